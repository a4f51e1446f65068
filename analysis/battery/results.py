"""The computed parts of the battery report and the yes/no report (paper 003): what their sections show, each
computed once.

Computation apart from presentation (scikit-learn's estimators compute, its
Displays only draw): :func:`battery_results` reads the run's
:class:`~analysis.battery.frames.Frames` and computes every part of
:mod:`analysis.battery.report` once, each a function of named inputs (the
per-instrument parts of :mod:`analysis.battery.instrument_parts`: the graded
stance theta feeds the label map and the (s, m) fit, whose loop
:func:`analysis.battery.run_fits.fit_run` ``probe compare`` shares; here, the
convergent validity and the planted parameters, which read the other parts,
and the layer profile), into a frozen :class:`BatteryResults`. A part is its
value, or the line saying its instrument is absent, or the NotComputed it
raised (its section then says why), with the stories it left out either way.
:func:`yesno_results` does the same for the plain yes/no battery
(:class:`YesNoResults`); the readout temperature
(:func:`~analysis.battery.instrument_parts.compute_calibration`) is a part of
both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from analysis.battery.fit import N_BOOT, SEED
from analysis.battery.frames import Frames, counterbalanced_pairs
from analysis.battery.instrument_parts import (
    Choice,
    Fits,
    Graded,
    LabelMap,
    ReadoutTemperature,
    VerbFlip,
    compute_calibration,
    compute_choice,
    compute_fits,
    compute_graded,
    compute_labelmap,
    compute_verbflip,
)
from analysis.battery.yesno import Dropped, decompose
from analysis.common.results import Part, attempt
from probe.record import Manifest
from probe.runs import Run


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
