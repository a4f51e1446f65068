"""The transport of the engines that talk to a server: one client, the adaptive concurrency limit, transport
retries and the run folder's lock, held by :class:`engines.api.ApiEngine` and :class:`engines.server.ServerEngine`
alike (each holds a :class:`Transport`; neither reaches into the other).

One call per endpoint, each with its typed reply: :meth:`Transport.chat` (Chat Completions, or Anthropic's
Messages API) returns a :class:`~engines.api.providers.Reply`; :meth:`Transport.completion` (``/v1/completions``)
returns the response body, which :mod:`engines.server` reads as its own typed reply. A reply is never dressed up
as another endpoint's.

Retries: :meth:`Transport.guard` runs a call with the transport retries of :class:`~engines.api.retry.RetryPolicy`
(a transport failure is sent again after a jittered delay, a rejected request stops the run); the API engine's
draws run their own loop over the same policy (:meth:`delay`, :meth:`sleep`), since they also keep a budget and
count refusals. Failures that outlived every retry are counted in :attr:`unrecovered` (the run's stats).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from engines.api.journal import LOCK
from engines.api.providers import Reply, TransportError, classify, parse_reply
from engines.api.retry import AdaptiveLimiter, RetryPolicy, shared_limiter
from engines.base import require
from probe.errors import ProbeError


class TransportSettings(Protocol):
    """What the transport reads of the engine's settings (:class:`engines.api.ApiSettings`)."""

    @property
    def provider(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def base_url(self) -> str | None: ...

    @property
    def concurrency(self) -> int: ...

    @property
    def seed(self) -> int: ...

    @property
    def max_retries(self) -> int: ...

    @property
    def timeout(self) -> float: ...

    def key_env(self) -> tuple[str | None, bool]: ...


class TransportGaveUp(ProbeError, RuntimeError):
    """A call kept failing in transport after every retry; the run stopped (re-run to resume)."""


T = TypeVar("T")

ClientFactory = Callable[[Any, str | None], Any]
"""Makes the client from the settings and the key (tests inject a fake)."""


class Transport:
    """The client, the concurrency limit, the retries and the run lock of one engine (see the module docstring)."""

    def __init__(
        self,
        settings: TransportSettings,
        *,
        client_factory: ClientFactory | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        self.settings = settings
        self.retry_policy = retry_policy or RetryPolicy(max_retries=settings.max_retries)
        self._client_factory = client_factory
        self.client: Any = None
        """The official client (None until :meth:`open_client`)."""
        self.limiter: AdaptiveLimiter | None = None
        """The adaptive limit of calls in flight, shared per (provider, endpoint, model) in this process."""
        self.unrecovered: Counter[str] = Counter()
        """Transport failures, by kind, that outlived every retry in this session."""
        self._rng = random.Random(settings.seed)
        self._rng_lock = threading.Lock()
        self._lock_file: Any = None
        self._root: Path | None = None

    # ------------------------------------------------------------ set-up
    def open_limit(self) -> None:
        """The adaptive concurrency limit (idempotent; no network)."""
        s = self.settings
        if self.limiter is None:
            self.limiter = shared_limiter(f"{s.provider}@{s.base_url or ''}", s.model, s.concurrency)

    def open_client(self) -> None:
        """The official client, with the key checked (idempotent; no network)."""
        if self.client is None:
            self.client = self._make_client()

    def api_key(self) -> str:
        var, required = self.settings.key_env()
        key = os.environ.get(var or "", "")
        if key:
            return key
        if required:
            raise ValueError(
                f"no API key: set the environment variable {var} for {self.settings.provider}:{self.settings.model}"
                + (" (or name another one with --api-key-env)" if self.settings.provider == "openai-compatible" else "")
            )
        return "EMPTY"  # a local server ignores it; the client insists on a string

    def _make_client(self) -> Any:
        s = self.settings
        key = self.api_key()
        if self._client_factory is not None:
            return self._client_factory(s, key)
        if s.provider == "anthropic":
            anthropic = require("anthropic", "api")
            return anthropic.Anthropic(api_key=key, base_url=s.base_url, max_retries=0, timeout=s.timeout)
        openai = require("openai", "api")
        return openai.OpenAI(api_key=key, base_url=s.base_url, max_retries=0, timeout=s.timeout)

    # ------------------------------------------------------------ the run folder's lock
    def attach(self, root: Path) -> None:
        """Lock ``root/results`` (the run folder) for the length of each :meth:`hold_run`."""
        from filelock import FileLock

        if self._root != root:
            self._lock_file = FileLock(str(root / "results" / LOCK))
            self._root = root

    def hold_run(self) -> Any:
        """The run folder's lock for the length of one batch of calls: a second process on the same run would pay
        twice for the same draws, so it is refused."""
        from filelock import Timeout

        if self._lock_file is None:
            return contextlib.nullcontext()
        try:
            return self._lock_file.acquire(timeout=0)  # released when the with-block ends
        except Timeout:
            raise ValueError(
                f"another probe process is running {self._root} (lock {self._lock_file.lock_file}); "
                "wait for it to finish or stop it"
            ) from None

    # ------------------------------------------------------------ retries
    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry ``attempt`` (jittered by the engine's seeded generator)."""
        with self._rng_lock:
            return self.retry_policy.delay(attempt, retry_after, self._rng)

    def sleep(self, seconds: float, stop: threading.Event) -> None:
        stop.wait(seconds)

    def guard(
        self,
        call: Callable[[], T],
        stop: threading.Event | None = None,
        *,
        failed: Callable[[TransportError], None] | None = None,
        what: str | None = None,
    ) -> T:
        """``call()`` with transport retries: the one retry loop of the API and server engines.

        A transport failure (:func:`classify`) is told to ``failed`` (the direct calls count it and pause the
        limit) and retried after the policy's jittered delay; a rejected request raises its error, and anything
        :func:`classify` does not know is raised as it is. Spent retries raise :class:`TransportGaveUp`, naming
        ``what`` (a trial and draw) where given.
        """
        stop = stop or threading.Event()
        var, _ = self.settings.key_env()
        for attempt in range(self.retry_policy.max_retries + 1):
            try:
                return call()
            except Exception as e:
                err = classify(e, var)
                if not isinstance(err, TransportError):
                    raise err from e
                if failed is not None:
                    failed(err)
                if attempt < self.retry_policy.max_retries:
                    self.sleep(self.delay(attempt, err.retry_after), stop)
                    continue
                self.unrecovered[err.kind] += 1
                if what is None:
                    raise TransportGaveUp(f"{err} (after {attempt + 1} attempts); re-run to resume") from e
                raise TransportGaveUp(
                    f"{what}: {err} after {attempt + 1} attempts; the run stopped, re-run the same command to resume"
                ) from e
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------ endpoints
    def chat(self, body: Mapping[str, Any]) -> Reply:
        """One Chat Completions (or Anthropic Messages) call with the official client, its reply typed."""
        rest = {k: v for k, v in body.items() if k not in ("model", "messages", "max_tokens")}
        if self.settings.provider == "anthropic":
            resp = self.client.messages.create(
                model=body["model"], messages=body["messages"], max_tokens=body["max_tokens"], extra_body=rest
            )
        else:
            if "max_tokens" in body:
                rest["max_tokens"] = body["max_tokens"]
            resp = self.client.chat.completions.create(model=body["model"], messages=body["messages"], extra_body=rest)
        return parse_reply(self.settings.provider, _json(resp))

    def completion(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """One ``/v1/completions`` call with the official client; the response body (read by
        :func:`engines.server.parse_completion` into its typed reply)."""
        rest = {k: v for k, v in body.items() if k not in ("model", "prompt")}
        return _json(self.client.completions.create(model=body["model"], prompt=body["prompt"], extra_body=rest))


def _json(resp: Any) -> dict[str, Any]:
    """A client's response as a plain dict; anything else is a malformed reply (retried)."""
    if hasattr(resp, "model_dump"):
        return dict(resp.model_dump(mode="json"))
    if isinstance(resp, Mapping):
        return dict(resp)
    raise TransportError("malformed", f"the server did not return JSON: {str(resp)[:120]!r}")
