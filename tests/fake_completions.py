"""A local stand-in for vLLM's ``/v1/completions`` on token-id prompts, over a deterministic logit table.

The server engine (:mod:`engines.server`) talks to it over real HTTP through the official client, so the tests
exercise the requests it builds and the response shapes vLLM returns (``token_id:N`` keys, ``prompt_logprobs``
entries, ``logprob_token_ids``, ``usage.prompt_tokens``), with the log probabilities of
:class:`tests.test_vllm_engine.FakeLLM` (so :func:`tests.test_vllm_engine.brute_force` gives the exact answer).
Faults a real server shows can be switched on: no token-id prompts, no or constant or zero log probabilities, a
different prompt count, a server error after some requests.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.quiet_http import LocalServer, QuietHandler


@dataclass
class Behaviour:
    """What the fake server does (all on: a vLLM with every readout mode)."""

    token_ids: bool = True
    """Accepts ``logprob_token_ids``."""
    prompt_logprobs: bool = True
    """Accepts ``prompt_logprobs``."""
    token_prompts: bool = True
    """Accepts a prompt of token ids (``transformers serve`` takes strings only)."""
    logprobs: str = "real"
    """real, none (``logprobs: null``), constant (-1.0 everywhere) or zero (0.0 everywhere, llama.cpp's echo)."""
    count_offset: int = 0
    """Added to ``usage.prompt_tokens`` (a server that adds a token of its own)."""
    fail_after: int | None = None
    """Completions answered before every further one gets a 500 (a server going away)."""
    close_at: tuple[int, int] | None = None
    """(step, token): greedy generation emits ``token`` at ``step`` (as :class:`FakeLLM`'s, to close a think block)."""


def body_key(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


class FakeCompletions(LocalServer):
    """Serves ``/v1/completions`` and ``/version`` from ``llm.logprobs`` (a callable: ids -> log-softmax row)."""

    def __init__(self, llm: Any, behaviour: Behaviour | None = None) -> None:
        self.llm = llm
        self.behaviour = behaviour or Behaviour()
        self.answered: Counter[str] = Counter()
        """Completions answered (status 200), by the hash of the request body."""
        self.bodies: dict[str, dict[str, Any]] = {}
        owner = self
        self._lock = threading.Lock()
        self._admitted = 0
        """Requests let past ``fail_after`` (counted when they arrive, so concurrent ones cannot overshoot it)."""

        class Handler(QuietHandler):
            def serve(self) -> None:
                if self.path.rstrip("/").endswith("/version"):
                    self.respond(200, json.dumps({"version": "0.0-fake"}).encode())
                    return
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                status, reply = owner.complete(body)
                self.respond(status, json.dumps(reply).encode())

        super().__init__(Handler)

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def complete(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        b = self.behaviour
        prompt = body.get("prompt")
        if not b.token_prompts and not isinstance(prompt, str):
            return 400, {"detail": "prompt must be a string."}
        for name, ok in (("logprob_token_ids", b.token_ids), ("prompt_logprobs", b.prompt_logprobs)):
            if body.get(name) is not None and not ok:
                return 400, {"error": {"message": f"Unknown field {name}", "type": "BadRequestError"}}
        with self._lock:  # check and count in one step: concurrent requests must not all pass the check
            if b.fail_after is not None and self._admitted >= b.fail_after:
                return 500, {"error": {"message": "the server is going away", "type": "InternalServerError"}}
            self._admitted += 1
        ids = tuple(int(t) for t in prompt)
        reply = self._reply(ids, body)
        with self._lock:
            key = body_key(body)
            self.answered[key] += 1
            self.bodies[key] = body
        return 200, reply

    def _value(self, v: float) -> float:
        mode = self.behaviour.logprobs
        return {"constant": -1.0, "zero": 0.0}.get(mode, float(v))

    def _reply(self, ids: tuple[int, ...], body: dict[str, Any]) -> dict[str, Any]:
        temperature = float(body.get("temperature") or 0.0)
        rng = np.random.default_rng(int(body.get("seed") or 0)) if temperature > 0 else None
        stops = set(body.get("stop_token_ids") or [])
        gen: list[int] = []
        rows: list[np.ndarray] = []
        ctx = ids
        finish, stop_reason = "length", None
        close = self.behaviour.close_at
        for step in range(int(body.get("max_tokens") or 16)):
            row = self.llm.logprobs(ctx)
            rows.append(row)
            if rng is None:
                t = close[1] if close and step == close[0] else int(np.argmax(row))
            else:
                p = np.exp(row / temperature - np.logaddexp.reduce(row / temperature))
                t = int(rng.choice(len(p), p=p / p.sum()))
            gen.append(t)
            ctx = (*ctx, t)
            if t in stops:
                finish, stop_reason = "stop", t
                break
        choice: dict[str, Any] = {"index": 0, "text": "", "finish_reason": finish, "stop_reason": stop_reason}
        if body.get("return_token_ids"):
            choice["token_ids"] = gen
        k = body.get("logprobs")
        if k is not None and self.behaviour.logprobs != "none":
            tops = []
            for i, (row, t) in enumerate(zip(rows, gen, strict=True)):
                wanted = body.get("logprob_token_ids") if i == 0 else None
                chosen = list(wanted) if wanted else [int(x) for x in np.argsort(-row, kind="stable")[: int(k)]]
                entry = {f"token_id:{t}": self._value(row[t])}
                entry.update({f"token_id:{x}": self._value(row[x]) for x in chosen})
                tops.append(entry)
            choice["logprobs"] = {
                "text_offset": [0] * len(gen),
                "token_logprobs": [self._value(r[t]) for r, t in zip(rows, gen, strict=True)],
                "tokens": [f"token_id:{t}" for t in gen],
                "top_logprobs": tops,
            }
        else:
            choice["logprobs"] = None
        pk = body.get("prompt_logprobs")
        if pk is not None and self.behaviour.logprobs != "none":
            out: list[Any] = [None]
            for i in range(1, len(ids)):
                row = self.llm.logprobs(ids[:i])
                top = [int(x) for x in np.argsort(-row, kind="stable")[: int(pk)]]
                out.append({str(x): {"logprob": self._value(row[x]), "rank": 0} for x in (ids[i], *top)})
            choice["prompt_logprobs"] = out
        n = len(ids) + self.behaviour.count_offset
        return {
            "id": "cmpl-fake",
            "object": "text_completion",
            "model": body.get("model"),
            "choices": [choice],
            "usage": {"prompt_tokens": n, "completion_tokens": len(gen), "total_tokens": n + len(gen)},
        }
