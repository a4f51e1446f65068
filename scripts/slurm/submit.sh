#!/usr/bin/env bash
# Submit a probe run as a Slurm array (one task per model x shard) plus a dependent merge job.
#
#   scripts/slurm/submit.sh EXPERIMENT OUT N MODEL[,MODEL...] [probe run args...]
#   scripts/slurm/submit.sh yesno runs/cluster 8 Qwen/Qwen3-30B-A3B,nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 \
#       --engine vllm --think
#
# Run it again with the same arguments after a preemption or a failed task: finished
# shards exit at once, the others resume, and the merge runs when all succeed.
# Resources: scripts/slurm/resources.sh (PROBE_ARRAY_RESOURCES for the tasks, PROBE_MERGE_RESOURCES for
# the merge, SBATCH_ARGS such as "--partition=gpu --account=me" for both). Works from any folder:
# OUT and the logs folder are relative to the folder you submit from.
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: scripts/slurm/submit.sh EXPERIMENT OUT N MODEL[,MODEL...] [probe run args...]" >&2
  exit 2
fi
experiment=$1 out=$2 n=$3 models=$4
shift 4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PROBE_SLURM_DIR=$here  # sbatch exports it to the jobs (they run from a spool copy)
. "$here/resources.sh"
IFS=, read -r -a model_list <<<"$models"
if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then
  echo "submit.sh: N (shards per model) must be a positive integer, got '$n'" >&2
  exit 2
fi
last=$((${#model_list[@]} * n - 1))
mkdir -p "$PROBE_LOG_DIR"  # Slurm does not create the --output folder (the job would fail with no log)
array_log="$PROBE_LOG_DIR/probe-%A_%a.out" merge_log="$PROBE_LOG_DIR/probe-merge-%j.out"

submit_failed() {  # submit_failed WHICH RESOURCES: explain a refused sbatch, the usual causes first
  echo "submit.sh: sbatch refused the $1 job (its message is above). It asked for: ${2:-(no resources)} ${SBATCH_ARGS:-}." >&2
  echo "  No GPUs on this cluster or partition? Use the CPU recipe: PROBE_ARRAY_RESOURCES=\"--cpus-per-task=4 --mem=16G\"." >&2
  echo "  More CPUs or memory than a node has? Lower them in PROBE_ARRAY_RESOURCES / PROBE_MERGE_RESOURCES" \
    "(defaults and recipes: scripts/slurm/resources.sh, docs/cluster.md)." >&2
  exit 1
}

preflight() {  # preflight WHICH RESOURCES SBATCH-ARGS...: a request no node can ever meet would pend forever
  local out
  out=$(sbatch --test-only "${@:3}" 2>&1) || { printf '%s\n' "$out" >&2; submit_failed "$1" "$2"; }
}

# shellcheck disable=SC2086  # the resource variables and SBATCH_ARGS are lists of flags
preflight array "$PROBE_ARRAY_RESOURCES" $PROBE_ARRAY_RESOURCES ${SBATCH_ARGS:-} --array="0-$last" \
  "$here/array.sbatch" "$experiment" "$out" "$n" "$models" "$@"
# shellcheck disable=SC2086
preflight merge "$PROBE_MERGE_RESOURCES" $PROBE_MERGE_RESOURCES ${SBATCH_ARGS:-} "$here/merge.sbatch" "$out" "$models"
# shellcheck disable=SC2086
array=$(sbatch --parsable $PROBE_ARRAY_RESOURCES ${SBATCH_ARGS:-} --output="$array_log" --array="0-$last" \
  "$here/array.sbatch" "$experiment" "$out" "$n" "$models" "$@") || submit_failed array "$PROBE_ARRAY_RESOURCES"
array=${array%%;*}  # --parsable prints "jobid[;cluster]"
# --kill-on-invalid-dep: if a task fails, drop the merge instead of leaving it pending forever
# shellcheck disable=SC2086
merge=$(sbatch --parsable $PROBE_MERGE_RESOURCES ${SBATCH_ARGS:-} --output="$merge_log" \
  --dependency="afterok:$array" --kill-on-invalid-dep=yes "$here/merge.sbatch" "$out" "$models") ||
  submit_failed merge "$PROBE_MERGE_RESOURCES"
merge=${merge%%;*}
echo "array job $array (tasks 0-$last: ${#model_list[@]} model(s) x $n shards), merge job $merge after it"
echo "logs: $PROBE_LOG_DIR/probe-${array}_<task>.out, $PROBE_LOG_DIR/probe-merge-$merge.out"
