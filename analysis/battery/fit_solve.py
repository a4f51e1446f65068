"""What the per-channel and the joint (s, m) fits share: the solver, the bootstrap of refits and the quality flags.

:func:`multistart` is the bounded ``least_squares`` over the starting points, :func:`bootstrap_refits` the
percentile CIs of refits over item resamples, :func:`goodness` the r2 and rmse of a fit; :class:`FitQuality`
flags saturation, bounds (:func:`at_bound`) and convergence by the same rules for both fits, and
:func:`unidentified_reason` says when the items cannot separate s from m. The settings they read
(bounds, clip, level) are :mod:`analysis.battery.fit`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from analysis.battery.fit import M_BOUND, S_BOUNDS, THETA_SPREAD_MIN
from analysis.common.bootstrap import quantile_ci, resample_index


# ------------------------------------------------------------------ quality flags
@dataclass(frozen=True)
class FitQuality:
    """How far a fit can be read: saturation, bounds and convergence of its point estimate, and its bootstrap.

    The per-channel and the joint fit flag their estimates by the same rules
    (:meth:`measure`), so a flag means the same in both tables.
    """

    frac_saturated: float
    """Share of the fitted P (the stacked p+ and p-, or every fitted cell) within ``clip`` of 0 or 1."""
    saturated: bool
    """Most (> half) of the fitted P are clipped: s reads small, m attenuated."""
    degenerate: bool
    """s at a bound, an m at its bound, or the optimizer did not converge."""
    converged: bool
    """The optimizer of the point estimate converged."""
    level: float
    """The level of the percentile bootstrap CIs."""
    n_boot: int
    """Bootstrap resamples drawn (0: no CIs)."""
    n_boot_failed: int
    """Resamples whose refit did not converge, left out of the CIs."""
    seed: int
    """The seed of the item resamples."""

    @property
    def clip_limited(self) -> bool:
        """Absolute s (and m) are not interpretable; only rankings and within-model differences are."""
        return self.saturated or self.degenerate

    @classmethod
    def measure(
        cls,
        p: np.ndarray,
        x: np.ndarray,
        converged: bool,
        *,
        clip: float,
        level: float,
        n_boot: int,
        failed: int,
        seed: int,
    ) -> FitQuality:
        """The flags of a fit of the probabilities ``p`` at parameters ``x`` = (s, m_1..m_C)."""
        frac_sat = float(np.mean((p < clip) | (p > 1 - clip)))
        return cls(
            frac_saturated=frac_sat,
            saturated=frac_sat > 0.5,
            degenerate=(not converged) or at_bound(x),
            converged=converged,
            level=level,
            n_boot=n_boot,
            n_boot_failed=failed,
            seed=seed,
        )


def multistart(
    residuals: Any, jacobian: Any, starts: list[np.ndarray], lo: np.ndarray, hi: np.ndarray, args: tuple[Any, ...]
) -> tuple[np.ndarray, bool]:
    """The lowest-cost bounded ``least_squares`` (trf, tight tolerances) over the starting points (clipped into bounds)."""
    best = None
    for x0 in starts:
        r = least_squares(
            residuals,
            np.clip(x0, lo, hi),
            jac=jacobian,
            bounds=(lo, hi),
            args=args,
            method="trf",
            xtol=1e-12,
            ftol=1e-12,
            gtol=1e-12,
        )
        if best is None or r.cost < best.cost:
            best = r
    assert best is not None
    return best.x, bool(best.success)


def unidentified_reason(
    theta: np.ndarray, s_lo: float, s_hi: float, m_lo: Sequence[float], m_hi: Sequence[float]
) -> str:
    """Why the items cannot separate s from m ("" when they can): no spread of theta, or intervals at the bounds.

    Separate from ``clip_limited`` (a saturated or degenerate point estimate):
    a fit can converge inside the bounds and still rest on nothing but m/s.
    """
    why = []
    spread = float(np.ptp(theta)) if len(theta) else 0.0
    if spread < THETA_SPREAD_MIN:
        why.append(f"theta spans {spread:.3f} over the items (< {THETA_SPREAD_MIN:g}): only m/s is identified")
    if s_hi >= S_BOUNDS[1] * 0.99 or s_lo <= S_BOUNDS[0] * 1.01:
        why.append(f"the s interval reaches the optimizer's bound ({S_BOUNDS[0]:g}..{S_BOUNDS[1]:g})")
    if any(lo <= -M_BOUND * 0.99 or hi >= M_BOUND * 0.99 for lo, hi in zip(m_lo, m_hi, strict=True)):
        why.append(f"an m interval reaches the optimizer's bound (+/-{M_BOUND:g})")
    return "; ".join(why)


def at_bound(x: np.ndarray) -> bool:
    """s (``x[0]``) at a bound of :data:`~analysis.battery.fit.S_BOUNDS`, or an m (``x[1:]``) at +/- :data:`~analysis.battery.fit.M_BOUND`."""
    lo, hi = S_BOUNDS
    return bool(x[0] <= lo * 1.01 or x[0] >= hi * 0.99 or np.any(np.abs(x[1:]) >= M_BOUND * 0.99))


def goodness(p: np.ndarray, residuals: np.ndarray) -> tuple[float, float]:
    """(r2, rmse) of a fit of the probabilities ``p``: r2 = 1 - SS_res / SS_tot (NaN when p does not vary)."""
    ss_tot = float(np.sum((p - p.mean()) ** 2))
    ss_res = float(np.sum(residuals**2))
    return (1 - ss_res / ss_tot if ss_tot > 0 else float("nan")), float(np.sqrt(ss_res / p.size))


def bootstrap_refits(
    refit: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    n: int,
    n_par: int,
    *,
    n_boot: int,
    seed: int,
    level: float,
) -> tuple[np.ndarray, np.ndarray, int]:
    """(lo, hi, failed): percentile CIs of the ``n_par`` parameters over ``n_boot`` resamples of ``n`` items.

    ``refit`` takes the resampled positions (:func:`resample_index`) and
    returns (params per resample, converged); resamples that did not converge
    are counted in ``failed`` and left out. NaN CIs without resamples.
    """
    lo = hi = np.full(n_par, np.nan)
    failed = 0
    if n_boot:
        boots, ok = refit(resample_index(n, n_boot, seed))
        failed = int((~ok).sum())
        if ok.any():
            lo, hi = quantile_ci(boots[ok], level, axis=0)
    return lo, hi, failed
