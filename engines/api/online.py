"""The API engine's direct calls (:mod:`engines.api`): each (trial, draw) of a sample call asked concurrently under
the adaptive limit, held to the ``--max-cost`` budget, retried on transport failures only, and journaled as it
lands (:class:`OnlineCalls`); and the progress line of a sample call (:class:`Progress`).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.api.journal import CallRecord, Key
from engines.api.providers import ProviderRefusal, Reply, TransportError, classify
from engines.api.transport import Transport
from engines.base import ProgressFn
from probe.errors import ProbeError
from probe.types import Trial


class BudgetExhausted(ProbeError, ValueError):
    """``--max-cost`` reached: the run stopped before the next call; raise the budget and re-run to resume.

    A ``ValueError`` so that the command line reports it as one line with
    exit status 2, like every other "change the arguments" condition.
    """


class Progress:
    """Calls done / remaining, rate, transport errors by kind, spend; on the run's bar or as log lines."""

    def __init__(
        self, total: int, resumed: int, spent: float, sink: ProgressFn | None, log: Callable[[str], None]
    ) -> None:
        self.total, self.resumed = total, resumed
        self.done = 0
        self.errors: Counter[str] = Counter()
        self.spent = spent
        """USD of the whole run so far (earlier sessions included)."""
        self.priced = True
        self.start = time.monotonic()
        self._sink = sink
        self._bar = getattr(sink, "__self__", None)
        self._log = log
        self._last_line = self.start
        self._lock = threading.Lock()

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        left = self.total - self.resumed - self.done
        errs = " ".join(f"{k}x{v}" for k, v in sorted(self.errors.items())) or "none"
        spend = f"${self.spent:.4f}" if self.priced else "unknown (no price for this model)"
        return f"{self.done} new + {self.resumed} resumed / {self.total} calls, {left} left, " + (
            f"{self.done / elapsed:.1f}/s, retries: {errs}, spent: {spend}"
        )

    def called(self, cost: float | None) -> None:
        with self._lock:
            self.done += 1
            if cost is None:
                self.priced = False
            else:
                self.spent += cost
        if self._sink:
            self._sink(1)
        self._show()

    def failed(self, kind: str) -> None:
        with self._lock:
            self.errors[kind] += 1
        self._show()

    def _show(self) -> None:
        if self._bar is not None and hasattr(self._bar, "set_postfix_str"):
            self._bar.set_postfix_str(self.line(), refresh=False)
        elif time.monotonic() - self._last_line > 30:
            self._last_line = time.monotonic()
            self._log(f"api: {self.line()}")


@dataclass
class Budget:
    """``--max-cost`` across the calls in flight: USD spent in the run, and held back for calls in flight."""

    max_cost: float | None
    """The budget (None: no limit)."""
    spent: float
    """USD of every call journaled in the run (earlier sessions included)."""
    reserved: float = 0.0
    """USD held back for the calls in flight."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def over(self, hold: float) -> BudgetExhausted | None:
        """Why a call that holds back ``hold`` may not start (the budget would pass), else None with ``hold``
        reserved."""
        if self.max_cost is not None and self.spent + self.reserved + hold > self.max_cost:
            return BudgetExhausted(
                f"--max-cost ${self.max_cost:.4f} reached (${self.spent:.4f} spent, "
                f"${self.reserved:.4f} in flight); raise it and re-run the same command to resume"
            )
        self.reserved += hold
        return None

    def release(self, hold: float) -> None:
        with self.lock:
            self.reserved -= hold

    def add(self, cost: float | None) -> None:
        with self.lock:
            self.spent += cost or 0.0


class Stopped(Exception):
    """An attempt not made: the run is stopping (a problem elsewhere, the budget, an interrupt)."""


class OnlineCalls:
    """The direct calls of one sample call, one (trial, draw) each, on a thread pool; the first problem (the budget
    reached, a rejected call, transport retries spent) stops the others, and is raised once every call in flight
    has landed and been journaled.

    Handed what it needs of the engine: the ``transport`` (its adaptive limit, retry policy and delays), ``ask`` (one
    request body to a typed reply), ``body`` (the request body of (trial, draw, temperature)), ``record`` (a reply to
    its journal record), ``journal`` (where records are added), ``hold_for`` (USD to hold back for one call in
    flight), the ``budget``, ``key_var`` (the key's variable, for error messages), the ``concurrency`` cap, the call's
    progress ``prog`` and ``log``.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        ask: Callable[[Mapping[str, Any]], Reply],
        body: Callable[[Trial, int, float], dict[str, Any]],
        record: Callable[..., CallRecord],
        journal: Any,
        hold_for: Callable[[Trial], float],
        budget: Budget,
        key_var: str | None,
        concurrency: int,
        prog: Progress,
        log: Callable[[str], None],
    ) -> None:
        assert transport.limiter is not None
        self.transport, self.limiter, self.policy = transport, transport.limiter, transport.retry_policy
        self.ask, self.body, self.record, self.journal, self.hold_for = ask, body, record, journal, hold_for
        self.budget, self.key_var, self.concurrency, self.prog, self.log = budget, key_var, concurrency, prog, log
        self.stop = threading.Event()
        self.problems: list[BaseException] = []

    def run(self, todo: Sequence[tuple[Trial, int]], temperature: float) -> None:
        """Call every (trial, draw) of ``todo`` at ``temperature``; raise the first problem after the pool drains."""
        pool = cf.ThreadPoolExecutor(max_workers=min(self.concurrency, len(todo)), thread_name_prefix="probe-api")
        try:
            futures = [pool.submit(self._one, t, d, temperature) for t, d in todo]
            pending = set(futures)
            while pending:
                _, pending = cf.wait(pending, timeout=0.5)
        except KeyboardInterrupt:
            self.stop.set()
            self.log(f"api: interrupted; waiting for {self.limiter.in_flight} calls in flight (they are paid) to land")
            raise
        finally:
            if self.problems:
                self.stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
        for f in futures:
            if f.done() and not f.cancelled() and f.exception() is not None:
                self.problems.append(f.exception())  # type: ignore[arg-type]
        if self.problems:
            raise self.problems[0]

    def _one(self, trial: Trial, draw: int, temperature: float) -> None:
        """One (trial, draw): attempts (:meth:`Transport.guard`, the one retry loop) until its reply is journaled,
        the run stops, or the budget refuses it."""
        key: Key = (trial.trial_id, draw, temperature)
        body = self.body(trial, draw, temperature)
        retries: Counter[str] = Counter()
        hold = self.hold_for(trial) if self.budget.max_cost is not None else 0.0
        attempts = 0

        def attempt() -> tuple[Reply, float]:
            nonlocal attempts
            if self.stop.is_set() or not self._admit(hold):
                raise Stopped
            attempts += 1
            t0 = time.monotonic()
            return self._attempt(body, hold), time.monotonic() - t0

        def failed(err: TransportError) -> None:
            retries[err.kind] += 1
            self.prog.failed(err.kind)
            if err.retry_after is not None:
                self.limiter.pause(min(err.retry_after, self.policy.max_retry_after))

        try:
            reply, latency = self.transport.guard(
                attempt, self.stop, failed=failed, what=f"trial {trial.trial_id} draw {draw}"
            )
        except Stopped:
            return
        except Exception as e:  # rejected, retries spent, or unknown: the run stops (to be resumed)
            self._stop_with(e)
            return
        rec = self.record(trial, key, reply, attempts=attempts, retries=retries, batch=False, latency=latency)
        self.journal.add(rec)
        self.budget.add(rec.cost)
        self.prog.called(rec.cost)

    def _admit(self, hold: float) -> bool:
        """Reserve ``hold`` under the budget and take a slot of the adaptive limit; False where the run stops."""
        with self.budget.lock:
            refused = self.budget.over(hold)
            if refused is not None:
                if not self.problems:
                    self.problems.append(refused)
                self.stop.set()
                return False
        if not self.limiter.acquire(self.stop):
            self.budget.release(hold)
            return False
        return True

    def _attempt(self, body: Mapping[str, Any], hold: float) -> Reply:
        """One call, in the slot and under the reserve :meth:`_admit` took (both given back as it ends): its reply (a
        provider's refusal as a refused reply), else its error, classified for the limit (a 429 throttles it)."""
        outcome = "failed"
        try:
            reply = self.ask(body)
            outcome = "ok"
            return reply
        except Exception as e:
            err = self._classified(e)
            if isinstance(err, ProviderRefusal):
                outcome = "ok"
                return Reply(text="", finish=f"blocked:{err.code}", refused=True)
            if isinstance(err, TransportError) and err.kind == "rate_limit":
                outcome = "throttled"
            raise err from e
        finally:
            self.limiter.release(outcome)
            self.budget.release(hold)

    def _classified(self, e: Exception) -> Exception:
        try:
            return classify(e, self.key_var)
        except Exception as unknown:  # not a transport or request error: a bug or an SDK change
            return unknown

    def _stop_with(self, problem: BaseException) -> None:
        self.problems.append(problem)
        self.stop.set()
