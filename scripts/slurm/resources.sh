# What each probe job asks Slurm for: the one place to change it. Sourced by submit.sh; set any of
# these in the environment you submit from to override it for one submission.
#
# PROBE_ARRAY_RESOURCES  each array task (one model x shard: loads the model, runs its trials)
# PROBE_MERGE_RESOURCES  the merge job (reads the shards, writes the report: no GPU)
# SBATCH_ARGS            both jobs (where to run: --partition, --account, --qos); no resources here
# PROBE_LOG_DIR          the logs' folder, created by submit.sh (relative to the submit folder)
#
# CPU partition (no GPUs): PROBE_ARRAY_RESOURCES="--cpus-per-task=4 --mem=16G --time=04:00:00"
# Two GPUs per task (vLLM --tensor-parallel-size 2): PROBE_ARRAY_RESOURCES="--gres=gpu:2 --cpus-per-task=16 --mem=128G --time=04:00:00"
# Recipes and what each default is for: docs/cluster.md.
PROBE_ARRAY_RESOURCES=${PROBE_ARRAY_RESOURCES---gres=gpu:1 --cpus-per-task=8 --mem=64G --time=04:00:00}
PROBE_MERGE_RESOURCES=${PROBE_MERGE_RESOURCES---cpus-per-task=4 --mem=16G --time=01:00:00}
PROBE_LOG_DIR=${PROBE_LOG_DIR:-logs}
