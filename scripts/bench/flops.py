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


DENSE = ("llama", "qwen2", "qwen3", "mistral")
"""Dense decoders whose layers are attention plus a gated MLP (SmolLM2 is ``llama``)."""


def linear_flops_per_token(config: Any) -> float:
    """2 x the weights one token multiplies with: attention projections plus a Qwen3-MoE's router and active
    experts, or a dense decoder's gated MLP (gate, up and down projections)."""
    kind = getattr(config, "model_type", None)
    if kind in DENSE:
        h, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        hd = getattr(config, "head_dim", None) or h // heads
        attention = h * heads * hd + 2 * h * kv * hd + heads * hd * h
        return 2.0 * config.num_hidden_layers * (attention + 3 * h * config.intermediate_size)
    if kind != "qwen3_moe":
        raise ValueError(f"the FLOP model covers qwen3_moe and {', '.join(DENSE)}, got {kind!r}")
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
    hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 4.0 * config.num_hidden_layers * config.num_attention_heads * hd * (depth + 1)


def workload_need(config: Any, seqs: Sequence[Sequence[int]]) -> Need:
    """Unique tokens and FLOPs of reading the next-token distribution after each of ``seqs``."""
    from engines.hf.tokens import pack_tree

    tree = pack_tree(seqs)
    per_token = linear_flops_per_token(config)
    attention = attention_flops(config, 0) * sum(d + 1 for d in tree.depth)
    readouts = len(tree.shared)
    head = 2.0 * config.hidden_size * config.vocab_size * readouts
    return Need(len(tree.tokens), readouts, per_token * len(tree.tokens) + attention + head)


def sampling_need(config: Any, prompts: Sequence[Sequence[int]], generated: Sequence[Sequence[int]]) -> Need:
    """The least compute of sampling: every distinct prompt prefix once, then each generated token once.

    ``generated[i]`` lists the lengths of the draws of ``prompts[i]`` (stop token included). A draw's k-th token
    (k = 0, 1, ...) is computed at depth ``len(prompt) + k - 1`` except the last, whose distribution is never
    read; every distribution that is sampled from costs one vocabulary projection (one per token drawn).
    """
    tree = workload_need(config, prompts)
    per_token = linear_flops_per_token(config)
    head = 2.0 * config.hidden_size * config.vocab_size
    tokens, flops, draws = 0, 0.0, 0
    for prompt, lengths in zip(prompts, generated, strict=True):
        for g in lengths:
            draws += 1
            fed = max(0, g - 1)  # the last token drawn is never fed back
            tokens += fed
            flops += per_token * fed + sum(attention_flops(config, len(prompt) + k) for k in range(fed))
            flops += head * fed  # the first draw's distribution is the prompt's, counted in the tree
    return Need(tree.unique_tokens + tokens, tree.readouts + tokens, tree.flops + flops)
