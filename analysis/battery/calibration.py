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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import optimize, special, stats

from analysis.common.bootstrap import check_bootstrap
from analysis.common.records import Record
from probe.errors import NotComputed
from probe.parse import parse_answer
from probe.types import Trial

if TYPE_CHECKING:
    from probe.runs import Run

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
    return _Blocks.of(logprobs, counts).loglik(temperature)


@dataclass(frozen=True)
class _Blocks:
    """The trials of a likelihood stacked by option count, so that each log-sum-exp is one call over a block.

    The fit evaluates the likelihood a few hundred times; a call of ``logsumexp`` per trial and evaluation cost
    seconds a report (339,240 calls for the battery's six calibrations). Each trial's term, and the order they are
    added in, are those of the trial-by-trial sum: the same float, bit for bit (``tests/test_calibration.py``).
    """

    rows: tuple[tuple[int, int], ...]
    """Per trial, in the given order: (block, row within it)."""
    logprobs: tuple[np.ndarray, ...]
    counts: tuple[np.ndarray, ...]

    @staticmethod
    def of(logprobs: Sequence[np.ndarray], counts: Sequence[np.ndarray]) -> _Blocks:
        blocks: list[list[int]] = []  # the trials of each option count, in order of first appearance
        block_of: dict[int, int] = {}
        rows = []
        for i, lv in enumerate(logprobs):
            b = block_of.setdefault(len(lv), len(blocks))
            if b == len(blocks):
                blocks.append([])
            rows.append((b, len(blocks[b])))
            blocks[b].append(i)
        return _Blocks(
            tuple(rows),
            tuple(np.stack([np.asarray(logprobs[i], dtype=np.float64) for i in m]) for m in blocks),
            tuple(np.stack([np.asarray(counts[i], dtype=np.float64) for i in m]) for m in blocks),
        )

    def loglik(self, temperature: float) -> float:
        zs = [lv / temperature for lv in self.logprobs]
        lses = [special.logsumexp(z, axis=1) for z in zs]
        total = 0.0
        for b, r in self.rows:
            total += float(np.dot(self.counts[b][r], zs[b][r] - lses[b][r]))
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
    check_bootstrap(level)
    ls, ns = _arrays(logprobs, counts)
    if not ls:
        raise NotComputed("no trial has both sampled answers and distinct option logprobs; nothing to fit")

    blocks = _Blocks.of(ls, ns)

    def nll(log_t: float) -> float:
        return -blocks.loglik(math.exp(log_t))

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
    :meth:`probe.runs.Run.sample_counts`). Trials are matched by id, so both
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
        raise NotComputed("the readout and sample tables share no (trial_id, option); are they runs of the same spec?")
    groups = [g for _, g in merged.sort_values(["trial_id", "option"]).groupby("trial_id", sort=True)]
    return readout_temperature(
        [g["logprob"].tolist() for g in groups], [g["count"].tolist() for g in groups], level=kw.get("level", 0.95)
    )


# --------------------------------------------------------------------------------------------------
# Relative readout temperature and the calibration summary (paper 003, SI S4; battery analysis).
# T is reported relative to the sampling temperature tau: T = fitted temperature / tau, so a sampler that
# is faithful to its answer-slot logits gives T = 1 at any tau, and tau * T is the effective temperature
# above. The decisiveness s of analysis/battery/fit.py is a different number (temperature-free greedy readouts).


@dataclass(frozen=True)
class Calibration(Record):
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
    ``sample_options`` (first frame of :meth:`probe.runs.Run.sample_counts`)
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
        raise NotComputed(f"no sampled trial has an option meaning {meaning!r}; pass meaning=None for all options")
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


# --------------------------------------------------------------------------------------------------
# Which answers the temperature is fitted on, and per instrument (issue 27, items E and F).
# The readout reads the answer slot: the first tokens of the reply. A sampled reply parsed by the
# standalone rule ("Tantamount to one yes. You" reads Yes) found its answer somewhere else, so its
# frequency is a different quantity from the slot's distribution. The calibration therefore fits T
# twice per instrument: on the answers given at the slot (the check that sampling and readout agree)
# and on every parsed answer (how well the readout predicts behaviour).

RULES: tuple[str, ...] = ("exact", "stated", "standalone", "refusal", "invalid")
"""The parse rules of :func:`probe.parse.parse_answer`, in the order they are tried (``none`` reads ``invalid``)."""

ANSWER_SETS: tuple[str, ...] = ("slot", "all")
"""``slot``: answers given at the slot (rule ``exact``); ``all``: every parsed answer (status ``ok``)."""

INSTRUMENT_ORDER: tuple[str, ...] = ("binary", "choice", "graded")
"""Report order: the forced binary first (the paper's T calibrates the binary choice probability)."""

POOLED = "pooled"


def sample_rules(
    samples: pd.DataFrame, trials: Sequence[Trial] | Mapping[str, Sequence[str]], *, think: bool
) -> pd.DataFrame:
    """Per stored draw: the parse rule that decided it, recomputed from its text and its trial's options.

    The samples table keeps the parsed option and status, not the rule, so the
    rule is recomputed with today's parser exactly as the run parsed it
    (:func:`probe.parse.parse_answer` with ``forced=True``: readout trials ask for one of
    their options, so a reply is parsed up to where its answer ends; ``think``:
    the run's think mode, :func:`probe.panel.run_reasoning`, which decides whether
    a ``</think>`` with no ``<think>`` ends reasoning or is a stray token in the
    answer, so outside think mode such a reply is not an answer at the slot). Returns
    ``trial_id, draw, rule, slot_option, agrees``: ``rule`` is one of
    :data:`RULES` (or ``error`` for an engine error, which has no text to parse);
    ``slot_option`` is the option answered at the slot (rule ``exact``: the
    reply's first sentence, markup and punctuation stripped, is exactly one
    option), else None; ``agrees`` says whether the recomputed option and
    status equal the stored ones (False for draws of a run parsed by an older parser).
    ``trials``: the run's trials, or their options by trial id.
    """
    need = ("trial_id", "option", "status", "text")
    missing = [c for c in need if c not in samples.columns]
    if missing:
        raise ValueError(f"samples lacks columns {missing}; it has {list(samples.columns)} (RunStore.load('samples'))")
    by_id = _options_of(trials)
    unknown = sorted(set(samples["trial_id"]) - set(by_id))
    if unknown:
        raise ValueError(f"{len(unknown)} sampled trial ids are not among the run's trials (e.g. {unknown[0]!r})")
    rules: list[str] = []
    slots: list[str | None] = []
    agrees: list[bool] = []
    for tid, text, option, status in zip(
        samples["trial_id"], samples["text"], samples["option"], samples["status"], strict=True
    ):
        if status == "error":
            rules.append("error")
            slots.append(None)
            agrees.append(True)
            continue
        p = parse_answer(str(text), by_id[tid], think=think, forced=True)
        rule = "invalid" if p.rule == "none" else p.rule
        rules.append(rule)
        slots.append(p.option if rule == "exact" else None)
        stored = None if option is None or (isinstance(option, float) and math.isnan(option)) else option
        agrees.append(p.status == status and p.option == stored)
    draw = samples["draw"] if "draw" in samples.columns else pd.Series(range(len(samples)), index=samples.index)
    return pd.DataFrame(
        {
            "trial_id": samples["trial_id"].to_numpy(),
            "draw": draw.to_numpy(),
            "rule": rules,
            "slot_option": slots,
            "agrees": agrees,
        }
    )


def _options_of(trials: Sequence[Trial] | Mapping[str, Sequence[str]]) -> Mapping[str, Sequence[str]]:
    return trials if isinstance(trials, Mapping) else {t.trial_id: t.options for t in trials}


def _instrument_of(trials: Sequence[Trial] | Mapping[str, str]) -> Mapping[str, str]:
    """trial id -> instrument factor (``all`` for experiments without one, e.g. ``probe run yesno``)."""
    if isinstance(trials, Mapping):
        return trials
    return {t.trial_id: str(t.factors.get("instrument", "all")) for t in trials}


def _instrument_names(present: set[str]) -> list[str]:
    return [i for i in INSTRUMENT_ORDER if i in present] + sorted(present - set(INSTRUMENT_ORDER))


def rule_counts(rules: pd.DataFrame, trials: Sequence[Trial] | Mapping[str, str]) -> pd.DataFrame:
    """How many draws each parse rule decided, per instrument (rows) and in total (row ``all``).

    ``rules`` is :func:`sample_rules`'s frame. Columns: :data:`RULES` in order,
    ``error`` (engine errors), ``n`` (all draws) and ``disagree`` (draws whose
    stored parse differs from today's parser; 0 for a run parsed by it). ``trials``: the run's
    trials, or the instrument of each trial id (any grouping; a draw of an unlisted trial counts as ``other``).
    """
    inst = _instrument_of(trials)
    frame = rules.assign(instrument=rules["trial_id"].map(inst).fillna("other"))
    names = _instrument_names(set(frame["instrument"]))
    counts = frame.groupby(["instrument", "rule"]).size().unstack(fill_value=0)
    out = counts.reindex(index=names, columns=[*RULES, "error"], fill_value=0)
    out["n"] = out.sum(axis=1)
    out["disagree"] = (~frame["agrees"]).groupby(frame["instrument"]).sum().reindex(names, fill_value=0)
    if len(names) > 1:
        out.loc["all"] = out.sum(axis=0)
    out.index.name = "instrument"
    return out.astype(int)


def answers_at(samples: pd.DataFrame, rules: pd.DataFrame, answers: str) -> pd.DataFrame:
    """The samples a temperature is fitted on: ``all`` (as stored) or ``slot`` (only slot answers, status ok).

    ``rules`` is :func:`sample_rules` of the same ``samples`` (row for row).
    """
    if answers not in ANSWER_SETS:
        raise ValueError(f"answers must be one of {list(ANSWER_SETS)}, got {answers!r}")
    if len(rules) != len(samples):
        raise ValueError(f"rules has {len(rules)} rows but samples has {len(samples)}; pass sample_rules(samples, ...)")
    if answers == "all":
        return samples
    at = rules["slot_option"].notna().to_numpy()
    return samples.loc[at].assign(option=rules.loc[at, "slot_option"].to_numpy(), status="ok")


@dataclass(frozen=True)
class TemperatureRow:
    """One readout temperature of the report: one instrument (or ``pooled``), one answer set."""

    instrument: str
    answers: str
    """``slot`` or ``all`` (:data:`ANSWER_SETS`)."""
    calibration: Calibration | None
    """None when nothing could be fitted (``reason`` says why)."""
    reason: str = ""
    n_trials: int = 0
    """Trials with at least one answer in this answer set (``calibration.n_trials`` counts the trials in r)."""

    @property
    def excludes_one(self) -> bool:
        c = self.calibration
        return c is not None and not c.T_lo <= 1.0 <= c.T_hi


def calibrate_by_instrument(
    readout_options: pd.DataFrame,
    samples: pd.DataFrame,
    trials: Sequence[Trial],
    tau: float,
    *,
    think: bool,
    level: float = 0.95,
    rules: pd.DataFrame | None = None,
) -> tuple[TemperatureRow, ...]:
    """T per instrument and pooled, each on the answers at the slot and on all parsed answers.

    Rows come instrument by instrument (:data:`INSTRUMENT_ORDER`, the forced
    binary first), then ``pooled`` (every instrument together, the report's
    former single T); within each, ``slot`` before ``all``. Each is
    :func:`calibrate` on that instrument's trials, ``meaning="cbr"`` where the
    instrument has a CBR option (r and mad over trials' P(CBR)), else every
    option. ``rules``: :func:`sample_rules` of ``samples`` if already computed
    (else computed in the run's think mode ``think``).
    """
    from probe.views import count_samples

    if rules is None:
        rules = sample_rules(samples, trials, think=think)
    inst = _instrument_of(trials)
    sampled = set(samples["trial_id"])
    names = _instrument_names({inst[t] for t in sampled if t in inst})
    groups = [(n, {t for t in sampled if inst.get(t) == n}) for n in names]
    if len(names) > 1:
        groups.append((POOLED, sampled))
    rows = []
    for name, ids in groups:
        mine = samples["trial_id"].isin(ids).to_numpy()
        s_inst, r_inst = samples.loc[mine].reset_index(drop=True), rules.loc[mine].reset_index(drop=True)
        ro = readout_options[readout_options["trial_id"].isin(ids)]
        for answers in ANSWER_SETS:
            chosen = answers_at(s_inst, r_inst, answers)
            label = "answers at the slot" if answers == "slot" else "parsed answers"
            if not (chosen["status"] == "ok").any():
                rows.append(TemperatureRow(name, answers, None, f"no {label}"))
                continue
            sopts = count_samples(chosen, trials)[0]
            meaning = "cbr" if "cbr" in set(sopts["meaning"]) else None
            try:
                cal = calibrate(ro, sopts, tau, level=level, meaning=meaning)
            except NotComputed as e:
                rows.append(TemperatureRow(name, answers, None, str(e)))
                continue
            n_trials = int(chosen.loc[chosen["status"] == "ok", "trial_id"].nunique())
            rows.append(TemperatureRow(name, answers, cal, n_trials=n_trials))
    return tuple(rows)


def run_temperature(run: Run) -> pd.DataFrame:
    """The readout temperature table of a run with readouts and samples, fitted on the trials that have both
    (:func:`calibrate_by_instrument`, at the slot and on all parsed answers): the influence and cue reports' line
    beside their side-by-side sources. A row with only a ``note`` where the samples were greedy."""
    man = run.manifest
    assert man.plan is not None, "a run with samples records its plan"
    tau = float(man.plan.temperature)
    if not tau > 0:
        return pd.DataFrame([{"instrument": "all", "answers": "all", "note": "greedy samples: no temperature to fit"}])
    rows = calibrate_by_instrument(
        run.load("readout_options"), run.load("samples"), run.trial_list, tau, think=bool(man.think)
    )
    return temperature_table(rows)


def temperature_lines(table: pd.DataFrame) -> list[str]:
    """One Markdown bullet per answer set of :func:`run_temperature`'s table."""
    lines = []
    for row in table.to_dict("records"):
        what = "answers at the slot" if row.get("answers") == "slot" else "all parsed answers"
        note = row.get("note")
        note = note if isinstance(note, str) and note else ""
        if pd.notna(row.get("T", math.nan)):
            lines.append(
                f"- readout temperature, {what}: T = {row['T']:.3f} [{row['T_lo']:.3f}, {row['T_hi']:.3f}] "
                f"({int(row['n_samples'])} answers, {int(row['n_trials'])} trials)" + (f"; {note}" if note else "")
            )
        else:
            lines.append(f"- readout temperature, {what}: not fitted ({note})")
    return lines


def temperature_table(rows: Sequence[TemperatureRow]) -> pd.DataFrame:
    """The rows of :func:`calibrate_by_instrument` as a table (one line per instrument and answer set)."""
    out = []
    for row in rows:
        c = row.calibration
        rec: dict[str, object] = {"instrument": row.instrument, "answers": row.answers}
        if c is None:
            rec.update(note=row.reason)
        else:
            rec |= c.pick("T", "T_lo", "T_hi", "level", "n_samples")
            rec |= {"n_trials": row.n_trials, "n_trials_r": c.n_trials}
            rec |= c.pick("r", "mad", "mad_tempered")
            rec["note"] = "interval excludes 1" if row.excludes_one else ""
        out.append(rec)
    cols = ["instrument", "answers", "T", "T_lo", "T_hi", "level", "n_samples", "n_trials", "n_trials_r", "r", "mad",
            "mad_tempered", "note"]  # fmt: skip
    return pd.DataFrame(out).reindex(columns=cols)


def rule_count_line(
    samples: pd.DataFrame, options: Mapping[str, Sequence[str]], instrument: Mapping[str, str], *, think: bool
) -> str:
    """One Markdown bullet for every sampled report: the draws each parse rule decided, per instrument (``think``:
    the run's think mode, as in :func:`sample_rules`)."""
    counts = rule_counts(sample_rules(samples, options, think=think), instrument)
    cols = [c for c in (*RULES, "error") if c != "error" or counts[c].any()]
    parts = [
        f"{g} " + ", ".join(f"{c} {int(row[c])}" for c in cols) + f" of {int(row['n'])}" for g, row in counts.iterrows()
    ]
    stale = int(counts["disagree"].iloc[-1])
    return (
        "- parse rules of the sampled answers (exact: the reply's first sentence is one option, i.e. at the slot; "
        "stated: 'Answer: X'; standalone: one option found anywhere in the reply): "
        + "; ".join(parts)
        + (f"; {stale} stored answers differ from today's parser" if stale else "")
    )
