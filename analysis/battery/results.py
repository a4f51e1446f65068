"""The computed parts of the battery report (paper 003): what its sections show, each computed once.

Computation apart from presentation (scikit-learn's estimators compute, its
Displays only draw): :func:`battery_results` reads the run's :class:`Frames`
and computes every part of :mod:`analysis.battery.report` once, each a
function of named inputs (the graded stance theta feeds the label map and
the (s, m) fit, whose loop :func:`analysis.battery.fit.fit_run` ``probe
compare`` shares), into a frozen :class:`BatteryResults`. A part is its value,
or the line saying its instrument is absent, or the NotComputed it raised
(its section then says why), with the stories it left out either way.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analysis.battery.binary import cell_events, incomplete_stories, lexicality_gradient, projections
from analysis.battery.fit import N_BOOT, SEED, RunFits
from analysis.battery.yesno import CELLS, Dropped, decompose
from analysis.common.results import Part, attempt
from probe.errors import NotComputed
from probe.record import Manifest
from probe.runs import Run


@dataclass(frozen=True)
class Frames:
    """What every part of the report reads: the run's frames."""

    options: pd.DataFrame
    per_trial: pd.DataFrame
    source: str
    manifest: Manifest
    judgments: pd.DataFrame
    samples: pd.DataFrame
    readout_options: pd.DataFrame
    meta: pd.DataFrame
    """One row per trial of the run (all instruments), with its factors."""
    trial_list: list[Any]

    def instrument(self, name: str) -> pd.DataFrame:
        if "instrument" not in self.per_trial:
            return self.per_trial.iloc[0:0]
        return self.per_trial[self.per_trial["instrument"] == name]


def load_frames(run: Run) -> Frames:
    opts, per_trial, source = run.choice_probs()
    return Frames(
        options=opts,
        per_trial=per_trial,
        source=source,
        manifest=run.manifest,
        judgments=run.load("judgments"),
        samples=run.load("samples"),
        readout_options=run.load("readout_options"),
        meta=run.trial_meta(),
        trial_list=run.trial_list,
    )


# ------------------------------------------------------------------- parts
@dataclass(frozen=True)
class Graded:
    """I-1: theta per dilemma and its cross-form incoherence (:func:`compute_graded`)."""

    trials: pd.DataFrame
    """The graded trials, with their factors."""
    graded: pd.DataFrame
    """Per graded trial: the value read (:func:`analysis.battery.stance.graded_trials`)."""
    fallback: pd.DataFrame
    empty_forms: pd.DataFrame
    theta: pd.Series
    inc: pd.DataFrame
    gen: Any
    table: pd.DataFrame
    bipolar: Any
    pooled: Any


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
    return Part(Graded(g, gt, fallback, empty_forms, th, inc, gen, table, bipolar, pooled))


@dataclass(frozen=True)
class VerbFlip:
    """I-3, the yes/no verb flip: the four cells per story and their decomposition (:func:`compute_verbflip`)."""

    trials: pd.DataFrame
    """The Yes/No forced-binary trials of replicate 0."""
    cells: pd.DataFrame
    """Per story: mean P(CBR) in each (verb, order) cell, ``p_cbr_<verb>_<order>``; stories with an empty cell
    are left out (in the part's ``dropped``)."""
    dec: pd.DataFrame
    """Per story: z, lexical, order, apparent."""


def compute_verbflip(f: Frames) -> Part[VerbFlip]:
    """The per-story cells of the yes/no verb flip and their decomposition (Eq. 1)."""
    b = f.instrument("binary")
    b = b[(b["labels"] == "Yes/No") & (b["replicate"] == 0)] if len(b) else b
    if b.empty:
        return Part(absent="Not in this run (instrument binary, labels Yes/No).")
    from analysis.battery.yesno import empty_cells, p_cbr

    df = b.join(p_cbr(f.options), on="trial_id")
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
    return Part(VerbFlip(b, cells, dec), dropped=dropped)


@dataclass(frozen=True)
class LabelMap:
    """I-3, the label pairs: projections, the lexicality gradient of the label pull, m_label (:func:`compute_labelmap`)."""

    pulls: pd.DataFrame
    gradient: pd.DataFrame
    """Per label pair: order, label pull, logic with CIs, n_dropped and (with theta) m_label."""
    contrast: float
    contrast_all: float
    incomplete: tuple[Dropped, ...]
    n_left: pd.Series
    clipped: list[str]
    """Pairs whose per-pair fit is clip-limited (no m_label shown)."""


def compute_labelmap(f: Frames, theta: pd.Series | None) -> Part[LabelMap]:
    """Order / logic / label projections per label pair, the lexicality gradient, and m_label with ``theta``."""
    from analysis.battery import fit
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
                    pf = fit.fit_pair(theta, bt, str(pair), n_boot=0)
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
    return Part(LabelMap(pulls, by_pair, contrast, contrast_all, incomplete, n_left, clipped), dropped=incomplete)


@dataclass(frozen=True)
class Choice:
    """I-2, free choice: the judged replies and the per-dilemma verdict shares (:func:`compute_choice`)."""

    replies: pd.DataFrame
    """The judged replies (one row each) with their dilemma, framing, print order and replicate."""
    per_item: pd.DataFrame
    """Per dilemma: P(PRO), P(ANTI), P(NONCOMMIT), the stance, sigma_repro, sigma_raw and the order pull."""
    stance: pd.Series
    """P(PRO) - P(ANTI) per dilemma."""


def compute_choice(f: Frames) -> Part[Choice]:
    """P(PRO), P(ANTI), P(NONCOMMIT) per dilemma, the choice stance and its spread across the forms."""
    j = f.judgments
    if j.empty:
        return Part(absent="Not in this run (instrument choice, or no judge).")
    from analysis.battery import stance

    cols = ["item_id", "framing", "order", "replicate"]
    meta = f.meta[f.meta["instrument"] == "choice"].set_index("trial_id")[cols]
    d = j.join(meta, on="trial_id")
    per_item = d.groupby("item_id")[["p_pro", "p_anti", "p_noncommit"]].mean()
    per_item["stance"] = per_item["p_pro"] - per_item["p_anti"]
    inc = stance.choice_incoherence(stance.choice_forms(d.reset_index(drop=True)))
    per_item = per_item.join(inc[["sigma_repro", "sigma_raw", "order"]])
    return Part(Choice(d, per_item, per_item["stance"]))


@dataclass(frozen=True)
class Fits:
    """The (s, m) fits with theta from I-1 (:func:`compute_fits`)."""

    binary: pd.DataFrame
    """The forced-binary trials (:func:`analysis.battery.fit.binary_trials`)."""
    run: RunFits


def compute_fits(f: Frames, theta: pd.Series | None) -> Part[Fits]:
    """The (s, m) fit per channel and per label family against ``theta`` (:func:`analysis.battery.fit.fit_run`)."""
    from analysis.battery import fit

    b = f.instrument("binary")
    if theta is None or b.empty:
        return Part(absent="Needs the graded and binary instruments.")
    bt = fit.binary_trials(f.options[f.options["trial_id"].isin(b["trial_id"])], b)
    cf = fit.fit_run(theta, bt, n_boot=N_BOOT, seed=SEED)
    return Part(Fits(bt, cf), dropped=cf.dropped)


@dataclass(frozen=True)
class BatteryResults:
    """Every computed part of the battery report, each computed once (:func:`battery_results`)."""

    graded: Part[Graded] = Part()
    verbflip: Part[VerbFlip] = Part()
    labelmap: Part[LabelMap] = Part()
    choice: Part[Choice] = Part()
    fit: Part[Fits] = Part()

    @property
    def theta(self) -> pd.Series | None:
        """Theta per dilemma (I-1), when computed."""
        return None if self.graded.value is None else self.graded.value.theta

    @property
    def z(self) -> pd.Series | None:
        """The story stance z per dilemma (I-3 verb flip), when computed."""
        return None if self.verbflip.value is None else self.verbflip.value.dec["z"]

    @property
    def choice_stance(self) -> pd.Series | None:
        """The choice stance per dilemma (I-2), when computed."""
        return None if self.choice.value is None else self.choice.value.stance

    @property
    def fits(self) -> pd.DataFrame | None:
        """The per-channel (s, m) fits, indexed by channel; None when none was fitted."""
        return None if self.fit.value is None else self.fit.value.run.fits

    @property
    def joint(self) -> pd.DataFrame | None:
        """The joint fits per label family, shown when some channel was fitted."""
        if self.fit.value is None or self.fit.value.run.fits is None:
            return None
        return self.fit.value.run.joint

    @property
    def label_gradient(self) -> pd.DataFrame | None:
        return None if self.labelmap.value is None else self.labelmap.value.gradient

    @property
    def dropped(self) -> list[Dropped]:
        """The stories the parts left out, in section order."""
        return [*self.verbflip.dropped, *self.labelmap.dropped, *self.fit.dropped]


def battery_results(f: Frames) -> BatteryResults:
    """Compute every part of the report once; theta (I-1) feeds the label map and the (s, m) fit."""
    graded = attempt(compute_graded, f)
    theta = None if graded.value is None else graded.value.theta
    return BatteryResults(
        graded=graded,
        verbflip=attempt(compute_verbflip, f),
        labelmap=attempt(compute_labelmap, f, theta),
        choice=attempt(compute_choice, f),
        fit=attempt(compute_fits, f, theta),
    )
