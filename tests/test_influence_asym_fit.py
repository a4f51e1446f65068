"""The |Asym| ~ |baseline bias| fit: crossed and nested structures against statsmodels, benchmark offsets,
the share of |bias| alone, and the record of optimizer retries and warnings."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis.influence import asym


def _groupings(
    rng: np.random.Generator, n: int, factors: list[str], influences: list[str], benchmarks: list[str] | None = None
) -> pd.DataFrame:
    """The columns of :func:`asym.asym_frame` but ``abs_asym``: six model x reasoning groups, the given factors,
    influences (and benchmarks) drawn at random, and |baseline bias| uniform on 0..0.5."""
    cols = {
        "model_reasoning": rng.choice(list("abcdef"), n),
        "factor": rng.choice(factors, n),
        "influence": rng.choice(influences, n),
    }
    if benchmarks is not None:
        cols["benchmark"] = rng.choice(benchmarks, n)
    cols["baseline_bias"] = rng.uniform(0, 0.5, n)
    return pd.DataFrame(cols)


def _crossed_frame(n: int = 160, seed: int = 3) -> pd.DataFrame:
    """One intercept per model x reasoning group, factor and influence (crossed), slope 2 on |bias|."""
    rng = np.random.default_rng(seed)
    df = _groupings(rng, n, ["t:g", "t:h", "t:i", "t:j"], list("uvwxy"))
    effect = {k: rng.normal(0, 0.4) for k in [*"abcdef", "t:g", "t:h", "t:i", "t:j", *"uvwxy"]}
    noise = rng.normal(0, 0.3, n)
    df["abs_asym"] = 0.3 + 2.0 * df["baseline_bias"] + noise
    for g in ("model_reasoning", "factor", "influence"):
        df["abs_asym"] += df[g].map(effect)
    return df


def _nested_frame(n: int = 240, seed: int = 5) -> pd.DataFrame:
    """Factor and influence intercepts drawn anew for every model x reasoning group (nested), two benchmarks."""
    rng = np.random.default_rng(seed)
    df = _groupings(rng, n, ["f1", "f2", "f3", "f4"], list("uvwx"), ["triage", "bbq"])
    mr = {g: rng.normal(0, 0.5) for g in "abcdef"}
    inner = {(g, f): rng.normal(0, 0.4) for g in "abcdef" for f in ["f1", "f2", "f3", "f4", *"uvwx"]}
    y = 0.3 + 2.0 * df["baseline_bias"] + df["model_reasoning"].map(mr) + rng.normal(0, 0.3, n)
    y += [
        inner[(g, f)] + inner[(g, i)]
        for g, f, i in zip(df["model_reasoning"], df["factor"], df["influence"], strict=True)
    ]
    df["abs_asym"] = y + np.where(df["benchmark"] == "bbq", 1.0, 0.0)
    return df


def test_fit_asym_recovers_a_planted_slope_and_the_gls_se() -> None:
    import statsmodels.formula.api as smf

    df = _crossed_frame()
    fit = asym.fit_asym(df, "synthetic")
    assert fit.converged and fit.levels == {"model_reasoning": 6, "factor": 4, "influence": 5}
    assert fit.beta_lo < 2.0 < fit.beta_hi
    assert 0 < fit.variances.r2_marginal < fit.variances.r2_conditional < 1
    model = smf.mixedlm(
        "abs_asym ~ baseline_bias", df, groups=np.ones(len(df)), re_formula="0", vc_formula=asym.VC_FORMULA
    )
    res = model.fit(reml=True)
    cov = asym.gls_cov(model.exog, df, dict(zip(model.exog_vc.names, res.vcomp, strict=True)), res.scale)
    np.testing.assert_allclose(np.sqrt(np.diag(cov)), res.bse_fe.to_numpy(), rtol=5e-3)


def test_variance_shares_hand_values_and_ols_fallback() -> None:
    import statsmodels.api as sm

    v = asym.Variances(fixed=1.0, bias=0.5, components={"factor": 1.0, "influence": 2.0}, residual=1.0)
    assert (v.random, v.total) == (3.0, 5.0)
    assert (v.r2_marginal, v.r2_conditional, v.r2_bias) == pytest.approx((0.2, 0.8, 0.1))  # 1/5, (1 + 3)/5, 0.5/5
    empty = asym.Variances(fixed=0.0, bias=0.0, residual=0.0)
    assert all(math.isnan(r) for r in (empty.r2_marginal, empty.r2_conditional, empty.r2_bias))
    df = _crossed_frame().assign(model_reasoning="a", factor="t:g", influence="u")
    fit = asym.fit_asym(df, "one of each")
    ols = sm.OLS(df["abs_asym"], sm.add_constant(df["baseline_bias"])).fit()
    assert fit.method == "OLS" and "left out (one level)" in fit.note
    assert fit.beta == pytest.approx(ols.params["baseline_bias"])
    assert (fit.beta_lo, fit.beta_hi) == pytest.approx(tuple(ols.conf_int().loc["baseline_bias"]))
    var_f = float(np.var(ols.fittedvalues, ddof=1))
    assert fit.variances.r2_marginal == pytest.approx(var_f / (var_f + ols.scale))
    assert asym.fit_asym(df.head(2), "tiny").method == "none"


def test_nested_fit_equals_a_direct_statsmodels_call() -> None:
    import statsmodels.formula.api as smf

    df = _nested_frame()
    fit = asym.fit_asym(df, "bbq+triage", structure="nested")
    model = smf.mixedlm(
        "abs_asym ~ baseline_bias",
        df,
        groups=df["model_reasoning"],
        re_formula="1",
        vc_formula={"factor": "0 + C(factor)", "influence": "0 + C(influence)"},
    )
    res = model.fit(reml=True)
    assert fit.structure == "nested" and fit.method == "MixedLM (REML)"
    assert fit.levels == {"factor": 24, "influence": 24, "model_reasoning": 6}  # (group, level) combinations
    assert fit.beta == pytest.approx(res.fe_params["baseline_bias"], rel=1e-6)
    vc = {"model_reasoning": float(res.cov_re.iloc[0, 0]), **dict(zip(model.exog_vc.names, res.vcomp, strict=True))}
    assert dict(fit.variances.components) == pytest.approx(vc, rel=1e-5)
    assert fit.variances.residual == pytest.approx(res.scale, rel=1e-6)
    var_f = float(np.var(model.exog @ res.fe_params.to_numpy(), ddof=1))
    total = var_f + sum(vc.values()) + res.scale
    assert fit.variances.r2_marginal == pytest.approx(var_f / total, rel=1e-6)
    assert fit.variances.r2_bias == pytest.approx(
        fit.variances.r2_marginal, rel=1e-9
    )  # no benchmark offsets: X beta is the bias term
    assert fit.attempts[0].startswith("default") and fit.attempts[-1].endswith("converged")


def test_crossed_and_nested_differ_on_nested_data() -> None:
    df = _nested_frame()
    crossed = asym.fit_asym(df, "x", structure="crossed")
    nested = asym.fit_asym(df, "x", structure="nested")
    # the planted within-group factor and influence variances (0.4^2 = 0.16 each) are what nested recovers;
    # crossed sees one intercept per factor across groups, so most of that variance lands in its residual
    # (both residuals also hold the unmodelled benchmark offset, variance 0.25); fixed seed: deterministic
    assert nested.variances.residual < crossed.variances.residual - 0.1
    assert nested.variances.components["factor"] > 0.05 and nested.variances.components["influence"] > 0.05
    with pytest.raises(ValueError, match="crossed, nested"):
        asym.fit_asym(df, "x", structure="random")


def test_pooled_fit_has_benchmark_offsets_and_the_bias_share_alone() -> None:
    import statsmodels.formula.api as smf

    df = _nested_frame()
    fit = asym.fit_asym(df, "pooled", benchmark_effect=True)
    assert fit.formula == "abs_asym ~ baseline_bias + C(benchmark)"
    model = smf.mixedlm(fit.formula, df, groups=np.ones(len(df)), re_formula="0", vc_formula=dict(asym.VC_FORMULA))
    res = model.fit(reml=True)
    assert fit.beta == pytest.approx(res.fe_params["baseline_bias"], rel=1e-6)
    offset = res.fe_params["C(benchmark)[T.triage]"]
    assert offset == pytest.approx(-1.0, abs=0.25)  # planted: bbq is 1.0 above triage
    vc = sum(res.vcomp)
    var_f = float(np.var(model.exog @ res.fe_params.to_numpy(), ddof=1))
    var_b = float(np.var(res.fe_params["baseline_bias"] * df["baseline_bias"], ddof=1))
    total = var_f + vc + res.scale
    assert fit.variances.r2_marginal == pytest.approx(var_f / total, rel=1e-5)
    assert fit.variances.r2_bias == pytest.approx(var_b / total, rel=1e-5)
    assert (
        fit.variances.r2_bias < fit.variances.r2_marginal
    )  # the benchmark offsets explain variance the |bias| term does not


def test_asym_fits_per_structure_and_pooled() -> None:
    df = _nested_frame()
    cond = pd.DataFrame(
        {
            "variant": "cue",
            "benchmark": df["benchmark"],
            "run": df["model_reasoning"],
            "model": df["model_reasoning"],
            "think": False,
            "pair": df["factor"],
            "influence": df["influence"],
            "baseline_bias": df["baseline_bias"],
            "asym": df["abs_asym"],
        }
    )
    fits = asym.asym_fits(cond, ("nested", "crossed"))
    first = str(df["benchmark"].iloc[0])  # benchmarks in order of first appearance
    other = "triage" if first == "bbq" else "bbq"
    assert [(f.scope, f.structure) for f in fits] == [
        (first, "nested"),
        (other, "nested"),
        ("pooled", "nested"),
        (first, "crossed"),
        (other, "crossed"),
        ("pooled", "crossed"),
    ]
    assert all(("C(benchmark)" in f.formula) == (f.scope == "pooled") for f in fits)


class _Model:
    """A stand-in MixedLM whose default optimizer fails to converge (with a warning) and powell converges."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def fit(self, reml: bool, method: Any = None) -> Any:
        self.calls.append(method)
        if method is None:
            warnings.warn("Retrying MixedLM optimization with lbfgs", UserWarning, stacklevel=2)
            return SimpleNamespace(converged=False, llf=-10.0, tag="default")
        return SimpleNamespace(converged=True, llf=-9.0, tag=method)


def test_fit_mixed_retries_and_records_attempts_and_warnings() -> None:
    model = _Model()
    res, attempts, ws = asym.fit_mixed(model)
    assert res.tag == "powell" and model.calls == [None, "powell"]
    assert attempts == ("default (bfgs, lbfgs, cg): not converged", "powell: converged")
    assert ws == ("UserWarning: Retrying MixedLM optimization with lbfgs",)


def test_a_boundary_fit_records_its_warnings_in_the_report_row() -> None:
    rng = np.random.default_rng(1)
    n = 60
    df = pd.DataFrame(
        {
            "model_reasoning": rng.choice(list("ab"), n),
            "factor": rng.choice(["f1", "f2", "f3"], n),
            "influence": rng.choice(list("uv"), n),
            "baseline_bias": rng.uniform(0, 0.5, n),
        }
    )
    df["abs_asym"] = 1.0 + df["baseline_bias"] + rng.normal(0, 0.3, n)  # no grouping effect: variances at 0
    fit = asym.fit_asym(df, "flat")
    row = asym.AsymFit.row(fit)
    assert fit.warnings and "boundary" in row["warnings"]
    assert row["attempts"] == " | ".join(fit.attempts) and row["attempts"]
