"""Transport retries and an adaptive concurrency limit for API calls.

Only *transport* failures are retried: rate limits (429), server errors
(5xx, 408, 409, Anthropic's 529), timeouts, dropped connections and responses
that cannot be read (truncated or malformed bodies). A refusal or an
unparseable answer is a complete response and is never retried: it is data.

Why these shapes:

* **Exponential backoff with jitter** (``base * 2**attempt``, capped, times a
  uniform factor in [0.5, 1]) spreads the retries of many workers that failed
  together, so they do not return together.
* **Retry-After is honoured**: when the server says how long to wait (seconds,
  an HTTP date, or OpenAI's ``retry-after-ms``) we wait at least that long,
  and every worker of the same (provider, model) pauses, not just the one
  that was told.
* **AIMD concurrency** (additive increase, multiplicative decrease, as in TCP
  congestion control): a 429 halves the number of calls in flight; each run
  of ``limit`` successes adds one back, so the limit grows back slowly and
  settles just under what the provider accepts. A burst of 429s from calls
  that were all in flight together counts as one signal (a cooldown), so the
  limit is not collapsed to 1 by a single overload. The user's cap is never
  exceeded.
"""

from __future__ import annotations

import email.utils
import math
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529})
"""HTTP statuses that mean "try again later" rather than "this request is wrong"."""


@dataclass(frozen=True)
class RetryPolicy:
    """How transport failures are retried."""

    max_retries: int = 8
    """Retries per call after the first attempt; when spent, the run stops (and resumes later)."""
    base_delay: float = 1.0
    """Seconds before the first retry (before jitter)."""
    max_delay: float = 60.0
    """Longest wait between two attempts, Retry-After excepted."""
    max_retry_after: float = 600.0
    """Longest Retry-After we accept; a server asking for more stops the run instead."""

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if not (self.base_delay >= 0 and self.max_delay >= self.base_delay):
            raise ValueError(f"need 0 <= base_delay <= max_delay, got {self.base_delay} and {self.max_delay}")

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based).

        Exponential with jitter in [0.5, 1] of the nominal delay; at least
        the server's Retry-After (plus up to 10% jitter, so that workers told
        the same instant do not all return at it).
        """
        nominal = min(self.max_delay, self.base_delay * 2.0**attempt)
        wait = nominal * rng.uniform(0.5, 1.0)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_retry_after) * rng.uniform(1.0, 1.1))
        return wait


def parse_retry_after(headers: Mapping[str, str] | None, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms``, or ``Retry-After`` (seconds or an HTTP date); None if absent."""
    if not headers:
        return None
    lower = {str(k).lower(): str(v) for k, v in headers.items()}
    ms = lower.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = lower.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
        return max(0.0, seconds) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class AdaptiveLimiter:
    """An AIMD limit on calls in flight for one (provider, model), shared by all workers.

    ``acquire()`` blocks while the limit is reached or a Retry-After pause is
    in force; ``release(outcome)`` returns the slot and adapts the limit.
    """

    def __init__(
        self,
        cap: int,
        initial: int | None = None,
        *,
        cooldown: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cap < 1:
            raise ValueError(f"the concurrency cap must be >= 1, got {cap}")
        self.cap = cap
        self.limit = float(min(cap, initial if initial is not None else min(cap, 4)))
        if self.limit < 1:
            raise ValueError(f"the initial concurrency must be >= 1, got {initial}")
        self.cooldown = cooldown
        self._clock = clock
        self._in_flight = 0
        self._streak = 0
        self._last_cut = -math.inf
        self._paused_until = 0.0
        self._cond = threading.Condition()
        self.n_cuts = 0
        self.peak = int(self.limit)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def acquire(self, stop: threading.Event | None = None) -> bool:
        """Wait for a slot; False if ``stop`` was set while waiting."""
        with self._cond:
            while True:
                if stop is not None and stop.is_set():
                    return False
                pause = self._paused_until - self._clock()
                if pause <= 0 and self._in_flight < int(self.limit):
                    self._in_flight += 1
                    return True
                self._cond.wait(timeout=min(max(pause, 0.05), 0.5))

    def release(self, outcome: str) -> None:
        """``ok`` (a response arrived), ``throttled`` (429) or ``failed`` (another transport error)."""
        with self._cond:
            self._in_flight -= 1
            now = self._clock()
            if outcome == "throttled":
                self._streak = 0
                if now - self._last_cut >= self.cooldown:
                    self.limit = max(1.0, self.limit / 2)
                    self._last_cut = now
                    self.n_cuts += 1
            elif outcome == "ok":
                self._streak += 1
                if self._streak >= int(self.limit) and self.limit < self.cap:
                    self.limit = min(float(self.cap), self.limit + 1)
                    self._streak = 0
                    self.peak = max(self.peak, int(self.limit))
            self._cond.notify_all()

    def pause(self, seconds: float) -> None:
        """Hold back every new call for ``seconds`` (the server's Retry-After)."""
        with self._cond:
            self._paused_until = max(self._paused_until, self._clock() + seconds)
            self._cond.notify_all()


_LIMITERS: dict[tuple[str, str], AdaptiveLimiter] = {}
_LIMITERS_LOCK = threading.Lock()


def shared_limiter(provider: str, model: str, cap: int, initial: int | None = None) -> AdaptiveLimiter:
    """The process-wide limiter of (provider, model): engines of the same model share one budget.

    A later engine with a different cap updates the cap (the last setting wins).
    """
    with _LIMITERS_LOCK:
        lim = _LIMITERS.get((provider, model))
        if lim is None:
            lim = _LIMITERS[(provider, model)] = AdaptiveLimiter(cap, initial)
        else:
            lim.cap = cap
            lim.limit = min(lim.limit, float(cap))
        return lim
