# Sourced by the probe Slurm jobs: the environment a batch job on a cluster needs.
# Override any of these in the environment you submit from (sbatch exports it by default).

# Compute nodes usually have no internet: read models from the shared hub cache only.
# PROBE_SET_OFFLINE remembers that this file (not you) chose offline, for the hint a failed task prints.
if [ -z "${HF_HUB_OFFLINE:-}" ]; then
  export HF_HUB_OFFLINE=1 PROBE_SET_OFFLINE=1
fi
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-$HF_HUB_OFFLINE}
# export HF_HOME=/shared/hf   # where `hf download` put the models on the login node
# vLLM's workers must be spawned, not forked, once CUDA is initialized in the parent.
export VLLM_WORKER_MULTIPROC_METHOD=${VLLM_WORKER_MULTIPROC_METHOD:-spawn}
export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
# torch would start a thread per core of the node, also on the cores other jobs were given
if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$SLURM_CPUS_PER_TASK}
fi
export PYTHONUNBUFFERED=1
# The probe command and its Python: the project's venv, found from this file, so any submit folder works.
probe_root=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)  # -P: through a symlinked scripts folder
PROBE_BIN=${PROBE_BIN:-$probe_root/.venv/bin/probe}
PROBE_PYTHON=${PROBE_PYTHON:-$probe_root/.venv/bin/python}

# A folder name for a model spec: Qwen/Qwen3-30B-A3B -> Qwen3-30B-A3B, vllm:/models/x -> x.
probe_slug() {
  local m=${1#vllm:}
  m=${m%/}
  m=${m##*/}
  printf '%s\n' "${m//[^A-Za-z0-9._-]/_}"
}

# What a failed probe command should add: env.sh made the hub offline, so a model that is not in the
# cache cannot be downloaded on the node.
probe_offline_hint() {
  if [ "${PROBE_SET_OFFLINE:-}" = 1 ]; then
    echo "note: scripts/slurm/env.sh set HF_HUB_OFFLINE=1 (compute nodes are usually offline), so a hub model must" \
      "already be in the cache: download it on the login node (hf download MODEL, into the HF_HOME the nodes see)," \
      "or submit with HF_HUB_OFFLINE=0 where nodes reach the hub" >&2
  fi
}

