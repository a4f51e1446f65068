"""Readouts through a server: the answer-slot distribution from a running vLLM (or any OpenAI-compatible server
that returns log probabilities), the same :class:`~probe.types.Readout` records as the local engines.

Selected by the model spec users already write for sampling, ``openai-compatible:<name>@<url>``, whenever a
readout is wanted (``probe readout``; ``probe run`` without ``--no-readout``; see :func:`engines.make_engine`).

Why it is shaped like this:

* **The client renders, the server computes.** Every trial is rendered to token ids by
  :mod:`engines.render` with the model's tokenizer (a local copy: ``--tokenizer``, else the served name resolved
  as a local model, e.g. ``tiny`` or ``smol``), exactly as the local engines render it, and sent as a token-id
  prompt to ``/v1/completions``. The server's chat template is never used. Each reply's ``usage.prompt_tokens``
  must equal the ids sent: a server that counted otherwise read a different prompt, and the run is refused,
  naming both counts.
* **Exact option scoring, by what the server offers** (found by the canary, below):
  ``token_ids``: vLLM's ``logprob_token_ids``, the log probabilities of exactly the option tokens, one
  ``max_tokens=1`` request per trie node (:mod:`engines.trie`), plus one top-k request at the slot for the most
  likely non-option tokens: the in-process vLLM engine's requests, sent over HTTP.
  ``prompt_logprobs``: vLLM's ``prompt_logprobs`` on ``prompt + option``: the actual token's log probability at
  every prompt position, inside or outside the top-k, so one request per trie *leaf* (an option that is a
  prefix of no other) gives every conditional on its path, and every trie edge lies on some leaf's path.
  ``top_logprobs``: the plain OpenAI ``logprobs`` top-k at each trie node. An option token outside the top-k is
  not known: its log probability is reported as the bound it cannot exceed (the chain with that token at the
  k-th log probability), never as zero, and ``coverage`` counts only the options known exactly, a lower bound.
* **A canary, once per engine** (:meth:`ServerEngine.load`): one request per mode on a fixed prompt, checked
  for what a working server must return: the prompt token count, finite log probabilities in (-9999, 0], not
  all equal, not all zero, a top-k sorted with the greedy token first, the same value for the same token asked
  two ways. A server that returns constant, zero, sentinel or missing log probabilities (llama.cpp echoes 0.0;
  some providers -9999) is refused with one line naming what it returned. What was found (the modes, the mode
  used, the server's ``/version``, the URL without credentials) goes into the manifest.
* **The API engine's transport, held, not inherited.** The engine holds a :class:`engines.api_transport.Transport`
  (the client, the adaptive concurrency limit, transport retries, the run folder's lock); each readout request is
  a typed :class:`Request` whose ``/v1/completions`` reply is read into a typed :class:`ServerReply`, appended,
  fsync-ed, to ``results/server-journal.jsonl`` (:class:`engines.api_journal.AppendLog`) keyed by the hash of its
  whole request body, so a killed run resumes without sending an answered request again.
* **Sampling through the same prompt.** ``sample()`` is an :class:`engines.api.ApiEngine` the server engine holds
  on the same transport (its journal, budget, progress and parsing), asking each draw through this module
  (:meth:`ServerEngine._ask_draw`): a ``/v1/completions`` request on the same rendered token ids with raw sampling
  (no top-k, top-p, min-p or penalties) and the draw's seed, its completion read as the draw's reply (the text
  decoded from the generated ids), so readout and sampled behaviour come from one prompt and one endpoint, and
  the readout temperature calibration of local runs applies.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import math
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from engines.api import ApiEngine, ApiSettings, Draw, parse_model_spec, request_identity
from engines.api import from_args as api_from_args
from engines.api_journal import AppendLog
from engines.api_limits import RetryPolicy
from engines.api_pricing import Usage
from engines.api_providers import Reply, TransportError
from engines.api_transport import ClientFactory, Transport, TransportGaveUp
from engines.base import (
    RAW_SAMPLING,
    Draws,
    Engine,
    EngineSettings,
    ProgressFn,
    draw_seed,
    reasoning_record,
    require,
)
from engines.flags import NO_FLAG, add_flags, flag, settings_from_flags
from engines.local import (
    Prepared,
    RendersLocally,
    ThinkRequest,
    assembled_readout,
    folder_info,
    slot_readout,
    with_stop,
)
from engines.render import rendered_system_prompt
from engines.trie import Prefix, Trie, build_trie
from probe.errors import ModelError, ProbeError
from probe.types import Message, Readout, Sample, Trial

MODES = ("auto", "token_ids", "prompt_logprobs", "top_logprobs")
"""How option tokens are read (``--server-readout``); auto: the first of the others the server offers."""
EXACT_MODES = ("token_ids", "prompt_logprobs")
MAX_TOKEN_IDS = 128
"""Most ids one ``logprob_token_ids`` request may carry (vLLM's ``MAX_LOGPROB_TOKEN_IDS``)."""
SENTINEL = -9999.0
"""A log probability at or below this is a provider's stand-in for "unknown", not a value."""
JOURNAL = "server-journal.jsonl"
CANARY_PROMPT = "Is water wet? Answer with Yes or No."
CANARY_OPTIONS = ("Yes", "No")


class ServerRefused(ProbeError, ValueError):
    """The server cannot give exact readouts (or lied about them); one line, exit 2 at the CLI."""


class NoLogprobs(ServerRefused):
    """The server returns no log probabilities at all (a sampling-only server)."""


# --------------------------------------------------------------- settings
@dataclass(frozen=True)
class ServerSettings(ApiSettings):
    """The API engine's settings, and how the slot is read through the server (each field its flag but
    ``top_other``, :mod:`engines.flags`)."""

    tokenizer: str | None = None
    """Local copy of the served model's tokenizer: a folder, tiny, smol or a cached hub id (default: the served
    name, resolved as a local model)."""
    readout_mode: str = field(default="auto", metadata=flag(name="server-readout", choices=MODES))
    """How option tokens are read: token_ids (vLLM logprob_token_ids), prompt_logprobs (vLLM), top_logprobs (any
    server; options outside the top-k are bounded), auto (the first the server offers, in that order)."""
    top_other: int = field(default=5, metadata=NO_FLAG)
    """How many of the most likely non-option tokens to report (as the local engines)."""
    top_logprobs: int = 20
    """Most top-k log probabilities asked for in one request.

    vLLM's and OpenAI's default cap is 20."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.provider != "openai-compatible":
            raise ValueError(
                f"readouts through a server need an openai-compatible:<name>@<url> model, got {self.provider}"
            )
        if self.readout_mode not in MODES:
            raise ValueError(f"--server-readout must be one of {', '.join(MODES)}, got {self.readout_mode!r}")
        if not isinstance(self.top_other, int) or self.top_other < 0:
            raise ValueError(f"top_other must be an integer >= 0, got {self.top_other!r}")
        if not isinstance(self.top_logprobs, int) or self.top_logprobs < 1:
            raise ValueError(f"--top-logprobs must be an integer >= 1, got {self.top_logprobs!r}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The server readout's own flags (the API engine's, like --concurrency, apply too)."""
    g = p.add_argument_group("readouts through a server (openai-compatible:<name>@<url> with a readout)")
    add_flags(g, ServerSettings, own=True)


def settings_from_args(model: str, a: argparse.Namespace) -> ServerSettings:
    """The settings of ``openai-compatible:`` model ``model`` with the parsed flags (the API engine's and these)."""
    spec = parse_model_spec(model)
    return settings_from_flags(ServerSettings, a, provider=spec.provider, model=spec.model, base_url=spec.base_url)


def from_args(model: str, a: argparse.Namespace) -> Any:
    """A server engine, checked by its canary; where the server returns no log probabilities at all (or there is no
    local copy of the model's tokenizer) and the run also samples (``--samples N``), the plain API engine with a
    one-line notice (the sample-only run it was)."""
    engine = ServerEngine(settings_from_args(model, a))
    try:
        return engine.load()
    except (NoLogprobs, ModelError) as e:  # no log probabilities, or no local tokenizer to render the prompt with
        if not getattr(a, "samples", 0):
            raise
        engine._log(f"api: {e}; sampling only (pass --no-readout to skip this check)")
        return api_from_args(model, a)


# ------------------------------------------------------------- pure parts
def public_url(url: str | None) -> str | None:
    """``url`` without user, password, query or fragment (what the manifest may keep)."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def body_key(body: Mapping[str, Any]) -> str:
    """The journal key of one request: the hash of its whole body (same body, same reply)."""
    text = json.dumps(dict(body), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def token_id(key: str | int, reverse: Mapping[str, int] | None = None) -> int | None:
    """The id of a returned token: ``token_id:N`` (vLLM's ``return_tokens_as_token_ids``), an int, a digit
    string (``prompt_logprobs`` keys), or a decoded string found once in ``reverse``; None where it is unknown."""
    if isinstance(key, int):
        return key
    if key.startswith("token_id:"):
        return int(key[len("token_id:") :])
    if key.isdigit() and reverse is None:
        return int(key)
    return (reverse or {}).get(key)


@dataclass(frozen=True)
class ServerReply:
    """What one ``/v1/completions`` reply says, reduced to what a readout uses (journaled as is)."""

    prompt_tokens: int
    """The server's count of the prompt (``usage.prompt_tokens``)."""
    slot: Mapping[int, float]
    """Log probabilities at the first generated position: the sampled token and the returned top-k or ids."""
    ranked: tuple[int, ...] = ()
    """The top-k ids at that position, in the server's order (the sampled token first where it leads)."""
    prompt: tuple[Mapping[int, float], ...] = ()
    """``prompt_logprobs`` at the prompt positions from ``start`` on (each: the actual token and the top-k)."""
    generated: tuple[int, ...] = ()
    """The generated ids (the stop token included where the server stopped on one)."""
    finish: str = ""
    stop_reason: int | str | None = None

    def to_record(self) -> dict[str, Any]:
        d = asdict(self)
        d["slot"] = {str(k): v for k, v in self.slot.items()}
        d["prompt"] = [{str(k): v for k, v in p.items()} for p in self.prompt]
        return d

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> ServerReply:
        return cls(
            prompt_tokens=int(r["prompt_tokens"]),
            slot={int(k): float(v) for k, v in r["slot"].items()},
            ranked=tuple(int(t) for t in r.get("ranked", ())),
            prompt=tuple({int(k): float(v) for k, v in p.items()} for p in r.get("prompt", ())),
            generated=tuple(int(t) for t in r.get("generated", ())),
            finish=str(r.get("finish", "")),
            stop_reason=r.get("stop_reason"),
        )


def parse_completion(d: Any, *, start: int = 0, reverse: Mapping[str, int] | None = None) -> ServerReply:
    """A ``/v1/completions`` response body to a :class:`ServerReply`; a body of the wrong shape is a transport
    failure (retried), like the API engine's."""
    if not isinstance(d, Mapping) or not isinstance(d.get("choices"), list) or not d["choices"]:
        raise TransportError("malformed", f"response without choices: {json.dumps(d, default=str)[:200]}")
    c = d["choices"][0]
    usage = d.get("usage") or {}
    slot: dict[int, float] = {}
    ranked: list[int] = []
    lp = c.get("logprobs") or {}
    tokens = list(lp.get("tokens") or [])
    top = list(lp.get("top_logprobs") or [])
    if top and isinstance(top[0], Mapping):
        for k, v in top[0].items():
            t = token_id(k, reverse)
            if t is not None and v is not None:
                slot.setdefault(t, float(v))
                ranked.append(t)
    values = list(lp.get("token_logprobs") or [])
    if tokens and values and values[0] is not None:
        t = token_id(tokens[0], reverse)
        if t is not None:
            slot.setdefault(t, float(values[0]))
    generated = [int(t) for t in c.get("token_ids") or []]
    if not generated and tokens:
        ids = [token_id(t, reverse) for t in tokens]
        generated = [int(t) for t in ids if t is not None] if None not in ids else []
    prompt: list[dict[int, float]] = []
    for pos in list(c.get("prompt_logprobs") or [])[start:]:
        entry: dict[int, float] = {}
        for k, v in (pos or {}).items():
            value = v.get("logprob") if isinstance(v, Mapping) else v
            if value is not None:
                entry[int(k)] = float(value)
        prompt.append(entry)
    return ServerReply(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        slot=slot,
        ranked=tuple(ranked),
        prompt=tuple(prompt),
        generated=tuple(generated),
        finish=str(c.get("finish_reason") or ""),
        stop_reason=c.get("stop_reason"),
    )


def check_values(what: str, values: Sequence[float], *, varied: bool = True) -> None:
    """Refuse log probabilities no working server returns: missing, non-finite, positive, sentinel, all zero, or
    (``varied``) all equal."""
    if not values:
        raise NoLogprobs(f"the server returned no log probabilities for {what}")
    shown = ", ".join(f"{v:g}" for v in list(values)[:6])
    bad = [v for v in values if not math.isfinite(v) or v > 1e-6 or v <= SENTINEL]
    if bad:
        raise ServerRefused(
            f"the server returned log probabilities outside (-9999, 0] for {what} ({shown}): they are not real "
            "log probabilities; use a server that computes them (vLLM) or sample with --samples N --no-readout"
        )
    if all(v == 0.0 for v in values) and len(values) > 1:
        raise ServerRefused(
            f"the server returned 0.0 for every log probability of {what} ({shown}), as servers that do not compute "
            "them do (llama.cpp's echo); use a server that computes them (vLLM) or sample with --no-readout"
        )
    if varied and len(values) > 1 and max(values) - min(values) == 0.0:
        raise ServerRefused(
            f"the server returned the same log probability for every token of {what} ({shown}); "
            "use a server that computes them (vLLM) or sample with --no-readout"
        )


def check_prompt_count(sent: int, reply: ServerReply, what: str) -> None:
    """Refuse a reply whose server read a prompt of another length than the ids sent."""
    if reply.prompt_tokens != sent:
        raise ServerRefused(
            f"the server counted {reply.prompt_tokens} prompt tokens for {what}, but probe sent {sent} token ids: "
            "it did not read the prompt probe rendered (a server that re-tokenizes or adds tokens); use a server "
            "that takes token-id prompts as given (vLLM)"
        )


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


def reasoning_sampling(s: EngineSettings, seed: int) -> dict[str, Any]:
    """The sampling fields of a think request: none for greedy reasoning, else the local engines' settings
    (``--think-sampling``) with the trial's own ``seed`` (:func:`engines.base.reasoning_seed`), so the server
    reasons as ``engines.vllm`` does."""
    if s.think_temperature == 0:
        return {}
    return {
        "temperature": float(s.think_temperature),
        "top_p": float(s.think_top_p),
        "top_k": int(s.think_top_k),
        "seed": seed,
    }


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


# ------------------------------------------------------------------ engine
class ServerEngine(RendersLocally, Engine):
    """Answer-slot readouts and samples through an OpenAI-compatible server; see the module docstring.

    It holds its :class:`~engines.api_transport.Transport` and, for sampling, an :class:`~engines.api.ApiEngine`
    on that transport (:attr:`sampler`) whose draws it asks itself. ``tokenizer`` and ``client_factory`` can be
    injected (tests).
    """

    name = "server"
    settings: ServerSettings
    value_settings = (*ApiEngine.value_settings, "top_other", "think_budget")
    """The API engine's value settings, and how many non-option tokens a readout reports and how long it reasons."""

    def __init__(
        self,
        settings: ServerSettings,
        *,
        tokenizer: Any = None,
        client_factory: ClientFactory | None = None,
        log: Any = None,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        self.settings = settings
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.transport = Transport(settings, client_factory=client_factory, retry_policy=retry_policy)
        self.sampler = ApiEngine(
            settings,
            log=self._log,
            transport=self.transport,
            draw=Draw(self._draw_body, self._ask_draw),
            more_stats=lambda: {"readout": self._readout_record()},
        )
        """The draws (journal, budget, progress, parsing): an API engine on this engine's transport."""
        self._tok = tokenizer
        self._tok_path: str | None = None
        self._generation_eos: Any = None
        self._reverse: dict[str, int] | None = None
        self.capabilities: dict[str, Any] | None = None
        """What the canary found (None until :meth:`load`)."""
        self.mode: str = ""
        self._replies: dict[str, ServerReply] = {}
        self._readout_log: AppendLog | None = None
        self.readout_stats: dict[str, float] = {
            "trials": 0,
            "requests": 0,
            "resumed": 0,
            "prompt_tokens": 0,
            "seconds": 0.0,
            "bounded_options": 0,
        }
        """Readout requests sent and answered from the journal, their prompt tokens and wall seconds, and options
        reported as bounds (top_logprobs), since load."""

    # ---------------------------------------------------------------- loading
    def load(self) -> ServerEngine:
        """Open the client, load the local tokenizer, run the canary once (idempotent)."""
        self.sampler.load()
        self.transport.open_client()  # a dry run sends no draw, but the readout's identity needs the canary's mode
        if self._tok is None:
            self._load_tokenizer()
        if self.capabilities is None:
            self.capabilities = self._probe()
            self.mode = str(self.capabilities["mode"])
        return self

    def _load_tokenizer(self) -> None:
        from probe.models import resolve_model

        s = self.settings
        spec = s.tokenizer or s.model
        try:
            ref = resolve_model(spec)
            transformers = require("transformers", "hf")
            transformers.logging.disable_progress_bar()
            self._tok = transformers.AutoTokenizer.from_pretrained(ref.path, local_files_only=True)
        except (OSError, ValueError, ModelError) as e:
            raise ModelError(
                f"cannot load a local tokenizer for the served model {s.model!r} from {spec!r} "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); readouts through a server render "
                "the prompt here: pass --tokenizer with the model's folder (or tiny, smol, a cached hub id)"
            ) from e
        self._tok_path = ref.path
        if not getattr(self._tok, "chat_template", None):
            raise ValueError(f"the tokenizer at {ref.path} has no chat template; probe renders every trial as a chat")
        gen = Path(ref.path) / "generation_config.json"
        self._generation_eos = json.loads(gen.read_text()).get("eos_token_id") if gen.is_file() else None

    def _reverse_vocab(self) -> dict[str, int]:
        """Decoded token text -> id, for servers that name top-k tokens by text (ambiguous texts left out)."""
        if self._reverse is None:
            tok = self.tokenizer
            seen: dict[str, int] = {}
            dup: set[str] = set()
            for i in range(len(tok)):
                text = tok.decode([i], skip_special_tokens=False)
                if text in seen:
                    dup.add(text)
                seen[text] = i
            self._reverse = {k: v for k, v in seen.items() if k not in dup}
        return self._reverse

    # ---------------------------------------------------------------- canary
    def _probe(self) -> dict[str, Any]:
        """Find out once what the server returns, refusing one that returns nothing usable (see the module)."""
        s = self.settings
        trial = Trial(
            "canary", "canary", "canary", {}, (Message("user", CANARY_PROMPT),), CANARY_OPTIONS, CANARY_OPTIONS
        )
        ids = self.render(trial, think=False)
        yes, no = (o[0] for o in self.option_ids(trial))
        found: dict[str, Any] = {"url": public_url(s.base_url), "version": self._version(), "prompt_tokens": len(ids)}
        offered: dict[str, bool] = {}
        reasons: dict[str, str] = {}
        # top-k first: it is the reference the other modes are checked against
        k = min(s.top_logprobs, 5)
        top = self._canary_send("top_logprobs", completion_body(s.model, ids, logprobs=k), len(ids), reasons)
        if top is not None:
            ranked = [v for _, v in sorted(((-lp, t), lp) for t, lp in top.slot.items())]
            check_values("the canary's top-k", ranked)
            if top.ranked and top.slot[top.ranked[0]] < max(top.slot.values()) - 1e-6:
                raise ServerRefused(
                    f"the server's greedy token {top.ranked[0]} is not its most likely one (canary top-k "
                    f"{dict(list(top.slot.items())[:5])}); its log probabilities are not the model's"
                )
            if math.fsum(math.exp(v) for v in top.slot.values()) > 1 + 1e-4:
                raise ServerRefused(f"the server's canary top-k sums to more than probability 1 ({ranked[:6]})")
            offered["top_logprobs"] = True
        body = completion_body(s.model, ids, logprobs=1, logprob_token_ids=[yes, no])
        tid = self._canary_send("token_ids", body, len(ids), reasons)
        if tid is not None and {yes, no} <= set(tid.slot):
            check_values("the canary's requested tokens", [tid.slot[yes], tid.slot[no]], varied=False)
            self._agree(top, tid.slot, "logprob_token_ids")
            offered["token_ids"] = True
        elif tid is not None:
            reasons["token_ids"] = "the requested token ids did not come back"
        body = completion_body(s.model, [*ids, yes], prompt_logprobs=1)
        pl = self._canary_send("prompt_logprobs", body, len(ids) + 1, reasons, start=1)
        if pl is not None and len(pl.prompt) == len(ids) and yes in pl.prompt[-1]:
            check_values("the canary's prompt tokens", [lp for p in pl.prompt for lp in p.values()])
            self._agree(top, pl.prompt[-1], "prompt_logprobs")
            offered["prompt_logprobs"] = True
        elif pl is not None:
            reasons["prompt_logprobs"] = "no prompt_logprobs came back for every prompt token"
        found["offered"] = {m: bool(offered.get(m)) for m in MODES[1:]}
        found["why_not"] = {m: r for m, r in reasons.items() if not offered.get(m)}
        want = s.readout_mode
        if want == "auto":
            mode = next((m for m in MODES[1:] if offered.get(m)), None)
        else:
            mode = want if offered.get(want) else None
        if mode is None:
            what = "; ".join(f"{m}: {r}" for m, r in found["why_not"].items()) or "none returned"
            cls = NoLogprobs if not offered else ServerRefused
            asked = "any log probabilities" if want == "auto" else f"--server-readout {want}"
            raise cls(f"the server at {found['url']} does not return {asked} ({what})")
        found["mode"] = mode
        found["exact"] = mode in EXACT_MODES
        return found

    def _agree(self, top: ServerReply | None, other: Mapping[int, float], how: str) -> None:
        """The same token's log probability at the canary's slot must agree between the top-k and ``how``."""
        if top is None:
            return
        for t in [t for t in other if t in top.slot]:
            if abs(other[t] - top.slot[t]) > 1e-4:
                raise ServerRefused(
                    f"the server's {how} gives token {t} log probability {other[t]:.6g} at the canary's slot, "
                    f"its top-k {top.slot[t]:.6g}: one of them is not the model's"
                )

    def _canary_send(
        self, mode: str, body: dict[str, Any], sent: int, reasons: dict[str, str], *, start: int = 0
    ) -> ServerReply | None:
        """One canary request; None (with the reason) where the server rejects the mode's parameters."""
        from engines.api_providers import ApiRequestError

        try:
            raw = self.transport.guard(lambda: self.transport.completion(body))
        except ApiRequestError as e:
            reasons[mode] = str(e).split(";")[0]
            return None
        reply = parse_completion(raw, start=start, reverse=self._reverse_for(raw))
        check_prompt_count(sent, reply, "the canary prompt")
        if mode != "prompt_logprobs" and not reply.slot:
            reasons[mode] = "the reply carries no log probabilities"
            return None
        return reply

    def _reverse_for(self, raw: Any) -> dict[str, int] | None:
        """The text -> id map, only where a reply names its top-k tokens by text (not ``token_id:N``)."""
        try:
            top = raw["choices"][0]["logprobs"]["top_logprobs"][0]
        except (KeyError, IndexError, TypeError):
            return None
        if top and not all(str(k).startswith("token_id:") for k in top):
            return self._reverse_vocab()
        return None

    def _version(self) -> str | None:
        """The server's ``/version`` (vLLM), where it answers one."""
        import urllib.request

        url = (self.settings.base_url or "").rstrip("/")
        origin = url[: -len("/v1")] if url.endswith("/v1") else url
        try:
            with urllib.request.urlopen(origin + "/version", timeout=min(self.settings.timeout, 10.0)) as r:
                v = json.loads(r.read().decode()).get("version")
                return str(v) if v is not None else None
        except Exception:  # best effort: not every server has it
            return None

    # ------------------------------------------------------------- the journal
    def attach(self, store: Any) -> None:
        """The sampler's journal and the run lock, and the readout journal ``results/server-journal.jsonl``."""
        self.sampler.attach(store)
        path = Path(store.root) / "results" / JOURNAL
        if self._readout_log is None or self._readout_log.path != path:
            if self._readout_log is not None:
                self._readout_log.close()
            self._readout_log = AppendLog(path, validate=lambda r: ServerReply.from_record(r["reply"]))
            self._replies = {str(r["key"]): ServerReply.from_record(r["reply"]) for r in self._readout_log.read()}
            if self._readout_log.quarantined:
                self._log(f"api: quarantined {len(self._readout_log.quarantined)} damaged line(s) of {path}")

    def close(self) -> None:
        self.sampler.close()
        if self._readout_log is not None:
            self._readout_log.close()
            self._readout_log = None

    def fetch(self, requests: Sequence[Request]) -> list[ServerReply]:
        """The reply of every request, in order: from the journal where answered, else sent (concurrently, under
        the adaptive limit, with transport retries) and journaled as each arrives."""
        keys = [body_key(q.body) for q in requests]
        todo: dict[str, Request] = {}
        for k, q in zip(keys, requests, strict=True):
            if k not in self._replies and k not in todo:
                todo[k] = q
        self.readout_stats["resumed"] += len({k for k in keys if k in self._replies})
        if todo:
            with self.transport.hold_run():
                self._send_all(todo)
        return [self._replies[k] for k in keys]

    def _send_all(self, todo: Mapping[str, Request]) -> None:
        assert self.transport.limiter is not None
        limiter = self.transport.limiter
        stop = threading.Event()
        problems: list[BaseException] = []
        lock = threading.Lock()

        def one(key: str, q: Request) -> None:
            if stop.is_set():
                return

            def call() -> ServerReply:
                if not limiter.acquire(stop):
                    raise TransportGaveUp("stopped")
                outcome = "failed"
                try:
                    raw = self.transport.completion(q.body)
                    outcome = "ok"
                finally:
                    limiter.release(outcome)
                reply = parse_completion(raw, start=q.start, reverse=self._reverse_for(raw))  # malformed: retried
                check_top_k(q, reply)
                return reply

            try:
                reply = self.transport.guard(call, stop)
                check_prompt_count(q.sent, reply, f"a readout request ({q.sent} ids)")
            except BaseException as e:  # the first problem stops the others; journaled replies are kept
                with lock:
                    problems.append(e)
                stop.set()
                return
            with lock:
                if self._readout_log is not None:
                    self._readout_log.append({"key": key, "reply": reply.to_record(), "session": self.sampler.session})
                self._replies[key] = reply
                self.readout_stats["requests"] += 1
                self.readout_stats["prompt_tokens"] += q.sent

        workers = max(1, min(self.settings.concurrency, len(todo)))
        with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe-server") as pool:
            futures = [pool.submit(one, k, q) for k, q in todo.items()]
            try:
                cf.wait(futures)
            except KeyboardInterrupt:
                stop.set()
                raise
        if problems:
            raise problems[0]

    # ---------------------------------------------------------------- manifest
    def identity(self) -> dict[str, Any]:
        """The API engine's identity under this engine's name and value settings, the readout's mode, the reasoning
        settings, and the local tokenizer's fingerprint."""
        s = self.settings
        return {
            **request_identity(self.name, s, self.value_settings),
            "readout_mode": self.mode,
            **reasoning_record(s),
            "tokenizer": (folder_info(self._tok_path) or {}).get("fingerprint") or s.tokenizer or s.model,
        }

    def describe(self) -> dict[str, Any]:
        """The API engine's record (the URL without credentials), what the canary found, the tokenizer used."""
        d = self.sampler.describe()
        s = self.settings
        d["engine"] = self.name
        d["settings"] = {**d["settings"], "base_url": public_url(s.base_url)}
        d["model_path"] = f"{s.provider}:{s.model}@{public_url(s.base_url)}"
        d["server"] = dict(self.capabilities or {})
        d["tokenizer"] = {
            "source": "local copy",
            "spec": s.tokenizer or s.model,
            "path": self._tok_path,
            **folder_info(self._tok_path),
        }
        d["system_prompt"] = rendered_system_prompt(self.tokenizer, s.system_prompt)
        return d

    def run_stats(self) -> dict[str, Any]:
        """The sampler's totals, and the readout requests' under ``readout`` (:meth:`_readout_record`)."""
        return self.sampler.run_stats()

    def _readout_record(self) -> dict[str, Any]:
        """The readout requests' totals: sent, resumed from the journal, throughput, the mode."""
        r: dict[str, Any] = dict(self.readout_stats)
        r["requests_per_s"] = round(r["requests"] / r["seconds"], 3) if r["seconds"] else None
        r["trials_per_s"] = round(r["trials"] / r["seconds"], 3) if r["seconds"] else None
        r["seconds"] = round(r["seconds"], 3)
        r["mode"] = self.mode
        return r

    # ---------------------------------------------------------------- readouts
    def _reason(self, request: ThinkRequest) -> list[list[int]]:
        """The reasoning of think mode, through the server: one ``/v1/completions`` request per trial."""
        s = self.settings
        reqs = [
            Request(
                i,
                (),
                "think",
                completion_body(
                    s.model,
                    ids,
                    max_tokens=request.budget,
                    stop_token_ids=sorted(request.ends),
                    skip_special_tokens=False,
                    return_token_ids=True,
                    logprobs=0,
                    **reasoning_sampling(s, seed),
                ),
            )
            for i, (ids, seed) in enumerate(zip(request.prompts, request.seeds, strict=True))
        ]
        return [with_stop(r.generated, r.stop_reason, request.end_id) for r in self.fetch(reqs)]

    def readout(self, trials: Sequence[Trial], progress: ProgressFn | None = None) -> list[Readout]:
        """The answer-slot distribution of each trial, in input order (see the module docstring)."""
        if not trials:
            return []
        self.load()
        t0 = time.perf_counter()
        before = self.readout_stats["bounded_options"]
        for t in trials:  # fail on a bad option before sending anything
            self.option_ids(t)
        prepared = self.prepare(trials)
        tries = [build_trie(p.options) for p in prepared]
        s = self.settings
        reqs = [
            q
            for i, (p, trie) in enumerate(zip(prepared, tries, strict=True))
            for q in node_requests(s.model, i, p.ids, trie, self.mode, top_other=s.top_other, cap=s.top_logprobs)
        ]
        conds = [Conditionals() for _ in prepared]
        for group in by_kind(reqs):
            for q, r in zip(group, self.fetch(group), strict=True):
                conds[q.row].absorb(q, r)
        out = []
        for i, (t, p, trie) in enumerate(zip(trials, prepared, tries, strict=True)):
            out.append(self._assemble(t, p, trie, conds[i], [q for q in reqs if q.row == i]))
        bounded = self.readout_stats["bounded_options"] - before
        if bounded:
            self._log(
                f"server: {int(bounded)} option(s) of {len(trials)} trials lay outside the top-{s.top_logprobs} "
                "log probabilities: reported at their bound, coverage a lower bound (a server with "
                "logprob_token_ids or prompt_logprobs reads them exactly)"
            )
        self.readout_stats["trials"] += len(trials)
        self.readout_stats["seconds"] += time.perf_counter() - t0
        if progress:
            progress(len(trials))
        return out

    def _assemble(self, trial: Trial, prep: Prepared, trie: Trie, c: Conditionals, reqs: Sequence[Request]) -> Readout:
        """The readout of one trial; ``top_other`` from the slot's returned tokens that start no option."""
        first = set(trie[()])
        ranked = sorted(((lp, t) for t, lp in c.seen.items() if t not in first), key=lambda x: (-x[0], x[1]))
        n = self.settings.top_other
        other = tuple((self.tokenizer.decode([t]), math.exp(lp)) for lp, t in ranked[:n])
        if self.mode == "prompt_logprobs":
            computed = sum(q.sent for q in reqs)  # prompt_logprobs requests skip the prefix cache
        else:
            computed = len(prep.ids) + sum(1 for node in trie if node)
        missing = any(kid not in c.cond.get(node, {}) for node, kids in trie.items() for kid in kids)
        if not missing:
            return slot_readout(trial, prep, trie, c.cond, top_other=other, computed=computed)
        if self.mode != "top_logprobs":  # pragma: no cover - absorb raises first
            raise ServerRefused(f"trial {trial.trial_id}: the server left option tokens unscored")
        readout, bounded = bounded_readout(trial, prep, trie, c, top_other=other, computed=computed)
        self.readout_stats["bounded_options"] += bounded
        return readout

    # ---------------------------------------------------------------- sampling
    def _draw_body(self, s: ApiSettings, trial: Trial, draw: int, temperature: float) -> dict[str, Any]:
        """A ``/v1/completions`` draw on the readout's own token ids: raw sampling at ``temperature`` (no top-k,
        top-p, min-p or penalties), the draw's seed, stopping at the model's end-of-turn ids; ``s``: the settings
        of this sampling call (its reply cap)."""
        ids = self.render(trial)
        return {
            "model": s.model,
            "prompt": list(ids),
            "max_tokens": s.max_tokens,
            "temperature": float(temperature),
            **RAW_SAMPLING,
            "seed": draw_seed(s.seed, trial.trial_id, draw),
            "stop_token_ids": sorted(self._stop_ids()),
            "skip_special_tokens": False,
            "return_token_ids": True,
            **dict(s.extra_body),
        }

    def _ask_draw(self, body: Mapping[str, Any]) -> Reply:
        """One draw: the completion, checked for its prompt count, as the draw's reply (the text decoded here from
        the generated ids, stop tokens dropped, as the local engines do)."""
        raw = self.transport.completion(body)
        reply = parse_completion(raw)
        check_prompt_count(len(body["prompt"]), reply, "a sampling request")
        stops = self._stop_ids()
        text = raw["choices"][0].get("text") or ""
        if reply.generated:
            text = self.tokenizer.decode([t for t in reply.generated if t not in stops], skip_special_tokens=False)
        usage = raw.get("usage") or {}
        return Reply(
            text=str(text or ""),
            finish=reply.finish,
            refused=reply.finish == "content_filter",
            usage=Usage(
                input_tokens=_count(usage.get("prompt_tokens")), output_tokens=_count(usage.get("completion_tokens"))
            ),
            response_id=str(raw.get("id") or ""),
            served_model=str(raw.get("model") or ""),
        )

    def _sample(self, trials: Sequence[Trial], draws: Draws, progress: ProgressFn | None) -> list[Sample]:
        self.load()
        return self.sampler.sample(
            trials,
            draws.n,
            draws.temperature,
            progress,
            max_new_tokens=draws.max_new_tokens,
            stop_at_answer=draws.stop_at_answer,
        )


def _count(v: Any) -> int:
    """A token count of a reply's usage (0 where absent or not a number)."""
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0
