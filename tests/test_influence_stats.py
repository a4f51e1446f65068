"""Statistics of the influence audit (experiments.influence.stats): hand-worked counts, scipy/statsmodels, simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint, proportions_ztest

from experiments.influence import stats as st
from probe.bootstrap import cluster_weights, expanded_alpha, expanded_percentile_ci, expanded_pvalue, percentile_ci

# A hand-worked condition: 60 answers per arm; B chosen 30 times with no cue,
# 15 times under the cue toward A (so A 45 times), 40 times under the cue toward B.
N0, K0, NA, KA, NB, KB = 60, 30, 60, 15, 60, 40


def test_hand_worked_condition() -> None:
    assert st.freq(K0, N0) == pytest.approx(0.5)
    assert st.freq(KA, NA) == pytest.approx(0.25)
    # Delta_A = f_A(A) - f_0(A) = 45/60 - 30/60; Delta_B = 40/60 - 30/60
    s_a = st.steerability(K0, N0, KA, NA, "A")
    s_b = st.steerability(K0, N0, KB, NB, "B")
    # corrected log-odds: A under cue A = log(45.5/15.5); baseline = log(30.5/30.5) = 0; B under cue B = log(40.5/20.5)
    assert s_a == pytest.approx(math.log(45.5 / 15.5)) == pytest.approx(1.0768715, abs=1e-6)
    assert s_b == pytest.approx(math.log(40.5 / 20.5)) == pytest.approx(0.6808770, abs=1e-6)
    asym, var, z, p = st.wald_asym(K0, N0, KA, NA, KB, NB)
    assert asym == pytest.approx(0.6808770 - 1.0768715, abs=1e-6)
    by_hand = 1 / 40.5 + 1 / 20.5 + 1 / 45.5 + 1 / 15.5 + 4 * (1 / 30.5 + 1 / 30.5)
    assert var == pytest.approx(by_hand) == pytest.approx(0.4222611, abs=1e-6)
    assert z == pytest.approx(-0.395995 / math.sqrt(0.4222611), abs=1e-5)
    assert p == pytest.approx(2 * stats.norm.sf(0.609395), abs=1e-5)
    assert st.normalized_asym(s_a, s_b) == pytest.approx(-0.395995 / (1.0768715 + 0.6808770), abs=1e-5)


def test_asym_is_steerability_difference_and_baseline_enters_twice() -> None:
    """Asym = L_B(B) - L_A(A) + 2 L_0(A): the algebra behind the variance counted four times."""
    rng = np.random.default_rng(3)
    n = rng.integers(5, 200, size=(3, 50))
    k = rng.integers(0, n + 1)
    asym, *_ = st.wald_asym(k[0], n[0], k[1], n[1], k[2], n[2])
    lo = st.log_odds
    rewritten = lo(k[2], n[2]) - lo(n[1] - k[1], n[1]) + 2 * lo(n[0] - k[0], n[0])
    np.testing.assert_allclose(asym, rewritten, rtol=1e-12)


def test_continuity_correction_keeps_one_sided_counts_finite() -> None:
    s = st.steerability(0, 40, 40, 40, "B")  # baseline never B, cue toward B always B
    assert math.isfinite(float(s))
    assert s == pytest.approx(math.log(40.5 / 0.5) - math.log(0.5 / 40.5))
    with np.errstate(divide="ignore"):
        assert math.isinf(float(st.steerability(0, 40, 40, 40, "B", cc=0.0)))
    assert math.isfinite(float(st.wald_asym(0, 40, 40, 40, 40, 40)[2]))


def test_binom_test_matches_scipy() -> None:
    for n in range(1, 41):
        for k in range(n + 1):
            assert st.binom_test_half(k, n) == pytest.approx(stats.binomtest(k, n, 0.5).pvalue, rel=1e-9), (k, n)
    assert math.isnan(float(st.binom_test_half(0, 0)))
    with pytest.raises(ValueError, match="integer counts"):
        st.binom_test_half(2.5, 10)


def test_two_proportion_z_matches_statsmodels() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n1, n2 = rng.integers(5, 300, size=2)
        k1, k2 = rng.integers(1, n1), rng.integers(1, n2)
        z, p = st.two_proportion_z(k1, n1, k2, n2)
        zs, ps = proportions_ztest([k1, k2], [n1, n2])
        assert z == pytest.approx(zs, rel=1e-9)
        assert p == pytest.approx(ps, rel=1e-9)
    # both arms all-B: no shift and no variance -> z = 0, p = 1 (statsmodels gives NaN)
    assert st.two_proportion_z(10, 10, 20, 20) == (0.0, 1.0)


@pytest.mark.filterwarnings("ignore")  # a saturated fit has no residual df and separates perfectly by design
def test_wald_asym_matches_a_saturated_logistic_fit() -> None:
    """Without the correction, Asym's Wald test is the contrast beta_A + beta_B - 2 beta_0 of a binomial GLM."""
    import statsmodels.api as sm

    rng = np.random.default_rng(1)
    for _ in range(10):
        n = rng.integers(30, 400, size=3)
        k = np.array([rng.integers(3, m - 3) for m in n])
        asym, var, _, p = st.wald_asym(k[0], n[0], k[1], n[1], k[2], n[2], cc=0.0)
        endog = np.column_stack([k, n - k])  # successes = B, failures = A
        fit = sm.GLM(endog, np.eye(3), family=sm.families.Binomial()).fit()
        test = fit.t_test(np.array([[-2.0, 1.0, 1.0]]))
        assert asym == pytest.approx(float(test.effect[0]), rel=1e-6)
        assert math.sqrt(var) == pytest.approx(float(test.sd[0, 0]), rel=1e-6)
        assert p == pytest.approx(float(test.pvalue), rel=1e-5)


def _null_conditions(rng: np.random.Generator, m: int, n: int) -> tuple[np.ndarray, ...]:
    """``m`` conditions with equal steerability toward A and toward B (Asym = 0), ``n`` answers per arm."""
    p0 = rng.uniform(0.2, 0.8, m)
    s = rng.uniform(-1.5, 1.5, m)
    logit0 = np.log(p0 / (1 - p0))
    p_b_under_b = 1 / (1 + np.exp(-(logit0 + s)))
    p_b_under_a = 1 / (1 + np.exp(-(logit0 - s)))
    return rng.binomial(n, p0), rng.binomial(n, p_b_under_a), rng.binomial(n, p_b_under_b)


@pytest.mark.parametrize("n", [100, 400])
def test_wald_asym_size_under_the_null(n: int) -> None:
    """Rejection rate at alpha 0.05 within [0.03, 0.07] over 8000 simulated null conditions."""
    rng = np.random.default_rng(2024 + n)
    k0, ka, kb = _null_conditions(rng, 8000, n)
    p = st.wald_asym(k0, n, ka, n, kb, n)[3]
    rate = float(np.mean(p < 0.05))
    # Deterministic (default_rng(2024 + n)): false-failure rate 0. At a fresh seed, a test of exact size 0.05
    # has a rejection rate with SE sqrt(0.05 * 0.95 / 8000) = 0.0024: the band is 8 SE wide each side (~1e-15).
    assert 0.03 <= rate <= 0.07, rate
    # the same statistic with the baseline counted twice (as if s(A), s(B) were independent) over-rejects
    asym = st.steerability(k0, n, kb, n, "B") - st.steerability(k0, n, ka, n, "A")
    naive = st.log_odds_var(kb, n) + st.log_odds_var(ka, n) + 2 * st.log_odds_var(k0, n)
    naive_rate = float(np.mean(st.z_pvalue(asym / np.sqrt(naive)) < 0.05))
    assert naive_rate > 0.08, naive_rate  # same draws, deterministic; 0.08 is 12 SE above the nominal 0.05


def test_wilson_matches_statsmodels() -> None:
    for k, n in [(0, 10), (3, 10), (50, 100), (99, 100), (7, 7)]:
        lo, hi = st.wilson_interval(k, n)
        slo, shi = proportion_confint(k, n, method="wilson")
        assert lo == pytest.approx(slo, abs=1e-12)
        assert hi == pytest.approx(shi, abs=1e-12)


def test_bh_matches_statsmodels_and_skips_nan() -> None:
    rng = np.random.default_rng(5)
    p = rng.uniform(0, 0.2, 40)
    np.testing.assert_allclose(st.bh_adjust(p), multipletests(p, method="fdr_bh")[1], rtol=1e-12)
    q = st.bh_adjust([0.01, np.nan, 0.04, 0.03])
    assert math.isnan(q[1])
    np.testing.assert_allclose(q[[0, 2, 3]], multipletests([0.01, 0.04, 0.03], method="fdr_bh")[1])
    # hand-worked: m = 4, sorted p 0.01 0.02 0.03 0.2 -> 0.04 0.04 0.04 0.2
    np.testing.assert_allclose(st.bh_adjust([0.2, 0.01, 0.03, 0.02]), [0.2, 0.04, 0.04, 0.04])


def test_normalized_asym_range_and_undefined() -> None:
    assert st.normalized_asym(1.0, 1.0) == 0.0
    assert st.normalized_asym(0.0, 2.0) == 1.0
    assert st.normalized_asym(-1.0, 1.0) == 1.0  # A backfires, B complies: fully asymmetric toward B
    assert math.isnan(float(st.normalized_asym(0.0, 0.0)))
    with pytest.raises(ValueError, match="toward"):
        st.steerability(1, 2, 1, 2, "C")


def test_cluster_weights_keep_strata_and_match_the_analytic_se() -> None:
    rng = np.random.default_rng(0)
    strata = ["x"] * 30 + ["y"] * 10
    w = cluster_weights(strata, 4000, rng)
    assert w.shape == (4000, 40)
    np.testing.assert_array_equal(w[:, :30].sum(axis=1), 30)
    np.testing.assert_array_equal(w[:, 30:].sum(axis=1), 10)
    values = np.random.default_rng(1).normal(size=30)
    boot = w[:, :30] @ values / 30
    analytic = values.std(ddof=0) / math.sqrt(30)  # the bootstrap SE of a mean (plug-in variance)
    # Deterministic (default_rng(0), (1)): false-failure rate 0. At fresh seeds, an SD from 4000 resamples has
    # a relative SE of 1/sqrt(2 * 4000) = 1.1%, so rel 0.06 is 5.4 SE (~7e-8).
    assert st.nan_sd(boot) == pytest.approx(analytic, rel=0.06)
    again = cluster_weights(strata, 4000, np.random.default_rng(0))
    np.testing.assert_array_equal(w, again)


def test_percentile_ci_and_z_from_se() -> None:
    reps = np.column_stack([np.arange(1001, dtype=float), np.full(1001, np.nan)])
    lo, hi = percentile_ci(reps)
    assert lo[0] == pytest.approx(25.0) and hi[0] == pytest.approx(975.0)
    assert np.isnan(lo[1]) and np.isnan(hi[1])
    np.testing.assert_array_equal(st.z_from_se([0.0, 1.0, 2.0], [0.0, 0.0, 1.0]), [0.0, np.inf, 2.0])


def test_expanded_alpha_by_hand_and_by_scipy() -> None:
    # by hand, n = 9: t_8 quantile 2.306004 (tables), times sqrt(9/8) = 1.0606602 gives 2.445884, and
    # 2 Phi(-2.445884) = 2 x 0.0072248 = 0.0144496
    assert float(expanded_alpha(9)) == pytest.approx(0.0144496, abs=2e-7)
    n = np.array([2.0, 5.0, 30.0, 1e6])
    want = 2 * stats.norm.cdf(np.sqrt(n / (n - 1)) * stats.t.ppf(0.025, n - 1))
    np.testing.assert_allclose(expanded_alpha(n), want, rtol=1e-12)
    assert float(expanded_alpha(1e6)) == pytest.approx(0.05, abs=1e-5)  # the plain interval for many clusters
    assert np.isnan(expanded_alpha([1.0, 0.0])).all()
    with pytest.raises(ValueError, match="alpha must lie in"):
        expanded_alpha(9, 1.5)


def test_expanded_pvalue_is_the_test_the_expanded_interval_inverts() -> None:
    # by hand, n = 9: the statistic at the interval's edge, 2.445884 (sqrt(9/8) x t_8 0.975 quantile 2.306004),
    # has p = 0.05; a z test on the same bootstrap SE would give 2 Phi(-2.445884) = 0.0144
    edge = np.sqrt(9 / 8) * stats.t.ppf(0.975, 8)
    assert float(expanded_pvalue(edge, 1.0, 9)) == pytest.approx(0.05, abs=1e-12)
    assert float(expanded_pvalue(-2 * edge, 2.0, 9)) == pytest.approx(0.05, abs=1e-12)  # |estimate| / se
    n = np.array([3.0, 9.0, 40.0])
    want = 2 * stats.t.sf(1.5 / np.sqrt(n / (n - 1)), n - 1)
    np.testing.assert_allclose(expanded_pvalue(1.5, 1.0, n), want, rtol=1e-12)
    assert float(expanded_pvalue(0.0, 0.0, 9)) == 1.0 and float(expanded_pvalue(0.3, 0.0, 9)) == 0.0
    assert np.isnan(expanded_pvalue(1.0, 1.0, 1))


def test_expanded_percentile_ci_reads_the_replicates_at_the_expanded_level() -> None:
    reps = np.column_stack([np.arange(1001, dtype=float), np.arange(1001, dtype=float), np.full(1001, np.nan)])
    lo, hi = expanded_percentile_ci(reps, [9, 1e9, 9])
    a = float(expanded_alpha(9))
    assert lo[0] == pytest.approx(1000 * a / 2) and hi[0] == pytest.approx(1000 * (1 - a / 2))  # 7.22, 992.78
    plain = percentile_ci(reps[:, 1])
    assert lo[1] == pytest.approx(float(plain[0]), abs=0.01) and hi[1] == pytest.approx(float(plain[1]), abs=0.01)
    assert np.isnan(lo[2]) and np.isnan(hi[2])
    # the bootstrap of a mean of 9 values: the expanded interval is about as wide as Student's t interval
    # (deterministic seeds; at 20000 replicates the width's sampling error is about 1%)
    x = np.random.default_rng(3).normal(size=9)
    w = cluster_weights(["all"] * 9, 20000, np.random.default_rng(4))
    boot = w @ x / 9
    elo, ehi = expanded_percentile_ci(boot, 9)
    t_width = 2 * stats.t.ppf(0.975, 8) * x.std(ddof=1) / 3
    plo, phi = percentile_ci(boot)
    assert float(ehi - elo) == pytest.approx(t_width, rel=0.06)
    assert float(phi - plo) < 0.85 * t_width  # the plain interval is short
