"""The run store: a directory that survives a crash and never lies.

Layout of a run directory::

    manifest.json             spec, run key, model, engine settings, versions, commit
    trials.jsonl              every trial of this run (shard), in order
    results/
        chunk-000003.readout_options.parquet   one row per (trial_id, option)
        chunk-000003.readout_trials.parquet    one row per trial
        chunk-000003.done                      commit marker, written last

The trials are split into fixed chunks (the same split every time for the
same spec), so a resumed run computes exactly the chunks that are missing,
with exactly the same trials in each: values are bit-identical to an
uninterrupted run, and every trial is present exactly once. A chunk counts
only when its ``.done`` marker exists; the marker is written after its tables
have been renamed into place, so a kill at any point leaves either a whole
chunk or a chunk that will be recomputed. Every file is written to a temporary
name and renamed (atomic on POSIX).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.types import Trial

MANIFEST = "manifest.json"
TRIALS = "trials.jsonl"
RESULTS = "results"
_CHUNK = re.compile(r"^chunk-(\d{6})\.done$")


class StoreError(RuntimeError):
    """A run directory that cannot be used as asked; the message says how to proceed."""


def canonical_json(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def run_key(identity: Mapping[str, Any]) -> str:
    """Hash of everything that determines the results (spec, model, value-affecting settings)."""
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:16]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_parquet(path: Path, frame: Any) -> None:
    import io

    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (0-based), a contiguous block of the trial list."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not m:
            raise ValueError(f"--shard must look like i/n (e.g. 0/8), got {text!r}")
        i, n = int(m.group(1)), int(m.group(2))
        if n < 1 or not 0 <= i < n:
            raise ValueError(f"--shard {text}: need n >= 1 and 0 <= i < n (shards are 0-based), got i={i}, n={n}")
        return cls(i, n)

    def select(self, trials: Sequence[Trial]) -> list[Trial]:
        n = len(trials)
        lo, hi = (self.index * n) // self.count, ((self.index + 1) * n) // self.count
        return list(trials[lo:hi])

    @property
    def folder(self) -> str:
        return f"shard-{self.index}-of-{self.count}"


def _trials_text(trials: Sequence[Trial]) -> str:
    return "".join(canonical_json(t.to_record()) + "\n" for t in trials)


def chunk_bounds(n_trials: int, chunk_size: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + chunk_size, n_trials)) for lo in range(0, n_trials, chunk_size)]


class RunStore:
    """One run directory (a whole run, or one shard of it)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # ---------------------------------------------------------------- create
    @classmethod
    def open(
        cls,
        root: Path,
        manifest: Mapping[str, Any],
        trials: Sequence[Trial],
    ) -> RunStore:
        """Create the run directory, or reopen it for resuming after checking it is the same run."""
        store = cls(root)
        key = manifest["run_key"]
        mpath = store.root / MANIFEST
        if mpath.exists():
            old = store.manifest()
            if old.get("run_key") != key:
                diff = sorted(
                    k
                    for k in set(old.get("identity", {})) | set(manifest.get("identity", {}))
                    if old.get("identity", {}).get(k) != manifest.get("identity", {}).get(k)
                )
                raise StoreError(
                    f"{store.root} holds a different run (differs in: {', '.join(diff) or 'run key'}); "
                    f"refusing to mix results. Use a new --out, or delete {store.root} to start fresh."
                )
            stored = (store.root / TRIALS).read_text(encoding="utf-8")
            if stored != _trials_text(trials):
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
        atomic_write_text(store.root / TRIALS, _trials_text(trials))
        atomic_write_text(mpath, json.dumps(dict(manifest), indent=2, sort_keys=True, default=str) + "\n")
        return store

    def update_manifest(self, fields: Mapping[str, Any]) -> None:
        """Add or replace top-level manifest fields that do not enter the run key (e.g. engine stats), atomically."""
        manifest = self.manifest()
        clash = [k for k in fields if k in ("run_key", "identity")]
        if clash:
            raise ValueError(f"update_manifest may not change {clash}: they define the run")
        manifest.update(fields)
        atomic_write_text(self.root / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")

    # ------------------------------------------------------------------ read
    def manifest(self) -> dict[str, Any]:
        path = self.root / MANIFEST
        try:
            return dict(json.loads(path.read_text()))
        except FileNotFoundError:
            raise StoreError(f"{self.root} is not a run directory (no {MANIFEST})") from None
        except json.JSONDecodeError as e:
            raise StoreError(f"{path} is corrupt ({e}); delete the run folder to start fresh") from None

    def trials(self) -> list[Trial]:
        with open(self.root / TRIALS, encoding="utf-8") as f:
            return [Trial.from_record(json.loads(line)) for line in f if line.strip()]

    def trial_ids(self) -> list[str]:
        with open(self.root / TRIALS, encoding="utf-8") as f:
            return [json.loads(line)["trial_id"] for line in f if line.strip()]

    @property
    def results_dir(self) -> Path:
        return self.root / RESULTS

    def done_chunks(self) -> set[int]:
        if not self.results_dir.is_dir():
            return set()
        return {int(m.group(1)) for p in self.results_dir.iterdir() if (m := _CHUNK.match(p.name))}

    # ----------------------------------------------------------------- write
    def write_chunk(self, k: int, tables: Mapping[str, Any]) -> None:
        """Write one chunk's tables, then its commit marker (the order is the crash-safety)."""
        for name, frame in tables.items():
            atomic_write_parquet(self.results_dir / f"chunk-{k:06d}.{name}.parquet", frame)
        atomic_write_text(self.results_dir / f"chunk-{k:06d}.done", canonical_json(sorted(tables)) + "\n")

    def load(self, name: str) -> Any:
        """All committed rows of table ``name``, chunks in order."""
        import pandas as pd

        parts = []
        for k in sorted(self.done_chunks()):
            path = self.results_dir / f"chunk-{k:06d}.{name}.parquet"
            if path.exists():
                parts.append(pd.read_parquet(path))
        if not parts:
            return pd.DataFrame()
        return pd.concat(parts, ignore_index=True)


def find_shards(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).glob("shard-*-of-*") if p.is_dir())


def merge_shards(root: Path) -> RunStore:
    """Join the shard folders of ``root`` into one run in ``root`` itself.

    Refuses unless every shard 0..n-1 is present, from the same run, and complete.
    """
    import pandas as pd

    root = Path(root)
    shards = find_shards(root)
    if not shards:
        raise StoreError(f"{root} has no shard-i-of-n folders to merge (runs made with --shard write them)")
    stores = [RunStore(p) for p in shards]
    mans = [s.manifest() for s in stores]
    keys = {m["run_key"] for m in mans}
    if len(keys) != 1:
        raise StoreError(f"{root}: shards come from different runs (run keys {sorted(keys)}); refusing to merge")
    count = mans[0]["shard"]["count"]
    seen = sorted(m["shard"]["index"] for m in mans)
    if seen != list(range(count)) or any(m["shard"]["count"] != count for m in mans):
        missing = sorted(set(range(count)) - set(seen))
        raise StoreError(f"{root}: expected shards 0..{count - 1}, missing {missing}; run them, then merge again")
    by_index = dict(sorted(((m["shard"]["index"], s) for m, s in zip(mans, stores, strict=True))))
    for i, s in by_index.items():
        n_chunks = len(chunk_bounds(len(s.trial_ids()), int(s.manifest()["chunk_size"])))
        if len(s.done_chunks()) != n_chunks:
            raise StoreError(f"{s.root}: shard {i} is incomplete ({len(s.done_chunks())}/{n_chunks} chunks); rerun it")
    trials = [t for s in by_index.values() for t in s.trials()]
    manifest = dict(mans[0])
    manifest["shard"] = None
    manifest["merged_from"] = [s.root.name for s in by_index.values()]
    manifest["n_trials"] = len(trials)
    if (root / MANIFEST).exists():
        existing = RunStore(root).manifest()
        if existing.get("run_key") != manifest["run_key"]:
            raise StoreError(f"{root} already holds a different run; merge into an empty folder")
    atomic_write_text(root / TRIALS, _trials_text(trials))
    atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
    merged = RunStore(root)
    names = sorted({n for s in stores for n in _table_names(s)})
    tables = {n: pd.concat([s.load(n) for s in by_index.values()], ignore_index=True) for n in names}
    merged.write_chunk(0, tables)
    manifest["chunk_size"] = max(len(trials), 1)
    atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
    return merged


def _table_names(store: RunStore) -> set[str]:
    names = set()
    for k in store.done_chunks():
        names.update(json.loads((store.results_dir / f"chunk-{k:06d}.done").read_text()))
    return names
