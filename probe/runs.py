"""A run folder in Python: ``probe.open_run(path)`` for notebooks, and what ``probe view`` reads runs through.

:func:`open_run` returns a :class:`Run`: the manifest, the integrity of every
chunk (the store's own receipts, :meth:`probe.store.RunStore.integrity`), and
lazy DataFrames of the trials, readouts, options, samples and codes, each
joined on ``trial_id`` with the trial's columns and its factors spread out
into columns of their own. The column names and dtypes are a contract
(:data:`COLUMNS`, tested, listed in docs/python.md).

A study-scale run has hundreds of thousands of trials and a ``trials.jsonl``
of several hundred MB, so nothing here reads a whole file to show one trial:

* the **trial index** (:meth:`Run.index`: id, position, item, factors,
  options, and the byte offset of each line of ``trials.jsonl``) is built once
  and cached as Parquet under ``$PROBE_CACHE/view/`` (keyed by the file's path,
  size and modification time), so a trial's full record is one seek;
* :meth:`Run.page` filters the index in Arrow, reads only the narrow result
  columns a filter needs (once per verified chunk, then kept), and fetches the
  display columns of one page from the chunks that hold its trials;
* :meth:`Run.trial_data` reads one trial's rows from its own chunk only.

Only verified chunks are read; a damaged or missing chunk is reported, with
the store's reason, on every trial it holds (:attr:`TrialData.chunk`), never
dropped silently. The DataFrames refuse an incomplete run like every
analysis does, unless the run was opened with ``allow_partial=True``.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from probe.errors import ProbeError
from probe.store import MANIFEST, TRIALS, ChunkState, Integrity, RunStore, inside, parse_trial_line
from probe.types import Trial

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = [
    "COLUMNS",
    "SAMPLE_STATUSES",
    "FilterError",
    "NotARunError",
    "Page",
    "Run",
    "TrialData",
    "TrialFilter",
    "factor_column",
    "open_run",
    "run_folders",
]

INDEX_FORMAT: Final[int] = 1
"""Version of the cached trial index (a new version builds a new index)."""
SAMPLE_STATUSES: Final[tuple[str, ...]] = ("ok", "refusal", "invalid", "error")
SAMPLE_TABLES: Final[tuple[str, ...]] = ("samples", "generations")
"""Sampled answers to readout trials, and free-text replies to generative trials (one schema)."""

TRIAL_COLUMNS: Final[dict[str, str]] = {
    "trial_id": "string",
    "position": "int64",
    "chunk": "int64",
    "experiment": "category",
    "item_id": "category",
    "replicate": "int64",
    "salt": "string",
    "assistant_prefix": "string",
    "n_options": "int64",
}
"""The columns every frame starts with; the factor columns (dtype ``category``) follow them, sorted by name."""

COLUMNS: Final[dict[str, dict[str, str]]] = {
    "trials": TRIAL_COLUMNS,
    "readouts": {
        "coverage": "float64",
        "greedy_option": "string",
        "greedy_meaning": "string",
        "prompt_tokens": "int64",
        "computed_tokens": "int64",
        "reasoning_tokens": "int64",
        "hit_budget": "bool",
        "reasoning": "string",
        "top_other": "object",
    },
    "options": {
        "option": "string",
        "option_index": "int64",
        "meaning": "string",
        "n_tokens": "int64",
        "logprob": "float64",
        "prob": "float64",
        "greedy": "bool",
    },
    "samples": {
        "source": "category",
        "draw": "int64",
        "option": "string",
        "meaning": "string",
        "status": "category",
        "text": "string",
        "reasoning": "string",
        "prompt_tokens": "int64",
        "completion_tokens": "int64",
        "truncated": "bool",
        "token_ids": "object",
    },
    "codes": {
        "task": "category",
        "draw": "int64",
        "label": "string",
        "p_label": "float64",
        "probs": "object",
        "judge": "string",
        "status": "string",
    },
}
"""Each frame's own columns (after :data:`TRIAL_COLUMNS` and the factors) and their pandas dtypes.

``top_other``: list of ``[token, prob]`` (the most likely non-option first tokens); ``token_ids``: list of int;
``probs``: dict code -> probability. ``source`` is ``samples`` (draws of readout trials) or ``generations``
(free-text replies); codes' ``task`` is ``verdict`` (the run's judge) or a ``probe code`` task."""

FILTER_KEYS: Final[frozenset[str]] = frozenset({"item", "option", "status", "coverage_below", "disagree", "chunk"})
RESERVED: Final[frozenset[str]] = frozenset(
    {c for cols in COLUMNS.values() for c in cols} | set(TRIAL_COLUMNS) | FILTER_KEYS
)
"""Names a factor column may not take (a factor named like one is spread as ``factor_<name>``)."""


def factor_column(name: str) -> str:
    """The column of factor ``name``: its own name, or ``factor_<name>`` where that is a fixed column or a filter
    key (the cue experiment has a factor ``status``, and the samples a column ``status``)."""
    return f"factor_{name}" if name in RESERVED else name


class NotARunError(ProbeError, ValueError):
    """A path that is not a run folder; the message says what it is and what to give instead."""


class FilterError(ProbeError, ValueError):
    """A trial filter naming an unknown factor, level, item, option or status; the message lists the known ones."""


# ------------------------------------------------------------------ opening
def _not_a_run(path: Path) -> str:
    if not path.exists():
        return f"{path} does not exist; give the --out folder of `probe run`"
    if not path.is_dir():
        return f"{path} is a file, not a run folder; give the --out folder of `probe run`"
    if path.name == "report" and (path.parent / MANIFEST).exists():
        return f"{path} is the report of a run; give the run folder itself, {path.parent}"
    if any(p.is_dir() and (p / MANIFEST).exists() for p in path.glob("shard-*-of-*")):
        return f"{path} holds unmerged shards (shard-i-of-n); join them with `probe merge {path}` first"
    if (path / "panel.csv").exists():
        return f"{path} is a `probe compare` folder; open its runs with probe.runs.run_folders({str(path)!r})"
    return f"{path} is not a run folder (no {MANIFEST}); give the --out folder of `probe run`"


def open_run(path: str | os.PathLike[str], *, allow_partial: bool = False) -> Run:
    """The run in folder ``path`` (the ``--out`` of ``probe run``).

    Opening reads only the manifest. ``allow_partial``: the DataFrames hold the
    verified chunks of an unfinished or damaged run instead of refusing it
    (:attr:`Run.integrity` says what is left out).
    """
    root = Path(path)
    if not (root / MANIFEST).is_file():
        raise NotARunError(_not_a_run(root))
    store = RunStore(root, allow_partial=allow_partial)
    manifest = store.manifest()
    if not (root / TRIALS).is_file():
        raise NotARunError(f"{root} has a manifest but no {TRIALS}; it is not a complete run folder")
    return Run(root, store, manifest, allow_partial)


def run_folders(path: str | os.PathLike[str]) -> tuple[Path, ...]:
    """The run folders behind ``path``: itself for a run, the runs of its ``panel.csv`` for a ``probe compare``
    folder (relative paths taken from the folder, then from the working directory)."""
    root = Path(path)
    if (root / MANIFEST).is_file():
        return (root,)
    panel = root / "panel.csv"
    if not panel.is_file():
        raise NotARunError(_not_a_run(root))
    with open(panel, newline="", encoding="utf-8") as f:
        listed = [row["run"] for row in csv.DictReader(f) if row.get("run")]
    if not listed:
        raise NotARunError(f"{panel} lists no runs (no `run` column); re-run `probe compare` to rewrite it")
    found = []
    for run in listed:
        p = Path(run)
        cands = [p] if p.is_absolute() else [root / p, p]
        hit = next((c for c in cands if (c / MANIFEST).is_file()), None)
        if hit is None:
            raise NotARunError(
                f"{panel} lists run {run!r}, which is not a run folder here; move it back or edit {panel}"
            )
        found.append(hit)
    return tuple(found)


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


@dataclass(frozen=True)
class TrialData:
    """Everything the run holds for one trial."""

    trial: Trial
    position: int
    chunk: ChunkState
    """Its chunk's state: when not verified, the result frames are empty and ``chunk.reason`` says why."""
    readout: Mapping[str, Any] | None
    """The readout row (coverage, greedy_option, prompt_tokens, reasoning, top_other, ...), None without one."""
    options: pd.DataFrame
    """option, option_index, meaning, n_tokens, logprob, prob, greedy; in print order."""
    samples: pd.DataFrame
    """source, draw, option, status, text, reasoning, prompt_tokens, completion_tokens, truncated, token_ids."""
    codes: pd.DataFrame
    """task, draw, label, p_label, probs, judge, status."""


# ------------------------------------------------------------------ the run
@dataclass(frozen=True, eq=False)
class Run:
    """One run folder, read lazily (see :func:`open_run`).

    The DataFrame properties are computed on first use and kept; open the run
    again to see chunks committed since (an unfinished run).
    """

    root: Path
    store: RunStore = field(repr=False)
    manifest: Mapping[str, Any] = field(repr=False)
    allow_partial: bool = False
    _memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------ about it
    @property
    def name(self) -> str:
        return self.root.resolve().name

    @property
    def experiment(self) -> str:
        return str(self.manifest.get("experiment", ""))

    @property
    def model(self) -> str:
        engine = self.manifest.get("engine") or {}
        settings = engine.get("settings") or {}
        return str(settings.get("model") or engine.get("model_path") or self.manifest.get("identity", {}).get("model"))

    @property
    def integrity(self) -> Integrity:
        """Every expected chunk checked against its receipt, now (files re-hashed only when they changed)."""
        held = self._memo.get("snapshot")
        return held if held is not None else self.store.integrity()

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Check the chunks once for everything done inside (one page, one trial): on a run of 1,500 chunks each
        check stats 6,000 files."""
        outer = "snapshot" in self._memo
        if not outer:
            self._memo["snapshot"] = self.store.integrity()
        try:
            yield
        finally:
            if not outer:
                self._memo.pop("snapshot", None)

    @property
    def n_trials(self) -> int:
        n = self.manifest.get("n_trials")
        return int(n) if isinstance(n, int) else self.store.n_trials()

    @property
    def chunk_size(self) -> int:
        return int(self.manifest.get("chunk_size") or max(self.n_trials, 1))

    def report_dir(self) -> Path:
        return self.root / "report"

    def coding_files(self) -> list[Path]:
        """The tables of ``probe code`` (``coding/*.parquet``, not the failed ones), checked: a symbolic link is a
        :class:`probe.store.LinkError`."""
        coding = inside(self.root, "coding")
        if not coding.is_dir():
            return []
        return [
            inside(coding, p.name) for p in sorted(coding.glob("*.parquet")) if not p.name.endswith(".failed.parquet")
        ]

    # ------------------------------------------------------------ the index
    def index(self) -> pa.Table:
        """The trial index: one row per line of trials.jsonl, without the messages (cached, see the module doc).

        Columns: position, offset, length, trial_id, experiment, item_id,
        replicate, salt, assistant_prefix, options, meaning and
        ``factor:<name>`` per factor.
        """
        if "index" not in self._memo:
            self._memo["index"] = _load_index(inside(self.root, TRIALS))
        return self._memo["index"]

    @functools.cached_property
    def factor_names(self) -> tuple[str, ...]:
        return tuple(sorted(c[len("factor:") :] for c in self.index().column_names if c.startswith("factor:")))

    @functools.cached_property
    def levels(self) -> dict[str, tuple[str, ...]]:
        """The values a filter can take: ``item``, ``option`` and every factor (sorted)."""
        import pyarrow.compute as pc

        idx = self.index()

        def uniq(col: str) -> tuple[str, ...]:
            return tuple(sorted(str(v) for v in pc.unique(idx[col]).to_pylist() if v is not None))

        out = {
            "item": uniq("item_id"),
            "option": tuple(
                sorted({str(o) for o in pc.unique(pc.list_flatten(idx["options"])).to_pylist()}, key=_natural)
            ),
        }
        out.update({name: uniq(f"factor:{name}") for name in self.factor_names})
        return out

    def position_of(self, trial_id: str) -> int:
        """Where ``trial_id`` is in trials.jsonl; KeyError naming it when the run has no such trial."""
        pos = self._memo.get("positions")
        if pos is None:
            ids = self.index()["trial_id"].to_pylist()
            pos = self._memo["positions"] = {t: i for i, t in enumerate(ids)}
        if trial_id not in pos:
            raise KeyError(f"run {self.root} has no trial {trial_id!r}")
        return int(pos[trial_id])

    def trial(self, trial_id: str) -> Trial:
        """The full trial (messages, options, meaning) of ``trial_id``: one seek into trials.jsonl."""
        return self.trial_at(self.position_of(trial_id))

    def trial_at(self, position: int) -> Trial:
        idx = self.index()
        offset, length = int(idx["offset"][position].as_py()), int(idx["length"][position].as_py())
        path = inside(self.root, TRIALS)
        with open(path, "rb") as f:
            f.seek(offset)
            line = f.read(length)
        return Trial.from_record(parse_trial_line(line, path, position + 1))

    def chunk_of(self, position: int) -> int:
        return position // self.chunk_size

    def chunk_states(self) -> dict[int, ChunkState]:
        return {c.chunk: c for c in self.integrity.chunks}

    # ------------------------------------------------------------ frames
    @functools.cached_property
    def trials(self) -> pd.DataFrame:
        """One row per trial: :data:`TRIAL_COLUMNS`, then one ``category`` column per factor."""
        import pandas as pd

        idx = self.index()
        frame = pd.DataFrame(
            {
                "trial_id": idx["trial_id"].to_pandas(),
                "position": idx["position"].to_pandas(),
                "chunk": idx["position"].to_pandas() // self.chunk_size,
                "experiment": idx["experiment"].to_pandas(),
                "item_id": idx["item_id"].to_pandas(),
                "replicate": idx["replicate"].to_pandas(),
                "salt": idx["salt"].to_pandas(),
                "assistant_prefix": idx["assistant_prefix"].to_pandas(),
                "n_options": idx["options"].to_pandas().map(len),
            }
        )
        frame = _typed(frame, TRIAL_COLUMNS)
        for name in self.factor_names:
            frame[factor_column(name)] = idx[f"factor:{name}"].to_pandas().astype("category")
        return frame

    @functools.cached_property
    def readouts(self) -> pd.DataFrame:
        """One row per trial with a readout: the trial columns, then :data:`COLUMNS` ``["readouts"]``."""
        raw = self.store.load("readout_trials")
        return self._frame("readouts", _readout_columns(raw, self._meanings()))

    @functools.cached_property
    def options(self) -> pd.DataFrame:
        """One row per (trial, option) of every readout, in print order: the trial columns, then the options'."""
        raw = self.store.load("readout_options")
        readouts = self.store.load("readout_trials")
        return self._frame("options", _option_columns(raw, readouts, self._meanings()))

    @functools.cached_property
    def samples(self) -> pd.DataFrame:
        """One row per sampled reply (draws of readout trials and free-text replies): trial columns, then the
        samples' (``option`` is missing where the reply parsed into no option)."""
        import pandas as pd

        parts = [_sample_columns(self.store.load(t), t, self._meanings()) for t in SAMPLE_TABLES]
        parts = [p for p in parts if len(p)]
        raw = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
        return self._frame("samples", raw)

    @functools.cached_property
    def codes(self) -> pd.DataFrame:
        """One row per verdict or code: the run's judge (task ``verdict``) and every ``probe code`` task."""
        import pandas as pd

        parts = [_judgment_columns(self.store.load("judgments"))]
        for path in self.coding_files():
            parts.append(_coding_columns(pd.read_parquet(path), path.stem))
        parts = [p for p in parts if len(p)]
        raw = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
        return self._frame("codes", raw)

    def _meanings(self) -> dict[str, dict[str, str]]:
        if "meanings" not in self._memo:
            idx = self.index()
            self._memo["meanings"] = {
                t: dict(zip(o, m, strict=False))
                for t, o, m in zip(
                    idx["trial_id"].to_pylist(), idx["options"].to_pylist(), idx["meaning"].to_pylist(), strict=True
                )
            }
        return self._memo["meanings"]  # type: ignore[no-any-return]

    def _frame(self, kind: str, raw: pd.DataFrame) -> pd.DataFrame:
        """The trial columns joined onto ``raw`` (one of the stored tables, renamed), typed."""
        import pandas as pd

        own = COLUMNS[kind]
        if raw.empty:
            raw = pd.DataFrame(
                {"trial_id": pd.Series([], dtype="string"), **{c: pd.Series([], dtype=object) for c in own}}
            )
        body = _typed(raw[["trial_id", *own]].copy(), {"trial_id": "string", **own})
        trials = self.trials
        out = body.merge(trials, on="trial_id", how="left", validate="many_to_one", sort=False)
        keys = list(trials.columns)
        out = out[keys + [c for c in own]]
        out = out.sort_values(["position", *(c for c in ("option_index", "draw") if c in own)], kind="stable")
        return out.reset_index(drop=True)

    # ------------------------------------------------------------ one trial
    def trial_data(self, trial_id: str) -> TrialData:
        """Everything stored for ``trial_id``, read from its own chunk only (KeyError for an unknown trial)."""
        with self.snapshot():
            return self._trial_data(trial_id)

    def _trial_data(self, trial_id: str) -> TrialData:
        import pandas as pd

        position = self.position_of(trial_id)
        trial = self.trial_at(position)
        k = self.chunk_of(position)
        states = self.chunk_states()
        state = states.get(k) or ChunkState(k, (position, position + 1), "missing", "not in the manifest's split")
        meaning = dict(zip(trial.options, trial.meaning, strict=True))
        empty = pd.DataFrame()
        readout: dict[str, Any] | None = None
        options, samples, codes = empty, empty, empty
        if state.status == "verified":
            rt = self._chunk_rows(state, "readout_trials", trial_id)
            if len(rt):
                readout = _readout_columns(rt, {trial_id: meaning}).iloc[0].to_dict()
            ro = self._chunk_rows(state, "readout_options", trial_id)
            options = _option_columns(ro, rt, {trial_id: meaning}) if len(ro) else empty
            parts = [
                _sample_columns(self._chunk_rows(state, t, trial_id), t, {trial_id: meaning}) for t in SAMPLE_TABLES
            ]
            parts = [p for p in parts if len(p)]
            samples = pd.concat(parts, ignore_index=True) if parts else empty
            codes = _judgment_columns(self._chunk_rows(state, "judgments", trial_id))
        extra = [
            _coding_columns(pd.read_parquet(p, filters=[("trial_id", "==", trial_id)]), p.stem)
            for p in self.coding_files()
        ]
        frames = [c for c in (codes, *extra) if len(c)]
        codes = pd.concat(frames, ignore_index=True) if frames else empty
        return TrialData(trial, position, state, readout, options, samples, codes)

    def _chunk_rows(self, state: ChunkState, table: str, trial_id: str) -> pd.DataFrame:
        import pandas as pd
        import pyarrow.parquet as pq

        if table not in state.tables:
            return pd.DataFrame()
        path = self.store.table_path(state.chunk, table)
        return pq.read_table(path, filters=[("trial_id", "==", trial_id)]).to_pandas()

    # ------------------------------------------------------------ paging
    def check_filter(self, flt: TrialFilter) -> None:
        """Refuse a filter naming an unknown factor, level, item, option, status or chunk state."""
        lv = self.levels
        for item in flt.items:
            if item not in lv["item"]:
                raise FilterError(f"unknown item {item!r} in run {self.name}; known items: {_few(lv['item'])}")
        for name, values in flt.factors:
            if name not in self.factor_names:
                raise FilterError(
                    f"unknown filter {name!r} in run {self.name}; filters: item, option, status, coverage_below, "
                    f"disagree, chunk, and the factors {_few(self.factor_names)}"
                )
            for v in values:
                if v not in lv[name]:
                    raise FilterError(
                        f"unknown value {v!r} of factor {name!r} in run {self.name}; its values: {_few(lv[name])}"
                    )
        if flt.option is not None and flt.option not in lv["option"]:
            raise FilterError(f"unknown option {flt.option!r} in run {self.name}; options: {_few(lv['option'])}")
        if flt.status is not None and flt.status not in SAMPLE_STATUSES:
            raise FilterError(f"unknown parse status {flt.status!r}; statuses: {', '.join(SAMPLE_STATUSES)}")
        if flt.chunk is not None and flt.chunk not in ("verified", "damaged", "missing"):
            raise FilterError(f"unknown chunk state {flt.chunk!r}; states: verified, damaged, missing")
        if flt.coverage_below is not None and not 0 <= flt.coverage_below <= 1:
            raise FilterError(f"coverage_below must lie in [0, 1], got {flt.coverage_below}")

    def select(self, flt: TrialFilter) -> Any:
        """The positions (a sorted numpy array) of the trials ``flt`` selects."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        self.check_filter(flt)
        idx = self.index()
        mask = pa.array(np.ones(idx.num_rows, dtype=bool))
        if flt.items:
            mask = pc.and_(mask, pc.is_in(idx["item_id"], value_set=pa.array(flt.items)))
        for name, values in flt.factors:
            mask = pc.and_(mask, pc.fill_null(pc.is_in(idx[f"factor:{name}"], value_set=pa.array(values)), False))
        positions = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
        if flt.chunk is not None:
            states = self.chunk_states()
            chunks = positions // self.chunk_size
            bad = {k for k, s in states.items() if s.status == flt.chunk}
            positions = positions[np.isin(chunks, list(bad))]
        if flt.needs_results and len(positions):
            ids = idx["trial_id"].take(pa.array(positions)).to_pylist()
            keep = self._result_mask(flt, ids)
            positions = positions[keep]
        return positions

    def _result_mask(self, flt: TrialFilter, ids: list[str]) -> Any:
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

    def _disagreeing(self) -> set[str]:
        """Trials whose greedy option is not the (strict) majority option of their parsed sampled replies."""
        if "disagree" in self._memo and self._memo["disagree"][0] == self._signature():
            return self._memo["disagree"][1]  # type: ignore[no-any-return]
        sm = self.narrow_samples()
        rt = self.narrow("readout_trials", ("trial_id", "greedy_option", "coverage"))
        greedy = dict(zip(rt["trial_id"].to_pylist(), rt["greedy_option"].to_pylist(), strict=True))
        counts: dict[str, dict[str, int]] = {}
        for t, o in zip(sm["trial_id"].to_pylist(), sm["option"].to_pylist(), strict=True):
            if o is not None and t in greedy:
                counts.setdefault(t, {})[o] = counts.setdefault(t, {}).get(o, 0) + 1
        out = {t for t, c in counts.items() if majority(c) != greedy[t]}
        self._memo["disagree"] = (self._signature(), out)
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
        cache: dict[int, pa.Table] = self._memo.setdefault(key, {})
        held = [c for c in self.integrity.verified if table in c.tables]
        todo = [c for c in held if c.chunk not in cache]
        counted = [c for c in todo if c.receipt is not None]
        rows = [c.receipt.tables[table].rows for c in counted if c.receipt is not None]
        try:  # one schema for all files (a column that is all missing in one chunk has another type there)
            paths = [str(self.store.table_path(c.chunk, table)) for c in counted]
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
                cache[c.chunk] = pq.read_table(self.store.table_path(c.chunk, table), columns=list(columns))
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
        idx = self.index()
        states = self.chunk_states()
        rows = []
        by_chunk: dict[int, list[str]] = {}
        for p in chosen:
            by_chunk.setdefault(self.chunk_of(p), []).append(str(idx["trial_id"][p].as_py()))
        results = self._page_results(by_chunk, states)
        for p in chosen:
            tid = str(idx["trial_id"][p].as_py())
            k = self.chunk_of(p)
            state = states.get(k)
            res = results.get(tid, {})
            factors = {n: idx[f"factor:{n}"][p].as_py() for n in self.factor_names}
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
                    self.store.table_path(k, "readout_trials"),
                    columns=["trial_id", "coverage", "greedy_option"],
                    filters=flt,
                )
                for t, cov, g in zip(
                    rt["trial_id"].to_pylist(), rt["coverage"].to_pylist(), rt["greedy_option"].to_pylist(), strict=True
                ):
                    out.setdefault(t, {}).update(coverage=cov, greedy_option=g)
            if "readout_options" in state.tables:
                ro = pq.read_table(
                    self.store.table_path(k, "readout_options"), columns=["trial_id", "option", "prob"], filters=flt
                )
                for t, o, pr in zip(
                    ro["trial_id"].to_pylist(), ro["option"].to_pylist(), ro["prob"].to_pylist(), strict=True
                ):
                    if out.get(t, {}).get("greedy_option") == o:
                        out[t]["greedy_prob"] = pr
            for table in SAMPLE_TABLES:
                if table not in state.tables:
                    continue
                sm = pq.read_table(self.store.table_path(k, table), columns=["trial_id", "status"], filters=flt)
                for t, s in zip(sm["trial_id"].to_pylist(), sm["status"].to_pylist(), strict=True):
                    row = out.setdefault(t, {})
                    row["n_samples"] = row.get("n_samples", 0) + 1
                    row.setdefault("_st", {})[s] = row.get("_st", {}).get(s, 0) + 1
        for row in out.values():
            st = row.pop("_st", None)
            if st:
                row["statuses"] = ", ".join(f"{s} {n}" for s, n in sorted(st.items()))
        return out

    # ------------------------------------------------------------ across runs
    def match_key(self, trial: Trial) -> str:
        """What makes a trial the same trial in another run of the experiment: item, factors and replicate (not the
        salt text or the id, which can depend on the model's tokenizer)."""
        return _match_key(trial.experiment, trial.item_id, trial.factors, trial.replicate)

    def find_match(self, trial: Trial) -> str | None:
        """The id of this run's trial matching ``trial`` of another run (None when it has none)."""
        keys = self._memo.get("match")
        if keys is None:
            idx = self.index()
            names = self.factor_names
            cols = {n: idx[f"factor:{n}"].to_pylist() for n in names}
            keys = {}
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
                keys.setdefault(_match_key(exp, item, factors, rep), tid)
            self._memo["match"] = keys
        return keys.get(self.match_key(trial))


def majority(counts: Mapping[str, int]) -> str | None:
    """The option drawn most often; None on a tie for the top (no majority)."""
    if not counts:
        return None
    top = max(counts.values())
    leaders = [o for o, n in counts.items() if n == top]
    return leaders[0] if len(leaders) == 1 else None


def _match_key(experiment: str, item: str, factors: Mapping[str, Any], replicate: int) -> str:
    return json.dumps([experiment, item, sorted((str(k), str(v)) for k, v in factors.items()), int(replicate)])


def _natural(text: str) -> tuple[Any, ...]:
    """Sort key that orders the numbers inside a text as numbers: options 1, 2, ..., 10, 100 (not 1, 10, 100, 2)."""
    import re

    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text) if p)


def _few(values: Sequence[str], n: int = 12) -> str:
    shown = ", ".join(values[:n])
    return shown + (f", ... ({len(values)} in all)" if len(values) > n else "") if values else "(none)"


# ------------------------------------------------------------------ frames
def _typed(frame: pd.DataFrame, dtypes: Mapping[str, str]) -> pd.DataFrame:
    for col, dtype in dtypes.items():
        if dtype == "object":
            frame[col] = frame[col].astype(object)
        elif dtype == "bool":
            frame[col] = frame[col].fillna(False).astype(bool)
        elif dtype == "int64":
            frame[col] = frame[col].fillna(0).astype("int64")
        else:
            frame[col] = frame[col].astype(dtype)  # type: ignore[call-overload]
    return frame


def _readout_columns(raw: pd.DataFrame, meanings: Mapping[str, Mapping[str, str]]) -> pd.DataFrame:
    if raw.empty:
        return raw
    out = raw.copy()
    out["greedy_meaning"] = [
        meanings.get(t, {}).get(g) for t, g in zip(out["trial_id"], out["greedy_option"], strict=True)
    ]
    out["top_other"] = [json.loads(x) if isinstance(x, str) and x else [] for x in out["top_other"]]
    return out


def _option_columns(
    raw: pd.DataFrame, readouts: pd.DataFrame, meanings: Mapping[str, Mapping[str, str]]
) -> pd.DataFrame:
    if raw.empty:
        return raw
    out = raw.copy()
    out["meaning"] = [meanings.get(t, {}).get(o) for t, o in zip(out["trial_id"], out["option"], strict=True)]
    greedy = dict(zip(readouts["trial_id"], readouts["greedy_option"], strict=True)) if len(readouts) else {}
    out["greedy"] = [greedy.get(t) == o for t, o in zip(out["trial_id"], out["option"], strict=True)]
    return out


def _sample_columns(raw: pd.DataFrame, source: str, meanings: Mapping[str, Mapping[str, str]]) -> pd.DataFrame:
    if raw.empty:
        return raw
    out = raw.copy()
    out["source"] = source
    out["meaning"] = [
        meanings.get(t, {}).get(o) if o is not None else None
        for t, o in zip(out["trial_id"], out["option"], strict=True)
    ]
    out["token_ids"] = [[int(i) for i in ids] if ids is not None else [] for ids in out["token_ids"]]
    if "truncated" not in out:
        out["truncated"] = False
    return out


def _judgment_columns(raw: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    if raw.empty:
        return pd.DataFrame()
    probs = [
        {"PRO": float(a), "ANTI": float(b), "NONCOMMIT": float(c)}
        for a, b, c in zip(raw["p_pro"], raw["p_anti"], raw["p_noncommit"], strict=True)
    ]
    return pd.DataFrame(
        {
            "trial_id": raw["trial_id"],
            "task": "verdict",
            "draw": raw["draw"],
            "label": raw["verdict"],
            "p_label": [p.get(v, float("nan")) for p, v in zip(probs, raw["verdict"], strict=True)],
            "probs": probs,
            "judge": raw["judge"],
            "status": "ok",
        }
    )


def _coding_columns(raw: pd.DataFrame, task: str) -> pd.DataFrame:
    import pandas as pd

    if raw.empty:
        return pd.DataFrame()
    pcols = [c for c in raw.columns if c.startswith("p_")]
    probs = [{c[2:]: float(row[c]) for c in pcols} for _, row in raw[pcols].iterrows()]
    return pd.DataFrame(
        {
            "trial_id": raw["trial_id"],
            "task": task,
            "draw": raw["draw"],
            "label": raw["label"],
            "p_label": [p.get(str(lab), float("nan")) for p, lab in zip(probs, raw["label"], strict=True)],
            "probs": probs,
            "judge": raw["judge"],
            "status": raw.get("status", "ok"),
        }
    )


# ------------------------------------------------------------------ the index
def _cache_dir() -> Path:
    """``$PROBE_CACHE/view`` (default ``~/.cache/probe/view``), where trial indexes are kept."""
    env = os.environ.get("PROBE_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "probe") / "view"


def _index_key(path: Path) -> str:
    st = path.stat()
    ident = [INDEX_FORMAT, str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:24]


def _load_index(path: Path) -> pa.Table:
    """The cached index of ``path`` (trials.jsonl), built and cached when absent or stale."""
    import pyarrow.parquet as pq

    cached = _cache_dir() / f"trials-{_index_key(path)}.parquet"
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
    """Scan trials.jsonl once into the trial index (see :meth:`Run.index`).

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
