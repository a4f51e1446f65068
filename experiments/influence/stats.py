"""Statistics of the influence audit (paper 000, section 3.3), as small vectorized pure functions.

For a condition (model x scenario x influence type) with sides A and B and
arms c in {0 (no cue), A (cue toward A), B (cue toward B)}, everything starts
from the counts ``n_c`` (answers) and ``k_c`` (answers choosing B)::

    f_c(B)   = k_c / n_c                   f_c(A) = 1 - f_c(B)
    Delta_A  = f_A(A) - f_0(A)             Delta_B = f_B(B) - f_0(B)
    L_c(d)   = log((k_c(d) + 1/2) / (n_c - k_c(d) + 1/2))     corrected log-odds of d
    s(A)     = L_A(A) - L_0(A)             s(B)    = L_B(B) - L_0(B)
    Asym     = s(B) - s(A)                 N-Asym  = Asym / (|s(A)| + |s(B)|)
    backfire: s(d) < 0

**Continuity correction.** Half a count is added to each of the two cells
before taking a log-odds (Haldane-Anscombe), so a condition where every answer
went one way has a finite steerability; the same correction enters the Wald
variance ``1/(k + 1/2) + 1/(n - k + 1/2)``. ``cc=0`` gives the uncorrected
quantities.

**The Wald test of Asym.** Because ``L_0(B) = -L_0(A)``,
``Asym = L_B(B) - L_A(A) + 2 L_0(A)``: the baseline log-odds enters twice, so
its variance counts four times,
``Var(Asym) = V_A + V_B + 4 V_0``. (Treating ``s(A)`` and ``s(B)`` as
independent would count it twice and reject too often; the simulation test
shows both.)

**Readout runs take no pseudo-count.** A logit run has one readout per
prompt, so ``n`` counts prompts and ``k`` sums P(B): there is no sampling noise
inside a prompt for the correction to temper, and half a *prompt* per cell
only pulls s toward 0 by an amount set by the design (f moving from 0.5 to
0.99 over 18 prompts reads 3.29 instead of logit(0.99) = 4.60). Their log-odds
is the logit of the mean probability (:func:`mean_log_odds`), clipped to
``[clip, 1 - clip]`` where ``clip`` is the run's resolution of a probability
(:func:`readout_clip`); a clipped cell is flagged by the caller.

Tests: exact two-sided binomial for ``f_0(B) != 1/2``; pooled two-proportion
z for ``Delta_d != 0``; Wald z for ``Asym != 0``; Benjamini-Hochberg within a
family. All functions take numpy arrays (or scalars) and broadcast.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

CC = 0.5
"""The continuity correction added to each cell of a log-odds (Haldane-Anscombe)."""

Array = NDArray[np.float64]

FLOAT32_RESOLUTION = 2.0**-24
"""The spacing of float32 numbers just below 1 (half of float32's machine epsilon): readouts are computed in
float32 (docs/DESIGN), so a probability within this of 0 or 1 cannot be told from 0 or 1, and a mean over prompts
no better. The smallest clip of a readout log-odds (:func:`readout_clip`); logit(1 - 2^-24) = 16.6."""


def _f(x: ArrayLike) -> Array:
    return np.asarray(x, dtype=float)


def freq(k: ArrayLike, n: ArrayLike) -> Array:
    """``k / n``; NaN where ``n == 0``."""
    k, n = _f(k), _f(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, k / np.where(n > 0, n, 1.0), np.nan)


def log_odds(k: ArrayLike, n: ArrayLike, cc: float = CC) -> Array:
    """Corrected log-odds of the event counted by ``k`` among ``n``: ``log((k + cc) / (n - k + cc))``."""
    k, n = _f(k), _f(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, np.log(k + cc) - np.log(n - k + cc), np.nan)


def log_odds_var(k: ArrayLike, n: ArrayLike, cc: float = CC) -> Array:
    """Wald variance of :func:`log_odds`: ``1/(k + cc) + 1/(n - k + cc)``."""
    k, n = _f(k), _f(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, 1.0 / (k + cc) + 1.0 / (n - k + cc), np.nan)


def readout_clip(max_prob_diff: float | None = None) -> float:
    """How close to 0 or 1 a readout run's mean probability may come before its log-odds is clipped there.

    A probability is resolved no finer than :data:`FLOAT32_RESOLUTION`, nor than the run's own numeric floor
    (``max_prob_diff``, the largest change of a readout probability when a trial is read alone instead of in its
    batch, :mod:`probe.app.floor`; None where the run recorded none): a distance from 0 or 1 below the larger of
    the two means nothing, so the log-odds past it is not a measurement.
    """
    if max_prob_diff is None:
        return FLOAT32_RESOLUTION
    d = float(max_prob_diff)
    if not (math.isfinite(d) and 0 <= d < 0.5):
        raise ValueError(f"a numeric floor's max_prob_diff must be a number in [0, 0.5), got {max_prob_diff!r}")
    return max(FLOAT32_RESOLUTION, d)


def mean_log_odds(k: ArrayLike, n: ArrayLike, clip: float = FLOAT32_RESOLUTION) -> Array:
    """Log-odds of the mean probability ``k / n`` with no pseudo-count, ``k / n`` clipped to ``[clip, 1 - clip]``.

    The readout rule: ``k`` sums P(side) over ``n`` prompts. NaN where ``n == 0``.
    """
    if not 0 < clip < 0.5:
        raise ValueError(f"clip must lie in (0, 0.5), got {clip!r}")
    f = np.clip(freq(k, n), clip, 1.0 - clip)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.log(f) - np.log1p(-f)


def clipped(k: ArrayLike, n: ArrayLike, clip: float = FLOAT32_RESOLUTION) -> NDArray[np.bool_]:
    """Where :func:`mean_log_odds` clipped: the mean probability ``k / n`` lies within ``clip`` of 0 or 1."""
    f = freq(k, n)
    with np.errstate(invalid="ignore"):
        return (f < clip) | (f > 1.0 - clip)


def readout_steerability(
    k0: ArrayLike, n0: ArrayLike, k: ArrayLike, n: ArrayLike, toward: str, clip: float = FLOAT32_RESOLUTION
) -> Array:
    """``s(d)`` of a readout run: ``logit(f_d(d)) - logit(f_0(d))`` of the mean probabilities, no pseudo-count.

    ``k0``/``k`` sum P(B) over the ``n0``/``n`` prompts of the baseline and the cued arm.
    """
    if toward not in ("A", "B"):
        raise ValueError(f"toward must be 'A' or 'B', got {toward!r}")
    diff = mean_log_odds(k, n, clip) - mean_log_odds(k0, n0, clip)
    return diff if toward == "B" else -diff


def binom_test_half(k: ArrayLike, n: ArrayLike) -> Array:
    """Exact two-sided binomial p-value of ``k`` successes in ``n`` against p = 1/2.

    With p = 1/2 the distribution is symmetric, so the two-sided p-value (the
    probability of an outcome at most as likely as the observed one, scipy's
    ``binomtest`` definition) is ``min(1, 2 P(X <= min(k, n - k)))``.
    """
    k, n = _f(k), _f(n)
    if np.any((np.round(k) != k) | (np.round(n) != n)):
        raise ValueError("binom_test_half needs integer counts; readout probabilities are tested by bootstrap")
    lo = np.minimum(k, n - k)
    p = np.minimum(1.0, 2.0 * stats.binom.cdf(lo, n, 0.5))
    return np.where(n > 0, p, np.nan)


def z_pvalue(z: ArrayLike) -> Array:
    """Two-sided normal p-value of a z statistic."""
    return 2.0 * stats.norm.sf(np.abs(_f(z)))


def two_proportion_z(k1: ArrayLike, n1: ArrayLike, k2: ArrayLike, n2: ArrayLike) -> tuple[Array, Array]:
    """Pooled two-proportion z test of ``k1/n1 == k2/n2``: (z, two-sided p).

    The pooled proportion ``(k1 + k2) / (n1 + n2)`` gives the standard error
    under the null (statsmodels' ``proportions_ztest`` default). When both
    proportions are 0 or both are 1 the difference is 0 with no variance:
    z = 0, p = 1 (no evidence of a shift), where statsmodels returns NaN.
    """
    k1, n1, k2, n2 = _f(k1), _f(n1), _f(k2), _f(n2)
    with np.errstate(invalid="ignore", divide="ignore"):
        p1, p2 = k1 / n1, k2 / n2
        pooled = (k1 + k2) / (n1 + n2)
        se = np.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
        z = np.where(se > 0, (p1 - p2) / np.where(se > 0, se, 1.0), np.where(p1 == p2, 0.0, np.nan))
    valid = (n1 > 0) & (n2 > 0)
    z = np.where(valid, z, np.nan)
    return z, np.where(valid, z_pvalue(z), np.nan)


def steerability(k0: ArrayLike, n0: ArrayLike, k: ArrayLike, n: ArrayLike, toward: str, cc: float = CC) -> Array:
    """``s(d)``: the shift in corrected log-odds of side ``toward`` from the baseline to the cue toward it.

    ``k0``/``k`` count answers choosing **B** in the baseline and in the cued arm.
    """
    if toward not in ("A", "B"):
        raise ValueError(f"toward must be 'A' or 'B', got {toward!r}")
    if toward == "B":
        return log_odds(k, n, cc) - log_odds(k0, n0, cc)
    return log_odds(_f(n) - _f(k), n, cc) - log_odds(_f(n0) - _f(k0), n0, cc)


def wald_asym(
    k0: ArrayLike, n0: ArrayLike, kA: ArrayLike, nA: ArrayLike, kB: ArrayLike, nB: ArrayLike, cc: float = CC
) -> tuple[Array, Array, Array, Array]:
    """Asym = s(B) - s(A) and its Wald test: (asym, variance, z, two-sided p).

    ``k0``, ``kA``, ``kB`` count answers choosing **B** in the baseline, under
    the cue toward A and under the cue toward B. The variance counts the
    baseline four times (see the module docstring).
    """
    asym = steerability(k0, n0, kB, nB, "B", cc) - steerability(k0, n0, kA, nA, "A", cc)
    var = log_odds_var(kB, nB, cc) + log_odds_var(kA, nA, cc) + 4.0 * log_odds_var(k0, n0, cc)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = asym / np.sqrt(var)
    return asym, var, z, z_pvalue(z)


def normalized_asym(s_a: ArrayLike, s_b: ArrayLike) -> Array:
    """``(s(B) - s(A)) / (|s(A)| + |s(B)|)`` in [-1, 1]; NaN when neither direction moves the model."""
    s_a, s_b = _f(s_a), _f(s_b)
    denom = np.abs(s_a) + np.abs(s_b)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (s_b - s_a) / np.where(denom > 0, denom, 1.0), np.nan)


def wilson_interval(k: ArrayLike, n: ArrayLike, alpha: float = 0.05) -> tuple[Array, Array]:
    """Wilson score interval of ``k / n`` (as statsmodels' ``proportion_confint(method='wilson')``)."""
    k, n = _f(k), _f(n)
    z = stats.norm.isf(alpha / 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        denom = 1 + z**2 / n
        centre = (p + z**2 / (2 * n)) / denom
        half = z * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / denom
    return np.where(n > 0, centre - half, np.nan), np.where(n > 0, centre + half, np.nan)


def bh_adjust(p: ArrayLike) -> Array:
    """Benjamini-Hochberg adjusted p-values (q-values); NaNs stay NaN and do not count in m."""
    p = _f(p)
    out = np.full(p.shape, np.nan)
    ok = ~np.isnan(p)
    m = int(ok.sum())
    if m == 0:
        return out
    pv = p[ok]
    order = np.argsort(pv, kind="mergesort")
    ranked = pv[order] * m / np.arange(1, m + 1)
    q = np.minimum.accumulate(ranked[::-1])[::-1]
    adj = np.empty(m)
    adj[order] = np.minimum(q, 1.0)
    out[ok] = adj
    return out


def nan_sd(reps: ArrayLike, axis: int = 0) -> Array:
    """Standard deviation of bootstrap replicates (ddof 1), NaN replicates ignored."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanstd(_f(reps), axis=axis, ddof=1)


def z_from_se(estimate: ArrayLike, se: ArrayLike) -> Array:
    """``estimate / se`` with the degenerate cases made explicit: se = 0 gives +-inf (or 0 for a 0 estimate)."""
    est, se = _f(estimate), _f(se)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = est / se
    return np.where((se == 0) & (est == 0), 0.0, z)
