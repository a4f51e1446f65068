"""Paper 000's appendix tables of one run, of a condition table alone and across runs: computed here once, from
:mod:`analysis.influence.paper000`'s statistics (:mod:`analysis.influence.results` and
:mod:`analysis.influence.compare` call these; :mod:`analysis.influence.paper000_report` only formats and draws).
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from analysis.influence import paper000 as p
from analysis.influence.audit import Audit

TESTS = (("p_asym", "Wald, baseline x4"), ("p_asym_2x", "Wald, baseline x2 (the paper's)"))
"""The Asym tests Table 21 is given for, where the condition table has their p column."""
BY = ("benchmark", "model", "think")
"""How the comparison splits Table 21 and BB: one row per model and reasoning mode."""


def table21(cond: pd.DataFrame, by: str = "benchmark") -> pd.DataFrame:
    """Table 21 (:func:`analysis.influence.paper000.neutral_asym_table`) for each Asym test whose p column ``cond``
    has, one after the other (column ``test``)."""
    parts = [p.neutral_asym_table(cond, by=by, p=col).assign(test=label) for col, label in TESTS if col in cond.columns]
    out = pd.concat(parts, ignore_index=True)
    return out[["test", *[c for c in out.columns if c != "test"]]]


def condition_tables(cond: pd.DataFrame, by: tuple[str, ...] = ("benchmark", "think")) -> dict[str, pd.DataFrame]:
    """The tables a condition table alone gives: Table 21 and Table 11's BB (per ``by``)."""
    return {"table21_neutral_asym": table21(cond), "baseline_bias": p.baseline_bias(cond, by=by)}


def imported_tables(cond: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """An imported run's tables (condition-level data): Table 21, BB and Table 13."""
    return {**condition_tables(cond), "max_asym_by_pair": p.max_asym_by_pair(cond)}


def source_tables(audit: Audit) -> dict[str, pd.DataFrame]:
    """One source's tables: Table 21 and BB; I.9 where trials have group sizes (the triage task); I.12 where the
    answers were sampled; Table 4's flip rates per value on DailyDilemmas."""
    out = condition_tables(audit.conditions)
    out["max_asym_by_pair"] = p.max_asym_by_pair(audit.conditions)
    larger = p.larger_group(audit.cells)
    if len(larger):
        out["larger_group"] = larger
        out["larger_by_ratio"] = p.larger_by_ratio(larger)
        out["larger_summary"] = p.larger_summary(larger)
    invalid = p.invalid_rates(audit.cells)
    if len(invalid):
        out["invalid_rates"] = invalid
        out["invalid_by_arm"] = p.invalid_by_arm(invalid)
    if audit.benchmark == "dd":
        out["flip_rates_by_value"] = p.flip_rates_by_value(audit.cells)
        out["value_counts"] = p.value_counts(audit.cells)
    return out


def compare_tables(
    cond: pd.DataFrame, run_cells: Mapping[str, tuple[str, bool, pd.DataFrame]]
) -> dict[str, pd.DataFrame]:
    """The comparison's paper-000 tables: Table 21 per benchmark (BH-FDR over the panel's main cues of the
    benchmark) and per run, BB per model and reasoning mode and per reasoning mode (Table 11's column), and from
    the native runs' trial cells (``run_cells``: run name -> (model, reasoning, cells)) I.9's larger-group share
    (Figures 15-19 compare it by model and reasoning) and I.12's invalid answers per run."""
    out = {
        "table21_neutral_asym": table21(cond),
        "table21_by_run": table21(cond, by="run"),
        "baseline_bias_by_model": p.baseline_bias(cond, by=BY),
        "baseline_bias": p.baseline_bias(cond, by=("benchmark", "think")),
        "steer_by_condition": p.steer_long(cond),
    }
    larger, invalid = [], []
    for name, (model, think, cells) in run_cells.items():
        tag = {"run": name, "model": model, "think": think}
        lg = p.larger_group(cells)
        if len(lg):
            larger.append(p.larger_summary(lg).assign(**tag))
        inv = p.invalid_rates(cells)
        if len(inv):
            invalid.append(p.invalid_by_arm(inv).assign(**tag))
    if larger:
        out["larger_group_by_run"] = _front(pd.concat(larger, ignore_index=True), ("run", "model", "think"))
    if invalid:
        out["invalid_by_run"] = _front(pd.concat(invalid, ignore_index=True), ("run", "model", "think"))
    return out


def _front(df: pd.DataFrame, cols: tuple[str, ...]) -> pd.DataFrame:
    return df[[*cols, *[c for c in df.columns if c not in cols]]]
