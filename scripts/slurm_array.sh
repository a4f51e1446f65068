#!/usr/bin/env bash
# Run an experiment as a Slurm job array: one shard per array task, then merge.
#
#   sbatch --array=0-7 scripts/slurm_array.sh yesno Qwen/Qwen3-30B-A3B runs/q30b [extra probe run args]
#   # when all tasks are done:
#   probe merge runs/q30b
#
# Each task writes runs/q30b/shard-$SLURM_ARRAY_TASK_ID-of-$SLURM_ARRAY_TASK_COUNT and can be
# re-submitted after a preemption: it resumes from its last committed chunk.
#SBATCH --job-name=probe
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=04:00:00
#SBATCH --output=logs/probe-%A_%a.out
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: sbatch --array=0-N scripts/slurm_array.sh EXPERIMENT MODEL OUT [probe run args...]" >&2
  exit 2
fi
experiment=$1 model=$2 out=$3
shift 3
: "${SLURM_ARRAY_TASK_ID:?run this under sbatch --array}"
count=${SLURM_ARRAY_TASK_COUNT:-$((SLURM_ARRAY_TASK_MAX + 1))}
cd "${SLURM_SUBMIT_DIR:-.}"
exec .venv/bin/probe run "$experiment" --model "$model" --out "$out" \
  --shard "$SLURM_ARRAY_TASK_ID/$count" --quiet "$@"
