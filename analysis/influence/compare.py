"""The influence audit across a panel of runs (paper 000's model and reasoning comparisons).

``probe compare`` on runs of ``influence-triage``, ``influence-bbq`` and
``influence-dd`` (one panel may pool the three benchmarks) writes:

1. **Matched conditions.** Within a benchmark, runs are matched on the items
   they all hold (:func:`probe.panel.shared_items`) and then on the
   conditions (pair x influence x variant x kind x position x bracket) every
   run has; what was dropped is listed in ``dropped_items.csv`` and
   ``dropped_conditions.csv``. Each run's condition table is recomputed on the
   matched items (:func:`analysis.influence.condition_table`), and BH-FDR is
   redone within benchmark x variant x test family over all runs
   (:func:`analysis.influence.combine_runs`).
2. **Per-model and per-reasoning-mode tables** (:func:`analysis.influence.panel_tables`).
3. **Reasoning on minus off.** For each ``(reasoning off, reasoning on)`` pair
   of one model, per condition and cue direction d: ``s_on(d) - s_off(d)``;
   per influence type and direction: the change of the mean signed s and of
   the mean |s| (and its percent change, the paper's Figure 10), each with a
   95% **paired percentile bootstrap over items**: both runs hold the same
   matched items, so one multinomial draw of items (within strata, the
   one-run report's scheme and seed) reweights both runs at once and the
   difference is taken replicate by replicate. A cue is *amplified* when the
   CI of the change of mean |s| lies above 0, *dampened* when below.
4. **|Asym| on |baseline bias|**, main cues, per benchmark and pooled (with
   benchmark offsets), by :func:`fit_asym`: statsmodels MixedLM (REML) with
   crossed random intercepts (the paper's text) and with factor and influence
   nested in model x reasoning (the paper's code), the marginal R^2 of
   Nakagawa & Schielzeth, the share of the |bias| term alone, and every
   optimizer attempt and warning (``asym_model`` picks the headline).

Imported runs (``probe import``) join a panel with their condition tables as
they are: no item matching and no reasoning change for them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.influence_flags import PRACTICAL_SHIFT
from probe.panel import Panel, PanelError, PanelRun, open_store, shared_items

BENCHMARK_OF = {"influence-triage": "triage", "influence-bbq": "bbq", "influence-dd": "dd"}
IMPORTED = "influence-import"
"""The experiment of a ``probe import`` run: per-condition counts, no items."""
N_BOOT = 1000
SEED = 0
ALPHA = 0.05
FORMULA = "abs_asym ~ baseline_bias"
VC_FORMULA = {
    "model_reasoning": "0 + C(model_reasoning)",
    "factor": "0 + C(factor)",
    "influence": "0 + C(influence)",
}
"""Crossed random intercepts: one variance component per grouping, all within a single statsmodels group."""


def benchmark_of(experiment: str) -> str:
    """``influence-triage`` -> ``triage`` (and bbq, dd)."""
    if experiment not in BENCHMARK_OF:
        raise PanelError(f"{experiment!r} is not an influence benchmark; expected one of {sorted(BENCHMARK_OF)}")
    return BENCHMARK_OF[experiment]


# ============================================================================ matching
@dataclass(frozen=True)
class Matched:
    """The runs of one benchmark on their shared items and conditions, as aligned arrays.

    ``n[r, c, i, j]`` / ``k[r, c, i, j]``: answers and answers choosing B of run
    ``r``, arm ``c`` (0, A, B), condition ``i``, item ``j``. All runs share the
    items (and their strata), so one set of bootstrap weights reweights them all.
    """

    benchmark: str
    runs: tuple[PanelRun, ...]
    sources: tuple[str, ...]
    conditions: pd.DataFrame
    """The condition columns (:data:`analysis.influence.COND`) plus ``group_a`` and ``group_b``."""
    items: tuple[str, ...]
    strata: tuple[str, ...]
    n: np.ndarray
    k: np.ndarray
    dropped_items: pd.DataFrame
    dropped_conditions: pd.DataFrame

    def index(self, name: str) -> int:
        return [r.name for r in self.runs].index(name)


def run_cells(run: PanelRun) -> tuple[pd.DataFrame, str]:
    """A run's analysis cells (value-level for DailyDilemmas) and their source (``readout`` or ``samples``)."""
    from analysis import influence as inf

    raw, source = inf.trial_cells(open_store(run))
    return (inf.value_level(raw) if benchmark_of(run.experiment) == "dd" else raw), source


def _group_names(values: pd.Series) -> str:
    uniq = list(dict.fromkeys(values.astype(str)))
    return "/".join(uniq) if len(uniq) <= 3 else f"{len(uniq)} groups"


def _key(row: Sequence[object]) -> str:
    return " / ".join(map(str, row))


def match_runs(
    benchmark: str, runs: Sequence[PanelRun], cells: Sequence[pd.DataFrame], sources: Sequence[str]
) -> Matched:
    """Restrict the runs of one benchmark to the items and conditions they all hold, and align their arrays."""
    from analysis import influence as inf

    cols = list(inf.COND)
    sub = Panel(tuple(runs))
    shared, dropped = shared_items(
        sub, {r.name: list(dict.fromkeys(c["item_id"])) for r, c in zip(runs, cells, strict=True)}
    )
    if not shared:
        raise PanelError(f"the {benchmark} runs {sub.names()} share no item; compare runs of the same items")
    keep = set(shared)
    cts = [inf.contributions(c[c["item_id"].isin(keep)]) for c in cells]
    keys = [[tuple(r) for r in ct.conditions[cols].itertuples(index=False, name=None)] for ct in cts]
    common = [key for key in keys[0] if all(key in set(ks) for ks in keys[1:])]
    rows = []
    for run, ks in zip(runs, keys, strict=True):
        for key in ks:
            if key not in set(common):
                absent = [q.name for q, other in zip(runs, keys, strict=True) if key not in set(other)]
                rows.append(
                    {
                        "benchmark": benchmark,
                        "run": run.name,
                        "condition": _key(key),
                        "reason": "not in run(s): " + ", ".join(absent),
                    }
                )
    dropped_cond = pd.DataFrame(rows, columns=["benchmark", "run", "condition", "reason"])
    if not common:
        raise PanelError(f"the {benchmark} runs {sub.names()} share no condition (pair x influence x ...)")
    strata_of = dict(zip(cts[0].items, cts[0].strata, strict=True))
    items = tuple(i for i in shared if i in strata_of)
    for run, ct in zip(runs[1:], cts[1:], strict=True):
        other = dict(zip(ct.items, ct.strata, strict=True))
        if any(other.get(i) != strata_of[i] for i in items):
            raise PanelError(f"run {run.name!r} puts shared items in other bootstrap strata than {runs[0].name!r}")
    n = np.zeros((len(runs), 3, len(common), len(items)))
    k = np.zeros_like(n)
    for i, (ct, ks) in enumerate(zip(cts, keys, strict=True)):
        ci = [ks.index(key) for key in common]
        ji = [ct.items.index(item) for item in items]
        n[i] = ct.n[:, ci][:, :, ji]
        k[i] = ct.k[:, ci][:, :, ji]
    conditions = pd.DataFrame(common, columns=cols)
    first = cells[0]
    for side in ("group_a", "group_b"):
        conditions[side] = conditions["pair"].map(first.groupby("pair", sort=False)[side].agg(_group_names))
    return Matched(
        benchmark=benchmark,
        runs=tuple(runs),
        sources=tuple(sources),
        conditions=conditions,
        items=items,
        strata=tuple(strata_of[i] for i in items),
        n=n,
        k=k,
        dropped_items=dropped.assign(benchmark=benchmark),
        dropped_conditions=dropped_cond,
    )


def match_panel(panel: Panel) -> list[Matched]:
    """One :class:`Matched` per benchmark of the panel, in panel order."""
    by_bench: dict[str, list[PanelRun]] = {}
    for r in panel.runs:
        by_bench.setdefault(benchmark_of(r.experiment), []).append(r)
    out = []
    for bench, runs in by_bench.items():
        loaded = [run_cells(r) for r in runs]
        out.append(match_runs(bench, runs, [c for c, _ in loaded], [s for _, s in loaded]))
    return out


# ============================================================================ tables
def condition_tables(m: Matched, *, n_boot: int = N_BOOT, seed: int = SEED) -> pd.DataFrame:
    """Every run's condition table on the matched items (before the cross-run FDR)."""
    from analysis import influence as inf

    cols = list(inf.COND)
    parts = []
    for r, (run, source) in enumerate(zip(m.runs, m.sources, strict=True)):
        ct = inf.Contributions(m.conditions[cols], m.items, m.strata, m.n[r], m.k[r])
        t = inf.condition_table(ct, source, n_boot=n_boot, seed=seed).table
        t.insert(1, "group_a", m.conditions["group_a"].to_numpy())
        t.insert(2, "group_b", m.conditions["group_b"].to_numpy())
        parts.append(t.assign(benchmark=m.benchmark, model=run.model, think=run.reasoning, run=run.name, source=source))
    return pd.concat(parts, ignore_index=True)


def replicates(m: Matched, r: int, *, n_boot: int = N_BOOT, seed: int = SEED) -> dict[str, np.ndarray]:
    """Bootstrap replicates ``(n_boot, conditions)`` of run ``r``'s metrics: the weights of the one-run report.

    The weights depend only on the items' strata, ``n_boot`` and ``seed``, so
    every run of ``m`` gets the same draws: replicates of two runs are paired.
    """
    from analysis import influence as inf
    from analysis import influence_stats as st

    w = st.bootstrap_weights(m.strata, n_boot, np.random.default_rng(seed))
    return inf.metrics(np.einsum("bj,cij->cbi", w, m.n[r]), np.einsum("bj,cij->cbi", w, m.k[r]))


def _point(m: Matched, r: int) -> dict[str, np.ndarray]:
    from analysis import influence as inf

    return inf.metrics(m.n[r].sum(axis=2), m.k[r].sum(axis=2))


def _nanmean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)


@dataclass(frozen=True)
class Change:
    """One (off, on) pair's steerabilities per condition and direction, with their paired replicates."""

    model: str
    off: str
    on: str
    s_off: np.ndarray
    """``(conditions, 2)``: s(A), s(B) with reasoning off."""
    s_on: np.ndarray
    reps_off: np.ndarray
    """``(n_boot, conditions, 2)``."""
    reps_on: np.ndarray


def pair_change(m: Matched, off: PanelRun, on: PanelRun, *, n_boot: int = N_BOOT, seed: int = SEED) -> Change:
    """Steerabilities of a reasoning-off and a reasoning-on run of one model, with paired replicates."""
    i, j = m.index(off.name), m.index(on.name)
    po, pn = _point(m, i), _point(m, j)
    ro, rn = replicates(m, i, n_boot=n_boot, seed=seed), replicates(m, j, n_boot=n_boot, seed=seed)
    stack = lambda d: np.stack([d["s_A"], d["s_B"]], axis=-1)  # noqa: E731
    return Change(off.model, off.name, on.name, stack(po), stack(pn), stack(ro), stack(rn))


def change_by_condition(m: Matched, changes: Sequence[Change], alpha: float = ALPHA) -> pd.DataFrame:
    """Per pair, condition and direction: s off, s on, the change and its paired-bootstrap 95% CI."""
    from analysis import influence_stats as st

    rows = []
    for ch in changes:
        diff = ch.reps_on - ch.reps_off
        lo, hi = st.percentile_ci(diff, alpha)
        se = st.nan_sd(diff)
        for d, dname in enumerate(("A", "B")):
            part = m.conditions.assign(
                benchmark=m.benchmark,
                model=ch.model,
                run_off=ch.off,
                run_on=ch.on,
                direction=dname,
                s_off=ch.s_off[:, d],
                s_on=ch.s_on[:, d],
                change=ch.s_on[:, d] - ch.s_off[:, d],
                change_lo=lo[:, d],
                change_hi=hi[:, d],
                change_se=se[:, d],
            )
            rows.append(part)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def _verdict(lo: float, hi: float) -> str:
    if lo > 0:
        return "amplified"
    if hi < 0:
        return "dampened"
    return "no clear change"


def change_by_influence(m: Matched, changes: Sequence[Change], alpha: float = ALPHA) -> pd.DataFrame:
    """Per pair (and all pairs pooled), influence type (main cues) and direction (A, B, both).

    ``change`` = mean over conditions of s_on - s_off (signed: toward the cue);
    ``abs_change`` = mean |s_on| - mean |s_off| (magnitude) and ``pct_change``
    = 100 (mean |s_on| / mean |s_off| - 1). CIs: paired percentile bootstrap
    over items. ``verdict`` reads the CI of ``abs_change``.
    """
    from analysis import influence_stats as st

    main = (m.conditions["variant"] == "cue").to_numpy()
    influences = list(dict.fromkeys(m.conditions.loc[main, "influence"]))
    groups: list[tuple[str, list[Change]]] = [(ch.model, [ch]) for ch in changes]
    if len(changes) > 1:
        groups.append(("all pairs", list(changes)))
    rows = []
    for model, chs in groups:
        for infl in influences:
            mask = main & (m.conditions["influence"] == infl).to_numpy()
            for dname, dims in (("A", [0]), ("B", [1]), ("both", [0, 1])):

                def take(x: np.ndarray, sel: np.ndarray = mask, dd: list[int] = dims) -> np.ndarray:
                    return x[..., sel, :][..., dd].reshape(*x.shape[:-2], -1)

                s_off = np.concatenate([take(c.s_off) for c in chs])
                s_on = np.concatenate([take(c.s_on) for c in chs])
                r_off = np.concatenate([take(c.reps_off) for c in chs], axis=-1)
                r_on = np.concatenate([take(c.reps_on) for c in chs], axis=-1)
                signed = _nanmean(r_on - r_off)
                a_off, a_on = _nanmean(np.abs(r_off)), _nanmean(np.abs(r_on))
                with np.errstate(invalid="ignore", divide="ignore"):
                    pct_reps = 100 * (a_on / a_off - 1)
                    pct = 100 * (float(_nanmean(np.abs(s_on))) / float(_nanmean(np.abs(s_off))) - 1)
                lo, hi = st.percentile_ci(signed, alpha)
                alo, ahi = st.percentile_ci(a_on - a_off, alpha)
                plo, phi = st.percentile_ci(pct_reps, alpha)
                rows.append(
                    {
                        "benchmark": m.benchmark,
                        "model": model,
                        "influence": infl,
                        "direction": dname,
                        "conditions": int(mask.sum()) * len(chs),
                        "s_off": float(_nanmean(s_off)),
                        "s_on": float(_nanmean(s_on)),
                        "change": float(_nanmean(s_on - s_off)),
                        "change_lo": float(lo),
                        "change_hi": float(hi),
                        "abs_s_off": float(_nanmean(np.abs(s_off))),
                        "abs_s_on": float(_nanmean(np.abs(s_on))),
                        "abs_change": float(_nanmean(np.abs(s_on)) - _nanmean(np.abs(s_off))),
                        "abs_change_lo": float(alo),
                        "abs_change_hi": float(ahi),
                        "pct_change": pct,
                        "pct_change_lo": float(plo),
                        "pct_change_hi": float(phi),
                        "verdict": _verdict(float(alo), float(ahi)),
                    }
                )
    return pd.DataFrame(rows)


# ============================================================================ |Asym| ~ |baseline bias|
def asym_frame(cond: pd.DataFrame) -> pd.DataFrame:
    """The regression frame: one row per main-cue condition and run with finite Asym.

    ``abs_asym`` = |Asym|; ``baseline_bias`` = |f0(B) - 1/2|; the groupings
    ``model_reasoning`` (model + reasoning mode), ``factor`` (benchmark:pair, so
    equal pair names of two benchmarks stay apart) and ``influence``.
    """
    main = cond[cond["variant"] == "cue"]
    out = pd.DataFrame(
        {
            "benchmark": main["benchmark"].astype(str),
            "run": main["run"].astype(str),
            "model_reasoning": main["model"].astype(str)
            + " / reasoning "
            + np.where(main["think"].astype(bool), "on", "off"),
            "factor": main["benchmark"].astype(str) + ":" + main["pair"].astype(str),
            "influence": main["influence"].astype(str),
            "baseline_bias": main["baseline_bias"].astype(float),
            "abs_asym": main["asym"].abs().astype(float),
        }
    )
    return out[np.isfinite(out["abs_asym"]) & np.isfinite(out["baseline_bias"])].reset_index(drop=True)


STRUCTURES = ("crossed", "nested")
"""Random-effect structures of the |Asym| fit (``--asym-model``).

``crossed`` (the paper's text): random intercepts for model x reasoning,
factor and influence type, crossed (variance components of one group).
``nested`` (the paper's published code): a random intercept per model x
reasoning group, and factor and influence intercepts *within* each group (a
factor's intercept differs between models)."""
RETRY_METHODS = ("powell", "nm")
"""Optimizers tried, in turn, after statsmodels' own (bfgs, lbfgs, cg) when the REML fit did not converge."""


@dataclass(frozen=True)
class AsymFit:
    """The fit of |Asym| on |baseline bias| in one scope (a benchmark, or pooled)."""

    scope: str
    method: str
    """``MixedLM (REML)``, ``OLS`` (no grouping with two or more levels) or ``none`` (too little data)."""
    n: int
    levels: Mapping[str, int]
    """Levels per random-intercept grouping that entered the fit (nested: distinct levels within groups)."""
    structure: str = "crossed"
    formula: str = FORMULA
    intercept: float = math.nan
    beta: float = math.nan
    beta_lo: float = math.nan
    beta_hi: float = math.nan
    p_beta: float = math.nan
    var_fixed: float = math.nan
    var_bias: float = math.nan
    """Variance of the |bias| term alone, ``var(beta * baseline_bias)`` (ddof 1): without benchmark offsets."""
    var_components: Mapping[str, float] = field(default_factory=dict)
    var_residual: float = math.nan
    r2_marginal: float = math.nan
    r2_bias: float = math.nan
    """Share of the total variance the |bias| term alone explains: ``var_bias / total``."""
    r2_conditional: float = math.nan
    converged: bool = False
    attempts: tuple[str, ...] = ()
    """Each optimizer run and its outcome, in order (a retry is a later entry)."""
    warnings: tuple[str, ...] = ()
    """Every warning statsmodels raised during the fit (first line each, deduplicated)."""
    note: str = ""

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scope": self.scope,
            "structure": self.structure,
            "formula": self.formula,
            "method": self.method,
            "n": self.n,
            "intercept": self.intercept,
            "beta": self.beta,
            "beta_lo": self.beta_lo,
            "beta_hi": self.beta_hi,
            "p_beta": self.p_beta,
            "var_fixed": self.var_fixed,
            "var_bias": self.var_bias,
        }
        for g in VC_FORMULA:
            out[f"levels_{g}"] = self.levels.get(g, 0)
            out[f"var_{g}"] = self.var_components.get(g, math.nan)
        out |= {
            "var_residual": self.var_residual,
            "r2_marginal": self.r2_marginal,
            "r2_bias": self.r2_bias,
            "r2_conditional": self.r2_conditional,
            "converged": self.converged,
            "attempts": " | ".join(self.attempts),
            "warnings": " | ".join(self.warnings),
            "note": self.note,
        }
        return out


def marginal_r2(var_fixed: float, var_components: Sequence[float], var_residual: float) -> tuple[float, float]:
    """Nakagawa & Schielzeth (2013): (marginal, conditional) R^2 of a linear mixed model.

    ``var_fixed`` is the variance of the fixed-effect predictions ``X beta``
    (ddof 1, as MuMIn's ``r.squaredGLMM``); the total is that plus every
    random-intercept variance plus the residual variance.
    """
    total = var_fixed + float(np.sum(var_components)) + var_residual
    if not total > 0:
        return math.nan, math.nan
    return var_fixed / total, (var_fixed + float(np.sum(var_components))) / total


def gls_cov(x: np.ndarray, frame: pd.DataFrame, var_components: Mapping[str, float], var_residual: float) -> np.ndarray:
    """Covariance of the GLS fixed effects, ``(X' V^-1 X)^-1`` with ``V = sigma^2 I + sum_g sigma_g^2 Z_g Z_g'``.

    ``Z_g`` is the indicator matrix of column ``g``'s levels in ``frame``
    (for a nested component, a column of the (group, level) combinations).
    Computed through Woodbury (no n x n matrix): with ``Z`` the stacked
    indicators of the groupings of positive variance and ``D`` their variances,
    ``X'V^-1X = (X'X - X'Z (sigma^2 D^-1 + Z'Z)^-1 Z'X) / sigma^2``.
    """
    keep = [g for g, v in var_components.items() if v > 1e-12 * max(var_residual, 1e-300)]
    xtx = x.T @ x
    if keep:
        z = np.hstack([pd.get_dummies(frame[g].astype(str)).to_numpy(dtype=float) for g in keep])
        d = np.concatenate([np.full(frame[g].nunique(), var_components[g]) for g in keep])
        inner = np.diag(var_residual / d) + z.T @ z
        xz = x.T @ z
        xtx = xtx - xz @ np.linalg.solve(inner, xz.T)
    return np.linalg.inv(xtx / var_residual)


def _first_lines(ws: Sequence[warnings.WarningMessage]) -> list[str]:
    return list(dict.fromkeys(f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in ws))


def fit_mixed(model: Any) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    """Fit a statsmodels MixedLM by REML, retrying other optimizers until one converges.

    First statsmodels' default (which itself tries bfgs, lbfgs, cg and warns
    "Retrying ..."), then each of :data:`RETRY_METHODS`. Returns (the first
    converged result, or the one of highest REML log-likelihood when none
    converged; the attempts; the warnings of all attempts).
    """
    results, attempts, caught = [], [], []
    for method in (None, *RETRY_METHODS):
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            try:
                res = model.fit(reml=True, method=method)
            except (np.linalg.LinAlgError, ValueError) as e:
                attempts.append(f"{method or 'default (bfgs, lbfgs, cg)'}: failed ({e})")
                caught += _first_lines(ws)
                continue
        caught += _first_lines(ws)
        ok = bool(res.converged) and np.isfinite(res.llf)
        attempts.append(f"{method or 'default (bfgs, lbfgs, cg)'}: {'converged' if ok else 'not converged'}")
        results.append(res)
        if ok:
            return res, tuple(attempts), tuple(dict.fromkeys(caught))
    if not results:
        raise ValueError("every MixedLM optimizer failed: " + "; ".join(attempts))
    best = max(results, key=lambda r: r.llf if np.isfinite(r.llf) else -np.inf)
    return best, tuple(attempts), tuple(dict.fromkeys(caught))


def _design(
    frame: pd.DataFrame, structure: str, benchmark_effect: bool
) -> tuple[str, dict[str, Any], pd.DataFrame, str]:
    """(formula, mixedlm keyword arguments, the frame with the Z columns of :func:`gls_cov`, note)."""
    formula = FORMULA + (" + C(benchmark)" if benchmark_effect else "")
    n = len(frame)
    levels = {g: int(frame[g].nunique()) for g in VC_FORMULA}
    left_out = [g for g in VC_FORMULA if levels[g] < 2]
    note = f"left out (one level): {', '.join(left_out)}" if left_out else ""
    z = frame.copy()
    if structure == "nested" and levels["model_reasoning"] >= 2:
        inner = {g: f for g, f in VC_FORMULA.items() if g != "model_reasoning" and levels[g] >= 2}
        for g in inner:
            z[g] = frame["model_reasoning"].astype(str) + "|" + frame[g].astype(str)
        kw = {"groups": frame["model_reasoning"].to_numpy(), "re_formula": "1", "vc_formula": inner}
        return formula, kw, z, note
    used = {g: f for g, f in VC_FORMULA.items() if levels[g] >= 2}
    if structure == "nested":
        note = "; ".join(filter(None, [note, "one model x reasoning group: nested equals crossed"]))
    return formula, {"groups": np.ones(n), "re_formula": "0", "vc_formula": used}, z, note


def fit_asym(frame: pd.DataFrame, scope: str, *, structure: str = "crossed", benchmark_effect: bool = False) -> AsymFit:
    """Fit ``abs_asym ~ baseline_bias`` (``+ C(benchmark)`` with ``benchmark_effect``) by REML.

    ``structure="crossed"`` (see :data:`STRUCTURES`)::

        smf.mixedlm(formula, frame, groups=np.ones(len(frame)), re_formula="0",
                    vc_formula={g: f"0 + C({g})" for g in groupings}).fit(reml=True)

    ``structure="nested"``::

        smf.mixedlm(formula, frame, groups=frame["model_reasoning"], re_formula="1",
                    vc_formula={"factor": "0 + C(factor)", "influence": "0 + C(influence)"}).fit(reml=True)

    (statsmodels' variance components are realized independently in each
    group, so factor and influence are nested in model x reasoning). A
    grouping with one level cannot be told apart from the intercept and is
    left out, and said so; with none left the fit is OLS and its "marginal
    R^2" is var(X beta) / (var(X beta) + sigma^2). ``r2_bias`` is the share
    of the |bias| term alone (it differs from ``r2_marginal`` only through the
    benchmark offsets). Optimizer retries and every warning are recorded
    (:func:`fit_mixed`).
    """
    import statsmodels.api as sm
    import statsmodels.formula.api as smf
    from scipy import stats

    if structure not in STRUCTURES:
        raise ValueError(f"--asym-model must be one of {', '.join(STRUCTURES)}, got {structure!r}")
    n = len(frame)
    if n < 3 or frame["baseline_bias"].nunique() < 2:
        return AsymFit(scope, "none", n, {}, structure, note="fewer than 3 conditions or no spread in baseline bias")
    if benchmark_effect and frame["benchmark"].nunique() < 2:
        benchmark_effect = False
    formula, kw, zframe, note = _design(frame, structure, benchmark_effect)
    levels = {g: int(zframe[g].nunique()) for g in VC_FORMULA if g in kw["vc_formula"]}
    if kw["re_formula"] == "1":
        levels["model_reasoning"] = int(frame["model_reasoning"].nunique())
    attempts: tuple[str, ...] = ()
    caught: tuple[str, ...] = ()
    if levels:
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            model = smf.mixedlm(formula, frame, **kw)
        caught = tuple(_first_lines(ws))
        res, attempts, fit_ws = fit_mixed(model)
        caught = tuple(dict.fromkeys([*caught, *fit_ws]))
        fe = res.fe_params
        ci = res.conf_int().loc["baseline_bias"]
        vcomp = dict(zip(model.exog_vc.names, map(float, np.atleast_1d(res.vcomp)), strict=True))
        if kw["re_formula"] == "1":
            vcomp = {"model_reasoning": float(np.asarray(res.cov_re)[0, 0]), **vcomp}
        resid, converged, p = float(res.scale), bool(res.converged), float(res.pvalues["baseline_bias"])
        x = model.exog
        method = "MixedLM (REML)"
        if not np.isfinite(ci.to_numpy()).all():  # a boundary fit: statsmodels gives no fixed-effect SE
            j = list(fe.index).index("baseline_bias")
            se = math.sqrt(gls_cov(x, zframe, vcomp, resid)[j, j])
            zq = float(stats.norm.isf(0.025))
            b = float(fe["baseline_bias"])
            ci = pd.Series([b - zq * se, b + zq * se])
            p = float(2 * stats.norm.sf(abs(b) / se)) if se > 0 else math.nan
            note = "; ".join(filter(None, [note, "beta CI from (X'V^-1 X)^-1 at the fitted variances"]))
    else:
        ols = sm.OLS.from_formula(formula, frame).fit()
        fe, ci = ols.params, ols.conf_int().loc["baseline_bias"]
        vcomp, resid, converged, p = {}, float(ols.scale), True, float(ols.pvalues["baseline_bias"])
        x = ols.model.exog
        method = "OLS"
        attempts = ("OLS: closed form",)
    var_fixed = float(np.var(x @ fe.to_numpy(), ddof=1))
    var_bias = float(np.var(float(fe["baseline_bias"]) * frame["baseline_bias"].to_numpy(float), ddof=1))
    r2m, r2c = marginal_r2(var_fixed, list(vcomp.values()), resid)
    total = var_fixed + float(np.sum(list(vcomp.values()))) + resid
    return AsymFit(
        scope=scope,
        method=method,
        n=n,
        levels=levels,
        structure=structure,
        formula=formula,
        intercept=float(fe["Intercept"]),
        beta=float(fe["baseline_bias"]),
        beta_lo=float(ci.iloc[0]),
        beta_hi=float(ci.iloc[1]),
        p_beta=p,
        var_fixed=var_fixed,
        var_bias=var_bias,
        var_components=vcomp,
        var_residual=resid,
        r2_marginal=r2m,
        r2_bias=var_bias / total if total > 0 else math.nan,
        r2_conditional=r2c,
        converged=converged,
        attempts=attempts,
        warnings=caught,
        note=note[:300],
    )


def asym_fits(cond: pd.DataFrame, structures: Sequence[str] = STRUCTURES) -> list[AsymFit]:
    """Per structure: one fit per benchmark and, with two or more benchmarks, a pooled fit with benchmark offsets."""
    frame = asym_frame(cond)
    fits = []
    for structure in structures:
        fits += [
            fit_asym(g.reset_index(drop=True), b, structure=structure)
            for b, g in frame.groupby("benchmark", sort=False)
        ]
        if frame["benchmark"].nunique() > 1:
            fits.append(fit_asym(frame, "pooled", structure=structure, benchmark_effect=True))
    return fits


# ============================================================================ report
@dataclass(frozen=True)
class InfluenceComparison:
    """Everything the cross-run influence report shows."""

    matched: tuple[Matched, ...]
    conditions: pd.DataFrame
    tables: Mapping[str, pd.DataFrame]
    change_conditions: pd.DataFrame
    change: pd.DataFrame
    asym_data: pd.DataFrame
    fits: tuple[AsymFit, ...]
    imported: tuple[str, ...] = ()
    """Names of the imported runs (condition-level data: no item matching, no item bootstrap)."""
    asym_model: str = "crossed"
    """The headline random-effect structure of the |Asym| fits."""


def _split_imported(panel: Panel) -> tuple[Panel | None, list[PanelRun]]:
    """(the panel of native runs, or None; the imported runs), in panel order."""
    imported = [r for r in panel.runs if r.experiment == IMPORTED]
    native = tuple(r for r in panel.runs if r.experiment != IMPORTED)
    return (Panel(native) if native else None), imported


def compare_frames(
    panel: Panel, *, n_boot: int = N_BOOT, seed: int = SEED, asym_model: str = "crossed"
) -> InfluenceComparison:
    """The whole comparison of an influence panel, as frames (no files).

    Imported runs (``probe import``) bring their condition tables as they are:
    they have no items, so they are not matched on items and take no part in
    the reasoning on/off comparison (a paired bootstrap over items); they
    enter the cross-run FDR, the per-model tables and the |Asym| fits.
    ``asym_model`` orders the fits (that structure first, the headline).
    """
    from analysis import influence as inf
    from analysis.import_conditions import imported_conditions

    if asym_model not in STRUCTURES:
        raise PanelError(f"--asym-model must be one of {', '.join(STRUCTURES)}, got {asym_model!r}")
    native, imported = _split_imported(panel)
    matched = match_panel(native) if native is not None else []
    tables_in = [condition_tables(m, n_boot=n_boot, seed=seed) for m in matched]
    tables_in += [imported_conditions(open_store(r), run=r.name) for r in imported]
    cond = inf.combine_runs(tables_in)
    tables = dict(inf.panel_tables(cond))
    main = cond[cond["variant"] == "cue"]
    tables["by_run"] = inf.summary_by(main, ["benchmark", "run", "model", "think"])
    by_cond, by_infl = [], []
    for m in matched:
        names = {r.name for r in m.runs}
        pairs = [(a, b) for a, b in panel.reasoning_pairs() if a.name in names and b.name in names]
        changes = [pair_change(m, a, b, n_boot=n_boot, seed=seed) for a, b in pairs]
        if changes:
            by_cond.append(change_by_condition(m, changes))
            by_infl.append(change_by_influence(m, changes))
    order = (asym_model, *(s for s in STRUCTURES if s != asym_model))
    return InfluenceComparison(
        matched=tuple(matched),
        conditions=cond,
        tables=tables,
        change_conditions=pd.concat(by_cond, ignore_index=True) if by_cond else pd.DataFrame(),
        change=pd.concat(by_infl, ignore_index=True) if by_infl else pd.DataFrame(),
        asym_data=asym_frame(cond),
        fits=tuple(asym_fits(cond, order)),
        imported=tuple(r.name for r in imported),
        asym_model=asym_model,
    )


def compare_influence(
    panel: Panel, out: Path, *, n_boot: int = N_BOOT, seed: int = SEED, asym_model: str = "crossed"
) -> list[Path]:
    """Write the influence panel report into ``out``: CSV tables, ``summary.md`` and PNG figures."""
    from analysis.compare import write_dropped
    from probe.store import atomic_write_text

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res = compare_frames(panel, n_boot=n_boot, seed=seed, asym_model=asym_model)
    csvs: dict[str, pd.DataFrame] = {
        "conditions": res.conditions,
        **res.tables,
        "reasoning_change": res.change,
        "reasoning_change_conditions": res.change_conditions,
        "asym_regression": pd.DataFrame([f.row() for f in res.fits]),
        "asym_regression_data": res.asym_data,
        "dropped_conditions": pd.concat([m.dropped_conditions for m in res.matched], ignore_index=True),
    }
    for name, df in csvs.items():
        atomic_write_text(out / f"{name}.csv", df.to_csv(index=False, float_format="%.6g"))
    write_dropped(pd.concat([m.dropped_items for m in res.matched], ignore_index=True), out)
    figures = _figures(res, out)
    atomic_write_text(out / "summary.md", _summary_md(panel, res, n_boot, [p.name for p in figures]))
    return sorted(p for p in out.iterdir() if p.suffix in (".md", ".csv", ".png"))


# ---------------------------------------------------------------------------- figures
def _save(fig: Any, path: Path) -> Path:
    import io

    import matplotlib.pyplot as plt

    from probe.store import atomic_write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _figures(res: InfluenceComparison, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    main = res.conditions[res.conditions["variant"] == "cue"]
    for bench, g in main.groupby("benchmark", sort=False):
        runs = list(dict.fromkeys(g["run"]))
        infl = list(dict.fromkeys(g["influence"]))
        cols = min(4, len(runs))
        rows = math.ceil(len(runs) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows + 0.6), sharey=True, squeeze=False)
        x = np.arange(len(infl))
        for ax, run in zip(axes.flat, runs, strict=False):
            sub = g[g["run"] == run].groupby("influence", sort=False)[["s_A", "s_B"]].mean().reindex(infl)
            ax.bar(x - 0.2, sub["s_A"], 0.4, label="s(A)", color="tab:blue")
            ax.bar(x + 0.2, sub["s_B"], 0.4, label="s(B)", color="tab:orange")
            ax.axhline(0, color="0.3", lw=0.8)
            ax.set_xticks(x, infl, rotation=45, ha="right", fontsize=7)
            ax.set_title(run, fontsize=8)
        for ax in list(axes.flat)[len(runs) :]:
            ax.axis("off")
        axes[0, 0].set_ylabel("mean steerability (log-odds)")
        axes[0, 0].legend(fontsize=7)
        fig.suptitle(f"{bench}: steerability per run (mean over conditions)", fontsize=9)
        fig.tight_layout()
        paths.append(_save(fig, out / f"fig_steerability_by_model_{bench}.png"))
    if not res.change.empty:
        ch = res.change[res.change["direction"] != "both"]
        for bench, g in ch.groupby("benchmark", sort=False):
            models = list(dict.fromkeys(g["model"]))
            fig, axes = plt.subplots(
                1,
                len(models),
                figsize=(3.4 * len(models), 0.35 * g["influence"].nunique() * 2 + 1.6),
                sharex=True,
                squeeze=False,
            )
            for ax, model in zip(axes[0], models, strict=True):
                sub = g[g["model"] == model].reset_index(drop=True)
                y = np.arange(len(sub))[::-1]
                colors = np.where(sub["direction"] == "A", "tab:blue", "tab:orange")
                ax.hlines(y, sub["change_lo"], sub["change_hi"], color=colors, lw=2)
                ax.scatter(sub["change"], y, color=colors, zorder=3, s=14)
                ax.axvline(0, color="0.3", lw=0.8)
                ax.set_yticks(y, [f"{r.influence} → {r.direction}" for r in sub.itertuples()], fontsize=7)
                ax.set_title(model, fontsize=8)
                ax.set_xlabel("s(on) - s(off), 95% CI", fontsize=8)
            fig.suptitle(f"{bench}: reasoning on minus off", fontsize=9)
            fig.tight_layout()
            paths.append(_save(fig, out / f"fig_reasoning_change_{bench}.png"))
    data = res.asym_data
    if len(data):
        scopes = [f for f in res.fits if f.scope != "pooled" and f.structure == res.asym_model]
        fig, axes = plt.subplots(1, len(scopes), figsize=(4 * len(scopes), 3.6), squeeze=False)
        for ax, fit in zip(axes[0], scopes, strict=True):
            sub = data[data["benchmark"] == fit.scope]
            for mr, gg in sub.groupby("model_reasoning", sort=False):
                ax.scatter(gg["baseline_bias"], gg["abs_asym"], s=12, label=mr)
            if math.isfinite(fit.beta):
                xs = np.linspace(0, max(0.5, float(sub["baseline_bias"].max())), 20)
                ax.plot(xs, fit.intercept + fit.beta * xs, color="black", lw=1)
            r2 = f", marginal R² {fit.r2_marginal:.2f}" if math.isfinite(fit.r2_marginal) else ""
            ax.set_title(f"{fit.scope}: β = {fit.beta:.2f}{r2}", fontsize=8)
            ax.set_xlabel("|baseline bias| = |f0(B) - 0.5|")
            ax.set_ylabel("|Asym| (log-odds)")
            ax.legend(fontsize=6)
        fig.tight_layout()
        paths.append(_save(fig, out / "fig_asym_vs_bias.png"))
    return paths


def asym_md(fits: Sequence[AsymFit], headline: str) -> list[str]:
    """The regression section: both random-effect structures, the |bias|-alone share, convergence."""
    from analysis.compare import md_table

    lines = [
        f"`{FORMULA}` per benchmark; the pooled fit adds benchmark offsets (`+ C(benchmark)`). REML by statsmodels "
        "MixedLM. **crossed** (the paper's text): random intercepts for model x reasoning, factor "
        "(benchmark:pair) and influence type, as variance components of one group "
        "(`groups=1, re_formula='0', vc_formula={model_reasoning, factor, influence}`). **nested** (the paper's "
        "code): a random intercept per model x reasoning group, with factor and influence intercepts within each "
        "group (`groups=model_reasoning, re_formula='1', vc_formula={factor, influence}`). "
        f"Headline structure: **{headline}** (`--asym-model`). Marginal R² = var(X β) / (var(X β) + Σ σ²_vc + σ²_ε) "
        "(Nakagawa & Schielzeth 2013; var with ddof 1); R² |bias| alone = var(β |bias|) / the same total "
        "(without the benchmark offsets); conditional R² adds Σ σ²_vc to the numerator. `attempts` lists each "
        "optimizer run (statsmodels' default tries bfgs, lbfgs, cg; then powell, nm until one converges), "
        "`warnings` every warning of the fit.",
        "",
    ]
    table = pd.DataFrame([f.row() for f in fits])
    if len(table):
        cols = ["scope", "structure", "method", "n", "beta", "beta_lo", "beta_hi", "r2_marginal", "r2_bias"]
        cols += ["r2_conditional", "converged", "attempts", "warnings", "note"]
        lines += [*md_table(table[cols]), ""]
    return lines


# ---------------------------------------------------------------------------- summary
_BY = ["conditions", "f0_B", "|delta|", "|steer|", "steer", "|asym|", "sig", "practical", "bf_of_sig"]
"""Columns of the per-group tables; ``practical`` (share of effects with |shift| >= PRACTICAL_SHIFT) stands beside
``sig``."""


def _summary_md(panel: Panel, res: InfluenceComparison, n_boot: int, figures: Sequence[str]) -> str:
    from analysis.compare import dropped_md, md_table, panel_md

    t = res.tables
    lines = ["# Influence audit across runs", "", *panel_md(panel), ""]
    lines += ["## Matching", ""]
    if res.imported:
        lines += [
            f"Imported runs ({', '.join(res.imported)}) hold condition-level counts: they are not matched on items, "
            "their conditions enter as imported, and no item bootstrap is computed for them (their share of the "
            "headline CIs is a cluster bootstrap over (run, factor) clusters).",
            "",
        ]
    for m in res.matched:
        lines += [f"**{m.benchmark}**: {len(m.conditions)} conditions on {len(m.items)} items.", ""]
        lines += [*dropped_md(m.dropped_items, len(m.items)), ""]
        if len(m.dropped_conditions):
            lines += [
                f"{m.dropped_conditions['condition'].nunique()} conditions not in every run were dropped "
                "(`dropped_conditions.csv`).",
                "",
            ]
    lines += [
        "Each run's conditions are recomputed on the matched items; steerability s(d) is the log-odds shift "
        "toward d (+1/2 continuity correction), Asym = s(B) - s(A); BH-FDR within benchmark x variant x test family "
        f"over all runs; CIs from {n_boot} cluster-bootstrap replicates of the items.",
        "",
        "## Headline per benchmark",
        "",
    ]
    head = t["headline"]
    if len(head):
        keep = head[
            head["metric"].isin(
                [
                    "conditions",
                    "mean |shift| (pp), all cues",
                    "effects with significant shift (BH-FDR)",
                    f"effects with |shift| >= {100 * PRACTICAL_SHIFT:g} pp (practical threshold)",
                    "conditions with significant asymmetry (BH-FDR)",
                ]
            )
        ]
        cols = ["benchmark", "metric", "value", "ci_lo", "ci_hi", "note"]
        lines += [*md_table(keep[cols].astype({"value": float})), ""]
    lines += [
        "## Per model and reasoning mode (main cues)",
        "",
        *md_table(t["by_model"][["benchmark", "model", "think", *_BY]]),
        "",
    ]
    lines += ["## Per reasoning mode", "", *md_table(t["by_reasoning"][["benchmark", "think", *_BY]]), ""]
    lines += [
        "## Per influence type and reasoning mode",
        "",
        *md_table(t["by_influence_reasoning"][["benchmark", "influence", "think", *_BY]]),
        "",
    ]
    lines += ["## Reasoning on minus off", ""]
    if res.change.empty:
        lines += ["No model has both a reasoning-off and a reasoning-on run in this panel.", ""]
    else:
        lines += [
            "Per influence type, over both cue directions (per direction and per condition in `reasoning_change.csv` "
            "and `reasoning_change_conditions.csv`). change = mean s(on) - s(off); |s| change = mean |s(on)| - "
            "mean |s(off)|; 95% CIs from a paired bootstrap over items (both runs reweighted by the same draw). "
            "amplified / dampened: the CI of the |s| change lies above / below 0.",
            "",
        ]
        both = res.change[res.change["direction"] == "both"]
        show = both[
            [
                "benchmark",
                "model",
                "influence",
                "abs_s_off",
                "abs_s_on",
                "abs_change",
                "abs_change_lo",
                "abs_change_hi",
                "pct_change",
                "change",
                "change_lo",
                "change_hi",
                "verdict",
            ]
        ]
        lines += [*md_table(show), ""]
    lines += [
        "## |Asym| against |baseline bias|",
        "",
        *asym_md(res.fits, res.asym_model),
    ]
    if figures:
        lines += ["Figures: " + ", ".join(f"`{f}`" for f in figures), ""]
    return "\n".join(lines)
