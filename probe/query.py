"""The query engine: which trials of a run a filter selects, and one page of them to show.

``probe view``'s trial browser and ``probe show --where`` list trials by
item, factor levels, greedy option, parse status, low coverage,
greedy-vs-sampled disagreement and chunk state. :class:`TrialFilter` is such
a filter (parsed from a URL's query or ``--where`` pairs); a
:class:`RunQuery` built on a :class:`probe.runs.Run` answers it (``run.page`` asks the run's own,
:attr:`probe.runs.Run.query`):

* :meth:`RunQuery.select` filters the run's trial index
  (:class:`probe.trial_index.TrialIndex`) in Arrow, and reads only the narrow
  result columns a filter needs (:meth:`RunQuery.narrow`: once per verified
  chunk, then kept);
* :meth:`RunQuery.page` fetches the display columns of one page from the
  chunks that hold its trials (a :class:`Page`).

Only verified chunks are read. The chunks are checked once per page; inside
:meth:`RunQuery.snapshot` (one request of the viewer) once for everything
done there.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from probe.errors import ProbeError
from probe.receipts import ChunkState, Integrity
from probe.tables import SAMPLE_STATUSES, SAMPLE_TABLES, TrialData, factor_column

if TYPE_CHECKING:
    from pathlib import Path

    import numpy as np
    import numpy.typing as npt
    import pandas as pd
    import pyarrow as pa

__all__ = ["FilterError", "Page", "RunQuery", "TrialFilter", "majority"]


class FilterError(ProbeError, ValueError):
    """A trial filter naming an unknown factor, level, item, option or status; the message lists the known ones."""


# ------------------------------------------------------------------ filters
@dataclass(frozen=True)
class TrialFilter:
    """Which trials to list: every field narrows (factor values of one factor are alternatives)."""

    items: tuple[str, ...] = ()
    factors: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(factor name, allowed values) pairs."""
    option: str | None = None
    """The readout's greedy option."""
    status: str | None = None
    """At least one sampled reply with this parse status (ok, refusal, invalid, error)."""
    coverage_below: float | None = None
    """The readout's option mass is below this."""
    disagree: bool = False
    """The greedy option differs from the majority of the parsed sampled replies."""
    chunk: str | None = None
    """The chunk's status: verified, damaged or missing."""

    @classmethod
    def parse(cls, pairs: Iterable[tuple[str, str]]) -> TrialFilter:
        """From ``(key, value)`` pairs: ``item``, ``option``, ``status``, ``coverage_below``, ``disagree``,
        ``chunk``, or a factor name (``instrument=binary``; repeat a key for alternatives)."""
        items: list[str] = []
        factors: dict[str, list[str]] = {}
        kw: dict[str, Any] = {}
        for key, value in pairs:
            key, value = key.strip(), value.strip()
            if value == "":
                continue
            if key == "item":
                items.append(value)
            elif key in ("option", "status", "chunk"):
                kw[key] = value
            elif key == "coverage_below":
                try:
                    kw[key] = float(value)
                except ValueError:
                    raise FilterError(f"coverage_below must be a number between 0 and 1, got {value!r}") from None
            elif key == "disagree":
                kw[key] = value.lower() in ("1", "true", "yes", "on")
            else:
                name = key[len("factor_") :] if key.startswith("factor_") else key
                factors.setdefault(name, []).append(value)
        return cls(tuple(items), tuple((k, tuple(v)) for k, v in factors.items()), **kw)

    def pairs(self) -> list[tuple[str, str]]:
        """The filter as ``(key, value)`` pairs (what :meth:`parse` reads back; a URL's query)."""
        out = [("item", i) for i in self.items]
        out += [(factor_column(k), v) for k, vs in self.factors for v in vs]
        for key in ("option", "status", "chunk"):
            if getattr(self, key) is not None:
                out.append((key, str(getattr(self, key))))
        if self.coverage_below is not None:
            out.append(("coverage_below", f"{self.coverage_below:g}"))
        if self.disagree:
            out.append(("disagree", "1"))
        return out

    @property
    def needs_results(self) -> bool:
        return self.option is not None or self.coverage_below is not None or self.status is not None or self.disagree


@dataclass(frozen=True)
class Page:
    """One page of the trials a filter selects."""

    total: int
    """Trials the filter selects in all."""
    offset: int
    limit: int
    rows: pd.DataFrame
    """trial_id, position, chunk, chunk_status, item_id, factors (text), greedy_option, greedy_meaning,
    greedy_prob, coverage, n_samples, statuses (text), in trial order."""


# ------------------------------------------------------------------ the query engine
class QueriedRun(Protocol):
    """What the query engine reads of a run (:class:`probe.runs.Run` provides it; the engine does not import it,
    since the run asks its own engine for a page)."""

    @property
    def name(self) -> str: ...

    @property
    def integrity(self) -> Integrity: ...

    @property
    def chunk_size(self) -> int: ...

    @property
    def factor_names(self) -> tuple[str, ...]: ...

    def index(self) -> pa.Table: ...

    def chunk_of(self, position: int) -> int: ...

    def chunk_states(self, integrity: Integrity | None = None) -> dict[int, ChunkState]: ...

    def table_path(self, chunk: int, table: str) -> Path: ...

    def trial_data(self, trial_id: str, *, integrity: Integrity | None = None) -> TrialData: ...


@dataclass(eq=False)
class RunQuery:
    """The trials of one run that a filter selects, and pages of them (see the module doc).

    What it reads is kept (the levels, each chunk's narrow columns, the disagreeing trials), so the next filter
    costs no read; the chunks verified since are read when next asked.
    """

    run: QueriedRun
    _held: Integrity | None = field(default=None, init=False, repr=False)
    """The chunks' integrity inside :meth:`snapshot`, None outside it."""
    _narrowed: dict[tuple[str, tuple[str, ...]], dict[int, pa.Table]] = field(
        default_factory=dict, init=False, repr=False
    )
    """(table, columns) -> chunk -> those columns of that chunk's file (:meth:`narrow`)."""
    _disagree: tuple[tuple[int, ...], frozenset[str]] | None = field(default=None, init=False, repr=False)
    """(the verified chunks, the disagreeing trials among them)."""

    @property
    def integrity(self) -> Integrity:
        """The chunks' integrity: the one taken on entering :meth:`snapshot` while inside it, else checked now."""
        return self._held if self._held is not None else self.run.integrity

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Check the chunks once for everything done inside (one page, one request of the viewer): on a run of
        1,500 chunks each check stats 6,000 files."""
        outer = self._held is not None
        if not outer:
            self._held = self.run.integrity
        try:
            yield
        finally:
            if not outer:
                self._held = None

    def chunk_states(self) -> dict[int, ChunkState]:
        return self.run.chunk_states(self.integrity)

    def trial_data(self, trial_id: str) -> TrialData:
        """:meth:`probe.runs.Run.trial_data`, by the chunks' state of this query (one check per request)."""
        return self.run.trial_data(trial_id, integrity=self.integrity)

    @functools.cached_property
    def levels(self) -> dict[str, tuple[str, ...]]:
        """The values a filter can take: ``item``, ``option`` and every factor (sorted)."""
        import pyarrow.compute as pc

        idx = self.run.index()

        def uniq(col: str) -> tuple[str, ...]:
            return tuple(sorted(str(v) for v in pc.unique(idx[col]).to_pylist() if v is not None))

        out = {
            "item": uniq("item_id"),
            "option": tuple(
                sorted({str(o) for o in pc.unique(pc.list_flatten(idx["options"])).to_pylist()}, key=_natural)
            ),
        }
        out.update({name: uniq(f"factor:{name}") for name in self.run.factor_names})
        return out

    def check_filter(self, flt: TrialFilter) -> None:
        """Refuse a filter naming an unknown factor, level, item, option, status or chunk state."""
        lv = self.levels
        for item in flt.items:
            if item not in lv["item"]:
                raise FilterError(f"unknown item {item!r} in run {self.run.name}; known items: {_few(lv['item'])}")
        for name, values in flt.factors:
            if name not in self.run.factor_names:
                raise FilterError(
                    f"unknown filter {name!r} in run {self.run.name}; filters: item, option, status, coverage_below, "
                    f"disagree, chunk, and the factors {_few(self.run.factor_names)}"
                )
            for v in values:
                if v not in lv[name]:
                    raise FilterError(
                        f"unknown value {v!r} of factor {name!r} in run {self.run.name}; its values: {_few(lv[name])}"
                    )
        if flt.option is not None and flt.option not in lv["option"]:
            raise FilterError(f"unknown option {flt.option!r} in run {self.run.name}; options: {_few(lv['option'])}")
        if flt.status is not None and flt.status not in SAMPLE_STATUSES:
            raise FilterError(f"unknown parse status {flt.status!r}; statuses: {', '.join(SAMPLE_STATUSES)}")
        if flt.chunk is not None and flt.chunk not in ("verified", "damaged", "missing"):
            raise FilterError(f"unknown chunk state {flt.chunk!r}; states: verified, damaged, missing")
        if flt.coverage_below is not None and not 0 <= flt.coverage_below <= 1:
            raise FilterError(f"coverage_below must lie in [0, 1], got {flt.coverage_below}")

    def select(self, flt: TrialFilter) -> npt.NDArray[np.intp]:
        """The positions (a sorted numpy array) of the trials ``flt`` selects."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        self.check_filter(flt)
        idx = self.run.index()
        mask = pa.array(np.ones(idx.num_rows, dtype=bool))
        if flt.items:
            mask = pc.and_(mask, pc.is_in(idx["item_id"], value_set=pa.array(flt.items)))
        for name, values in flt.factors:
            mask = pc.and_(mask, pc.fill_null(pc.is_in(idx[f"factor:{name}"], value_set=pa.array(values)), False))
        positions = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
        if flt.chunk is not None:
            states = self.chunk_states()
            chunks = positions // self.run.chunk_size
            bad = {k for k, s in states.items() if s.status == flt.chunk}
            positions = positions[np.isin(chunks, list(bad))]
        if flt.needs_results and len(positions):
            ids = idx["trial_id"].take(pa.array(positions)).to_pylist()
            keep = self._result_mask(flt, ids)
            positions = positions[keep]
        return positions

    def _result_mask(self, flt: TrialFilter, ids: list[str]) -> npt.NDArray[np.bool_]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        keep = np.ones(len(ids), dtype=bool)
        arr = pa.array(ids)
        if flt.option is not None or flt.coverage_below is not None or flt.disagree:
            rt = self.narrow("readout_trials", ("trial_id", "greedy_option", "coverage"))
            cond = pa.array(np.ones(rt.num_rows, dtype=bool))
            if flt.option is not None:
                cond = pc.and_(cond, pc.equal(rt["greedy_option"], flt.option))
            if flt.coverage_below is not None:
                cond = pc.and_(cond, pc.less(rt["coverage"], flt.coverage_below))
            hit = rt.filter(cond)["trial_id"]
            keep &= pc.is_in(arr, value_set=hit).to_numpy(zero_copy_only=False)
        if flt.status is not None:
            sm = self.narrow_samples()
            hit = sm.filter(pc.equal(sm["status"], flt.status))["trial_id"]
            keep &= pc.is_in(arr, value_set=pc.unique(hit)).to_numpy(zero_copy_only=False)
        if flt.disagree:
            hit = pa.array(sorted(self._disagreeing()), type=pa.string())
            keep &= pc.is_in(arr, value_set=hit).to_numpy(zero_copy_only=False)
        return keep

    def _disagreeing(self) -> frozenset[str]:
        """Trials whose greedy option is not the (strict) majority option of their parsed sampled replies."""
        if self._disagree is not None and self._disagree[0] == self._signature():
            return self._disagree[1]
        sm = self.narrow_samples()
        rt = self.narrow("readout_trials", ("trial_id", "greedy_option", "coverage"))
        greedy = dict(zip(rt["trial_id"].to_pylist(), rt["greedy_option"].to_pylist(), strict=True))
        counts: dict[str, dict[str, int]] = {}
        for t, o in zip(sm["trial_id"].to_pylist(), sm["option"].to_pylist(), strict=True):
            if o is not None and t in greedy:
                counts.setdefault(t, {})[o] = counts.setdefault(t, {}).get(o, 0) + 1
        out = frozenset(t for t, c in counts.items() if majority(c) != greedy[t])
        self._disagree = (self._signature(), out)
        return out

    def _signature(self) -> tuple[int, ...]:
        return tuple(c.chunk for c in self.integrity.verified)

    def narrow(self, table: str, columns: Sequence[str]) -> pa.Table:
        """``columns`` of ``table`` over every verified chunk: each chunk's file read once (those columns only)
        and kept, so the next filter costs no read.

        The chunks not read yet are read in one Arrow dataset scan (threaded; a run of 1,500 chunks reads in a
        fraction of the time file by file), which keeps the files' order, and split back into chunks by the row
        counts of their receipts (a receipt-less legacy chunk is read on its own).
        """
        import pyarrow as pa
        import pyarrow.dataset as ds
        import pyarrow.parquet as pq

        key = (table, tuple(columns))
        cache = self._narrowed.setdefault(key, {})
        held = [c for c in self.integrity.verified if table in c.tables]
        todo = [c for c in held if c.chunk not in cache]
        counted = [c for c in todo if c.receipt is not None]
        rows = [c.receipt.tables[table].rows for c in counted if c.receipt is not None]
        try:  # one schema for all files (a column that is all missing in one chunk has another type there)
            paths = [str(self.run.table_path(c.chunk, table)) for c in counted]
            whole = ds.dataset(paths, format="parquet").to_table(columns=list(columns)) if counted else None
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            whole = None  # read file by file below
        if whole is not None and whole.num_rows == sum(rows):
            start = 0
            for c, n in zip(counted, rows, strict=True):
                cache[c.chunk] = whole.slice(start, n)
                start += n
        for c in todo:
            if c.chunk not in cache:
                cache[c.chunk] = pq.read_table(self.run.table_path(c.chunk, table), columns=list(columns))
        parts = [cache[c.chunk] for c in held]
        if not parts:
            return pa.table({c: pa.array([], type=pa.float64() if c == "coverage" else pa.string()) for c in columns})
        return pa.concat_tables(parts, promote_options="permissive")

    def narrow_samples(self) -> pa.Table:
        """trial_id, option, status of every sampled reply (both sample tables)."""
        import pyarrow as pa

        cols = ("trial_id", "option", "status")
        parts = [self.narrow(t, cols) for t in SAMPLE_TABLES]
        parts = [p.cast(pa.schema([(c, pa.string()) for c in cols])) for p in parts]
        return pa.concat_tables(parts)

    def page(self, flt: TrialFilter, offset: int = 0, limit: int = 50) -> Page:
        """Trials ``offset .. offset+limit`` of those ``flt`` selects, with their display columns."""
        with self.snapshot():
            return self._page(flt, offset, limit)

    def _page(self, flt: TrialFilter, offset: int, limit: int) -> Page:
        import pandas as pd

        if offset < 0 or limit < 1:
            raise FilterError(f"a page needs offset >= 0 and limit >= 1, got offset {offset}, limit {limit}")
        positions = self.select(flt)
        chosen = [int(p) for p in positions[offset : offset + limit]]
        idx = self.run.index()
        states = self.chunk_states()
        rows = []
        by_chunk: dict[int, list[str]] = {}
        for p in chosen:
            by_chunk.setdefault(self.run.chunk_of(p), []).append(str(idx["trial_id"][p].as_py()))
        results = self._page_results(by_chunk, states)
        for p in chosen:
            tid = str(idx["trial_id"][p].as_py())
            k = self.run.chunk_of(p)
            state = states.get(k)
            res = results.get(tid, {})
            factors = {n: idx[f"factor:{n}"][p].as_py() for n in self.run.factor_names}
            greedy = res.get("greedy_option")
            meaning = dict(zip(idx["options"][p].as_py(), idx["meaning"][p].as_py(), strict=False))
            rows.append(
                {
                    "trial_id": tid,
                    "position": p,
                    "chunk": k,
                    "chunk_status": state.status if state else "missing",
                    "item_id": idx["item_id"][p].as_py(),
                    "factors": ", ".join(f"{n}={v}" for n, v in factors.items() if v is not None),
                    "greedy_option": greedy,
                    "greedy_meaning": meaning.get(greedy) if greedy is not None else None,
                    "greedy_prob": res.get("greedy_prob"),
                    "coverage": res.get("coverage"),
                    "n_samples": res.get("n_samples", 0),
                    "statuses": res.get("statuses", ""),
                }
            )
        return Page(len(positions), offset, limit, pd.DataFrame(rows))

    def _page_results(
        self, by_chunk: Mapping[int, list[str]], states: Mapping[int, ChunkState]
    ) -> dict[str, dict[str, Any]]:
        """The display columns of a page's trials, read from their chunks only."""
        import pyarrow.parquet as pq

        out: dict[str, dict[str, Any]] = {}
        for k, ids in by_chunk.items():
            state = states.get(k)
            if state is None or state.status != "verified":
                continue
            flt = [("trial_id", "in", ids)]
            if "readout_trials" in state.tables:
                rt = pq.read_table(
                    self.run.table_path(k, "readout_trials"),
                    columns=["trial_id", "coverage", "greedy_option"],
                    filters=flt,
                )
                for t, cov, g in zip(
                    rt["trial_id"].to_pylist(), rt["coverage"].to_pylist(), rt["greedy_option"].to_pylist(), strict=True
                ):
                    out.setdefault(t, {}).update(coverage=cov, greedy_option=g)
            if "readout_options" in state.tables:
                ro = pq.read_table(
                    self.run.table_path(k, "readout_options"), columns=["trial_id", "option", "prob"], filters=flt
                )
                for t, o, pr in zip(
                    ro["trial_id"].to_pylist(), ro["option"].to_pylist(), ro["prob"].to_pylist(), strict=True
                ):
                    if out.get(t, {}).get("greedy_option") == o:
                        out[t]["greedy_prob"] = pr
            for table in SAMPLE_TABLES:
                if table not in state.tables:
                    continue
                sm = pq.read_table(self.run.table_path(k, table), columns=["trial_id", "status"], filters=flt)
                for t, s in zip(sm["trial_id"].to_pylist(), sm["status"].to_pylist(), strict=True):
                    row = out.setdefault(t, {})
                    row["n_samples"] = row.get("n_samples", 0) + 1
                    row.setdefault("_st", {})[s] = row.get("_st", {}).get(s, 0) + 1
        for row in out.values():
            st = row.pop("_st", None)
            if st:
                row["statuses"] = ", ".join(f"{s} {n}" for s, n in sorted(st.items()))
        return out


def majority(counts: Mapping[str, int]) -> str | None:
    """The option drawn most often; None on a tie for the top (no majority)."""
    if not counts:
        return None
    top = max(counts.values())
    leaders = [o for o, n in counts.items() if n == top]
    return leaders[0] if len(leaders) == 1 else None


def _natural(text: str) -> tuple[Any, ...]:
    """Sort key that orders the numbers inside a text as numbers: options 1, 2, ..., 10, 100 (not 1, 10, 100, 2)."""
    import re

    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text) if p)


def _few(values: Sequence[str], n: int = 12) -> str:
    shown = ", ".join(values[:n])
    return shown + (f", ... ({len(values)} in all)" if len(values) > n else "") if values else "(none)"
