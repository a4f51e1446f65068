"""The one bootstrap module of every estimator: resampled positions, cluster weights, percentile intervals.

Randomness enters only here, through a seeded ``numpy.random.Generator``:
:func:`resample_index` draws the item positions of an ordinary bootstrap
(one ``(n_boot, n)`` draw, so paired statistics that share it stay paired),
:func:`probe.bootstrap.cluster_weights` the multiplicities of a stratified cluster
bootstrap (kept in the core with :func:`probe.bootstrap.percentile_ci`, because
the follow-up experiment chooses its trials from the influence audit's tests).
Seeded intervals are reproducible to the bit: the draws are the ones the
battery and influence estimators have always made.

Two interval readers, kept apart because their arithmetic differs in the
last bits: :func:`quantile_ci` (``numpy.quantile`` at ``(1 - level) / 2``,
the battery's stance, fit and yes/no intervals) and
:func:`probe.bootstrap.percentile_ci` (``numpy.nanpercentile``, NaN replicates
ignored; the influence audit and the battery comparison through
:func:`finite_ci`). Beside them :func:`basic_ci`, the basic (reflected) interval
and bias-corrected estimate for a statistic whose replicates are biased (the
influence audit's mean |shift|).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from probe.bootstrap import percentile_ci


def check_bootstrap(level: float, n_boot: int | None = None, min_boot: int = 0) -> None:
    """Refuse a CI ``level`` outside (0, 1), or ``n_boot`` under ``min_boot``, naming the value received.

    Every estimate with a bootstrap CI takes these two; checking them in one
    place keeps the messages the same across the papers.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n_boot is not None and n_boot < min_boot:
        raise ValueError(f"n_boot must be >= {min_boot}, got {n_boot}")


def resample_index(n: int, n_boot: int, seed: int) -> NDArray[np.int64]:
    """Resampled positions ``0..n-1`` with replacement, shape ``(n_boot, n)``, from ``default_rng(seed)``."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def quantile_ci(reps: ArrayLike, level: float = 0.95, axis: int | None = None) -> tuple[Any, Any]:
    """The central ``level`` interval of bootstrap replicates: ``numpy.quantile`` at ``(1 - level) / 2`` and its mirror.

    Scalars for 1-d replicates (``axis`` None), arrays along ``axis`` otherwise.
    """
    alpha = (1 - level) / 2
    lo, hi = np.quantile(np.asarray(reps, dtype=float), [alpha, 1 - alpha], axis=axis)
    return lo, hi


def basic_ci(point: float, reps: ArrayLike, alpha: float = 0.05, lower: float = -np.inf) -> tuple[float, float, float]:
    """The bias-corrected estimate ``2 point - mean(reps)`` and the basic bootstrap interval ``[2 point - q_hi,
    2 point - q_lo]`` (Davison & Hinkley 1997, eq. 5.6; ``q`` the percentiles of
    :func:`probe.bootstrap.percentile_ci`), all three clipped below at ``lower``; NaN replicates ignored, NaN when
    none is finite.

    Why beside the percentile interval: the percentile interval assumes the replicates scatter around the
    estimate as the estimate scatters around the truth, so a biased statistic (a mean of absolute values is
    biased away from 0 and its replicates twice as far) gets an interval shifted by the bias, which can exclude
    its own estimate. The basic interval reflects the replicates' spread around the estimate to the other side,
    which removes the bias to first order; the bias-corrected estimate is its centre.
    """
    r = np.asarray(reps, dtype=float)
    r = r[np.isfinite(r)]
    if not r.size or not math.isfinite(point):
        return math.nan, math.nan, math.nan
    lo, hi = percentile_ci(r, alpha=alpha)
    est, b_lo, b_hi = 2 * point - float(np.mean(r)), 2 * point - float(hi), 2 * point - float(lo)
    return max(lower, est), max(lower, b_lo), max(lower, b_hi)


def finite_ci(values: ArrayLike, level: float = 0.95) -> tuple[float, float]:
    """:func:`probe.bootstrap.percentile_ci` of 1-d replicates as floats, over the finite ones (none finite: NaN, NaN)."""
    v = np.asarray(values, dtype=float)
    if not np.isfinite(v).any():
        return float("nan"), float("nan")
    lo, hi = percentile_ci(v[np.isfinite(v)], alpha=1 - level)
    return float(lo), float(hi)
