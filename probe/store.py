"""The run store: a directory that survives a crash and never lies.

Layout of a run directory::

    manifest.json             spec, run key, model, engine settings, versions, commit
    trials.jsonl              every trial of this run (shard), in order
    .probe.lock               the writer's lock (pid, host, command; see probe.lock)
    results/
        chunk-000003.readout_options.parquet   one row per (trial_id, option)
        chunk-000003.readout_trials.parquet    one row per trial
        chunk-000003.done                      the chunk's receipt, written last

The trials are split into fixed chunks (the same split every time for the
same spec), so a resumed run computes exactly the chunks that are missing,
with exactly the same trials in each: values are bit-identical to an
uninterrupted run, and every trial is present exactly once.

A chunk counts only when its ``.done`` marker is a receipt that its files
match: the marker records, per table, the file's size, row count and SHA-256,
and is itself checksummed. The marker is written after its tables have been
renamed into place, so a kill at any point leaves either a whole chunk or a
chunk that will be recomputed; a file that was later deleted, cut short or
changed (a full disk, a killed copy job, a cluster file system) fails its
receipt, and that chunk is recomputed too. A resume and every load verify
the receipts (:meth:`RunStore.integrity`); analysis refuses a store whose
chunks are not all verified unless asked for a partial report. Every file is
written to a temporary name and renamed (atomic on POSIX). See docs/store.md.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from probe.errors import StoreError
from probe.files import (
    atomic_write_bytes,
    atomic_write_text,
    canonical_json,
    human_bytes,
    inside,
    link_problem,
    parquet_bytes,
    read_parquet_bytes,
    sha256_hex,
)
from probe.receipts import ChunkState, Integrity, Receipt, TableReceipt, legacy_tables
from probe.record import Manifest
from probe.types import Trial

MANIFEST = "manifest.json"
TRIALS = "trials.jsonl"
RESULTS = "results"
_CHUNK = re.compile(r"^chunk-(\d{6})\.done$")
_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
"""What a chunk table's name may be (it becomes part of a file name)."""


def run_key(identity: Mapping[str, Any]) -> str:
    """Hash of everything that determines the results (spec, model, value-affecting settings)."""
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:16]


def trials_text(trials: Sequence[Trial]) -> str:
    return "".join(canonical_json(t.to_record()) + "\n" for t in trials)


def write_run_files(root: Path, manifest: Manifest | Mapping[str, Any], trials: Sequence[Trial]) -> Manifest:
    """Write ``trials.jsonl``, then ``manifest.json`` recording how many trials it holds (``n_trials``) and its
    SHA-256 (``trials_sha256``), which every integrity check verifies (a file cut at a line boundary, or changed,
    is seen). Returns the record as written."""
    text = trials_text(trials)
    record = as_manifest(manifest).with_fields(n_trials=len(trials), trials_sha256=sha256_hex(text.encode()))
    atomic_write_text(Path(root) / TRIALS, text)
    atomic_write_text(Path(root) / MANIFEST, manifest_text(record))
    return record


def as_manifest(manifest: Manifest | Mapping[str, Any]) -> Manifest:
    """``manifest`` as a record (a plain mapping, as a test or a script may pass, is read like a stored file)."""
    return manifest if isinstance(manifest, Manifest) else Manifest.from_dict(manifest)


def manifest_text(manifest: Manifest | Mapping[str, Any]) -> str:
    """A manifest as written: sorted keys, NaN and NA as null, strict JSON."""
    doc = manifest.to_dict() if isinstance(manifest, Manifest) else dict(manifest)
    return json.dumps(json_ready(doc), indent=2, sort_keys=True, allow_nan=False) + "\n"


def json_ready(obj: Any) -> Any:
    """``obj`` with what JSON cannot hold turned into what it can: NaN, infinities, NA and NaT become null,
    NumPy scalars Python numbers, tuples lists, keys strings, anything else its ``str``; so ``json.dumps(...,
    allow_nan=False)`` writes valid JSON (a bare ``NaN`` is not JSON, and strict parsers refuse it)."""
    if obj is None or isinstance(obj, (bool, str, int)):
        return obj
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, Mapping):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    if type(obj).__name__ in ("NAType", "NaTType"):
        return None
    if hasattr(obj, "item") and hasattr(obj, "dtype"):  # a NumPy scalar (or a 0-d array)
        try:
            return json_ready(obj.item())
        except (TypeError, ValueError):
            return str(obj)
    if hasattr(obj, "tolist"):  # a NumPy array
        return json_ready(obj.tolist())
    return str(obj)


def chunk_bounds(n_trials: int, chunk_size: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + chunk_size, n_trials)) for lo in range(0, n_trials, chunk_size)]


class RunStore:
    """One run directory (a whole run, or one shard of it).

    ``allow_partial``: :meth:`load` returns the verified chunks of an
    incomplete or damaged store instead of refusing it.
    """

    def __init__(self, root: Path, *, allow_partial: bool = False) -> None:
        self.root = Path(root)
        self.allow_partial = allow_partial
        self._verified: dict[int, tuple[tuple[Any, ...], ChunkState]] = {}
        self._trials_seen: tuple[tuple[Any, ...], int, str] | None = None

    # ---------------------------------------------------------------- create
    @classmethod
    def open(
        cls,
        root: Path,
        manifest: Manifest | Mapping[str, Any],
        trials: Sequence[Trial],
    ) -> RunStore:
        """Create the run directory, or reopen it for resuming after checking it is the same run."""
        store = cls(root)
        new = as_manifest(manifest)
        mpath = inside(store.root, MANIFEST)
        if mpath.exists():
            old = store.manifest()
            if old.run_key != new.run_key:
                diff = sorted(
                    k for k in set(old.identity) | set(new.identity) if old.identity.get(k) != new.identity.get(k)
                )
                raise StoreError(
                    f"{store.root} holds a different run (differs in: {', '.join(diff) or 'run key'}); "
                    f"refusing to mix results. Use a new --out, or delete {store.root} to start fresh."
                )
            stored = inside(store.root, TRIALS).read_text(encoding="utf-8")
            if stored != trials_text(trials):
                raise StoreError(
                    f"{store.root}: the stored trials (prompts, options or ids) differ from what this spec "
                    "expands to now, so the experiment code changed; refusing to mix. "
                    "Use a new --out, or delete the folder to start fresh."
                )
            return store
        leftovers = (
            [p for p in store.root.iterdir() if p.name != TRIALS and not p.name.startswith(".")]
            if store.root.exists()
            else []
        )
        if leftovers:  # a crash between trials.jsonl and manifest.json leaves only files we rewrite
            raise StoreError(f"{store.root} exists, is not empty and has no {MANIFEST}; choose another --out")
        store.root.mkdir(parents=True, exist_ok=True)
        write_run_files(store.root, new, trials)
        return store

    def update_manifest(self, fields: Mapping[str, Any]) -> None:
        """Add or replace top-level manifest fields that do not enter the run key (e.g. engine stats), atomically."""
        clash = [k for k in fields if k in ("run_key", "identity")]
        if clash:
            raise ValueError(f"update_manifest may not change {clash}: they define the run")
        atomic_write_text(inside(self.root, MANIFEST), manifest_text(self.manifest().with_fields(**fields)))

    # ------------------------------------------------------------------ read
    def manifest(self) -> Manifest:
        """The run's record (:class:`probe.record.Manifest`); a missing, unreadable or damaged file is a StoreError
        that says how to recover."""
        path = inside(self.root, MANIFEST)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise StoreError(f"{self.root} is not a run directory (no {MANIFEST})") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise StoreError(
                f"{path} is not valid JSON ({e}); the run cannot be read without it: restore {MANIFEST} from a copy "
                "of the run folder"
            ) from None
        if not isinstance(doc, dict):
            raise StoreError(f"{path} is not a manifest (a JSON object); restore {MANIFEST} from a copy of the run")
        return Manifest.from_dict(doc, where=str(path))

    def _records(self) -> Iterator[dict[str, Any]]:
        """The records of trials.jsonl; a line that is not a JSON object is a StoreError naming the file and line."""
        path = inside(self.root, TRIALS)
        with open(path, encoding="utf-8") as f:
            for no, line in enumerate(f, 1):
                if line.strip():
                    yield parse_trial_line(line, path, no)

    def trials(self) -> list[Trial]:
        return [Trial.from_record(r) for r in self._records()]

    def trial_ids(self) -> list[str]:
        return [r["trial_id"] for r in self._records()]

    @property
    def results_dir(self) -> Path:
        return inside(self.root, RESULTS)

    def done_chunks(self) -> set[int]:
        """Chunks that have a ``.done`` marker, verified or not (see :meth:`integrity` for which to trust)."""
        if not self.results_dir.is_dir():
            return set()
        return {int(m.group(1)) for p in self.results_dir.iterdir() if (m := _CHUNK.match(p.name))}

    def marker(self, k: int) -> Path:
        return self.results_dir / f"chunk-{k:06d}.done"

    def table_path(self, k: int, name: str) -> Path:
        return self.results_dir / f"chunk-{k:06d}.{name}.parquet"

    def bounds(self) -> list[tuple[int, int]]:
        """The [lo, hi) trial positions of every chunk, from the manifest's chunk size.

        A manifest without a chunk size (written by a caller that commits all
        trials as chunk 0) has one chunk; a run with no trials has chunk 0 only
        when a marker was written for it (an imported table).
        """
        man = self.manifest()
        n = man.n_trials if man.n_trials is not None else self.n_trials()
        size = man.chunk_size or max(n, 1)
        return chunk_bounds(n, size) or ([(0, 0)] if self.marker(0).exists() else [])

    def n_trials(self) -> int:
        """Lines in trials.jsonl (the manifest's ``n_trials`` says the same for runs the runner wrote)."""
        return self._trials_file()[0]

    def _trials_file(self) -> tuple[int, str]:
        """(lines, SHA-256) of trials.jsonl, read once and kept while the file is unchanged (size, time, inode)."""
        path = inside(self.root, TRIALS)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise StoreError(f"{self.root} has no {TRIALS}; it is not a complete run folder") from None
        sig = (st.st_size, st.st_mtime_ns, st.st_ino)
        if self._trials_seen is None or self._trials_seen[0] != sig:
            h, lines = hashlib.sha256(), 0
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
                    lines += block.count(b"\n")
            self._trials_seen = (sig, lines, h.hexdigest())
        return self._trials_seen[1], self._trials_seen[2]

    def trials_problem(self, manifest: Manifest) -> str:
        """Why trials.jsonl does not match what the manifest records (empty when it does; a manifest written
        before ``trials_sha256`` was recorded is checked on its ``n_trials`` alone)."""
        lines, digest = self._trials_file()
        n = manifest.n_trials
        if n is not None and lines != n:
            return f"{TRIALS} holds {lines} trials, the manifest says {n} (cut short or added to after the run)"
        want = manifest.trials_sha256
        if want is not None and want != digest:
            return f"{TRIALS} does not match the manifest's hash (changed after the run was written)"
        return ""

    def integrity(self) -> Integrity:
        """Every expected chunk, verified against its receipt (files re-hashed unless unchanged since), and
        trials.jsonl against the manifest's count and hash."""
        man = self.manifest()
        key = man.run_key
        bounds = self.bounds()
        states = tuple(self._chunk_state(k, b, key) for k, b in enumerate(bounds))
        return Integrity(self.root, bounds[-1][1] if bounds else 0, states, self.trials_problem(man))

    def verified_chunks(self) -> set[int]:
        return {c.chunk for c in self.integrity().verified}

    def _signature(self, k: int, names: Sequence[str]) -> tuple[Any, ...]:
        def sig(p: Path) -> tuple[Any, ...]:
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                return (p.name, None)
            return (p.name, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)

        return (sig(self.marker(k)), *(sig(self.table_path(k, n)) for n in names))

    def _chunk_state(self, k: int, trials: tuple[int, int], run_key: str) -> ChunkState:
        marker = self.marker(k)
        why = link_problem(marker)
        if why:
            return ChunkState(k, trials, "damaged", f"its .done marker: {why}")
        try:
            text = marker.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ChunkState(k, trials, "missing", "no .done marker (never committed)")
        cached = self._verified.get(k)
        if cached is not None and cached[1].trials == trials and self._signature(k, cached[1].tables) == cached[0]:
            return cached[1]
        state = self._verify(k, trials, run_key, text)
        if state.status == "verified":
            self._verified[k] = (self._signature(k, state.tables), state)
        return state

    def _verify(self, k: int, trials: tuple[int, int], run_key: str, text: str) -> ChunkState:
        legacy = legacy_tables(text)
        if legacy is not None:  # a format-1 marker: no receipt, so the best check is that every table parses
            bad = [n for n in legacy if not _TABLE_NAME.match(n)]
            if bad:
                return ChunkState(k, trials, "damaged", f"its .done marker names a table {bad[0]!r}, not a table name")
            for name in legacy:
                why = _parquet_problem(self.table_path(k, name))
                if why:
                    return ChunkState(k, trials, "damaged", why, legacy_tables=legacy)
            return ChunkState(k, trials, "verified", legacy_tables=legacy)
        try:
            receipt = Receipt.parse(text)
        except ValueError as e:
            return ChunkState(k, trials, "damaged", f"its .done marker is damaged: {e}")
        if receipt.run_key != run_key or receipt.chunk != k:
            return ChunkState(
                k, trials, "damaged", f"its .done marker belongs to chunk {receipt.chunk} of run {receipt.run_key}"
            )
        if receipt.trials != trials:
            return ChunkState(
                k, trials, "damaged", f"its .done marker holds trials {receipt.trials}, the manifest's split {trials}"
            )
        for name, t in receipt.tables.items():
            own = f"chunk-{k:06d}.{name}.parquet"
            if not _TABLE_NAME.match(name) or t.file != own:
                return ChunkState(
                    k,
                    trials,
                    "damaged",
                    f"its receipt names file {t.file!r} for table {name!r}; a receipt may name only its own "
                    f"chunk's file ({own})",
                )
            why = t.check(self.results_dir)
            if why:
                return ChunkState(k, trials, "damaged", why, receipt)
        return ChunkState(k, trials, "verified", receipt=receipt)

    # ----------------------------------------------------------------- write
    def write_chunk(self, k: int, tables: Mapping[str, Any], *, trials: tuple[int, int] | None = None) -> None:
        """Write one chunk's tables, then its receipt (the order is the crash-safety).

        ``trials`` ([lo, hi) in trials.jsonl) defaults to chunk ``k`` of the
        manifest's split. A full disk (checked before the first byte, and
        caught if it fills during the write) leaves nothing of the chunk
        behind and raises a :class:`StoreError` naming the folder and the
        space the chunk needs.
        """
        span = trials if trials is not None else self.bounds()[k]
        blobs = {name: parquet_bytes(frame) for name, frame in tables.items()}
        receipt = Receipt(
            k,
            self.manifest().run_key,
            span,
            {
                name: TableReceipt(self.table_path(k, name).name, len(data), len(tables[name]), sha256_hex(data))
                for name, data in blobs.items()
            },
        )
        marker_text = receipt.to_text()
        self.results_dir.mkdir(parents=True, exist_ok=True)
        block = max(os.statvfs(self.results_dir).f_frsize, 1)  # files take whole blocks
        sizes = [*(len(b) for b in blobs.values()), len(marker_text.encode())]
        need = sum(-(-n // block) * block for n in sizes)
        free = shutil.disk_usage(self.results_dir).free
        if free < need:
            raise StoreError(self._full_message(k, need, free))
        self.marker(k).unlink(missing_ok=True)  # a rewrite is untrusted until its new receipt lands
        for old in self.results_dir.glob(f"chunk-{k:06d}.*.parquet"):
            old.unlink()
        written: list[Path] = []
        try:
            for name, data in blobs.items():
                atomic_write_bytes(self.table_path(k, name), data)
                written.append(self.table_path(k, name))
            atomic_write_text(self.marker(k), marker_text)
        except OSError as e:
            for p in written:
                p.unlink(missing_ok=True)
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreError(self._full_message(k, need, shutil.disk_usage(self.results_dir).free)) from e
            raise
        self._verified.pop(k, None)

    def _full_message(self, k: int, need: int, free: int) -> str:
        return (
            f"no space left for chunk {k} in {self.results_dir}: it needs {human_bytes(need)} ({need} bytes on disk), the "
            f"file system has {human_bytes(free)} free. Nothing of chunk {k} was committed; free space (or move the "
            "run folder to a bigger disk), then re-run the same command: committed chunks are kept and it resumes here"
        )

    # ------------------------------------------------------------------ load
    def load(self, name: str) -> Any:
        """All rows of table ``name``, chunks in order, each file checked against its receipt as it is read.

        Refuses (:class:`StoreError`, with expected vs found trials and how to
        repair) a store with a damaged or missing chunk, unless ``allow_partial``.
        """
        import pandas as pd

        integrity = self.integrity()
        if not integrity.complete and not self.allow_partial:
            raise StoreError(integrity.refusal())
        parts = []
        for c in integrity.verified:
            if name not in c.tables:
                continue
            path = self.table_path(c.chunk, name)
            why = link_problem(path)
            if why:
                raise StoreError(f"{path}: {why}; run `probe check {self.root}`")
            data = path.read_bytes()
            receipt = c.receipt.tables[name] if c.receipt is not None else None
            if receipt is not None and sha256_hex(data) != receipt.sha256:
                raise StoreError(f"{path} changed while it was being read; run `probe check {self.root}`")
            frame = read_parquet_bytes(data)
            if receipt is not None and len(frame) != receipt.rows:
                raise StoreError(f"{path} has {len(frame)} rows, its receipt says {receipt.rows}")
            parts.append(frame)
        if not parts:
            return pd.DataFrame()
        return pd.concat(parts, ignore_index=True)


def parse_trial_line(line: str | bytes, path: Path, no: int) -> dict[str, Any]:
    """One line of trials.jsonl as a record; a StoreError naming the file, the line and what is wrong."""
    try:
        doc = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StoreError(f"{path}, line {no}: not valid JSON ({e}); the file is damaged") from None
    if not isinstance(doc, dict) or "trial_id" not in doc:
        raise StoreError(f"{path}, line {no}: not a trial (a JSON object with a trial_id); the file is damaged")
    return doc


def _parquet_problem(path: Path) -> str | None:
    """Why ``path`` is not a readable Parquet file (None: its footer reads)."""
    import pyarrow.parquet as pq

    why = link_problem(path)
    if why:
        return why
    if not path.exists():
        return f"{path.name} is missing"
    try:
        pq.read_metadata(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for a short or garbled file
        return f"{path.name} is not readable Parquet ({e})"
    return None
