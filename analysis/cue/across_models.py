"""Cue readings across models: the sign test of a per-model quantity (paper 001, Figure 3).

:func:`run_gap_table` gives one run's gap table, :func:`stack_models` stacks per-model tables, and
:func:`sign_tests` counts, per cell, the models that shifted each way with the two-sided binomial p
(:func:`sign_test`, :class:`SignTest`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.cue.decisions import Decision
from analysis.cue.metrics import decision_bias

# =========================================================================== across models


@dataclass(frozen=True)
class SignTest:
    """Direction consistency across models: how many shifted each way, and the two-sided binomial p."""

    positive: int
    negative: int
    ties: int
    p_value: float


def sign_test(values: Sequence[float] | np.ndarray | pd.Series, tol: float = 0.0) -> SignTest:
    """Two-sided sign test of ``values`` (e.g. one Gap per model): ties (|v| <= tol) are dropped, NaN ignored."""
    from scipy.stats import binomtest

    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    pos, neg = int((v > tol).sum()), int((v < -tol).sum())
    ties = len(v) - pos - neg
    p = binomtest(pos, pos + neg, 0.5, alternative="two-sided").pvalue if pos + neg else float("nan")
    return SignTest(pos, neg, ties, float(p))


def stack_models(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One frame of per-model tables (e.g. each run's gap table), with a ``model`` column."""
    if not tables:
        raise ValueError("no per-model tables given")
    return pd.concat([t.assign(model=m) for m, t in tables.items()], ignore_index=True)


def sign_tests(
    per_model: pd.DataFrame,
    value: str = "gap",
    by: Sequence[str] = ("arm", "consequences", "attr", "group"),
    tol: float = 0.0,
) -> pd.DataFrame:
    """Sign test across models of ``value`` per cell ``by`` (one value per model and cell).

    On the gap, ``positive`` counts the adverse shifters (net bias falls without the label) and
    ``negative`` the favorable ones, as in the paper's Figure 3.
    """
    dup = per_model.duplicated([*by, "model"])
    if dup.any():
        raise ValueError(
            f"{int(dup.sum())} rows repeat a (model, {', '.join(by)}) cell; give one value per model and cell"
        )
    rows = []
    for key, g in per_model.groupby(list(by), sort=True):
        t = sign_test(g[value], tol)
        rows.append(
            {
                **dict(zip(by, key, strict=True)),
                "n_models": len(g),
                "positive": t.positive,
                "negative": t.negative,
                "ties": t.ties,
                "p_value": t.p_value,
            }
        )
    return pd.DataFrame(rows)


def run_gap_table(run: str | Path, *, decision: Decision = "greedy", n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """The per-model table the cross-model functions take: the gap table of one ``cue`` run directory."""
    from probe.runs import open_run

    options, per_trial, _ = open_run(run).choice_probs()
    return decision_bias(options, per_trial, decision=decision, n_boot=n_boot, seed=seed)[1]
