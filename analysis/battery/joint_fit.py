"""The joint (s, m) fit of a label family: one s and one m per channel, on the cells themselves.

``P(CBR)[i, k] = sigmoid((theta_i + sum_c m_c sgn_ck) / s)``: :func:`joint_cells` builds the cell table of a
family (:class:`JointData`, the channels it identifies: :data:`JOINT_CHANNELS`), :func:`fit_joint_data`
fits it with a bootstrap over items (:func:`refit_joint_resamples`) into a :class:`JointFit`;
:func:`fit_joint` and :func:`fit_joints` fit a run's families and :func:`fit_pair` one label pair's
cells. Why the joint fit stands beside the per-channel one: :mod:`analysis.battery.fit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import expit

from analysis.battery.fit import (
    CLIP,
    IDENTIFYING_PAIRS,
    LEVEL,
    M_BOUND,
    M_STARTS,
    N_BOOT,
    S_BOUNDS,
    S_STARTS,
    SEED,
    SIDES,
    TIE,
    select_trials,
)
from analysis.battery.fit_solve import FitQuality, bootstrap_refits, goodness, multistart, unidentified_reason
from analysis.common.bootstrap import check_bootstrap
from probe.errors import NotComputed

# ------------------------------------------------------------ the joint fit
JOINT_CHANNELS: dict[str, tuple[str, ...]] = {"yesno": ("order", "lexical"), "arbitrary": ("order", "logic", "label")}
"""Label family -> the channels fitted together in it (a channel the design does not identify is left out)."""
JOINT_LABELS: dict[str, tuple[str, ...] | None] = {"yesno": None, "arbitrary": IDENTIFYING_PAIRS}
"""Label family -> the pairs its joint fit uses by default (the arbitrary family: A/B alone, as the paper)."""


@dataclass(frozen=True, eq=False)
class JointData:
    """The cell table of one label family as arrays: what :func:`fit_joint` and its bootstrap fit.

    ``p[i, k]`` is the mean P(CBR) over the trials of item ``items[i]`` in
    cell ``k`` (NaN where the item lacks that cell); ``x[k, c]`` is +1 when
    cell ``k`` lies on the p+ side of ``channels[c]``, else -1.
    """

    family: str
    channels: tuple[str, ...]
    excluded: tuple[tuple[str, str], ...]
    """(channel, why it is not in the fit): no variation in the family, or confounded with a fitted channel."""
    items: tuple[str, ...]
    theta: np.ndarray
    p: np.ndarray
    x: np.ndarray

    def subset(self, items: list[str] | tuple[str, ...]) -> JointData:
        """The same cells on ``items`` (in that order); every item must be in this table."""
        pos = {i: k for k, i in enumerate(self.items)}
        missing = [i for i in items if i not in pos]
        if missing:
            raise ValueError(f"items {missing[:5]} are not in the {self.family} cell table")
        k = np.array([pos[i] for i in items], dtype=int)
        return JointData(self.family, self.channels, self.excluded, tuple(items), self.theta[k], self.p[k], self.x)


def joint_cells(
    theta: pd.Series,
    binary: pd.DataFrame,
    family: str,
    *,
    labels: tuple[str, ...] | str | None = "default",
    replicate: int | None = 0,
    channels: tuple[str, ...] | None = None,
) -> JointData:
    """Per item and design cell of ``family``: the mean P(CBR) over the cell's trials, and each cell's channel signs.

    A cell is one combination of the side columns of the family's channels
    (:data:`JOINT_CHANNELS`, :data:`~analysis.battery.fit.SIDES`); forms and label pairs of the
    family are averaged within it. A channel whose side column never varies
    in the family, or moves in lockstep with (or against) the column of a
    channel already kept, is not identified: it is left out and named in
    ``excluded`` with the reason (with a fixed label-to-verdict mapping the
    label channel is part of logic, as in :func:`~analysis.battery.fit.channel_sides`). Items
    without theta are left out. ``labels`` restricts the family to these
    pairs (``default``: :data:`JOINT_LABELS`, A/B alone for the arbitrary
    family; None: every pair).
    """
    if family not in JOINT_CHANNELS and channels is None:
        raise ValueError(
            f"unknown label family {family!r} for the joint fit; choose from {sorted(JOINT_CHANNELS)} "
            "or name the channels"
        )
    if isinstance(labels, str) and labels != "default":
        raise ValueError(f"labels must be 'default', None or a tuple of label pairs, got {labels!r}")
    pairs = JOINT_LABELS.get(family) if labels == "default" else labels
    fitted = JOINT_CHANNELS[family] if channels is None else channels
    df = select_trials(binary, family, pairs, replicate)
    if df.empty:
        raise NotComputed(f"no binary trials in label family {family!r} (pairs {pairs}, replicate {replicate})")
    kept: list[str] = []
    excluded: list[tuple[str, str]] = []
    for ch in fitted:
        col = df[SIDES[ch]]
        if col.nunique() < 2:
            excluded.append((ch, f"no variation: {SIDES[ch]} is {bool(col.iloc[0])} in every {family} trial"))
            continue
        twin = next((k for k in kept if col.eq(df[SIDES[k]]).all() or col.ne(df[SIDES[k]]).all()), None)
        if twin is not None:
            why = f"confounded with {twin}: {SIDES[ch]} moves in lockstep with {SIDES[twin]}"
            if ch == "label":
                why += " (the label-to-verdict mapping is not counterbalanced)"
            excluded.append((ch, why))
            continue
        kept.append(ch)
    if not kept:
        raise NotComputed(f"label family {family!r}: no channel varies in these trials; {dict(excluded)}")
    cols = [SIDES[ch] for ch in kept]
    th = theta.dropna()
    df = df[df["item_id"].isin(th.index)]
    if df.empty:
        raise NotComputed(f"label family {family!r}: no item has both theta and binary trials")
    wide = df.groupby(["item_id", *cols], sort=True)["p_cbr"].mean().unstack(cols).dropna(how="all")
    cells = list(wide.columns)
    x = np.array([[1.0 if v else -1.0 for v in (c if isinstance(c, tuple) else (c,))] for c in cells])
    rank = int(np.linalg.matrix_rank(x))
    if rank < len(kept):  # cannot happen after the pairwise checks with <= 3 two-level columns; kept as a guard
        raise NotComputed(f"label family {family!r}: the cells do not identify channels {kept} separately")
    items = tuple(str(i) for i in wide.index)
    return JointData(
        family=family,
        channels=tuple(kept),
        excluded=tuple(excluded),
        items=items,
        theta=th.reindex(list(wide.index)).to_numpy(float),
        p=wide.to_numpy(float),
        x=x,
    )


@dataclass(frozen=True)
class JointFit:
    """One s and one m per channel of a label family, fitted on all cells of all items at once."""

    family: str
    channels: tuple[str, ...]
    """The channels fitted (those of :data:`JOINT_CHANNELS` the design identifies), in the order of ``m``."""
    s: float
    """Decisiveness, one for every channel of the family."""
    s_lo: float
    s_hi: float
    """The bootstrap CI of s (NaN without resamples); likewise ``m_lo``, ``m_hi`` per channel."""
    m: tuple[float, ...]
    """Per channel of ``channels``, adjusted for the others."""
    m_lo: tuple[float, ...]
    m_hi: tuple[float, ...]
    r2: float
    """1 - SS_res / SS_tot over all fitted cells."""
    rmse: float
    """Root mean squared residual over all fitted cells."""
    n_items: int
    """Items with theta and at least one usable cell, the units of the bootstrap."""
    n_cells: int
    """Fitted (item, cell) values."""
    n_near_tie: int
    """Items with every cell usable and |z| < ``tie``, z = mean of 2 P(CBR) - 1 over the item's cells (a story
    with an empty cell has no balanced z and is not counted)."""
    tie: float
    quality: FitQuality
    """Saturation, bounds, convergence and bootstrap of the fit (the same rules as the per-channel fit)."""
    excluded: tuple[tuple[str, str], ...] = ()
    """Channels of the family the design does not identify, with the reason."""
    unidentified: str = ""
    """Why the items cannot separate s from the m's (:func:`~analysis.battery.fit_solve.unidentified_reason`); "" when they can."""

    @property
    def clip_limited(self) -> bool:
        """Absolute s (and m) are not interpretable; only rankings and within-model differences are."""
        return self.quality.clip_limited

    def rows(self) -> list[dict[str, Any]]:
        """One row per channel of the family (left-out channels with NaN numbers and the reason in ``note``)."""
        common = {
            "family": self.family,
            "channel": "",
            "s": self.s,
            "s_lo": self.s_lo,
            "s_hi": self.s_hi,
            "r2": self.r2,
            "rmse": self.rmse,
            "n_items": self.n_items,
            "n_cells": self.n_cells,
            "n_near_tie": self.n_near_tie,
            "frac_saturated": self.quality.frac_saturated,
            "clip_limited": self.clip_limited,
            "unidentified": self.unidentified,
            "converged": self.quality.converged,
            "n_boot": self.quality.n_boot,
            "n_boot_failed": self.quality.n_boot_failed,
            "seed": self.quality.seed,
        }
        out = [
            {**common, "channel": ch, "m": m, "m_lo": lo, "m_hi": hi, "note": ""}
            for ch, m, lo, hi in zip(self.channels, self.m, self.m_lo, self.m_hi, strict=True)
        ]
        nan = float("nan")
        for ch, why in self.excluded:
            out.append({**common, "channel": ch, "m": nan, "m_lo": nan, "m_hi": nan, "note": f"not fitted: {why}"})
        order = {ch: k for k, ch in enumerate(JOINT_CHANNELS.get(self.family, ()))}
        return sorted(out, key=lambda r: order.get(r["channel"], len(order)))


def _joint_residuals(x: np.ndarray, th: np.ndarray, p: np.ndarray, sg: np.ndarray, ok: np.ndarray) -> np.ndarray:
    u = (th[:, None] + (sg @ x[1:])[None, :]) / x[0]
    out: np.ndarray = (expit(u) - p)[ok]
    return out


def _joint_jacobian(x: np.ndarray, th: np.ndarray, p: np.ndarray, sg: np.ndarray, ok: np.ndarray) -> np.ndarray:
    s = x[0]
    u = (th[:, None] + (sg @ x[1:])[None, :]) / s
    g = expit(u)
    d = g * (1 - g)
    cols = [(-d * u / s)[ok]] + [(d * sg[None, :, c] / s)[ok] for c in range(sg.shape[1])]
    return np.column_stack(cols)


def _joint_bounds(n_ch: int) -> tuple[np.ndarray, np.ndarray]:
    return np.array([S_BOUNDS[0], *[-M_BOUND] * n_ch]), np.array([S_BOUNDS[1], *[M_BOUND] * n_ch])


def _joint_solve(th: np.ndarray, p: np.ndarray, sg: np.ndarray, starts: list[np.ndarray]) -> tuple[np.ndarray, bool]:
    lo, hi = _joint_bounds(sg.shape[1])
    return multistart(_joint_residuals, _joint_jacobian, starts, lo, hi, (th, p, sg, np.isfinite(p)))


def _joint_lm_batch(
    th: np.ndarray, p: np.ndarray, sg: np.ndarray, x0: np.ndarray, iters: int = 100
) -> tuple[np.ndarray, np.ndarray]:
    """Levenberg-Marquardt on many resamples at once: ``th`` (B, n), ``p`` (B, n, K) with NaN for absent cells.

    The same damping and stopping rules as :func:`~analysis.battery.channel_fit._lm_batch`, with the (1 + C)
    x (1 + C) normal equations of (s, m_1..m_C) solved for all rows at once.
    Returns (params (B, 1 + C), converged).
    """
    b, n_par = th.shape[0], 1 + sg.shape[1]
    w = np.isfinite(p).astype(float)
    pz = np.where(w > 0, p, 0.0)
    lo, hi = _joint_bounds(sg.shape[1])
    x = np.tile(np.asarray(x0, float), (b, 1))
    lam = np.full(b, 1e-3)
    done = np.zeros(b, dtype=bool)

    def parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        u = (th[:, :, None] + (x[:, 1:] @ sg.T)[:, None, :]) / x[:, 0, None, None]
        return u, expit(u)

    def cost(x: np.ndarray) -> np.ndarray:
        out: np.ndarray = (w * (parts(x)[1] - pz) ** 2).sum(axis=(1, 2))
        return out

    c = cost(x)
    eye = np.eye(n_par)
    for _ in range(iters):
        u, g = parts(x)
        d = w * g * (1 - g)
        s = x[:, 0, None, None]
        r = g - pz
        jac = np.concatenate([(-d * u / s)[..., None], d[..., None] * sg[None, None, :, :] / s[..., None]], axis=-1)
        jf = jac.reshape(b, -1, n_par)
        a = np.einsum("bip,biq->bpq", jf, jf)
        grad = np.einsum("bip,bi->bp", jf, (w * r).reshape(b, -1))
        damped = a + lam[:, None, None] * a * eye + 1e-300 * eye
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            try:
                step = -np.linalg.solve(damped, grad[..., None])[..., 0]
            except np.linalg.LinAlgError:
                step = np.full_like(x, np.nan)
        ok_step = np.isfinite(step).all(axis=1) & ~done
        x_new = np.clip(x + np.where(ok_step[:, None], step, 0), lo, hi)
        c_new = cost(x_new)
        better = ok_step & (c_new <= c)
        small = better & (np.abs(x_new - x) <= 1e-10 * (1 + np.abs(x))).all(axis=1)
        x, c = np.where(better[:, None], x_new, x), np.where(better, c_new, c)
        diag = np.einsum("bpp->bp", a)
        grad_small = np.abs(grad).max(axis=1) <= 1e-10 * (1 + np.sqrt(diag.sum(axis=1) * c))
        lam = np.where(done, lam, np.where(better, lam / 10, lam * 10))
        done |= small | grad_small
        if (done | (lam > 1e12)).all():
            break
    return x, done


def refit_joint_resamples(data: JointData, idx: np.ndarray, x0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(s, m_1..m_C) refitted on every resample (row ``k`` of ``idx`` holds item positions), started at ``x0``.

    Batched Levenberg-Marquardt, ``least_squares`` for the rare resample it
    does not settle. Refitting two runs on the same ``idx`` gives paired
    bootstrap differences.
    """
    boots, ok = _joint_lm_batch(data.theta[idx], data.p[idx], data.x, x0)
    for k in np.flatnonzero(~ok):
        boots[k], ok[k] = _joint_solve(data.theta[idx[k]], data.p[idx[k]], data.x, [np.asarray(x0, float)])
    return boots, ok


def fit_joint_data(
    data: JointData,
    *,
    n_boot: int = N_BOOT,
    seed: int = SEED,
) -> JointFit:
    """Fit P(CBR)[i, k] = sigmoid((theta_i + sum_c m_c x[k, c]) / s) to every cell of every item (least squares).

    Percentile bootstrap over items with a fixed seed, each resample refitted
    from the point estimate (see :func:`refit_joint_resamples`); resamples
    that do not converge are counted in ``n_boot_failed`` and left out.
    """
    check_bootstrap(LEVEL, n_boot)
    n, n_ch = len(data.items), len(data.channels)
    if n < 3:
        raise NotComputed(f"the joint fit of family {data.family!r} needs at least 3 items with theta, got {n}")
    th, p, sg = data.theta, data.p, data.x
    ok = np.isfinite(p)
    starts = [np.array([s0, *[m0] * n_ch]) for s0 in S_STARTS for m0 in M_STARTS]
    x, conv = _joint_solve(th, p, sg, starts)
    stacked = p[ok]
    r2, rmse = goodness(stacked, _joint_residuals(x, th, p, sg, ok))
    # z of a story with an empty cell would be an unbalanced mean (its stance leaks the missing cell's
    # offsets), so only the stories with every cell count toward the items near the tie (issue 27)
    complete = ok.all(axis=1)
    z = (2 * p[complete] - 1).mean(axis=1)
    lo, hi, failed = bootstrap_refits(
        lambda idx: refit_joint_resamples(data, idx, x), n, 1 + n_ch, n_boot=n_boot, seed=seed, level=LEVEL
    )
    return JointFit(
        family=data.family,
        channels=data.channels,
        s=float(x[0]),
        s_lo=float(lo[0]),
        s_hi=float(hi[0]),
        m=tuple(float(v) for v in x[1:]),
        m_lo=tuple(float(v) for v in lo[1:]),
        m_hi=tuple(float(v) for v in hi[1:]),
        r2=r2,
        rmse=rmse,
        n_items=n,
        n_cells=int(stacked.size),
        n_near_tie=int(np.sum(np.abs(z) < TIE)),
        tie=TIE,
        quality=FitQuality.measure(stacked, x, conv, clip=CLIP, level=LEVEL, n_boot=n_boot, failed=failed, seed=seed),
        excluded=data.excluded,
        unidentified=unidentified_reason(th, float(lo[0]), float(hi[0]), lo[1:].tolist(), hi[1:].tolist()),
    )


def fit_joint(
    theta: pd.Series,
    binary: pd.DataFrame,
    family: str,
    *,
    labels: tuple[str, ...] | str | None = "default",
    n_boot: int = N_BOOT,
    seed: int = SEED,
) -> JointFit:
    """The joint fit of one label family: :func:`joint_cells` then :func:`fit_joint_data` (with ``n_boot`` and ``seed``).

    Unlike :func:`~analysis.battery.channel_fit.fit_channel`, whose sides each average over the other
    channels' offsets (the paper's estimand, a family-aggregate s), this fits
    one s and one m per channel on the cells themselves, so each m is
    adjusted for the others and s is not flattened by them. A cell with no
    usable answer (every draw refused) is simply absent from the fit.
    """
    return fit_joint_data(joint_cells(theta, binary, family, labels=labels), n_boot=n_boot, seed=seed)


PAIR_CHANNELS = ("order", "logic", "label")


def fit_pair(theta: pd.Series, binary: pd.DataFrame, pair: str, *, n_boot: int = N_BOOT, seed: int = SEED) -> JointFit:
    """The joint fit (order, logic, label) on one label pair's cells: its label pull in theta units.

    The per-pair counterpart of Fig. 6's label pull: ``m`` of the label
    channel is the offset toward the pair's nominal yes label, adjusted for
    order and verdict. A pair whose mapping is not counterbalanced has its
    label channel left out (named in ``excluded``). ``n_boot`` and ``seed``
    go to :func:`fit_joint_data`.
    """
    df = binary[binary["labels"] == pair]
    if df.empty:
        raise NotComputed(f"label pair {pair!r} is not in these binary trials; pairs: {sorted(set(binary['labels']))}")
    family = str(df["family"].iloc[0])
    return fit_joint_data(joint_cells(theta, df, family, labels=None, channels=PAIR_CHANNELS), n_boot=n_boot, seed=seed)


def fit_joints(
    theta: pd.Series,
    binary: pd.DataFrame,
    families: tuple[str, ...] = ("yesno", "arbitrary"),
    *,
    n_boot: int = N_BOOT,
    seed: int = SEED,
) -> pd.DataFrame:
    """The joint fit of every family present in ``binary``; one row per (family, channel) (:meth:`JointFit.rows`).

    A family the design cannot fit (fewer than 3 items, no channel that
    varies) gets one row with an empty channel and the reason in ``note``.
    """
    rows: list[dict[str, Any]] = []
    for fam in families:
        if not (binary["family"] == fam).any():
            continue
        try:
            rows += fit_joint(theta, binary, fam, n_boot=n_boot, seed=seed).rows()
        except NotComputed as e:  # a family the design cannot fit says why; the others are still fitted
            rows.append({"family": fam, "channel": "", "note": f"not fitted: {e}"})
    return pd.DataFrame(rows)
