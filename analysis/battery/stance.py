"""The graded stance theta, its cross-form incoherence and the generalizability coefficient (paper 003, I-1).

A graded trial's options are the values of a rating scale, and each option's
``meaning`` is its signed stance ``x`` toward the item's cost-benefit (CBR)
pole (rating normalization of ``docs/battery-analysis.md``: ``a = (v-lo)/(hi-lo)``,
``1-a`` under a descending anchor, ``x = 2a-1`` for the CBR pole, ``1-2a`` for
the other). So a trial's answer distribution is a distribution over ``x``:

* **per-trial stance**: its mean ``sum_i p_i x_i`` (mean-based) or the ``x`` of
  its most likely option (mode-based);
* **per-form value** ``x_f``: one value per (item, scale, wording, anchor,
  pole), from the unsalted replicate or pooled over replicates, with its
  sampling variance ``Var_samp(x_f)`` (how much ``x_f`` would move if the same
  form were asked again);
* **theta** = mean of ``x_f`` over the unipolar forms (= mean a_action - mean
  a_complement); bipolar forms give the measured contrast ``theta_bipolar - theta``;
* **sigma_repro** = ``sqrt(max(0, Var_forms(x_f) - mean Var_samp(x_f)))``,
  the Gauge R&R correction (Var_samp: the variance of the form's *value*), split by variance share into an anchor-direction
  and a scale (within-direction) component that add in quadrature;
* **sigma_repeat** = sqrt of the pooled variance of *one elicitation* of a
  form (``var_rep``: one draw in one context), the same for draws and salts;
  ``sigma_tot^2 = sigma_repro^2 + sigma_repeat^2``;
* **G** = ``Var_items(theta) / (Var_items(theta) + mean sigma_repro^2)``.

Also the salt floor (within-form SD under salts vs between-form SD) and the
convergent-validity helpers. All functions are pure and take tidy frames as
returned by :mod:`probe.views`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
from scipy import stats

from analysis.common.bootstrap import check_bootstrap, quantile_ci, resample_index
from analysis.common.records import Record
from probe.errors import NotComputed

FORM = ("scale", "wording", "anchor", "pole")
"""The factors that make a graded form (condition)."""
Source = Literal["readout", "samples"]
Value = Literal["mean", "mode"]
Replicates = Literal["unsalted", "pooled"]


# ------------------------------------------------------------------ per trial
def graded_trials(options: pd.DataFrame, per_trial: pd.DataFrame, source: Source) -> pd.DataFrame:
    """Per graded trial: mean and mode stance, the distribution's variance and the sampling variance of the mean.

    ``options``/``per_trial`` are what :meth:`probe.runs.Run.choice_probs`
    returns and ``source`` is its third value: ``readout`` (exact answer-slot
    probabilities; the mean is exact, ``var_mean = 0``) or ``samples``
    (``count`` per option; ``var_mean`` = the unbiased variance of the draws
    divided by their number, NaN with fewer than two parsed draws).

    Columns: trial_id, item_id, replicate, the form factors, ``bipolar``,
    ``mean_x``, ``mode_x``, ``var_x`` (variance of the answer distribution),
    ``n`` (parsed draws; NaN for readouts), ``var_mean``.
    """
    if source not in ("readout", "samples"):
        raise ValueError(f"source must be 'readout' or 'samples', got {source!r}")
    if "instrument" not in per_trial.columns:
        raise NotComputed("per_trial has no 'instrument' factor; graded trials come from the battery experiment")
    meta = per_trial[per_trial["instrument"] == "graded"]
    missing = [c for c in FORM if c not in meta.columns]
    if missing:
        raise NotComputed(f"graded trials lack the factors {missing}; expected {list(FORM)}")
    opts = options[options["trial_id"].isin(meta["trial_id"])].copy()
    if opts.empty:
        raise NotComputed("no graded options in the run; run the battery with the graded instrument")
    opts["x"] = pd.to_numeric(opts["meaning"], errors="raise")
    opts["v"] = pd.to_numeric(opts["option"], errors="raise")
    if source == "readout":
        opts["w"] = opts["prob"]
    else:
        opts["w"] = opts["count"]
    opts = opts.sort_values(["trial_id", "option_index"], kind="stable")
    g = opts.groupby("trial_id", sort=False)
    total = g["w"].sum()
    mean_x = (opts["w"] * opts["x"]).groupby(opts["trial_id"], sort=False).sum() / total
    dev2 = opts["w"] * (opts["x"] - opts["trial_id"].map(mean_x)) ** 2
    ss = dev2.groupby(opts["trial_id"], sort=False).sum()
    # mode: the option with the largest weight, ties to the first printed
    idx = opts.groupby("trial_id", sort=False)["w"].idxmax()
    mode_x = opts.loc[idx].set_index("trial_id")["x"]
    bipolar = g["v"].min() < 0
    out = pd.DataFrame({"mean_x": mean_x, "mode_x": mode_x, "bipolar": bipolar})
    if source == "readout":
        out["var_x"] = ss / total
        out["n"] = np.nan
        out["var_mean"] = 0.0
    else:
        n = total
        out["var_x"] = ss / n.where(n > 0)
        out["n"] = n
        out["var_mean"] = ss / (n * (n - 1)).where(n > 1)
        out.loc[n == 0, ["mean_x", "mode_x"]] = np.nan
    cols = ["trial_id", "item_id", "replicate", *FORM]
    return meta[cols].join(out, on="trial_id").reset_index(drop=True)


# ------------------------------------------------------------------- per form
def _repeat_variance(df: pd.DataFrame, keys: list[str], col: str) -> pd.Series:
    """Per form: the variance of ONE elicitation (one draw in one context), pooled over the form's replicates.

    Sampled trials: the unbiased variance of all parsed draws of the form,
    across its salt replicates (``SS = sum_r SS_r + sum_r n_r (m_r - M)^2``
    over ``N - 1``, ``N = sum_r n_r``, ``m_r`` the replicate's mean stance),
    so N draws in one context and N contexts of one draw estimate the same
    number (issue 27). Readouts: a readout is one deterministic elicitation
    per context (``n_r = 1``, ``SS_r = 0``, ``m_r`` = its ``col``), so this
    is the variance of ``col`` across the salt replicates (ddof 1), and 0 with
    a single replicate. NaN for a sampled form with fewer than two draws.
    """
    sampled = df["n"].notna() if "n" in df.columns else pd.Series(False, index=df.index)
    n = df["n"].where(sampled, 1.0).astype(float) if "n" in df.columns else pd.Series(1.0, index=df.index)
    m = df["mean_x"].where(sampled, df[col]).astype(float)
    var_x = df["var_x"] if "var_x" in df.columns else pd.Series(np.nan, index=df.index)
    ss = (var_x * n).where(sampled, 0.0).astype(float)
    by = [df[k] for k in keys]
    big_n = n.groupby(by, sort=True).transform("sum")
    grand = (n * m).groupby(by, sort=True).transform("sum") / big_n
    total = (ss + n * (m - grand) ** 2).groupby(by, sort=True).sum()
    big_n_f = n.groupby(by, sort=True).sum()
    any_sampled = sampled.groupby(by, sort=True).any()
    out = total / (big_n_f - 1).where(big_n_f > 1)
    return out.where(any_sampled | (big_n_f > 1), 0.0)


def per_form(trials: pd.DataFrame, value: Value = "mean", replicates: Replicates = "unsalted") -> pd.DataFrame:
    """One value per (item, form) with its sampling variance ``var_samp`` and its repeat variance ``var_rep``.

    With R salt replicates of a form (``x_r``, r = 0..R-1):

    * ``unsalted``: ``x_f = x_0`` and ``var_samp`` = the variance of one
      replicate, ``Var_r(x_r)`` (ddof 1), which holds the sampling and the
      salt noise of a single context. A form whose unsalted replicate has
      no usable value (every draw refused) falls back to the mean of its
      salted replicates, with ``var_samp = Var_r(x_r) / R'`` over those R'
      (its own ``var_mean`` when R' = 1); ``value_from`` says which;
    * ``pooled``: ``x_f = mean_r x_r`` and ``var_samp = Var_r(x_r) / R``.

    With a single replicate ``var_samp`` is the trial's own ``var_mean``
    (0 for a readout, variance of the mean of the draws for samples).
    ``var_samp`` is the variance of the form's *value* (what the Gauge R&R
    correction of sigma_repro subtracts). ``var_rep`` is the variance of
    *one elicitation* (:func:`_repeat_variance`), the same whatever the
    number of draws or salts: its pooled square root is sigma_repeat.
    ``value`` picks the mean-based or mode-based per-trial stance. Forms
    with no usable value in any replicate are absent (:func:`unusable_forms`
    lists them).
    """
    if value not in ("mean", "mode"):
        raise ValueError(f"value must be 'mean' or 'mode', got {value!r}")
    if replicates not in ("unsalted", "pooled"):
        raise ValueError(f"replicates must be 'unsalted' or 'pooled', got {replicates!r}")
    col = f"{value}_x"
    keys = ["item_id", *FORM]
    df = trials.dropna(subset=[col])
    g = df.groupby(keys, sort=True)
    n_rep = g[col].size().rename("n_rep")
    var_rep = g[col].var(ddof=1)
    bipolar = g["bipolar"].first()
    pooled_x = g[col].mean()
    pooled_var = (var_rep / n_rep).where(n_rep > 1, g["var_mean"].first())
    value_from = pd.Series("pooled", index=n_rep.index)
    if replicates == "unsalted":
        zero = df[df["replicate"] == 0].set_index(keys)
        if zero.index.duplicated().any():
            raise NotComputed(
                "more than one replicate-0 trial per form; per_form needs one trial per form and replicate"
            )
        x = zero[col].reindex(n_rep.index)
        single = zero["var_mean"].reindex(n_rep.index)
        var_samp = var_rep.where(n_rep > 1, single)
        lost = x.isna()  # the unsalted replicate had no usable answer: the policy's fallback
        x = x.where(~lost, pooled_x)
        var_samp = var_samp.where(~lost, pooled_var)
        value_from = pd.Series(np.where(lost, "salted mean", "unsalted"), index=n_rep.index)
    else:
        x = pooled_x
        var_samp = pooled_var
    rep = _repeat_variance(df, keys, col)
    out = pd.DataFrame(
        {
            "x": x,
            "var_samp": var_samp,
            "var_rep": rep.reindex(n_rep.index),
            "n_rep": n_rep,
            "bipolar": bipolar.astype(bool),
            "value_from": value_from,
        }
    )
    return out.reset_index()


def unusable_forms(trials: pd.DataFrame, value: Value = "mean") -> pd.DataFrame:
    """The (item, form)s with no usable value in any replicate (every draw refused): :func:`per_form` leaves them out."""
    col = f"{value}_x"
    keys = ["item_id", *FORM]
    usable = trials[col].notna().groupby([trials[k] for k in keys], sort=True).any()
    return usable[~usable].reset_index()[keys]


def pole_balanced_mean(forms: pd.DataFrame) -> pd.Series:
    """Per item: the mean over the rated poles of each pole's mean ``x``: ``a_action_mean - a_complement_mean``.

    The paper's theta is ``mean a_action - mean a_complement``; with
    ``x = 2a - 1`` on the CBR pole and ``1 - 2a`` on the other, that is the
    mean of the two poles' mean x. When forms drop out (a sampled form with
    no usable answer) each pole keeps weight one half, so a pole that lost
    forms is not outweighed by the other (a plain mean of x over the
    surviving forms would be). Reading taken where the paper's formula is
    undefined: an item with one pole entirely missing gets that pole's mean.
    Without a ``pole`` column every form counts as one pole.
    """
    if "pole" not in forms.columns:
        return forms.groupby("item_id")["x"].mean()
    return forms.groupby(["item_id", "pole"])["x"].mean().groupby(level="item_id").mean()


def theta(forms: pd.DataFrame) -> pd.Series:
    """theta per item on the unipolar forms: ``mean a_action - mean a_complement`` (:func:`pole_balanced_mean`)."""
    uni = forms[~forms["bipolar"]]
    if uni.empty:
        raise NotComputed("no unipolar graded forms (0-10, 0-100); theta is defined on the unipolar scales only")
    return pole_balanced_mean(uni).rename("theta")


def bipolar_contrast(forms: pd.DataFrame) -> pd.DataFrame:
    """Per item: theta (unipolar), theta_bipolar (the same estimator on the bipolar forms), contrast = their difference."""
    th = theta(forms)
    bi = pole_balanced_mean(forms[forms["bipolar"]]).rename("theta_bipolar")
    out = pd.concat([th, bi], axis=1)
    out["contrast"] = out["theta_bipolar"] - out["theta"]
    return out


@dataclass(frozen=True)
class BipolarSummary(Record):
    """The measured bipolar contrast over items: the signed mean and the paper's mean |theta_bipolar - theta|."""

    mean: float
    mean_abs: float
    n_items: int


def bipolar_summary(contrast: pd.DataFrame) -> BipolarSummary:
    """Signed mean and mean |.| of the ``contrast`` column of :func:`bipolar_contrast` (items with both)."""
    c = contrast["contrast"].dropna()
    if c.empty:
        raise NotComputed("no item has both unipolar and bipolar forms; the bipolar contrast needs both")
    return BipolarSummary(mean=float(c.mean()), mean_abs=float(c.abs().mean()), n_items=len(c))


# ----------------------------------------------------------- incoherence
def variance_shares(x: np.ndarray, groups: np.ndarray, noise: float) -> tuple[float, float]:
    """Split the sampling-corrected cross-form variance into a between-``groups`` and a within-groups share.

    ``Var_forms(x) = (SS_between + SS_within) / (K - 1)``; the sampling noise
    ``noise`` (= mean Var_samp) is subtracted from each share in proportion to
    its degrees of freedom (``J - 1`` and ``K - J`` of ``K - 1``). The two
    shares add exactly to ``Var_forms(x) - noise`` (before any floor at zero).
    """
    k = len(x)
    if k < 2:
        return float("nan"), float("nan")
    labels, codes = np.unique(groups, return_inverse=True)
    j = len(labels)
    means = np.bincount(codes, weights=x) / np.bincount(codes)
    ss_between = float(np.sum((means[codes] - x.mean()) ** 2))
    ss_within = float(np.sum((x - means[codes]) ** 2))
    between = (ss_between - noise * (j - 1)) / (k - 1)
    within = (ss_within - noise * (k - j)) / (k - 1)
    return between, within


def incoherence(forms: pd.DataFrame, *, include_bipolar: bool = False, by: str = "anchor") -> pd.DataFrame:
    """Per item: theta, the cross-form incoherence and its components.

    Columns: ``theta``, ``n_forms``, ``var_forms`` (ddof 1), ``var_samp``
    (mean over forms), ``sigma_repro = sqrt(max(0, var_forms - var_samp))``,
    ``sigma_dir`` (the between-``by`` share, anchor direction by default),
    ``sigma_scale`` (the within-direction share: scale, wording, pole),
    ``sigma_quad = sqrt(sigma_dir^2 + sigma_scale^2)`` (equal to sigma_repro
    unless a share was floored at zero), ``sigma_raw`` (sqrt of
    ``var_forms``, uncorrected) and the two shares before the floor,
    ``var_dir`` and ``var_scale`` (for :func:`pooled_incoherence`), and ``var_rep``, the mean over forms of
    the single-elicitation variance (:func:`per_form`; NaN when no form has one). Forms without a sampling
    variance are left out of its mean. ``include_bipolar`` adds the bipolar forms (the paper's
    robustness check); theta stays unipolar.
    """
    th = theta(forms)
    use = forms if include_bipolar else forms[~forms["bipolar"]]
    rows = {}
    for item, df in use.groupby("item_id", sort=True):
        x = df["x"].to_numpy(float)
        vs = df["var_samp"].to_numpy(float)
        noise = float(np.nanmean(vs)) if np.isfinite(vs).any() else 0.0
        var_forms = float(np.var(x, ddof=1)) if len(x) > 1 else float("nan")
        between, within = variance_shares(x, df[by].to_numpy(), noise)
        vr = df["var_rep"].to_numpy(float) if "var_rep" in df.columns else np.array([np.nan])
        sig_dir = np.sqrt(max(0.0, between)) if np.isfinite(between) else np.nan
        sig_scale = np.sqrt(max(0.0, within)) if np.isfinite(within) else np.nan
        rows[item] = {
            "theta": th.get(item, np.nan),
            "n_forms": len(x),
            "var_forms": var_forms,
            "var_samp": noise,
            "sigma_repro": np.sqrt(max(0.0, var_forms - noise)) if np.isfinite(var_forms) else np.nan,
            "sigma_dir": sig_dir,
            "sigma_scale": sig_scale,
            "sigma_quad": np.sqrt(sig_dir**2 + sig_scale**2),
            "sigma_raw": np.sqrt(var_forms),
            "var_dir": between,
            "var_scale": within,
            "var_rep": float(np.nanmean(vr)) if np.isfinite(vr).any() else np.nan,
        }
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "item_id"
    return out


@dataclass(frozen=True)
class PooledIncoherence(Record):
    """The per-model aggregate incoherence (the paper's headline and Fig. 1b): variances pooled over items, then sqrt.

    The mean of per-item sigma_repro is lower by Jensen's inequality
    (per-item 0.05, 0.10, 0.30: mean 0.15, pooled 0.185); both are reported.
    """

    sigma_repro: float
    """sqrt(max(0, pooled Var_forms - pooled Var_samp))."""
    sigma_dir: float
    """sqrt(max(0, pooled between-direction share))."""
    sigma_scale: float
    """sqrt(max(0, pooled within-direction share: scale, wording, pole))."""
    sigma_repeat: float
    """sqrt(pooled var_rep): the SD of ONE elicitation of a form (one draw in one context), the paper's Gauge
    R&R repeatability; the same whether the replicates are draws or salts. Not the standard error of a form's
    value (that is sqrt(Var_samp), what the correction of sigma_repro subtracts). 0 for an unsalted readout;
    NaN when no form has two draws."""
    sigma_tot: float
    """sqrt(sigma_repro^2 + sigma_repeat^2): the SD of one elicitation of a randomly chosen form."""
    mean_item_sigma_repro: float
    """The mean of per-item sigma_repro (the estimator of the uncertainty statements)."""
    n_items: int
    n_forms: int
    sigma_value: float = float("nan")
    """sqrt(pooled Var_samp): the standard error of one form's value (sigma_repeat / sqrt(N) for N draws)."""


def pooled_incoherence(inc: pd.DataFrame) -> PooledIncoherence:
    """Pool the per-item variance decomposition of :func:`incoherence` across items.

    Each item's ``var_forms``, ``var_samp``, ``var_rep`` and shares are
    weighted by its degrees of freedom ``n_forms - 1`` (a pooled variance:
    with equal form counts, the plain mean over items), then floored at zero
    and square-rooted. The pooled shares add exactly to the pooled
    ``Var_forms - Var_samp``. sigma_repro subtracts ``Var_samp`` (the
    variance of the form's value, Var/N for a mean of N draws); sigma_repeat
    is the SD of one elicitation, ``sqrt(pooled var_rep)`` (issue 27: it was
    ``sqrt(pooled Var_samp)``, a standard error that halved as the draws
    quadrupled).
    """
    df = inc.dropna(subset=["var_forms"])
    df = df[df["n_forms"] > 1]
    if df.empty:
        raise NotComputed("pooled incoherence needs at least one item with two or more forms")
    w = (df["n_forms"] - 1).to_numpy(float)

    def pool(col: str) -> float:
        return float(np.sum(w * df[col].to_numpy(float)) / w.sum())

    var_samp = pool("var_samp")
    var_repro = pool("var_forms") - var_samp
    sigma_repro = float(np.sqrt(max(0.0, var_repro)))
    rep = df["var_rep"].to_numpy(float) if "var_rep" in df.columns else np.full(len(df), np.nan)
    ok = np.isfinite(rep)
    var_rep = float(np.sum(w[ok] * rep[ok]) / w[ok].sum()) if ok.any() else float("nan")
    sigma_repeat = float(np.sqrt(max(0.0, var_rep))) if ok.any() else float("nan")
    return PooledIncoherence(
        sigma_repro=sigma_repro,
        sigma_dir=float(np.sqrt(max(0.0, pool("var_dir")))),
        sigma_scale=float(np.sqrt(max(0.0, pool("var_scale")))),
        sigma_repeat=sigma_repeat,
        sigma_tot=float(np.hypot(sigma_repro, sigma_repeat)),
        mean_item_sigma_repro=float(df["sigma_repro"].mean()),
        n_items=len(df),
        n_forms=int(df["n_forms"].sum()),
        sigma_value=float(np.sqrt(max(0.0, var_samp))),
    )


@dataclass(frozen=True)
class Generalizability(Record):
    """G = Var_items(theta) / (Var_items(theta) + mean sigma_repro^2): an ICC for one randomly chosen form."""

    G: float
    var_items: float
    """Between-item variance of theta (ddof 1)."""
    mean_sigma2: float
    """Mean per-item sigma_repro^2."""
    n_items: int


def generalizability(inc: pd.DataFrame) -> Generalizability:
    """G from the per-item table of :func:`incoherence`."""
    df = inc.dropna(subset=["theta", "sigma_repro"])
    if len(df) < 2:
        raise NotComputed(f"G needs at least two items with theta and sigma_repro, got {len(df)}")
    var_items = float(np.var(df["theta"].to_numpy(float), ddof=1))
    mean_s2 = float(np.mean(df["sigma_repro"].to_numpy(float) ** 2))
    denom = var_items + mean_s2
    return Generalizability(
        G=var_items / denom if denom > 0 else float("nan"),
        var_items=var_items,
        mean_sigma2=mean_s2,
        n_items=len(df),
    )


# ------------------------------------------------------------------ salt floor
def salt_spread(values: pd.DataFrame, value: str, form: Sequence[str]) -> pd.DataFrame:
    """Per (item, form): the replicate mean, the within-form SD across salt replicates (ddof 1) and the count.

    ``values`` has one row per trial with ``item_id``, ``replicate``, the
    ``form`` columns and the ``value`` column (a graded stance, or P(CBR) of a
    binary trial). Every replicate, the unsalted one included, is one draw of
    a meaningless context.
    """
    keys = ["item_id", *form]
    g = values.dropna(subset=[value]).groupby(keys, sort=True)[value]
    out = pd.DataFrame({"mean": g.mean(), "within_sd": g.std(ddof=1), "n_rep": g.size()})
    if (out["n_rep"] < 2).all():
        raise NotComputed("the salt floor needs salted replicates: run with --salts 2 or more")
    return out.reset_index()


@dataclass(frozen=True)
class SaltFloor(Record):
    """Within-form spread under salts against the between-form spread (paper 003, salt replication)."""

    within_sd_mean: float
    """Mean over forms of the within-form SD across salts."""
    within_sd_median: float
    between_sd_mean: float
    """Mean over items of the SD across forms of the replicate-mean value."""
    ratio: float
    """between_sd_mean / within_sd_mean (inf when the floor is exactly zero)."""
    n_forms: int
    n_items: int


def salt_floor(spread: pd.DataFrame) -> SaltFloor:
    """Summarize :func:`salt_spread`: is the between-form spread more than the within-form (salt) noise?"""
    w = spread["within_sd"].dropna()
    between = spread.groupby("item_id")["mean"].std(ddof=1).dropna()
    w_mean = float(w.mean())
    b_mean = float(between.mean()) if len(between) else float("nan")
    return SaltFloor(
        within_sd_mean=w_mean,
        within_sd_median=float(w.median()),
        between_sd_mean=b_mean,
        ratio=b_mean / w_mean if w_mean > 0 else float("inf"),
        n_forms=len(w),
        n_items=int(spread["item_id"].nunique()),
    )


@dataclass(frozen=True)
class SaltInvariance(Record):
    """What salting does to the graded forms (paper 003: "69% of forms exactly invariant", "r = 0.993")."""

    invariant: float
    """Share of (item, form) whose most likely rating (the mode stance) is the same in every replicate."""
    n_forms: int
    r_theta: float
    """Pearson r over items of theta from the salted replicates (pooled) against the unsalted theta."""
    n_items: int


def salt_invariance(trials: pd.DataFrame) -> SaltInvariance:
    """Salt diagnostics of :func:`graded_trials` rows with salted replicates (unipolar forms).

    Reading taken: "exactly invariant" is read on the mode stance (the greedy
    answer of a logit readout); a mean stance moves by round-off under any
    salt. Salted theta: per form the mean over the salted replicates (1..R-1),
    then :func:`theta`; unsalted theta: replicate 0.
    """
    uni = trials[~trials["bipolar"]] if "bipolar" in trials.columns else trials
    if not (uni["replicate"] > 0).any():
        raise NotComputed("salt diagnostics need salted replicates: run with --salts 2 or more")
    keys = ["item_id", *FORM]
    g = uni.dropna(subset=["mode_x"]).groupby(keys)
    n_rep = g["mode_x"].size()
    invariant = (g["mode_x"].nunique() == 1)[n_rep > 1]
    salted = uni[uni["replicate"] > 0]
    unsalted = uni[uni["replicate"] == 0]

    def theta_of(df: pd.DataFrame) -> pd.Series:
        forms = df.dropna(subset=["mean_x"]).groupby(keys)["mean_x"].mean().rename("x").reset_index()
        return theta(forms.assign(bipolar=False))

    both = pd.concat([theta_of(salted).rename("s"), theta_of(unsalted).rename("u")], axis=1).dropna()
    ok = len(both) > 2 and both["s"].nunique() > 1 and both["u"].nunique() > 1
    return SaltInvariance(
        invariant=float(invariant.mean()),
        n_forms=int(invariant.size),
        r_theta=float(np.corrcoef(both["s"], both["u"])[0, 1]) if ok else float("nan"),
        n_items=len(both),
    )


# ------------------------------------------------------- convergent validity
@dataclass(frozen=True)
class Correlation(Record):
    """Pearson r between two per-item series, with a percentile bootstrap CI over items."""

    r: float
    lo: float
    hi: float
    p_value: float
    n: int
    level: float
    n_boot: int
    seed: int


MIN_CORRELATION_ITEMS = 5
"""Items below which no correlation is reported: with 3 or 4 points |r| near 1 is common by chance alone
(under independence, P(|r| > 0.9) is 0.29 at n = 3 and 0.10 at n = 4)."""
MIN_STANCE_SPREAD = 0.05
"""Range over items (on the -1..1 stance scale) below which a stance has nothing to correlate: what is left is noise."""


def correlation_blocker(a: pd.Series, b: pd.Series, names: tuple[str, str] = ("a", "b")) -> str:
    """Why a correlation of ``a`` and ``b`` (aligned, NaN dropped) would mislead ("" when it would not).

    Too few items, or a series with (next to) no spread across items.
    """
    df = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner").dropna()
    if len(df) < MIN_CORRELATION_ITEMS:
        return f"only {len(df)} items in both (a correlation needs at least {MIN_CORRELATION_ITEMS})"
    for col, name in zip(("a", "b"), names, strict=True):
        spread = float(df[col].max() - df[col].min())
        if spread < MIN_STANCE_SPREAD:
            return (
                f"{name} spans {spread:.3f} across the {len(df)} items (< {MIN_STANCE_SPREAD:g}): "
                "no between-item variation to correlate"
            )
    return ""


def pearson_ci(a: pd.Series, b: pd.Series, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> Correlation:
    """Pearson r of ``a`` and ``b`` (aligned on their index, NaN dropped) with a percentile bootstrap over items.

    Resamples in which either series is constant have no r and are skipped.
    """
    check_bootstrap(level)
    df = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner").dropna()
    n = len(df)
    if n < 3:
        raise NotComputed(f"a correlation needs at least 3 items present in both series, got {n}")
    x, y = df["a"].to_numpy(float), df["b"].to_numpy(float)
    res = stats.pearsonr(x, y)
    idx = resample_index(n, n_boot, seed)
    xb, yb = x[idx], y[idx]
    xc = xb - xb.mean(axis=1, keepdims=True)
    yc = yb - yb.mean(axis=1, keepdims=True)
    den = np.sqrt((xc**2).sum(axis=1) * (yc**2).sum(axis=1))
    ok = den > 0
    rb = (xc * yc).sum(axis=1)[ok] / den[ok]
    lo, hi = quantile_ci(rb, level) if len(rb) else (np.nan, np.nan)
    return Correlation(
        r=float(res.statistic),
        lo=float(lo),
        hi=float(hi),
        p_value=float(res.pvalue),
        n=n,
        level=level,
        n_boot=int(ok.sum()),
        seed=seed,
    )


def choice_stance(judgments: pd.DataFrame) -> pd.Series:
    """I-2 stance per item: mean of ``p_pro - p_anti`` over judged replies (NONCOMMIT counts as 0).

    ``judgments`` needs ``item_id``, ``p_pro``, ``p_anti`` (the judgments table
    of a battery run joined with the trials' item ids; a rule judge gives 0/1,
    a logit judge its probabilities). On the [-1, 1] axis, like theta.
    """
    need = {"item_id", "p_pro", "p_anti"} - set(judgments.columns)
    if need:
        raise ValueError(f"judgments lack the columns {sorted(need)}; join item_id onto the judgments table")
    d = judgments["p_pro"] - judgments["p_anti"]
    return d.groupby(judgments["item_id"]).mean().rename("choice_stance")


# ------------------------------------------------------------- I-2 free choice
def choice_forms(judged: pd.DataFrame) -> pd.DataFrame:
    """Per (item, framing, order): the I-2 stance of the form and its sampling variance ``var_samp``.

    ``judged`` has one row per judged reply: ``item_id``, ``framing``,
    ``order`` (``cbr_first``/``anti_first``), ``replicate``, ``trial_id``,
    ``p_pro``, ``p_anti``. A trial's value is the mean of ``p_pro - p_anti``
    over its replies, with ``var_mean`` = their unbiased variance over n
    (NaN with one reply). As for I-1 (:func:`per_form`, unsalted policy): the
    form's value is replicate 0's, and its ``var_samp`` the variance over
    salt replicates when there are several, else the trial's ``var_mean``.
    """
    need = {"item_id", "framing", "order", "replicate", "trial_id", "p_pro", "p_anti"} - set(judged.columns)
    if need:
        raise ValueError(f"judged replies lack the columns {sorted(need)}; join the trial factors onto the judgments")
    d = judged.assign(v=judged["p_pro"] - judged["p_anti"])
    g = d.groupby(["item_id", "framing", "order", "replicate", "trial_id"], sort=True)["v"]
    per_trial = pd.DataFrame({"v": g.mean(), "var_mean": g.var(ddof=1) / g.count()}).reset_index()
    keys = ["item_id", "framing", "order"]
    f = per_trial.groupby(keys)
    n_rep = f["v"].size()
    zero = per_trial[per_trial["replicate"] == 0].groupby(keys)[["v", "var_mean"]].first().reindex(n_rep.index)
    var_samp = f["v"].var(ddof=1).where(n_rep > 1, zero["var_mean"])
    return pd.DataFrame({"x": zero["v"], "var_samp": var_samp, "n_rep": n_rep}).reset_index()


def choice_incoherence(forms: pd.DataFrame) -> pd.DataFrame:
    """Per item: the I-2 ``stance``, its sampling-corrected spread ``sigma_repro`` and the ``order`` bias.

    ``stance`` = mean of the form values; ``sigma_repro`` = ``sqrt(max(0,
    Var_forms - mean Var_samp))`` as for I-1 (forms without a sampling
    variance left out of the mean, 0 when none has one, e.g. one greedy reply
    per form); ``order`` = ``(stance_cbr_first - stance_anti_first) / 2`` =
    mean over the two print orders of P(first-printed course) - P(second),
    the pull toward the first-printed course (negative: toward the last).
    """
    rows = {}
    for item, df in forms.dropna(subset=["x"]).groupby("item_id", sort=True):
        x = df["x"].to_numpy(float)
        vs = df["var_samp"].to_numpy(float)
        noise = float(np.nanmean(vs)) if np.isfinite(vs).any() else 0.0
        var_forms = float(np.var(x, ddof=1)) if len(x) > 1 else float("nan")
        by_order = df.groupby("order")["x"].mean()
        order = (
            (by_order["cbr_first"] - by_order["anti_first"]) / 2
            if {"cbr_first", "anti_first"} <= set(by_order.index)
            else float("nan")
        )
        rows[item] = {
            "stance": float(x.mean()),
            "sigma_repro": float(np.sqrt(max(0.0, var_forms - noise))) if np.isfinite(var_forms) else float("nan"),
            "sigma_raw": float(np.sqrt(var_forms)) if np.isfinite(var_forms) else float("nan"),
            "order": float(order),
            "n_forms": len(x),
        }
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "item_id"
    return out
