"""The panel comparison of the crossed-frame battery (paper 003) and the plain yes/no battery: the estimators.

``probe compare`` matches the runs of a panel (``docs/panels.md``) on the
items they all hold and recomputes every per-run quantity on those shared
items (so G, the decomposition and (s, m) describe the same item set in every
column). This module holds that computation, as pure functions on frames:
loading and matching the runs (:func:`panel_context`, :func:`yesno_context`,
:func:`compute_run`), the per-run table of stance, incoherence, G and the
decomposition (:func:`models_table`), the agreement of the item ordering
(:func:`agreement`, :func:`consensus_reference`, :func:`mean_r2_summary`),
the paired deliberation differences (:func:`deliberation_table`), the human
anchors (:func:`load_humans`, :func:`humans_agreement`,
:func:`framing_shift`) and the logit-vs-sampled matching
(:func:`logit_sampled_pairs`, :func:`logit_sampled_rows`). The contexts
compute every part of a comparison once, into a frozen :class:`Context`;
:mod:`analysis.battery.compare_report` only formats it (Markdown, CSV,
figures); its module docstring lists the sections.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.battery.fit import N_BOOT, SEED
from analysis.common.bootstrap import finite_ci, resample_index
from analysis.common.results import Part, attempt
from probe.errors import NotComputed, ProbeError
from probe.panel import Panel, PanelRun, shared_items
from probe.record import Plan
from probe.runs import Run

N_OUTLIERS = 5
CHANNELS = ("order", "lexical", "logic", "label")


# ------------------------------------------------------------------ per run
@dataclass(frozen=True)
class RunData:
    """What the comparison reads from one run (all items), and what it computed on the shared items.

    :func:`load_run` reads it; :func:`compute_run` returns a copy with the computed fields filled in.
    """

    run: PanelRun
    items: list[str]
    source: str
    """``readout`` or ``samples``: where the option probabilities come from."""
    options: pd.DataFrame
    per_trial: pd.DataFrame
    opened: Run
    """The run folder, opened (:class:`probe.runs.Run`)."""
    has_readouts: bool
    has_samples: bool
    inc: pd.DataFrame | None = None
    """Per shared item: theta, sigma_repro, ... (:func:`analysis.battery.stance.incoherence`)."""
    dec: pd.DataFrame | None = None
    """Per shared item: z, lexical, order, apparent (yes/no verb flip)."""
    logic: pd.Series | None = None
    """Per arbitrary label pair: the logical (verdict) pull, mean over shared items."""
    bt: pd.DataFrame | None = None
    """Binary trials of the shared items (:func:`analysis.battery.fit.binary_trials`)."""
    fits: pd.DataFrame | None = None
    joint: pd.DataFrame | None = None
    """The joint (s, m) fit per label family (:func:`analysis.battery.fit.fit_joints`), one row per (family, channel)."""
    why: dict[str, str] = field(default_factory=dict)
    """Quantity -> why it is missing for this run."""
    unfitted: tuple[Any, ...] = ()
    """Channels the (s, m) fit could not fit on this run (:class:`analysis.battery.fit.Unfitted`), with the reason."""
    dropped: list[Any] = field(default_factory=list)
    """Stories a table left out for an empty cell (:class:`analysis.battery.yesno.Dropped`): label map, (s, m) fit."""

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def theta(self) -> pd.Series | None:
        return None if self.inc is None else self.inc["theta"]


def load_run(run: PanelRun) -> RunData:
    """Read one run's option probabilities (readouts, else sampled frequencies) and trial factors."""
    opened = run.run()
    trials = opened.trial_list
    has_readouts = not opened.load("readout_options").empty
    samples = _samples(opened)
    if has_readouts:  # the same choice as Run.choice_probs: readouts when the run has them
        opts, per_trial = opened.readout_frames()
        source = "readout"
    elif not samples.empty:
        opts, per_trial = _count(samples, trials)
        source = "samples"
    else:
        raise ValueError(f"run {run.name!r} ({run.path}) has neither readouts nor samples; finish it first")
    return RunData(
        run=run,
        items=list(dict.fromkeys(t.item_id for t in trials)),
        source=source,
        options=opts,
        per_trial=per_trial,
        opened=opened,
        has_readouts=has_readouts,
        has_samples=not samples.empty,
    )


def _samples(run: Run) -> pd.DataFrame:
    """The run's samples, trial ids as plain Python strings (fast set membership)."""
    s = run.load("samples")
    return s.astype({"trial_id": object}) if not s.empty else s


def _count(samples: pd.DataFrame, trials: Sequence[Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    from probe.views import count_samples

    ids = set(samples["trial_id"])
    return count_samples(samples, [t for t in trials if t.trial_id in ids])


def verbflip_cells(per_trial: pd.DataFrame, options: pd.DataFrame, battery: bool = True) -> pd.DataFrame:
    """Per item: mean P(CBR) in the four (CBR-relative verb x printed order) cells of the Yes/No family.

    Battery trials carry the CBR-relative verb already (trial contract); plain
    yes/no trials get it from the option meanings (:func:`analysis.battery.yesno.with_cbr_verb`).
    Replicate 0 only, forms averaged within each cell.
    """
    from analysis.battery.yesno import cell_table, p_cbr, with_cbr_verb

    if battery:
        if "instrument" not in per_trial.columns:
            raise NotComputed("no instrument factor: not a battery run")
        b = per_trial[per_trial["instrument"] == "binary"]
        b = b[b["labels"] == "Yes/No"] if "labels" in b.columns else b.iloc[0:0]
        if b.empty:
            raise NotComputed("no Yes/No forced-binary trials (instrument binary, labels Yes/No)")
        b = b.assign(cbr_verb=b["verb"])
    else:
        b = with_cbr_verb(per_trial, options)
    return cell_table(b, p_cbr(options[options["trial_id"].isin(b["trial_id"])]))


def compute_run(d: RunData, items: Sequence[str], *, n_boot: int = N_BOOT, seed: int = SEED) -> RunData:
    """``d`` with theta / incoherence, the decomposition, the logical pull and (s, m) computed on ``items`` only.

    The (s, m) fits are the report's (:func:`analysis.battery.fit.fit_run`); a quantity that cannot be
    computed is None, with the reason under its name in ``why``.
    """
    from analysis.battery import fit, stance
    from analysis.battery.binary import cell_events, incomplete_stories, projections
    from analysis.battery.yesno import decompose

    keep = set(items)
    per = d.per_trial[d.per_trial["item_id"].isin(keep)]
    opts = d.options[d.options["trial_id"].isin(per["trial_id"])]
    why: dict[str, str] = {}
    inc = dec = bt = logic = None
    dropped: list[Any] = []
    try:
        g = per[per["instrument"] == "graded"] if "instrument" in per.columns else per.iloc[0:0]
        if g.empty:
            raise NotComputed("no graded (I-1) trials in this run")
        gt = stance.graded_trials(opts[opts["trial_id"].isin(g["trial_id"])], g, d.source)  # type: ignore[arg-type]
        inc = stance.incoherence(stance.per_form(gt))
    except NotComputed as e:
        why["theta"] = str(e)
    try:
        dec = decompose(verbflip_cells(per, opts, battery="instrument" in per.columns)).loc[
            lambda df: df.index.isin(keep)
        ]
    except NotComputed as e:
        why["decomposition"] = str(e)
    try:
        bt = fit.binary_trials(opts, per)
    except NotComputed as e:
        why["binary"] = str(e)
    arb = per[(per["family"] == "arbitrary") & (per["replicate"] == 0)] if "family" in per.columns else per.iloc[0:0]
    if len(arb):
        events = cell_events(arb, opts)
        dropped += incomplete_stories(events)
        logic = projections(events, set()).groupby("labels")["logic"].mean()
    else:
        why["logic"] = "no arbitrary label pairs (A/B, 1/2, ...) in this run"
    fitted = None
    if inc is not None and bt is not None:
        try:
            fitted = fit.fit_run(inc["theta"], bt, n_boot=n_boot, seed=seed)
            if fitted.fits is None:
                why["fit"] = "no channel could be fitted"
            dropped += fitted.dropped
        except NotComputed as e:
            why["fit"] = str(e)
    else:
        why["fit"] = "needs the graded and the binary instruments"
    return replace(
        d,
        inc=inc,
        dec=dec,
        logic=logic,
        bt=bt,
        fits=None if fitted is None else fitted.fits,
        joint=None if fitted is None else fitted.joint,
        unfitted=() if fitted is None else fitted.unfitted,
        why={**d.why, **why},
        dropped=[*d.dropped, *dropped],
    )


# ------------------------------------------------------------------ human anchors
class HumanTableError(ProbeError, ValueError):
    """A malformed human-anchor CSV: the message names the file, the row and the column."""


HUMAN_COLUMNS = ("item_id", "p_cbr", "n", "rating", "rating_lo", "rating_hi", "frame")


def load_humans(path: str | Path) -> pd.DataFrame:
    """Read and check a human-anchor CSV (format in ``docs/panels.md``).

    Returns one row per (item, frame, measure) with ``item_id``, ``frame``
    (``""`` without a frame column), ``measure`` (``p_cbr`` or ``rating``),
    ``raw`` (the value as given), ``value`` (on the stance axis [-1, 1]:
    ``2 p_cbr - 1``, or ``2 (rating - lo) / (hi - lo) - 1``) and ``n`` (the
    number of respondents behind a ``p_cbr``; NaN when not given). Rows are
    numbered as data rows (the header is line 1, the first data row is row 1
    on line 2).
    """
    p = Path(path)
    raw = _read_human_csv(p)
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[str, str], int] = {}
    for k, rec in enumerate(raw.to_dict("records"), start=1):
        where = f"{p}, row {k} (line {k + 1})"
        item = str(rec["item_id"]).strip()
        if not item:
            raise HumanTableError(f"{where}, column item_id: empty")
        frame = str(rec.get("frame", "")).strip()
        if "frame" in raw.columns and not frame:
            raise HumanTableError(f"{where}, column frame: empty (give every row a frame, or drop the column)")
        if (item, frame) in seen:
            raise HumanTableError(
                f"{where}: item {item!r}" + (f" frame {frame!r}" if frame else "") + f" repeats row {seen[item, frame]}"
            )
        seen[item, frame] = k
        found = False
        if "p_cbr" in raw.columns and str(rec["p_cbr"]).strip():
            v, n = _choice_rate(p, k, rec, has_n="n" in raw.columns)
            rows.append({"item_id": item, "frame": frame, "measure": "p_cbr", "raw": v, "value": 2 * v - 1, "n": n})
            found = True
        if "rating" in raw.columns and str(rec["rating"]).strip():
            v, a = _rating(p, k, rec)
            rows.append(
                {"item_id": item, "frame": frame, "measure": "rating", "raw": v, "value": 2 * a - 1, "n": np.nan}
            )
            found = True
        if not found:
            raise HumanTableError(f"{where}: neither p_cbr nor rating has a value")
    return pd.DataFrame(rows, columns=["item_id", "frame", "measure", "raw", "value", "n"])


def _read_human_csv(p: Path) -> pd.DataFrame:
    """The human table's cells as text, its columns checked: known, and the ones each measure needs."""
    try:
        raw = pd.read_csv(p, dtype=str, keep_default_na=False, skipinitialspace=True)
    except FileNotFoundError:
        raise HumanTableError(f"human table {p} does not exist") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise HumanTableError(f"human table {p} is not a readable CSV: {e}") from None
    raw.columns = [str(c).strip() for c in raw.columns]
    unknown = [c for c in raw.columns if c not in HUMAN_COLUMNS]
    if unknown:
        raise HumanTableError(f"{p}: unknown column(s) {unknown}; allowed: {', '.join(HUMAN_COLUMNS)}")
    if "item_id" not in raw.columns:
        raise HumanTableError(f"{p}: needs an `item_id` column (the dilemma ids of the runs)")
    measures = [m for m in ("p_cbr", "rating") if m in raw.columns]
    if not measures:
        raise HumanTableError(f"{p}: needs a `p_cbr` column (choice rate of the cost-benefit option) or `rating`")
    if "rating" in raw.columns and not {"rating_lo", "rating_hi"} <= set(raw.columns):
        raise HumanTableError(f"{p}: a `rating` column needs `rating_lo` and `rating_hi` (the ends of its scale)")
    if "n" in raw.columns and "p_cbr" not in raw.columns:
        raise HumanTableError(f"{p}: column `n` counts the respondents behind `p_cbr`, which is missing")
    if raw.empty:
        raise HumanTableError(f"{p}: no data rows")
    return raw


def _human_number(p: Path, row: int, col: str, text: str) -> float:
    """A finite number in a cell of the human table (untrusted input: the error names file, row and column)."""
    try:
        v = float(text)
    except ValueError:
        raise HumanTableError(f"{p}, row {row} (line {row + 1}), column {col}: not a number: {text!r}") from None
    if not np.isfinite(v):
        raise HumanTableError(f"{p}, row {row} (line {row + 1}), column {col}: must be finite, got {text!r}")
    return v


def _choice_rate(p: Path, k: int, rec: dict[str, Any], has_n: bool) -> tuple[float, float]:
    """Row ``k``'s choice rate ``p_cbr`` in [0, 1] and its respondents ``n`` (NaN when not given)."""
    where = f"{p}, row {k} (line {k + 1})"
    v = _human_number(p, k, "p_cbr", rec["p_cbr"])
    if not 0 <= v <= 1:
        raise HumanTableError(f"{where}, column p_cbr: a choice rate must lie in [0, 1], got {v:g}")
    n = float("nan")
    if has_n and str(rec["n"]).strip():
        n = _human_number(p, k, "n", rec["n"])
        if n < 1 or n != int(n):
            raise HumanTableError(f"{where}, column n: must be a whole number >= 1, got {rec['n']!r}")
    return v, n


def _rating(p: Path, k: int, rec: dict[str, Any]) -> tuple[float, float]:
    """Row ``k``'s rating and where it lies on its scale, from 0 (rating_lo) to 1 (rating_hi)."""
    where = f"{p}, row {k} (line {k + 1})"
    v = _human_number(p, k, "rating", rec["rating"])
    lo, hi = _human_number(p, k, "rating_lo", rec["rating_lo"]), _human_number(p, k, "rating_hi", rec["rating_hi"])
    if not lo < hi:
        raise HumanTableError(f"{where}, columns rating_lo/rating_hi: need lo < hi, got {lo:g} and {hi:g}")
    if not lo <= v <= hi:
        raise HumanTableError(f"{where}, column rating: {v:g} lies outside its scale [{lo:g}, {hi:g}]")
    return v, (v - lo) / (hi - lo)


# ------------------------------------------------------------------ statistics
def g_of(theta: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """G = Var(theta) / (Var(theta) + mean sigma^2) along the last axis (ddof 1), as in :mod:`analysis.battery.stance`."""
    var = np.var(theta, axis=-1, ddof=1)
    denom = var + np.mean(sigma**2, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out: np.ndarray = np.where(denom > 0, var / denom, np.nan)
    return out


def mad_ci(a: pd.Series, b: pd.Series, *, n_boot: int = N_BOOT, seed: int = SEED) -> tuple[float, float, float, int]:
    """Mean |a - b| over the items both hold, with a percentile bootstrap CI over items."""
    df = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner").dropna()
    diff = (df["a"] - df["b"]).abs().to_numpy(float)
    if len(diff) == 0:
        return float("nan"), float("nan"), float("nan"), 0
    boots = diff[resample_index(len(diff), n_boot, seed)].mean(axis=1)
    lo, hi = finite_ci(boots)
    return float(diff.mean()), lo, hi, len(diff)


def standardized(theta: pd.DataFrame) -> pd.DataFrame:
    """Each column (run) z-scored across items (ddof 1); a constant column becomes NaN."""
    sd = theta.std(ddof=1)
    return (theta - theta.mean()) / sd.where(sd > 0)


def agreement(
    theta: pd.DataFrame, reference: Sequence[str] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(r matrix, consensus table per item, per-run table) from an item x run table of theta.

    Consensus = the raw mean of theta over the ``reference`` runs (the
    paper's "frontier-mean consensus"; None: every run); disagreement = SD
    (ddof 1) across all runs of theta standardized within each run. Per run:
    mean r with the other runs, and the consensus alignment ``consensus_r2``
    = r^2 with the consensus, computed leave-one-out for a reference run (its
    own theta left out of the consensus it is compared with).
    """
    if theta.shape[1] < 2:
        raise NotComputed(f"agreement needs at least two runs with theta, got {theta.shape[1]}")
    if theta.shape[0] < 3:
        raise NotComputed(f"agreement needs at least 3 shared items with theta, got {theta.shape[0]}")
    ref = list(theta.columns) if reference is None else list(reference)
    unknown = [n for n in ref if n not in theta.columns]
    if unknown or not ref:
        raise ValueError(
            f"consensus reference runs {unknown or ref} are not runs with theta; runs: {list(theta.columns)}"
        )
    r = theta.corr(method="pearson")
    z = standardized(theta)
    cons = pd.DataFrame({"consensus": theta[ref].mean(axis=1), "disagreement": z.std(axis=1, ddof=1)})
    cons = cons.join(theta)
    cons["rank"] = cons["consensus"].rank(ascending=False, method="first").astype(int)
    cons = cons.sort_values("rank")
    rows = {}
    for c in theta.columns:
        others = [o for o in theta.columns if o != c]
        basis = [o for o in ref if o != c]
        r2 = float("nan")
        if basis:
            target = theta[basis].mean(axis=1)
            ok = theta[c].notna() & target.notna()
            if ok.sum() > 2 and theta[c][ok].nunique() > 1 and target[ok].nunique() > 1:
                r2 = float(np.corrcoef(theta[c][ok], target[ok])[0, 1] ** 2)
        rows[c] = {
            "mean_r_with_others": float(r.loc[c, others].mean()),
            "consensus_r2": r2,
            "in_reference": c in ref,
        }
    per_run = pd.DataFrame(rows).T
    per_run.index.name = "run"
    return r, cons, per_run


def mean_r2_summary(
    theta: pd.DataFrame, reference: Sequence[str], human: pd.Series | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The mean-r^2 summaries of paper 003's Table S2: (per run, per group).

    Per run: ``mean_r2_reference`` = mean r^2 of its theta with each reference
    run other than itself, and ``r2_human`` = r^2 with the human anchor
    (items both hold). Per group: ``reference-reference`` = the mean over
    distinct pairs of reference runs, ``reference-human`` = the mean over
    reference runs of r^2 with the humans, ``other-reference`` and
    ``other-human`` the same for the runs outside the set (NaN when empty).
    """
    r2 = theta.corr(method="pearson") ** 2
    ref = [n for n in reference if n in theta.columns]
    rows = {}
    for c in theta.columns:
        others = [o for o in ref if o != c]
        rows[c] = {
            "mean_r2_reference": float(r2.loc[c, others].mean()) if others else float("nan"),
            "r2_human": _r2(theta[c], human) if human is not None else float("nan"),
        }
    per_run = pd.DataFrame.from_dict(rows, orient="index")
    per_run.index.name = "run"
    pairs = [(a, b) for k, a in enumerate(ref) for b in ref[k + 1 :]]
    rest = [c for c in theta.columns if c not in ref]

    def mean(values: list[float]) -> float:
        return float(np.nanmean(values)) if values and np.isfinite(values).any() else float("nan")

    groups = pd.DataFrame(
        {
            "mean_r2": [
                mean([float(r2.loc[a, b]) for a, b in pairs]),
                mean([float(per_run.loc[c, "r2_human"]) for c in ref]),
                mean([float(per_run.loc[c, "mean_r2_reference"]) for c in rest]),
                mean([float(per_run.loc[c, "r2_human"]) for c in rest]),
            ],
            "n": [len(pairs), len(ref), len(rest), len(rest)],
        },
        index=pd.Index(["reference-reference", "reference-human", "other-reference", "other-human"], name="group"),
    )
    return per_run, groups


def _r2(a: pd.Series, b: pd.Series | None) -> float:
    if b is None:
        return float("nan")
    df = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner").dropna()
    if len(df) < 3 or df["a"].nunique() < 2 or df["b"].nunique() < 2:
        return float("nan")
    return float(np.corrcoef(df["a"], df["b"])[0, 1] ** 2)


def consensus_reference(panel: Panel, runs: dict[str, RunData], have: Sequence[str]) -> tuple[list[str], str]:
    """The runs the consensus averages over, and the rule that chose them (for the report).

    A panel file's per-run ``consensus: true/false`` decides when any run
    sets it. Otherwise the paper's definition: the frontier configurations,
    which the paper measures by sampling, not by logit readout (the
    open-weight models are read at the logit level and left out); so the
    sampled-only runs, or every run when none is sampled.
    """
    marked = [r for r in panel.runs if r.consensus is not None]
    if marked:
        chosen = [r.name for r in panel.runs if r.consensus and r.name in have]
        return chosen, "the runs marked `consensus: true` in the panel file"
    sampled = [n for n in have if runs[n].source == "samples"]
    if sampled:
        return sampled, "the sampled runs (the paper's frontier configurations; logit-readout runs left out)"
    return list(have), "every run (no sampled run: the paper's frontier set is empty here)"


@dataclass(frozen=True)
class ThetaAgreement:
    """The agreement of theta across the runs on the shared dilemmas with theta in every run (:func:`agreement`)."""

    theta: pd.DataFrame
    """Item x run theta, items with theta in every run."""
    rule: str
    """Which runs the consensus averages over, and why (:func:`consensus_reference`)."""
    r: pd.DataFrame
    r2: pd.DataFrame
    """``r`` squared, index ``run``."""
    consensus: pd.DataFrame
    """Per item: the consensus theta and the disagreement."""
    per_run: pd.DataFrame
    reference: list[str]
    r2_by_run: pd.DataFrame
    """The mean-r^2 summaries of Table S2 per run (:func:`mean_r2_summary`)."""
    r2_groups: pd.DataFrame
    """The same per group of runs (reference, other) and with the human anchor."""


def theta_agreement(
    panel: Panel, runs: dict[str, RunData], theta: pd.DataFrame, humans: pd.DataFrame | None
) -> ThetaAgreement:
    """:func:`agreement` of ``theta`` (item x run) against the consensus of :func:`consensus_reference`, and the
    mean-r^2 summaries (:func:`mean_r2_summary`) with the human anchor of ``humans`` (:func:`human_anchor`)."""
    reference, rule = consensus_reference(panel, runs, list(theta.columns))
    r, cons, per_run = agreement(theta, reference)
    cons.index.name = "item_id"
    r2 = (r**2).rename_axis("run")
    by_run, groups = mean_r2_summary(theta, reference, human_anchor(humans))
    return ThetaAgreement(theta, rule, r, r2, cons, per_run, reference, by_run, groups)


# ------------------------------------------------------------------ the comparison
def theta_table(runs: dict[str, RunData], shared: Sequence[str]) -> pd.DataFrame:
    """Item x run theta on the shared dilemmas (items with theta in no run left out)."""
    cols = {n: d.theta for n, d in runs.items() if d.theta is not None}
    return pd.DataFrame(cols).reindex(shared).dropna(how="all")


@dataclass(frozen=True)
class Context:
    """What the comparison's sections read, all computed before them (:func:`panel_context`, :func:`yesno_context`):
    the panel, its runs (with what :func:`compute_run` computed), the shared items and the dropped ones, the humans,
    and every part of the comparison. The sections only format it."""

    panel: Panel
    runs: dict[str, RunData]
    shared: list[str]
    dropped: pd.DataFrame
    n_boot: int = N_BOOT
    seed: int = SEED
    humans: pd.DataFrame | None = None
    agreement: Part[ThetaAgreement] = field(default_factory=Part)
    """Theta agreement of a battery panel (:func:`theta_agreement`; absent in a yes/no panel)."""
    yesno: Part[YesNoCells] = field(default_factory=Part)
    """The cells and decomposition of a yes/no panel (:func:`yesno_cells`; absent in a battery panel)."""
    models: pd.DataFrame | None = None
    """The battery panel's per-run table (:func:`models_table`)."""
    human_values: pd.DataFrame | None = None
    """Item x measure: every human item's values on the stance axis (:func:`humans_per_item`); None without humans."""
    deliberation: Part[Deliberation] = field(default_factory=Part)
    """Reasoning off - on per paired model of a battery panel (:func:`compute_deliberation`)."""
    anchors: Part[HumanAnchors] = field(default_factory=Part)
    """The runs against the human anchors of a battery panel (:func:`compute_anchors`)."""
    logit_sampled: Part[LogitSampled] = field(default_factory=Part)
    """Readout runs against their sampled-only twins (:func:`compute_logit_sampled`)."""
    planted: pd.DataFrame | None = None
    """r^2 of the planted thetas of the sim runs (:func:`planted_r2`)."""
    z_agreement: Part[ZAgreement] = field(default_factory=Part)
    """The agreement of the story stance z of a yes/no panel (:func:`compute_z_agreement`)."""
    layers: Mapping[str, Any] = field(default_factory=dict)
    """Run -> its layer profile on the shared items (:func:`layer_profiles`); only the runs made with
    ``--layers``, empty when none was."""

    def theta_table(self) -> pd.DataFrame:
        return theta_table(self.runs, self.shared)

    @property
    def consensus(self) -> pd.Series | None:
        """The consensus theta per item, when the agreement was computed."""
        return None if self.agreement.value is None else self.agreement.value.consensus["consensus"]


def models_table(c: Context) -> pd.DataFrame:
    """Per run on the shared items: stance, incoherence, G (with a bootstrap CI over items), decomposition, logic_AB.

    One row per run (index ``run``): model, reasoning, source; from the graded
    instrument n_items, mean_theta, sd_theta, mean_sigma_repro, the pooled
    incoherence (:func:`analysis.battery.stance.pooled_incoherence`: sigma_repro,
    sigma_dir, sigma_scale, sigma_repeat, sigma_tot) and G with G_lo, G_hi
    (``c.n_boot`` resamples, seed ``c.seed``); z, order, lexical, apparent:
    the yes/no decomposition, mean over items; logic_AB: the logical pull
    with the A/B labels.
    """
    from analysis.battery import stance

    rows = {}
    for name, d in c.runs.items():
        row: dict[str, Any] = {
            "model": d.run.model,
            "reasoning": "on" if d.run.reasoning else "off",
            "source": d.source,
        }
        if d.inc is not None:
            inc = d.inc.dropna(subset=["theta", "sigma_repro"])
            th, sg = inc["theta"].to_numpy(float), inc["sigma_repro"].to_numpy(float)
            row.update(n_items=len(inc), mean_theta=float(th.mean()), sd_theta=float(th.std(ddof=1)))
            row["mean_sigma_repro"] = float(sg.mean())
            with contextlib.suppress(NotComputed):
                pooled = stance.pooled_incoherence(d.inc)
                row |= pooled.pick("sigma_repro", "sigma_dir", "sigma_scale", "sigma_repeat", "sigma_tot")
            if len(inc) >= 2:
                idx = resample_index(len(inc), c.n_boot, c.seed)
                row["G"] = float(g_of(th, sg))
                row["G_lo"], row["G_hi"] = finite_ci(g_of(th[idx], sg[idx]))
        if d.dec is not None:
            for k in ("z", "order", "lexical", "apparent"):
                row[f"{k}"] = float(d.dec[k].mean())
        if d.logic is not None and "A/B" in d.logic.index:
            row["logic_AB"] = float(d.logic["A/B"])
        rows[name] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "run"
    return table


def planted_r2(c: Context) -> pd.DataFrame | None:
    """r^2 between the planted thetas of the sim runs on the consensus items; None without two sim runs or a consensus."""
    from engines.sim import SimParams

    sims = {n: d for n, d in c.runs.items() if d.opened.manifest.engine.kind == "sim"}
    if len(sims) < 2 or c.consensus is None:
        return None
    items = list(c.consensus.index)
    planted = pd.DataFrame(
        {n: [SimParams(**d.opened.manifest.engine.params).item_theta(str(i)) for i in items] for n, d in sims.items()},
        index=items,
    )
    r2 = planted.corr() ** 2
    r2.index.name = "run"
    return r2


# ------------------------------------------------------------------ deliberation
NUMERICAL_ZERO = 1e-6
"""Differences smaller than this are round-off of the fits (m and s are reported to 3 decimals)."""


def _boot_fit(th: np.ndarray, pp: np.ndarray, pm: np.ndarray, idx: np.ndarray, x0: tuple[float, float]) -> np.ndarray:
    """(s, m) refitted on every resample (rows of ``idx``); NaN rows where the fit did not converge."""
    from analysis.battery.fit import refit_resamples

    boots, ok = refit_resamples(th, pp, pm, idx, x0)
    boots[~ok] = np.nan
    return boots


def deliberation_table(off: RunData, on: RunData, *, n_boot: int = N_BOOT, seed: int = SEED) -> pd.DataFrame:
    """Paired off - on differences (the paper's sign: "off minus on") with bootstrap CIs over items.

    Column ``off_minus_on``: positive when reasoning lowers the quantity
    (e.g. a smaller |m| or sigma_repro with reasoning on). One resampling of
    items serves every row.

    Rows: ``sigma_repro`` (mean over items), ``G``, per channel fitted in
    both runs ``|m|``, ``m`` and ``s`` (both runs refitted on each resample),
    and per label family the joint fit (:func:`analysis.battery.fit.fit_joint`):
    ``s`` with channel ``joint:<family>``, ``abs_m`` and ``m`` with channel
    ``joint:<family>:<channel>``. Items: those with theta and sigma_repro
    (and, for a channel or family, its cells) in both runs.
    """

    if off.inc is None or on.inc is None:
        raise NotComputed("needs theta and sigma_repro (the graded instrument) in both runs")
    a = off.inc[["theta", "sigma_repro"]].dropna()
    b = on.inc[["theta", "sigma_repro"]].dropna()
    items = [i for i in a.index if i in b.index]
    if len(items) < 3:
        raise NotComputed(f"needs at least 3 items with theta in both runs, got {len(items)}")
    rows = _DiffRows()
    sa, sb = a.loc[items, "sigma_repro"].to_numpy(float), b.loc[items, "sigma_repro"].to_numpy(float)
    ta, tb = a.loc[items, "theta"].to_numpy(float), b.loc[items, "theta"].to_numpy(float)
    idx = resample_index(len(items), n_boot, seed)
    rows.add("sigma_repro", "", float(sa.mean()), float(sb.mean()), sb[idx].mean(1) - sa[idx].mean(1), len(items))
    rows.add(
        "G", "", float(g_of(ta, sa)), float(g_of(tb, sb)), g_of(tb[idx], sb[idx]) - g_of(ta[idx], sa[idx]), len(items)
    )
    if off.bt is None or on.bt is None:
        return pd.DataFrame(rows.rows)
    pairing = _Pairing(a, b, off.bt, on.bt, items, n_boot, seed)
    pairing.channel_differences(rows)
    pairing.joint_differences(rows)
    return pd.DataFrame(rows.rows)


class _DiffRows:
    """The rows of :func:`deliberation_table`: one quantity's off and on values, off - on and its bootstrap CI."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, q: str, ch: str, v_off: float, v_on: float, on_minus_off: np.ndarray, n: int) -> None:
        d_boot = -on_minus_off  # reported off - on, as the paper writes it
        lo, hi = finite_ci(d_boot)
        self.rows.append(
            {
                "quantity": q,
                "channel": ch,
                "off": v_off,
                "on": v_on,
                "off_minus_on": v_off - v_on,
                "lo": lo,
                "hi": hi,
                # a CI that only misses 0 by optimizer round-off (a planted-zero m) does not count
                "excludes_0": bool(lo > NUMERICAL_ZERO or hi < -NUMERICAL_ZERO),
                "n_items": n,
                "n_boot_ok": int(np.isfinite(d_boot).sum()),
            }
        )


@dataclass(frozen=True)
class _Pairing:
    """An off and an on run on the items both hold: theta and sigma_repro (``a`` off, ``b`` on), their binary
    trials, and the resampling of the items (``n_boot``, ``seed``) every refit shares."""

    a: pd.DataFrame
    b: pd.DataFrame
    bt_off: pd.DataFrame
    bt_on: pd.DataFrame
    items: list[Any]
    n_boot: int
    seed: int

    def channel_differences(self, rows: _DiffRows) -> None:
        """|m|, m and s of every channel fitted in both runs (on its items in both), both refitted on each resample."""
        from analysis.battery import fit

        for ch in CHANNELS:
            try:
                sides_a, sides_b = fit.channel_sides(self.bt_off, ch), fit.channel_sides(self.bt_on, ch)
            except NotComputed:
                continue
            common = [i for i in self.items if i in sides_a.index and i in sides_b.index]
            if len(common) < 3:
                continue
            arrays = []
            for inc, sides in ((self.a, sides_a), (self.b, sides_b)):
                th = inc.loc[common, "theta"].to_numpy(float)
                pp, pm = sides.loc[common, "p_plus"].to_numpy(float), sides.loc[common, "p_minus"].to_numpy(float)
                point = fit.fit_channel(inc.loc[common, "theta"], sides.loc[common], n_boot=0)
                boots = _boot_fit(th, pp, pm, resample_index(len(common), self.n_boot, self.seed), (point.s, point.m))
                arrays.append((point, boots))
            (pa, ba), (pb, bb) = arrays
            n = len(common)
            rows.add("abs_m", ch, abs(pa.m), abs(pb.m), np.abs(bb[:, 1]) - np.abs(ba[:, 1]), n)
            rows.add("m", ch, pa.m, pb.m, bb[:, 1] - ba[:, 1], n)
            rows.add("s", ch, pa.s, pb.s, bb[:, 0] - ba[:, 0], n)

    def joint_differences(self, rows: _DiffRows) -> None:
        """s, and |m| and m per channel, of every label family's joint fit in both runs, refitted on each resample."""
        from analysis.battery import fit

        for fam in fit.JOINT_CHANNELS:
            try:
                ja = fit.joint_cells(self.a.loc[self.items, "theta"], self.bt_off, fam)
                jb = fit.joint_cells(self.b.loc[self.items, "theta"], self.bt_on, fam)
            except NotComputed:
                continue
            common = [i for i in self.items if i in ja.items and i in jb.items]
            if len(common) < 3 or ja.channels != jb.channels:
                continue
            joint = []
            for data in (ja.subset(common), jb.subset(common)):
                jfit = fit.fit_joint_data(data, n_boot=0)
                jboots, ok = fit.refit_joint_resamples(
                    data, resample_index(len(common), self.n_boot, self.seed), np.array([jfit.s, *jfit.m])
                )
                jboots[~ok] = np.nan
                joint.append((jfit, jboots))
            (pa_j, ba_j), (pb_j, bb_j) = joint
            n = len(common)
            rows.add("s", f"joint:{fam}", pa_j.s, pb_j.s, bb_j[:, 0] - ba_j[:, 0], n)
            for k, ch in enumerate(ja.channels, start=1):
                m_a, m_b = pa_j.m[k - 1], pb_j.m[k - 1]
                rows.add("abs_m", f"joint:{fam}:{ch}", abs(m_a), abs(m_b), np.abs(bb_j[:, k]) - np.abs(ba_j[:, k]), n)
                rows.add("m", f"joint:{fam}:{ch}", m_a, m_b, bb_j[:, k] - ba_j[:, k], n)


@dataclass(frozen=True)
class Deliberation:
    """Reasoning off - on for every (off, on) pair of one model in the panel (:func:`compute_deliberation`)."""

    table: pd.DataFrame | None
    """One row per (model, quantity, channel) (:func:`deliberation_table`); None when no pair could be computed."""
    skipped: tuple[tuple[PanelRun, PanelRun, str], ...]
    """The (off, on) pairs not computed, with why."""


def compute_deliberation(c: Context) -> Part[Deliberation]:
    """:func:`deliberation_table` of each reasoning pair of the panel (:meth:`probe.panel.Panel.reasoning_pairs`)."""
    pairs = c.panel.reasoning_pairs()
    if not pairs:
        return Part(
            absent="No model has both a reasoning-off and a reasoning-on run in this panel (give `model:` and "
            "`reasoning:` in a panel file to pair runs)."
        )
    tables, skipped = [], []
    for off, on in pairs:
        try:
            t = deliberation_table(c.runs[off.name], c.runs[on.name], n_boot=c.n_boot, seed=c.seed)
        except NotComputed as e:
            skipped.append((off, on, str(e)))
            continue
        tables.append(t.assign(model=off.model, off_run=off.name, on_run=on.name))
    table = None
    if tables:
        table = pd.concat(tables, ignore_index=True)
        cols = ["model", "off_run", "on_run", "quantity", "channel", "off", "on", "off_minus_on", "lo", "hi"]
        cols.append("excludes_0")
        table = table[[*cols, "n_items", "n_boot_ok"]]
    return Part(Deliberation(table, tuple(skipped)))


# ------------------------------------------------------------------ humans
HUMAN_VS: dict[str, tuple[str, ...]] = {"rating": ("theta",), "p_cbr": ("theta", "z")}
"""Which model quantities a human measure is compared with. The paper's anchor (Fig. 1a, "r^2 of per-item
theta ... frontier-human") sets the human choice rate, as 2 P - 1, beside the model's graded theta: first row.
A choice rate is also shown against the forced-binary story stance z = mean(2 P(CBR) - 1) (both choice
rates), as a second, labelled row; a rating is compared with theta."""


def humans_per_item(h: pd.DataFrame) -> pd.DataFrame:
    """Item x measure table of the human values on the stance axis (:func:`load_humans`), averaged over frames."""
    return h.groupby(["item_id", "measure"])["value"].mean().unstack("measure")


def human_anchor(humans: pd.DataFrame | None) -> pd.Series | None:
    """The human value per item that theta is set beside: 2 p_cbr - 1 where given, else the first measure."""
    if humans is None or not len(humans):
        return None
    per_measure = humans_per_item(humans)
    return per_measure["p_cbr"] if "p_cbr" in per_measure.columns else per_measure.iloc[:, 0]


def humans_agreement(
    runs: dict[str, RunData], per_item: pd.DataFrame, *, n_boot: int = N_BOOT, seed: int = SEED
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(agreement table, values by item) of every run's quantities (:data:`HUMAN_VS`) with the human ``per_item``.

    Table: one row per (run, human measure, model quantity) with the Pearson r
    (bootstrap CI over items, :func:`analysis.battery.stance.pearson_ci`), r2,
    the mean |diff| (:func:`mad_ci`), n_items and a note (why a row is
    empty). By item: the human values (``humans_<measure>``) beside each
    run's quantity (``<run> (<quantity>)``).
    """
    from analysis.battery.stance import pearson_ci

    rows, by_item = [], per_item.add_prefix("humans_")
    for name, d in runs.items():
        for measure in per_item.columns:
            for quantity in HUMAN_VS[measure]:
                model = d.theta if quantity == "theta" else (None if d.dec is None else d.dec["z"])
                row: dict[str, Any] = {"run": name, "human": measure, "model": quantity}
                if model is None:
                    rows.append({**row, "note": f"run has no {quantity}"})
                    continue
                by_item[f"{name} ({quantity})"] = model.reindex(by_item.index)
                try:
                    r = pearson_ci(model, per_item[measure], n_boot=n_boot, seed=seed)
                    row.update(r=r.r, r_lo=r.lo, r_hi=r.hi, r2=r.r**2)
                except NotComputed as e:
                    row["note"] = str(e)
                mad, lo, hi, n = mad_ci(model, per_item[measure], n_boot=n_boot, seed=seed)
                rows.append({**row, "mean_abs_diff": mad, "mad_lo": lo, "mad_hi": hi, "n_items": n})
    table = pd.DataFrame(rows)
    for col in ("r", "r_lo", "r_hi", "r2", "mean_abs_diff", "mad_lo", "mad_hi", "n_items", "note"):
        if col not in table.columns:
            table[col] = np.nan if col != "note" else ""
    table["note"] = table["note"].fillna("")
    by_item.index.name = "item_id"
    return table, by_item


def human_sampling_se(h: pd.DataFrame) -> tuple[float, int] | None:
    """(mean binomial SE of 2 p_cbr - 1, rows with n) over the p_cbr rows that give n; None when none does."""
    if not ("p_cbr" in h["measure"].values and h["n"].notna().any()):
        return None
    pc = h[(h["measure"] == "p_cbr") & h["n"].notna()]
    p = (pc["value"] + 1) / 2
    return float((2 * np.sqrt(p * (1 - p) / pc["n"])).mean()), len(pc)


def framing_shift(h: pd.DataFrame, *, n_boot: int = N_BOOT, seed: int = SEED) -> pd.DataFrame:
    """Per measure and frame: mean over items of value(frame) - value(reference frame), with a bootstrap CI.

    The reference is the first frame in file order. Items without both frames are left out of that row.
    """
    rows = []
    for measure, m in h.groupby("measure", sort=False):
        frames = list(dict.fromkeys(m["frame"]))
        ref = frames[0]
        wide = m.pivot(index="item_id", columns="frame", values="value")
        for fr in frames[1:]:
            d = (wide[fr] - wide[ref]).dropna().to_numpy(float)
            if len(d) == 0:
                continue
            lo, hi = finite_ci(d[resample_index(len(d), n_boot, seed)].mean(axis=1))
            rows.append(
                {
                    "measure": measure,
                    "frame": fr,
                    "reference": ref,
                    "shift": float(d.mean()),
                    "lo": lo,
                    "hi": hi,
                    "n_items": len(d),
                }
            )
    return pd.DataFrame(rows, columns=["measure", "frame", "reference", "shift", "lo", "hi", "n_items"])


@dataclass(frozen=True)
class HumanAnchors:
    """The runs against the human anchors on the shared dilemmas (:func:`compute_anchors`)."""

    humans: pd.DataFrame
    """The human rows of the shared dilemmas (:func:`load_humans`)."""
    per_item: pd.DataFrame
    """Item x measure: their values on the stance axis (:func:`humans_per_item`)."""
    table: pd.DataFrame
    """The agreement of every run's quantities with them (:func:`humans_agreement`)."""
    by_item: pd.DataFrame
    noise: tuple[float, int] | None
    """(mean binomial SE, rows with n) (:func:`human_sampling_se`)."""
    left_out: list[str]
    """Human items not shared by every run."""
    shift: pd.DataFrame | None
    """The framing shift of the human sample (:func:`framing_shift`); None without frames."""


def compute_anchors(c: Context) -> Part[HumanAnchors]:
    """The human table of the panel on the shared dilemmas, against every run; absent without one."""
    if c.panel.humans is None:
        return Part(absent="No human table in this panel (`--humans CSV` or `humans:` in the panel file).")
    assert c.humans is not None
    h = c.humans[c.humans["item_id"].isin(c.shared)]
    if h.empty:
        return Part(absent="None of the human items is among the shared dilemmas; check the item ids.")
    per_item = humans_per_item(h)
    table, by_item = humans_agreement(c.runs, per_item, n_boot=c.n_boot, seed=c.seed)
    left_out = sorted(set(c.humans["item_id"]) - set(c.shared))
    shift = framing_shift(h, n_boot=c.n_boot, seed=c.seed) if set(h["frame"]) - {""} else None
    return Part(HumanAnchors(h, per_item, table, by_item, human_sampling_se(h), left_out, shift))


# ------------------------------------------------------------------ logit vs sampled
def logit_sampled_pairs(runs: Sequence[RunData]) -> list[tuple[RunData, RunData]]:
    """(readout run, sampled-only run) pairs of one model and reasoning flag that share trials.

    Each sampled-only run is paired with the first readout run of the same
    model and reasoning flag (in panel order) that has trial ids in common.
    """
    pairs = []
    for s in runs:
        if s.has_readouts or not s.has_samples:
            continue
        ids = set(s.per_trial["trial_id"])
        for r in runs:
            same = r.run.model == s.run.model and r.run.reasoning == s.run.reasoning
            if r is not s and r.has_readouts and same and ids & set(r.per_trial["trial_id"]):
                pairs.append((r, s))
                break
    return pairs


def cell_quantities(options: pd.DataFrame, per_trial: pd.DataFrame, source: str) -> pd.DataFrame:
    """Per item: z, lexical and order of the yes/no verb flip, and theta where graded trials are present."""
    from analysis.battery import stance
    from analysis.battery.yesno import decompose

    parts = []
    with contextlib.suppress(NotComputed):
        parts.append(
            decompose(verbflip_cells(per_trial, options, battery="instrument" in per_trial.columns))[
                ["z", "lexical", "order"]
            ]
        )
    if "instrument" in per_trial.columns:
        g = per_trial[per_trial["instrument"] == "graded"]
        if len(g):
            try:
                gt = stance.graded_trials(options[options["trial_id"].isin(g["trial_id"])], g, source)  # type: ignore[arg-type]
                parts.append(stance.theta(stance.per_form(gt, replicates="pooled")).to_frame())
            except NotComputed:
                pass
    if not parts:
        raise NotComputed("neither Yes/No verb-flip cells nor graded trials among the matched trials")
    return pd.concat(parts, axis=1)


def logit_sampled_rows(r: RunData, s: RunData) -> tuple[dict[str, Any], pd.DataFrame]:
    """The readout temperature of (readout run r, sampled run s) and the agreement of the cell-level quantities."""
    from analysis.battery.calibration import calibrate

    tau = (s.opened.manifest.plan or Plan()).temperature  # no plan: Plan's default
    if not tau > 0:
        raise NotComputed(f"run {s.name!r} sampled greedily (temperature {tau:g}): no temperature to fit")
    ids = sorted(set(r.per_trial["trial_id"]) & set(s.per_trial["trial_id"]))
    if not ids:
        raise NotComputed(f"runs {r.name!r} and {s.name!r} share no trial id; were they run with the same spec?")
    keep = set(ids)
    samples = _samples(s.opened)
    sopts, sper = _count(samples[samples["trial_id"].isin(keep)], s.opened.trial_list)
    ropts, rper = r.options[r.options["trial_id"].isin(keep)], r.per_trial[r.per_trial["trial_id"].isin(keep)]
    ro = r.opened.load("readout_options")
    meaning = "cbr" if "cbr" in set(sopts["meaning"]) else None
    cal = calibrate(ro[ro["trial_id"].isin(keep)], sopts, tau=tau, meaning=meaning)
    head = {
        "readout_run": r.name,
        "sampled_run": s.name,
        "model": r.run.model,
        "tau": tau,
        "T": cal.T,
        "T_lo": cal.T_lo,
        "T_hi": cal.T_hi,
        "r_trial": cal.r,
        "mad_trial": cal.mad,
        "mad_trial_tempered": cal.mad_tempered,
        "n_trials": len(ids),
        "n_samples": cal.n_samples,
    }
    qa = cell_quantities(ropts, rper, "readout")
    qb = cell_quantities(sopts, sper, "samples")
    rows = []
    for q in [c for c in qa.columns if c in qb.columns]:
        df = pd.concat([qa[q].rename("a"), qb[q].rename("b")], axis=1, join="inner").dropna()
        ok = len(df) >= 3 and df["a"].std() > 0 and df["b"].std() > 0
        rows.append(
            {
                "readout_run": r.name,
                "sampled_run": s.name,
                "quantity": q,
                "r": float(np.corrcoef(df["a"], df["b"])[0, 1]) if ok else float("nan"),
                "mean_abs_diff": float((df["a"] - df["b"]).abs().mean()) if len(df) else float("nan"),
                "mean_readout": float(df["a"].mean()),
                "mean_sampled": float(df["b"].mean()),
                "n_items": len(df),
            }
        )
    return head, pd.DataFrame(rows)


@dataclass(frozen=True)
class LogitSampled:
    """Readout runs against their sampled-only twins (:func:`compute_logit_sampled`)."""

    heads: pd.DataFrame | None
    """Per pair: the readout temperature and the trial-level agreement; None when no pair could be computed."""
    cells: pd.DataFrame | None
    """Per pair and quantity: the agreement of the cell-level quantities."""
    skipped: tuple[tuple[str, str, str], ...]
    """(readout run, sampled run, why) of the pairs not computed."""


def compute_logit_sampled(runs: Sequence[RunData]) -> Part[LogitSampled]:
    """:func:`logit_sampled_rows` of every (readout run, sampled-only run) pair (:func:`logit_sampled_pairs`)."""
    pairs = logit_sampled_pairs(runs)
    if not pairs:
        return Part(
            absent="No pair of a readout run and a sampled-only run (`--no-readout --samples N`) of the same model "
            "and reasoning flag with common trials (a run with both readouts and samples has this in its own report)."
        )
    heads, cells, skipped = [], [], []
    for r, s in pairs:
        try:
            head, q = logit_sampled_rows(r, s)
        except NotComputed as e:
            skipped.append((r.name, s.name, str(e)))
            continue
        heads.append(head)
        cells.append(q)
    if not heads:
        return Part(LogitSampled(None, None, tuple(skipped)))
    return Part(LogitSampled(pd.DataFrame(heads), pd.concat(cells, ignore_index=True), tuple(skipped)))


# ------------------------------------------------------------------ contexts
def panel_context(panel: Panel, *, n_boot: int, seed: int) -> Context:
    """The runs of a battery panel, loaded, matched on their shared dilemmas and computed there (:func:`compute_run`),
    with every part of the comparison.

    With a human table in the panel, its values are read (:func:`load_humans`) and its items outside the
    shared dilemmas added to the dropped table (run ``humans``).
    """
    runs = {r.name: load_run(r) for r in panel.runs}
    shared, dropped = shared_items(panel, {n: d.items for n, d in runs.items()})
    if not shared:
        raise ValueError(f"the runs share no dilemma; item counts: { {n: len(d.items) for n, d in runs.items()} }")
    runs = {name: compute_run(d, shared, n_boot=n_boot, seed=seed) for name, d in runs.items()}
    humans = None
    if panel.humans is not None:
        humans = load_humans(panel.humans)
        extra = sorted(set(humans["item_id"]) - set(shared))
        if extra:
            more = pd.DataFrame(
                {"run": "humans", "item_id": extra, "reason": "human item not in every run (or unknown id)"}
            )
            dropped = pd.concat([dropped, more], ignore_index=True)
    agreement: Part[ThetaAgreement]
    try:
        agreement = Part(theta_agreement(panel, runs, theta_table(runs, shared).dropna(), humans))
    except NotComputed as e:  # the agreement part says why
        agreement = Part(error=e)
    c = Context(panel, runs, shared, dropped, n_boot, seed, humans, agreement)
    return replace(
        c,
        models=models_table(c),
        human_values=humans_per_item(humans) if humans is not None and len(humans) else None,
        deliberation=attempt(compute_deliberation, c),
        anchors=attempt(compute_anchors, c),
        logit_sampled=attempt(compute_logit_sampled, list(runs.values())),
        planted=planted_r2(c),
        layers=layer_profiles(runs, shared, n_boot=n_boot, seed=seed),
    )


def layer_profiles(runs: Mapping[str, RunData], shared: Sequence[str], *, n_boot: int, seed: int) -> dict[str, Any]:
    """Each readout run's layer profile (:func:`analysis.battery.layers.layer_profile`) on the shared items, for
    the runs made with ``--layers``; a run whose profile cannot be computed is left out."""
    from analysis.battery.layers import layer_profile
    from analysis.battery.results import counterbalanced_pairs

    out = {}
    for name, d in runs.items():
        layers = d.opened.load("readout_layers") if d.source == "readout" else pd.DataFrame()
        if layers.empty:
            continue
        per = d.per_trial[d.per_trial["item_id"].isin(shared)]
        pairs = counterbalanced_pairs(d.opened.manifest) if "instrument" in per else set()
        with contextlib.suppress(NotComputed):
            out[name] = layer_profile(d.options, per, layers, d.source, pairs, n_boot=n_boot, seed=seed)
    return out


def yesno_context(panel: Panel, *, n_boot: int, seed: int) -> Context:
    """The runs of a yes/no panel, loaded, matched on their shared dilemmas, with their cells and decomposition there,
    the agreement of z and the readout runs against their sampled twins.

    Each run's ``dec`` is its decomposition on the shared dilemmas; when the cells cannot be computed for every run,
    no run has one and the cells part says why.
    """
    runs = {r.name: load_run(r) for r in panel.runs}
    shared, dropped = shared_items(panel, {n: d.items for n, d in runs.items()})
    if not shared:
        raise ValueError("the runs share no dilemma")
    cells: Part[YesNoCells]
    try:
        cells = Part(yesno_cells(runs, shared))
    except NotComputed as e:  # the cells part says why
        cells = Part(error=e)
    else:
        decomposition = ["z", "lexical", "order", "apparent"]
        long = cells.get().long
        runs = {n: replace(d, dec=long[long["run"] == n].set_index("item_id")[decomposition]) for n, d in runs.items()}
    return Context(
        panel,
        runs,
        shared,
        dropped,
        n_boot=n_boot,
        seed=seed,
        yesno=cells,
        logit_sampled=attempt(compute_logit_sampled, list(runs.values())),
        z_agreement=attempt(compute_z_agreement, runs),
        layers=layer_profiles(runs, shared, n_boot=n_boot, seed=seed),
    )


@dataclass(frozen=True)
class ZAgreement:
    """The agreement of the story stance z across the runs of a yes/no panel (:func:`compute_z_agreement`)."""

    z: pd.DataFrame
    """Item x run z, items with z in every run."""
    r2: pd.DataFrame
    """r^2 of z between runs, index ``run``."""
    consensus: pd.DataFrame
    """Per item (index ``item_id``): the mean z over the runs and the disagreement."""
    per_run: pd.DataFrame


def compute_z_agreement(runs: dict[str, RunData]) -> Part[ZAgreement]:
    """:func:`agreement` of z (item x run) with the consensus of every run."""
    z = pd.DataFrame({n: d.dec["z"] for n, d in runs.items() if d.dec is not None}).dropna()
    r, cons, per_run = agreement(z)
    return Part(ZAgreement(z, (r**2).rename_axis("run"), cons.rename_axis("item_id"), per_run))


@dataclass(frozen=True)
class YesNoCells:
    """The yes/no verb-flip cells and their decomposition on the shared dilemmas, per run (:func:`yesno_cells`)."""

    table: pd.DataFrame
    """Per run (index ``run``): model, reasoning, source and the means over items of z, order, lexical, apparent."""
    long: pd.DataFrame
    """One row per (run, item): the four cells' P(CBR) joined with the decomposition."""


def yesno_cells(runs: dict[str, RunData], shared: Sequence[str]) -> YesNoCells:
    """(per-run means, per item and run) of the yes/no verb-flip cells and their decomposition on the shared items.

    Per run (index ``run``): model, reasoning, source and the means over items
    of z, order, lexical, apparent. Long: one row per (run, item), the four
    cells' P(CBR) joined with the decomposition.
    """
    from analysis.battery.yesno import decompose

    parts: list[pd.DataFrame] = []
    summary: dict[str, dict[str, Any]] = {}
    for name, d in runs.items():
        per = d.per_trial[d.per_trial["item_id"].isin(shared)]
        cells = verbflip_cells(per, d.options, battery=False)
        dec = decompose(cells)
        parts.append(cells.join(dec).assign(run=name).reset_index())
        summary[name] = {"model": d.run.model, "reasoning": "on" if d.run.reasoning else "off", "source": d.source}
        summary[name].update({k: float(dec[k].mean()) for k in ("z", "order", "lexical", "apparent")})
    table = pd.DataFrame.from_dict(summary, orient="index")
    table.index.name = "run"
    return YesNoCells(table, pd.concat(parts, ignore_index=True))
