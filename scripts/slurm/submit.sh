#!/usr/bin/env bash
# Submit a probe run as a Slurm array (one task per model x shard) plus a dependent merge job.
#
#   scripts/slurm/submit.sh EXPERIMENT OUT N MODEL[,MODEL...] [probe run args...]
#   scripts/slurm/submit.sh yesno runs/cluster 8 Qwen/Qwen3-30B-A3B,nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 \
#       --engine vllm --think
#
# Run it again with the same arguments after a preemption or a failed task: finished
# shards exit at once, the others resume, and the merge runs when all succeed.
# SBATCH_ARGS (e.g. "--partition=gpu --account=me") is passed to both sbatch calls.
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: scripts/slurm/submit.sh EXPERIMENT OUT N MODEL[,MODEL...] [probe run args...]" >&2
  exit 2
fi
experiment=$1 out=$2 n=$3 models=$4
shift 4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PROBE_SLURM_DIR=$here  # sbatch exports it to the jobs (they run from a spool copy)
IFS=, read -r -a model_list <<<"$models"
if ! [[ $n =~ ^[1-9][0-9]*$ ]]; then
  echo "submit.sh: N (shards per model) must be a positive integer, got '$n'" >&2
  exit 2
fi
last=$((${#model_list[@]} * n - 1))
mkdir -p logs
# shellcheck disable=SC2086  # SBATCH_ARGS is a list of flags
array=$(sbatch --parsable ${SBATCH_ARGS:-} --array="0-$last" "$here/array.sbatch" "$experiment" "$out" "$n" "$models" "$@")
array=${array%%;*}  # --parsable prints "jobid[;cluster]"
# shellcheck disable=SC2086
# --kill-on-invalid-dep: if a task fails, drop the merge instead of leaving it pending forever
merge=$(sbatch --parsable ${SBATCH_ARGS:-} --dependency="afterok:$array" --kill-on-invalid-dep=yes \
  "$here/merge.sbatch" "$out" "$models")
merge=${merge%%;*}
echo "array job $array (tasks 0-$last: ${#model_list[@]} model(s) x $n shards), merge job $merge after it"
