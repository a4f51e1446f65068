"""What a server's ``/v1/completions`` reply says, for readouts through it (:mod:`engines.server`): the typed
:class:`ServerReply` (journaled as is), its parsing, and the checks every reply must pass (finite log probabilities,
the prompt count of the ids sent), with the errors that refuse a server.

Pure functions of the reply bodies: no network here.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from engines.api.providers import TransportError
from probe.errors import ProbeError

SENTINEL = -9999.0
"""A log probability at or below this is a provider's stand-in for "unknown", not a value."""


class ServerRefused(ProbeError, ValueError):
    """The server cannot give exact readouts (or lied about them); one line, exit 2 at the CLI."""


class NoLogprobs(ServerRefused):
    """The server returns no log probabilities at all (a sampling-only server)."""


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
