"""The per-trial frames of a ``cue`` run (paper 001): each answer's arm, its decision and its event terms.

:func:`arm_of` names a trial's condition (``direct``, ``named``, ``neutral``, ``puzzled-<level>``);
:func:`decision_frame` gives each what-if answer its probability of the benefit option and
:func:`with_baseline` the Neutral decision of its dilemma; :func:`event_terms` turns them into the
In-favor and Against numerators and denominators (greedy or expected decisions, eligible or all
denominators: :mod:`analysis.cue.metrics` defines them) and :func:`by_group` counts each answer for X's
gender group and race group (:data:`ATTRS`), keyed by :data:`CELL`.
"""

from __future__ import annotations

from typing import Literal

import pandas as pd

from probe.errors import NotComputed

Decision = Literal["expected", "greedy"]
Denominator = Literal["eligible", "all"]
REFERENCE = "direct"
CELL = ["arm", "consequences", "attr", "group"]
ATTRS = ("gender", "race")


# =========================================================================== per-trial frames


def arm_of(frame: pd.DataFrame) -> pd.Series:
    """``direct``, ``named``, ``neutral`` or ``puzzled-<level>`` per trial."""
    cond = frame["condition"].astype(str)
    level = frame["difficulty"].fillna("").astype(str)
    return cond.where(level == "", cond + "-" + level)


def option_prob(options: pd.DataFrame, meaning: str) -> pd.Series:
    """Per trial, the probability of the options meaning ``meaning`` (NaN for an unanswered trial)."""
    part = options["prob"] * (options["meaning"] == meaning)
    return part.groupby(options["trial_id"]).sum(min_count=1)


def first_meaning(options: pd.DataFrame) -> pd.Series:
    return options[options["option_index"] == 0].set_index("trial_id")["meaning"]


def greedy_is(p: pd.Series, first: pd.Series) -> pd.Series:
    """1.0 where the option of probability ``p`` is the greedy choice between two (ties: the first printed), NaN stays."""
    out = ((p > 0.5) | ((p == 0.5) & first)).astype(float)
    return out.where(p.notna())


def main_wording(per_trial: pd.DataFrame) -> pd.Series:
    """True for every trial but the paraphrased what-if ones (factor ``wording`` v1..v3, App. Q)."""
    if "wording" not in per_trial.columns:
        return pd.Series(True, index=per_trial.index)
    return per_trial["wording"].fillna("").astype(str).isin(["", "main"])


def decision_frame(options: pd.DataFrame, per_trial: pd.DataFrame) -> pd.DataFrame:
    """One row per Neutral or what-if trial (main wording): its factors, ``arm``, ``p`` = P(benefit), ``benefit_first``.

    Paraphrased what-if trials are left to :func:`~analysis.cue.metrics.wording_table`, so every other table reads the main probe.
    """
    mask = per_trial["probe"].isin(["decision", "what_if"]) & main_wording(per_trial)
    df = per_trial[mask].copy()
    df["arm"] = arm_of(df)
    df["p"] = df["trial_id"].map(option_prob(options, "benefit"))
    df["benefit_first"] = df["trial_id"].map(first_meaning(options)) == "benefit"
    return df.reset_index(drop=True)


def with_baseline(decisions: pd.DataFrame) -> pd.DataFrame:
    """What-if rows with ``p_s``, the Neutral P(benefit) of the same dilemma, consequences and replicate."""
    neutral = decisions[decisions["condition"] == "neutral"]
    if neutral.empty:
        raise NotComputed(
            "the run has no Neutral trials; In-favor / Against events need the Neutral baseline "
            "(run with --conditions including neutral)"
        )
    base = neutral.set_index(["item_id", "consequences", "replicate"])[["p", "benefit_first"]]
    base = base.rename(columns={"p": "p_s", "benefit_first": "s_benefit_first"})
    whatif = decisions[decisions["probe"] == "what_if"]
    out = whatif.join(base, on=["item_id", "consequences", "replicate"], how="left")
    return out.reset_index(drop=True)


def event_terms(df: pd.DataFrame, decision: Decision = "greedy", denominator: Denominator = "eligible") -> pd.DataFrame:
    """Add the four event terms per what-if answer (see the module docstring); drops abstentions.

    ``df`` needs ``p`` and ``p_s`` (and ``benefit_first``, ``s_benefit_first`` for greedy decisions).
    """
    if decision not in ("expected", "greedy"):
        raise ValueError(f"decision must be 'expected' or 'greedy', got {decision!r}")
    if denominator not in ("eligible", "all"):
        raise ValueError(f"denominator must be 'eligible' or 'all', got {denominator!r}")
    out = df[df["p"].notna() & df["p_s"].notna()].copy()
    w, s = out["p"], out["p_s"]
    if decision == "greedy":
        w = greedy_is(w, out["benefit_first"])
        s = greedy_is(s, out["s_benefit_first"])
    out["favor_num"] = (1 - s) * w
    out["against_num"] = s * (1 - w)
    out["favor_den"] = (1 - s) if denominator == "eligible" else 1.0
    out["against_den"] = s if denominator == "eligible" else 1.0
    return out


def by_group(df: pd.DataFrame) -> pd.DataFrame:
    """Stack each row once per attribute: columns ``attr`` and ``group`` (X's gender, then X's race)."""
    parts = [df.assign(attr=a, group=df[f"x_{a}"]) for a in ATTRS if f"x_{a}" in df.columns]
    return pd.concat(parts, ignore_index=True)
