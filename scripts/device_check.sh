#!/usr/bin/env bash
# The one prepared check for a lent GPU machine (one offline H200, the working tree, the machine's torch and
# transformers; no vLLM, no hub). Under 10 minutes by construction (timeouts 120 + 300 + 100 + 60 s = 9.7 min
# are the hard cap; the estimate is about 6: see scripts/device_check.py for the sizes):
#   0. build the tiny models from the working tree (no download);
#   1-5. python -m scripts.device_check: the parity matrix (every readout path x float32/bfloat16, float32 head
#      and model head, against float32 on the CPU), identical draws on every sampling path, think mode, float32
#      reasoning in slots recorded in CUDA graphs (--hf-decode-graphs on) against the refilled stack, a forced
#      split (norm and lm_head on the CPU, layers on the GPU) through every readout and sampling path, a random
#      Qwen3-MoE at the real widths (every timing warm and repeated: readouts vs an lm-eval-style scorer, draws vs
#      generate(), decode steps (eager, and slot steps in CUDA graphs) vs the weight-read floor, refilled
#      reasoning (stacked and in slots) vs its ideal, peak memory, head
#      drift, issue 44's targets with pass/fail), and a summary of what was and was not verified; every figure in
#      $OUT/device_check.json;
#   5b. python -m scripts.device_check --steps graphs, a call of its own: Transformers' compiled static-cache decode
#      step against its dynamic one on the same random Qwen3-MoE (what CUDA graphs buy before the engine has them);
#   6. the CUDA tests (tests/test_gpu.py), and vLLM's where `import vllm` works.
# Usage (repository root): bash scripts/device_check.sh          (on the GPU machine; logs and JSON to $OUT)
#                          bash scripts/device_check.sh --cpu    (any machine: the same steps at tiny shapes)
#                          bash scripts/device_check.sh --dry-run (the plan; runs nothing)
set -uo pipefail
out=${OUT:-/tmp/device_check}
mkdir -p "$out"
py=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && py=.venv/bin/python
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} # the checkout itself: no install (the device has no network)
export PROBE_CACHE=${PROBE_CACHE:-/tmp/probe-cache} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_WORKER_MULTIPROC_METHOD=spawn
mode=${1:-}
cpu_flag=$([ "$mode" = "--cpu" ] && echo --cpu)

if [ "$mode" = "--dry-run" ]; then
  echo "device_check plan (python: $py; logs to $out):"
  echo "  0. python -m probe tiny (build the tiny models)"
  echo "  1-5. python -m scripts.device_check --out $out (parity, sampling, split, moe; --cpu: tiny shapes, no split)"
  echo "  5b. python -m scripts.device_check --steps graphs --out $out/graphs (compiled static-cache decode vs dynamic)"
  echo "  6. pytest -m gpu tests/test_gpu.py; where vllm imports: tests/test_vllm_gpu.py and scripts.vllm_parity"
  "$py" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
  exit $?
fi

status=0
start=$(date +%s)
timeout 120 "$py" -m probe tiny >"$out/tiny.log" 2>&1 || { echo "device_check: tiny build failed (see $out/tiny.log)"; exit 1; }
timeout 300 "$py" -m scripts.device_check $cpu_flag --out "$out" 2>"$out/device_check.err" | tee "$out/device_check.log"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || { status=1; echo "device_check: the steps exited $rc (see $out/device_check.log and .err)"; }
# what CUDA graphs buy a decode step (Transformers' compiled static cache against its dynamic one): a call of its
# own, because compiling can take minutes; a timeout loses only its own figures, which are findings, not checks
timeout 100 "$py" -m scripts.device_check $cpu_flag --steps graphs --out "$out/graphs" 2>"$out/graphs.err" |
  tee "$out/graphs.log"
[ "${PIPESTATUS[0]}" = 0 ] || echo "device_check: the graphs step did not finish (see $out/graphs.log and .err)"

if [ -z "$cpu_flag" ]; then
  timeout 60 "$py" -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tee "$out/gpu_tests.log" || status=1
  if "$py" -c "import vllm" 2>/dev/null; then
    timeout 240 "$py" -m scripts.vllm_parity --device cuda --models tiny,smol --report "$out/vllm_parity.jsonl" \
      2>"$out/vllm_parity.err" | tee "$out/vllm_parity.log" || status=1
  else
    echo "device_check: vLLM is not importable here: its CUDA parity was not run"
  fi
fi
echo "device_check: done in $(( $(date +%s) - start )) s, exit $status; figures in $out/device_check.json"
exit "$status"
