"""``probe compare`` for the crossed-frame battery (paper 003) and the plain yes/no battery.

One report across the runs of a panel (``docs/panels.md``): the runs are
matched on the items they all hold, every per-run quantity is recomputed on
those shared items (so G, the decomposition and (s, m) describe the same item
set in every column), and then:

* **models side by side**: theta with its incoherence sigma_repro, G (with a
  bootstrap CI over items), the yes/no decomposition (order / lexical /
  apparent) with the logical (label-map) pull, (s, m) per channel and the
  joint (s, m) fit per label family;
* **agreement of the item ordering**: the pairwise r^2 matrix of theta, a
  consensus ordering (mean over runs of theta standardized within each run),
  the outlier items (largest spread of standardized theta across runs) and the
  outlier models (lowest mean r with the others);
* **deliberation**: for each (reasoning off, reasoning on) pair of one model,
  paired item-bootstrap differences (off - on, the paper's sign) of mean sigma_repro, G, |m| and
  s per channel and of the joint fit (every resample redraws the same items
  for both runs and refits both);
* **human anchors** from a user CSV (:func:`load_humans`), beside the models,
  with the model-human agreement and the human framing shift;
* **logit vs sampled**: a readout run and a sampled-only run of one model,
  matched per trial: the readout temperature (:mod:`analysis.battery.calibration`)
  and the agreement of the cell-level quantities.

A section that cannot be computed says why; the others still run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.bootstrap import finite_ci, resample_index
from analysis.common.figures import pyplot, save_figure
from analysis.common.report import (
    Section,
    dropped_md,
    panel_md,
    report_files,
    run_sections,
    write_dropped,
    write_summary,
)
from analysis.common.tables import md_table
from probe.errors import ProbeError
from probe.files import atomic_write_text
from probe.panel import Panel, PanelRun, shared_items
from probe.store import RunStore

N_BOOT = 2000
SEED = 0
LEVEL = 0.95
N_OUTLIERS = 5
CHANNELS = ("order", "lexical", "logic", "label")


# ------------------------------------------------------------------ per run
@dataclass
class RunData:
    """What the comparison reads from one run (all items), and what it computed on the shared items."""

    run: PanelRun
    items: list[str]
    source: str
    """``readout`` or ``samples``: where the option probabilities come from."""
    options: pd.DataFrame
    per_trial: pd.DataFrame
    manifest: dict[str, Any]
    store: RunStore
    trial_list: list[Any]
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
    from analysis.common.frames import readouts

    store = run.store()
    trials = store.trials()
    has_readouts = not store.load("readout_options").empty
    samples = _samples(store)
    if has_readouts:  # the same choice as analysis.common.frames.choice_probs: readouts when the run has them
        opts, per_trial = readouts(store)
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
        manifest=store.manifest(),
        store=store,
        trial_list=trials,
        has_readouts=has_readouts,
        has_samples=not samples.empty,
    )


def _samples(store: RunStore) -> pd.DataFrame:
    """The run's samples, trial ids as plain Python strings (fast set membership)."""
    s = store.load("samples")
    return s.astype({"trial_id": object}) if not s.empty else s


def _count(samples: pd.DataFrame, trials: Sequence[Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    from analysis.common.frames import count_samples

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
            raise ValueError("no instrument factor: not a battery run")
        b = per_trial[per_trial["instrument"] == "binary"]
        b = b[b["labels"] == "Yes/No"] if "labels" in b.columns else b.iloc[0:0]
        if b.empty:
            raise ValueError("no Yes/No forced-binary trials (instrument binary, labels Yes/No)")
        b = b.assign(cbr_verb=b["verb"])
    else:
        b = with_cbr_verb(per_trial, options)
    return cell_table(b, p_cbr(options[options["trial_id"].isin(b["trial_id"])]))


def compute_run(d: RunData, items: Sequence[str], *, n_boot: int = N_BOOT, seed: int = SEED) -> RunData:
    """Fill in theta / incoherence, the decomposition, the logical pull and (s, m) on ``items`` only."""
    from analysis.battery import fit, stance
    from analysis.battery.binary import cell_events, incomplete_stories, projections
    from analysis.battery.yesno import decompose

    keep = set(items)
    per = d.per_trial[d.per_trial["item_id"].isin(keep)]
    opts = d.options[d.options["trial_id"].isin(per["trial_id"])]
    try:
        g = per[per["instrument"] == "graded"] if "instrument" in per.columns else per.iloc[0:0]
        if g.empty:
            raise ValueError("no graded (I-1) trials in this run")
        gt = stance.graded_trials(opts[opts["trial_id"].isin(g["trial_id"])], g, d.source)  # type: ignore[arg-type]
        d.inc = stance.incoherence(stance.per_form(gt))
    except ValueError as e:
        d.why["theta"] = str(e)
    try:
        d.dec = decompose(verbflip_cells(per, opts, battery="instrument" in per.columns)).loc[
            lambda df: df.index.isin(keep)
        ]
    except ValueError as e:
        d.why["decomposition"] = str(e)
    try:
        d.bt = fit.binary_trials(opts, per)
    except ValueError as e:
        d.why["binary"] = str(e)
    arb = per[(per["family"] == "arbitrary") & (per["replicate"] == 0)] if "family" in per.columns else per.iloc[0:0]
    if len(arb):
        events = cell_events(arb, opts)
        d.dropped += list(incomplete_stories(events))
        d.logic = projections(events, set()).groupby("labels")["logic"].mean()
    else:
        d.why["logic"] = "no arbitrary label pairs (A/B, 1/2, ...) in this run"
    if d.theta is not None and d.bt is not None:
        try:
            fits, d.unfitted = fit.fit_each_channel(d.theta, d.bt, n_boot=n_boot, seed=seed)
            d.fits = fits.set_index("channel") if len(fits) else None
            if d.fits is None:
                d.why["fit"] = "no channel could be fitted"
            for ch in [*(fits["channel"] if len(fits) else []), *(u.channel for u in d.unfitted)]:
                with contextlib.suppress(ValueError):
                    d.dropped += list(fit.dropped_items(d.bt, str(ch)))
        except ValueError as e:
            d.why["fit"] = str(e)
        joint = fit.fit_joints(d.theta, d.bt, n_boot=n_boot, seed=seed)
        d.joint = joint if len(joint) else None
    else:
        d.why.setdefault("fit", "needs the graded and the binary instruments")
    return d


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

    def num(row: int, col: str, text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise HumanTableError(f"{p}, row {row} (line {row + 1}), column {col}: not a number: {text!r}") from None
        if not np.isfinite(v):
            raise HumanTableError(f"{p}, row {row} (line {row + 1}), column {col}: must be finite, got {text!r}")
        return v

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
            v = num(k, "p_cbr", rec["p_cbr"])
            if not 0 <= v <= 1:
                raise HumanTableError(f"{where}, column p_cbr: a choice rate must lie in [0, 1], got {v:g}")
            n = float("nan")
            if "n" in raw.columns and str(rec["n"]).strip():
                n = num(k, "n", rec["n"])
                if n < 1 or n != int(n):
                    raise HumanTableError(f"{where}, column n: must be a whole number >= 1, got {rec['n']!r}")
            rows.append({"item_id": item, "frame": frame, "measure": "p_cbr", "raw": v, "value": 2 * v - 1, "n": n})
            found = True
        if "rating" in raw.columns and str(rec["rating"]).strip():
            v = num(k, "rating", rec["rating"])
            lo, hi = num(k, "rating_lo", rec["rating_lo"]), num(k, "rating_hi", rec["rating_hi"])
            if not lo < hi:
                raise HumanTableError(f"{where}, columns rating_lo/rating_hi: need lo < hi, got {lo:g} and {hi:g}")
            if not lo <= v <= hi:
                raise HumanTableError(f"{where}, column rating: {v:g} lies outside its scale [{lo:g}, {hi:g}]")
            a = (v - lo) / (hi - lo)
            rows.append(
                {"item_id": item, "frame": frame, "measure": "rating", "raw": v, "value": 2 * a - 1, "n": np.nan}
            )
            found = True
        if not found:
            raise HumanTableError(f"{where}: neither p_cbr nor rating has a value")
    return pd.DataFrame(rows, columns=["item_id", "frame", "measure", "raw", "value", "n"])


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
        raise ValueError(f"agreement needs at least two runs with theta, got {theta.shape[1]}")
    if theta.shape[0] < 3:
        raise ValueError(f"agreement needs at least 3 shared items with theta, got {theta.shape[0]}")
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


# ------------------------------------------------------------------ the comparison
@dataclass
class Context:
    panel: Panel
    runs: dict[str, RunData]
    shared: list[str]
    dropped: pd.DataFrame
    n_boot: int = N_BOOT
    seed: int = SEED
    humans: pd.DataFrame | None = None
    results: dict[str, Any] = field(default_factory=dict)

    def theta_table(self) -> pd.DataFrame:
        cols = {n: d.theta for n, d in self.runs.items() if d.theta is not None}
        return pd.DataFrame(cols).reindex(self.shared).dropna(how="all")


def _csv(df: pd.DataFrame, path: Path, index: bool = True) -> Path:
    atomic_write_text(path, df.to_csv(index=index, float_format="%.6f"))
    return path


def matching_section(c: Context, out: Path) -> Section:
    write_dropped(c.dropped, out)
    lines = [
        *panel_md(c.panel),
        "",
        *dropped_md(c.dropped[c.dropped["run"] != "humans"], len(c.shared), "dilemmas"),
    ]
    return Section("Panel and item matching", lines, [out / "dropped_items.csv"])


def models_section(c: Context, out: Path) -> Section:
    """Per run on the shared items: stance, incoherence, G (with CI), decomposition and the logical pull."""
    from analysis.battery import stance

    rows, files = {}, []
    long = []
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
            with contextlib.suppress(ValueError):
                pooled = stance.pooled_incoherence(d.inc)
                row |= pooled.pick("sigma_repro", "sigma_dir", "sigma_scale", "sigma_repeat", "sigma_tot")
            if len(inc) >= 2:
                idx = resample_index(len(inc), c.n_boot, c.seed)
                row["G"] = float(g_of(th, sg))
                row["G_lo"], row["G_hi"] = finite_ci(g_of(th[idx], sg[idx]))
            long.append(d.inc.assign(run=name).reset_index())
        if d.dec is not None:
            for k in ("z", "order", "lexical", "apparent"):
                row[f"{k}"] = float(d.dec[k].mean())
        if d.logic is not None and "A/B" in d.logic.index:
            row["logic_AB"] = float(d.logic["A/B"])
        rows[name] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "run"
    files.append(_csv(table, out / "models.csv"))
    lines = [
        f"Every quantity on the {len(c.shared)} shared dilemmas. theta: mean signed stance over the unipolar graded "
        "forms; sigma_repro: the per-model incoherence, the paper's headline (per-item variances pooled over "
        "dilemmas, then sqrt), split into sigma_dir and sigma_scale in quadrature, with sigma_repeat (the SD of one "
        "elicitation of a form: one draw in one context) and sigma_tot = sqrt(sigma_repro^2 + sigma_repeat^2); mean_sigma_repro: the mean of "
        "per-item sigma_repro (lower by Jensen's inequality; descriptive); G = Var_items(theta) / (Var_items(theta) "
        f"+ mean sigma_repro^2) with a {LEVEL:.0%} percentile bootstrap over items ({c.n_boot} resamples, seed "
        f"{c.seed}); z, order, lexical, apparent: the yes/no verb-flip decomposition, mean over items; logic_AB: "
        "the logical (verdict-attached) pull with the fully arbitrary A/B labels, on which the paper rests "
        "identification (every pair: the battery report's label map).",
        "",
        md_table(table.reset_index(), "{:+.3f}", nan="–"),
    ]
    missing = [f"- {n}: {k}: {why}" for n, d in c.runs.items() for k, why in d.why.items() if k != "fit"]
    if missing:
        lines += ["", "Not available:", *missing]
    if long:
        stance_long = pd.concat(long, ignore_index=True)
        cols = ["run", "item_id", "theta", "sigma_repro", "sigma_dir", "sigma_scale", "n_forms"]
        files.append(_csv(stance_long[cols], out / "stance_by_item.csv", index=False))
        wide = c.theta_table()
        if c.humans is not None and len(c.humans):
            hum = c.humans.groupby(["item_id", "measure"])["value"].mean().unstack("measure")
            for m in hum.columns:
                wide[f"humans ({m})"] = hum[m].reindex(wide.index)
        wide.index.name = "item_id"
        files.append(_csv(wide, out / "theta_by_model.csv"))
        files.append(_stance_figure(c, out / "fig_stance_models.png"))
    decs = [d.dec.assign(run=n).reset_index() for n, d in c.runs.items() if d.dec is not None]
    if decs:
        dec = pd.concat(decs, ignore_index=True)
        files.append(_csv(dec, out / "decomposition_by_item.csv", index=False))
        files.append(_decomposition_figure(c, out / "fig_decomposition_models.png"))
    return Section("Models side by side: stance, incoherence, G, decomposition", lines, files)


def fits_section(c: Context, out: Path) -> Section:
    rows = []
    for name, d in c.runs.items():
        if d.fits is None:
            continue
        for ch, f in d.fits.iterrows():
            rows.append({"run": name, "channel": ch, **{k: f[k] for k in ("s", "s_lo", "s_hi", "m", "m_lo", "m_hi")}})
            rows[-1].update(r2=f["r2"], n_items=int(f["n_items"]), clip_limited="yes" if f["clip_limited"] else "no")
    if not rows:
        why = "; ".join(f"{n}: {d.why.get('fit', '?')}" for n, d in c.runs.items())
        per_channel = [f"- {n}: {u.channel}: {u.why}" for n, d in c.runs.items() for u in d.unfitted]
        return Section(
            "Framing susceptibility m and decisiveness s", [f"No run could be fitted ({why}).", *per_channel], []
        )
    table = pd.DataFrame(rows)
    files = [_csv(table, out / "fit_sm.csv", index=False), _fit_figure(table, out / "fig_sm_models.png")]
    lines = [
        "Per run and channel, the joint fit of p+ = sigmoid((theta + m)/s), p- = sigmoid((theta - m)/s) on the shared "
        f"items (theta from I-1 of the same run); {LEVEL:.0%} percentile bootstrap over items ({c.n_boot} resamples, "
        f"seed {c.seed}). clip_limited: read only the ranking of m.",
        "",
        md_table(table, "{:+.3f}", nan="–"),
    ]
    skipped = [f"- {n}: {d.why['fit']}" for n, d in c.runs.items() if d.fits is None and "fit" in d.why]
    skipped += [f"- {n}: {u.channel}: {u.why}" for n, d in c.runs.items() for u in d.unfitted]
    if skipped:
        lines += ["", "Not fitted:", *skipped]
    joints = [d.joint.assign(run=n) for n, d in c.runs.items() if d.joint is not None]
    if joints:
        joint = pd.concat(joints, ignore_index=True)
        cols = ["run", "family", "channel", "s", "s_lo", "s_hi", "m", "m_lo", "m_hi", "r2", "n_items", "n_cells"]
        joint = joint.reindex(columns=[*cols, "clip_limited", "note"])
        files.append(_csv(joint, out / "fit_joint.csv", index=False))
        show = joint.copy()
        show["clip_limited"] = show["clip_limited"].map({True: "yes", False: "no"}).fillna("")
        show["note"] = show["note"].fillna("")
        for col in ("n_items", "n_cells"):
            show[col] = show[col].map(lambda v: "" if pd.isna(v) else str(int(v)))
        if not (show["note"] != "").any():
            show = show.drop(columns=["note"])
        lines += [
            "",
            "Joint fit per run and label family: P(CBR) of every design cell = sigmoid((theta + sum_c m_c sgn_c) / s), "
            "one s for all channels of the family, each m adjusted for the others (same loss, bootstrap and seed). The "
            "per-channel s above averages each side over the other channels' offsets and so reads high when another "
            "channel has one; the joint s does not.",
            "",
            md_table(show, "{:+.3f}", nan="–"),
        ]
    return Section("Framing susceptibility m and decisiveness s", lines, files)


def dropped_stories_section(c: Context, out: Path) -> Section:
    """Per run: the shared stories a table left out for an empty design cell (label map, (s, m) fit), and why."""
    rows = [
        {"run": n, "dilemma": x.item_id, "table": x.analysis, "reason": x.reason}
        for n, d in c.runs.items()
        for x in d.dropped
    ]
    if not rows:
        return Section("Dropped stories", [], [])
    table = pd.DataFrame(rows).drop_duplicates().sort_values(["run", "dilemma", "table"], kind="stable")
    files = [_csv(table, out / "dropped_stories.csv", index=False)]
    lines = [
        "Stories left out of a table because a design cell had no usable answer (every draw refused or "
        "unparsable): averaging the surviving cells would leak the story's stance into the bias. The runs are "
        "still matched on the shared dilemmas; these stories are missing from the named table only.",
        "",
        *(f"- {r.run}: {r.dilemma}, {r.table}: {r.reason}" for r in table.itertuples()),
    ]
    return Section("Dropped stories", lines, files)


def agreement_section(c: Context, out: Path) -> Section:
    theta = c.theta_table().dropna()
    reference, rule = consensus_reference(c.panel, c.runs, list(theta.columns))
    r, cons, per_run = agreement(theta, reference)
    r2 = r**2
    r2.index.name = "run"
    cons.index.name = "item_id"
    files = [
        _csv(r2, out / "agreement_r2.csv"),
        _csv(r.rename_axis("run"), out / "agreement_r.csv"),
        _csv(cons, out / "consensus.csv"),
        _csv(per_run, out / "agreement_models.csv"),
        _heatmap(r2, out / "fig_agreement_r2.png"),
    ]
    c.results["consensus"] = cons["consensus"]
    human = None
    if c.humans is not None and len(c.humans):
        per_measure = c.humans.groupby(["item_id", "measure"])["value"].mean().unstack("measure")
        human = per_measure["p_cbr"] if "p_cbr" in per_measure.columns else per_measure.iloc[:, 0]
    s2_runs, s2_groups = mean_r2_summary(theta, reference, human)
    files += [_csv(s2_runs, out / "agreement_r2_by_run.csv"), _csv(s2_groups, out / "agreement_r2_summary.csv")]
    top = cons.sort_values("disagreement", ascending=False).head(N_OUTLIERS)
    worst = per_run.sort_values("mean_r_with_others")
    lines = [
        f"Pearson r^2 of theta between runs over the {len(theta)} shared dilemmas with theta in every run "
        "(`agreement_r.csv` keeps the sign):",
        "",
        md_table(r2.reset_index(), "{:.3f}", nan="–"),
        "",
        f"Consensus ordering: the raw mean theta over the reference runs ({', '.join(reference)}: {rule}), as "
        "the paper's frontier-mean consensus; rank 1 = most cost-benefit. Disagreement: the SD across all runs of "
        "theta standardized within each run (`consensus.csv` has every item).",
        "",
        "Outlier items (largest disagreement):",
        "",
        md_table(top[["rank", "consensus", "disagreement"]].reset_index(), "{:+.3f}", nan="–"),
        "",
        "Outlier models (lowest mean r with the other runs first); consensus_r2: the consensus-alignment r^2 "
        "(leave-one-out for a reference run):",
        "",
        md_table(worst.reset_index(), "{:+.3f}", nan="–"),
        "",
        "Mean r^2 summaries (the paper's Table S2; descriptive, no CI): mean pairwise r^2 of per-item theta within "
        "the reference set and with the human anchor (human 2P - 1 where given, else the rating), and the same for "
        "the runs outside the set; per run in `agreement_r2_by_run.csv`:",
        "",
        md_table(s2_groups.reset_index(), "{:.3f}", nan="–"),
    ]
    return Section("Agreement of the item ordering across runs", lines, files)


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
    from analysis.battery import fit

    if off.inc is None or on.inc is None:
        raise ValueError("needs theta and sigma_repro (the graded instrument) in both runs")
    a = off.inc[["theta", "sigma_repro"]].dropna()
    b = on.inc[["theta", "sigma_repro"]].dropna()
    items = [i for i in a.index if i in b.index]
    if len(items) < 3:
        raise ValueError(f"needs at least 3 items with theta in both runs, got {len(items)}")
    rows = []

    def add(q: str, ch: str, v_off: float, v_on: float, on_minus_off: np.ndarray, n: int) -> None:
        d_boot = -on_minus_off  # reported off - on, as the paper writes it
        lo, hi = finite_ci(d_boot)
        rows.append(
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

    sa, sb = a.loc[items, "sigma_repro"].to_numpy(float), b.loc[items, "sigma_repro"].to_numpy(float)
    ta, tb = a.loc[items, "theta"].to_numpy(float), b.loc[items, "theta"].to_numpy(float)
    idx = resample_index(len(items), n_boot, seed)
    add("sigma_repro", "", float(sa.mean()), float(sb.mean()), sb[idx].mean(1) - sa[idx].mean(1), len(items))
    add("G", "", float(g_of(ta, sa)), float(g_of(tb, sb)), g_of(tb[idx], sb[idx]) - g_of(ta[idx], sa[idx]), len(items))
    if off.bt is None or on.bt is None:
        return pd.DataFrame(rows)
    for ch in CHANNELS:
        try:
            sides_a, sides_b = fit.channel_sides(off.bt, ch), fit.channel_sides(on.bt, ch)
        except ValueError:
            continue
        common = [i for i in items if i in sides_a.index and i in sides_b.index]
        if len(common) < 3:
            continue
        arrays = []
        for inc, sides in ((a, sides_a), (b, sides_b)):
            th = inc.loc[common, "theta"].to_numpy(float)
            pp, pm = sides.loc[common, "p_plus"].to_numpy(float), sides.loc[common, "p_minus"].to_numpy(float)
            point = fit.fit_channel(inc.loc[common, "theta"], sides.loc[common], n_boot=0)
            boots = _boot_fit(th, pp, pm, resample_index(len(common), n_boot, seed), (point.s, point.m))
            arrays.append((point, boots))
        (pa, ba), (pb, bb) = arrays
        n = len(common)
        add("abs_m", ch, abs(pa.m), abs(pb.m), np.abs(bb[:, 1]) - np.abs(ba[:, 1]), n)
        add("m", ch, pa.m, pb.m, bb[:, 1] - ba[:, 1], n)
        add("s", ch, pa.s, pb.s, bb[:, 0] - ba[:, 0], n)
    for fam in fit.JOINT_CHANNELS:
        try:
            ja = fit.joint_cells(a.loc[items, "theta"], off.bt, fam)
            jb = fit.joint_cells(b.loc[items, "theta"], on.bt, fam)
        except ValueError:
            continue
        common = [i for i in items if i in ja.items and i in jb.items]
        if len(common) < 3 or ja.channels != jb.channels:
            continue
        joint = []
        for data in (ja.subset(common), jb.subset(common)):
            jfit = fit.fit_joint_data(data, n_boot=0)
            jboots, ok = fit.refit_joint_resamples(
                data, resample_index(len(common), n_boot, seed), np.array([jfit.s, *jfit.m])
            )
            jboots[~ok] = np.nan
            joint.append((jfit, jboots))
        (pa_j, ba_j), (pb_j, bb_j) = joint
        n = len(common)
        add("s", f"joint:{fam}", pa_j.s, pb_j.s, bb_j[:, 0] - ba_j[:, 0], n)
        for k, ch in enumerate(ja.channels, start=1):
            m_a, m_b = pa_j.m[k - 1], pb_j.m[k - 1]
            add("abs_m", f"joint:{fam}:{ch}", abs(m_a), abs(m_b), np.abs(bb_j[:, k]) - np.abs(ba_j[:, k]), n)
            add("m", f"joint:{fam}:{ch}", m_a, m_b, bb_j[:, k] - ba_j[:, k], n)
    return pd.DataFrame(rows)


def deliberation_section(c: Context, out: Path) -> Section:
    pairs = c.panel.reasoning_pairs()
    if not pairs:
        return Section(
            "Deliberation: reasoning off - on",
            [
                "No model has both a reasoning-off and a reasoning-on run in this panel (give `model:` and "
                "`reasoning:` in a panel file to pair runs)."
            ],
            [],
        )
    tables, lines = [], []
    for off, on in pairs:
        try:
            t = deliberation_table(c.runs[off.name], c.runs[on.name], n_boot=c.n_boot, seed=c.seed)
        except ValueError as e:
            lines.append(f"- {off.model}: {off.name} vs {on.name}: not computed: {e}")
            continue
        tables.append(t.assign(model=off.model, off_run=off.name, on_run=on.name))
    files = []
    if tables:
        table = pd.concat(tables, ignore_index=True)
        cols = ["model", "off_run", "on_run", "quantity", "channel", "off", "on", "off_minus_on", "lo", "hi"]
        cols.append("excludes_0")
        table = table[[*cols, "n_items", "n_boot_ok"]]
        files = [_csv(table, out / "deliberation.csv", index=False), _deliberation_figure(table, out)]
        show = table.drop(columns=["off_run", "on_run", "n_boot_ok"]).copy()
        show["excludes_0"] = show["excludes_0"].map({True: "yes", False: "no"})
        lines = [
            "Per model, reasoning off minus on (the paper's sign; positive = smaller with reasoning on) on the "
            "items both runs hold: mean sigma_repro (incoherence), G, "
            "per channel abs_m = |m|, m and s, and the joint fit per label family (s: channel joint:<family>; abs_m "
            f"and m: joint:<family>:<channel>). CIs: {LEVEL:.0%} percentile bootstrap over items ({c.n_boot} "
            f"resamples, seed {c.seed}); each resample draws the same items for both runs and refits (s, m) in both, "
            "so the difference is paired. The per-channel s absorbs the other channels' offsets (each side averages "
            "over them), so a change of s that shows per channel but not in the joint s is that artefact (e.g. a "
            "smaller m_order making the lexical s look smaller), not a change of decisiveness.",
            "",
            md_table(show, "{:+.3f}", nan="–"),
            *(["", *lines] if lines else []),
        ]
    return Section("Deliberation: reasoning off - on", lines, files)


# ------------------------------------------------------------------ humans
HUMAN_VS: dict[str, tuple[str, ...]] = {"rating": ("theta",), "p_cbr": ("theta", "z")}
"""Which model quantities a human measure is compared with. The paper's anchor (Fig. 1a, "r^2 of per-item
theta ... frontier-human") sets the human choice rate, as 2 P - 1, beside the model's graded theta: first row.
A choice rate is also shown against the forced-binary story stance z = mean(2 P(CBR) - 1) (both choice
rates), as a second, labelled row; a rating is compared with theta."""


def humans_section(c: Context, out: Path) -> Section:
    title = "Human anchors"
    if c.panel.humans is None:
        return Section(title, ["No human table in this panel (`--humans CSV` or `humans:` in the panel file)."], [])
    h = c.humans
    assert h is not None
    h = h[h["item_id"].isin(c.shared)]
    if h.empty:
        return Section(title, ["None of the human items is among the shared dilemmas; check the item ids."], [])
    per_item = h.groupby(["item_id", "measure"])["value"].mean().unstack("measure")
    rows, by_item = [], per_item.add_prefix("humans_")
    for name, d in c.runs.items():
        for measure in per_item.columns:
            for quantity in HUMAN_VS[measure]:
                model = d.theta if quantity == "theta" else (None if d.dec is None else d.dec["z"])
                row: dict[str, Any] = {"run": name, "human": measure, "model": quantity}
                if model is None:
                    rows.append({**row, "note": f"run has no {quantity}"})
                    continue
                by_item[f"{name} ({quantity})"] = model.reindex(by_item.index)
                try:
                    from analysis.battery.stance import pearson_ci

                    r = pearson_ci(model, per_item[measure], n_boot=c.n_boot, seed=c.seed)
                    row.update(r=r.r, r_lo=r.lo, r_hi=r.hi, r2=r.r**2)
                except ValueError as e:
                    row["note"] = str(e)
                mad, lo, hi, n = mad_ci(model, per_item[measure], n_boot=c.n_boot, seed=c.seed)
                rows.append({**row, "mean_abs_diff": mad, "mad_lo": lo, "mad_hi": hi, "n_items": n})
    table = pd.DataFrame(rows)
    for col in ("r", "r_lo", "r_hi", "r2", "mean_abs_diff", "mad_lo", "mad_hi", "n_items", "note"):
        if col not in table.columns:
            table[col] = np.nan if col != "note" else ""
    table["note"] = table["note"].fillna("")
    by_item.index.name = "item_id"
    files = [
        _csv(table, out / "humans_agreement.csv", index=False),
        _csv(by_item, out / "humans_by_item.csv"),
        _humans_figure(by_item, per_item, c, out / "fig_humans.png"),
    ]
    lines = [
        f"Human table `{c.panel.humans}`: {h['item_id'].nunique()} of the shared dilemmas; human values on the "
        "stance axis [-1, 1] (p_cbr as 2 p - 1; rating as 2 (rating - lo) / (hi - lo) - 1), averaged over frames. "
        "Both are compared with the model's graded theta, as the paper anchors its stance axis (Fig. 1a: human "
        "2P - 1 beside theta; r^2 of per-item theta); choice rates also with the forced-binary story stance z "
        "(row model = z). "
        f"r: Pearson with a {LEVEL:.0%} percentile bootstrap over items; mean |diff| with the same bootstrap.",
        "",
        md_table(table, "{:+.3f}", nan="–"),
    ]
    if "p_cbr" in h["measure"].values and h["n"].notna().any():
        pc = h[(h["measure"] == "p_cbr") & h["n"].notna()]
        p = (pc["value"] + 1) / 2
        se = float((2 * np.sqrt(p * (1 - p) / pc["n"])).mean())
        lines += ["", f"Human sampling noise: mean binomial SE of 2 p_cbr - 1 = {se:.3f} ({len(pc)} rows with n)."]
    dropped = sorted(set(c.humans["item_id"]) - set(c.shared)) if c.humans is not None else []
    if dropped:
        lines += ["", f"{len(dropped)} human items are not shared by every run and were dropped: {', '.join(dropped)}."]
    frames = sorted(set(h["frame"]) - {""})
    if frames:
        shift = framing_shift(h, n_boot=c.n_boot, seed=c.seed)
        files.append(_csv(shift, out / "humans_framing.csv", index=False))
        lines += [
            "",
            "Framing shift of the human sample: per measure, the mean over items of (value in the frame - value in "
            "the reference frame, the first in the file), with a bootstrap CI over items:",
            "",
            md_table(shift, "{:+.3f}", nan="–"),
        ]
    return Section(title, lines, files)


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
    with contextlib.suppress(ValueError):
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
            except ValueError:
                pass
    if not parts:
        raise ValueError("neither Yes/No verb-flip cells nor graded trials among the matched trials")
    return pd.concat(parts, axis=1)


def logit_sampled_rows(r: RunData, s: RunData) -> tuple[dict[str, Any], pd.DataFrame]:
    """The readout temperature of (readout run r, sampled run s) and the agreement of the cell-level quantities."""
    from analysis.battery.calibration import calibrate

    tau = float(s.manifest.get("plan", {}).get("temperature", 1.0))
    if not tau > 0:
        raise ValueError(f"run {s.name!r} sampled greedily (temperature {tau:g}): no temperature to fit")
    ids = sorted(set(r.per_trial["trial_id"]) & set(s.per_trial["trial_id"]))
    if not ids:
        raise ValueError(f"runs {r.name!r} and {s.name!r} share no trial id; were they run with the same spec?")
    keep = set(ids)
    samples = _samples(s.store)
    sopts, sper = _count(samples[samples["trial_id"].isin(keep)], s.trial_list)
    ropts, rper = r.options[r.options["trial_id"].isin(keep)], r.per_trial[r.per_trial["trial_id"].isin(keep)]
    ro = r.store.load("readout_options")
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


def logit_sampled_section(c: Context, out: Path) -> Section:
    title = "Logit readout vs sampled behaviour (across runs)"
    pairs = logit_sampled_pairs(list(c.runs.values()))
    if not pairs:
        return Section(
            title,
            [
                "No pair of a readout run and a sampled-only run (`--no-readout --samples N`) of the same model and "
                "reasoning flag with common trials (a run with both readouts and samples has this in its own report)."
            ],
            [],
        )
    heads, cells, notes = [], [], []
    for r, s in pairs:
        try:
            head, q = logit_sampled_rows(r, s)
        except ValueError as e:
            notes.append(f"- {r.name} vs {s.name}: not computed: {e}")
            continue
        heads.append(head)
        cells.append(q)
    lines: list[str] = []
    files = []
    if heads:
        ht = pd.DataFrame(heads)
        ct = pd.concat(cells, ignore_index=True)
        files = [
            _csv(ht, out / "logit_vs_sampled.csv", index=False),
            _csv(ct, out / "logit_vs_sampled_cells.csv", index=False),
        ]
        lines = [
            "Trials matched by id (same spec: same trials). T = fitted readout temperature relative to the sampling "
            f"temperature tau ({LEVEL:.0%} profile-likelihood interval; T = 1: sampling at tau draws from "
            "softmax(logits / tau)); r_trial and mad_trial compare the readout P(CBR) with the sampled frequency per "
            "trial (mad_trial_tempered after re-tempering the readout at the fitted T).",
            "",
            md_table(ht, "{:.3f}", nan="–"),
            "",
            "Cell-level quantities per item, readout vs sampled (z, lexical, order of the yes/no verb flip; theta "
            "pooled over replicates):",
            "",
            md_table(ct, "{:+.3f}", nan="–"),
        ]
    return Section(title, lines + (["", *notes] if notes else []), files)


def planted_section(c: Context, out: Path) -> Section:
    """For sim runs: r^2 of the planted thetas beside the recovered r^2 matrix."""
    from engines.sim import SimParams

    sims = {n: d for n, d in c.runs.items() if d.manifest.get("engine", {}).get("engine") == "sim"}
    if len(sims) < 2 or "consensus" not in c.results:
        return Section("Planted vs recovered", [], [])
    items = list(c.results["consensus"].index)
    planted = pd.DataFrame(
        {n: [SimParams(**d.manifest["engine"]["params"]).item_theta(str(i)) for i in items] for n, d in sims.items()},
        index=items,
    )
    r2 = planted.corr() ** 2
    r2.index.name = "run"
    return Section(
        "Planted vs recovered (synthetic subjects)",
        [
            "r^2 of the planted thetas (compare with the recovered matrix above):",
            "",
            md_table(r2.reset_index(), "{:.3f}", nan="–"),
        ],
        [_csv(r2, out / "planted_r2.csv")],
    )


# ------------------------------------------------------------------ figures
def _grid(n: int, width: float = 3.6, height: float = 3.2) -> tuple[Any, list[Any]]:
    plt = pyplot()
    cols = min(n, 4)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _save(fig: Any, path: Path, title: str) -> Path:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def _item_order(c: Context) -> list[str]:
    cons = c.results.get("consensus")
    if cons is not None:
        return [str(i) for i in cons.sort_values().index]
    theta = c.theta_table()
    return [str(i) for i in theta.mean(axis=1).sort_values().index]


def _stance_figure(c: Context, path: Path) -> Path:
    runs = [(n, d) for n, d in c.runs.items() if d.inc is not None]
    order = _item_order(c)
    fig, axes = _grid(len(runs), 3.4, 0.2 * len(order) + 1.4)
    for ax, (name, d) in zip(axes, runs, strict=True):
        assert d.inc is not None
        inc = d.inc.reindex(order)
        ax.barh(range(len(order)), inc["theta"], xerr=inc["sigma_repro"], color="#4c72b0", ecolor="#333", capsize=1.5)
        ax.set_yticks(range(len(order)), order if ax is axes[0] else [""] * len(order), fontsize=6)
        ax.axvline(0, color="black", lw=0.7)
        ax.set_xlim(-1.05, 1.05)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("theta (bars: sigma_repro)", fontsize=8)
    return _save(fig, path, "Stance theta per dilemma, items in consensus order")


def _decomposition_figure(c: Context, path: Path) -> Path:
    runs = [(n, d) for n, d in c.runs.items() if d.dec is not None]
    order = [i for i in _item_order(c) if all(d.dec is not None and i in d.dec.index for _, d in runs)]
    order = order or [str(i) for i in runs[0][1].dec.index]  # type: ignore[union-attr]
    fig, axes = _grid(len(runs), 4.2, 3.2)
    x = np.arange(len(order))
    for ax, (name, d) in zip(axes, runs, strict=True):
        assert d.dec is not None
        dec = d.dec.reindex(order)
        for k, col in enumerate(("order", "lexical", "apparent")):
            ax.bar(x + (k - 1) * 0.27, dec[col].to_numpy(float), 0.27, label=col)
        ax.axhline(0, color="black", lw=0.7)
        ax.set_xticks(x, order, rotation=70, ha="right", fontsize=5)
        ax.set_ylim(-1.05, 1.05)
        ax.set_title(name, fontsize=9)
    axes[0].legend(fontsize=6)
    return _save(fig, path, "Yes/no bias decomposition per dilemma (apparent = order + lexical)")


def _fit_figure(table: pd.DataFrame, path: Path) -> Path:
    channels = list(dict.fromkeys(table["channel"]))
    fig, axes = _grid(len(channels), 4.0, 0.35 * table["run"].nunique() + 1.6)
    runs = list(dict.fromkeys(table["run"]))
    for ax, ch in zip(axes, channels, strict=True):
        t = table[table["channel"] == ch].set_index("run").reindex(runs)
        y = np.arange(len(runs))
        err = np.vstack([t["m"] - t["m_lo"], t["m_hi"] - t["m"]]).clip(min=0)
        ax.errorbar(t["m"], y, xerr=err, fmt="o", color="#c44e52", label="m")
        ax.set_yticks(y, runs, fontsize=7)
        ax.invert_yaxis()
        ax.axvline(0, color="black", lw=0.7)
        ax.set_xlabel("m (95% CI)", fontsize=8)
        ax.set_title(f"{ch}: m (s in labels)", fontsize=9)
        for k, (_, row) in enumerate(t.iterrows()):
            ax.annotate(f"s={row['s']:.2f}", (row["m"], k), textcoords="offset points", xytext=(4, 4), fontsize=6)
    return _save(fig, path, "Framing susceptibility m per channel and run (s printed beside)")


def _heatmap(r2: pd.DataFrame, path: Path) -> Path:
    plt = pyplot()
    n = len(r2)
    fig, ax = plt.subplots(figsize=(1.0 * n + 2.5, 0.8 * n + 2))
    im = ax.imshow(r2.to_numpy(float), vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(n), list(r2.columns), rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(n), list(r2.index), fontsize=7)
    for i in range(n):
        for j in range(n):
            v = float(r2.iloc[i, j])
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.6 else "black")
    fig.colorbar(im, ax=ax, label="r^2 of theta")
    ax.set_title("Agreement of the item ordering (r^2 of theta)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return path


def _deliberation_figure(table: pd.DataFrame, out: Path) -> Path:
    models = list(dict.fromkeys(table["model"]))
    labels = [f"{q} {ch}".strip() for q, ch in zip(table["quantity"], table["channel"], strict=True)]
    table = table.assign(label=labels)
    fig, axes = _grid(len(models), 4.4, 0.3 * table.groupby("model").size().max() + 1.5)
    for ax, m in zip(axes, models, strict=True):
        t = table[table["model"] == m]
        y = np.arange(len(t))
        err = np.vstack([t["off_minus_on"] - t["lo"], t["hi"] - t["off_minus_on"]]).clip(min=0)
        ax.errorbar(t["off_minus_on"], y, xerr=err, fmt="o", color="#4c72b0")
        ax.set_yticks(y, list(t["label"]), fontsize=7)
        ax.invert_yaxis()
        ax.axvline(0, color="black", lw=0.7)
        ax.set_title(str(m), fontsize=9)
        ax.set_xlabel("off - on (95% CI)", fontsize=8)
    return _save(fig, out / "fig_deliberation.png", "Deliberation effects: reasoning off minus on")


def _humans_figure(by_item: pd.DataFrame, per_item: pd.DataFrame, c: Context, path: Path) -> Path:
    panels = []
    for name, _d in c.runs.items():
        for measure in per_item.columns:
            col = f"{name} ({HUMAN_VS[measure]})"
            if col in by_item.columns:
                panels.append((name, measure, col))
    fig, axes = _grid(max(len(panels), 1), 3.2, 3.1)
    for ax, (name, measure, col) in zip(axes, panels, strict=False):
        ax.scatter(by_item[f"humans_{measure}"], by_item[col], s=12)
        ax.plot([-1, 1], [-1, 1], color="grey", lw=0.8, ls="--")
        ax.set(xlim=(-1.05, 1.05), ylim=(-1.05, 1.05))
        ax.set_xlabel(f"humans ({measure}, stance axis)", fontsize=8)
        ax.set_ylabel(f"{name}: {HUMAN_VS[measure]}", fontsize=8)
        ax.set_title(name, fontsize=9)
    return _save(fig, path, "Models against the human anchors")


# ------------------------------------------------------------------ entry points
SECTIONS: list[Callable[[Context, Path], Section]] = [
    matching_section,
    models_section,
    fits_section,
    dropped_stories_section,
    agreement_section,
    deliberation_section,
    humans_section,
    logit_sampled_section,
    planted_section,
]


def _context(panel: Panel, *, n_boot: int, seed: int) -> Context:
    runs = {r.name: load_run(r) for r in panel.runs}
    shared, dropped = shared_items(panel, {n: d.items for n, d in runs.items()})
    if not shared:
        raise ValueError(f"the runs share no dilemma; item counts: { {n: len(d.items) for n, d in runs.items()} }")
    for d in runs.values():
        compute_run(d, shared, n_boot=n_boot, seed=seed)
    c = Context(panel, runs, shared, dropped, n_boot=n_boot, seed=seed)
    if panel.humans is not None:
        c.humans = load_humans(panel.humans)
        extra = sorted(set(c.humans["item_id"]) - set(shared))
        if extra:
            more = pd.DataFrame(
                {"run": "humans", "item_id": extra, "reason": "human item not in every run (or unknown id)"}
            )
            c.dropped = pd.concat([dropped, more], ignore_index=True)
    return c


def compare_battery(panel: Panel, out: Path, *, n_boot: int = N_BOOT, seed: int = SEED) -> list[Path]:
    """Write the battery comparison of ``panel`` into ``out`` (CSV, ``summary.md``, PNG); returns the files."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    c = _context(panel, n_boot=n_boot, seed=seed)
    head = [
        f"# Crossed-frame battery: comparison of {len(panel.runs)} runs",
        "",
        f"- panel: {panel.source}; {len(c.shared)} shared dilemmas",
        "- spreads (sigma_repro, disagreement) are descriptive; CIs are percentile bootstraps over items",
        "",
    ]
    body, _ = run_sections(SECTIONS, c, out)
    write_summary(out, "\n".join(head + body))
    return report_files(out)


# ------------------------------------------------------------------ yes/no
def yesno_cells_section(c: Context, out: Path) -> Section:
    from analysis.battery.yesno import decompose

    parts: list[pd.DataFrame] = []
    summary: dict[str, dict[str, Any]] = {}
    for name, d in c.runs.items():
        per = d.per_trial[d.per_trial["item_id"].isin(c.shared)]
        cells = verbflip_cells(per, d.options, battery=False)
        dec = decompose(cells)
        parts.append(cells.join(dec).assign(run=name).reset_index())
        summary[name] = {"model": d.run.model, "reasoning": "on" if d.run.reasoning else "off", "source": d.source}
        summary[name].update({k: float(dec[k].mean()) for k in ("z", "order", "lexical", "apparent")})
    table = pd.DataFrame.from_dict(summary, orient="index")
    table.index.name = "run"
    long = pd.concat(parts, ignore_index=True)
    files = [_csv(table, out / "models.csv"), _csv(long, out / "yesno_cells.csv", index=False)]
    for col in ("z", "lexical", "order"):
        wide = long.pivot(index="item_id", columns="run", values=col).reindex(columns=list(c.runs))
        files.append(_csv(wide, out / f"yesno_{col}_by_model.csv"))
    lines = [
        "Per run, on the shared dilemmas: P(CBR) per (verb x printed order) cell, averaged over forms "
        "(`yesno_cells.csv`), and the decomposition; the table shows the means over items "
        "(z = mean 2P - 1; lexical: pull toward yes; order: pull toward the first-printed option).",
        "",
        md_table(table.reset_index(), "{:+.3f}", nan="–"),
    ]
    for name, d in c.runs.items():
        d.dec = long[long["run"] == name].set_index("item_id")[["z", "lexical", "order", "apparent"]]
    files.append(_decomposition_figure(c, out / "fig_decomposition_models.png"))
    return Section("Cells and decomposition side by side", lines, files)


def yesno_agreement_section(c: Context, out: Path) -> Section:
    z = pd.DataFrame({n: d.dec["z"] for n, d in c.runs.items() if d.dec is not None}).dropna()
    r, cons, per_run = agreement(z)
    r2 = (r**2).rename_axis("run")
    files = [_csv(r2, out / "agreement_r2.csv"), _csv(cons.rename_axis("item_id"), out / "consensus.csv")]
    lines = [
        f"Pearson r^2 of the story stance z between runs ({len(z)} dilemmas); consensus = the mean z over the runs:",
        "",
        md_table(r2.reset_index(), "{:.3f}", nan="–"),
        "",
        md_table(per_run.reset_index(), "{:+.3f}", nan="–"),
    ]
    return Section("Agreement of the item ordering (z)", lines, files)


def compare_yesno(panel: Panel, out: Path, *, n_boot: int = N_BOOT, seed: int = SEED) -> list[Path]:
    """The yes/no comparison: cells and decomposition side by side, agreement of z, logit vs sampled."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = {r.name: load_run(r) for r in panel.runs}
    shared, dropped = shared_items(panel, {n: d.items for n, d in runs.items()})
    if not shared:
        raise ValueError("the runs share no dilemma")
    c = Context(panel, runs, shared, dropped, n_boot=n_boot, seed=seed)
    head = [f"# Yes/no battery: comparison of {len(panel.runs)} runs", "", f"- {len(shared)} shared dilemmas", ""]
    sections = [matching_section, yesno_cells_section, yesno_agreement_section, logit_sampled_section]
    body, _ = run_sections(sections, c, out)
    write_summary(out, "\n".join(head + body))
    return report_files(out)
