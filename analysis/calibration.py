"""Readout temperature: the temperature that maps answer-slot logits to sampled frequencies.

A logit readout gives, per trial, the raw log probability ``l_j`` of each
option at the answer slot. Sampling the same model at temperature ``tau``
draws option ``j`` (among the replies that parse to an option) with
probability ``softmax_j(l_j / tau)``: the temperature divides the logits of
the whole vocabulary, and conditioning on "the reply is an option" removes
the normalizer. So if sampled counts ``n_ij`` come from a known sampling
temperature, the maximum-likelihood fit of

    P_ij(T) = softmax_j(l_ij / T)

to the counts should recover ``T = tau``. A fitted T far from the sampling
temperature says the readout and the behaviour disagree (a different prompt
rendering, server-side truncation such as top-k, a multi-token option whose
continuation the sampler did not follow). This is *not* the decisiveness
``s`` of the (s, m) fit (paper 003): that one comes from temperature-free
greedy readouts; the report shows both.

The interval is the profile-likelihood interval (likelihood-ratio test with
one degree of freedom), which, unlike a Wald interval on T, stays inside
T > 0 and is asymmetric where the likelihood is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize, special, stats

_LOG_T_RANGE = (math.log(1e-3), math.log(1e3))


@dataclass(frozen=True)
class TemperatureFit:
    """The maximum-likelihood readout temperature and its profile-likelihood interval."""

    temperature: float
    lo: float
    """Lower end of the interval (``0.0`` if the likelihood never drops enough on that side)."""
    hi: float
    """Upper end (``inf`` if the likelihood never drops enough on that side)."""
    level: float
    n_trials: int
    """Trials that carried information (at least one parsed sample and two distinct logits)."""
    n_samples: int
    loglik: float


def _arrays(
    logprobs: Sequence[Sequence[float]], counts: Sequence[Sequence[float]]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    if len(logprobs) != len(counts):
        raise ValueError(f"logprobs has {len(logprobs)} trials but counts has {len(counts)}; give one row per trial")
    ls, ns = [], []
    for i, (lrow, nrow) in enumerate(zip(logprobs, counts, strict=True)):
        lv = np.asarray(lrow, dtype=np.float64)
        nv = np.asarray(nrow, dtype=np.float64)
        if lv.shape != nv.shape or lv.ndim != 1:
            raise ValueError(f"trial {i}: {lv.size} logprobs but {nv.size} counts; give one count per option")
        if (nv < 0).any() or not np.isfinite(nv).all():
            raise ValueError(f"trial {i}: counts must be finite and >= 0, got {nrow}")
        if not np.isfinite(lv).all():
            raise ValueError(f"trial {i}: logprobs must be finite, got {lrow}")
        if nv.sum() == 0 or np.ptp(lv) == 0:
            continue  # no samples, or options the model cannot tell apart: no information about T
        ls.append(lv)
        ns.append(nv)
    return ls, ns


def temperature_loglik(temperature: float, logprobs: Sequence[np.ndarray], counts: Sequence[np.ndarray]) -> float:
    """sum_ij n_ij log softmax_j(l_ij / T)."""
    total = 0.0
    for lv, nv in zip(logprobs, counts, strict=True):
        z = lv / temperature
        total += float(np.dot(nv, z - special.logsumexp(z)))
    return total


def readout_temperature(
    logprobs: Sequence[Sequence[float]], counts: Sequence[Sequence[float]], *, level: float = 0.95
) -> TemperatureFit:
    """Fit T in ``P_ij = softmax_j(l_ij / T)`` to sampled counts by maximum likelihood.

    ``logprobs[i][j]`` is the raw answer-slot log probability of option j of
    trial i; ``counts[i][j]`` how often sampling produced option j. Trials
    without samples or with identical logits carry no information and are
    skipped. The likelihood is unimodal in log T for these models, so a
    bounded scalar search on log T in [1e-3, 1e3] finds the optimum.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    ls, ns = _arrays(logprobs, counts)
    if not ls:
        raise ValueError("no trial has both sampled answers and distinct option logprobs; nothing to fit")

    def nll(log_t: float) -> float:
        return -temperature_loglik(math.exp(log_t), ls, ns)

    res = optimize.minimize_scalar(nll, bounds=_LOG_T_RANGE, method="bounded", options={"xatol": 1e-10})
    log_t = float(res.x)
    best = -float(res.fun)
    drop = float(stats.chi2.ppf(level, df=1)) / 2

    def gap(x: float) -> float:
        return -nll(x) - (best - drop)

    lo_edge, hi_edge = _LOG_T_RANGE
    lo = math.exp(optimize.brentq(gap, lo_edge, log_t)) if gap(lo_edge) < 0 else 0.0
    hi = math.exp(optimize.brentq(gap, log_t, hi_edge)) if gap(hi_edge) < 0 else math.inf
    return TemperatureFit(
        temperature=math.exp(log_t),
        lo=lo,
        hi=hi,
        level=level,
        n_trials=len(ls),
        n_samples=int(sum(n.sum() for n in ns)),
        loglik=best,
    )


def temperature_from_frames(readout_options: pd.DataFrame, sample_options: pd.DataFrame, **kw: float) -> TemperatureFit:
    """Join a logit run's per-option table with a sampled run's counts and fit T.

    ``readout_options`` needs ``trial_id, option, logprob`` (``RunStore.load("readout_options")``);
    ``sample_options`` needs ``trial_id, option, count`` (the first frame of
    :func:`analysis.frames.sample_counts`). Trials are matched by id, so both
    runs must come from the same experiment spec.
    """
    for name, frame, cols in (
        ("readout_options", readout_options, ("trial_id", "option", "logprob")),
        ("sample_options", sample_options, ("trial_id", "option", "count")),
    ):
        missing = [c for c in cols if c not in frame.columns]
        if missing:
            raise ValueError(f"{name} lacks columns {missing}; it has {list(frame.columns)}")
    merged = readout_options[["trial_id", "option", "logprob"]].merge(
        sample_options[["trial_id", "option", "count"]], on=["trial_id", "option"], how="inner", validate="one_to_one"
    )
    if merged.empty:
        raise ValueError("the readout and sample tables share no (trial_id, option); are they runs of the same spec?")
    groups = [g for _, g in merged.sort_values(["trial_id", "option"]).groupby("trial_id", sort=True)]
    return readout_temperature(
        [g["logprob"].tolist() for g in groups], [g["count"].tolist() for g in groups], level=kw.get("level", 0.95)
    )


# --------------------------------------------------------------------------------------------------
# Relative readout temperature and the calibration summary (paper 003, SI S4; battery analysis).
# T is reported relative to the sampling temperature tau: T = fitted temperature / tau, so a sampler that
# is faithful to its answer-slot logits gives T = 1 at any tau, and tau * T is the effective temperature
# above. The decisiveness s of analysis/fit.py is a different number (temperature-free greedy readouts).


@dataclass(frozen=True)
class Calibration:
    """Readout versus sampled behaviour: the relative readout temperature T and the Pearson r of the two channels."""

    tau: float
    """The known sampling temperature of the behavioural samples."""
    T: float
    """Fitted temperature / tau: 1 when sampling at tau draws from softmax(logits / tau)."""
    T_lo: float
    T_hi: float
    effective: float
    """tau * T: the temperature that maps the readout logits to the sampled frequencies."""
    level: float
    r: float
    """Pearson r over trials between the readout probability and the sampled frequency (of ``meaning`` options)."""
    mad: float
    """Mean |readout probability - sampled frequency| over the same trials (r ignores a uniform miscalibration)."""
    mad_tempered: float
    """The same with the readout re-tempered at the fitted effective temperature (smaller when T != 1 is real)."""
    n_trials: int
    """Trials in r (with parsed samples)."""
    n_samples: int
    """Parsed samples in the temperature fit."""
    loglik: float


def calibration_table(
    readout_options: pd.DataFrame,
    sample_options: pd.DataFrame,
    *,
    meaning: str | None = "cbr",
    temperature: float = 1.0,
) -> pd.DataFrame:
    """Per trial: the readout probability and the sampled frequency of the options that mean ``meaning``.

    ``readout_options`` needs ``trial_id, option, logprob``;
    ``sample_options`` (first frame of :func:`analysis.frames.sample_counts`)
    needs ``trial_id, option, meaning, count``. The readout probability is
    ``softmax(logprob / temperature)`` over the trial's options (temperature 1
    gives the readout's own normalized probabilities). With ``meaning=None``
    every (trial, option) pair is one row instead (for instruments without a
    CBR option, e.g. graded scales). Trials without parsed samples are left out.
    """
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    for name, frame, cols in (
        ("readout_options", readout_options, ("trial_id", "option", "logprob")),
        ("sample_options", sample_options, ("trial_id", "option", "meaning", "count")),
    ):
        missing = [c for c in cols if c not in frame.columns]
        if missing:
            raise ValueError(f"{name} lacks columns {missing}; it has {list(frame.columns)}")
    m = readout_options[["trial_id", "option", "logprob"]].merge(
        sample_options[["trial_id", "option", "meaning", "count"]],
        on=["trial_id", "option"],
        how="inner",
        validate="one_to_one",
    )
    z = m["logprob"] / temperature
    z = z - z.groupby(m["trial_id"]).transform("max")
    m["p_readout"] = np.exp(z) / np.exp(z).groupby(m["trial_id"]).transform("sum")
    m["n"] = m.groupby("trial_id")["count"].transform("sum")
    m = m[m["n"] > 0]
    if meaning is None:
        out = m[["trial_id", "option", "p_readout", "count", "n"]].copy()
        out["p_sampled"] = out["count"] / out["n"]
        return out.drop(columns="count").reset_index(drop=True)
    sel = m[m["meaning"] == meaning]
    if sel.empty:
        raise ValueError(f"no sampled trial has an option meaning {meaning!r}; pass meaning=None for all options")
    g = sel.groupby("trial_id", sort=True)
    out = pd.DataFrame(
        {"p_readout": g["p_readout"].sum(), "p_sampled": g["count"].sum() / g["n"].first(), "n": g["n"].first()}
    )
    return out.reset_index()


def calibrate(
    readout_options: pd.DataFrame,
    sample_options: pd.DataFrame,
    tau: float,
    *,
    level: float = 0.95,
    meaning: str | None = "cbr",
) -> Calibration:
    """Fit the readout temperature (relative to ``tau``) and summarize readout-vs-behaviour agreement.

    The temperature is fitted on every option of every sampled trial
    (:func:`temperature_from_frames`); r uses :func:`calibration_table`.
    """
    if not (tau > 0 and math.isfinite(tau)):
        raise ValueError(f"tau must be the finite sampling temperature > 0 of the samples, got {tau} (greedy has no T)")
    fit = temperature_from_frames(readout_options, sample_options, level=level)
    table = calibration_table(readout_options, sample_options, meaning=meaning)
    tempered = calibration_table(readout_options, sample_options, meaning=meaning, temperature=fit.temperature)

    def _r(t: pd.DataFrame) -> float:
        if len(t) < 3 or t["p_readout"].std() == 0 or t["p_sampled"].std() == 0:
            return float("nan")
        return float(stats.pearsonr(t["p_readout"], t["p_sampled"]).statistic)

    return Calibration(
        tau=tau,
        T=fit.temperature / tau,
        T_lo=fit.lo / tau,
        T_hi=fit.hi / tau,
        effective=fit.temperature,
        level=level,
        r=_r(table),
        mad=float((table["p_readout"] - table["p_sampled"]).abs().mean()),
        mad_tempered=float((tempered["p_readout"] - tempered["p_sampled"]).abs().mean()),
        n_trials=len(table) if meaning is not None else int(table["trial_id"].nunique()),
        n_samples=fit.n_samples,
        loglik=fit.loglik,
    )
