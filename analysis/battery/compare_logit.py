"""Readout runs against their sampled-only twins: the logit-vs-sampled matching of a panel.

:func:`logit_sampled_pairs` pairs each readout run with a sampled-only run of the same model and reasoning
flag, :func:`cell_quantities` and :func:`logit_sampled_rows` compare their cells, and
:func:`compute_logit_sampled` gathers every pair into a :class:`LogitSampled`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.battery.compare_runs import RunData, count_trials, run_samples, verbflip_cells
from analysis.common.results import Part
from probe.errors import NotComputed
from probe.record import Plan


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
    samples = run_samples(s.opened)
    sopts, sper = count_trials(samples[samples["trial_id"].isin(keep)], s.opened.trial_list)
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
