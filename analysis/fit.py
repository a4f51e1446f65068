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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.special import expit

from analysis.yesno import p_cbr

SIDES: dict[str, str] = {
    "order": "cbr_first",
    "lexical": "cbr_affirmative",
    "logic": "cbr_affirmative",
    "label": "cbr_canonical",
}
"""Channel -> the boolean trial column that puts a cell on the p+ side."""
FAMILY: dict[str, str | None] = {"order": "yesno", "lexical": "yesno", "logic": "arbitrary", "label": "arbitrary"}
"""The label family each channel is measured in by default (order and lexical: the verb-flip Yes/No family)."""
CELL = ("cbr_first", "cbr_affirmative", "cbr_canonical")

S_BOUNDS = (1e-3, 10.0)
M_BOUND = 4.0
"""|m| is bounded at 4 (four times the whole theta axis; a fit there is degenerate)."""


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
        raise ValueError("no forced-binary trials in the run; run the battery's binary instrument or yesno")
    if "labels" not in meta.columns:
        raise ValueError("binary trials lack the 'labels' factor (e.g. Yes/No); the trial contract requires it")
    first_label = meta["labels"].astype(str).str.split("/").str[0]
    meta["yes_label"] = meta["yes_label"].fillna(first_label) if "yes_label" in meta.columns else first_label
    meta["family"] = meta["family"].fillna("yesno") if "family" in meta.columns else "yesno"
    meta["mapping"] = meta["mapping"].fillna("canonical") if "mapping" in meta.columns else "canonical"
    opts = options[options["trial_id"].isin(meta["trial_id"])]
    cbr = opts[opts["meaning"] == "cbr"]
    counts = cbr.groupby("trial_id").size().reindex(meta["trial_id"], fill_value=0)
    bad = counts.index[counts != 1].tolist()
    if bad:
        raise ValueError(
            f"binary trials need exactly one 'cbr' option; trials {bad[:5]} have {counts[bad[:5]].tolist()}"
        )
    cbr = cbr.set_index("trial_id")
    out = meta[["trial_id", "item_id", "replicate", "family", "labels", "yes_label", "mapping"]].copy()
    for col in ("form", "verb", "order"):
        out[col] = meta[col] if col in meta.columns else ""
    out["p_cbr"] = out["trial_id"].map(p_cbr(opts))
    cbr_option = out["trial_id"].map(cbr["option"])
    out["cbr_first"] = out["trial_id"].map(cbr["position"]).eq(0)
    out["cbr_affirmative"] = cbr_option.eq(out["yes_label"])
    out["cbr_canonical"] = out["cbr_affirmative"].eq(out["mapping"].ne("swapped"))
    return out.reset_index(drop=True)


def channel_sides(
    binary: pd.DataFrame, channel: str, *, family: str | None = "default", replicate: int | None = 0
) -> pd.DataFrame:
    """Per item: ``p_plus``, ``p_minus`` (the two sides of ``channel``), ``bias = p_plus - p_minus`` and ``z``.

    Forms (and label pairs, salts when ``replicate`` is None) are averaged
    within each design cell first, then cells within a side, so every cell
    weighs the same. ``z = p_plus + p_minus - 1`` is the story stance
    ``mean(2 P(CBR) - 1)`` over the balanced cells. ``family`` selects the
    label family (``default``: :data:`FAMILY`; None: all rows given). A cell
    column confounded with the side (the canonical label under a fixed
    mapping) belongs to the channel: with Yes/No the lexical channel is word
    and verdict together. Each
    item must have the same set of other-channel cells on both sides (a
    balanced 2-vs-2 or 4-vs-4 split); otherwise the bias would mix channels.
    """
    if channel not in SIDES:
        raise ValueError(f"unknown channel {channel!r}; choose from {sorted(SIDES)}")
    fam = FAMILY[channel] if family == "default" else family
    df = binary
    if fam is not None:
        df = df[df["family"] == fam]
    if replicate is not None:
        df = df[df["replicate"] == replicate]
    if df.empty:
        raise ValueError(f"no binary trials for channel {channel!r} (family {fam!r}, replicate {replicate})")
    side = SIDES[channel]
    # a cell column that moves in lockstep with the side (the canonical label *is* the affirmative one
    # when the mapping is not counterbalanced) is part of the channel, not a cell to balance over
    confounded = [c for c in CELL if c != side and (df[c].eq(df[side]).all() or df[c].ne(df[side]).all())]
    if side == "cbr_canonical" and "cbr_affirmative" in confounded:
        raise ValueError(
            "the label channel needs a counterbalanced label-to-verdict mapping (mapping canonical and swapped); "
            "in these trials the canonical label always carries the same verdict"
        )
    others = [c for c in CELL if c != side and c not in confounded]
    cells = df.groupby(["item_id", *others, side], sort=True)["p_cbr"].mean().unstack(side)
    cells.columns = ["plus" if c else "minus" for c in cells.columns]
    if set(cells.columns) != {"plus", "minus"}:
        raise ValueError(f"channel {channel!r} has cells on one side only; the design is incomplete")
    holes = cells[["plus", "minus"]].isna().any(axis=1)
    if holes.any():
        items = sorted(set(cells.index[holes].get_level_values("item_id")))
        raise ValueError(
            f"items {items[:5]}: the two sides of channel {channel!r} cover different cells of {others}; "
            "the split would not be balanced (is a verb, order or mapping missing?)"
        )
    g = cells.groupby(level="item_id", sort=True)
    out = pd.DataFrame({"p_plus": g["plus"].mean(), "p_minus": g["minus"].mean()})
    out["bias"] = out["p_plus"] - out["p_minus"]
    out["z"] = out["p_plus"] + out["p_minus"] - 1
    out["n_cells"] = 2 * g.size()
    return out


# ------------------------------------------------------------------ the fit
@dataclass(frozen=True)
class ChannelFit:
    """The (s, m) fit of one bias channel, with percentile bootstrap CIs over items and quality flags."""

    channel: str
    s: float
    m: float
    s_lo: float
    s_hi: float
    m_lo: float
    m_hi: float
    r2: float
    """1 - SS_res / SS_tot on the stacked p+ and p- of all items."""
    rmse: float
    n_items: int
    n_near_tie: int
    """Items with |z| < ``tie`` (the story stance near the tie: where m is identified)."""
    tie: float
    frac_saturated: float
    """Share of the stacked p within ``clip`` of 0 or 1."""
    saturated: bool
    """Most (> half) of the stacked p are clipped: s reads small, m attenuated."""
    degenerate: bool
    """s at a bound, m at its bound, or the optimizer did not converge."""
    converged: bool
    level: float
    n_boot: int
    n_boot_failed: int
    seed: int

    @property
    def clip_limited(self) -> bool:
        """Absolute s (and m) are not interpretable; only rankings and within-model differences are."""
        return self.saturated or self.degenerate

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "clip_limited": self.clip_limited}


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
    best = None
    for x0 in starts:
        x0c = (float(np.clip(x0[0], *S_BOUNDS)), float(np.clip(x0[1], -M_BOUND, M_BOUND)))
        r = least_squares(
            _residuals,
            x0c,
            jac=_jacobian,
            bounds=([S_BOUNDS[0], -M_BOUND], [S_BOUNDS[1], M_BOUND]),
            args=(th, pp, pm),
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


def _at_bound(s: float, m: float) -> bool:
    lo, hi = S_BOUNDS
    return s <= lo * 1.01 or s >= hi * 0.99 or abs(m) >= M_BOUND * 0.99


def fit_channel(
    theta: pd.Series,
    sides: pd.DataFrame,
    *,
    channel: str = "",
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    tie: float = 0.9,
    clip: float = 0.02,
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
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n_boot < 0:
        raise ValueError(f"n_boot must be >= 0, got {n_boot}")
    df = pd.concat([theta.rename("theta"), sides[["p_plus", "p_minus", "z"]]], axis=1, join="inner").dropna()
    n = len(df)
    if n < 3:
        raise ValueError(f"the (s, m) fit needs at least 3 items with theta and both sides, got {n}")
    th = df["theta"].to_numpy(float)
    pp = df["p_plus"].to_numpy(float)
    pm = df["p_minus"].to_numpy(float)
    starts = [(s0, m0) for s0 in (0.1, 0.3, 1.0) for m0 in (-0.2, 0.0, 0.2)]
    x, ok = _solve(th, pp, pm, starts)
    s, m = float(x[0]), float(x[1])
    res = _residuals(x, th, pp, pm)
    stacked = np.concatenate([pp, pm])
    ss_tot = float(np.sum((stacked - stacked.mean()) ** 2))
    ss_res = float(np.sum(res**2))
    frac_sat = float(np.mean((stacked < clip) | (stacked > 1 - clip)))

    failed = 0
    alpha = (1 - level) / 2
    s_lo = s_hi = m_lo = m_hi = float("nan")
    if n_boot:
        idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
        boots, ok_b = refit_resamples(th, pp, pm, idx, (s, m))
        failed = int((~ok_b).sum())
        if ok_b.any():
            kept = boots[ok_b]
            (s_lo, s_hi), (m_lo, m_hi) = (np.quantile(kept[:, k], [alpha, 1 - alpha]) for k in range(2))
    return ChannelFit(
        channel=channel,
        s=s,
        m=m,
        s_lo=float(s_lo),
        s_hi=float(s_hi),
        m_lo=float(m_lo),
        m_hi=float(m_hi),
        r2=1 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
        rmse=float(np.sqrt(ss_res / (2 * n))),
        n_items=n,
        n_near_tie=int(np.sum(np.abs(df["z"].to_numpy(float)) < tie)),
        tie=tie,
        frac_saturated=frac_sat,
        saturated=frac_sat > 0.5,
        degenerate=(not ok) or _at_bound(s, m),
        converged=ok,
        level=level,
        n_boot=n_boot,
        n_boot_failed=failed,
        seed=seed,
    )


def fit_channels(
    theta: pd.Series,
    binary: pd.DataFrame,
    channels: tuple[str, ...] = ("order", "lexical", "logic", "label"),
    **kw: Any,
) -> pd.DataFrame:
    """Fit every channel present in ``binary`` (a channel whose family is absent is skipped); one row per channel."""
    rows = []
    for ch in channels:
        fam = FAMILY[ch]
        if fam is not None and not (binary["family"] == fam).any():
            continue
        rows.append(fit_channel(theta, channel_sides(binary, ch), channel=ch, **kw).to_dict())
    return pd.DataFrame(rows)
