"""The compute a workload needs at the least: unique tokens and their FLOPs (pure functions).

The least any method must compute is every *distinct* token prefix once: the
nodes of the token tree of all prompts and option prefixes of the workload
(:func:`engines.hf.pack_tree` builds exactly that tree). A node at depth d
costs the model's active linear layers plus attention over its d + 1
ancestors; the vocabulary projection is needed only where a distribution is
read (one per distinct sequence). Norms, activations and routing are left
out: they are memory-bound and small, so the limit stays a lower bound on
time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Need:
    """What a workload needs at the least."""

    unique_tokens: int
    readouts: int
    """Distinct sequences whose next-token distribution is read."""
    flops: float


def linear_flops_per_token(config: Any) -> float:
    """2 x the weights one token multiplies with in a Qwen3-MoE decoder (attention projections, router, active experts)."""
    if getattr(config, "model_type", None) != "qwen3_moe":
        raise ValueError(f"the FLOP model covers qwen3_moe, got {getattr(config, 'model_type', None)!r}")
    if getattr(config, "mlp_only_layers", None) or getattr(config, "decoder_sparse_step", 1) != 1:
        raise ValueError(
            "the FLOP model assumes a MoE block in every layer (mlp_only_layers=[], decoder_sparse_step=1)"
        )
    h, heads, kv, hd = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    attention = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    experts = config.num_experts_per_tok * 3 * h * config.moe_intermediate_size
    router = h * config.num_experts
    return 2.0 * config.num_hidden_layers * (attention + router + experts)


def attention_flops(config: Any, depth: int) -> float:
    """Scores and weighted values of one token at ``depth`` over its ``depth + 1`` keys, all layers."""
    return 4.0 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * (depth + 1)


def workload_need(config: Any, seqs: Sequence[Sequence[int]]) -> Need:
    """Unique tokens and FLOPs of reading the next-token distribution after each of ``seqs``."""
    from engines.hf import pack_tree

    tree = pack_tree(seqs)
    per_token = linear_flops_per_token(config)
    attention = attention_flops(config, 0) * sum(d + 1 for d in tree.depth)
    readouts = len(tree.shared)
    head = 2.0 * config.hidden_size * config.vocab_size * readouts
    return Need(len(tree.tokens), readouts, per_token * len(tree.tokens) + attention + head)
