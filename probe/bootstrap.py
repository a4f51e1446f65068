"""The bootstrap draws and the percentile interval that experiments and analysis both use.

A follow-up experiment chooses its trials from the influence audit's per-condition
tests (:mod:`experiments.influence.effects`), and the audit's cluster-bootstrap CIs
and standard errors come from here; so do the cue analysis's. Randomness enters
only through a seeded ``numpy.random.Generator``. The rest of the bootstrap
toolkit of the analyses (resampled positions, the battery's quantile interval, the
basic interval) is :mod:`analysis.common.bootstrap`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]


def cluster_weights(strata: Sequence[str] | NDArray[np.str_], n_boot: int, rng: np.random.Generator) -> Array:
    """Cluster-bootstrap multiplicities: an ``(n_boot, J)`` matrix for ``J`` clusters.

    Within each stratum the ``m`` clusters are resampled with replacement
    ``m`` times (a multinomial draw), so every replicate keeps the strata's
    sizes. A statistic that is a sum over clusters is then ``weights @ values``.
    One stratum for all (``["all"] * J``) is the plain cluster bootstrap.
    """
    labels = np.asarray(strata)
    w = np.zeros((n_boot, labels.size))
    for s in dict.fromkeys(labels.tolist()):
        idx = np.flatnonzero(labels == s)
        w[:, idx] = rng.multinomial(idx.size, np.full(idx.size, 1.0 / idx.size), size=n_boot)
    return w


def percentile_ci(reps: ArrayLike, alpha: float = 0.05, axis: int = 0) -> tuple[Array, Array]:
    """Percentile interval of bootstrap replicates along ``axis`` (NaN replicates ignored)."""
    r = np.asarray(reps, dtype=float)
    with warnings.catch_warnings():  # an all-NaN column (a condition no replicate could compute) stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        lo = np.nanpercentile(r, 100 * alpha / 2, axis=axis)
        hi = np.nanpercentile(r, 100 * (1 - alpha / 2), axis=axis)
    return lo, hi


def expanded_alpha(n: ArrayLike, alpha: float = 0.05) -> Array:
    """The tail level of Hesterberg's expanded percentile interval for ``n`` clusters at nominal level ``1 - alpha``.

    A bootstrap over ``n`` clusters estimates a mean's variance with divisor ``n`` instead of ``n - 1`` (its SE is
    ``sqrt((n - 1) / n)`` of the unbiased one: 0.94 at 9 clusters) and its percentile interval takes normal
    quantiles where a mean over ``n`` clusters calls for Student's t with ``n - 1`` degrees of freedom; both make
    the interval too short when ``n`` is small. The expanded interval (Hesterberg 2015, "What teachers should know
    about the bootstrap", section 3.3; ``boot``-style "expanded percentile") takes the percentile interval at the
    level ``alpha'`` with ``Phi^-1(alpha' / 2) = sqrt(n / (n - 1)) t_{n-1}^-1(alpha / 2)``, so it is still read off the
    replicates (skew kept) but as wide as a t interval with the unbiased SE. At ``n = 9``, ``alpha = 0.05``:
    ``alpha' = 0.0144``. ``n < 2`` gives NaN (no interval from one cluster); large ``n`` tends to ``alpha``.
    """
    from scipy import stats

    nn = np.asarray(n, dtype=float)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = nn >= 2
        safe = np.where(ok, nn, 2.0)
        z = np.sqrt(safe / (safe - 1.0)) * stats.t.ppf(alpha / 2, safe - 1.0)
        return np.where(ok, 2.0 * stats.norm.cdf(z), np.nan)


def expanded_percentile_ci(reps: ArrayLike, n: ArrayLike, alpha: float = 0.05) -> tuple[Array, Array]:
    """Hesterberg's expanded percentile interval of bootstrap replicates ``(n_boot, ...)`` over ``n`` clusters.

    ``n``: the number of resampled clusters behind each column (a scalar or an array of the columns' trailing
    shape); each column's percentile interval is taken at :func:`expanded_alpha` of its ``n`` (NaN replicates
    ignored, as :func:`percentile_ci`). The replicates are the plain cluster bootstrap's: only the quantiles move.
    """
    r = np.asarray(reps, dtype=float)
    a = np.broadcast_to(expanded_alpha(n, alpha), r.shape[1:])
    flat = r.reshape(r.shape[0], -1)
    lo, hi = np.full(flat.shape[1], np.nan), np.full(flat.shape[1], np.nan)
    af = a.reshape(-1)
    with warnings.catch_warnings():  # an all-NaN column stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        for level in np.unique(af[np.isfinite(af)]):
            cols = np.flatnonzero(af == level)
            lo[cols] = np.nanpercentile(flat[:, cols], 100 * level / 2, axis=0)
            hi[cols] = np.nanpercentile(flat[:, cols], 100 * (1 - level / 2), axis=0)
    return lo.reshape(r.shape[1:]), hi.reshape(r.shape[1:])


def expanded_pvalue(estimate: ArrayLike, se: ArrayLike, n: ArrayLike) -> Array:
    """Two-sided p-value of ``estimate`` whose standard error ``se`` a bootstrap over ``n`` clusters estimated: the
    test the expanded percentile interval (:func:`expanded_percentile_ci`) inverts, ``|estimate| / (se *
    sqrt(n / (n - 1)))`` against Student's t with ``n - 1`` degrees of freedom, where a z test on the bootstrap SE
    would reject too often at few clusters (at 9 clusters and nominal 0.05: 0.10 of the time, by the same two
    corrections). ``se == 0`` gives 0 for a nonzero estimate and 1 for a zero one; ``n < 2`` gives NaN."""
    from scipy import stats

    est, sd, nn = (np.asarray(x, dtype=float) for x in (estimate, se, n))
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = nn >= 2
        safe = np.where(ok, nn, 2.0)
        t = np.abs(est) / (sd * np.sqrt(safe / (safe - 1.0)))
        t = np.where((sd == 0) & (est == 0), 0.0, t)
        return np.where(ok, 2.0 * stats.t.sf(t, safe - 1.0), np.nan)
