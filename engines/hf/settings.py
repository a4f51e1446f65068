"""The Transformers engine's settings (:class:`HFSettings`) and its own ``--hf-*`` flags.

Owns: the settings dataclass (each field its flag, :mod:`engines.flags`), the allowed values of its choices, and
:func:`add_arguments`. May import: :mod:`engines.base`, :mod:`engines.flags`, :mod:`engines.hf.placement` (the device
argument's check); nothing else of :mod:`engines.hf`, and no heavy library.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import ClassVar

from engines.base import LoadingSettings, Supports, check_reasoning
from engines.flags import NO_FLAG, add_flags, flag
from engines.hf.placement import check_device_arg

READOUT_PATHS = ("auto", "tree", "branch", "plain")
SAMPLE_PATHS = ("auto", "tree", "shared", "plain")
HEAD_DTYPES = ("float32", "model")
EXPERTS = ("auto", "eager", "grouped_mm", "batched_mm")
"""Implementations of a mixture-of-experts layer in Transformers (``set_experts_implementation``)."""
DECODE_GRAPHS = ("auto", "on", "off")
SUPPORTS = Supports("hf", layers=True)
"""The Transformers engine renders both frames, has a think mode and the model's hidden states (``--layers``)."""


@dataclass(frozen=True)
class HFSettings(LoadingSettings):
    """Settings of the Transformers engine (all recorded in the run manifest).

    Each field is its flag (:mod:`engines.flags`): the loading ones (``--dtype``, ``--device``, ``--batch-size``,
    ``--revision``, ``--trust-remote-code``) are the shared :class:`engines.base.LoadingSettings`'s; the speed-only
    ones are ``--hf-*`` (:func:`add_arguments`).
    """

    offload: bool = False
    """Accept weights that do not fit the GPU being placed on the CPU or disk (default: refuse, naming the memory;
    far slower)."""
    head_dtype: str = field(default="float32", metadata=flag(name="hf-head-dtype", choices=HEAD_DTYPES))
    """Dtype of the final projection at the positions read: float32 (default; the logits are not rounded to
    bfloat16 before the softmax) or model (as the model computes it).

    float32 casts the hidden state and the head's (``lm_head``) weights up, keeping a float32 copy of the head's
    weights, vocabulary x hidden x 4 bytes; model uses the weights' dtype."""
    max_batch_tokens: int = field(default=32768, metadata=NO_FLAG)
    """Most padded prompt tokens per forward pass (bounds activation memory)."""
    top_other: int = field(default=5, metadata=NO_FLAG)
    """How many of the most likely non-option tokens to report."""
    readout_path: str = field(default="auto", metadata=flag(name="hf-readout-path", choices=READOUT_PATHS))
    """How shared prompt tokens are computed: tree, branch, plain or auto.

    Speed only in float32: the paths agree within 3.2e-5 nats on smol; in bfloat16 they round differently, so
    outside float32 the path enters the run key (docs/gpu.md). tree: one tree-masked forward per batch
    (attention-only models); branch: the shared prefix once, then its cache branched per trial (any model);
    plain: every prompt whole; auto: tree where possible, else branch on a CPU and plain on a GPU."""
    tree_tokens: int = field(default=1024, metadata=flag(name="hf-tree-tokens"))
    """Most tokens in one packed prompt tree.

    Its attention mask is tree_tokens x tree_tokens; one longer prompt gets a tree of its own."""
    sample_path: str = field(default="auto", metadata=flag(name="hf-sample-path", choices=SAMPLE_PATHS))
    """How draws share their prompt (docs/speed.md): tree, shared, plain or auto.

    Speed only: every path draws the same tokens from the same seeds, up to float rounding. tree: the batch's
    prompts packed as one token tree, its cache copied to every draw (attention-only models); shared: each prompt
    once, its cache copied to every draw (any model); plain: every draw prefills its prompt (the reference);
    auto: tree where possible, else shared."""
    sample_rows: int = field(default=1024, metadata=flag(name="hf-sample-rows"))
    """Most draws decoded together.

    On 2 CPU cores one batch of 544 draws was 10% faster than two of 272, 512 rows 29% faster than 128, and 128
    about twice as fast per draw as 16 (docs/speed.md). The batch's KV cache is also bounded by
    ``sample_cache_tokens``."""
    sample_cache_tokens: int = field(default=131072, metadata=flag(name="hf-sample-cache-tokens"))
    """Most KV-cache tokens of one decoding batch, reply room included; bounds memory.

    Grouped draws hold their prompt once. Memory: tokens x layers x 2 x kv-heads x head-dim x bytes, about 6 GB at
    the default on SmolLM2-135M in float32 and 13 GB on Qwen3-30B-A3B in bfloat16."""
    group_draws: bool = field(
        default=True,
        metadata=flag(
            name="hf-no-group-draws",
            negate=True,
            help="give every draw its own cache row instead of one per prompt (grouped attention; docs/speed.md)",
        ),
    )
    """Draws of one prompt keep its keys once and attend to them together (speed only: the same attention up to
    float rounding; tree and shared paths, n > 1, sdpa or eager attention). False: one cache row per draw."""

    reasoning_refill: bool = field(
        default=True,
        metadata=flag(
            name="hf-no-refill",
            negate=True,
            help="reason in fixed length buckets, each decoded until its longest trace ends, instead of giving a "
            "finished row to the next trial (docs/speed.md, 'Think mode')",
        ),
    )
    """Think mode: a row whose trace ended is given to the next waiting trial (:mod:`engines.hf.refill`), so
    reasoning costs about total tokens / rows + the longest trace in steps; the same for think mode's draws
    (reasoning, then the answer). False: fixed length buckets, each to its longest trace, and draws on the
    sample paths. Speed only in float32; outside it the schedule enters the run key (docs/gpu.md)."""
    experts_prefill: str = field(default="auto", metadata=flag(name="hf-experts-prefill", choices=EXPERTS))
    """Mixture-of-experts models: how the experts compute a forward over many tokens per row (prompts, trees).

    auto: as the model loaded (Transformers' default, grouped_mm); batched_mm copies each token's experts'
    weights, so it cannot prefill at scale (it asked for 218 GiB at 16 x 291 tokens on Qwen3-30B-A3B's widths).
    Speed only in float32; outside it the choice enters the run key (docs/gpu.md)."""
    experts_decode: str = field(default="auto", metadata=flag(name="hf-experts-decode", choices=EXPERTS))
    """Mixture-of-experts models: how the experts compute a decoding step (one token per row).

    auto: batched_mm on a GPU where prefill uses grouped_mm, else as prefill (Transformers' generate() rule,
    :func:`experts_by_phase`). Speed only in float32; outside it the choice enters the run key."""
    reasoning_rows: int = field(default=0, metadata=flag(name="hf-reasoning-rows"))
    """Think mode: most traces reasoned together; 0 (auto): ``batch_size`` on a CPU, on a GPU as many as half its
    free memory holds KV cache for.

    A bfloat16 think-mode run's tokens depend on which traces share a step, so set it to make such a run
    reproducible across machines with other free memory."""
    decode_graphs: str = field(default="auto", metadata=flag(name="hf-decode-graphs", choices=DECODE_GRAPHS))
    """Think mode's refilled decoding in steps of fixed shape (slots, :mod:`engines.hf.graphs`), each recorded in a
    CUDA graph on a GPU, so a step costs one launch instead of one per kernel.

    on: slots, recorded on one GPU (on a CPU or a split model the same steps run unrecorded); off: the refilled
    stack (:mod:`engines.hf.refill`); auto: off until a device check has measured graphs on a GPU (docs/gpu.md).
    Attention-only models (a Mamba hybrid reasons in buckets). Speed only in float32; outside it the schedule
    (``slots``) enters the run key."""

    SUPPORTS: ClassVar[Supports] = SUPPORTS

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.readout_path not in READOUT_PATHS:
            raise ValueError(f"readout_path must be one of {READOUT_PATHS}, got {self.readout_path!r}")
        if self.sample_path not in SAMPLE_PATHS:
            raise ValueError(f"sample_path must be one of {SAMPLE_PATHS}, got {self.sample_path!r}")
        for name in (
            "batch_size",
            "max_batch_tokens",
            "think_budget",
            "max_new_tokens",
            "tree_tokens",
            "sample_rows",
            "sample_cache_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.top_other < 0:
            raise ValueError(f"top_other must be >= 0, got {self.top_other}")
        if self.reasoning_rows < 0:
            raise ValueError(f"reasoning_rows must be >= 0 (0: auto), got {self.reasoning_rows}")
        check_device_arg(self.device)
        check_reasoning(self)
        if self.head_dtype not in HEAD_DTYPES:
            raise ValueError(f"head_dtype must be one of {HEAD_DTYPES}, got {self.head_dtype!r}")
        for name in ("experts_prefill", "experts_decode"):
            if getattr(self, name) not in EXPERTS:
                raise ValueError(f"{name} must be one of {EXPERTS}, got {getattr(self, name)!r}")
        if self.decode_graphs not in DECODE_GRAPHS:
            raise ValueError(f"decode_graphs must be one of {DECODE_GRAPHS}, got {self.decode_graphs!r}")


OWN_FLAGS = (
    "layers",
    "readout_path",
    "tree_tokens",
    "sample_path",
    "sample_rows",
    "sample_cache_tokens",
    "group_draws",
    "reasoning_refill",
    "reasoning_rows",
    "decode_graphs",
    "experts_prefill",
    "experts_decode",
    "head_dtype",
    "offload",
)
"""The fields of the Transformers engine's own flags, in their order in ``--help``."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The Transformers engine's own flags (speed only; the values do not change), from :class:`HFSettings`."""
    add_flags(p.add_argument_group("Transformers engine"), HFSettings, OWN_FLAGS)
