"""The API engine's journal: every paid response is on disk before anything else happens.

The runner commits whole chunks of trials to the run folder; an API
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

Every line carries ``line_sha256``, a checksum of the rest of its record
(lines written before it existed have none and are taken as they are). A
writer that reopens the journal moves any complete line that does not parse,
fails its checksum or is not a valid record into ``<name>.quarantine``
(the raw bytes, for a human to read) and keeps every other line; the API
engine says which lines went and why. A response lost that way is bought
again only if its chunk has to be recomputed: a committed chunk already
holds it.

The same append-only file discipline keeps the batch-interface state
(``results/api-batches.jsonl``, see :mod:`engines.api.batch`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.api.pricing import Usage
from probe.errors import StoreError
from probe.files import atomic_write_bytes, human_bytes

JOURNAL = "api-journal.jsonl"
BATCHES = "api-batches.jsonl"
STATS = "api-stats.json"
LOCK = "api.lock"

Key = tuple[str, int, float]
"""(trial_id, draw, sampling temperature)."""

CHECK = "line_sha256"
"""The field of a journal line that checksums the rest of it."""

Validate = Callable[[Mapping[str, Any]], object]
"""Raises KeyError / TypeError / ValueError for a record that parses but is not valid."""


def _checksum(record: Mapping[str, Any]) -> str:
    body = json.dumps(dict(record), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def encode_line(record: Mapping[str, Any]) -> bytes:
    """One record as one checksummed JSON line."""
    body = {k: v for k, v in record.items() if k != CHECK}
    full = {**body, CHECK: _checksum(body)}
    return (json.dumps(full, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n").encode()


def decode_line(raw: bytes, validate: Validate | None = None) -> dict[str, Any]:
    """The record of one complete line, checksum removed; ValueError saying why it is damaged."""
    try:
        rec = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"not valid JSON ({e.__class__.__name__}: {str(e)[:80]})") from None
    if not isinstance(rec, dict):
        raise ValueError(f"not a JSON object (a {type(rec).__name__})")
    claimed = rec.pop(CHECK, None)
    if claimed is not None and claimed != _checksum(rec):
        raise ValueError("its checksum does not match its content (the line was changed)")
    if validate is not None:
        try:
            validate(rec)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a valid record ({e!r})") from None
    return rec


@dataclass(frozen=True)
class DamagedLine:
    """A complete line of an append log that cannot be trusted."""

    line: int
    """1-based line number in the file as it was found."""
    reason: str
    raw: bytes

    def describe(self) -> str:
        tid = re.search(rb'"trial_id":\s*"([^"]{1,80})"', self.raw)
        draw = re.search(rb'"draw":\s*(\d+)', self.raw)
        looks = ""
        if tid:
            looks = f"; it looks like trial {tid.group(1).decode(errors='replace')}"
            looks += f" draw {int(draw.group(1))}" if draw else ""
        return f"line {self.line}: {self.reason}{looks}"


def scan_lines(path: Path, validate: Validate | None = None) -> tuple[list[bytes], list[DamagedLine]]:
    """(the good complete lines, the damaged ones) of ``path``, read only; a torn last line is in neither."""
    if not path.exists():
        return [], []
    good: list[bytes] = []
    bad: list[DamagedLine] = []
    data = path.read_bytes()
    lines = data.split(b"\n")[:-1]  # the piece after the last newline is torn (or empty)
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            decode_line(raw, validate)
        except ValueError as e:
            bad.append(DamagedLine(i, str(e), raw))
            continue
        good.append(raw + b"\n")
    return good, bad


def quarantine_path(path: Path) -> Path:
    return path.with_name(path.stem + ".quarantine")


def quarantined_count(path: Path | None) -> int:
    """Lines ever moved out of the log at ``path`` (all sessions)."""
    q = quarantine_path(path) if path is not None else None
    return q.read_bytes().count(b"\n") if q is not None and q.exists() else 0


def quarantine_message(path: Path, damaged: tuple[DamagedLine, ...], kept: int | None) -> str:
    """The line the API engine prints when it quarantined damaged lines (``kept``: responses left; None: a batch log)."""
    head = (
        f"api: quarantined {len(damaged)} damaged line(s) of {path} into {quarantine_path(path)} "
        f"({'; '.join(d.describe() for d in damaged)})"
    )
    if kept is None:
        return (
            head
            + "; kept the other records (the requests of a batch whose record was lost are sent again, and that batch may still be billed)"
        )
    return head + (
        f"; kept the other {kept} responses. A committed chunk already holds its responses; a response lost "
        "here is bought again only if its chunk is recomputed"
    )


class AppendLog:
    """An append-only JSON-lines file, each line checksummed and fsync-ed.

    On open, a torn tail is cut off and (``quarantine``) damaged complete
    lines are moved to :func:`quarantine_path`; only one writer may open it
    (the run folder's lock sees to that).
    """

    def __init__(
        self, path: Path, *, fsync: bool = True, validate: Validate | None = None, quarantine: bool = True
    ) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.validate = validate
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.torn_bytes = self._cut_torn_tail()
        self.corrupt_lines = 0
        self.quarantined: tuple[DamagedLine, ...] = self._quarantine() if quarantine else ()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _quarantine(self) -> tuple[DamagedLine, ...]:
        """Move damaged lines out of the log (their raw bytes first, then the log without them)."""
        good, bad = scan_lines(self.path, self.validate)
        if not bad:
            return ()
        with open(quarantine_path(self.path), "ab") as q:
            q.write(b"".join(d.raw + b"\n" for d in bad))
            q.flush()
            os.fsync(q.fileno())

        atomic_write_bytes(self.path, b"".join(good))
        return tuple(bad)

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
        """Every complete valid record, in file order (a damaged line is counted and skipped)."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            for line in f:
                if not line.strip() or not line.endswith(b"\n"):
                    continue
                try:
                    yield decode_line(line.rstrip(b"\n"), self.validate)
                except ValueError:
                    self.corrupt_lines += 1

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record as one checksummed line, durably (fsync) before returning."""
        data = encode_line(record)
        with self._lock:
            try:
                written = os.write(self._fd, data)
                if written != len(data):  # a full disk mid-line: the torn line is quarantined on reopen
                    raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
                if self.fsync:
                    os.fsync(self._fd)
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise

                free = shutil.disk_usage(self.path.parent).free
                raise StoreError(
                    f"no space left in {self.path.parent} to journal a record of {len(data)} bytes (the file "
                    f"system has {human_bytes(free)} free), so it is lost; free space, then re-run the same command: "
                    "every record journaled before it is kept"
                ) from e

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
        self._log = AppendLog(path, validate=CallRecord.from_record) if path is not None else None
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

    @property
    def quarantined(self) -> tuple[DamagedLine, ...]:
        """The damaged lines this open moved to the quarantine file."""
        return self._log.quarantined if self._log is not None else ()

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
