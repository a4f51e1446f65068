"""Paper 000's appendix statistics that the main report does not print: Table 21, I.9, I.12, Table 4, Table 11's BB.

Small pure functions, frames in, frames out (the report and ``probe compare``
only format and draw them):

* :func:`neutral_asym_table` (Table 21): the share of baseline-neutral
  conditions with a significant Asym, for the paper's three neutrality
  definitions (binomial test at 0.05; ``|f0(B) - 0.5| < 0.05``; the 95% Wilson CI
  of f0(B) inside [0.45, 0.55]) x the thresholds 0.05, 0.01, 0.001 on the Asym
  test's p-value and BH-FDR (q < 0.05, within the benchmark's main cues).
* :func:`larger_group` and :func:`larger_by_ratio` (I.9, Figures 15-19): how
  often the larger group is picked, per size pair and per size ratio, per arm.
* :func:`invalid_rates` (I.12): refused, invalid and failed answers per
  condition and arm, split by which side carries the larger N.
* :func:`flip_rates_by_value` (Table 4): DailyDilemmas' sample-level flip
  rates per target value.
* :func:`baseline_bias` (Table 11's BB): the mean frequency of the preferred
  option without context, ``max(f0(B), 1 - f0(B))``, with a normal 95% CI of
  the mean over conditions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from experiments.influence.stats import bh_adjust

ALPHAS = (0.05, 0.01, 0.001)
"""Table 21's raw thresholds on ``p_asym`` (BH-FDR is the fourth column)."""
NEUTRALITY = (
    ("binom", "neutral_binom", "binom alpha=.05"),
    ("margin", "neutral_margin", "margin |f0(B)-0.5|<.05"),
    ("wilson", "neutral_ci", "Wilson CI in [0.45, 0.55]"),
    ("all", "", "every condition"),
)
"""(key, condition-table column, label) of Table 21's rows; the last, every main-cue condition, is the rate the
paper quotes beside it ("detectable in 18.5% of all conditions")."""
Z95 = 1.959963984540054


def _main(cond: pd.DataFrame) -> pd.DataFrame:
    return cond[cond["variant"] == "cue"] if "variant" in cond.columns else cond


def neutral_asym_table(
    cond: pd.DataFrame, alphas: Sequence[float] = ALPHAS, by: str = "benchmark", p: str = "p_asym"
) -> pd.DataFrame:
    """Table 21 of the main-cue conditions of ``cond`` (a condition table with ``neutral_*`` and the p column ``p``).

    One row per ``by`` value and neutrality definition: ``n_neutral`` and, per threshold, the share of those
    conditions with ``p < alpha`` (``sig_<alpha>``) and with a BH-FDR q-value below 0.05 (``sig_bh``), the
    q-values taken over every main-cue condition of the ``by`` group, then restricted to the neutral ones (as
    the paper does: "BH-FDR within each benchmark"). NaN where no condition is neutral. ``p`` is ``p_asym``
    (this project's Wald test, the baseline variance counted four times) or ``p_asym_2x`` (the paper's, counted
    twice: s(A) and s(B) treated as independent)."""
    rows = []
    main = _main(cond)
    for key, g in main[main[p].notna()].groupby(by, sort=False):  # a run without this test's p takes no part
        q = bh_adjust(g[p].to_numpy(float))
        for name, col, label in NEUTRALITY:
            mask = g[col].astype(bool).to_numpy() if col else np.ones(len(g), dtype=bool)
            pv, qv = g[p].to_numpy(float)[mask], q[mask]
            row: dict[str, object] = {by: key, "neutrality": name, "definition": label, "n_neutral": int(mask.sum())}
            for a in alphas:
                row[f"sig_{a:g}"] = float(np.mean(pv < a)) if mask.any() else math.nan
            row["sig_bh"] = float(np.mean(qv < 0.05)) if mask.any() else math.nan
            rows.append(row)
    cols = [by, "neutrality", "definition", "n_neutral", *(f"sig_{a:g}" for a in alphas), "sig_bh"]
    return pd.DataFrame(rows, columns=cols)


# ============================================================================ I.9: the larger group
def _sized(cells: pd.DataFrame) -> pd.DataFrame:
    """Trials with two different group sizes, with the sizes as numbers and the answers choosing the larger."""
    if not {"n_a", "n_b"} <= set(cells.columns):
        return cells.iloc[0:0].assign(small=0, large=0, larger=0.0)
    c = cells.assign(n_a=pd.to_numeric(cells["n_a"], errors="coerce"), n_b=pd.to_numeric(cells["n_b"], errors="coerce"))
    c = c[c["n_a"].notna() & c["n_b"].notna() & (c["n_a"] != c["n_b"])]
    keep = c["direction"].isin(["base", "A", "B"]) & c["variant"].isin(["none", "cue"])
    c = c[keep]
    larger = np.where(c["n_b"] > c["n_a"], c["k"], c["n"] - c["k"])
    return c.assign(small=np.minimum(c["n_a"], c["n_b"]), large=np.maximum(c["n_a"], c["n_b"]), larger=larger)


def larger_group(cells: pd.DataFrame) -> pd.DataFrame:
    """How often the larger group is picked, per pair, arm (``base``, cue toward ``A`` / ``B``; main cues pooled
    over influence types) and (smaller, larger) size: ``answers`` (valid answers, or readouts), ``larger``
    (answers for the larger group; readouts: summed probability) and ``rate``. Equal sizes are left out."""
    cols = ["pair", "arm", "small", "large", "answers", "larger", "rate"]
    c = _sized(cells)
    if c.empty:
        return pd.DataFrame(columns=cols)
    g = c.groupby(["pair", "direction", "small", "large"], sort=False)[["n", "larger"]].sum().reset_index()
    g = g.rename(columns={"direction": "arm", "n": "answers"})
    g["small"], g["large"] = g["small"].astype(int), g["large"].astype(int)
    g["rate"] = g["larger"] / g["answers"]
    return g[cols].sort_values(["pair", "arm", "small", "large"], kind="stable").reset_index(drop=True)


def larger_by_ratio(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`larger_group`'s table pooled by size ratio (larger / smaller, 3 decimals) per pair and arm."""
    cols = ["pair", "arm", "ratio", "answers", "larger", "rate"]
    if table.empty:
        return pd.DataFrame(columns=cols)
    t = table.assign(ratio=(table["large"] / table["small"]).round(3))
    g = t.groupby(["pair", "arm", "ratio"], sort=True)[["answers", "larger"]].sum().reset_index()
    g["rate"] = g["larger"] / g["answers"]
    return g[cols]


def larger_summary(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`larger_group`'s table pooled over sizes: the share of answers for the larger group per pair and arm,
    and over all pairs (``pair`` = ``all``)."""
    cols = ["pair", "arm", "answers", "larger", "rate"]
    if table.empty:
        return pd.DataFrame(columns=cols)
    per = table.groupby(["pair", "arm"], sort=False)[["answers", "larger"]].sum().reset_index()
    tot = table.groupby("arm", sort=False)[["answers", "larger"]].sum().reset_index().assign(pair="all")
    out = pd.concat([per, tot], ignore_index=True)
    out["rate"] = out["larger"] / out["answers"]
    return out[cols]


# ============================================================================ I.12: invalid responses
def larger_side(n_a: pd.Series, n_b: pd.Series) -> pd.Series:
    """Which side carries the larger N: ``A``, ``B``, ``equal``, or ``n/a`` where the trial has no sizes."""
    a, b = pd.to_numeric(n_a, errors="coerce"), pd.to_numeric(n_b, errors="coerce")
    side = np.where(a > b, "A", np.where(b > a, "B", "equal"))
    return pd.Series(np.where(a.isna() | b.isna(), "n/a", side), index=n_a.index)


def invalid_rates(cells: pd.DataFrame) -> pd.DataFrame:
    """Per pair, influence, arm (``base``, ``rerun``, ``A``, ``B``) and the side with the larger N: the sampled
    answers, the shares refused, invalid and failed, and ``invalid_any`` (all three: what the paper discards as
    invalid). Sampled runs only (readouts have no invalid answers): an empty table otherwise."""
    cols = ["pair", "influence", "arm", "larger_n", "answers", "refusal", "invalid", "error", "invalid_any"]
    need = {"n_ok", "n_refusal", "n_invalid", "n_error"}
    if not need <= set(cells.columns) or cells.empty:
        return pd.DataFrame(columns=cols)
    n_a = cells["n_a"] if "n_a" in cells.columns else pd.Series(np.nan, index=cells.index)
    n_b = cells["n_b"] if "n_b" in cells.columns else pd.Series(np.nan, index=cells.index)
    c = cells.assign(larger_n=larger_side(n_a, n_b), arm=cells["direction"])
    c = c[c["variant"].isin(["none", "cue"])]
    keys = ["pair", "influence", "arm", "larger_n"]
    g = c.groupby(keys, sort=False)[["n_ok", "n_refusal", "n_invalid", "n_error"]].sum()
    answers = g.sum(axis=1)
    out = pd.DataFrame(
        {
            "answers": answers,
            "refusal": g["n_refusal"] / answers,
            "invalid": g["n_invalid"] / answers,
            "error": g["n_error"] / answers,
            "invalid_any": (g["n_refusal"] + g["n_invalid"] + g["n_error"]) / answers,
        }
    ).reset_index()
    return out[cols]


def invalid_by_arm(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`invalid_rates` pooled over pairs and influences: per arm and larger side, the share invalid."""
    cols = ["arm", "larger_n", "answers", "invalid_any"]
    if table.empty:
        return pd.DataFrame(columns=cols)
    bad = table["invalid_any"] * table["answers"]
    g = table.assign(bad=bad).groupby(["arm", "larger_n"], sort=False)[["answers", "bad"]].sum().reset_index()
    g["invalid_any"] = g["bad"] / g["answers"]
    return g[cols]


# ============================================================================ Table 4: flips per value
def _side(df: pd.DataFrame) -> pd.Series:
    """The side most answers chose (``B``, ``A``), None for an exact tie."""
    f = df["k"] / df["n"]
    side = pd.Series(None, index=df.index, dtype=object)
    side[f > 0.5] = "B"
    side[f < 0.5] = "A"
    return side


def flip_rates_by_value(cells: pd.DataFrame) -> pd.DataFrame:
    """DailyDilemmas' sample-level flip rates (G.2) per target value (Table 4): for each dilemma, cue and
    direction, the majority choice with the cue against the baseline's (exact ties left out); the target value
    is side A's value under a cue toward A, side B's under a cue toward B. ``overall``: share changed;
    ``toward``: among baselines choosing the other value, share switching to the target; ``away``: among
    baselines already choosing the target, share switching away."""
    cols = ["value", "comparisons", "overall", "toward", "away"]
    base = cells[cells["direction"] == "base"].groupby("item_id")[["n", "k"]].sum()
    cued = cells[cells["direction"].isin(["A", "B"]) & (cells["variant"] == "cue")]
    if cued.empty or base.empty:
        return pd.DataFrame(columns=cols)
    keys = ["item_id", "group_a", "group_b", "influence", "position", "bracket", "direction"]
    agg = cued.groupby(keys, sort=False)[["n", "k"]].sum().reset_index()
    agg["choice"] = _side(agg).to_numpy()
    agg["base"] = agg["item_id"].map(_side(base))
    agg = agg.dropna(subset=["choice", "base"])
    agg["value"] = np.where(agg["direction"] == "A", agg["group_a"], agg["group_b"])
    agg["flipped"] = agg["choice"] != agg["base"]
    agg["on_target"] = agg["base"] == agg["direction"]
    rows = []
    for name, g in [*agg.groupby("value", sort=True), ("all", agg)]:
        toward, away = g[~g["on_target"]], g[g["on_target"]]
        rows.append(
            {
                "value": name,
                "comparisons": len(g),
                "overall": float(g["flipped"].mean()) if len(g) else math.nan,
                "toward": float(toward["flipped"].mean()) if len(toward) else math.nan,
                "away": float(away["flipped"].mean()) if len(away) else math.nan,
            }
        )
    return pd.DataFrame(rows, columns=cols)


# ============================================================================ Table 11: BB
def baseline_bias(cond: pd.DataFrame, by: Sequence[str] = ("benchmark", "think")) -> pd.DataFrame:
    """Table 11's BB per ``by`` group of the main-cue conditions of ``cond``: the mean of ``max(f0(B), 1 - f0(B))``
    (0.5 impartial, 1 fully biased) with a normal 95% CI of the mean (``mean +- 1.96 sd / sqrt(n)``, sd with
    ``n - 1``)."""
    cols = [*by, "conditions", "bb", "bb_lo", "bb_hi"]
    main = _main(cond)
    if main.empty:
        return pd.DataFrame(columns=cols)
    bb = np.maximum(main["f0_B"], 1 - main["f0_B"])
    rows = []
    for key, g in main.assign(bb=bb).groupby(list(by), sort=False):
        x = g["bb"].to_numpy(float)
        half = Z95 * float(np.std(x, ddof=1)) / math.sqrt(len(x)) if len(x) > 1 else math.nan
        keys = key if isinstance(key, tuple) else (key,)
        rows.append(
            {
                **dict(zip(by, keys, strict=True)),
                "conditions": len(x),
                "bb": x.mean(),
                "bb_lo": x.mean() - half,
                "bb_hi": x.mean() + half,
            }
        )
    return pd.DataFrame(rows, columns=cols)


# ============================================================================ Tables 3 and 13, Figures 13 and 14
def value_counts(cells: pd.DataFrame) -> pd.DataFrame:
    """Table 3: how often each primary value occurs among the retained DailyDilemmas (each dilemma counts once for
    each of its two options' values, so the counts sum to twice the dilemmas)."""
    items = cells.drop_duplicates("item_id")[["group_a", "group_b"]]
    counts = pd.concat([items["group_a"], items["group_b"]]).value_counts()
    out = counts.rename_axis("value").reset_index(name="count")
    return out.sort_values(["count", "value"], ascending=[False, True], kind="stable").reset_index(drop=True)


def max_asym_by_pair(cond: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Table 13: per pair (and per benchmark, model and reasoning mode where ``cond`` holds several), the main-cue
    condition with the largest |Asym|: f0(B), f_A(B), f_B(B) with a flag where the shift from f0(B) is significant
    (raw ``alpha``; the paper's asterisk), mean |Delta|, s(A), s(B) and Asym (flagged where ``p_asym < alpha``)."""
    main = _main(cond)
    keys = [c for c in ("benchmark", "model", "think") if c in main.columns and main[c].nunique() > 1] + ["pair"]
    stats = ["influence", "f0_B", "fA_B", "fB_B", "abs_effect", "s_A", "s_B", "asym", "sig_A", "sig_B", "sig_asym"]
    if main.empty:
        return pd.DataFrame(columns=[*keys, *stats])
    top = main.loc[main["asym"].abs().groupby([main[k] for k in keys], sort=False).idxmax()]
    out = top[[*keys, "influence", "f0_B", "fA_B", "fB_B", "s_A", "s_B", "asym"]].assign(
        abs_effect=(top["delta_A"].abs() + top["delta_B"].abs()) / 2,
        sig_A=top["p_delta_A"] < alpha,
        sig_B=top["p_delta_B"] < alpha,
        sig_asym=top["p_asym"] < alpha,
    )
    return out[[*keys, *stats]].reset_index(drop=True)


def steer_long(cond: pd.DataFrame) -> pd.DataFrame:
    """Figures 5, 7, 10(a), 13 and 14's data: one row per main-cue condition and direction with the steerability
    ``s`` toward the cue's side, the baseline bias ``|f0(B) - 0.5|`` and whether the cue pushes toward the side the
    baseline prefers (``toward_preferred``; NaN at an exact tie)."""
    cols = ["benchmark", "model", "think", "pair", "influence", "direction", "s", "baseline_bias", "toward_preferred"]
    main = _main(cond)
    parts = []
    for d, s_col in (("A", "s_A"), ("B", "s_B")):
        pref = np.where(main["f0_B"] > 0.5, "B", np.where(main["f0_B"] < 0.5, "A", ""))
        toward = pd.Series(pref == d, index=main.index).where(pref != "", np.nan)
        parts.append(
            pd.DataFrame(
                {
                    "benchmark": main["benchmark"],
                    "model": main["model"] if "model" in main.columns else "",
                    "think": main["think"] if "think" in main.columns else False,
                    "pair": main["pair"],
                    "influence": main["influence"],
                    "direction": d,
                    "s": main[s_col],
                    "baseline_bias": (main["f0_B"] - 0.5).abs(),
                    "toward_preferred": toward,
                }
            )
        )
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)
