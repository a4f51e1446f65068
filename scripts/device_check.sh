#!/usr/bin/env bash
# One short GPU check for a lent device machine: GPU tests + bf16 vs fp32 readouts.
# Usage (on the device): bash scripts/device_check.sh   (writes logs to $OUT if set)
set -uo pipefail
out=${OUT:-/tmp}
python3 -m pip install -q -e . --no-deps 2>&1 | tail -2
export PROBE_CACHE=${PROBE_CACHE:-/tmp/probe-cache} PYTHONUNBUFFERED=1
python3 -m probe.cli tiny 2>&1 | tee "$out/tiny.log"
python3 -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.log"
