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
  size and modification time; :mod:`probe.trial_index`), so a trial's full
  record is one seek;
* :meth:`Run.trial_data` reads one trial's rows from its own chunk only;
* :meth:`Run.find_match` finds the same trial in another run.

Which trials a filter selects, a page at a time, is the viewer's query
engine, :class:`probe.query.RunQuery`, built on a :class:`Run`.

Only verified chunks are read; a damaged or missing chunk is reported, with
the store's reason, on every trial it holds (:attr:`TrialData.chunk`), never
dropped silently. The DataFrames refuse an incomplete run like every
analysis does, unless the run was opened with ``allow_partial=True``.
"""

from __future__ import annotations

import csv
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from probe import tables
from probe.errors import StoreError
from probe.files import inside
from probe.query import FilterError, Page, RunQuery, TrialFilter
from probe.receipts import ChunkState, Integrity
from probe.record import Manifest
from probe.store import MANIFEST, TRIALS, RunStore, parse_trial_line
from probe.tables import SAMPLE_TABLES, TrialData, factor_column
from probe.trial_index import NotARunError, TrialIndex, match_key
from probe.types import Trial

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

__all__ = [
    "COLUMNS",
    "FilterError",
    "NotARunError",
    "Page",
    "Run",
    "TrialData",
    "TrialFilter",
    "as_run",
    "factor_column",
    "open_run",
    "run_folders",
]


TRIAL_COLUMNS: Final[dict[str, str]] = {c.name: c.dtype for c in tables.TRIAL_COLUMNS}
"""The columns every frame starts with; the factor columns (dtype ``category``) follow them, sorted by name."""

COLUMNS: Final[dict[str, dict[str, str]]] = {
    "trials": TRIAL_COLUMNS,
    **{kind: table.dtypes() for kind, table in tables.FRAMES.items()},
}
"""Each frame's own columns (after :data:`TRIAL_COLUMNS` and the factors) and their pandas dtypes, from the
tables' one declaration (:mod:`probe.tables`, which also says what each column holds).

``top_other``: list of ``[token, prob]`` (the most likely non-option first tokens); ``token_ids``: list of int;
``probs``: dict code -> probability. ``source`` is ``samples`` (draws of readout trials) or ``generations``
(free-text replies); codes' ``task`` is ``verdict`` (the run's judge) or a ``probe code`` task."""


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


def as_run(run: Run | RunStore | str | os.PathLike[str]) -> Run:
    """``run`` itself, the run of a store (what :func:`probe.app.runner.run` returns), or the run in folder ``run``
    (:func:`open_run`)."""
    if isinstance(run, Run):
        return run
    if isinstance(run, RunStore):
        return open_run(run.root, allow_partial=run.allow_partial)
    return open_run(run)


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


# ------------------------------------------------------------------ the run
@dataclass(frozen=True, eq=False)
class Run:
    """One run folder, read lazily (see :func:`open_run`).

    The DataFrame properties are computed on first use and kept; open the run
    again to see chunks committed since (an unfinished run).
    """

    root: Path
    store: RunStore = field(repr=False)
    manifest: Manifest = field(repr=False)
    """The run's record (typed fields; also the stored JSON as a read-only mapping)."""
    allow_partial: bool = False

    # ------------------------------------------------------------ about it
    @property
    def name(self) -> str:
        return self.root.resolve().name

    @property
    def experiment(self) -> str:
        return self.manifest.experiment

    @property
    def model(self) -> str:
        return self.manifest.model

    @property
    def display_name(self) -> str:
        """What the run is called where no name was given (:attr:`probe.record.Manifest.display_name`)."""
        return self.manifest.display_name

    @property
    def integrity(self) -> Integrity:
        """Every expected chunk checked against its receipt, now (files re-hashed only when they changed)."""
        return self.store.integrity()

    @property
    def n_trials(self) -> int:
        n = self.manifest.n_trials
        return n if n is not None else self.store.n_trials()

    @property
    def chunk_size(self) -> int:
        return self.manifest.chunk_size or max(self.n_trials, 1)

    def report_dir(self) -> Path:
        return self.root / "report"

    def coding_files(self) -> list[Path]:
        """The tables of ``probe code`` (``coding/*.parquet``, not the failed ones), checked: a symbolic link is a
        :class:`probe.files.LinkError`."""
        coding = inside(self.root, "coding")
        if not coding.is_dir():
            return []
        return [
            inside(coding, p.name) for p in sorted(coding.glob("*.parquet")) if not p.name.endswith(".failed.parquet")
        ]

    # ------------------------------------------------------------ the index
    @functools.cached_property
    def trial_index(self) -> TrialIndex:
        """The trial index and its lookups (:mod:`probe.trial_index`), loaded on first use and kept."""
        return TrialIndex.load(inside(self.root, TRIALS))

    def index(self) -> pa.Table:
        """The trial index: one row per line of trials.jsonl, without the messages (cached, see the module doc).

        Columns: position, offset, length, trial_id, experiment, item_id,
        replicate, salt, assistant_prefix, options, meaning and
        ``factor:<name>`` per factor.
        """
        return self.trial_index.table

    @property
    def factor_names(self) -> tuple[str, ...]:
        return self.trial_index.factor_names

    def position_of(self, trial_id: str) -> int:
        """Where ``trial_id`` is in trials.jsonl; KeyError naming it when the run has no such trial."""
        pos = self.trial_index.positions
        if trial_id not in pos:
            raise KeyError(f"run {self.root} has no trial {trial_id!r}")
        return int(pos[trial_id])

    def trial(self, trial_id: str) -> Trial:
        """The full trial (messages, options, meaning) of ``trial_id``: one seek into trials.jsonl."""
        return self.trial_at(self.position_of(trial_id))

    def trial_at(self, position: int) -> Trial:
        offset, length = self.trial_index.span(position)
        path = inside(self.root, TRIALS)
        with open(path, "rb") as f:
            f.seek(offset)
            line = f.read(length)
        return Trial.from_record(parse_trial_line(line, path, position + 1))

    def table_path(self, chunk: int, table: str) -> Path:
        """The file of one chunk's table (it may be missing: see :attr:`integrity`)."""
        return self.store.table_path(chunk, table)

    def chunk_of(self, position: int) -> int:
        return position // self.chunk_size

    def chunk_states(self, integrity: Integrity | None = None) -> dict[int, ChunkState]:
        """Each chunk's state, by ``integrity`` (default: checked now)."""
        return {c.chunk: c for c in (integrity if integrity is not None else self.integrity).chunks}

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
        return self._frame("readouts", _readout_columns(raw, self.trial_index.meanings))

    @functools.cached_property
    def options(self) -> pd.DataFrame:
        """One row per (trial, option) of every readout, in print order: the trial columns, then the options'."""
        raw = self.store.load("readout_options")
        readouts = self.store.load("readout_trials")
        return self._frame("options", _option_columns(raw, readouts, self.trial_index.meanings))

    @functools.cached_property
    def layers(self) -> pd.DataFrame:
        """One row per (trial, layer, option) of a run with ``--layers``, layers ascending, options in print order:
        the trial columns, then :data:`COLUMNS` ``["layers"]`` (empty without ``--layers``)."""
        raw = self.store.load("readout_layers")
        if not raw.empty:
            raw = raw.copy()
            meanings = self.trial_index.meanings
            raw["meaning"] = [meanings.get(t, {}).get(o) for t, o in zip(raw["trial_id"], raw["option"], strict=True)]
        return self._frame("layers", raw)

    @functools.cached_property
    def samples(self) -> pd.DataFrame:
        """One row per sampled reply (draws of readout trials and free-text replies): trial columns, then the
        samples' (``option`` is missing where the reply parsed into no option)."""
        import pandas as pd

        parts = [_sample_columns(self.store.load(t), t, self.trial_index.meanings) for t in SAMPLE_TABLES]
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
        out = out.sort_values(["position", *(c for c in ("layer", "option_index", "draw") if c in own)], kind="stable")
        return out.reset_index(drop=True)

    # ------------------------------------------------------------ pages of trials (probe.query)
    @functools.cached_property
    def query(self) -> RunQuery:
        """This run's query engine (:class:`probe.query.RunQuery`), kept, so each filter reads only what the last
        one did not."""
        return RunQuery(self)

    def page(self, flt: TrialFilter, offset: int = 0, limit: int = 50) -> Page:
        """One page of the trials ``flt`` selects (:meth:`probe.query.RunQuery.page`); an unknown filter key or
        value is a :class:`probe.query.FilterError` naming it and the known ones."""
        return self.query.page(flt, offset, limit)

    # ------------------------------------------------------------ what analyses read (probe.views)
    @functools.cached_property
    def trial_list(self) -> list[Trial]:
        """Every trial, in full and in order (read once, kept)."""
        return self.store.trials()

    @functools.cached_property
    def trial_order(self) -> dict[str, int]:
        """trial_id -> its place in the trial list (design order; the sampled tables are not in it)."""
        return {t.trial_id: i for i, t in enumerate(self.trial_list)}

    def load(self, table: str) -> pd.DataFrame:
        """One stored table (:mod:`probe.tables`), its verified chunks concatenated (a fresh frame on every call;
        an incomplete run is refused unless opened with ``allow_partial``)."""
        return self.store.load(table)

    def trial_meta(self) -> pd.DataFrame:
        """One row per trial: ``trial_id``, ``item_id``, ``replicate`` and one column per factor (its own name)."""
        from probe import views

        return views.trial_meta(self.trial_list)

    def readout_frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(options with their meaning, per-trial readouts with the trials' factors); StoreError without readouts."""
        from probe import views

        opts, per = self.load("readout_options"), self.load("readout_trials")
        return views.readout_frames(opts, per, self.trial_list, self.root)

    def sample_counts(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Sampled behaviour: (options with their share of the parsed draws, per-trial status counts)."""
        from probe import views

        samples = self.load("samples")
        if samples.empty:
            raise StoreError(f"{self.root} has no samples; run with --samples N")
        return views.count_samples(samples, self.trial_list)

    @functools.cached_property
    def sources(self) -> tuple[str, ...]:
        """The sources of option probabilities this run holds, in :data:`probe.views.SOURCES` order: ``readout``
        where it has readouts, ``samples`` where it has sampled answers (a run with both is analysed from each)."""
        from probe import views

        table = {"readout": "readout_options", "samples": "samples"}
        return tuple(s for s in views.SOURCES if not self.load(table[s]).empty)

    def choice_probs(self, source: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame, str]:
        """The option probabilities every analysis uses: (options, per_trial, source). ``source`` None: from the
        readouts where the run has them, else from the sampled answers (the choice :data:`probe.views.SOURCES`
        names); ``readout`` or ``samples``: from that one (a StoreError where the run lacks it)."""
        from probe import views

        if source == "readout":
            return (*self.readout_frames(), "readout")
        if source == "samples":
            return (*self.sample_counts(), "samples")
        if source is not None:
            raise ValueError(f"source must be one of {list(views.SOURCES)} or None, got {source!r}")
        opts = self.load("readout_options")
        if opts.empty:
            return (*self.sample_counts(), "samples")
        return (*views.readout_frames(opts, self.load("readout_trials"), self.trial_list, self.root), "readout")

    # ------------------------------------------------------------ one trial
    def trial_data(self, trial_id: str, *, integrity: Integrity | None = None) -> TrialData:
        """Everything stored for ``trial_id``, read from its own chunk only (KeyError for an unknown trial).

        ``integrity``: the chunks' state to read by (default: checked now; the viewer passes the one it took for the
        whole request)."""
        import pandas as pd

        position = self.position_of(trial_id)
        trial = self.trial_at(position)
        k = self.chunk_of(position)
        states = self.chunk_states(integrity)
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

    # ------------------------------------------------------------ across runs
    def match_key(self, trial: Trial) -> str:
        """What makes a trial the same trial in another run of the experiment: item, factors and replicate (not the
        salt text or the id, which can depend on the model's tokenizer)."""
        return match_key(trial.experiment, trial.item_id, trial.factors, trial.replicate)

    def find_match(self, trial: Trial) -> str | None:
        """The id of this run's trial matching ``trial`` of another run (None when it has none)."""
        return self.trial_index.match_keys.get(self.match_key(trial))


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
