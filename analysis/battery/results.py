"""The computed parts of the battery report and the yes/no report (paper 003): what their sections show, each
computed once.

Computation apart from presentation (scikit-learn's estimators compute, its
Displays only draw): :func:`battery_results` reads the run's :class:`Frames`
and computes every part of :mod:`analysis.battery.report` once, each a
function of named inputs (the graded stance theta feeds the label map and
the (s, m) fit, whose loop :func:`analysis.battery.run_fits.fit_run` ``probe
compare`` shares; the convergent validity and the planted parameters read the
other parts), into a frozen :class:`BatteryResults`. A part is its value,
or the line saying its instrument is absent, or the NotComputed it raised
(its section then says why), with the stories it left out either way.
:func:`yesno_results` does the same for the plain yes/no battery
(:class:`YesNoResults`); the readout temperature (:func:`compute_calibration`)
is a part of both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from analysis.battery.binary import cell_events, incomplete_stories, lexicality_gradient, projections
from analysis.battery.calibration import TemperatureRow
from analysis.battery.fit import N_BOOT, SEED
from analysis.battery.run_fits import RunFits
from analysis.battery.yesno import CELLS, Dropped, Resampling, decompose
from analysis.common.results import Part, attempt
from probe.errors import NotComputed
from probe.record import Manifest, Plan
from probe.runs import Run
from probe.types import Trial


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
    layers: pd.DataFrame = field(default_factory=pd.DataFrame)
    """The run's ``readout_layers`` table (``--layers``); empty without."""

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
        layers=run.load("readout_layers"),
    )


def _with_mean(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a last row ``mean``: the mean of each numeric column over the rows (the items)."""
    out = df.copy()
    out.loc["mean"] = df.mean(numeric_only=True)
    return out


def corpus_form_order(corpus: str | None, forms: set[str]) -> list[str]:
    """The run's verb-flip forms in corpus order (the order of ``binary.forms`` in the corpus file).

    The form-parity split of Fig. 3 takes even / odd forms in this order,
    whatever order ``--forms`` named them in and under every preset (issue
    27: ``--preset full`` used to sort them alphabetically). Forms the corpus
    does not list (an edited corpus) follow, sorted.
    """
    from experiments.battery import load_corpus

    listed = [str(x) for x in load_corpus(corpus)["binary"]["forms"] if x in forms]
    return listed + sorted(forms - set(listed))


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


@dataclass(frozen=True)
class ValidityPair:
    """One convergent-validity correlation: Pearson r with its bootstrap CI, or why none is reported."""

    name: str
    other: str
    correlation: Any = None
    """:class:`analysis.battery.stance.Correlation`; None when not reported."""
    blocker: str = ""
    """Why no correlation is reported (:func:`analysis.battery.stance.correlation_blocker`); "" with no
    correlation: a stance is not in this run."""


@dataclass(frozen=True)
class Validity:
    """Convergent validity: I-2 and I-3 stances against theta, I-2 against z (:func:`compute_validity`)."""

    pairs: tuple[ValidityPair, ...]
    table: pd.DataFrame | None
    """r, lo, hi, n per reported correlation; None when none is."""


@dataclass(frozen=True)
class Planted:
    """The planted parameters of the synthetic subject beside what the analysis recovered (:func:`compute_planted`)."""

    theta_r: float | None
    """r(planted, recovered) of theta over the items; None with fewer than three."""
    n_theta: int
    table: pd.DataFrame
    """Per channel, joint fit and label pull (index ``channel``): s and m planted and recovered, with CIs."""
    T: float
    """The planted readout temperature."""


@dataclass(frozen=True)
class BatteryResults:
    """Every computed part of the battery report, each computed once (:func:`battery_results`)."""

    graded: Part[Graded] = Part()
    verbflip: Part[VerbFlip] = Part()
    labelmap: Part[LabelMap] = Part()
    choice: Part[Choice] = Part()
    fit: Part[Fits] = Part()
    calibration: Part[ReadoutTemperature] = Part()
    validity: Part[Validity] = Part()
    planted: Part[Planted] = Part()
    layers: Part[Any] = Part(absent="Not in this run (run it with --layers).")
    """Where the readout forms (:class:`analysis.battery.layers.LayerProfile`); absent without ``--layers``."""

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


def compute_layers(
    options: pd.DataFrame, per_trial: pd.DataFrame, layers: pd.DataFrame, source: str, label_pairs: set[str]
) -> Part[Any]:
    """Where the readout forms (:func:`analysis.battery.layers.layer_profile`): absent without ``--layers``, and
    for answers from samples (the layers are the readout's)."""
    from analysis.battery.layers import layer_profile

    if layers.empty:
        return Part(absent="Not in this run (run it with --layers).")
    if source != "readout":
        return Part(absent="The layer profile is the readout's; this report reads sampled answers.")
    return Part(layer_profile(options, per_trial, layers, source, label_pairs, n_boot=N_BOOT, seed=SEED))


def counterbalanced_pairs(manifest: Manifest) -> set[str]:
    """The label pairs whose mapping the battery's corpus counterbalances (their label projection is identified)."""
    from experiments.battery import BatterySpec, load_corpus

    labels = load_corpus(manifest.spec_as(BatterySpec).corpus)["binary"]["labels"]
    return {k for k, v in labels.items() if v.get("counterbalance")}


def compute_validity(res: BatteryResults) -> Part[Validity]:
    """Pearson r (95% bootstrap over items) of the I-2 and I-3 stances with theta and of I-2 with z, where the
    stances are in the run and a correlation would not mislead."""
    from analysis.battery.stance import correlation_blocker, pearson_ci

    th = res.theta
    if th is None:
        return Part(absent="Needs the graded instrument (theta).")
    pairs, rows = [], {}
    candidates = (
        ("I-2 choice stance", res.choice_stance, "theta", th),
        ("I-3 story stance z", res.z, "theta", th),
        ("I-2 choice stance", res.choice_stance, "the symmetrised binary stance z", res.z),
    )
    for name, series, other_name, other in candidates:
        if series is None or other is None:
            pairs.append(ValidityPair(name, other_name))
            continue
        why = correlation_blocker(series, other, (name, other_name))
        if why:
            pairs.append(ValidityPair(name, other_name, blocker=why))
            continue
        c = pearson_ci(series, other, n_boot=N_BOOT, seed=SEED)
        rows[name if other_name == "theta" else f"{name} vs z"] = {"r": c.r, "lo": c.lo, "hi": c.hi, "n": c.n}
        pairs.append(ValidityPair(name, other_name, c))
    return Part(Validity(tuple(pairs), pd.DataFrame(rows).T if rows else None))


def compute_planted(manifest: Manifest, res: BatteryResults) -> Part[Planted]:
    """For a run of the synthetic subject: its planted theta, s, m per channel and label pull, and T, beside what
    ``res`` recovered; absent for any other engine."""
    import numpy as np

    eng = manifest.engine
    if eng.kind != "sim":
        return Part(absent="Not a run of the synthetic subject.")
    from analysis.battery.fit import IDENTIFYING_PAIRS
    from engines.sim import SimParams

    params = SimParams(**eng.params)
    fit_pairs = IDENTIFYING_PAIRS
    th = res.theta
    theta_r = None
    if th is not None and len(th) > 2:
        planted = pd.Series({i: params.item_theta(str(i)) for i in th.index})
        theta_r = float(np.corrcoef(planted.to_numpy(), th.to_numpy())[0, 1])
    fits = res.fits
    word = {pair: params.m_label.get(pair, params.m_word) for pair in ("Yes/No", *fit_pairs)}
    truth = {
        "order": params.m_order,
        "lexical": word["Yes/No"] + params.m_logic,
        "logic": params.m_logic,
        "label": word[fit_pairs[0]],
    }
    rows = {}
    if fits is not None:
        for ch, row in fits.iterrows():
            rows[ch] = {
                "s planted": params.s,
                "s": row["s"],
                "s CI": f"[{row['s_lo']:.3f}, {row['s_hi']:.3f}]",
                "m planted": truth.get(str(ch), float("nan")),
                "m": row["m"],
                "m CI": f"[{row['m_lo']:.3f}, {row['m_hi']:.3f}]",
            }
    joint = res.joint
    if joint is not None:
        fitted = joint[joint.reindex(columns=["m"])["m"].notna()]
        for _, row in fitted.iterrows():
            ch, fam = str(row["channel"]), str(row["family"])
            m_true = truth.get(ch, float("nan"))
            if fam == "arbitrary" and ch == "logic" and "label" not in set(fitted["channel"]):
                m_true = params.m_logic + word[fit_pairs[0]]  # label not identified: the logic cells carry both
            rows[f"joint:{fam}:{ch}"] = {
                "s planted": params.s,
                "s": row["s"],
                "s CI": f"[{row['s_lo']:.3f}, {row['s_hi']:.3f}]",
                "m planted": m_true,
                "m": row["m"],
                "m CI": f"[{row['m_lo']:.3f}, {row['m_hi']:.3f}]",
            }
    gradient = res.label_gradient
    if gradient is not None and "m_label" in gradient.columns:
        for pair, row in gradient.iterrows():
            if pd.isna(row["m_label"]):
                continue
            rows[f"label pull: {pair}"] = {
                "s planted": float("nan"),
                "s": float("nan"),
                "s CI": "",
                "m planted": params.m_label.get(str(pair), params.m_word),
                "m": row["m_label"],
                "m CI": f"b = {row['label_pull']:+.3f} [{row['label_pull_lo']:+.3f}, {row['label_pull_hi']:+.3f}]",
            }
    table = pd.DataFrame(rows).T.rename_axis("channel")
    return Part(Planted(theta_r, len(th) if th is not None else 0, table, params.T))


def battery_results(f: Frames) -> BatteryResults:
    """Compute every part of the report once; theta (I-1) feeds the label map and the (s, m) fit, and the
    convergent validity and the planted parameters read the parts before them."""
    graded = attempt(compute_graded, f)
    theta = None if graded.value is None else graded.value.theta
    res = BatteryResults(
        graded=graded,
        verbflip=attempt(compute_verbflip, f),
        labelmap=attempt(compute_labelmap, f, theta),
        choice=attempt(compute_choice, f),
        fit=attempt(compute_fits, f, theta),
        calibration=attempt(compute_calibration, f.samples, f.readout_options, f.trial_list, f.manifest),
    )
    if not f.layers.empty:
        pairs = counterbalanced_pairs(f.manifest)
        res = replace(res, layers=attempt(compute_layers, f.options, f.per_trial, f.layers, f.source, pairs))
    return replace(res, validity=attempt(compute_validity, res), planted=attempt(compute_planted, f.manifest, res))


# ------------------------------------------------------------------- the yes/no battery
@dataclass(frozen=True)
class SaltNoise:
    """The salt noise floor of a yes/no run with salted replicates: the within-form SD of P(CBR)."""

    sd: pd.Series
    """Per (item, form, verb, order) (:func:`analysis.battery.yesno.salt_noise`)."""
    median: float
    max: float
    n_replicates: int


@dataclass(frozen=True)
class YesNoResults:
    """Everything the yes/no report shows, computed once (:func:`yesno_results`)."""

    source: str
    """``readout`` or ``samples``: where the option probabilities come from."""
    table: pd.DataFrame
    """Per dilemma: the four cells' P(CBR) and the decomposition, with the mean as a last row."""
    dropped: tuple[Dropped, ...]
    coverage_mean: float
    """Mean over dilemmas of the option coverage (option mass at the slot, or share of parsed answers)."""
    coverage_min: float
    salt: SaltNoise | None
    """None with one replicate."""
    calibration: Part[ReadoutTemperature]
    """Absent unless the run holds both samples and readouts; the report then shows no temperature."""
    layers: Part[Any] = Part(absent="Not in this run (run it with --layers).")
    """Where the readout forms (:class:`analysis.battery.layers.LayerProfile`); absent without ``--layers``."""

    @property
    def fits(self) -> None:
        """The yes/no battery fits no (s, m): the temperature section shows no s beside T."""
        return None


def yesno_results(run: Run) -> YesNoResults:
    """The cells, their decomposition, the dropped stories, the coverage, the salt noise floor and (a run with
    samples and readouts) the readout temperature of a yes/no run."""
    from analysis.battery import yesno

    opts, per_trial, source = run.choice_probs()
    pc = yesno.p_cbr(opts)
    with_verb = yesno.with_cbr_verb(per_trial, opts)
    cells = yesno.cell_table(with_verb, pc)
    dropped = yesno.dropped_stories(with_verb, pc)
    table = cells.join(decompose(cells))
    table.loc["mean"] = table.mean(numeric_only=True)
    cov = per_trial.groupby("item_id")["coverage"].mean()
    n_replicates = per_trial["replicate"].nunique()
    salt = None
    if n_replicates > 1:
        sd = yesno.salt_noise(per_trial, pc)
        salt = SaltNoise(sd, sd.median(), sd.max(), n_replicates)
    samples, readouts = run.load("samples"), run.load("readout_options")
    calibration: Part[ReadoutTemperature] = Part(absent="Needs samples and readouts.")
    if not samples.empty and not readouts.empty:  # a run that reads the slot and samples: the battery's calibration
        calibration = attempt(compute_calibration, samples, readouts, run.trial_list, run.manifest)
    layered = run.load("readout_layers")
    layers = (
        attempt(compute_layers, opts, per_trial, layered, source, set())
        if not layered.empty
        else Part(absent="Not in this run (run it with --layers).")
    )
    return YesNoResults(source, table, dropped, cov.mean(), cov.min(), salt, calibration, layers)
