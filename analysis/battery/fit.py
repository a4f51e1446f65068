"""The two-parameter fit (s, m) per bias channel (paper 003, "The two-parameter fit").

Each bias channel splits the forced-binary cells of an item into two balanced
sides: ``p+`` = mean P(CBR) over the cells where the channel pulls toward the
CBR option, ``p-`` = mean P(CBR) where it pulls away. Then
``b = p+ - p-`` is the channel's bias and ``(p+ + p-) / 2`` the shared mean
P(CBR), and the model

    p+ = sigmoid((theta + m) / s),   p- = sigmoid((theta - m) / s)

is fitted to both sides of all items jointly by nonlinear least squares, with
theta from the graded instrument (I-1), so the biased format never measures
the stance it is biased about. ``m`` is the framing susceptibility (the
channel's horizontal offset on the theta axis), ``s`` the decisiveness.

The sides are defined from what each CBR option *is* in a trial (trial
contract in ``docs/battery-analysis.md``):

==========  ==================  =========================================
channel     side column         p+ cells
==========  ==================  =========================================
order       ``cbr_first``       the CBR option is printed first
lexical     ``cbr_affirmative`` the CBR option is the affirmative answer
            (Yes/No family)     (approve cells; yes-pull m > 0)
logic       ``cbr_affirmative`` the same split on arbitrary labels (A/B, 1/2):
                                attachment to the verdict, not the word
label       ``cbr_canonical``   the CBR option is the pair's canonical first
                                label (A, 1), counterbalanced mapping only
==========  ==================  =========================================

With the yes/no words, order + lexical = apparent (Eq. 1) exactly.

Beside it, :func:`fit_joint` fits one s and one m per channel of a label
family on the cells themselves, ``P(CBR)[i, k] = sigmoid((theta_i + sum_c m_c
sgn_ck) / s)``. The per-channel fit stays the paper's estimand, but each of its
sides averages over the other channels' offsets, and a mean of shifted
sigmoids is flatter than one sigmoid: its s reads high when another channel
has an offset. The joint s does not, and its m's are adjusted for each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.special import expit

from analysis.battery.yesno import Dropped, empty_cells, p_cbr
from analysis.common.bootstrap import check_bootstrap, quantile_ci, resample_index
from probe.errors import NotComputed

if TYPE_CHECKING:
    from typing_extensions import Unpack

SIDES: dict[str, str] = {
    "order": "cbr_first",
    "lexical": "cbr_affirmative",
    "logic": "cbr_affirmative",
    "label": "cbr_canonical",
}
"""Channel -> the boolean trial column that puts a cell on the p+ side."""
FAMILY: dict[str, str | None] = {"order": "yesno", "lexical": "yesno", "logic": "arbitrary", "label": "arbitrary"}
"""The label family each channel is measured in by default (order and lexical: the verb-flip Yes/No family)."""
IDENTIFYING_PAIRS: tuple[str, ...] = ("A/B",)
"""The label pairs the logic and label channels are measured on by default: the paper rests identification
on the fully arbitrary A/B alone ("The identification claim rests on the fully arbitrary family"); the
other arbitrary pairs (1/2, $/%, the valenced +/-) are reported per pair by :mod:`analysis.battery.binary`."""
LABELS: dict[str, tuple[str, ...] | None] = {
    "order": None,
    "lexical": None,
    "logic": IDENTIFYING_PAIRS,
    "label": IDENTIFYING_PAIRS,
}
"""Channel -> the label pairs of its default selection (None: every pair of the family)."""
CELL = ("cbr_first", "cbr_affirmative", "cbr_canonical")

S_BOUNDS = (1e-3, 10.0)
M_BOUND = 4.0
"""|m| is bounded at 4 (four times the whole theta axis; a fit there is degenerate)."""
THETA_SPREAD_MIN = 0.1
"""Range of theta over items (on its -1..1 scale) below which s and m cannot be told apart: with every item at the
same stance, p+ = sigmoid((theta + m)/s) and p- fix only (theta +/- m)/s, one ratio for two unknowns."""

N_BOOT = 2000
"""Bootstrap resamples over items of both fits (:func:`fit_channel`, :func:`fit_joint_data`), and of every CI of the
battery report and the battery comparison (one place for them)."""
SEED = 0
"""The seed of those bootstraps."""
LEVEL = 0.95
"""The level of their percentile CIs."""
TIE = 0.9
"""An item is near the tie when its story stance has |z| below this (where m is identified)."""
CLIP = 0.02
"""A fitted P within this of 0 or 1 counts as saturated (:attr:`FitQuality.frac_saturated`)."""
S_STARTS = (0.1, 0.3, 1.0)
M_STARTS = (-0.2, 0.0, 0.2)
"""Start values of both least-squares fits: every (s, m) of this grid (m the same for every channel of a joint fit)."""


# --------------------------------------------------------------- the cells
def binary_trials(options: pd.DataFrame, per_trial: pd.DataFrame) -> pd.DataFrame:
    """Per forced-binary trial: P(CBR) and what the CBR option is (printed first, affirmative, canonical label).

    Works on battery runs (``instrument == "binary"`` with ``family``,
    ``yes_label``, ``mapping``) and on plain yes/no runs (no instrument
    factor: family ``yesno``, ``yes_label`` = the first label of ``labels``,
    canonical mapping). ``options`` needs ``trial_id, option, position,
    meaning, prob``.
    """
    meta = per_trial
    if "instrument" in meta.columns:
        meta = meta[meta["instrument"].isna() | (meta["instrument"] == "binary")]
    meta = meta.copy()
    if meta.empty:
        raise NotComputed("no forced-binary trials in the run; run the battery's binary instrument or yesno")
    if "labels" not in meta.columns:
        raise NotComputed("binary trials lack the 'labels' factor (e.g. Yes/No); the trial contract requires it")
    first_label = meta["labels"].astype(str).str.split("/").str[0]
    meta["yes_label"] = meta["yes_label"].fillna(first_label) if "yes_label" in meta.columns else first_label
    meta["family"] = meta["family"].fillna("yesno") if "family" in meta.columns else "yesno"
    meta["mapping"] = meta["mapping"].fillna("canonical") if "mapping" in meta.columns else "canonical"
    opts = options[options["trial_id"].isin(meta["trial_id"])]
    cbr = opts[opts["meaning"] == "cbr"]
    counts = cbr.groupby("trial_id").size().reindex(meta["trial_id"], fill_value=0)
    bad = counts.index[counts != 1].tolist()
    if bad:
        raise NotComputed(
            f"binary trials need exactly one 'cbr' option; trials {bad[:5]} have {counts[bad[:5]].tolist()}"
        )
    cbr = cbr.set_index("trial_id")
    out = meta[["trial_id", "item_id", "replicate", "family", "labels", "yes_label", "mapping"]].copy()
    for col in ("form", "verb", "order"):
        out[col] = meta[col] if col in meta.columns else ""
    out["p_cbr"] = out["trial_id"].map(p_cbr(opts))
    cbr_option = out["trial_id"].map(cbr["option"])
    out["cbr_first"] = out["trial_id"].map(cbr["option_index"]).eq(0)
    out["cbr_affirmative"] = cbr_option.eq(out["yes_label"])
    out["cbr_canonical"] = out["cbr_affirmative"].eq(out["mapping"].ne("swapped"))
    return out.reset_index(drop=True)


def select_trials(
    binary: pd.DataFrame, family: str | None, pairs: Sequence[str] | None, replicate: int | None
) -> pd.DataFrame:
    """The binary trials of one label family, label pairs and replicate; None leaves that filter out.

    The per-channel and the joint fits select their trials the same way, so
    that a channel's two estimates rest on the same trials.
    """
    df = binary
    if family is not None:
        df = df[df["family"] == family]
    if pairs is not None:
        df = df[df["labels"].isin(pairs)]
    if replicate is not None:
        df = df[df["replicate"] == replicate]
    return df


class Selection(TypedDict, total=False):
    """The selection keywords of :func:`channel_trials`, which the functions built on it pass through as they are."""

    family: str | None
    labels: tuple[str, ...] | str | None
    replicate: int | None


def channel_trials(
    binary: pd.DataFrame,
    channel: str,
    *,
    family: str | None = "default",
    labels: tuple[str, ...] | str | None = "default",
    replicate: int | None = 0,
) -> pd.DataFrame:
    """The trials a channel is measured on: its label family, its label pairs and one replicate.

    ``family="default"`` takes :data:`FAMILY` and, with ``labels="default"``,
    :data:`LABELS` (A/B alone for logic and label); an explicit family with
    ``labels="default"`` takes every pair of that family. None means no
    filter. An empty selection is an error naming it.
    """
    if channel not in SIDES:
        raise ValueError(f"unknown channel {channel!r}; choose from {sorted(SIDES)}")
    fam = FAMILY[channel] if family == "default" else family
    if labels == "default":
        pairs = LABELS[channel] if family == "default" else None
    elif isinstance(labels, str):
        raise ValueError(f"labels must be 'default', None or a tuple of label pairs, got {labels!r}")
    else:
        pairs = labels
    df = select_trials(binary, fam, pairs, replicate)
    if df.empty:
        raise NotComputed(
            f"no binary trials for channel {channel!r} (family {fam!r}, label pairs {pairs}, replicate {replicate})"
        )
    return df


def side_cells(df: pd.DataFrame, channel: str) -> list[str]:
    """The design-cell columns of ``channel`` in these trials: the other channels' columns it balances over, then its side.

    A cell column that moves in lockstep with the side (the canonical label
    *is* the affirmative one when the mapping is not counterbalanced) is part
    of the channel, not a cell to balance over; the label channel refuses such
    trials.
    """
    side = SIDES[channel]
    confounded = [c for c in CELL if c != side and (df[c].eq(df[side]).all() or df[c].ne(df[side]).all())]
    if side == "cbr_canonical" and "cbr_affirmative" in confounded:
        raise NotComputed(
            "the label channel needs a counterbalanced label-to-verdict mapping (mapping canonical and swapped); "
            "in these trials the canonical label always carries the same verdict"
        )
    return [*(c for c in CELL if c != side and c not in confounded), side]


def dropped_items(binary: pd.DataFrame, channel: str, **select: Unpack[Selection]) -> tuple[Dropped, ...]:
    """The items :func:`channel_sides` drops (with the same selection keywords): a cell with no usable answer."""
    df = channel_trials(binary, channel, **select)
    return empty_cells(df, side_cells(df, channel), f"(s, m) fit: {channel}")


def channel_sides(binary: pd.DataFrame, channel: str, **select: Unpack[Selection]) -> pd.DataFrame:
    """Per item: ``p_plus``, ``p_minus`` (the two sides of ``channel``), ``bias = p_plus - p_minus`` and ``z``.

    Forms (and label pairs, salts when ``replicate`` is None) are averaged
    within each design cell first, then cells within a side, so every cell
    weighs the same. ``z = p_plus + p_minus - 1`` is the story stance
    ``mean(2 P(CBR) - 1)`` over the balanced cells. The
    :class:`Selection` keywords select the trials, with the defaults of
    :func:`channel_trials`. A cell
    column confounded with the side (the canonical label under a fixed
    mapping) belongs to the channel: with Yes/No the lexical channel is word
    and verdict together (:func:`side_cells`). Each
    item must have the same set of other-channel cells on both sides (a
    balanced 2-vs-2 or 4-vs-4 split); otherwise the bias would mix channels.
    Trials with no P(CBR) (every draw refused) are left out of their cell;
    an item with a cell left empty is dropped (:func:`dropped_items` names it).
    """
    df = channel_trials(binary, channel, **select)
    side = SIDES[channel]
    others = side_cells(df, channel)[:-1]
    grp = df.groupby(["item_id", *others, side], sort=True)["p_cbr"]
    cells = grp.mean().unstack(side)
    present = grp.size().unstack(side)
    cells.columns = present.columns = ["plus" if c else "minus" for c in cells.columns]
    if set(cells.columns) != {"plus", "minus"}:
        raise NotComputed(f"channel {channel!r} has cells on one side only; the design is incomplete")
    holes = present[["plus", "minus"]].isna().any(axis=1)
    if holes.any():
        items = sorted(set(cells.index[holes].get_level_values("item_id")))
        raise NotComputed(
            f"items {items[:5]}: the two sides of channel {channel!r} cover different cells of {others}; "
            "the split would not be balanced (is a verb, order or mapping missing?)"
        )
    # a cell whose every trial went unanswered (all draws refused): the item is dropped, see dropped_items
    empty = cells[["plus", "minus"]].isna().any(axis=1).groupby(level="item_id").any()
    cells = cells[~cells.index.get_level_values("item_id").isin(empty.index[empty])]
    g = cells.groupby(level="item_id", sort=True)
    out = pd.DataFrame({"p_plus": g["plus"].mean(), "p_minus": g["minus"].mean()})
    out["bias"] = out["p_plus"] - out["p_minus"]
    out["z"] = out["p_plus"] + out["p_minus"] - 1
    out["n_cells"] = 2 * g.size()
    return out


# ------------------------------------------------------------------ the fit
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
            degenerate=(not converged) or _at_bound(x),
            converged=converged,
            level=level,
            n_boot=n_boot,
            n_boot_failed=failed,
            seed=seed,
        )


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
    """Why the items cannot separate s from m (:func:`unidentified_reason`); "" when they can."""

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
    return _multistart(_residuals, _jacobian, [np.asarray(x0, dtype=float) for x0 in starts], lo, hi, (th, pp, pm))


def _multistart(
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


def _at_bound(x: np.ndarray) -> bool:
    """s (``x[0]``) at a bound of :data:`S_BOUNDS`, or an m (``x[1:]``) at +/- :data:`M_BOUND`."""
    lo, hi = S_BOUNDS
    return bool(x[0] <= lo * 1.01 or x[0] >= hi * 0.99 or np.any(np.abs(x[1:]) >= M_BOUND * 0.99))


def _goodness(p: np.ndarray, residuals: np.ndarray) -> tuple[float, float]:
    """(r2, rmse) of a fit of the probabilities ``p``: r2 = 1 - SS_res / SS_tot (NaN when p does not vary)."""
    ss_tot = float(np.sum((p - p.mean()) ** 2))
    ss_res = float(np.sum(residuals**2))
    return (1 - ss_res / ss_tot if ss_tot > 0 else float("nan")), float(np.sqrt(ss_res / p.size))


def _bootstrap(
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
    :func:`channel_sides` (items are matched on the index; items missing from
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
    r2, rmse = _goodness(stacked, _residuals(x, th, pp, pm))
    lo, hi, failed = _bootstrap(
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

    A channel whose default selection (:data:`FAMILY`, :data:`LABELS`) has no
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
    (:data:`JOINT_CHANNELS`, :data:`SIDES`); forms and label pairs of the
    family are averaged within it. A channel whose side column never varies
    in the family, or moves in lockstep with (or against) the column of a
    channel already kept, is not identified: it is left out and named in
    ``excluded`` with the reason (with a fixed label-to-verdict mapping the
    label channel is part of logic, as in :func:`channel_sides`). Items
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
    """Why the items cannot separate s from the m's (:func:`unidentified_reason`); "" when they can."""

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
    return _multistart(_joint_residuals, _joint_jacobian, starts, lo, hi, (th, p, sg, np.isfinite(p)))


def _joint_lm_batch(
    th: np.ndarray, p: np.ndarray, sg: np.ndarray, x0: np.ndarray, iters: int = 100
) -> tuple[np.ndarray, np.ndarray]:
    """Levenberg-Marquardt on many resamples at once: ``th`` (B, n), ``p`` (B, n, K) with NaN for absent cells.

    The same damping and stopping rules as :func:`_lm_batch`, with the (1 + C)
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
    r2, rmse = _goodness(stacked, _joint_residuals(x, th, p, sg, ok))
    # z of a story with an empty cell would be an unbalanced mean (its stance leaks the missing cell's
    # offsets), so only the stories with every cell count toward the items near the tie (issue 27)
    complete = ok.all(axis=1)
    z = (2 * p[complete] - 1).mean(axis=1)
    lo, hi, failed = _bootstrap(
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

    Unlike :func:`fit_channel`, whose sides each average over the other
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


# ------------------------------------------------------------ one run's fits
@dataclass(frozen=True)
class RunFits:
    """The (s, m) fits of one run: per channel (:func:`fit_each_channel`) and per label family (:func:`fit_joints`)."""

    fits: pd.DataFrame | None
    """One row per fitted channel, indexed by channel; None when no channel could be fitted."""
    unfitted: tuple[Unfitted, ...]
    """The channels that could not be fitted, each with the reason."""
    joint: pd.DataFrame | None
    """The joint fit, one row per (family, channel); None when the run has no label family."""
    dropped: tuple[Dropped, ...]
    """The stories each channel's fit left out (a cell with no usable answer), fitted channels first."""


def fit_run(theta: pd.Series, binary: pd.DataFrame, *, n_boot: int = N_BOOT, seed: int = SEED) -> RunFits:
    """Every fit of a run, as the battery report and ``probe compare`` both show it (the one fit loop)."""
    fits, unfitted = fit_each_channel(theta, binary, n_boot=n_boot, seed=seed)
    dropped: list[Dropped] = []
    for ch in [*(fits["channel"] if len(fits) else []), *(u.channel for u in unfitted)]:
        with contextlib.suppress(NotComputed):
            dropped += dropped_items(binary, str(ch))
    joint = fit_joints(theta, binary, n_boot=n_boot, seed=seed)
    return RunFits(
        fits=fits.set_index("channel") if len(fits) else None,
        unfitted=unfitted,
        joint=joint if len(joint) else None,
        dropped=tuple(dropped),
    )
