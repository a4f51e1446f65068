"""One run of a battery or yes/no panel, loaded and recomputed on the panel's shared items.

:func:`load_run` reads a run's trials, options and samples into a frozen :class:`RunData`;
:func:`compute_run` recomputes its per-item quantities (stance, incoherence, the yes/no decomposition,
the logical pull) on the items every run of the panel holds; :func:`verbflip_cells` builds the four
verb-flip cells of the yes/no frames. :mod:`analysis.battery.compare` composes them into a comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from analysis.battery.fit import N_BOOT, SEED
from probe.errors import NotComputed
from probe.panel import PanelRun
from probe.runs import Run


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
    """The joint (s, m) fit per label family (:func:`analysis.battery.joint_fit.fit_joints`), one row per (family, channel)."""
    why: dict[str, str] = field(default_factory=dict)
    """Quantity -> why it is missing for this run."""
    unfitted: tuple[Any, ...] = ()
    """Channels the (s, m) fit could not fit on this run (:class:`analysis.battery.channel_fit.Unfitted`), with the reason."""
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
    samples = run_samples(opened)
    if has_readouts:  # the same choice as Run.choice_probs: readouts when the run has them
        opts, per_trial = opened.readout_frames()
        source = "readout"
    elif not samples.empty:
        opts, per_trial = count_trials(samples, trials)
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


def run_samples(run: Run) -> pd.DataFrame:
    """The run's samples, trial ids as plain Python strings (fast set membership)."""
    s = run.load("samples")
    return s.astype({"trial_id": object}) if not s.empty else s


def count_trials(samples: pd.DataFrame, trials: Sequence[Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(options, per_trial) counted from ``samples`` over the ``trials`` they hold (:func:`probe.views.count_samples`)."""
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

    The (s, m) fits are the report's (:func:`analysis.battery.run_fits.fit_run`); a quantity that cannot be
    computed is None, with the reason under its name in ``why``.
    """
    from analysis.battery import fit, run_fits, stance
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
            fitted = run_fits.fit_run(inc["theta"], bt, n_boot=n_boot, seed=seed)
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
