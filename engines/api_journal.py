"""The API engine's journal: every paid response is on disk before anything else happens.

The run store commits whole chunks of trials (:mod:`probe.store`); an API
chunk can be thousands of paid calls, so the API engine also appends each
response, as it arrives, to ``results/api-journal.jsonl`` in the run folder:
one JSON line per completed (trial_id, draw, temperature), written with one
``write`` on an ``O_APPEND`` descriptor and ``fsync``-ed before the call
counts as done. A killed run therefore loses at most the responses that were
being written at the instant of the kill, and ``sample()`` answers every
journaled pair from the journal instead of calling again.

A torn last line (the kill landed inside a write) is cut off when the
journal is reopened, so the next append starts on a clean line. The key
carries the draw index (and the sampling temperature), so replicates never
collapse into one cached answer.

The same append-only file discipline keeps the batch-interface state
(``results/api-batches.jsonl``, see :mod:`engines.api_batch`).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.api_pricing import Usage

JOURNAL = "api-journal.jsonl"
BATCHES = "api-batches.jsonl"
STATS = "api-stats.json"
LOCK = "api.lock"

Key = tuple[str, int, float]
"""(trial_id, draw, sampling temperature)."""


class AppendLog:
    """An append-only JSON-lines file, each line fsync-ed; a torn tail is cut off on open."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.torn_bytes = self._cut_torn_tail()
        self.corrupt_lines = 0
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _cut_torn_tail(self) -> int:
        if not self.path.exists():
            return 0
        size = self.path.stat().st_size
        if size == 0:
            return 0
        with open(self.path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return 0
            f.seek(0)
            data = f.read()
            keep = data.rfind(b"\n") + 1  # 0 when the only line is torn
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
            return size - keep

    def read(self) -> Iterator[dict[str, Any]]:
        """Every complete record, in file order (a line that does not parse is counted and skipped)."""
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    self.corrupt_lines += 1
                    continue
                if isinstance(rec, dict):
                    yield rec

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record as one line, durably (fsync) before returning."""
        data = (json.dumps(record, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n").encode()
        with self._lock:
            written = os.write(self._fd, data)
            if written != len(data):  # pragma: no cover - a full disk
                raise OSError(f"short write to {self.path} ({written} of {len(data)} bytes); is the disk full?")
            if self.fsync:
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


@dataclass(frozen=True)
class CallRecord:
    """One completed call: what came back, what it cost, what it took to get it."""

    trial_id: str
    draw: int
    temperature: float
    status: str
    """ok, refusal or invalid (the parser's verdict; transport failures never get here)."""
    option: str | None
    text: str
    reasoning: str = ""
    finish: str = ""
    """The provider's stop / finish reason."""
    usage: Usage = field(default_factory=Usage)
    cost: float | None = None
    """USD at the price table in force when it arrived (None: the model has no price)."""
    attempts: int = 1
    retries: Mapping[str, int] = field(default_factory=dict)
    """Transport failures (by kind) this call went through before it succeeded."""
    batch: bool = False
    latency: float = 0.0
    response_id: str = ""
    served_model: str = ""
    """The model name the provider says answered (it may be a dated snapshot of the requested one)."""
    session: str = ""
    """Which process made the call (a random id per engine), to count sessions and audit resumes."""

    @property
    def key(self) -> Key:
        return (self.trial_id, self.draw, float(self.temperature))

    def to_record(self) -> dict[str, Any]:
        return {
            "trial_id": self.trial_id,
            "draw": self.draw,
            "temperature": self.temperature,
            "status": self.status,
            "option": self.option,
            "text": self.text,
            "reasoning": self.reasoning,
            "finish": self.finish,
            "usage": self.usage.to_dict(),
            "cost": self.cost,
            "attempts": self.attempts,
            "retries": dict(self.retries),
            "batch": self.batch,
            "latency": round(self.latency, 4),
            "response_id": self.response_id,
            "served_model": self.served_model,
            "session": self.session,
        }

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> CallRecord:
        return cls(
            trial_id=str(r["trial_id"]),
            draw=int(r["draw"]),
            temperature=float(r["temperature"]),
            status=str(r["status"]),
            option=r.get("option"),
            text=str(r.get("text", "")),
            reasoning=str(r.get("reasoning", "")),
            finish=str(r.get("finish", "")),
            usage=Usage.from_dict(r.get("usage")),
            cost=None if r.get("cost") is None else float(r["cost"]),
            attempts=int(r.get("attempts", 1)),
            retries={str(k): int(v) for k, v in (r.get("retries") or {}).items()},
            batch=bool(r.get("batch", False)),
            latency=float(r.get("latency", 0.0)),
            response_id=str(r.get("response_id", "")),
            served_model=str(r.get("served_model", "")),
            session=str(r.get("session", "")),
        )


class Journal:
    """Completed calls by key; every record appended durably as it arrives.

    The first record of a key is the one that counts; a later one (a paid
    call that should not have happened) is kept on disk and counted as a
    duplicate, so spend totals stay honest and samples stay unique.
    """

    def __init__(self, path: Path | None) -> None:
        self._log = AppendLog(path) if path is not None else None
        self._lock = threading.Lock()
        self._by_key: dict[Key, CallRecord] = {}
        self._all: list[CallRecord] = []
        self.duplicates = 0
        self.total_cost = 0.0
        """USD of every record, duplicates included (a duplicate was paid too)."""
        self.n_priced = 0
        if self._log is not None:
            for rec in self._log.read():
                try:
                    self._remember(CallRecord.from_record(rec))
                except (KeyError, TypeError, ValueError):
                    self._log.corrupt_lines += 1

    @property
    def path(self) -> Path | None:
        return self._log.path if self._log is not None else None

    @property
    def torn_bytes(self) -> int:
        return self._log.torn_bytes if self._log is not None else 0

    @property
    def corrupt_lines(self) -> int:
        return self._log.corrupt_lines if self._log is not None else 0

    def _remember(self, rec: CallRecord) -> bool:
        self._all.append(rec)
        if rec.cost is not None:
            self.total_cost += rec.cost
            self.n_priced += 1
        if rec.key in self._by_key:
            self.duplicates += 1
            return False
        self._by_key[rec.key] = rec
        return True

    def get(self, key: Key) -> CallRecord | None:
        with self._lock:
            return self._by_key.get(key)

    def __contains__(self, key: Key) -> bool:
        with self._lock:
            return key in self._by_key

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_key)

    def add(self, rec: CallRecord) -> bool:
        """Persist ``rec`` (fsync) and remember it; False if its key was already there (a duplicate)."""
        with self._lock:
            if self._log is not None:
                self._log.append(rec.to_record())
            return self._remember(rec)

    def records(self) -> list[CallRecord]:
        """Every record ever written, duplicates included, in arrival order."""
        with self._lock:
            return list(self._all)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
