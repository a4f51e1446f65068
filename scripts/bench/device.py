"""The readout paths on a CUDA GPU: ``python -m scripts.bench.device`` (a device check, not part of ``make bench``).

Builds a model of the bench shape (:data:`scripts.bench.model.BENCH_MOE_CONFIG`)
with seeded random weights, since weights do not change speed and the trained
folder is too large to ship to a device machine, then reads the forced-binary
battery (264 trials) and the graded battery (3 dilemmas x 12 forms x 101
options) on each of probe's readout paths (tree, branch, plain) and prints
trials/s and tokens fed. The plain path computes what a peer without prefix
sharing computes, so plain/tree is the GPU gain of sharing. Each path is
checked against plain before it is timed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--tree-tokens", type=int, default=8192)
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu to try the script out")
    p.add_argument("--quick", action="store_true", help="one dilemma per workload")
    a = p.parse_args(argv)

    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from engines.hf import HFEngine, HFSettings
    from experiments.dilemmas import load_dilemmas
    from probe import tiny_tokenizer
    from scripts.bench.model import BENCH_MOE_CONFIG
    from scripts.bench.workloads import WorkloadSpec, expand_workload

    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    torch.manual_seed(0)
    tok = tiny_tokenizer.build_tokenizer()
    config = Qwen3MoeConfig(
        **BENCH_MOE_CONFIG, vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    with tempfile.TemporaryDirectory() as folder:
        Qwen3MoeForCausalLM(config).save_pretrained(folder)
        tok.save_pretrained(folder)
        base = HFEngine(
            HFSettings(model=folder, device=a.device, dtype=a.dtype, batch_size=a.batch_size, tree_tokens=a.tree_tokens)
        ).load()
        fed = [0]
        base.model.register_forward_pre_hook(
            lambda m, args, kw: fed.__setitem__(0, fed[0] + kw["input_ids"].numel()), with_kwargs=True
        )
        where = torch.cuda.get_device_name() if cuda else "CPU"
        print(f"{where}; bench-shaped model, random weights, {a.dtype}; batch {a.batch_size}")
        for name, n in (("forced_binary", 22), ("graded", 3)):
            items = tuple(d.id for d in load_dilemmas(None))[: 1 if a.quick else n]
            trials = expand_workload(WorkloadSpec(name, items), base.count_tokens)
            ref = None
            for path in ("plain", "branch", "tree"):
                e = HFEngine(replace(base.settings, readout_path=path), model=base.model, tokenizer=base.tokenizer)
                e.load().readout(trials[:8])  # warm-up: kernels, caches of this engine are per instance
                e = HFEngine(replace(base.settings, readout_path=path), model=base.model, tokenizer=base.tokenizer)
                e.load()
                sync()
                fed[0] = 0
                start = time.perf_counter()
                rs = e.readout(trials)
                sync()
                seconds = time.perf_counter() - start
                probs = [s.prob for r in rs for s in r.scores]
                ref = ref or probs
                diff = max(abs(x - y) for x, y in zip(probs, ref, strict=True))
                print(
                    f"{name:>14} {path:>6}: {len(trials)} trials in {seconds:6.2f}s = {len(trials) / seconds:8.1f} "
                    f"trials/s; tokens fed {fed[0]:7d}; max |prob - plain| {diff:.1e}"
                    + (f"; peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB" if cuda else "")
                )
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
    return 0


if __name__ == "__main__":
    sys.exit(main())
