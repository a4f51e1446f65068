"""The agreement of the item ordering across the runs of a panel.

G of a run (:func:`g_of`), the r^2 of every pair
of runs and of each run with the consensus (:func:`agreement`, :func:`mean_r2_summary`), the reference
runs of the consensus (:func:`consensus_reference`), the theta agreement of a battery panel
(:func:`theta_agreement`, :func:`theta_table`) and the z agreement of a yes/no panel
(:func:`compute_z_agreement`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.battery.compare_humans import human_anchor
from analysis.battery.compare_runs import RunData
from analysis.common.results import Part
from probe.errors import NotComputed
from probe.panel import Panel


# ------------------------------------------------------------------ statistics
def g_of(theta: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """G = Var(theta) / (Var(theta) + mean sigma^2) along the last axis (ddof 1), as in :mod:`analysis.battery.stance`."""
    var = np.var(theta, axis=-1, ddof=1)
    denom = var + np.mean(sigma**2, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out: np.ndarray = np.where(denom > 0, var / denom, np.nan)
    return out


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
    mean-r^2 summaries (:func:`mean_r2_summary`) with the human anchor of ``humans`` (:func:`~analysis.battery.compare_humans.human_anchor`)."""
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
