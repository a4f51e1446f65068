#!/usr/bin/env bash
# Are the saved reports byte-identical across a refactor? Makes a fixed set of runs once (the synthetic subject and
# tiny: every experiment, one and both sources, a follow-up, an import, coded traces, four panels), then writes
# every report and comparison with the code of REV and with the working tree, from copies of the runs at one path
# (the run's path is printed in its summary), and diffs the two folders: `diff -r` prints nothing when they match.
# About 5 minutes on 2 cores.
# Usage (repository root): bash scripts/report_bytes.sh REV [OUT]   (REV: a commit, e.g. HEAD~3; OUT: /tmp/report_bytes)
set -euo pipefail
rev=${1:?usage: bash scripts/report_bytes.sh REV [OUT]}
out=${2:-/tmp/report_bytes}
root=$PWD
py=$root/.venv/bin/python
[ -x "$py" ] || { echo "report_bytes: no .venv here: run make install first" >&2; exit 2; }
git rev-parse --verify --quiet "$rev^{commit}" > /dev/null || { echo "report_bytes: $rev is not a commit" >&2; exit 2; }
rm -rf "$out"
mkdir -p "$out"
runs=$out/runs
git worktree add --quiet --detach "$out/before" "$rev"
trap 'git -C "$root" worktree remove --force "$out/before"' EXIT

# the runs, made once with the working tree (the engines are not what is compared)
probe() { "$py" -m probe "$@" > /dev/null; }
q=(--quiet --no-report)
probe run yesno --model sim --out "$runs/yesno" "${q[@]}" --salts 2 --samples 4
probe run yesno --model sim --out "$runs/yesno2" "${q[@]}" --sim-seed 2
probe run yesno --model tiny --out "$runs/yesno_tiny" "${q[@]}"
probe run battery --model sim --out "$runs/battery" "${q[@]}" --salts 2 --samples 4
probe run battery --model sim --out "$runs/battery2" "${q[@]}" --sim-seed 3
probe run influence-triage --model sim --out "$runs/tri" "${q[@]}"
probe run influence-triage --model sim --samples 8 --out "$runs/tri_s" "${q[@]}"
probe run influence-triage --model sim --sim-seed 5 --out "$runs/tri2" "${q[@]}"
probe run influence-bbq --model sim --out "$runs/bbq" "${q[@]}" --bbq tests/data/bbq --bbq-limit 40
if [ -d ../shared/data/daily_dilemmas ]; then
  probe run influence-dd --model sim --out "$runs/dd" "${q[@]}" --samples 4 --dd ../shared/data/daily_dilemmas \
    --dd-limit 30 --dd-min-count 1
fi
probe run cue --model sim --out "$runs/cue" "${q[@]}"
probe run cue --model sim --samples 4 --out "$runs/cue_s" "${q[@]}"
probe run cue --model sim --sim-seed 4 --out "$runs/cue2" "${q[@]}"
probe run followup --model sim --source "$runs/tri_s" --out "$runs/fu" "${q[@]}"
probe import docs/examples/influence_conditions.csv --out "$runs/imp" --no-report
probe run influence-triage --model tiny --out "$runs/think" "${q[@]}" --factors gender --sizes 1-2 \
  --influences survey,few_shot --controls none --think --think-budget 16
probe code "$runs/think" --task compliance --judge tiny
probe code "$runs/think" --task rationale --judge tiny --limit 20

reports() {  # reports TREE DEST: every report and comparison with the code of TREE, from copies at one path
  local tree=$1 dest=$2 at=$out/at
  rm -rf "$at" && cp -r "$runs" "$at" && mkdir -p "$dest"
  for r in "$at"/*/; do
    r=${r%/}
    (cd "$tree" && "$py" -m probe analyze "$r" > /dev/null)
    cp -r "$r/report" "$dest/$(basename "$r")"
  done
  (
    cd "$tree"
    "$py" -m probe compare "$at/yesno" "$at/yesno2" --out "$dest/cmp_yesno" --quiet
    "$py" -m probe compare "$at/battery" "$at/battery2" --out "$dest/cmp_battery" --quiet --n-boot 200
    "$py" -m probe compare "$at/tri" "$at/tri_s" "$at/tri2" --out "$dest/cmp_tri" --quiet --n-boot 200
    "$py" -m probe compare "$at/cue" "$at/cue_s" "$at/cue2" --out "$dest/cmp_cue" --quiet --n-boot 200
    "$py" -m probe compare "$at/cue_s" "$at/cue_s" --names a,b --out "$dest/cmp_cue_both" --quiet --n-boot 200
  ) > /dev/null
}
reports "$out/before" "$out/reports-before"
reports "$root" "$out/reports-after"
files=$(find "$out/reports-after" -type f | wc -l)
if diff -r "$out/reports-before" "$out/reports-after"; then
  echo "report_bytes: $files files, byte-identical between $rev and the working tree"
else
  echo "report_bytes: the reports differ (above) between $rev and the working tree" >&2
  exit 1
fi
