#!/usr/bin/env bash
# GPU checks for a lent device machine, under 8 minutes in all without vLLM (the usual device: torch and
# transformers, no vLLM), under 14 with it (timeouts 150 + 120 + 300 + 240 s):
#   1. the Transformers GPU tests (fp32 on GPU == CPU, bf16 close);
#   2. where vLLM is installed: the vLLM engine tests, conformance and parity with the
#      Transformers engine on both tiny models (fp32 and bf16), with readouts/s;
#   3. where `import vllm` works: CUDA readout parity of engines.vllm against engines.hf on tiny and smol,
#      float32 and bfloat16, against the CPU conformance suite's tolerances (scripts/vllm_parity.py; one line
#      per model and dtype, in $OUT/vllm_parity.log and .jsonl). Without vLLM: one line saying it was skipped, and why.
# Ends with one summary line (also written to $OUT/summary.txt), e.g.
#   device_check: hf-gpu 2 passed | vllm 0.33.0 14 passed | max|p_vllm-p_hf| tiny fp32 3.1e-06 bf16 9.8e-04 ... | readouts/s ...
#     | vllm-parity max|logprob_vllm-logprob_hf| on cuda: tiny float32 ... bfloat16 ... | smol ...
# Usage (on the device, from the repository root): bash scripts/device_check.sh   (logs go to $OUT if set)
#   bash scripts/device_check.sh --dry-run   prints the plan and what imports here; runs nothing (any machine)
set -uo pipefail
out=${OUT:-/tmp}
py=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} # the checkout itself: no install (the device has no network)
export PROBE_CACHE=${PROBE_CACHE:-/tmp/probe-cache} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_WORKER_MULTIPROC_METHOD=spawn

if [ "${1:-}" = "--dry-run" ]; then
  echo "device_check plan (python: $py; logs to $out):"
  echo "  1. python -m probe tiny (build the tiny models), then pytest -m gpu tests/test_gpu.py"
  echo "  2. if vllm imports: pytest tests/test_vllm_gpu.py tests/test_vllm_real.py tests/test_vllm_engine.py"
  echo "  3. if vllm imports: python -m scripts.vllm_parity --device cuda --models tiny,smol"
  "$py" -m scripts.vllm_parity --dry-run --device cuda --models tiny,smol
  exit $?
fi

last_line() { grep -E "passed|failed|skipped|error|no tests" "$1" | tail -1 | sed 's/=//g; s/^ *//; s/ in [0-9.]*s.*//'; }

timeout 150 "$py" -m probe tiny >"$out/tiny.log" 2>&1 || echo "tiny build failed (see $out/tiny.log)"
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

# 3. CUDA readout parity, vLLM against Transformers, on tiny and smol (float32, bfloat16); the last line of
# scripts/vllm_parity.py is its summary. Exit 1 there means a row was OVER its tolerance or failed (see the log).
if vllm_err=$("$py" -c "import vllm" 2>&1); then
  timeout 240 "$py" -m scripts.vllm_parity --device cuda --models tiny,smol --report "$out/vllm_parity.jsonl" \
    2>"$out/vllm_parity.err" | tee "$out/vllm_parity.log"
  rc=${PIPESTATUS[0]}
  parity=$(grep "^vllm-parity max" "$out/vllm_parity.log" | tail -1)
  parity="${parity:-vllm-parity: no summary line}$([ "$rc" = 0 ] || echo " (exit $rc; see $out/vllm_parity.log, .err)")"
else
  parity="vllm-parity skipped: vLLM is not importable here ($(printf '%s\n' "$vllm_err" | tail -1))"
  echo "$parity"
fi
echo "device_check: $hf | $vl${numbers:+ | $numbers} | $parity" | tee "$out/summary.txt"
