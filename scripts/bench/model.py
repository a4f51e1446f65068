"""The benchmark model: a Qwen3-MoE of realistic shape for a CPU, built locally like ``tiny``.

``tiny`` (hidden size 64, 2 layers) is shaped for tests: its forward pass is
all Python overhead, so it says nothing about readout speed. The bench model
keeps tiny's tokenizer (Qwen2's digit-splitting pre-tokenizer and Qwen3's chat
template, from :func:`probe.tiny_tokenizer.build_tokenizer`) and its training style (a
short run on the synthetic format corpus, so the answer slot puts its mass on
the offered labels and the experts are not routed uniformly at random), but
has the proportions of a small modern MoE: 6 layers, hidden size 384,
grouped-query attention (6 query heads, 2 key/value heads of 64), and 16
experts of which 4 are active per token. About 24M parameters, 8M active
per token, so a forward pass is dominated by matrix multiplications as it is
on real models. Its config is tiny's (:data:`probe.tiny.QWEN_MOE_CONFIG`)
with these widths.

The build is deterministic and cached under ``$PROBE_CACHE/bench/`` in a
folder named by a hash of the recipe, written atomically (temporary sibling
folder, then ``os.replace``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import time
import uuid
from dataclasses import asdict
from typing import Any

from probe.tiny import QWEN_MOE_CONFIG

BENCH_VERSION = "1"
NAME = "bench-moe"

BENCH_MOE_CONFIG: dict[str, Any] = QWEN_MOE_CONFIG | {
    "hidden_size": 384,
    "intermediate_size": 768,
    "num_hidden_layers": 6,
    "num_attention_heads": 6,
    "head_dim": 64,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 192,
}
"""``tiny``'s Qwen3-MoE config (its key/value heads, positions, rope, tied embeddings, float32) at these widths."""


def recipe() -> Any:
    """The short training run: tiny's recipe with fewer, smaller steps (each token costs ~60x tiny's)."""
    from probe.tiny_train import TrainRecipe

    return TrainRecipe(steps=30, batch_size=8, lr=3e-3, warmup=5, seed=1)


def fingerprint() -> str:
    from probe import tiny

    blob = json.dumps(
        {
            "version": BENCH_VERSION,
            "config": BENCH_MOE_CONFIG,
            "recipe": asdict(recipe()),
            "tokenizer": tiny.fingerprint("tiny"),  # tiny's recipe hash covers its tokenizer and corpus
        },
        sort_keys=True,
    ).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def bench_dir(root: pathlib.Path | None = None) -> pathlib.Path:
    from probe.tiny import cache_root

    return (root or cache_root()) / "bench" / f"{NAME}-{fingerprint()}"


def ensure_bench_model(root: pathlib.Path | None = None, *, progress: bool = True) -> pathlib.Path:
    """The folder of the bench model, building it first if absent (a few minutes on 2 CPU cores)."""
    from filelock import FileLock

    from probe.tiny import MARKER, is_complete

    dest = bench_dir(root)
    if is_complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest.parent / f".{dest.name}.lock")):
        if is_complete(dest):
            return dest
        tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            started = time.perf_counter()
            info = _build(tmp, progress)
            info["build_seconds"] = round(time.perf_counter() - started, 1)
            (tmp / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _build(out: pathlib.Path, progress: bool) -> dict[str, Any]:
    from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from probe import tiny, tiny_tokenizer, tiny_train

    r = recipe()
    # One thread, like tiny: reproducible weights, and OpenMP threads spin badly on shared cores.
    with tiny.deterministic(seed=r.seed, threads=1):
        tokenizer = tiny_tokenizer.build_tokenizer()
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id  # tiny's <|im_end|> and <|endoftext|>
        config = Qwen3MoeConfig(
            **BENCH_MOE_CONFIG, vocab_size=len(tokenizer), eos_token_id=eos, pad_token_id=pad, bos_token_id=pad
        )
        model = Qwen3MoeForCausalLM(config).float()
        # No behaviour contract: the bench measures speed, and nothing asserts what this model answers. Its weights
        # differ between CPUs' float kernels as tiny's do; the bench compares peers on the same weights in one run.
        info = tiny_train.train_tiny(model, tokenizer, r, progress=progress, contract=None)
        model.generation_config = GenerationConfig(
            eos_token_id=[eos, pad], pad_token_id=pad, bos_token_id=pad, do_sample=False
        )
        out.mkdir(parents=True)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    return info | {"name": NAME, "fingerprint": fingerprint(), "parameters": n}


if __name__ == "__main__":
    print(ensure_bench_model())
