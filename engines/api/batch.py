"""The providers' batch interfaces (OpenAI Batch, Anthropic Message Batches), crash-safe.

A batch is paid when it is created, so its id must never be lost. The state
lives in an append-only log in the run folder (``results/api-batches.jsonl``):

1. ``intent``: a local key and the (trial, draw, temperature) of each request,
   with the ``custom_id`` it is sent under, written *before* the batch is created;
2. ``created``: the provider's batch id, written as soon as it is returned,
   before any polling;
3. ``ended``: the batch's final status, after its results are in the journal.

A resumed run polls every batch that was created and has not ended, instead
of creating new ones for the same requests. An intent without a ``created``
line means the process died inside the create call: for OpenAI the batch is
looked up by the local key it carries in its metadata; Anthropic batches
carry no metadata, so such requests are sent again (the window is one HTTP
round trip).

Per-request outcomes: a success goes to the journal like a direct call (the
engine parses it); a transient error or an expired request is returned to
the caller to be sent again; an invalid request stops the run.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from engines.api.journal import AppendLog, Key
from engines.api.providers import ApiRequestError

OPENAI_ACTIVE = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
ANTHROPIC_ACTIVE = frozenset({"in_progress", "canceling"})
FATAL_BATCH_ERRORS = frozenset(
    {"invalid_request_error", "authentication_error", "permission_error", "not_found_error", "billing_error"}
)


@dataclass
class BatchState:
    """One batch as the log records it."""

    local: str
    provider: str
    items: dict[str, Key]
    """custom_id -> (trial_id, draw, temperature)."""
    batch_id: str | None = None
    ended: str | None = None


def load_batches(log: AppendLog) -> dict[str, BatchState]:
    """Replay the batch log into the current state of every batch, by local key."""
    out: dict[str, BatchState] = {}
    for rec in log.read():
        ev, local = rec.get("event"), str(rec.get("local", ""))
        if ev == "intent":
            items = {str(cid): (str(t), int(d), float(tmp)) for cid, t, d, tmp in rec.get("items", [])}
            out[local] = BatchState(local, str(rec.get("provider", "")), items)
        elif local in out and ev == "created":
            out[local].batch_id = str(rec["batch_id"])
        elif local in out and ev == "ended":
            out[local].ended = str(rec.get("status", "ended"))
    return out


@dataclass
class Outcome:
    """What a finished batch gave back."""

    succeeded: list[tuple[Key, dict[str, Any]]] = field(default_factory=list)
    """(key, response body) of each request that completed."""
    retry: list[tuple[Key, str]] = field(default_factory=list)
    """(key, error kind) of each request to send again."""


class BatchClient:
    """The provider-specific half: create, poll, fetch results. ``client`` is the official SDK client."""

    def __init__(self, provider: str, client: Any, guard: Callable[[Callable[[], Any]], Any] | None = None) -> None:
        self.provider = provider
        self.client = client
        self.guard = guard or (lambda call: call())
        """Runs one SDK call with the engine's transport retries (identity by default)."""

    def create(self, local: str, requests: Sequence[tuple[str, dict[str, Any]]]) -> str:
        if self.provider == "anthropic":
            reqs = [{"custom_id": cid, "params": body} for cid, body in requests]
            return str(self.guard(lambda: self.client.messages.batches.create(requests=reqs)).id)
        lines = "".join(
            json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}) + "\n"
            for cid, body in requests
        )
        f = self.guard(lambda: self.client.files.create(file=(f"probe-{local}.jsonl", lines.encode()), purpose="batch"))

        def create_once() -> str:
            # a create that timed out may have succeeded: look before sending it again
            found = self._find_raw(local)
            if found is not None:
                return found
            b = self.client.batches.create(
                input_file_id=f.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                metadata={"probe_local": local},
            )
            return str(b.id)

        return str(self.guard(create_once))

    def find(self, local: str) -> str | None:
        """The id of a batch created under ``local`` whose id was never logged (OpenAI only)."""
        if self.provider == "anthropic":
            return None
        return self.guard(lambda: self._find_raw(local))

    def _file_text(self, file_id: str) -> str:
        return str(self.client.files.content(file_id).text)

    def _find_raw(self, local: str) -> str | None:
        for b in self.client.batches.list(limit=100):
            if (getattr(b, "metadata", None) or {}).get("probe_local") == local:
                return str(b.id)
        return None

    def status(self, batch_id: str) -> tuple[bool, str, Any]:
        """(still running, status text, the batch object)."""
        if self.provider == "anthropic":
            b = self.guard(lambda: self.client.messages.batches.retrieve(batch_id))
            return b.processing_status in ANTHROPIC_ACTIVE, str(b.processing_status), b
        b = self.guard(lambda: self.client.batches.retrieve(batch_id))
        return b.status in OPENAI_ACTIVE, str(b.status), b

    def results(self, batch_id: str, batch: Any, items: Mapping[str, Key]) -> Outcome:
        out = Outcome()
        seen: set[str] = set()
        if self.provider == "anthropic":
            for r in self.guard(lambda: list(self.client.messages.batches.results(batch_id))):
                d = r.model_dump(mode="json") if hasattr(r, "model_dump") else dict(r)
                cid = str(d.get("custom_id"))
                if cid not in items:
                    continue
                seen.add(cid)
                res = d.get("result") or {}
                kind = res.get("type")
                if kind == "succeeded":
                    out.succeeded.append((items[cid], res.get("message") or {}))
                elif kind == "errored":
                    err = (res.get("error") or {}).get("error") or {}
                    etype = str(err.get("type", "api_error"))
                    if etype in FATAL_BATCH_ERRORS:
                        raise ApiRequestError(
                            f"Anthropic batch {batch_id}: request {cid} was rejected ({etype}: {err.get('message')}); "
                            "fix the settings and re-run"
                        )
                    out.retry.append((items[cid], etype))
                else:  # canceled, expired
                    out.retry.append((items[cid], str(kind)))
        else:
            if batch.status == "failed":
                errs = getattr(getattr(batch, "errors", None), "data", None) or []
                msg = "; ".join(f"{getattr(e, 'code', '')}: {getattr(e, 'message', '')}" for e in errs[:3])
                raise ApiRequestError(f"OpenAI batch {batch_id} failed validation ({msg}); fix the settings and re-run")
            for fid in (batch.output_file_id, batch.error_file_id):
                if not fid:
                    continue
                text = str(self.guard(partial(self._file_text, fid)))
                for line in text.splitlines():
                    if not line.strip():
                        continue
                    d = json.loads(line)
                    cid = str(d.get("custom_id"))
                    if cid not in items:
                        continue
                    seen.add(cid)
                    resp = d.get("response") or {}
                    status = int(resp.get("status_code") or 0)
                    if status == 200 and not d.get("error"):
                        out.succeeded.append((items[cid], resp.get("body") or {}))
                    elif status == 429 or status >= 500 or status == 0:
                        out.retry.append((items[cid], "rate_limit" if status == 429 else "server"))
                    else:
                        body = resp.get("body") or d.get("error") or {}
                        raise ApiRequestError(
                            f"OpenAI batch {batch_id}: request {cid} was rejected ({status}: {json.dumps(body)[:300]}); "
                            "fix the settings and re-run"
                        )
        for cid, key in items.items():  # expired or never processed
            if cid not in seen:
                out.retry.append((key, "expired"))
        return out


def run_batches(
    *,
    client: BatchClient,
    log: AppendLog,
    pending: Sequence[tuple[Key, dict[str, Any]]],
    done: Callable[[Key], bool],
    on_success: Callable[[Key, dict[str, Any], str], None],
    poll_seconds: float,
    max_requests: int = 10_000,
    stop: Callable[[], bool] = lambda: False,
    on_poll: Callable[[Mapping[str, str]], None] = lambda status: None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[tuple[Key, str]]:
    """Submit ``pending`` (key, request body) through batches and wait for them; resume logged batches first.

    ``done(key)`` says whether the journal already has a key; ``on_success``
    journals one response (key, body, batch id). Returns the (key, error
    kind) pairs to send again.
    """
    states = {k: s for k, s in load_batches(log).items() if s.provider == client.provider}
    # batches logged by an earlier process that still owe results
    active = [s for s in states.values() if s.ended is None and any(not done(k) for k in s.items.values())]
    for s in active:
        if s.batch_id is None:
            s.batch_id = client.find(s.local)
            if s.batch_id is not None:
                log.append({"event": "created", "local": s.local, "batch_id": s.batch_id})
    active = [s for s in active if s.batch_id is not None]
    covered = {k for s in active for k in s.items.values()}
    fresh = [(k, body) for k, body in pending if k not in covered and not done(k)]
    for lo in range(0, len(fresh), max_requests):
        if stop():
            break
        part = fresh[lo : lo + max_requests]
        local = uuid.uuid4().hex[:16]
        items = {f"r{i}": key for i, (key, _) in enumerate(part)}
        log.append(
            {
                "event": "intent",
                "local": local,
                "provider": client.provider,
                "items": [[cid, *key] for cid, key in items.items()],
            }
        )
        batch_id = client.create(local, [(f"r{i}", body) for i, (_, body) in enumerate(part)])
        log.append({"event": "created", "local": local, "batch_id": batch_id})
        active.append(BatchState(local, client.provider, items, batch_id))
    retry: list[tuple[Key, str]] = []
    while active and not stop():
        still = []
        status: dict[str, str] = {}
        for s in active:
            assert s.batch_id is not None
            running, text, obj = client.status(s.batch_id)
            status[s.batch_id] = text
            if running:
                still.append(s)
                continue
            outcome = client.results(s.batch_id, obj, s.items)
            for key, body in outcome.succeeded:
                if not done(key):
                    on_success(key, body, s.batch_id)
            retry.extend((k, kind) for k, kind in outcome.retry if not done(k))
            log.append({"event": "ended", "local": s.local, "status": text})
        on_poll(status)
        active = still
        if active:
            sleep(poll_seconds)
    return retry
