"""Coded texts in the analysis: judge agreement, rationale distributions, compliance vs effect, backfire patterns.

Pure functions on frames (the coding file ``RUN/coding/<task>.parquet`` of
:mod:`probe.app.coding`, the trial factors, the influence audit's ``effects``);
the influence report's results hold them (:func:`coded_tasks`, one :class:`CodedTask`
per coded task) and :mod:`analysis.influence.coding_report` formats them when a run has been coded.

Label shares are **soft**: the mean of the judge's ``p_<code>`` over the
traces of a group (the judge's expected label counts divided by n), next to
the argmax counts. A confident judge gives the same two; a hesitant one (the
tiny model) shows it in the gap.

Agreement with a hand-labelled set: accuracy, Cohen's kappa
(``(p_o - p_e) / (1 - p_e)``), its asymptotic standard error (Fleiss, Cohen and
Everitt 1969, as statsmodels' ``cohens_kappa`` computes it), a percentile
bootstrap CI over items with a fixed seed, the confusion matrix and the recall
of each gold code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.bootstrap import resample_index
from probe.runs import Run

TRACE_TASKS = ("compliance", "rationale")
COND_KEYS = ("pair", "influence", "variant", "kind", "position", "bracket")
"""How a trace joins to an influence condition (``experiments.influence.build.COND``)."""


# ============================================================ agreement
@dataclass(frozen=True)
class Agreement:
    n: int
    accuracy: float
    kappa: float
    kappa_se: float
    """Asymptotic standard error of kappa (Fleiss, Cohen & Everitt 1969)."""
    kappa_ci: tuple[float, float]
    """Percentile bootstrap CI (95%) over items."""
    codes: tuple[str, ...]
    confusion: pd.DataFrame
    """Rows: gold code; columns: judge label (plus ``(none)`` for unparsed judge answers)."""
    recall: pd.DataFrame
    """Per gold code: n, correct, recall."""


def confusion_matrix(gold: Sequence[str], pred: Sequence[str], codes: Sequence[str]) -> np.ndarray:
    """Counts ``m[i, j]`` of gold ``codes[i]`` labelled ``codes[j]`` (labels outside ``codes`` are dropped)."""
    idx = {c: i for i, c in enumerate(codes)}
    m = np.zeros((len(codes), len(codes)), dtype=np.int64)
    for g, p in zip(gold, pred, strict=True):
        if g in idx and p in idx:
            m[idx[g], idx[p]] += 1
    return m


def kappa_from_table(m: np.ndarray) -> tuple[float, float]:
    """Cohen's kappa and its asymptotic standard error from a square contingency table."""
    m = np.asarray(m, dtype=float)
    n = m.sum()
    if n == 0:
        return math.nan, math.nan
    p = m / n
    rows, cols = p.sum(axis=1), p.sum(axis=0)
    po, pe = float(np.trace(p)), float(rows @ cols)
    if pe >= 1.0:
        return (1.0 if po >= 1.0 else math.nan), math.nan
    kappa = (po - pe) / (1 - pe)
    # Fleiss, Cohen & Everitt (1969): the large-sample variance under kappa != 0
    diag = np.diag(p)
    term1 = float(np.sum(diag * (1 - (rows + cols) * (1 - kappa)) ** 2))
    off = (cols[:, None] + rows[None, :]) ** 2 * p
    term2 = (1 - kappa) ** 2 * float(off.sum() - np.sum(np.diag(off)))
    term3 = (kappa - pe * (1 - kappa)) ** 2
    var = (term1 + term2 - term3) / (n * (1 - pe) ** 2)
    return float(kappa), float(math.sqrt(max(var, 0.0)))


def agreement(
    gold: Sequence[str], pred: Sequence[str], codes: Sequence[str], *, n_boot: int = 2000, seed: int = 0
) -> Agreement:
    """Accuracy, kappa (SE and bootstrap CI), confusion matrix and per-code recall of a judge against gold labels.

    ``codes`` fixes the order of the tables. A judge answer that is no code
    (unparsed: an empty label) counts as wrong and is shown in the ``(none)``
    column; kappa is computed on the table including that column.
    """
    gold, pred = [str(g) for g in gold], [str(p) if p else "(none)" for p in pred]
    if len(gold) != len(pred):
        raise ValueError(f"gold has {len(gold)} labels and pred {len(pred)}; they must pair up")
    if not gold:
        raise ValueError("no items to compare")
    bad = sorted(set(gold) - set(codes))
    if bad:
        raise ValueError(f"gold labels {bad} are not among the codes {list(codes)}")
    extra = sorted(set(pred) - set(codes))
    labels = list(codes) + extra
    m = confusion_matrix(gold, pred, labels)
    kappa, se = kappa_from_table(m)
    g_idx = np.array([labels.index(g) for g in gold])
    p_idx = np.array([labels.index(p) for p in pred])
    reps = []
    for pick in resample_index(len(gold), n_boot, seed):
        mb = np.zeros((len(labels), len(labels)))
        np.add.at(mb, (g_idx[pick], p_idx[pick]), 1)
        reps.append(kappa_from_table(mb)[0])
    arr = np.array([r for r in reps if not math.isnan(r)])
    ci = (
        (float(np.quantile(arr, 0.025)) + 0.0, float(np.quantile(arr, 0.975)) + 0.0)
        if len(arr)
        else (math.nan, math.nan)
    )
    conf = pd.DataFrame(m, index=pd.Index(labels, name="gold"), columns=labels)
    conf = conf.loc[[c for c in labels if c in set(gold)]]
    rec = pd.DataFrame(
        [
            {
                "code": c,
                "n": int(m[i].sum()),
                "correct": int(m[i, i]),
                "recall": float(m[i, i] / m[i].sum()) if m[i].sum() else math.nan,
            }
            for i, c in enumerate(labels)
            if c in set(gold)
        ]
    )
    acc = float(np.mean([g == p for g, p in zip(gold, pred, strict=True)]))
    return Agreement(len(gold), acc, kappa, se, ci, tuple(labels), conf, rec)


def agreement_text(ag: Agreement) -> str:
    """The agreement as printed by ``probe judge-agreement``."""
    chance = 1 / max(1, len([c for c in ag.codes if c != "(none)"]))
    lines = [
        f"items {ag.n}; accuracy {ag.accuracy:.3f} (uniform guessing: {chance:.3f})",
        f"Cohen's kappa {ag.kappa:.3f} (asymptotic SE {ag.kappa_se:.3f}; 95% bootstrap CI "
        f"[{ag.kappa_ci[0]:.3f}, {ag.kappa_ci[1]:.3f}])",
        "",
        "confusion matrix (rows: gold, columns: judge; only columns that occur)",
    ]
    conf = ag.confusion.loc[:, (ag.confusion.sum(axis=0) > 0).to_numpy()]
    lines.append(conf.to_string())
    lines += ["", "recall per gold code", ag.recall.to_string(index=False, float_format=lambda v: f"{v:.3f}")]
    return "\n".join(lines)


# ============================================================ coded runs
def load_coding(run: str | Path, task: str) -> tuple[pd.DataFrame, dict[str, Any]] | None:
    """The coding file of a run and its metadata, or None when the run has not been coded for ``task``."""
    root = Path(run) / "coding"
    path, meta = root / f"{task}.parquet", root / f"{task}.json"
    if not path.exists() or not meta.exists():
        return None
    return pd.read_parquet(path), json.loads(meta.read_text())


def code_columns(frame: pd.DataFrame) -> list[str]:
    return [c[2:] for c in frame.columns if c.startswith("p_")]


def with_factors(coded: pd.DataFrame, run: Run) -> pd.DataFrame:
    """Coded rows joined with their trial's factors (``arm``: base, rerun or cued)."""
    meta = run.trial_meta()
    out = coded.merge(meta, on="trial_id", how="left", validate="many_to_one")
    if "direction" in out.columns:
        out["arm"] = np.where(out["direction"].isin(["A", "B"]), "cued", out["direction"])
    return out


def distribution(coded: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Per group: n traces, and per code the soft share (mean p) and the argmax count."""
    codes = code_columns(coded)
    rows = []
    for key, g in coded.groupby(list(by), sort=False, dropna=False):
        keys = key if isinstance(key, tuple) else (key,)
        row: dict[str, Any] = dict(zip(by, keys, strict=True))
        row["n"] = len(g)
        counts = g["label"].value_counts()
        for c in codes:
            row[f"share_{c}"] = float(g[f"p_{c}"].mean())
            row[f"n_{c}"] = int(counts.get(c, 0))
        row["modal"] = max(codes, key=lambda c: row[f"share_{c}"])
        rows.append(row)
    return pd.DataFrame(rows)


def rationale_by_condition(coded: pd.DataFrame) -> pd.DataFrame:
    """Primary-rationale distribution per condition: influence x variant x direction (arm 0 / A / B), per pair."""
    by = [c for c in ("pair", "influence", "variant", "direction") if c in coded.columns]
    return distribution(coded, by)


def rationale_by_arm(coded: pd.DataFrame) -> pd.DataFrame:
    """Primary-rationale distribution, no cue vs the pooled cued traces (the paper's figures 26-27)."""
    return distribution(coded, ["arm"]) if "arm" in coded.columns else distribution(coded.assign(arm="all"), ["arm"])


def effect_class(eff: pd.DataFrame) -> pd.Series:
    """``sig_backfire``, ``sig_compliance`` or ``not_sig`` for each (condition, direction) effect."""
    return pd.Series(
        np.where(eff["sig"], np.where(eff["backfire"], "sig_backfire", "sig_compliance"), "not_sig"),
        index=eff.index,
    )


def join_effects(coded: pd.DataFrame, eff: pd.DataFrame) -> pd.DataFrame:
    """Cued traces joined with the effect of their condition and direction (Delta, s, significance, class)."""
    keys = [k for k in COND_KEYS if k in coded.columns and k in eff.columns] + ["direction"]
    e = eff.assign(effect_class=effect_class(eff))[[*keys, "delta", "s", "p", "sig", "backfire", "effect_class"]]
    cued = coded[coded["direction"].isin(["A", "B"])]
    return cued.merge(e, on=keys, how="inner", validate="many_to_one")


def compliance_vs_effect(joined: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per condition and direction: compliance shares next to Delta, s and class; per compliance label: effects).

    The second table is the paper's figure 22 in numbers: for the traces of
    each compliance label (argmax), how many, the median and mean s(d) of their
    condition, and the share in significantly backfiring conditions.
    """
    keys = [k for k in (*COND_KEYS, "direction") if k in joined.columns]
    per = distribution(joined, keys)
    first = joined.drop_duplicates(keys).set_index(keys)[["delta", "s", "sig", "backfire", "effect_class"]]
    per = per.join(first, on=keys)
    rows = []
    for label, g in joined.groupby("label", sort=True):
        rows.append(
            {
                "compliance": label,
                "traces": len(g),
                "median_s": float(g["s"].median()),
                "mean_s": float(g["s"].mean()),
                "mean_delta": float(g["delta"].mean()),
                "share_sig_backfire": float((g["effect_class"] == "sig_backfire").mean()),
                "share_sig_compliance": float((g["effect_class"] == "sig_compliance").mean()),
            }
        )
    return per, pd.DataFrame(rows)


def backfire_patterns(joined: pd.DataFrame) -> pd.DataFrame:
    """Per factor (pair) and influence type: the primary rationales of traces in backfiring conditions.

    Traces of conditions whose s(d) < 0 (``backfire``); ``sig_backfire`` counts
    the ones whose shift is also significant. The modal rationale is by soft share.
    """
    bf = joined[joined["backfire"]]
    if bf.empty:
        return pd.DataFrame(columns=["pair", "n", "n_sig_backfire", "modal"])
    out = distribution(bf, ["pair"])
    sig = bf.groupby("pair")["effect_class"].apply(lambda s: int((s == "sig_backfire").sum()))
    out.insert(2, "n_sig_backfire", out["pair"].map(sig).astype(int))
    by_infl = distribution(bf, ["pair", "influence"])[["pair", "influence", "n", "modal"]]
    infl = by_infl.groupby("pair").apply(
        lambda g: ", ".join(f"{r.influence}: {r.modal} ({r.n})" for r in g.itertuples())
    )
    out["by_influence"] = out["pair"].map(infl)
    return out


# ============================================================ what the influence report shows
@dataclass(frozen=True)
class CodedTask:
    """One coding task of an influence run (``RUN/coding/<task>.parquet``): the judge's metadata and the tables
    computed from its codes; a table the task (or its codes) does not give is None."""

    task: str
    meta: Mapping[str, Any]
    """The coding file's metadata (judge, taxonomy, counts)."""
    by_arm: pd.DataFrame | None = None
    """Rationale: :func:`rationale_by_arm`."""
    by_condition: pd.DataFrame | None = None
    """Rationale: :func:`rationale_by_condition`."""
    joined: pd.DataFrame | None = None
    """Compliance: the cued traces joined with their effects (:func:`join_effects`), for the figure."""
    vs_effect: pd.DataFrame | None = None
    """Compliance: per condition and direction (:func:`compliance_vs_effect`)."""
    by_label: pd.DataFrame | None = None
    """Compliance: per compliance label (:func:`compliance_vs_effect`)."""
    patterns: pd.DataFrame | None = None
    """Rationale: :func:`backfire_patterns`."""


def coded_task(run: Run, task: str, eff: pd.DataFrame) -> CodedTask | None:
    """What the report shows of ``task``'s codes of ``run`` (None: not coded); ``eff`` is
    :func:`experiments.influence.effects.effects` of the run's conditions."""
    got = load_coding(run.root, task)
    if got is None:
        return None
    raw, meta = got
    coded = with_factors(raw, run)
    if coded.empty:
        return CodedTask(task, meta)
    rationale = task == "rationale"
    by_arm = rationale_by_arm(coded) if rationale else None
    by_condition = rationale_by_condition(coded) if rationale else None
    joined = join_effects(coded, eff) if "direction" in coded.columns else pd.DataFrame()
    if joined.empty:
        return CodedTask(task, meta, by_arm, by_condition)
    if task == "compliance":
        per, by_label = compliance_vs_effect(joined)
        return CodedTask(task, meta, by_arm, by_condition, joined=joined, vs_effect=per, by_label=by_label)
    return CodedTask(task, meta, by_arm, by_condition, patterns=backfire_patterns(joined))


def coded_tasks(run: Run, eff: pd.DataFrame) -> tuple[CodedTask, ...]:
    """Every coded trace task of ``run`` (:data:`TRACE_TASKS`, in order) as :func:`coded_task` gives it."""
    return tuple(t for t in (coded_task(run, task, eff) for task in TRACE_TASKS) if t is not None)
