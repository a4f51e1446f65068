"""The vLLM engine's requests: the ``SamplingParams`` of slot, reasoning and sampling requests, and the rounds of
``max_tokens=1`` slot requests that read every trie node of a readout call (:func:`read_nodes`).

Pure functions of token ids, the trie and vLLM's replies (``generate`` is handed in): nothing here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from engines.base import RAW_SAMPLING
from engines.local import MAX_TOKEN_IDS, Prepared, with_stop
from engines.trie import Prefix, Trie
from probe.errors import ProbeError


class VLLMReadoutError(ProbeError, RuntimeError):
    """vLLM did not return a log probability that was explicitly asked for."""


Kind = Literal["token_ids", "top_k", "force"]


@dataclass(frozen=True)
class SlotQuery:
    """One ``max_tokens=1`` request at a trie node of one trial."""

    row: int
    """Index of the trial in the readout call."""
    prefix: Prefix
    """The trie node: option tokens already emitted after the prompt (``()`` is the slot itself)."""
    kind: Kind
    """token_ids: exactly ``tokens``; top_k: the ``k`` most likely (hoping ``tokens`` are among them);
    force: the single token ``tokens[0]``, the only one allowed."""
    tokens: tuple[int, ...]
    """The tokens whose log probabilities this request is for."""
    k: int = 0


def slot_params(q: SlotQuery) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments of one slot request: greedy, one token, raw logprobs."""
    kw: dict[str, Any] = {
        "n": 1,
        "max_tokens": 1,
        "temperature": 0.0,
        "detokenize": False,
        "skip_special_tokens": False,
    }
    if q.kind == "token_ids":
        kw["logprob_token_ids"] = list(q.tokens)
    elif q.kind == "top_k":
        kw["logprobs"] = q.k
    else:  # the mask applies after the raw logprobs are taken, so this reads p(t) unmasked
        kw["logprobs"] = 0
        kw["allowed_token_ids"] = [q.tokens[0]]
    return kw


def node_queries(row: int, prefix: Prefix, kids: Sequence[int], kind: Kind, k: int = 0) -> list[SlotQuery]:
    """The requests that read ``kids`` at one trie node (``token_ids`` in chunks vLLM accepts)."""
    if kind == "token_ids":
        return [
            SlotQuery(row, prefix, "token_ids", tuple(kids[i : i + MAX_TOKEN_IDS]))
            for i in range(0, len(kids), MAX_TOKEN_IDS)
        ]
    if kind == "top_k":
        return [SlotQuery(row, prefix, "top_k", tuple(kids), k)]
    return [SlotQuery(row, prefix, "force", (t,)) for t in kids]


def _by_kind(queries: Sequence[SlotQuery]) -> list[list[SlotQuery]]:
    """Queries grouped by kind, one ``generate`` call each.

    vLLM's V1 sampler answers a whole batch from the ``logprob_token_ids``
    gather as soon as one request in it has them, so a top-k request batched
    with token-id requests would get back only its sampled token. Never mixing
    kinds in one call keeps every reply what its request asked for.
    """
    order: tuple[Kind, ...] = ("token_ids", "top_k", "force")
    return [g for kind in order if (g := [q for q in queries if q.kind == kind])]


def position_logprobs(output: Any) -> dict[int, float]:
    """``{token id: raw logprob}`` at the first generated position of a vLLM ``RequestOutput``."""
    comp = output.outputs[0]
    if not comp.logprobs:
        raise VLLMReadoutError(f"vLLM returned no logprobs for request {getattr(output, 'request_id', '?')}")
    pos = comp.logprobs[0]
    return {int(t): float(getattr(lp, "logprob", lp)) for t, lp in pos.items()}


def sampled_token(output: Any) -> int:
    return int(output.outputs[0].token_ids[0])


def read_nodes(
    prepared: Sequence[Prepared],
    tries: Sequence[Trie],
    kind: Kind,
    *,
    top_other: int,
    cap: int,
    generate: Callable[[Sequence[Sequence[int]], Sequence[dict[str, Any]]], list[Any]],
) -> tuple[list[dict[Prefix, dict[int, float]]], list[dict[int, float]]]:
    """Conditional logprobs of every trie node's children, and everything seen at each slot.

    Round 1 reads every slot; round 2 the deeper trie nodes, on prefixes
    now in the prefix cache; round 3 (token-id path) the slot's top-k for
    ``top_other``. After any round, option tokens a reply lacked are asked
    for again, one forced token each, before the next round. ``kind``: how
    option tokens are asked for (token_ids or top_k); ``cap``: the most
    top-k logprobs one request may ask for; ``generate``: one ``LLM.generate``
    call on token prompts, results in input order.
    """
    cond: list[dict[Prefix, dict[int, float]]] = [{} for _ in prepared]
    seen: list[dict[int, float]] = [{} for _ in prepared]
    rounds: list[list[SlotQuery]] = [[], [], []]
    for i, trie in enumerate(tries):
        kids = trie[()]
        if kind == "top_k":
            rounds[0] += node_queries(i, (), kids, "top_k", min(cap, len(kids) + top_other))
        else:
            rounds[0] += node_queries(i, (), kids, "token_ids")
            if top_other:
                rounds[2].append(SlotQuery(i, (), "top_k", (), min(cap, len(kids) + top_other)))
        for node, node_kids in trie.items():
            if node:
                rounds[1] += node_queries(i, node, node_kids, kind, min(cap, len(node_kids)))
    while rounds:
        todo = rounds.pop(0)
        retry: list[SlotQuery] = []
        for group in _by_kind(todo):
            prompts = [(*prepared[q.row].ids, *q.prefix) for q in group]
            outs = generate(prompts, [slot_params(q) for q in group])
            for q, res in zip(group, outs, strict=True):
                retry += absorb(q, res, cond[q.row], seen[q.row])
        if retry:
            rounds.insert(0, retry)
    return cond, seen


def absorb(q: SlotQuery, res: Any, cond: dict[Prefix, dict[int, float]], seen: dict[int, float]) -> list[SlotQuery]:
    """Store one reply's logprobs; return the forced re-asks for option tokens it lacked."""
    got = position_logprobs(res)
    if q.kind == "force" and sampled_token(res) != q.tokens[0]:
        raise VLLMReadoutError(f"vLLM sampled token {sampled_token(res)} although only {q.tokens[0]} was allowed")
    if not q.prefix:
        for t, lp in got.items():
            seen.setdefault(t, lp)
    known = cond.setdefault(q.prefix, {})
    missing = []
    for t in q.tokens:
        if t in got:
            known.setdefault(t, got[t])
        elif t not in known:
            missing.append(t)
    if missing and q.kind == "force":
        raise VLLMReadoutError(f"vLLM did not return the logprob of forced token {missing[0]}")
    return node_queries(q.row, q.prefix, missing, "force")


def think_params(budget: int, stops: Iterable[int], sampling: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Reasoning up to ``budget`` tokens, stopping at ``</think>`` or end of turn: greedy (the default), or sampled
    as ``sampling`` says (:func:`engines.local.reasoning_sampling`: temperature, top-p, top-k and the trial's own
    seed)."""
    return {
        "n": 1,
        "max_tokens": budget,
        "temperature": 0.0,
        "stop_token_ids": sorted(stops),
        "detokenize": False,
        "skip_special_tokens": False,
        **(sampling or {}),
    }


def sample_params(temperature: float, seed: int, max_tokens: int, stops: Iterable[int]) -> dict[str, Any]:
    """Raw sampling: the model's distribution at ``temperature``, nothing truncated or penalized."""
    return {
        "n": 1,
        "temperature": float(temperature),
        **RAW_SAMPLING,
        "seed": seed,
        "max_tokens": max_tokens,
        "stop_token_ids": sorted(stops),
        "detokenize": False,
        "skip_special_tokens": False,
    }


def generated_ids(output: Any, end_id: int) -> list[int]:
    """The generated ids with their stop token (vLLM keeps it; restored from ``stop_reason`` if a version did not)."""
    comp = output.outputs[0]
    return with_stop(comp.token_ids, getattr(comp, "stop_reason", None), end_id)
