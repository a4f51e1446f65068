"""The GPU check: every readout and sampling path of the Transformers engine on the device, with figures.

``scripts/device_check.sh`` runs it on a lent GPU machine (one offline H100 or H200, the working tree, the machine's
torch and transformers; no vLLM, no hub), and ``--cpu`` runs the same steps end to end on a CPU-only machine at
tiny shapes, saying which steps need a GPU, so the script cannot rot (``make test`` runs it,
tests/test_gpu_numerics.py). The steps, in the order they run by default (:data:`~scripts.device.steps.STEPS`; ``--steps a,b`` runs any
of them, in the order given):

* **moe-readouts**, **moe-decode**, **moe-draws**, **moe-reasoning**: a randomly initialised Qwen3-MoE at the real
  widths (hidden 2048, 32/4 heads of 128, 128 experts top-8 of width 768, vocabulary 151,936) with
  :data:`~scripts.device.check.MOE_LAYERS` layers, bfloat16 on the GPU (the tiny model's widths and 4 layers on the CPU), built once for
  the four and every figure warm and repeated (:mod:`scripts.device_moe`): readouts against an lm-eval-style
  scorer (agreement checked first) and the bfloat16 head's drift; prefill and decode steps in each experts
  implementation and as slot steps recorded in CUDA graphs, against the compute limit and the weight-read floor
  measured in the same run; draws against ``generate()`` on the same model object; refilled reasoning (stacked
  and in slots) against its ideal step count and the bucket schedule. Each step prints its part of issue 44's
  targets with pass/fail. They come first because they need no tiny model: device_check.sh builds the tiny
  models in the background meanwhile.
* **parity**: the same trials (binary, 0-10 and 0-100 answers) on every readout path x float32/bfloat16 (and, in
  bfloat16, with the final projection in float32 and in the model's dtype) on the device, against float32 on the
  CPU: the largest |logprob| and |p| difference, greedy flips, and the largest path-vs-path difference per dtype.
  float32 must agree within :data:`~scripts.device.tiny_steps.FLOAT32_BOUND`; bfloat16 is measured (the figures go to docs/gpu.md).
* **sampling**: seeded draws on every sampling path in float32 must be the same tokens; think mode reads a slot;
  float32 slot steps recorded in CUDA graphs (``--hf-decode-graphs on``), teacher forced through the refilled
  stack's traces, must read the whole-sequence forwards' log-probs within :data:`~scripts.device.tiny_steps.GRAPHS_BOUND`, with no failed
  recording (:func:`~scripts.device.tiny_steps.graphs_logprobs`).
* **split** (GPU only): the model split over two devices (norm and ``lm_head`` on the CPU, the layers on the
  GPU) through every readout and sampling path, against the model in one place.
* **graphs** (not run by default): Transformers' static-cache ``generate()`` decode step (compiled on a GPU, CUDA
  graphs) against its dynamic one on the random Qwen3-MoE: what graph capture buys, measured before the engine
  had its own (issue 44). Compiling can take minutes, so it runs only when named.

Every step's rows go to ``OUT/device_check.json`` as soon as the step ends (written whole each time, atomically),
with the state of every step (``summary.steps``: ran, failed, skipped or not reached, and why), so a check killed
at its cap still returns every step that finished. ``--budget S`` skips a step whose estimate no longer fits in S
seconds from the start, saying so; ``--dry-run`` prints each step's estimate and the total.

The steps and their parts live in the package :mod:`scripts.device`; this file is the command line.

Usage (repository root): ``python -m scripts.device_check [--cpu] [--out DIR] [--steps a,b] [--budget S]
[--models tiny,tiny-hybrid] [--dry-run]``
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a file (python scripts/device_check.py): the checkout's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.device.check import Check
from scripts.device.steps import BY_NAME, STEPS, Record, estimates, run_steps


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    default = [s.name for s in STEPS if s.default]
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cpu", action="store_true", help="run every step on the CPU at tiny shapes (no CUDA needed)")
    p.add_argument("--out", default=".", help="folder for device_check.json (default: .)")
    p.add_argument("--steps", default=",".join(default),
                   help=f"comma list of {', '.join(BY_NAME)}; 'moe' names the four moe steps (default: {','.join(default)})")  # fmt: skip
    p.add_argument(
        "--models", default="tiny,tiny-hybrid", help="models of parity, sampling and split (default: tiny,tiny-hybrid)"
    )
    p.add_argument("--budget", type=float, default=None,
                   help="seconds from the start: a step whose estimate no longer fits is skipped, and says so")  # fmt: skip
    p.add_argument(
        "--dry-run", action="store_true", help="print each step's estimated seconds and the total; run nothing"
    )
    a = p.parse_args(argv)
    names = [
        n
        for part in a.steps.split(",")
        if part
        for n in ([s.name for s in STEPS if s.name.startswith("moe-")] if part == "moe" else [part])
    ]
    unknown = sorted(set(names) - set(BY_NAME))
    if unknown:
        p.error(f"unknown step(s) {unknown}; choose from {', '.join(BY_NAME)} (or moe for the four moe steps)")
    a.steps = [BY_NAME[n] for n in dict.fromkeys(names)]  # in the order given, each once
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a.dry_run:
        plan = estimates(a.steps, a.cpu)
        for what, s in plan:
            print(f"  {s:5.0f} s  {what}")
        print(f"  {sum(s for _, s in plan):5.0f} s  in all ({'CPU' if a.cpu else 'one H100 or H200'}, estimated)")
        return 0
    started = time.perf_counter()
    import torch

    if not a.cpu and not torch.cuda.is_available():
        print(
            f"device_check: torch {torch.__version__} sees no CUDA device; run with --cpu for the CPU mode",
            file=sys.stderr,
        )
        return 2
    device = "cpu" if a.cpu else "cuda:0"
    head = {"device": device, "torch": torch.__version__}
    if not a.cpu:
        head["gpu"] = torch.cuda.get_device_name(0)
    record = Record(Path(a.out) / "device_check.json", head,
                    {s.name: {"status": "not run", "why": "not reached"} for s in a.steps} |
                    {s.name: {"status": "not run", "why": "not asked for (--steps)"} for s in STEPS if s not in a.steps})  # fmt: skip
    record.write()
    run_steps(
        a.steps, Check(device, a.cpu, [m for m in a.models.split(",") if m], record.emit), record, a.budget, started
    )
    summary = record.summary()
    print(
        f"device_check: verified {', '.join(summary['verified']) or 'nothing'}; not verified: {'; '.join(summary['not_verified'])}"
    )
    for r in (r for r in record.rows if r["check"] == "target"):
        verdict = (
            ("PASS" if r["passed"] else "FAIL")
            if r["counts"]
            else ("pass" if r["passed"] else "fail") + " (CPU: for the record)"
        )
        print(f"device_check: target {r['target']}: {r['what']} = {r['value']:.3g} (bound {r['bound']}): {verdict}")
    problems = record.problems
    print(f"device_check: {len(problems)} problem(s)" + (": " + "; ".join(problems) if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
