"""The (s, m) fit of one bias channel on its two sides (paper 003, "The two-parameter fit").

:func:`fit_channel` fits p+ = sigmoid((theta + m) / s), p- = sigmoid((theta - m) / s) to the sides of
:func:`analysis.battery.fit.channel_sides` by bounded least squares, with a batched Levenberg-Marquardt
bootstrap over items (:func:`refit_resamples`); :func:`fit_each_channel` fits every channel of a run and
says why a channel is not fitted (:class:`Unfitted`, :func:`unfitted_reason`). The model and its settings
are described in :mod:`analysis.battery.fit`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from scipy.special import expit

from analysis.battery.fit import (
    CLIP,
    FAMILY,
    LABELS,
    LEVEL,
    M_BOUND,
    M_STARTS,
    N_BOOT,
    S_BOUNDS,
    S_STARTS,
    SEED,
    TIE,
    Selection,
    channel_sides,
    channel_trials,
)
from analysis.battery.fit_solve import FitQuality, bootstrap_refits, goodness, multistart, unidentified_reason
from analysis.common.bootstrap import check_bootstrap
from probe.errors import NotComputed

if TYPE_CHECKING:
    from typing_extensions import Unpack


@dataclass(frozen=True)
class ChannelFit:
    """The (s, m) fit of one bias channel, with percentile bootstrap CIs over items and quality flags."""

    channel: str
    s: float
    """Decisiveness: the scale of the sigmoid on the theta axis (small s: sharp answers)."""
    m: float
    """Framing susceptibility: the channel's offset on the theta axis (positive: toward the p+ side)."""
    s_lo: float
    s_hi: float
    """The bootstrap CI of s (NaN without resamples); likewise ``m_lo``, ``m_hi`` of m."""
    m_lo: float
    m_hi: float
    r2: float
    """1 - SS_res / SS_tot on the stacked p+ and p- of all items."""
    rmse: float
    """Root mean squared residual of the stacked p+ and p-."""
    n_items: int
    """Items with theta and both sides, the units of the bootstrap."""
    n_near_tie: int
    """Items with |z| < ``tie`` (the story stance near the tie: where m is identified)."""
    tie: float
    quality: FitQuality
    """Saturation, bounds, convergence and bootstrap of the fit (one column each in the row of :meth:`to_dict`)."""
    unidentified: str = ""
    """Why the items cannot separate s from m (:func:`~analysis.battery.fit_solve.unidentified_reason`); "" when they can."""

    @property
    def clip_limited(self) -> bool:
        """Absolute s (and m) are not interpretable; only rankings and within-model differences are."""
        return self.quality.clip_limited

    def to_dict(self) -> dict[str, Any]:
        """One flat row of ``fit_sm.csv``: the fields in order, the quality flags in place of ``quality``."""
        row: dict[str, Any] = {}
        for k, v in asdict(self).items():
            row.update(v if k == "quality" else {k: v})
        return {**row, "clip_limited": self.clip_limited}


def predict(theta: np.ndarray, s: float, m: float) -> tuple[np.ndarray, np.ndarray]:
    """(p+, p-) of the model at the given stances."""
    return expit((theta + m) / s), expit((theta - m) / s)


def _residuals(x: np.ndarray, th: np.ndarray, pp: np.ndarray, pm: np.ndarray) -> np.ndarray:
    s, m = x
    return np.concatenate([expit((th + m) / s) - pp, expit((th - m) / s) - pm])


def _jacobian(x: np.ndarray, th: np.ndarray, pp: np.ndarray, pm: np.ndarray) -> np.ndarray:
    s, m = x
    up, um = (th + m) / s, (th - m) / s
    gp, gm = expit(up), expit(um)
    dp, dm = gp * (1 - gp), gm * (1 - gm)
    ds = np.concatenate([-dp * up / s, -dm * um / s])
    dmm = np.concatenate([dp / s, -dm / s])
    return np.column_stack([ds, dmm])


def _solve(
    th: np.ndarray, pp: np.ndarray, pm: np.ndarray, starts: list[tuple[float, float]]
) -> tuple[np.ndarray, bool]:
    lo, hi = np.array([S_BOUNDS[0], -M_BOUND]), np.array([S_BOUNDS[1], M_BOUND])
    return multistart(_residuals, _jacobian, [np.asarray(x0, dtype=float) for x0 in starts], lo, hi, (th, pp, pm))


def refit_resamples(
    th: np.ndarray, pp: np.ndarray, pm: np.ndarray, idx: np.ndarray, x0: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray]:
    """(s, m) refitted on every resample (row ``k`` of ``idx`` holds item indices), started at ``x0``.

    Batched Levenberg-Marquardt, with ``least_squares`` for the rare resample it
    does not settle. Returns (params of shape (n_boot, 2), converged). Refitting
    two runs on the same ``idx`` gives paired bootstrap differences.
    """
    boots, ok = _lm_batch(th[idx], pp[idx], pm[idx], x0)
    for k in np.flatnonzero(~ok):
        boots[k], ok[k] = _solve(th[idx[k]], pp[idx[k]], pm[idx[k]], [x0])
    return boots, ok


def _lm_batch(
    th: np.ndarray, pp: np.ndarray, pm: np.ndarray, x0: tuple[float, float], iters: int = 100
) -> tuple[np.ndarray, np.ndarray]:
    """Levenberg-Marquardt on many resamples at once (rows of ``th``, ``pp``, ``pm``), all from ``x0``.

    The bootstrap refits thousands of two-parameter problems that start next to
    their optimum; solving the 2 x 2 damped normal equations for all rows in
    numpy is ~100x faster than one ``least_squares`` call per row. Returns
    (params, converged); rows that do not converge here are refitted by
    :func:`_solve` (``least_squares``) by the caller.
    """
    b = th.shape[0]
    s = np.full(b, x0[0])
    m = np.full(b, x0[1])
    lam = np.full(b, 1e-3)
    done = np.zeros(b, dtype=bool)

    def cost(s: np.ndarray, m: np.ndarray) -> np.ndarray:
        rp = expit((th + m[:, None]) / s[:, None]) - pp
        rm = expit((th - m[:, None]) / s[:, None]) - pm
        out: np.ndarray = (rp**2).sum(axis=1) + (rm**2).sum(axis=1)
        return out

    c = cost(s, m)
    for _ in range(iters):
        up, um = (th + m[:, None]) / s[:, None], (th - m[:, None]) / s[:, None]
        gp, gm = expit(up), expit(um)
        dp, dm = gp * (1 - gp), gm * (1 - gm)
        rp, rm = gp - pp, gm - pm
        js_p, js_m = -dp * up / s[:, None], -dm * um / s[:, None]
        jm_p, jm_m = dp / s[:, None], -dm / s[:, None]
        a11 = (js_p**2).sum(1) + (js_m**2).sum(1)
        a22 = (jm_p**2).sum(1) + (jm_m**2).sum(1)
        a12 = (js_p * jm_p).sum(1) + (js_m * jm_m).sum(1)
        g1 = (js_p * rp).sum(1) + (js_m * rm).sum(1)
        g2 = (jm_p * rp).sum(1) + (jm_m * rm).sum(1)
        d11, d22 = a11 * (1 + lam), a22 * (1 + lam)
        det = d11 * d22 - a12**2
        with np.errstate(divide="ignore", invalid="ignore"):
            ds = -(d22 * g1 - a12 * g2) / det
            dmm = -(d11 * g2 - a12 * g1) / det
        ok_step = np.isfinite(ds) & np.isfinite(dmm) & ~done
        s_new = np.clip(s + np.where(ok_step, ds, 0), *S_BOUNDS)
        m_new = np.clip(m + np.where(ok_step, dmm, 0), -M_BOUND, M_BOUND)
        c_new = cost(s_new, m_new)
        better = ok_step & (c_new <= c)
        small = better & (np.abs(s_new - s) <= 1e-10 * (1 + s)) & (np.abs(m_new - m) <= 1e-10 * (1 + np.abs(m)))
        s, m, c = np.where(better, s_new, s), np.where(better, m_new, m), np.where(better, c_new, c)
        grad_small = np.maximum(np.abs(g1), np.abs(g2)) <= 1e-10 * (1 + np.sqrt((a11 + a22) * c))
        lam = np.where(done, lam, np.where(better, lam / 10, lam * 10))
        done |= small | grad_small
        stuck = ~done & (lam > 1e12)  # no descent found: left to least_squares
        if (done | stuck).all():
            break
    return np.column_stack([s, m]), done


def fit_channel(
    theta: pd.Series,
    sides: pd.DataFrame,
    *,
    channel: str = "",
    n_boot: int = N_BOOT,
    seed: int = SEED,
) -> ChannelFit:
    """Fit (s, m) jointly to both sides of a channel; percentile bootstrap over items with a fixed seed.

    ``theta`` is the per-item I-1 stance, ``sides`` the table of
    :func:`~analysis.battery.fit.channel_sides` (items are matched on the index; items missing from
    either are left out). Each bootstrap resample redraws items with
    replacement and refits from the point estimate (all resamples at once by
    a batched Levenberg-Marquardt, the unsettled ones by ``least_squares``);
    resamples whose fit does not converge are counted in ``n_boot_failed``
    and left out of the CI.
    """
    check_bootstrap(LEVEL, n_boot)
    df = pd.concat([theta.rename("theta"), sides[["p_plus", "p_minus", "z"]]], axis=1, join="inner").dropna()
    n = len(df)
    if n < 3:
        raise NotComputed(f"the (s, m) fit needs at least 3 items with theta and both sides, got {n}")
    th = df["theta"].to_numpy(float)
    pp = df["p_plus"].to_numpy(float)
    pm = df["p_minus"].to_numpy(float)
    starts = [(s0, m0) for s0 in S_STARTS for m0 in M_STARTS]
    x, ok = _solve(th, pp, pm, starts)
    s, m = float(x[0]), float(x[1])
    stacked = np.concatenate([pp, pm])
    r2, rmse = goodness(stacked, _residuals(x, th, pp, pm))
    lo, hi, failed = bootstrap_refits(
        lambda idx: refit_resamples(th, pp, pm, idx, (s, m)), n, 2, n_boot=n_boot, seed=seed, level=LEVEL
    )
    return ChannelFit(
        channel=channel,
        s=s,
        m=m,
        s_lo=float(lo[0]),
        s_hi=float(hi[0]),
        m_lo=float(lo[1]),
        m_hi=float(hi[1]),
        r2=r2,
        rmse=rmse,
        n_items=n,
        n_near_tie=int(np.sum(np.abs(df["z"].to_numpy(float)) < TIE)),
        tie=TIE,
        quality=FitQuality.measure(stacked, x, ok, clip=CLIP, level=LEVEL, n_boot=n_boot, failed=failed, seed=seed),
        unidentified=unidentified_reason(th, float(lo[0]), float(hi[0]), [float(lo[1])], [float(hi[1])]),
    )


@dataclass(frozen=True)
class Unfitted:
    """A channel :func:`fit_each_channel` could not fit, and why (one line in the report)."""

    channel: str
    why: str


def empty_cell_counts(binary: pd.DataFrame, channel: str, **select: Unpack[Selection]) -> dict[str, int]:
    """Per design cell of ``channel`` (``verb=..., order=..., mapping=...``): how many stories have it empty.

    Named by the trial factors rather than the side columns, so the line reads as the design was asked.
    """
    df = channel_trials(binary, channel, **select)
    cols = [c for c in ("verb", "order", "mapping") if c in df.columns and df[c].nunique() > 1]
    g = df.groupby(["item_id", *cols], sort=True)["p_cbr"].count()
    out: dict[str, int] = {}
    for key in g.index[g.to_numpy() == 0]:
        levels = key[1:] if isinstance(key, tuple) else ()
        cell = ", ".join(f"{c}={v}" for c, v in zip(cols, levels, strict=True))
        out[cell] = out.get(cell, 0) + 1
    return out


def unfitted_reason(theta: pd.Series, binary: pd.DataFrame, channel: str, error: str) -> str:
    """One line on why ``channel`` could not be fitted: its complete stories and the cells the others miss."""
    try:
        sides = channel_sides(binary, channel)
    except NotComputed:
        return error
    n_all = channel_trials(binary, channel)["item_id"].nunique()
    n_complete = len(sides)
    n_theta = int(sides.index.isin(theta.dropna().index).sum())
    holes = empty_cell_counts(binary, channel)
    ranked = sorted(holes.items(), key=lambda kv: -kv[1])
    where = "; ".join(f"{cell} empty in {n}" for cell, n in ranked[:4])
    if len(ranked) > 4:
        where += f"; {len(ranked) - 4} more cells empty in some story"
    return f"{n_complete} of {n_all} stories have every cell usable ({n_theta} with theta; the fit needs 3)" + (
        f"; {where}" if where else ""
    )


def fit_each_channel(
    theta: pd.Series,
    binary: pd.DataFrame,
    channels: tuple[str, ...] = ("order", "lexical", "logic", "label"),
    *,
    n_boot: int = N_BOOT,
    seed: int = SEED,
) -> tuple[pd.DataFrame, tuple[Unfitted, ...]]:
    """Fit every channel present in ``binary`` on its own complete stories; one row per fitted channel.

    A channel whose default selection (:data:`~analysis.battery.fit.FAMILY`, :data:`~analysis.battery.fit.LABELS`) has no
    trial is skipped (logic and label need A/B in the run). A channel that
    cannot be fitted (fewer than 3 complete stories with theta, an unbalanced
    or confounded design) is returned in the second element with the reason;
    the other channels are still fitted (issue 27: one channel never hides
    the others).
    """
    rows, unfitted = [], []
    for ch in channels:
        fam, pairs = FAMILY[ch], LABELS[ch]
        chosen = binary["family"].eq(fam) if fam is not None else pd.Series(True, index=binary.index)
        if pairs is not None:
            chosen &= binary["labels"].isin(pairs)
        if not chosen.any():
            continue
        try:
            rows.append(fit_channel(theta, channel_sides(binary, ch), channel=ch, n_boot=n_boot, seed=seed).to_dict())
        except NotComputed as e:
            unfitted.append(Unfitted(ch, unfitted_reason(theta, binary, ch, str(e))))
    return pd.DataFrame(rows), tuple(unfitted)
