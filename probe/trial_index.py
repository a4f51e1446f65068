"""The trial index of a run: one row per line of ``trials.jsonl``, without the messages, built once and cached.

A study-scale run has hundreds of thousands of trials and a ``trials.jsonl``
of several hundred MB, so :class:`probe.runs.Run` never reads the whole file
to show one trial. The index (id, position, item, factors, options, and the
byte offset and length of each line) is scanned once (:func:`build_index`)
and cached as Parquet under ``$PROBE_CACHE/view/`` (:func:`cache_dir`), keyed
by the file's path, size and modification time (:func:`load_index`), so a
trial's full record is one seek. :class:`TrialIndex` holds the table and what
a run reads from it: a trial's position and byte span, the meaning of each
option, and the key that matches a trial across runs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from probe.errors import ProbeError
from probe.store import parse_trial_line

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["INDEX_FORMAT", "NotARunError", "TrialIndex", "build_index", "cache_dir", "load_index", "match_key"]

INDEX_FORMAT: Final[int] = 1
"""Version of the cached trial index (a new version builds a new index)."""


class NotARunError(ProbeError, ValueError):
    """A path that is not a run folder; the message says what it is and what to give instead.

    Importable from :mod:`probe.runs`, where the notebook API documents it; defined here, below the run, because a
    ``trials.jsonl`` whose lines do not parse into as many trials is not a run either."""


# ------------------------------------------------------------------ building and caching
def cache_dir() -> Path:
    """``$PROBE_CACHE/view`` (default ``~/.cache/probe/view``), where trial indexes are kept."""
    env = os.environ.get("PROBE_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "probe") / "view"


def _index_key(path: Path) -> str:
    st = path.stat()
    ident = [INDEX_FORMAT, str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:24]


def load_index(path: Path) -> pa.Table:
    """The cached index of ``path`` (trials.jsonl), built and cached when absent or stale."""
    import pyarrow.parquet as pq

    cached = cache_dir() / f"trials-{_index_key(path)}.parquet"
    if cached.is_file():
        try:
            return pq.read_table(cached)
        except Exception:  # a cut-short cache file: build it again
            cached.unlink(missing_ok=True)
    table = build_index(path)
    try:
        import pyarrow as pa

        from probe.files import atomic_write_bytes

        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        atomic_write_bytes(cached, sink.getvalue().to_pybytes())
    except OSError:  # a read-only home: the index lives in memory only
        pass
    return table


def build_index(path: Path) -> pa.Table:
    """Scan trials.jsonl once into the trial index (see :class:`TrialIndex`).

    Arrow's JSON reader parses the file in parallel; a file it cannot read in
    one schema (a field whose type changes between lines) is read line by
    line instead. The byte offset of each line comes from its newlines.
    """
    import numpy as np
    import pyarrow as pa

    data = np.fromfile(path, dtype=np.uint8)
    ends = np.flatnonzero(data == 10) + 1
    if len(data) and (not len(ends) or ends[-1] != len(data)):
        ends = np.append(ends, len(data))
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    lengths = (ends - starts).astype(np.int64)
    del data
    keep = lengths > 1  # a bare newline is no trial (the store writes none; a hand-edited file may)
    starts, lengths = starts[keep], lengths[keep]
    try:
        recs = _arrow_records(path)
    except Exception:  # pyarrow.ArrowInvalid and kin: mixed types across lines
        recs = _python_records(path)
    if recs.num_rows != len(starts):
        recs = _python_records(path)
    if recs.num_rows != len(starts):
        raise NotARunError(f"{path}: {recs.num_rows} trials parsed from {len(starts)} lines; the file is damaged")
    cols: dict[str, Any] = {
        "position": pa.array(np.arange(len(starts), dtype=np.int64)),
        "offset": pa.array(starts),
        "length": pa.array(lengths),
    }
    for name in ("trial_id", "experiment", "item_id", "replicate", "salt", "assistant_prefix", "options", "meaning"):
        cols[name] = recs[name]
    for name in sorted(c for c in recs.column_names if c.startswith("factor:")):
        cols[name] = recs[name]
    return pa.table(cols)


def _arrow_records(path: Path) -> pa.Table:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    table = pj.read_json(path, read_options=pj.ReadOptions(block_size=16 << 20))
    out: dict[str, Any] = {}
    n = table.num_rows
    for name, default in (
        ("trial_id", None),
        ("experiment", None),
        ("item_id", None),
        ("salt", ""),
        ("assistant_prefix", ""),
    ):
        out[name] = (
            pc.fill_null(table[name].cast(pa.string()), default)
            if name in table.column_names
            else pa.array([default] * n, pa.string())
        )
    out["replicate"] = (
        table["replicate"].cast(pa.int64()) if "replicate" in table.column_names else pa.array([0] * n, pa.int64())
    )
    out["options"] = table["options"].cast(pa.list_(pa.string()))
    out["meaning"] = table["meaning"].cast(pa.list_(pa.string()))
    if "factors" in table.column_names and pa.types.is_struct(table["factors"].type):
        factors = table["factors"].combine_chunks()
        for i, f in enumerate(factors.type):
            out[f"factor:{f.name}"] = factors.field(i).cast(pa.string())
    return pa.table(out)


def _python_records(path: Path) -> pa.Table:
    import pyarrow as pa

    rows = []
    with open(path, "rb") as f:
        for no, line in enumerate(f, 1):
            if line.strip():
                rows.append(parse_trial_line(line, path, no))
    names = sorted({k for r in rows for k in r.get("factors", {})})
    out: dict[str, Any] = {
        "trial_id": pa.array([str(r["trial_id"]) for r in rows], pa.string()),
        "experiment": pa.array([str(r["experiment"]) for r in rows], pa.string()),
        "item_id": pa.array([str(r["item_id"]) for r in rows], pa.string()),
        "replicate": pa.array([int(r.get("replicate", 0)) for r in rows], pa.int64()),
        "salt": pa.array([str(r.get("salt", "")) for r in rows], pa.string()),
        "assistant_prefix": pa.array([str(r.get("assistant_prefix", "")) for r in rows], pa.string()),
        "options": pa.array([[str(o) for o in r["options"]] for r in rows], pa.list_(pa.string())),
        "meaning": pa.array([[str(m) for m in r["meaning"]] for r in rows], pa.list_(pa.string())),
    }
    for name in names:
        out[f"factor:{name}"] = pa.array(
            [None if (v := r.get("factors", {}).get(name)) is None else str(v) for r in rows], pa.string()
        )
    return pa.table(out)


# ------------------------------------------------------------------ reading it
def match_key(experiment: str, item: str, factors: Mapping[str, Any], replicate: int) -> str:
    """What makes a trial the same trial in another run of the experiment: item, factors and replicate (not the
    salt text or the id, which can depend on the model's tokenizer)."""
    return json.dumps([experiment, item, sorted((str(k), str(v)) for k, v in factors.items()), int(replicate)])


@dataclass(frozen=True, eq=False)
class TrialIndex:
    """A run's trial index (:attr:`table`) and the lookups a run makes in it, each computed on first use and kept."""

    table: pa.Table
    """Columns: position, offset, length, trial_id, experiment, item_id, replicate, salt, assistant_prefix,
    options, meaning and ``factor:<name>`` per factor."""

    @classmethod
    def load(cls, path: Path) -> TrialIndex:
        """The index of ``path`` (a run's trials.jsonl), from the cache or built (:func:`load_index`)."""
        return cls(load_index(path))

    @functools.cached_property
    def factor_names(self) -> tuple[str, ...]:
        return tuple(sorted(c[len("factor:") :] for c in self.table.column_names if c.startswith("factor:")))

    @functools.cached_property
    def positions(self) -> dict[str, int]:
        """trial_id -> its line of trials.jsonl (0-based)."""
        return {t: i for i, t in enumerate(self.table["trial_id"].to_pylist())}

    def span(self, position: int) -> tuple[int, int]:
        """(byte offset, length) of line ``position`` of trials.jsonl."""
        return int(self.table["offset"][position].as_py()), int(self.table["length"][position].as_py())

    @functools.cached_property
    def meanings(self) -> dict[str, dict[str, str]]:
        """trial_id -> {option: what it stands for}."""
        idx = self.table
        return {
            t: dict(zip(o, m, strict=False))
            for t, o, m in zip(
                idx["trial_id"].to_pylist(), idx["options"].to_pylist(), idx["meaning"].to_pylist(), strict=True
            )
        }

    @functools.cached_property
    def match_keys(self) -> dict[str, str]:
        """:func:`match_key` -> the id of the first trial with that key."""
        idx = self.table
        names = self.factor_names
        cols = {n: idx[f"factor:{n}"].to_pylist() for n in names}
        keys: dict[str, str] = {}
        for i, (tid, exp, item, rep) in enumerate(
            zip(
                idx["trial_id"].to_pylist(),
                idx["experiment"].to_pylist(),
                idx["item_id"].to_pylist(),
                idx["replicate"].to_pylist(),
                strict=True,
            )
        ):
            factors = {n: cols[n][i] for n in names if cols[n][i] is not None}
            keys.setdefault(match_key(exp, item, factors, rep), tid)
        return keys
