#!/usr/bin/env bash
# GPU checks for a lent device machine, under 8 minutes in all:
#   1. the Transformers GPU tests (fp32 on GPU == CPU, bf16 close);
#   2. where vLLM is installed: the vLLM engine tests, conformance and parity with the
#      Transformers engine on both tiny models (fp32 and bf16), with readouts/s.
# Ends with one summary line (also written to $OUT/summary.txt), e.g.
#   device_check: hf-gpu 2 passed | vllm 0.33.0 14 passed | max|p_vllm-p_hf| tiny fp32 3.1e-06 bf16 9.8e-04 ... | readouts/s ...
# Usage (on the device, from the repository root): bash scripts/device_check.sh   (logs go to $OUT if set)
set -uo pipefail
out=${OUT:-/tmp}
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} # the checkout itself: no install (the device has no network)
export PROBE_CACHE=${PROBE_CACHE:-/tmp/probe-cache} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_WORKER_MULTIPROC_METHOD=spawn

last_line() { grep -E "passed|failed|skipped|error|no tests" "$1" | tail -1 | sed 's/=//g; s/^ *//; s/ in [0-9.]*s.*//'; }

timeout 150 "$py" -m probe.cli tiny >"$out/tiny.log" 2>&1 || echo "tiny build failed (see $out/tiny.log)"
timeout 120 "$py" -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.log"
hf="hf-gpu $(last_line "$out/gpu_tests.log")"

if vllm_version=$("$py" -c "import vllm; print(vllm.__version__)" 2>/dev/null); then
  export PROBE_DEVICE_REPORT=$out/vllm_report.jsonl
  rm -f "$PROBE_DEVICE_REPORT"
  timeout 300 "$py" -m pytest -q -rs tests/test_vllm_gpu.py tests/test_vllm_real.py tests/test_vllm_engine.py 2>&1 |
    tee "$out/vllm_tests.log"
  vl="vllm $vllm_version $(last_line "$out/vllm_tests.log")"
  numbers=$("$py" - "$PROBE_DEVICE_REPORT" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if __import__("os").path.exists(sys.argv[1]) else []
par = [r for r in rows if r.get("check") == "parity"]
diff = " ".join(f"{r['model']} {r['dtype']} {r['max_prob_diff']:.1e}" for r in par)
rate = " ".join(f"{r['model']} {r['dtype']} {r['readouts_per_s']:.0f}" for r in par)
print(f"max|p_vllm-p_hf| {diff or 'n/a'} | readouts/s {rate or 'n/a'}")
EOF
)
else
  vl="vllm not installed here (parity not run)"
  numbers=""
fi
echo "device_check: $hf | $vl${numbers:+ | $numbers}" | tee "$out/summary.txt"
