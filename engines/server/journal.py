"""The readout journal of a readout through a server (:mod:`engines.server`): every request's reply, from
``results/server-journal.jsonl`` where it was answered before, else sent (concurrently, under the adaptive limit,
with transport retries) and appended, fsync-ed, as it arrives, keyed by the hash of its whole request body, so a
killed run resumes without sending an answered request again.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engines.api.journal import AppendLog
from engines.api.transport import Transport, TransportGaveUp
from engines.server.replies import ServerReply, body_key, check_prompt_count, parse_completion
from engines.server.requests import Request, check_top_k

JOURNAL = "server-journal.jsonl"


class ReadoutJournal:
    """The replies of a server engine's readout requests (:meth:`fetch`), sent through ``transport``.

    ``reverse_for``: the text -> id map a reply needs where it names its top-k tokens by text; ``session``: the
    sampler's session id, written with each reply; ``stats``: the engine's readout counters, of which this adds to
    ``requests``, ``resumed`` and ``prompt_tokens``; ``concurrency``: the most requests in flight.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        concurrency: int,
        reverse_for: Callable[[Any], Mapping[str, int] | None],
        session: str,
        stats: dict[str, float],
        log: Callable[[str], None],
    ) -> None:
        self.transport = transport
        self.concurrency = concurrency
        self._reverse_for = reverse_for
        self.session = session
        self.stats = stats
        self._log = log
        self._replies: dict[str, ServerReply] = {}
        self._readout_log: AppendLog | None = None

    def attach(self, root: Path) -> None:
        """Journal into the run folder ``root`` (``results/server-journal.jsonl``), reading what it holds."""
        path = root / "results" / JOURNAL
        if self._readout_log is None or self._readout_log.path != path:
            if self._readout_log is not None:
                self._readout_log.close()
            self._readout_log = AppendLog(path, validate=lambda r: ServerReply.from_record(r["reply"]))
            self._replies = {str(r["key"]): ServerReply.from_record(r["reply"]) for r in self._readout_log.read()}
            if self._readout_log.quarantined:
                self._log(f"api: quarantined {len(self._readout_log.quarantined)} damaged line(s) of {path}")

    def close(self) -> None:
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
        self.stats["resumed"] += len({k for k in keys if k in self._replies})
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
                    self._readout_log.append({"key": key, "reply": reply.to_record(), "session": self.session})
                self._replies[key] = reply
                self.stats["requests"] += 1
                self.stats["prompt_tokens"] += q.sent

        workers = max(1, min(self.concurrency, len(todo)))
        with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe-server") as pool:
            futures = [pool.submit(one, k, q) for k, q in todo.items()]
            try:
                cf.wait(futures)
            except KeyboardInterrupt:
                stop.set()
                raise
        if problems:
            raise problems[0]
