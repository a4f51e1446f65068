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
