"""The |Asym| ~ |baseline bias| regression of paper 000 (main cues, per benchmark and pooled).

statsmodels MixedLM (REML) with crossed random intercepts (the paper's text) or with factor and
influence nested in model x reasoning (the paper's code); the marginal R^2 of Nakagawa & Schielzeth,
the share of the |bias| term alone, and every optimizer attempt and warning. beta's interval is a Wald
interval from the GLS covariance of the fixed effects at the REML optimum, ``(X' V^-1 X)^-1``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from probe.errors import NotComputed

FORMULA = "abs_asym ~ baseline_bias"
VC_FORMULA = {
    "model_reasoning": "0 + C(model_reasoning)",
    "factor": "0 + C(factor)",
    "influence": "0 + C(influence)",
}
"""Crossed random intercepts: one variance component per grouping, all within a single statsmodels group."""


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
METHODS = (None, "powell", "nm")
"""Optimizers every REML fit runs: statsmodels' default (itself bfgs, then lbfgs and cg when one fails), Powell and
Nelder-Mead. Near a zero variance component the default can stop short of the REML maximum while reporting
convergence (issue 38: log-likelihood -80.889 where Powell and Nelder-Mead reach -80.875), so all run and the
highest REML log-likelihood among the converged ones is kept."""
LLF_TIE = 1e-6
"""Log-likelihoods this close are one optimum (:func:`fit_mixed` keeps the first optimizer that reached it)."""


@dataclass(frozen=True)
class Variances:
    """Nakagawa & Schielzeth's (2013) parts of the |Asym| variance in one fit, and the R^2 they give.

    The total is ``fixed`` plus every random-intercept variance plus the
    residual; ``fixed`` has ddof 1, as MuMIn's ``r.squaredGLMM``. Every R^2 is
    NaN unless the total is positive.
    """

    fixed: float = math.nan
    """Variance of the fixed-effect predictions ``X beta`` (ddof 1), the fixed part."""
    bias: float = math.nan
    """Variance of the |bias| term alone, ``var(beta * baseline_bias)`` (ddof 1): without benchmark offsets."""
    components: Mapping[str, float] = field(default_factory=dict)
    """The REML variance of each random-intercept grouping that entered the fit."""
    residual: float = math.nan

    @property
    def random(self) -> float:
        """The sum of the random-intercept variances."""
        return float(np.sum(list(self.components.values())))

    @property
    def total(self) -> float:
        """The denominator of every R^2: fixed + random + residual."""
        return self.fixed + self.random + self.residual

    def _share(self, part: float) -> float:
        total = self.total
        return part / total if total > 0 else math.nan

    @property
    def r2_marginal(self) -> float:
        """``fixed / total``: what the fixed effects explain."""
        return self._share(self.fixed)

    @property
    def r2_conditional(self) -> float:
        """(fixed + random) / total: what the fixed and random effects together explain."""
        return self._share(self.fixed + self.random)

    @property
    def r2_bias(self) -> float:
        """``bias / total``: the share the |bias| term alone explains (less than marginal by the benchmark offsets)."""
        return self._share(self.bias)


@dataclass(frozen=True)
class AsymFit:
    """The fit of |Asym| on |baseline bias| in one scope (a benchmark, or pooled)."""

    scope: str
    """A benchmark, or ``pooled`` (every benchmark, with benchmark offsets)."""
    method: str
    """``MixedLM (REML)``, ``OLS`` (no grouping with two or more levels) or ``none`` (too little data)."""
    n: int
    """Conditions in the fit (rows of :func:`asym_frame`)."""
    levels: Mapping[str, int]
    """Levels per random-intercept grouping that entered the fit (nested: distinct levels within groups)."""
    structure: str = "crossed"
    """The random-effect structure (:data:`STRUCTURES`)."""
    formula: str = FORMULA
    """The fixed effects (``+ C(benchmark)`` for the pooled fit)."""
    intercept: float = math.nan
    beta: float = math.nan
    """The slope of |Asym| on |baseline bias|, the paper's headline."""
    beta_lo: float = math.nan
    beta_hi: float = math.nan
    """The 95% Wald CI of beta from the GLS covariance ``(X' V^-1 X)^-1`` at the REML optimum (:func:`gls_cov`;
    OLS: its t interval). Not statsmodels' ``conf_int``, which inverts the full observed Hessian, cross terms
    with the variance parameters included, and near a zero variance component widens the interval about 1.6x
    (issue 38)."""
    p_beta: float = math.nan
    """The two-sided p of beta = 0 against the normal, from the same standard error (OLS: t)."""
    variances: Variances = field(default_factory=Variances)
    """The parts of the |Asym| variance, and the R^2 they give."""
    converged: bool = False
    """The optimizer that gave the fit converged (OLS: always)."""
    attempts: tuple[str, ...] = ()
    """Each optimizer run, its outcome and REML log-likelihood, in order, then which one was kept."""
    warnings: tuple[str, ...] = ()
    """Every warning statsmodels raised during the fit (first line each, deduplicated)."""
    note: str = ""
    """What was left out or changed on the way (one-level groupings, a CI from the GLS covariance), cut at 300."""

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
            "var_fixed": self.variances.fixed,
            "var_bias": self.variances.bias,
        }
        for g in VC_FORMULA:
            out[f"levels_{g}"] = self.levels.get(g, 0)
            out[f"var_{g}"] = self.variances.components.get(g, math.nan)
        out |= {
            "var_residual": self.variances.residual,
            "r2_marginal": self.variances.r2_marginal,
            "r2_bias": self.variances.r2_bias,
            "r2_conditional": self.variances.r2_conditional,
            "converged": self.converged,
            "attempts": " | ".join(self.attempts),
            "warnings": " | ".join(self.warnings),
            "note": self.note,
        }
        return out


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


def gls_se(
    x: np.ndarray,
    frame: pd.DataFrame,
    var_components: Mapping[str, float],
    var_residual: float,
    names: Sequence[str],
    term: str,
) -> float:
    """The standard error of fixed effect ``term`` (``names``: the columns of ``x``) from :func:`gls_cov`."""
    j = list(names).index(term)
    return math.sqrt(max(float(gls_cov(x, frame, var_components, var_residual)[j, j]), 0.0))


def wald_ci(estimate: float, se: float, level: float = 0.95) -> tuple[pd.Series, float]:
    """(the two-sided normal CI at ``level``, the two-sided p of 0) of an estimate with standard error ``se``."""
    from scipy import stats

    zq = float(stats.norm.isf((1 - level) / 2))
    p = float(2 * stats.norm.sf(abs(estimate) / se)) if se > 0 else math.nan
    return pd.Series([estimate - zq * se, estimate + zq * se]), p


def _first_lines(ws: Sequence[warnings.WarningMessage]) -> list[str]:
    return list(dict.fromkeys(f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in ws))


def _method_name(method: str | None) -> str:
    return method or "default (bfgs, lbfgs, cg)"


def fit_mixed(model: Any) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    """Fit a statsmodels MixedLM by REML with every optimizer of :data:`METHODS`; keep the best.

    Returns (the converged result of highest REML log-likelihood, or the one of
    highest log-likelihood when none converged; the first in :data:`METHODS`
    order within :data:`LLF_TIE` of the best, so that rounding does not pick
    between equal optima; the attempts, each with its log-likelihood, and
    which was kept; the warnings of all attempts). Raises NotComputed when every
    optimizer failed.
    """
    results: list[tuple[str, Any, bool]] = []
    attempts, caught = [], []
    for method in METHODS:
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            try:
                res = model.fit(reml=True, method=method)
            # statsmodels' own failure of one optimizer (a singular or non-finite step): only the library call
            # is inside, each failure is listed in the attempts, and all of them failing is NotComputed below
            except (np.linalg.LinAlgError, ValueError) as e:
                attempts.append(f"{_method_name(method)}: failed ({e})")
                caught += _first_lines(ws)
                continue
        caught += _first_lines(ws)
        ok = bool(res.converged) and np.isfinite(res.llf)
        attempts.append(f"{_method_name(method)}: {'converged' if ok else 'not converged'}, llf {res.llf:.4f}")
        results.append((_method_name(method), res, ok))
    if not results:
        raise NotComputed("every MixedLM optimizer failed: " + "; ".join(attempts))
    pool = [r for r in results if r[2]] or results
    llf = [float(r[1].llf) if np.isfinite(r[1].llf) else -np.inf for r in pool]
    name, best, _ = pool[next(i for i, v in enumerate(llf) if v >= max(llf) - LLF_TIE)]
    attempts.append(f"kept: {name}")
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
    benchmark offsets). Every optimizer's log-likelihood, which one was kept,
    and every warning are recorded (:func:`fit_mixed`). beta's CI and p come
    from the GLS covariance at the REML optimum (:func:`gls_cov`, a Wald
    interval), not from statsmodels' ``conf_int`` (see ``AsymFit.beta_lo``).
    """
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
    f = _mixed_fit(frame, formula, kw, zframe) if levels else _ols_fit(frame, formula)
    fe = f.fe
    beta = float(fe["baseline_bias"])
    var_fixed = float(np.var(f.x @ fe.to_numpy(), ddof=1))
    var_bias = float(np.var(beta * frame["baseline_bias"].to_numpy(float), ddof=1))
    return AsymFit(
        scope,
        f.method,
        n,
        levels,
        structure,
        formula,
        intercept=float(fe["Intercept"]),
        beta=beta,
        beta_lo=float(f.ci.iloc[0]),
        beta_hi=float(f.ci.iloc[1]),
        p_beta=f.p,
        variances=Variances(fixed=var_fixed, bias=var_bias, components=f.vcomp, residual=f.resid),
        converged=f.converged,
        attempts=f.attempts,
        warnings=f.caught,
        note=note[:300],
    )


@dataclass(frozen=True)
class _Fitted:
    """What :func:`fit_asym` keeps of a MixedLM or OLS fit."""

    method: str
    fe: pd.Series
    """The fixed effects by name."""
    ci: pd.Series
    """beta's CI (lo, hi)."""
    p: float
    vcomp: dict[str, float]
    resid: float
    converged: bool
    x: np.ndarray
    """The fixed-effects design matrix."""
    attempts: tuple[str, ...]
    caught: tuple[str, ...]


def _mixed_fit(frame: pd.DataFrame, formula: str, kw: dict[str, Any], zframe: pd.DataFrame) -> _Fitted:
    """The REML MixedLM fit, its variance components, and beta's Wald CI from the GLS covariance."""
    import statsmodels.formula.api as smf

    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        model = smf.mixedlm(formula, frame, **kw)
    caught = tuple(_first_lines(ws))
    res, attempts, fit_ws = fit_mixed(model)
    caught = tuple(dict.fromkeys([*caught, *fit_ws]))
    fe = res.fe_params
    vcomp = dict(zip(model.exog_vc.names, map(float, np.atleast_1d(res.vcomp)), strict=True))
    if kw["re_formula"] == "1":
        vcomp = {"model_reasoning": float(np.asarray(res.cov_re)[0, 0]), **vcomp}
    resid, converged = float(res.scale), bool(res.converged) and np.isfinite(res.llf)
    ci, p = wald_ci(
        float(fe["baseline_bias"]), gls_se(model.exog, zframe, vcomp, resid, list(fe.index), "baseline_bias")
    )
    return _Fitted("MixedLM (REML)", fe, ci, p, vcomp, resid, converged, model.exog, attempts, caught)


def _ols_fit(frame: pd.DataFrame, formula: str) -> _Fitted:
    """OLS, where no grouping has two levels."""
    import statsmodels.api as sm

    ols = sm.OLS.from_formula(formula, frame).fit()
    ci = ols.conf_int().loc["baseline_bias"]
    p = float(ols.pvalues["baseline_bias"])
    return _Fitted("OLS", ols.params, ci, p, {}, float(ols.scale), True, ols.model.exog, ("OLS: closed form",), ())


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
