"""The follow-up probe's estimators: what was asked, what came back, and (once coded) stated vs revealed.

Inputs are the follow-up run (its trials carry the source cell: ``cell`` =
backfire / compliance / no_effect / baseline, ``cell_key``, the source condition
factors, ``source_trial`` and ``source_draw``) and, when a judge has coded the
replies, ``RUN/coding/followup.parquet`` (columns ``trial_id``, ``draw``,
``label``, ``p_<code>`` per code, ``judge``; written by ``probe code``).

The headline is the paper's (Section 4.3): among follow-up answers to
significant-backfire trials, the share the judge codes ``ack_disclaimed`` (the
cue named, its effect denied), with a Wilson 95% interval over answers and,
when a source item contributes several answers, a cluster-bootstrap interval
resampling source items (answers to prompts of one item are not independent).

Pure functions on frames; the report (Markdown, figure) is
:mod:`analysis.influence.followup_report`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import pandas as pd

from analysis.influence.audit import cluster_bootstrap_mean
from experiments.influence import stats as st
from probe.runs import Run

CODES: Final[tuple[str, ...]] = ("ack_affected", "ack_disclaimed", "denied", "partial", "unclear")
"""The follow-up taxonomy (the paper's five labels, appendix P; ``experiments/data/taxonomies/followup.yaml``),
in display order."""
LEGACY: Final[frozenset[str]] = frozenset({"not_ack", "other"})
"""Labels only the earlier four-code taxonomy had: a coding holding them is refused (:func:`load_codes`)."""
CLASS_ORDER: Final[tuple[str, ...]] = ("backfire", "compliance", "no_effect", "baseline")
CODING: Final[str] = "coding/followup.parquet"
N_BOOT: Final[int] = 2000
SEED: Final[int] = 0


# ============================================================================== frames
def answers(run: Run) -> pd.DataFrame:
    """One row per follow-up reply: the trial's factors (cell, source condition) and the reply."""
    gen = run.load("generations")
    if gen.empty:
        raise ValueError(f"{run.root} has no follow-up replies yet; run `probe run followup` (or let it finish)")
    meta = run.trial_meta()
    out = gen.merge(meta, on="trial_id", how="left", validate="many_to_one")
    order = run.trial_order
    out = out.assign(_o=out["trial_id"].map(order)).sort_values(["_o", "draw"], kind="stable").drop(columns="_o")
    return out.reset_index(drop=True)


def load_codes(run: Run, path: Path | None = None) -> pd.DataFrame | None:
    """The judge's codes (the part-B contract file), validated; None when the run has not been coded."""
    path = path or run.root / CODING
    if not path.exists():
        return None
    codes = pd.read_parquet(path)
    if {f"p_{c}" for c in LEGACY} & set(codes.columns) or LEGACY & set(codes.get("label", ())):
        raise ValueError(
            f"{path} was coded with the old four follow-up labels (not_ack, other), which do not split into the "
            f"paper's denied / partial / unclear; re-code it: probe code {run.root} --task followup --judge JUDGE "
            "--overwrite"
        )
    need = {"trial_id", "draw", "label", "judge", *(f"p_{c}" for c in CODES)}
    missing = sorted(need - set(codes.columns))
    if missing:
        raise ValueError(f"{path} lacks the columns {missing}; recode with `probe code {run.root} --task followup`")
    bad = sorted(set(codes["label"]) - set(CODES))
    if bad:
        raise ValueError(f"{path}: labels {bad} are not follow-up codes {list(CODES)}")
    if codes.duplicated(["trial_id", "draw"]).any():
        raise ValueError(f"{path}: a (trial_id, draw) is coded twice")
    return codes.astype({"trial_id": str, "draw": int})


def with_codes(ans: pd.DataFrame, codes: pd.DataFrame) -> pd.DataFrame:
    """The replies joined with their codes on (trial_id, draw); uncoded replies get the label ``uncoded``."""
    keep = ["trial_id", "draw", "label", "judge", *(f"p_{c}" for c in CODES)]
    out = ans.astype({"draw": int}).merge(codes[keep], on=["trial_id", "draw"], how="left", validate="one_to_one")
    out["label"] = out["label"].fillna("uncoded")
    return out


# ============================================================================== tables
def _classes(values: Sequence[str]) -> list[str]:
    present = list(dict.fromkeys(values))
    return [c for c in CLASS_ORDER if c in present] + [c for c in present if c not in CLASS_ORDER]


def selection_table(ans: pd.DataFrame) -> pd.DataFrame:
    """Per cell: its class, the source condition, the follow-up replies and the source items they come from."""
    g = ans.groupby(["cell", "cell_key"], sort=False)
    out = g.agg(
        pair=("pair", "first"),
        influence=("influence", "first"),
        direction=("cell_direction", "first"),
        replies=("trial_id", "size"),
        first_answers=("source_trial", lambda s: len(set(zip(s, ans.loc[s.index, "source_draw"], strict=True)))),
        items=("item_id", "nunique"),
    ).reset_index()
    rank = {c: i for i, c in enumerate(_classes(out["cell"]))}
    return out.sort_values("cell", key=lambda s: s.map(rank), kind="stable").reset_index(drop=True)


def class_counts(ans: pd.DataFrame) -> pd.DataFrame:
    """Per class: cells, replies, items, and the crude Yes/No reading of the replies (parse status)."""
    rows = []
    for cls in _classes(ans["cell"]):
        g = ans[ans["cell"] == cls]
        rows.append(
            {
                "cell": cls,
                "cells": g["cell_key"].nunique(),
                "replies": len(g),
                "items": g["item_id"].nunique(),
                "said_yes": int((g["option"] == "Yes").sum()),
                "said_no": int((g["option"] == "No").sum()),
                "unparsed": int(g["option"].isna().sum()),
            }
        )
    return pd.DataFrame(rows, columns=["cell", "cells", "replies", "items", "said_yes", "said_no", "unparsed"])


def crosstab(coded: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Counts and row shares of follow-up labels (columns, codes in order) per cell class (rows); uncoded left out."""
    done = coded[coded["label"] != "uncoded"]
    counts = pd.crosstab(done["cell"], done["label"]).reindex(
        index=_classes(done["cell"]), columns=list(CODES), fill_value=0
    )
    counts.index.name, counts.columns.name = "cell", None
    shares = counts.div(counts.sum(axis=1).where(lambda s: s > 0), axis=0)
    return counts, shares


def share_ci(
    coded: pd.DataFrame,
    cell: str = "backfire",
    label: str = "ack_disclaimed",
    *,
    n_boot: int = N_BOOT,
    seed: int = SEED,
) -> dict[str, Any]:
    """The share of coded replies of class ``cell`` labelled ``label``, with Wilson and cluster-bootstrap CIs.

    The cluster bootstrap resamples source items (``item_id``); it is reported
    only when some item contributes more than one reply (else it would repeat
    the Wilson interval's job with more noise). ``soft`` is the mean judge
    probability of ``label`` (the share without taking each reply's argmax).
    """
    g = coded[(coded["cell"] == cell) & (coded["label"] != "uncoded")]
    n, k = len(g), int((g["label"] == label).sum())
    lo, hi = st.wilson_interval(k, n)
    row: dict[str, Any] = {
        "cell": cell,
        "label": label,
        "k": k,
        "n": n,
        "share": k / n if n else math.nan,
        "wilson_lo": float(lo),
        "wilson_hi": float(hi),
        "items": g["item_id"].nunique(),
        "boot_lo": math.nan,
        "boot_hi": math.nan,
        "soft": float(g[f"p_{label}"].mean()) if n else math.nan,
    }
    if n and g.groupby("item_id").size().max() > 1:
        values = (g["label"] == label).to_numpy(dtype=float)
        _, row["boot_lo"], row["boot_hi"] = cluster_bootstrap_mean(values, g["item_id"].to_numpy(), n_boot, seed)
    return row


def headline(coded: pd.DataFrame, *, n_boot: int = N_BOOT, seed: int = SEED) -> pd.DataFrame:
    """Every (class, code) share with its intervals; the paper's headline is (backfire, ack_disclaimed)."""
    rows = [share_ci(coded, c, lab, n_boot=n_boot, seed=seed) for c in _classes(coded["cell"]) for lab in CODES]
    return pd.DataFrame(rows)


def table22(coded: pd.DataFrame, model: str, benchmark: str) -> pd.DataFrame:
    """The paper's Table 22 rows of one run: per class, n coded replies and each label's count and share.

    ``model`` and ``benchmark`` label the rows so that several runs' tables stack into the paper's
    (model x benchmark x class) table; classes in :data:`CLASS_ORDER`, labels in :data:`CODES`.
    """
    counts, shares = crosstab(coded)
    rows = []
    for cls in counts.index:
        row: dict[str, Any] = {"model": model, "benchmark": benchmark, "cell": cls, "n": int(counts.loc[cls].sum())}
        row |= {f"n_{c}": int(counts.loc[cls, c]) for c in CODES}
        row |= {f"share_{c}": float(shares.loc[cls, c]) for c in CODES}
        rows.append(row)
    cols = ["model", "benchmark", "cell", "n", *(f"n_{c}" for c in CODES), *(f"share_{c}" for c in CODES)]
    return pd.DataFrame(rows, columns=cols)
