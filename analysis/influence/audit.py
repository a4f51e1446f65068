"""The influence audit's analysis: from a run to conditions, effects, summaries and the report.

Pipeline (each step a pure function on frames; :func:`analysis.influence.results.influence_results` chains them
for the report):

1-4. :func:`experiments.influence.effects.run_conditions`: the trial cells
   (:func:`~experiments.influence.effects.trial_cells`, re-keyed by value for
   DailyDilemmas by :func:`~experiments.influence.effects.value_level`), the
   per-item sums of every condition and arm
   (:func:`~experiments.influence.effects.contributions`), and every
   condition's metrics and tests with cluster-bootstrap CIs
   (:func:`~experiments.influence.effects.condition_table`, tests of
   :mod:`experiments.influence.stats`). They live beside the experiment, which
   a follow-up designs its trials from.
5. :func:`~experiments.influence.effects.with_fdr` (BH within benchmark,
   variant and test family), the neutrality flags,
   :func:`~experiments.influence.effects.effects` (one row per condition and
   direction), and here :func:`headline`, :func:`summary_by`, the controls,
   the noise floor and the DailyDilemmas flip rates.

Cross-run summaries (models, reasoning modes) are the same pure functions over
the concatenation of per-run ``conditions.csv`` tables: :func:`combine_runs`
then :func:`summary_by` / :func:`headline`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.bootstrap import basic_ci
from analysis.influence import flags
from experiments.influence import stats as st
from experiments.influence.effects import (
    ALPHA,
    MARGIN,
    N_BOOT,
    SEED,
    effects,
    run_conditions,
    with_fdr,
)
from probe.bootstrap import cluster_weights, expanded_percentile_ci, expanded_pvalue, percentile_ci
from probe.runs import Run


# ======================================================================= summaries
def share(num: pd.Series, den: pd.Series | None = None) -> float:
    """Share of True in ``num`` (optionally among rows where ``den`` is True); NaN when empty."""
    if den is not None:
        num = num[den]
    return float(num.mean()) if len(num) else math.nan


def summary_by(cond: pd.DataFrame, by: str | Sequence[str], alpha: float = ALPHA) -> pd.DataFrame:
    """The paper's aggregate table (its Tables 5-11) grouped by ``by`` (influence, pair, model, think...).

    ``|x|`` columns average absolute values; ``steer`` is the mean signed s
    toward the cue's target; ``sig`` is the share of effects (condition x
    direction) with a significant Delta, ``practical`` (beside it) the share with
    |Delta| >= :data:`analysis.influence.flags.PRACTICAL_SHIFT`, ``bf_of_sig`` the
    share of significant effects that backfire.
    """
    keys = [by] if isinstance(by, str) else list(by)
    eff_by = dict(iter(effects(cond, alpha).groupby(keys, sort=False)))
    rows = []
    for key, g in cond.groupby(keys, sort=False):
        e = eff_by[key]
        rows.append(
            {
                **dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True)),
                "conditions": len(g),
                "f0_B": g["f0_B"].mean(),
                "fA_B": g["fA_B"].mean(),
                "fB_B": g["fB_B"].mean(),
                "|delta|": e["delta"].abs().mean(),
                "delta": e["delta"].mean(),
                "|steer|": e["s"].abs().mean(),
                "steer": e["s"].mean(),
                "asym": g["asym"].mean(),
                "|asym|": g["asym"].abs().mean(),
                "|n_asym|": g["n_asym"].abs().mean(),
                "sig": share(e["sig"]),
                "practical": flags.practical_size(e["delta"]).share,
                "bf_of_sig": share(e["backfire"], e["sig"]),
            }
        )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class MeanShift:
    """Mean |shift| with the paper's percentile CI and, beside it, a bias-corrected estimate with the basic CI."""

    value: float
    lo: float
    """The percentile CI (the paper's; biased upward with the statistic, it can exclude ``value``)."""
    hi: float
    corrected: float = math.nan
    """``2 value - mean(replicates)``, clipped at 0 (:func:`analysis.common.bootstrap.basic_ci`)."""
    corrected_lo: float = math.nan
    """The basic bootstrap CI ``[2 value - q97.5, 2 value - q2.5]``, clipped at 0."""
    corrected_hi: float = math.nan


def _mean_shift(point: float, reps: np.ndarray | None) -> MeanShift:
    if reps is None or not math.isfinite(point):
        return MeanShift(point, math.nan, math.nan)
    lo, hi = percentile_ci(reps)
    return MeanShift(point, float(lo), float(hi), *basic_ci(point, reps, lower=0.0))


def _mean_abs_delta(cond: pd.DataFrame, reps: np.ndarray | None, mask: np.ndarray) -> MeanShift:
    vals = np.abs(cond.loc[mask, ["delta_A", "delta_B"]].to_numpy())
    if vals.size == 0:
        return MeanShift(math.nan, math.nan, math.nan)
    point = float(np.nanmean(vals))
    if reps is None:
        return MeanShift(point, math.nan, math.nan)
    return _mean_shift(point, np.nanmean(np.abs(reps[:, mask, :]).reshape(reps.shape[0], -1), axis=1))


def cluster_bootstrap_reps(
    values: np.ndarray, clusters: Sequence[str] | np.ndarray, n_boot: int = N_BOOT, seed: int = SEED
) -> tuple[float, np.ndarray]:
    """Mean of ``values`` and its replicates resampling whole clusters (NaN values ignored)."""
    v = np.asarray(values, dtype=float)
    labels = np.asarray(clusters)
    uniq = list(dict.fromkeys(labels.tolist()))
    sums = np.array([np.nansum(v[labels == u]) for u in uniq])
    counts = np.array([np.sum(~np.isnan(v[labels == u])) for u in uniq])
    w = cluster_weights(["all"] * len(uniq), n_boot, np.random.default_rng(seed))
    with np.errstate(invalid="ignore", divide="ignore"):
        reps = (w @ sums) / (w @ counts)
    return float(np.nansum(sums) / np.sum(counts)), reps


def cluster_bootstrap_mean(
    values: np.ndarray, clusters: Sequence[str] | np.ndarray, n_boot: int = N_BOOT, seed: int = SEED
) -> tuple[float, float, float]:
    """Mean of ``values`` with a percentile CI resampling whole clusters (for summaries across runs)."""
    point, reps = cluster_bootstrap_reps(values, clusters, n_boot, seed)
    lo, hi = percentile_ci(reps)
    return point, float(lo), float(hi)


def headline(
    cond: pd.DataFrame, delta_reps: np.ndarray | None = None, noise: pd.DataFrame | None = None, alpha: float = ALPHA
) -> pd.DataFrame:
    """The paper's headline numbers for the main cues (variant ``cue``), as a metric / value / CI table.

    With ``delta_reps`` (one run) the CI of the mean shift comes from the item
    bootstrap; without (several runs concatenated), from a cluster bootstrap
    over (run, pair) clusters. Each mean |shift| row carries the paper's
    percentile CI (for replication) and is followed by a row with the
    bias-corrected estimate and the basic bootstrap CI
    (:func:`analysis.common.bootstrap.basic_ci`), which covers; then one row
    with the mean |shift| that sampling noise alone gives, the noise floor of
    the baseline re-run (``noise``), n/a without one.
    """
    main = (cond["variant"] == "cue").to_numpy()
    c = cond[main]
    eff = effects(c, alpha)
    rows = _Rows()
    rows.add("conditions", len(c))
    _mean_shift_rows(rows, cond, main, delta_reps)
    floor = float(noise["abs_diff"].mean()) if noise is not None and len(noise) else math.nan
    rows.add(
        "mean |shift| expected from sampling noise alone (pp)",
        100 * floor,
        note="the noise floor: mean |f0'(B) - f0(B)| of the baseline re-run"
        if math.isfinite(floor)
        else "n/a: no baseline re-run (--controls rerun)",
    )
    _significance_rows(rows, eff)
    _asymmetry_rows(rows, c)
    lean, asym = c["f0_B"] - 0.5, c["asym"]
    ok = lean.notna() & asym.notna()
    r = (
        float(np.corrcoef(lean[ok], asym[ok])[0, 1])
        if ok.sum() > 2 and lean[ok].std() > 0 and asym[ok].std() > 0
        else math.nan
    )
    rows.add("signed correlation r(f0(B) - 0.5, Asym)", r, note="negative: easier to push away from the baseline lean")
    if noise is not None and len(noise):
        floor = float(noise["abs_diff"].mean())
        rows.add("noise floor: mean |f0'(B) - f0(B)| of the re-run (pp)", 100 * floor)
        shift = next(r["value"] for r in rows.rows if r["metric"] == "mean |shift| (pp), all cues")
        rows.add(
            "shift-to-noise ratio", shift / (100 * floor) if floor > 0 else math.nan, note="n/a when the floor is 0"
        )
    out = pd.DataFrame(rows.rows)
    out["value"] = pd.Series([r["value"] for r in rows.rows], dtype=object)  # counts stay integers
    return out


class _Rows:
    """The headline table's rows: metric, value, CI and note."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, metric: str, value: float | int, lo: float = math.nan, hi: float = math.nan, note: str = "") -> None:
        self.rows.append({"metric": metric, "value": value, "ci_lo": lo, "ci_hi": hi, "note": note})


def _mean_shift_rows(rows: _Rows, cond: pd.DataFrame, main: np.ndarray, delta_reps: np.ndarray | None) -> None:
    """Mean |shift| of all main cues and of the one-sentence ones: percentile CI, then bias-corrected."""
    for label, mask in (
        ("mean |shift| (pp), all cues", main),
        ("mean |shift| (pp), one-sentence user-message cues", main & (cond["kind"] == "sentence").to_numpy()),
    ):
        if delta_reps is not None:
            ms = _mean_abs_delta(cond, delta_reps, mask)
        else:
            sub = cond[mask]
            vals = np.abs(np.concatenate([sub["delta_A"], sub["delta_B"]]))
            clusters = np.concatenate([_clusters(sub)] * 2)
            ms = _mean_shift(*cluster_bootstrap_reps(vals, clusters)) if len(vals) else MeanShift(*(math.nan,) * 3)
        boot = "item bootstrap" if delta_reps is not None else "cluster bootstrap"
        rows.add(label, 100 * ms.value, 100 * ms.lo, 100 * ms.hi, boot)
        rows.add(
            f"{label}, bias-corrected",
            100 * ms.corrected,
            100 * ms.corrected_lo,
            100 * ms.corrected_hi,
            f"{boot}, basic CI: 2 x estimate - replicates (the percentile CI above is biased upward with |shift|)",
        )


def _significance_rows(rows: _Rows, eff: pd.DataFrame) -> None:
    """Shares of effects significant, practically large, and backfiring (overall and by relation)."""
    size = flags.practical_size(eff["delta"])
    thr = f"{100 * flags.PRACTICAL_SHIFT:g} pp"
    rows.add("effects with significant shift (raw)", share(eff["sig"]), note=flags.practical_note(size))
    rows.add("effects with significant shift (BH-FDR)", share(eff["sig_bh"]), note=flags.practical_note(size))
    rows.add(
        f"effects with |shift| >= {thr} (practical threshold)", size.share, note=f"{size.practical} of {size.effects}"
    )
    big = eff["delta"].abs() >= flags.PRACTICAL_SHIFT - 1e-12
    rows.add(f"  significant effects (raw) with |shift| >= {thr}", share(big, eff["sig"]))
    rows.add("backfire share of significant effects (raw)", share(eff["backfire"], eff["sig"]))
    rows.add("backfire share of significant effects (BH-FDR)", share(eff["backfire"], eff["sig_bh"]))
    for rel in ("neutral", "toward_preferred", "away_from_preferred"):
        sub = eff["relation"] == rel
        rows.add(
            f"backfire share of significant effects, {rel.replace('_', ' ')}", share(eff["backfire"], eff["sig"] & sub)
        )


def _asymmetry_rows(rows: _Rows, c: pd.DataFrame) -> None:
    """Shares of conditions with significant asymmetry, overall and among the baseline-neutral ones."""
    asym_note = flags.practical_note(flags.practical_size(c["asym"], flags.PRACTICAL_ASYM), unit="log-odds")
    rows.add("conditions with significant asymmetry (raw)", share(c["sig_asym"]), note=asym_note)
    rows.add("conditions with significant asymmetry (BH-FDR)", share(c["sig_asym_bh"]), note=asym_note)
    for col, label in (
        ("neutral_binom", "test of f0(B) = 1/2"),
        ("neutral_margin", f"|f0(B) - 0.5| < {MARGIN}"),
        ("neutral_ci", f"CI inside [{0.5 - MARGIN}, {0.5 + MARGIN}]"),
    ):
        neutral = c[col].astype(bool)
        note = flags.practical_note(flags.practical_size(c.loc[neutral, "asym"], flags.PRACTICAL_ASYM), "log-odds")
        rows.add(f"baseline-neutral conditions ({label})", int(neutral.sum()))
        rows.add(
            f"  neutral ({label}): share with significant asymmetry (raw)", share(c["sig_asym"], neutral), note=note
        )
        rows.add(
            f"  neutral ({label}): share with significant asymmetry (BH-FDR)",
            share(c["sig_asym_bh"], neutral),
            note=note,
        )


def _clusters(cond: pd.DataFrame) -> np.ndarray:
    run = cond["run"].astype(str) if "run" in cond.columns else pd.Series("", index=cond.index)
    return (run + "|" + cond["pair"].astype(str)).to_numpy()


def noise_floor(cells: pd.DataFrame) -> pd.DataFrame:
    """Per pair: the baseline and its re-run (same items), and their absolute difference (the noise floor)."""
    rows = []
    for pair, g in cells.groupby("pair", sort=False):
        base, rerun = g[g["direction"] == "base"], g[g["direction"] == "rerun"]
        common = set(base["item_id"]) & set(rerun["item_id"])
        if not common:
            continue
        b, r = base[base["item_id"].isin(common)], rerun[rerun["item_id"].isin(common)]
        f0, f1 = b["k"].sum() / b["n"].sum(), r["k"].sum() / r["n"].sum()
        rows.append({"pair": pair, "items": len(common), "f0_B": f0, "f0_B_rerun": f1, "abs_diff": abs(f1 - f0)})
    return pd.DataFrame(rows, columns=["pair", "items", "f0_B", "f0_B_rerun", "abs_diff"])


def placebo_gap(cond: pd.DataFrame) -> pd.DataFrame:
    """Informative vs irrelevant cue (J.1): mean |s| of the cue and of its placebo, and the gap, per influence."""
    keys = ["pair", "influence", "position", "bracket"]
    cue, pla = cond[cond["variant"] == "cue"], cond[cond["variant"] == "placebo"]
    m = cue.merge(pla, on=keys, suffixes=("", "_placebo"))
    if m.empty:
        return pd.DataFrame(columns=["influence", "conditions", "|s| cue", "|s| placebo", "gap"])
    m["abs_s"] = (m["s_A"].abs() + m["s_B"].abs()) / 2
    m["abs_s_placebo"] = (m["s_A_placebo"].abs() + m["s_B_placebo"].abs()) / 2
    out = m.groupby("influence", sort=False).agg(
        conditions=("pair", "size"), **{"|s| cue": ("abs_s", "mean"), "|s| placebo": ("abs_s_placebo", "mean")}
    )
    out["gap"] = out["|s| cue"] - out["|s| placebo"]
    return out.reset_index()


def negation_match(cond: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """Negated cues (J.3): does "not prefer A" act like "prefer B"?

    Per influence: among the (condition, direction d) where the plain cue
    toward d has a significant shift, the share where the negated cue that
    points to d (it names the other side) shifts the same way.
    """
    keys = ["pair", "influence", "position", "bracket"]
    cue, neg = cond[cond["variant"] == "cue"], cond[cond["variant"] == "negated"]
    m = cue.merge(neg, on=keys, suffixes=("", "_neg"))
    rows = []
    for infl, g in m.groupby("influence", sort=False):
        hits, n = 0, 0
        for d in ("A", "B"):
            sig = g[f"p_delta_{d}"] < alpha
            n += int(sig.sum())
            hits += int((np.sign(g.loc[sig, f"delta_{d}"]) == np.sign(g.loc[sig, f"delta_{d}_neg"])).sum())
        rows.append({"influence": infl, "significant cue effects": n, "negation match": hits / n if n else math.nan})
    return pd.DataFrame(rows, columns=["influence", "significant cue effects", "negation match"])


def flip_rates(cells: pd.DataFrame) -> pd.DataFrame:
    """Sample-level flip rates (the paper's DailyDilemmas G.2), per influence and overall.

    For each dilemma, cue and target value, the choice without and with the
    cue: the side chosen by most answers over both printed orders (sampled
    runs: majority vote; logit runs: mean probability above 1/2; exact ties
    are left out). Overall: the share of choices that change. Toward: among
    baselines choosing the other value, the share switching to the target.
    Away: among baselines already choosing the target, the share switching
    away (sample-level backfire).
    """
    cols = ["influence", "comparisons", "overall", "toward", "away"]
    base = cells[cells["direction"] == "base"].groupby("item_id")[["n", "k"]].sum()
    base_choice = _choice(base)
    cued = cells[cells["direction"].isin(["A", "B"]) & (cells["variant"] == "cue")]
    if cued.empty or base.empty:
        return pd.DataFrame(columns=cols)
    keys = ["item_id", "influence", "position", "bracket", "direction"]
    agg = cued.groupby(keys, sort=False)[["n", "k"]].sum().reset_index()
    agg["choice"] = _choice(agg).to_numpy()
    agg["base"] = agg["item_id"].map(base_choice)
    agg = agg.dropna(subset=["choice", "base"])
    agg["flipped"] = agg["choice"] != agg["base"]
    agg["on_target"] = agg["base"] == agg["direction"]
    rows = []
    for name, g in [*agg.groupby("influence", sort=False), ("all", agg)]:
        rows.append(
            {
                "influence": name,
                "comparisons": len(g),
                "overall": share(g["flipped"]),
                "toward": share(g["flipped"], ~g["on_target"]),
                "away": share(g["flipped"], g["on_target"]),
            }
        )
    return pd.DataFrame(rows, columns=cols)


def _choice(df: pd.DataFrame) -> pd.Series:
    """The side most answers chose (B, A), or None for a tie or no answers."""
    f = df["k"] / df["n"]
    side = pd.Series(None, index=df.index, dtype=object)
    side[f > 0.5] = "B"
    side[f < 0.5] = "A"
    return side


def response_quality(cells: pd.DataFrame, source: str) -> pd.DataFrame:
    """Per arm: mean option coverage (logit runs) or the shares of refusals and invalid answers (sampled runs)."""
    g = cells.assign(arm=np.where(cells["direction"].isin(["A", "B"]), "cued", cells["direction"])).groupby(
        "arm", sort=False
    )
    if source == "readout":
        return g.agg(trials=("trial_id", "size"), coverage=("coverage", "mean")).reset_index()
    tot = g[["n_ok", "n_refusal", "n_invalid", "n_error"]].sum()
    all_ = tot.sum(axis=1)
    return pd.DataFrame(
        {
            "arm": tot.index,
            "answers": all_.to_numpy(),
            "refusal": (tot["n_refusal"] / all_).to_numpy(),
            "invalid": (tot["n_invalid"] / all_).to_numpy(),
            "error": (tot["n_error"] / all_).to_numpy(),
        }
    )


# ======================================================================= cross-run
def combine_runs(tables: Iterable[pd.DataFrame], alpha: float = ALPHA) -> pd.DataFrame:
    """Concatenate per-run condition tables (``conditions.csv``) and redo BH within benchmark x variant x family.

    Each table carries ``benchmark``, ``model``, ``think`` and ``run``; the
    summaries then group by them (:func:`summary_by` with ``["model", "think"]``
    or ``"think"``), and :func:`headline` uses cluster-bootstrap CIs.
    """
    parts = list(tables)
    if not parts:
        raise ValueError("combine_runs needs at least one condition table")
    missing = [i for i, t in enumerate(parts) if not {"benchmark", "model", "think", "run"} <= set(t.columns)]
    if missing:
        raise ValueError(f"condition tables {missing} lack benchmark/model/think/run columns; use conditions.csv")
    return with_fdr(pd.concat(parts, ignore_index=True), ("benchmark", "variant"), alpha)


def panel_tables(cond: pd.DataFrame, alpha: float = ALPHA) -> dict[str, pd.DataFrame]:
    """The cross-run tables of the paper from a :func:`combine_runs` frame (main cues only).

    ``headline``: the headline metrics per benchmark (cluster-bootstrap CIs);
    ``by_influence``, ``by_pair``, ``by_model`` (model x reasoning mode),
    ``by_reasoning`` and ``by_influence_reasoning`` (how reasoning reshapes
    each cue type), each per benchmark.
    """
    main = cond[cond["variant"] == "cue"]
    heads = [headline(g, alpha=alpha).assign(benchmark=b) for b, g in main.groupby("benchmark", sort=False)]
    return {
        "headline": pd.concat(heads, ignore_index=True) if heads else pd.DataFrame(),
        "by_influence": summary_by(main, ["benchmark", "influence"], alpha),
        "by_pair": summary_by(main, ["benchmark", "pair"], alpha),
        "by_model": summary_by(main, ["benchmark", "model", "think"], alpha),
        "by_reasoning": summary_by(main, ["benchmark", "think"], alpha),
        "by_influence_reasoning": summary_by(main, ["benchmark", "influence", "think"], alpha),
    }


# ========================================================================== report


def _names(values: pd.Series) -> str:
    """The group names a pair's side takes (BBQ pairs can mix several per side)."""
    uniq = list(dict.fromkeys(values))
    return "/".join(uniq) if len(uniq) <= 3 else f"{len(uniq)} groups"


@dataclass(frozen=True)
class Audit:
    """Everything the report shows for one run."""

    benchmark: str
    source: str
    info: Mapping[str, Any]
    cells: pd.DataFrame
    """One row per trial, as asked (before any re-keying)."""
    conditions: pd.DataFrame
    delta_reps: np.ndarray
    noise: pd.DataFrame
    flips: pd.DataFrame | None
    reps: Mapping[str, np.ndarray] | None = None
    """``(n_boot, conditions)`` bootstrap replicates of every metric (:class:`ConditionResult`)."""
    units: tuple[tuple[str, str], ...] = ()
    """(item, stratum) in the bootstrap's order: two audits with equal units drew the same resamples (paired)."""
    clusters: np.ndarray | None = None
    """Per condition (row of :attr:`conditions`), the clusters its bootstrap resamples."""


def analyze(run: Run, benchmark: str, *, n_boot: int = N_BOOT, seed: int = SEED, source: str | None = None) -> Audit:
    """Run the whole analysis of one influence run, from ``source`` (``readout`` / ``samples``; None: the run's own
    choice, readouts first)."""
    man = run.manifest
    measured = run_conditions(run, benchmark, n_boot=n_boot, seed=seed, source=source)
    raw, cells, source, res = measured.cells, measured.keyed, measured.source, measured.result
    info = {
        "benchmark": benchmark,
        "model": man.model,
        "think": man.think,
        "run": str(run.root),
        "source": source,
    }
    table = res.table.assign(**info)
    for pos, side in ((1, "group_a"), (2, "group_b")):
        names = cells.groupby("pair", sort=False)[side].agg(_names)
        table.insert(pos, side, table["pair"].map(names))
    table = with_fdr(table, ("benchmark", "variant"))
    return Audit(
        benchmark=benchmark,
        source=source,
        info=info,
        cells=raw,
        conditions=table,
        delta_reps=res.delta_reps,
        noise=noise_floor(raw),
        flips=flip_rates(raw) if benchmark == "dd" else None,
        reps=res.reps,
        units=tuple(cells.drop_duplicates("item_id")[["item_id", "stratum"]].itertuples(index=False, name=None)),
        clusters=res.clusters,
    )


def analyze_sources(run: Run, benchmark: str, *, n_boot: int = N_BOOT, seed: int = SEED) -> tuple[Audit, ...]:
    """One :class:`Audit` per source the run holds (:attr:`probe.runs.Run.sources`): readouts
    first. A run with both is reported side by side (:func:`source_agreement`)."""
    return tuple(analyze(run, benchmark, n_boot=n_boot, seed=seed, source=s) for s in run.sources)


AGREEMENT_METRICS = {"delta_A": "shift", "delta_B": "shift", "s_A": "steerability", "s_B": "steerability"}
AGREEMENT_METRICS["asym"] = "asymmetry"
"""The effects compared across sources, and the test family each belongs to (BH within benchmark x variant x
family, as the conditions' own tests)."""


def source_agreement(readout: Audit, samples: Audit, alpha: float = ALPHA) -> pd.DataFrame:
    """Per condition and effect: the readout and the sampled estimate, their difference and its test.

    Where both audits resampled the same items (equal :attr:`Audit.units`, the same seed and number of
    replicates: the case for a run's two sources) the difference's CI and standard error come from the
    **paired** replicates (one item resample reweights both sources, so the shared prompts cancel), with the
    small-sample correction of a bootstrap over few clusters (the expanded percentile interval and its t test,
    :func:`probe.bootstrap.expanded_pvalue`: a z test on the paired SE at 9 item clusters found 5 of 175
    disagreements on a sim subject whose sources agree by construction); otherwise from the two independent
    standard errors and a z test. BH-FDR within benchmark x variant x family (shift, steerability, asymmetry);
    ``disagree``: q < ``alpha``.
    """
    from experiments.influence import COND

    cols = list(COND)
    r, s = readout.conditions, samples.conditions
    if readout.reps is None or samples.reps is None:
        raise ValueError("source_agreement needs audits with their replicates (analyze() keeps them)")
    key_r = [tuple(x) for x in r[cols].itertuples(index=False, name=None)]
    key_s = {tuple(x): i for i, x in enumerate(s[cols].itertuples(index=False, name=None))}
    both = [(i, key_s[k]) for i, k in enumerate(key_r) if k in key_s]
    ir, is_ = np.array([a for a, _ in both], dtype=int), np.array([b for _, b in both], dtype=int)
    clusters = readout.clusters[ir] if readout.clusters is not None else None
    same = readout.units == samples.units and readout.reps["s_A"].shape == samples.reps["s_A"].shape
    paired = same and clusters is not None
    parts = []
    for metric, family in AGREEMENT_METRICS.items():
        est_r, est_s = r[metric].to_numpy()[ir], s[metric].to_numpy()[is_]
        if paired and clusters is not None:
            diff_reps = readout.reps[metric][:, ir] - samples.reps[metric][:, is_]
            se = st.nan_sd(diff_reps)
            lo, hi = expanded_percentile_ci(diff_reps, clusters)
            p = expanded_pvalue(est_r - est_s, se, clusters)
        else:
            se = np.hypot(r[f"{metric}_se"].to_numpy()[ir], s[f"{metric}_se"].to_numpy()[is_])
            lo, hi = est_r - est_s - 1.96 * se, est_r - est_s + 1.96 * se
            p = st.z_pvalue(st.z_from_se(est_r - est_s, se))
        part = r.iloc[ir][["benchmark", *cols]].reset_index(drop=True)
        part = part.assign(metric=metric, family=family, readout=est_r, samples=est_s, diff=est_r - est_s)
        part["diff_lo"], part["diff_hi"], part["diff_se"] = lo, hi, se
        part["p"] = p
        part["paired"] = paired
        parts.append(part)
    out = pd.concat(parts, ignore_index=True)
    out["q"] = np.nan
    for _, idx in out.groupby(["benchmark", "variant", "family"], sort=False).groups.items():
        out.loc[idx, "q"] = st.bh_adjust(out.loc[idx, "p"])
    out["disagree"] = out["q"] < alpha
    return out
