"""A chunk's receipt (its ``.done`` marker) and the integrity of a run folder checked against the receipts.

A chunk counts only when its receipt matches its files: per table, the file's
size, row count and SHA-256, and the receipt's own checksum
(:meth:`probe.store.RunStore.integrity` checks them; docs/store.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from probe.files import canonical_json, file_sha256, link_problem, sha256_hex

RECEIPT_FORMAT = 2
"""Version of the ``.done`` receipt (format 1 was a bare JSON list of table names)."""


@dataclass(frozen=True)
class TableReceipt:
    """One table file of a chunk as it was written."""

    file: str
    bytes: int
    rows: int
    sha256: str

    def check(self, results: Path) -> str | None:
        """Why the file on disk does not match (None: it matches)."""
        path = results / self.file
        why = link_problem(path)
        if why:
            return why
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return f"{self.file} is missing"
        if size != self.bytes:
            return f"{self.file} is {size} bytes, its receipt says {self.bytes}"
        if file_sha256(path) != self.sha256:
            return f"{self.file} does not match its receipt's content hash (changed or damaged on disk)"
        return None


@dataclass(frozen=True)
class Receipt:
    """A chunk's ``.done`` marker: which run and trials it holds and, per table, what was written."""

    chunk: int
    run_key: str
    trials: tuple[int, int]
    """[lo, hi) positions in trials.jsonl."""
    tables: Mapping[str, TableReceipt] = field(default_factory=dict)

    def _body(self) -> dict[str, Any]:
        return {
            "format": RECEIPT_FORMAT,
            "chunk": self.chunk,
            "run_key": self.run_key,
            "trials": list(self.trials),
            "tables": {
                n: {"file": t.file, "bytes": t.bytes, "rows": t.rows, "sha256": t.sha256}
                for n, t in sorted(self.tables.items())
            },
        }

    def to_text(self) -> str:
        body = self._body()
        return json.dumps({**body, "receipt_sha256": sha256_hex(canonical_json(body).encode())}, indent=1) + "\n"

    @classmethod
    def parse(cls, text: str) -> Receipt:
        """The receipt in ``text``; ValueError saying what is wrong with it."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != RECEIPT_FORMAT:
            raise ValueError(f"not a format-{RECEIPT_FORMAT} receipt")
        claimed = doc.pop("receipt_sha256", None)
        if claimed != sha256_hex(canonical_json(doc).encode()):
            raise ValueError("its own checksum does not match (the marker was changed or damaged)")
        try:
            tables = {
                str(n): TableReceipt(str(t["file"]), int(t["bytes"]), int(t["rows"]), str(t["sha256"]))
                for n, t in doc["tables"].items()
            }
            lo, hi = (int(x) for x in doc["trials"])
            return cls(int(doc["chunk"]), str(doc["run_key"]), (lo, hi), tables)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"a field is missing or malformed ({e!r})") from None


ChunkStatus = Literal["verified", "damaged", "missing"]


@dataclass(frozen=True)
class ChunkState:
    """What the store holds for one chunk of the trial list."""

    chunk: int
    trials: tuple[int, int]
    status: ChunkStatus
    reason: str = ""
    """Why a chunk is damaged or missing (empty when verified)."""
    receipt: Receipt | None = None
    legacy_tables: tuple[str, ...] = ()
    """Tables of a format-1 marker (no receipt): trusted when they parse."""

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(sorted(self.receipt.tables)) if self.receipt is not None else self.legacy_tables

    def describe(self) -> str:
        lo, hi = self.trials
        what = f"chunk {self.chunk} (trials {lo}-{hi - 1})" if hi > lo else f"chunk {self.chunk}"
        return f"{what}: {self.status}" + (f", {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class Integrity:
    """Every expected chunk of a run folder, checked against its receipt."""

    root: Path
    n_trials: int
    chunks: tuple[ChunkState, ...]
    trials_problem: str = ""
    """Why trials.jsonl does not match the manifest (its count or its hash); empty when it does."""

    def _with(self, status: ChunkStatus) -> list[ChunkState]:
        return [c for c in self.chunks if c.status == status]

    @property
    def verified(self) -> list[ChunkState]:
        return self._with("verified")

    @property
    def damaged(self) -> list[ChunkState]:
        return self._with("damaged")

    @property
    def missing(self) -> list[ChunkState]:
        return self._with("missing")

    @property
    def found_trials(self) -> int:
        return sum(hi - lo for c in self.verified for lo, hi in [c.trials])

    @property
    def complete(self) -> bool:
        return not self.damaged and not self.missing and not self.trials_problem

    def counts_line(self) -> str:
        done = len(self.verified) + len(self.damaged)
        return (
            f"chunks: {len(self.chunks)} expected, {done} done, {len(self.verified)} verified, "
            f"{len(self.damaged)} damaged, {len(self.missing)} missing; "
            f"trials: {self.found_trials} of {self.n_trials} verified"
        ) + (f"; but {self.trials_problem}" if self.trials_problem else "")

    def problems(self) -> list[str]:
        return [
            *([self.trials_problem] if self.trials_problem else []),
            *(c.describe() for c in self.chunks if c.status != "verified"),
        ]

    def partial_header(self) -> list[str]:
        """The lines a report on an incomplete store starts with (``probe analyze --allow-partial``)."""
        return [
            f"> **Partial report** (`probe analyze --allow-partial`): {self.found_trials} of {self.n_trials} trials, "
            f"from {len(self.verified)} of {len(self.chunks)} chunks; left out: {'; '.join(self.problems())}. "
            "Complete it by re-running `probe run` with the same arguments.",
            "",
        ]

    def refusal(self) -> str:
        """Why analysis refuses this store, and how to repair it."""
        bad = self.problems()
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        return (
            f"{self.root} is incomplete: the manifest expects {self.n_trials} trials, {self.found_trials} are in "
            f"verified chunks ({shown}). Repair it by re-running `probe run` with the same arguments (it "
            f"recomputes only those chunks; API responses are replayed from the journal), see `probe check "
            f"{self.root}`; or report on what is there with `probe analyze --allow-partial {self.root}`"
        )


def legacy_tables(text: str) -> tuple[str, ...] | None:
    """The table names of a format-1 marker (a JSON list), else None."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(doc, list) and all(isinstance(n, str) for n in doc):
        return tuple(doc)
    return None
