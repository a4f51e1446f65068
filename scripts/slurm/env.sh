# Sourced by the probe Slurm jobs: the environment a batch job on a cluster needs.
# Override any of these in the environment you submit from (sbatch exports it by default).

# Compute nodes usually have no internet: read models from the shared hub cache only.
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export TRANSFORMERS_OFFLINE=${TRANSFORMERS_OFFLINE:-1}
# export HF_HOME=/shared/hf   # where `hf download` put the models on the login node
# vLLM's workers must be spawned, not forked, once CUDA is initialized in the parent.
export VLLM_WORKER_MULTIPROC_METHOD=${VLLM_WORKER_MULTIPROC_METHOD:-spawn}
export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
export PYTHONUNBUFFERED=1
# The probe command and its Python (the project's venv by default).
PROBE_BIN=${PROBE_BIN:-.venv/bin/probe}
PROBE_PYTHON=${PROBE_PYTHON:-.venv/bin/python}

# A folder name for a model spec: Qwen/Qwen3-30B-A3B -> Qwen3-30B-A3B, vllm:/models/x -> x.
probe_slug() {
  local m=${1#vllm:}
  m=${m%/}
  m=${m##*/}
  printf '%s\n' "${m//[^A-Za-z0-9._-]/_}"
}
