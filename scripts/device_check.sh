#!/usr/bin/env bash
# The one prepared check for a lent GPU machine (one offline H100 or H200, the working tree, the machine's torch and
# transformers; no vLLM, no hub). A lease is 15 minutes of device time with the machine's start in it, so the check
# is built to leave room for a rerun: about 200 s estimated (--dry-run prints the plan), and a hard cap of CAP
# seconds (default 290) on the whole of it, the tiny build included:
#   - python -m probe tiny, in the background: the tiny models the parity, sampling and split steps read (the moe
#     steps, which run first, need none);
#   - python -m scripts.device_check (its docstring says what each step measures), given what is left of the cap
#     less the GPU tests' share as --budget, so it skips a step that no longer fits and says so; it writes
#     $OUT/device_check.json after every step, so a kill at the cap keeps every step that finished;
#   - the CUDA tests (tests/test_gpu.py) in what is left, and vLLM's parity where `import vllm` works (never on the
#     lent machines: no vLLM there).
# Usage (repository root): bash scripts/device_check.sh [--steps a,b]   (on the GPU machine; logs and JSON to $OUT)
#                          bash scripts/device_check.sh --cpu           (any machine: the same steps at tiny shapes)
#                          bash scripts/device_check.sh --dry-run       (each step's estimate and the total; runs nothing)
# Transformers' compiled decode step (what CUDA graphs buy, measured before the engine had its own) is not in the
# default steps: `bash scripts/device_check.sh --steps graphs` runs it alone (compiling can take minutes).
set -uo pipefail
out=${OUT:-/tmp/device_check}
mkdir -p "$out"
py=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && py=.venv/bin/python
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} # the checkout itself: no install (the device has no network)
export PROBE_CACHE=${PROBE_CACHE:-/tmp/probe-cache} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_WORKER_MULTIPROC_METHOD=spawn
cpu_flag="" dry="" steps=()
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) cpu_flag=--cpu ;;
    --dry-run) dry=1 ;;
    --steps) steps=(--steps "${2:?--steps needs a comma list}"); shift ;;
    --steps=*) steps=("$1") ;;
    *) echo "device_check.sh: unknown argument $1 (use --cpu, --dry-run, --steps a,b)" >&2; exit 2 ;;
  esac
  shift
done
# The cap: the whole check, builds included. On the CPU it only guards against a hang (the test runs it on 2 busy
# cores). GPU_TESTS_S: what the CUDA tests are kept (pytest's start and five tests, each a few seconds).
cap=${CAP:-$([ -n "$cpu_flag" ] && echo 900 || echo 290)}
GPU_TESTS_S=40

if [ -n "$dry" ]; then
  echo "device_check plan (python: $py; logs to $out; cap $cap s):"
  echo "  (background) python -m probe tiny: the tiny models, while the moe steps run"
  "$py" -m scripts.device_check $cpu_flag --dry-run "${steps[@]}" | tee "$out/plan.txt" || exit 1
  if [ -z "$cpu_flag" ]; then
    echo "     $GPU_TESTS_S s  pytest -m gpu tests/test_gpu.py (and vLLM's parity where vllm imports: not on the lent machines)"
    total=$(awk '/in all/ {print $1}' "$out/plan.txt")
    echo "  $(( total + GPU_TESTS_S )) s  estimated in all, under a hard cap of $cap s"
  fi
  exit 0
fi

start=$(date +%s)
left() { echo $(( cap - ($(date +%s) - start) )); }
status=0
# the tiny models, built while the moe steps run (their first use waits on the build's lock)
timeout "$cap" "$py" -m probe tiny >"$out/tiny.log" 2>&1 &
build=$!
reserve=$([ -z "$cpu_flag" ] && echo $GPU_TESTS_S || echo 0)
budget=$(( $(left) - reserve - 5 ))
timeout "$(( budget + 5 ))" "$py" -m scripts.device_check $cpu_flag "${steps[@]}" --budget "$budget" --out "$out" \
  2>"$out/device_check.err" | tee "$out/device_check.log"
rc=${PIPESTATUS[0]}
case $rc in
  0) ;;
  124|137) status=1; echo "device_check: the steps were stopped at the cap; $out/device_check.json holds every step that finished" ;;
  *) status=1; echo "device_check: the steps exited $rc (see $out/device_check.log and .err)" ;;
esac
wait "$build" || { status=1; echo "device_check: the tiny build failed (see $out/tiny.log)"; }

if [ -z "$cpu_flag" ]; then
  timeout "$(left)" "$py" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.log" || status=1
  if "$py" -c "import vllm" 2>/dev/null && [ "$(left)" -gt 60 ]; then
    timeout "$(left)" "$py" -m scripts.vllm_parity --device cuda --models tiny,smol --report "$out/vllm_parity.jsonl" \
      2>"$out/vllm_parity.err" | tee "$out/vllm_parity.log" || status=1
  else
    echo "device_check: vLLM's CUDA parity not run (vLLM not importable here, or under a minute of the cap left)"
  fi
fi
echo "device_check: done in $(( $(date +%s) - start )) s of a $cap s cap, exit $status; figures in $out/device_check.json"
exit "$status"
