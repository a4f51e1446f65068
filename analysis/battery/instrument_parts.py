"""The per-instrument parts of the battery report (paper 003), each computed once from the run's frames.

The salt noise (:func:`compute_salt`), the graded stance I-1 (:func:`compute_graded`), the forced-binary
verb flip I-3 (:func:`compute_verbflip`), the label map (:func:`compute_labelmap`), the free choice I-2
(:func:`compute_choice`), the (s, m) fits (:func:`compute_fits`) and the readout temperature
(:func:`compute_calibration`, a part of the yes/no report too). Each returns a
:class:`~analysis.common.results.Part`: its value, the line saying its instrument is absent, or the
NotComputed it raised. :mod:`analysis.battery.results` gathers them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analysis.battery.binary import cell_events, incomplete_stories, lexicality_gradient, projections
from analysis.battery.calibration import TemperatureRow
from analysis.battery.fit import N_BOOT, SEED
from analysis.battery.frames import Frames, corpus_form_order
from analysis.battery.run_fits import RunFits
from analysis.battery.yesno import CELLS, Dropped, Resampling, decompose
from analysis.common.results import Part, attempt
from probe.errors import NotComputed
from probe.record import Manifest, Plan
from probe.types import Trial


def _with_mean(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a last row ``mean``: the mean of each numeric column over the rows (the items)."""
    out = df.copy()
    out.loc["mean"] = df.mean(numeric_only=True)
    return out


# ------------------------------------------------------------------- parts
@dataclass(frozen=True)
class Salt:
    """I-1 under salts: the salt floor and the salt invariance of the graded forms (:func:`compute_salt`)."""

    floor: Any
    """:class:`analysis.battery.stance.SaltFloor` of the unipolar forms."""
    invariance: Any
    """:class:`analysis.battery.stance.SaltInvariance`."""


def compute_salt(trials: pd.DataFrame, graded: pd.DataFrame) -> Part[Salt]:
    """The salt floor and invariance of the graded trials; absent without a salted replicate."""
    from analysis.battery import stance

    if not (trials["replicate"] > 0).any():
        return Part(absent="No salted replicates.")
    floor = stance.salt_floor(stance.salt_spread(graded[~graded["bipolar"]], "mean_x", stance.FORM))
    return Part(Salt(floor, stance.salt_invariance(graded)))


@dataclass(frozen=True)
class Graded:
    """I-1: theta per dilemma and its cross-form incoherence (:func:`compute_graded`)."""

    fallback: pd.DataFrame
    """The forms whose value is not the unsalted replicate's (every draw refused there)."""
    empty_forms: pd.DataFrame
    """The forms with no usable answer in any replicate (left out)."""
    theta: pd.Series
    gen: Any
    table: pd.DataFrame
    """Per dilemma (index ``dilemma``): theta, its spread components, n_forms, theta_mode and the bipolar contrast."""
    summary: pd.DataFrame
    """``table`` without n_forms, with the mean over dilemmas as a last row (the Markdown table)."""
    n_forms: int
    """The median number of unipolar forms per dilemma."""
    bipolar: Any
    pooled: Any
    salt: Part[Salt]
    """The salt diagnostics; a NotComputed there leaves theta and the other parts standing."""


def compute_graded(f: Frames) -> Part[Graded]:
    """Theta per dilemma, its incoherence and components, G and the bipolar contrast, from the graded trials."""
    from analysis.battery import stance

    g = f.instrument("graded")
    if g.empty:
        return Part(absent="Not in this run (instrument graded).")
    opts = f.options[f.options["trial_id"].isin(g["trial_id"])]
    gt = stance.graded_trials(opts, g, f.source)  # type: ignore[arg-type]
    forms = stance.per_form(gt)
    fallback = forms[forms["value_from"] != "unsalted"]
    empty_forms = stance.unusable_forms(gt)
    th = stance.theta(forms)
    if th.empty:
        return Part(absent="No unipolar (0-10, 0-100) forms in this run: theta needs them.")
    inc = stance.incoherence(forms)
    gen = stance.generalizability(inc)
    th_mode = stance.theta(stance.per_form(gt, value="mode")).rename("theta_mode")
    table = inc[["theta", "sigma_repro", "sigma_dir", "sigma_scale", "n_forms"]].join(th_mode)
    bipolar = None
    if forms["bipolar"].any():
        contrast = stance.bipolar_contrast(forms)
        table = table.join(contrast[["theta_bipolar", "contrast"]])
        with contextlib.suppress(NotComputed):
            bipolar = stance.bipolar_summary(contrast)
    pooled = stance.pooled_incoherence(inc)
    table = table.rename_axis("dilemma")
    summary = _with_mean(table.drop(columns=["n_forms"]))
    n_forms = int(inc["n_forms"].median())
    salt = attempt(compute_salt, g, gt)
    return Part(Graded(fallback, empty_forms, th, gen, table, summary, n_forms, bipolar, pooled, salt))


@dataclass(frozen=True)
class VerbFlip:
    """I-3, the yes/no verb flip: the four cells per story and their decomposition (:func:`compute_verbflip`)."""

    dec: pd.DataFrame
    """Per story: z, lexical, order, apparent; stories with an empty cell are left out (in the part's
    ``dropped``)."""
    table: pd.DataFrame
    """Per story (index ``dilemma``): mean P(CBR) in each (verb, order) cell, ``p_cbr_<verb>_<order>``, the
    decomposition and its spread across the forms sigma_<q>, with the mean over stories as a last row."""
    bars: pd.DataFrame
    """Per story: order, lexical and apparent, with the mean as a last row (the figure)."""
    ci: pd.DataFrame
    """The story-averaged z, lexical, order and apparent with their bootstrap CIs."""
    identity: float
    """The largest |apparent - order - lexical| over the stories (round-off)."""
    n_forms: int
    parity: pd.DataFrame | None
    """The decomposition on the even and the odd forms in corpus order (index ``dilemma``); None when not computed."""
    resampling: Resampling | None
    """The resampling diagnostics of a sampled run; None for a readout run or when not computed."""


def compute_verbflip(f: Frames) -> Part[VerbFlip]:
    """The per-story cells of the yes/no verb flip and their decomposition (Eq. 1), its spread across the forms,
    the form-parity split, the story-averaged CIs and (sampled runs) the resampling diagnostics."""
    b = f.instrument("binary")
    b = b[(b["labels"] == "Yes/No") & (b["replicate"] == 0)] if len(b) else b
    if b.empty:
        return Part(absent="Not in this run (instrument binary, labels Yes/No).")
    from analysis.battery.yesno import (
        empty_cells,
        form_decomposition,
        i3_incoherence,
        p_cbr,
        parity_split,
        resampling_diagnostics,
        story_mean_ci,
        trial_variance,
    )
    from experiments.battery import BatterySpec

    pc = p_cbr(f.options)
    df = b.join(pc, on="trial_id")
    cells = df.groupby(["item_id", "verb", "order"])["p_cbr"].mean().unstack(["verb", "order"])
    missing = [c for c in CELLS if c not in cells.columns]
    if missing:
        return Part(absent=f"Cells missing from the run: {missing}.")
    cells = cells[CELLS]
    cells.columns = [f"p_cbr_{v}_{o}" for v, o in CELLS]
    dropped = empty_cells(df, ["verb", "order"], "yes/no verb flip")
    try:
        cells = cells.drop(index=[d.item_id for d in dropped]).dropna()
        dec = decompose(cells)
    except NotComputed as e:
        return Part(error=e, dropped=dropped)
    yn = f.instrument("binary")
    yn = yn[yn["labels"] == "Yes/No"].assign(cbr_verb=lambda d: d["verb"])
    forms = form_decomposition(yn, pc, trial_variance(f.options))
    spread = i3_incoherence(forms[forms.index.get_level_values("item_id").isin(dec.index)])
    order_of_forms = corpus_form_order(f.manifest.spec_as(BatterySpec).corpus, set(yn["form"]))
    parity = None
    if len(order_of_forms) >= 2:
        with contextlib.suppress(NotComputed):
            split = parity_split(yn[yn["item_id"].isin(dec.index)], pc, order_of_forms)
            parity = split.rename_axis("dilemma")
    table = _with_mean(cells.join(dec).join(spread.drop(columns="n_forms"))).rename_axis("dilemma")
    ci = story_mean_ci(dec[["z", "lexical", "order", "apparent"]], n_boot=N_BOOT, seed=SEED)
    bars = _with_mean(dec[["order", "lexical", "apparent"]])
    identity = float((dec["apparent"] - dec["order"] - dec["lexical"]).abs().max())
    resampling = None
    if f.source == "samples":
        with contextlib.suppress(NotComputed):
            resampling = resampling_diagnostics(yn, f.options)
    vf = VerbFlip(dec, table, bars, ci, identity, b["form"].nunique(), parity, resampling)
    return Part(vf, dropped=dropped)


@dataclass(frozen=True)
class LabelMap:
    """I-3, the label pairs: projections, the lexicality gradient of the label pull, m_label (:func:`compute_labelmap`)."""

    pulls: pd.DataFrame
    gradient: pd.DataFrame
    """Per label pair (index ``label pair``): order, label pull, logic with CIs, n_dropped and (with theta)
    m_label."""
    contrast: float
    contrast_all: float
    incomplete: tuple[Dropped, ...]
    n_left: pd.Series
    clipped: list[str]
    """Pairs whose per-pair fit is clip-limited (no m_label shown)."""


def compute_labelmap(f: Frames, theta: pd.Series | None) -> Part[LabelMap]:
    """Order / logic / label projections per label pair, the lexicality gradient, and m_label with ``theta``."""
    from analysis.battery import fit, joint_fit
    from analysis.battery.binary import label_pull
    from analysis.battery.yesno import story_mean_ci
    from experiments.battery import BatterySpec, load_corpus

    b = f.instrument("binary")
    b = b[(b["labels"] != "Yes/No") & (b["replicate"] == 0)] if len(b) else b
    if b.empty:
        return Part(absent="Not in this run (no label pairs beyond Yes/No).")
    corpus = load_corpus(f.manifest.spec_as(BatterySpec).corpus)
    labels = corpus["binary"]["labels"]
    cb = {k for k, v in labels.items() if v.get("counterbalance")}
    events = cell_events(b, f.options)
    proj = projections(events, cb)
    incomplete = incomplete_stories(events)
    try:
        if proj.empty:
            raise NotComputed(
                f"no story has every cell of any label pair usable ({len(incomplete)} story-pairs left out)"
            )
        lex = {k: int(v.get("lexicality", -1)) for k, v in labels.items()}
        by_pair, contrast = lexicality_gradient(proj, lex)
        _, contrast_all = lexicality_gradient(proj, lex, include_uncrossed=True)
        n_left = pd.Series([d.analysis.removeprefix("label map: ") for d in incomplete], dtype=object).value_counts()
        by_pair["n_dropped"] = n_left.reindex(by_pair.index).fillna(0).astype(int)
        pulls = label_pull(proj)
        for col in ("order", "label_pull", "logic"):
            wide = pulls[col].unstack("labels")
            ci = story_mean_ci(wide, n_boot=N_BOOT, seed=SEED)
            by_pair[f"{col}_lo"], by_pair[f"{col}_hi"] = ci["lo"], ci["hi"]
        clipped: list[str] = []
        if theta is not None:
            bt = fit.binary_trials(f.options[f.options["trial_id"].isin(b["trial_id"])], b)
            m_label = {}
            for pair in by_pair.index:
                try:
                    pf = joint_fit.fit_pair(theta, bt, str(pair), n_boot=0)
                except NotComputed:
                    continue
                if "label" not in pf.channels:
                    continue
                if pf.clip_limited:  # saturated or at a bound: its m is not a pull in theta units
                    clipped.append(str(pair))
                    continue
                m_label[pair] = pf.m[pf.channels.index("label")]
            by_pair["m_label"] = pd.Series(m_label, dtype=float)
    except NotComputed as e:
        return Part(error=e, dropped=incomplete)
    gradient = by_pair.rename_axis("label pair")
    return Part(LabelMap(pulls, gradient, contrast, contrast_all, incomplete, n_left, clipped), dropped=incomplete)


@dataclass(frozen=True)
class Choice:
    """I-2, free choice: the judged replies and the per-dilemma verdict shares (:func:`compute_choice`)."""

    replies: pd.DataFrame
    """The judged replies (one row each) with their dilemma, framing, print order and replicate."""
    per_item: pd.DataFrame
    """Per dilemma (index ``dilemma``): P(PRO), P(ANTI), P(NONCOMMIT), the stance, sigma_repro, sigma_raw and the
    order pull."""
    stance: pd.Series
    """P(PRO) - P(ANTI) per dilemma."""
    summary: pd.DataFrame
    """``per_item`` with the mean over dilemmas as a last row (the Markdown table)."""
    order_ci: pd.Series
    """The story-averaged order pull: mean, lo, hi, n (bootstrap over dilemmas)."""


def compute_choice(f: Frames) -> Part[Choice]:
    """P(PRO), P(ANTI), P(NONCOMMIT) per dilemma, the choice stance, its spread across the forms and the
    story-averaged order pull."""
    j = f.judgments
    if j.empty:
        return Part(absent="Not in this run (instrument choice, or no judge).")
    from analysis.battery import stance
    from analysis.battery.yesno import story_mean_ci

    cols = ["item_id", "framing", "order", "replicate"]
    meta = f.meta[f.meta["instrument"] == "choice"].set_index("trial_id")[cols]
    d = j.join(meta, on="trial_id")
    per_item = d.groupby("item_id")[["p_pro", "p_anti", "p_noncommit"]].mean()
    per_item["stance"] = per_item["p_pro"] - per_item["p_anti"]
    inc = stance.choice_incoherence(stance.choice_forms(d.reset_index(drop=True)))
    per_item = per_item.join(inc[["sigma_repro", "sigma_raw", "order"]])
    order_ci = story_mean_ci(per_item[["order"]], n_boot=N_BOOT, seed=SEED).loc["order"]
    per_item = per_item.rename_axis("dilemma")
    return Part(Choice(d, per_item, per_item["stance"], _with_mean(per_item), order_ci))


@dataclass(frozen=True)
class Fits:
    """The (s, m) fits with theta from I-1 (:func:`compute_fits`)."""

    binary: pd.DataFrame
    """The forced-binary trials (:func:`analysis.battery.fit.binary_trials`)."""
    run: RunFits
    sides: Mapping[str, pd.DataFrame]
    """Per fitted channel whose sides can be read: per dilemma p+, p-, z, bias and theta (the bowtie figure)."""


def compute_fits(f: Frames, theta: pd.Series | None) -> Part[Fits]:
    """The (s, m) fit per channel and per label family against ``theta`` (:func:`analysis.battery.run_fits.fit_run`),
    and each fitted channel's sides beside theta."""
    from analysis.battery import fit, run_fits

    b = f.instrument("binary")
    if theta is None or b.empty:
        return Part(absent="Needs the graded and binary instruments.")
    bt = fit.binary_trials(f.options[f.options["trial_id"].isin(b["trial_id"])], b)
    cf = run_fits.fit_run(theta, bt, n_boot=N_BOOT, seed=SEED)
    sides = {}
    for ch in [] if cf.fits is None else cf.fits.index:
        try:
            sides[ch] = fit.channel_sides(bt, ch).join(theta, how="inner")
        except NotComputed:
            continue
    return Part(Fits(bt, cf, sides), dropped=cf.dropped)


@dataclass(frozen=True)
class ReadoutTemperature:
    """The readout temperature T per instrument and the parse rules of the samples (:func:`compute_calibration`)."""

    counts: pd.DataFrame
    """How many draws each parse rule decided, per instrument (:func:`analysis.battery.calibration.rule_counts`)."""
    why: str | None = None
    """Why no temperature was fitted (no readouts, greedy samples); None when it was."""
    tau: float = float("nan")
    """The sampling temperature."""
    rows: tuple[TemperatureRow, ...] = ()
    """T per instrument and pooled, at the slot and on all parsed answers, the headline instrument first."""
    table: pd.DataFrame | None = None
    """``rows`` as a table (:func:`analysis.battery.calibration.temperature_table`)."""
    points: pd.DataFrame | None = None
    """Per trial of the headline instrument: readout vs sampled probability; None when its T was not fitted."""


def compute_calibration(
    samples: pd.DataFrame, readout_options: pd.DataFrame, trials: Sequence[Trial], manifest: Manifest
) -> Part[ReadoutTemperature]:
    """The parse rules of the samples and the readout temperature T per instrument (at the slot and on all parsed
    answers), with the headline instrument's readout-vs-sampled points."""
    from analysis.battery.calibration import (
        calibrate_by_instrument,
        calibration_table,
        rule_counts,
        sample_rules,
        temperature_table,
    )
    from probe.views import count_samples

    if samples.empty:
        return Part(absent="Needs --samples N (and readouts, from a logit engine).")
    rules = sample_rules(samples, trials, think=manifest.think)
    counts = rule_counts(rules, trials)
    if readout_options.empty:
        return Part(ReadoutTemperature(counts, "Needs readouts beside the samples (a logit engine)."))
    tau = (manifest.plan or Plan()).temperature  # no plan: Plan's default
    if tau <= 0:
        return Part(ReadoutTemperature(counts, "Samples were greedy (temperature 0): no temperature to fit.", tau))
    rows = calibrate_by_instrument(readout_options, samples, trials, tau, think=manifest.think, rules=rules)
    head = rows[0].instrument
    head_ids = {t.trial_id for t in trials if str(t.factors.get("instrument", "all")) == head}
    sopts = count_samples(samples[samples["trial_id"].isin(head_ids)], trials)[0]
    by = {(r.instrument, r.answers): r for r in rows}
    points = None
    if by[(head, "all")].calibration is not None:
        points = calibration_table(readout_options, sopts, meaning="cbr" if "cbr" in set(sopts["meaning"]) else None)
    return Part(ReadoutTemperature(counts, None, tau, rows, temperature_table(rows), points))
