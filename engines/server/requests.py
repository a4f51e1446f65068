"""The requests of a readout through a server (:mod:`engines.server`), one per trie node (or leaf) of each trial,
and what their replies add up to: the trie's conditionals (:class:`Conditionals`) and, where a top-k left option
tokens out, the bounded readout (:func:`bounded_readout`).

Pure functions of token ids, the trie and the parsed replies: no network here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.api.providers import TransportError
from engines.local import MAX_TOKEN_IDS, Prepared, assembled_readout
from engines.server.replies import SENTINEL, ServerRefused, ServerReply
from engines.trie import Prefix, Trie
from probe.types import Readout, Trial


@dataclass(frozen=True)
class Request:
    """One request of a readout: its body, and what it is for."""

    row: int
    """Index of the trial in the readout call."""
    prefix: Prefix
    """The trie node (``()``: the slot) the body's prompt ends at (prompt_logprobs: the leaf it covers)."""
    kind: str
    """token_ids, top_k, prompt_logprobs or think."""
    body: Mapping[str, Any]
    tokens: tuple[int, ...] = ()
    """The option tokens this request reads (token_ids, top_k)."""
    start: int = 0
    """prompt_logprobs: the prompt position the option starts at (the replies keep the positions from there)."""

    @property
    def sent(self) -> int:
        return len(self.body["prompt"])


def completion_body(model: str, prompt: Sequence[int], **extra: Any) -> dict[str, Any]:
    """A greedy one-token ``/v1/completions`` body on a token-id prompt, ids returned as ``token_id:N``."""
    return {
        "model": model,
        "prompt": [int(t) for t in prompt],
        "max_tokens": 1,
        "temperature": 0.0,
        "return_tokens_as_token_ids": True,
        **extra,
    }


def node_requests(
    model: str, row: int, ids: Sequence[int], trie: Trie, mode: str, *, top_other: int, cap: int
) -> list[Request]:
    """The requests that read every conditional of one trial's trie in ``mode`` (and the slot's top-k)."""
    out: list[Request] = []
    kids0 = trie[()]
    k0 = max(1, min(cap, len(kids0) + top_other))
    if mode == "prompt_logprobs":
        leaves = sorted({tuple(opt) for node, kids in trie.items() for t in kids if (opt := (*node, t)) not in trie})
        for leaf in leaves:
            body = completion_body(model, (*ids, *leaf), prompt_logprobs=k0 if top_other else 0)
            out.append(Request(row, leaf, "prompt_logprobs", body, leaf, start=len(ids)))
        return out
    for node, kids in trie.items():
        prompt = (*ids, *node)
        if mode == "token_ids":
            for i in range(0, len(kids), MAX_TOKEN_IDS):
                chunk = kids[i : i + MAX_TOKEN_IDS]
                body = completion_body(model, prompt, logprobs=1, logprob_token_ids=list(chunk))
                out.append(Request(row, node, "token_ids", body, tuple(chunk)))
        else:
            k = cap  # as many as the server gives: every option token it returns is one less bound
            out.append(Request(row, node, "top_k", completion_body(model, prompt, logprobs=k), tuple(kids)))
    if mode == "token_ids" and top_other:
        out.append(Request(row, (), "top_k", completion_body(model, ids, logprobs=k0)))
    return out


def by_kind(requests: Sequence[Request]) -> list[list[Request]]:
    """Requests grouped by kind, sent one group after the other, each with the slots first (their prompts then
    sit in the prefix cache for the deeper nodes).

    vLLM's V1 sampler answers a whole batch from the ``logprob_token_ids`` gather as soon as one request in it
    has them, so a top-k request that the server batches with token-id requests gets back only the gathered
    tokens (the in-process engine never mixes them in one ``generate`` call for the same reason). Sending the
    kinds apart keeps this client's requests out of each other's batches; :func:`check_top_k` catches a top-k
    reply that was answered so anyway (another client's requests in the same batch), and it is sent again.
    """
    order = ("think", "token_ids", "top_k", "prompt_logprobs")
    return [sorted(g, key=lambda q: len(q.prefix)) for kind in order if (g := [q for q in requests if q.kind == kind])]


def check_top_k(q: Request, reply: ServerReply) -> None:
    """A top-k reply must carry the k finite log probabilities asked for; else it is a transport failure (sent
    again): a batch answered from another request's ``logprob_token_ids`` (see :func:`by_kind`)."""
    if q.kind != "top_k":
        return
    k = int(q.body.get("logprobs") or 0)
    values = [reply.slot[t] for t in reply.ranked]
    if len(reply.ranked) < k or not all(math.isfinite(v) for v in values):
        raise TransportError(
            "malformed",
            f"the server returned {len(reply.ranked)} top log probabilities ({values[:4]}) of the {k} asked for "
            "(vLLM answers a batch that mixes logprob_token_ids requests from their gather)",
        )


@dataclass
class Conditionals:
    """What one trial's replies say: log p(child | prompt + node), and every token seen at the slot."""

    cond: dict[Prefix, dict[int, float]] = field(default_factory=dict)
    seen: dict[int, float] = field(default_factory=dict)
    floor: dict[Prefix, float] = field(default_factory=dict)
    """top_logprobs: the smallest log probability returned at a node (a token not returned lies at or below it)."""
    returned: dict[Prefix, dict[int, float]] = field(default_factory=dict)
    """top_logprobs: every token returned at a node (their mass bounds what was not returned)."""

    def absorb(self, q: Request, r: ServerReply) -> None:
        if q.kind == "prompt_logprobs":
            for i, t in enumerate(q.prefix):
                pos = r.prompt[i] if i < len(r.prompt) else {}
                if t not in pos:
                    raise ServerRefused(
                        f"the server's prompt_logprobs lack the prompt token {t} at position {q.start + i}; "
                        "it does not return the actual token's log probability"
                    )
                self.cond.setdefault(q.prefix[:i], {}).setdefault(t, pos[t])
                if i == 0:
                    for tok, lp in pos.items():
                        self.seen.setdefault(tok, lp)
            return
        if not q.prefix:
            for t, lp in r.slot.items():
                self.seen.setdefault(t, lp)
        known = self.cond.setdefault(q.prefix, {})
        for t in q.tokens:
            if t in r.slot:
                known.setdefault(t, r.slot[t])
            elif q.kind == "token_ids":
                raise ServerRefused(f"the server did not return the log probability of requested token {t}")
        if q.kind == "top_k" and r.slot:
            self.floor[q.prefix] = min(r.slot.values())
            self.returned.setdefault(q.prefix, {}).update(r.slot)


def bounded_readout(
    trial: Trial,
    prep: Prepared,
    trie: Trie,
    c: Conditionals,
    *,
    top_other: tuple[tuple[str, float], ...],
    computed: int,
) -> tuple[Readout, int]:
    """The readout of a top_logprobs trial whose option tokens were not all returned, and how many options are
    bounded.

    A bounded option's log probability is the most it can be: a token the server did not return at a node lies
    at or below the smallest log probability returned there (the node's floor) and within the mass the top-k
    left over, so a missing step of its path is taken at that bound; where a missing token would continue the
    option into a longer one, the mass that stops there is at most one minus the known continuations. It is
    never zero. ``coverage`` sums only the options whose every conditional was returned (a lower bound).
    """
    missing = {(node, kid) for node, kids in trie.items() for kid in kids if kid not in c.cond.get(node, {})}

    def step(node: Prefix, kid: int) -> float:
        if (node, kid) not in missing:
            return c.cond[node][kid]
        bound = c.floor.get(node, SENTINEL)
        left = 1.0 - math.fsum(math.exp(v) for v in c.returned.get(node, {}).values())
        return min(bound, math.log(left)) if left > 0 else bound

    lps, exact = [], []
    for opt in prep.options:
        key = tuple(opt)
        lp = math.fsum(step(key[:i], key[i]) for i in range(len(key)))
        if key in trie:
            cont = math.fsum(math.exp(c.cond[key][k]) for k in trie[key] if (key, k) not in missing)
            lp += math.log1p(-cont) if cont < 1.0 else -math.inf
        used = {(key[:i], key[i]) for i in range(len(key))} | {(key, kid) for kid in trie.get(key, ())}
        lps.append(lp)
        exact.append(not (used & missing))
    known = math.fsum(math.exp(lp) for lp, ok in zip(lps, exact, strict=True) if ok)
    readout = assembled_readout(trial, prep, lps, top_other=top_other, computed=computed, coverage=known)
    return readout, exact.count(False)
