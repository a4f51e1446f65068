"""Shards of a run: ``--shard i/n`` splits the trials for cluster arrays, and ``merge`` joins the shard folders."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from probe.errors import StoreError
from probe.lock import RunLock
from probe.record import Manifest
from probe.store import MANIFEST, RunStore, write_run_files
from probe.types import Trial


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


def find_shards(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).glob("shard-*-of-*") if p.is_dir())


def merge_shards(root: Path) -> RunStore:
    """Join the shard folders of ``root`` into one run in ``root`` itself.

    Refuses unless every shard 0..n-1 is present, from the same run, and
    complete with every chunk verified; holds ``root``'s writer lock while it writes.
    """
    root = Path(root)
    shards = find_shards(root)
    if not shards:
        raise StoreError(f"{root} has no shard-i-of-n folders to merge (runs made with --shard write them)")
    counts = sorted({int(p.name.rsplit("-of-", 1)[1]) for p in shards if p.name.rsplit("-of-", 1)[1].isdigit()})
    if len(counts) > 1:
        raise StoreError(
            f"{root} holds shards of {len(counts)} different splits (N = {', '.join(map(str, counts))}: "
            f"{', '.join(p.name for p in shards)}); refusing to mix them. Keep the folders of one N (delete "
            "the others, or move them to their own folder) and merge again"
        )
    stores = [RunStore(p) for p in shards]
    mans = [s.manifest() for s in stores]
    keys = {m.run_key for m in mans}
    if len(keys) != 1:
        raise StoreError(f"{root}: shards come from different runs (run keys {sorted(keys)}); refusing to merge")
    split = [_shard_of(m, s) for m, s in zip(mans, stores, strict=True)]
    count = split[0].count
    seen = sorted(sh.index for sh in split)
    if seen != list(range(count)) or any(sh.count != count for sh in split):
        missing = sorted(set(range(count)) - set(seen))
        raise StoreError(f"{root}: expected shards 0..{count - 1}, missing {missing}; run them, then merge again")
    by_index = dict(sorted(((sh.index, s) for sh, s in zip(split, stores, strict=True))))
    for i, s in by_index.items():
        integrity = s.integrity()
        if not integrity.complete:
            raise StoreError(
                f"{s.root}: shard {i} is incomplete ({len(integrity.verified)}/{len(integrity.chunks)} chunks "
                f"verified: {'; '.join(integrity.problems()[:3])}); rerun it (the same `probe run ... --shard "
                f"{i}/{count}`), then merge again"
            )
    with RunLock(root).hold():
        return _write_merged(root, mans[0], by_index)


def _shard_of(manifest: Manifest, store: RunStore) -> Shard:
    """The shard a shard folder's manifest records; a folder whose manifest records none is named."""
    if manifest.shard_of is None:
        raise StoreError(
            f"{store.root}: its manifest records no shard (index, count), so it is not a shard of a run; move it "
            "out of the folder and merge again"
        )
    return Shard(*manifest.shard_of)


def _write_merged(root: Path, first: Manifest, by_index: Mapping[int, RunStore]) -> RunStore:
    import pandas as pd

    trials = [t for s in by_index.values() for t in s.trials()]
    manifest = first.with_fields(
        shard=None,
        merged_from=[s.root.name for s in by_index.values()],
        n_trials=len(trials),
        chunk_size=max(len(trials), 1),
    )
    if (root / MANIFEST).exists():
        existing = RunStore(root).manifest()
        if existing.run_key != manifest.run_key:
            raise StoreError(f"{root} already holds a different run; merge into an empty folder")
    write_run_files(root, manifest, trials)  # records n_trials and the merged trials.jsonl's hash
    merged = RunStore(root)
    names = sorted({n for s in by_index.values() for c in s.integrity().verified for n in c.tables})
    tables = {n: pd.concat([s.load(n) for s in by_index.values()], ignore_index=True) for n in names}
    merged.write_chunk(0, tables, trials=(0, len(trials)))
    return merged
