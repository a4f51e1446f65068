"""Exact scoring of whole option strings through a token trie (pure functions).

An option is a *complete answer*: its probability is the probability that the
reply starts with its tokens **and does not continue into a longer option**.
So when ``1``, ``10`` and ``100`` are all options (digits are single tokens in
Qwen-style tokenizers),

    P("1")   = p(1) * (1 - p(0 | 1))
    P("10")  = p(1) * p(0 | 1) * (1 - p(0 | 10))
    P("100") = p(1) * p(0 | 1) * p(0 | 10)

and the options partition the space of replies: their probabilities sum to at
most 1 (the rest is the *coverage* gap). An option that is a prefix of no other
option gets the plain chain-rule probability of its tokens, the quantity
lm-evaluation-harness calls ``loglikelihood``.

The engine needs the conditional next-token distribution at the root (the
answer slot) and after every *proper prefix* of an option: those prefixes are
the trie's internal nodes, expanded one token per step on the prompt's cache.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

Prefix = tuple[int, ...]
Trie = dict[Prefix, tuple[int, ...]]
"""Internal node (a proper prefix of some option, the root ``()`` included) -> its child tokens, sorted."""


def build_trie(options: Sequence[Sequence[int]]) -> Trie:
    """The internal nodes of the trie of ``options`` with their child tokens."""
    children: dict[Prefix, set[int]] = {}
    for opt in options:
        if not opt:
            raise ValueError("an option encodes to zero tokens; options must be non-empty strings")
        for i in range(len(opt)):
            children.setdefault(tuple(opt[:i]), set()).add(opt[i])
    return {p: tuple(sorted(c)) for p, c in sorted(children.items(), key=lambda kv: (len(kv[0]), kv[0]))}


def option_logprobs(
    options: Sequence[Sequence[int]],
    trie: Trie,
    cond: Mapping[Prefix, Mapping[int, float]],
) -> list[float]:
    """log P(option is the whole answer) for each option.

    ``cond[p][t]`` is log p(t | prompt + p) for every internal node ``p`` and
    each of its children ``t``. The "ends here" factor of an option that is
    also an internal node is ``1 - sum of its children's probabilities``,
    computed with ``log1p`` in float64 so that a tiny remainder is not lost.
    """
    out: list[float] = []
    for opt in options:
        key = tuple(opt)
        lp = 0.0
        for i, tok in enumerate(key):
            lp += cond[key[:i]][tok]
        if key in trie:  # a prefix of a longer option: only the mass that stops here counts
            cont = math.fsum(math.exp(cond[key][c]) for c in trie[key])
            lp += math.log1p(-cont) if cont < 1.0 else -math.inf
        out.append(lp)
    return out


def normalize(logprobs: Sequence[float]) -> tuple[list[float], float]:
    """Probabilities normalized over the options, and the coverage (their total mass)."""
    top = max(logprobs)
    if top == -math.inf:
        n = len(logprobs)
        return [1.0 / n] * n, 0.0
    weights = [math.exp(lp - top) for lp in logprobs]
    total = math.fsum(weights)
    return [w / total for w in weights], math.exp(top) * total
