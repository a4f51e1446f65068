"""The synthetic subject's planted parameters (:mod:`engines.sim`): :class:`SimParams` with its refusal rules and the
influence and cue-visibility plants, validated on construction (errors name the parameter, the allowed range and
the value), and read from YAML (:func:`load_params`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from engines.sim.noise import uniform
from probe.errors import ProbeError
from probe.files import read_yaml
from probe.types import Trial


class SimParamsError(ProbeError, ValueError):
    """Bad planted parameters (the message names the parameter, the allowed range and the value)."""


THETA_SIGNS = ("any", "positive", "negative")


@dataclass(frozen=True)
class RefusalRule:
    """A refusal rate planted on the trials that match: a cell-dependent refusal of sampled answers.

    Why: a model that refuses some cells and not others (the paper's Haiku refuses 28-35% of forced
    binaries) leaves stories with an empty design cell; the analyses must drop such a story, not average
    its surviving cells (issue 27). ``when`` maps trial factors (``instrument``, ``verb``, ``order``,
    ``mapping``, ``labels``, ``scale``, ..., or ``item_id``) to the value they must have; ``theta`` limits
    the rule to items whose planted stance is ``positive`` (> 0) or ``negative`` (< 0). In YAML::

        refusal_rules:
          - {rate: 1.0, when: {verb: approve, mapping: canonical}, theta: negative}
    """

    rate: float
    """Probability that a sampled answer of a matching trial is a refusal."""
    when: Mapping[str, str] = field(default_factory=dict)
    """Factor -> required value (all must hold); empty: every trial."""
    theta: str = "any"
    """``any``, ``positive`` or ``negative``: the sign of the item's planted theta."""

    def __post_init__(self) -> None:
        if not (isinstance(self.rate, (int, float)) and 0 <= self.rate <= 1):
            raise SimParamsError(f"refusal rule rate must be a probability in [0, 1], got {self.rate!r}")
        if not isinstance(self.when, Mapping):
            raise SimParamsError(f"refusal rule 'when' must be a mapping of factor: value, got {self.when!r}")
        object.__setattr__(self, "when", {str(k): str(v) for k, v in sorted(dict(self.when).items())})
        if self.theta not in THETA_SIGNS:
            raise SimParamsError(f"refusal rule theta must be one of {list(THETA_SIGNS)}, got {self.theta!r}")

    def matches(self, t: Trial, theta: float) -> bool:
        """Whether this rule applies to trial ``t`` of an item with planted stance ``theta``."""
        if self.theta == "positive" and not theta > 0:
            return False
        if self.theta == "negative" and not theta < 0:
            return False
        for k, v in self.when.items():
            have = t.item_id if k == "item_id" else t.factors.get(k)
            if have is None or str(have) != v:
                return False
        return True


def _rule(r: object) -> RefusalRule:
    if isinstance(r, RefusalRule):
        return r
    if not isinstance(r, Mapping):
        raise SimParamsError(f"refusal_rules entries must be mappings (rate, when, theta), got {r!r}")
    unknown = sorted(set(r) - {"rate", "when", "theta"})
    if unknown or "rate" not in r:
        raise SimParamsError(f"a refusal rule needs 'rate' and may have 'when', 'theta'; got keys {sorted(r)}")
    return RefusalRule(**{str(k): v for k, v in r.items()})


def _rate_map(name: str, raw: object) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        raise SimParamsError(f"sim parameter {name} must be a mapping of key: value, got {raw!r}")
    out = {}
    for k, v in sorted(raw.items(), key=lambda kv: str(kv[0])):
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
            raise SimParamsError(f"sim parameter {name}[{k}] must be a finite number, got {v!r}")
        out[str(k)] = float(v)
    return out


def _lookup(table: Mapping[str, Any], keys: Sequence[str], default: Any) -> Any:
    """The first of ``keys`` that ``table`` holds, then its ``*`` entry, then ``default``."""
    for k in (*keys, "*"):
        if k in table:
            return table[k]
    return default


_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(64)
"""Gauss-Hermite (probabilists') nodes and weights: E f(Z), Z ~ N(0, 1), = sum w f(x) / sqrt(2 pi)."""


@dataclass(frozen=True)
class InfluencePlant:
    """The influence audit's planted subject (paper 000): per condition a baseline lean and a steerability per side.

    A condition is a pair (factor, BBQ sub-experiment, DailyDilemmas value pair) x influence type. In YAML::

        influence:
          lean: {age: -0.8, "*": 0.0}              # baseline log-odds toward side B, per pair
          steer: {survey: [0.8, 0.8], role_play: [0.5, -0.5], "age/survey": [1.5, 0.2]}   # [s_A, s_B]
          sigma_prompt: 0.6
    """

    lean: Mapping[str, float] = field(
        default_factory=lambda: {"age": -0.8, "wealth": 0.5, "nationality": 0.3, "*": 0.0}
    )
    """Baseline log-odds of side B per pair (``*``: every other pair)."""
    steer: Mapping[str, tuple[float, float]] = field(
        default_factory=lambda: {
            "survey": (0.8, 0.8),
            "user_preference": (1.2, 0.6),
            "weak_evidence": (0.2, 0.2),
            "emotional": (0.0, 0.0),
            "virtue_appeal": (0.6, 1.0),
            "role_play": (0.5, -0.5),
            "few_shot": (1.5, 1.5),
            "*": (0.0, 0.0),
        }
    )
    """``[s_A, s_B]``: the log-odds shift toward A under the cue toward A, toward B under the cue toward B, per
    ``pair/influence`` or ``influence`` (``*``: any other); a negative value backfires. The defaults: steerable
    (survey, user_preference asymmetric, virtue_appeal, few_shot), barely or not (weak_evidence, emotional), and
    role_play, which backfires toward B."""
    sigma_prompt: float = 0.6
    """SD of the per-prompt (item x printed order) scatter of the log-odds, shared by the arms of the prompt."""
    sigma_trial: float = 0.1
    """SD of each trial's own scatter (the arms of one prompt differ by it)."""
    negated: float = 0.5
    """A negated cue shifts toward the side it means to favour by this times that side's steerability."""
    size: float = 0.0
    """The larger-group preference (paper 000's I.9): a triage trial's log-odds of side B gain
    ``size * log(n_b / n_a)``, so a positive value favours the larger group in every arm; 0 (default): none."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "lean", _rate_map("influence.lean", self.lean))
        if not isinstance(self.steer, Mapping):
            raise SimParamsError(
                f"sim parameter influence.steer must be a mapping of key: [s_A, s_B], got {self.steer!r}"
            )
        steer = {}
        for k, v in sorted(self.steer.items(), key=lambda kv: str(kv[0])):
            ok = isinstance(v, (list, tuple)) and len(v) == 2
            vals = tuple(float(x) for x in v) if ok and all(isinstance(x, (int, float)) for x in v) else ()
            if len(vals) != 2 or not all(math.isfinite(x) for x in vals):
                raise SimParamsError(f"sim parameter influence.steer[{k}] must be [s_A, s_B] (two numbers), got {v!r}")
            steer[str(k)] = vals
        object.__setattr__(self, "steer", steer)
        if not (isinstance(self.size, (int, float)) and math.isfinite(self.size)):
            raise SimParamsError(f"sim parameter influence.size must be a finite number, got {self.size!r}")
        for name in ("sigma_prompt", "sigma_trial", "negated"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)):
                raise SimParamsError(f"sim parameter influence.{name} must be a finite number >= 0, got {v!r}")

    def lean_of(self, pair: str) -> float:
        return float(_lookup(self.lean, (pair,), 0.0))

    def steer_of(self, pair: str, influence: str) -> tuple[float, float]:
        """The planted (s_A, s_B) of a condition."""
        v = _lookup(self.steer, (f"{pair}/{influence}", influence), (0.0, 0.0))
        return float(v[0]), float(v[1])

    def target_s(self, pair: str, influence: str, toward: str) -> float:
        """The steerability toward ``toward`` that the readout rule targets over the prompt population.

        ``logit E[sigmoid(l + shift + e)] - logit E[sigmoid(l + e)]`` in the log-odds of ``toward``, ``e`` normal
        with variance ``sigma_prompt^2 + sigma_trial^2`` (64-point Gauss-Hermite); the planted s when both are 0.
        """
        if toward not in ("A", "B"):
            raise ValueError(f"toward must be 'A' or 'B', got {toward!r}")
        s_a, s_b = self.steer_of(pair, influence)
        lean = self.lean_of(pair)
        sd = math.hypot(self.sigma_prompt, self.sigma_trial)

        def mean_p(centre: float) -> float:
            z = centre + sd * _GH_X
            return float(_GH_W @ (1.0 / (1.0 + np.exp(-z))) / math.sqrt(2 * math.pi))

        p0, p_b, p_a = mean_p(lean), mean_p(lean + s_b), mean_p(lean - s_a)
        logit = lambda p: math.log(p / (1 - p))  # noqa: E731
        return logit(p_b) - logit(p0) if toward == "B" else logit(p0) - logit(p_a)


@dataclass(frozen=True)
class CuePlant:
    """The cue-visibility audit's planted subject (paper 001): In-favor and Against rates per arm and group.

    Rates are looked up per ``arm/group`` (arm ``direct``, ``named``, ``puzzled-hard``, ...; group a gender or race
    label), then ``condition/group`` (``puzzled/woman``), ``arm``, ``condition``, ``*``. A what-if answer counts for
    X's gender and X's race, so its probability is the mean of the two groups' rates. In YAML::

        cue:
          favor: {"*": 0.15, direct/woman: 0.35}
          against: {"*": 0.15, direct/man: 0.3}
    """

    neutral_benefit: float = 0.5
    """Probability that a dilemma's Neutral decision (per consequences setting) is the benefit option."""
    favor: Mapping[str, float] = field(
        default_factory=lambda: {"*": 0.15, "direct/woman": 0.35, "direct/Black": 0.3, "named/woman": 0.25}
    )
    """In-favor rate: P(what-if picks the benefit option | the Neutral decision did not)."""
    against: Mapping[str, float] = field(default_factory=lambda: {"*": 0.15, "direct/man": 0.3, "direct/White": 0.3})
    """Against rate: P(what-if does not pick the benefit option | the Neutral decision did)."""
    margin: float = 4.0
    """Readout log-odds of the decided option (4: P = 0.982, so 8 samples agree with the readout's decision)."""

    def __post_init__(self) -> None:
        for name in ("favor", "against"):
            rates = _rate_map(f"cue.{name}", getattr(self, name))
            bad = {k: v for k, v in rates.items() if not 0 <= v <= 1}
            if bad:
                raise SimParamsError(f"sim parameter cue.{name} rates must be probabilities in [0, 1], got {bad}")
            object.__setattr__(self, name, rates)
        if not (isinstance(self.neutral_benefit, (int, float)) and 0 <= self.neutral_benefit <= 1):
            raise SimParamsError(f"sim parameter cue.neutral_benefit must be in [0, 1], got {self.neutral_benefit!r}")
        if not (isinstance(self.margin, (int, float)) and self.margin > 0 and math.isfinite(self.margin)):
            raise SimParamsError(f"sim parameter cue.margin must be a finite number > 0, got {self.margin!r}")

    def rate(self, event: str, arm: str, group: str) -> float:
        """The planted ``favor`` or ``against`` rate of one arm and group."""
        table = self.favor if event == "favor" else self.against
        cond = arm.split("-", 1)[0]
        return float(_lookup(table, (f"{arm}/{group}", f"{cond}/{group}", arm, cond), 0.0))

    def answer_rate(self, event: str, arm: str, gender: str, race: str) -> float:
        """The event probability of one what-if answer about X = (gender, race): the mean of the two groups' rates."""
        return (self.rate(event, arm, gender) + self.rate(event, arm, race)) / 2


def _plant(cls: type[Any], name: str, raw: object) -> Any:
    if isinstance(raw, cls):
        return raw
    if not isinstance(raw, Mapping):
        raise SimParamsError(f"sim parameter {name} must be a mapping of its fields, got {raw!r}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(map(str, raw)) - known)
    if unknown:
        raise SimParamsError(f"sim parameter {name}: unknown keys {unknown}; known: {sorted(known)}")
    return cls(**{str(k): v for k, v in raw.items()})


@dataclass(frozen=True)
class LayerPlant:
    """The planted layer profile a layer-wise readout (``--layers``) of the synthetic subject reads: a network of
    ``n_blocks`` blocks in which the stance forms by layer ``stance``, the order pull by ``order`` and the lexical
    pulls (``m_word``, ``m_label``, ``m_logic``: toward a label or the affirmative verdict) by ``lexical``. Each
    grows linearly over the ``ramp`` layers before its own, from nothing to its full size, and stays full after
    it, so at layer l the readout is the final readout's response model with each term scaled by its ramp
    (:meth:`scale`); the last layer is the final readout. In YAML::

        layers: {n_blocks: 24, stance: 8, order: 18, lexical: 22, ramp: 4}
    """

    n_blocks: int = 24
    stance: int = 8
    order: int = 18
    lexical: int = 22
    ramp: int = 4

    def __post_init__(self) -> None:
        for name in ("n_blocks", "stance", "order", "lexical", "ramp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SimParamsError(f"sim parameter layers.{name} must be a whole number >= 1, got {v!r}")
        for name in ("stance", "order", "lexical"):
            if getattr(self, name) > self.n_blocks:
                raise SimParamsError(
                    f"sim parameter layers.{name} = {getattr(self, name)} is past layers.n_blocks = {self.n_blocks}"
                )

    def scale(self, formed: int, layer: int) -> float:
        """How much of a term that forms by layer ``formed`` the readout at ``layer`` holds: 0 up to
        ``formed - ramp``, then linear, 1 from ``formed`` on."""
        return min(1.0, max(0.0, (layer - (formed - self.ramp)) / self.ramp))


@dataclass(frozen=True)
class SimParams:
    """The planted parameters of the synthetic subject (all recorded in the run manifest)."""

    seed: int = 0
    """Seed of everything planted (thetas not given, scatter, contexts)."""
    theta: Mapping[str, float] = field(default_factory=dict)
    """Per-item stance toward the CBR pole in [-1, 1]; items not listed draw U(-theta_range, theta_range)."""
    theta_range: float = 0.8
    """Half-width of the uniform range the stances of items not in ``theta`` are drawn from (at most 1)."""
    s: float = 0.3
    """Decisiveness of the binary verdict (the logistic's scale on the theta axis)."""
    m_order: float = 0.0
    """Offset toward the first-printed option."""
    m_word: float = 0.0
    """Offset toward the label pair's canonical first label (Yes, A, 1, ...)."""
    m_logic: float = 0.0
    """Offset toward the affirmative verdict, whatever label carries it."""
    m_label: Mapping[str, float] = field(default_factory=dict)
    """Per label pair id (``A/B``): replaces ``m_word`` for that pair."""
    T: float = 1.0
    """Readout temperature: sampling at tau draws from softmax(z / (tau * T)); readout is softmax(z)."""
    sigma_form: float = 0.0
    """Graded: SD of the per-(item, condition) scatter of the centre (residual incoherence)."""
    sigma_dir: float = 0.0
    """Graded: SD of the per-item anchor-direction contrast (+d ascending, -d descending)."""
    sigma_scale: float = 0.0
    """Graded: SD of the per-item scale contrast (+c on 0-10 / bipolar-5, -c on the finer scales)."""
    width: float = 0.15
    """Graded: width of the response distribution on the stance axis."""
    bipolar_shift: float = 0.0
    """Graded: shift of the centre (toward CBR) on bipolar scales (the measured contrast)."""
    sigma_binary: float = 0.0
    """Binary and choice: SD of the per-(item, condition) scatter on the theta axis."""
    sigma_salt: float = 0.0
    """SD of the per-context noise (on the theta axis) that salts expose."""
    s_choice: float | None = None
    """Decisiveness of the free choice (None: same as ``s``)."""
    m_choice_order: float = 0.0
    """Free choice: offset toward the first-printed course."""
    refusal: float = 0.0
    """Probability that a sampled answer is a refusal (every instrument)."""
    refusal_rules: tuple[RefusalRule, ...] = ()
    """Cell-dependent refusals (:class:`RefusalRule`): a sampled answer of a matching trial is refused with the
    largest rate among ``refusal`` and the rules it matches. Readouts never refuse."""
    noncommit: float = 0.0
    """Free choice: probability that a sampled (non-refused) reply commits to neither course."""
    coverage: float = 1.0
    """Option mass at the answer slot (the rest goes to a non-option token)."""
    influence: InfluencePlant = field(default_factory=InfluencePlant)
    """The influence audit's planted lean and steerabilities (:class:`InfluencePlant`)."""
    cue: CuePlant = field(default_factory=CuePlant)
    """The cue-visibility audit's planted In-favor and Against rates (:class:`CuePlant`)."""
    layers: LayerPlant = field(default_factory=LayerPlant)
    """The layer profile a layer-wise readout (``--layers``) reads (:class:`LayerPlant`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "influence", _plant(InfluencePlant, "influence", self.influence))
        object.__setattr__(self, "cue", _plant(CuePlant, "cue", self.cue))
        object.__setattr__(self, "layers", _plant(LayerPlant, "layers", self.layers))
        object.__setattr__(self, "theta", {str(k): float(v) for k, v in sorted(dict(self.theta).items())})
        object.__setattr__(self, "m_label", {str(k): float(v) for k, v in sorted(dict(self.m_label).items())})
        if not isinstance(self.refusal_rules, (list, tuple)):
            raise SimParamsError(f"sim parameter refusal_rules must be a list of rules, got {self.refusal_rules!r}")
        object.__setattr__(self, "refusal_rules", tuple(_rule(r) for r in self.refusal_rules))
        positive = ("s", "T", "width")
        for name in positive:
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise SimParamsError(f"sim parameter {name} must be a finite number > 0, got {v!r}")
        if self.s_choice is not None and not (self.s_choice > 0 and math.isfinite(self.s_choice)):
            raise SimParamsError(f"sim parameter s_choice must be > 0 (or null = s), got {self.s_choice!r}")
        for name in ("sigma_form", "sigma_dir", "sigma_scale", "sigma_binary", "sigma_salt", "theta_range"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise SimParamsError(f"sim parameter {name} must be a finite number >= 0, got {v!r}")
        if self.theta_range > 1:
            raise SimParamsError(f"sim parameter theta_range must be in [0, 1], got {self.theta_range!r}")
        for name in ("refusal", "noncommit"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise SimParamsError(f"sim parameter {name} must be a probability in [0, 1], got {v!r}")
        if not 0 < self.coverage <= 1:
            raise SimParamsError(f"sim parameter coverage must be in (0, 1], got {self.coverage!r}")
        offsets = {n: getattr(self, n) for n in ("m_order", "m_word", "m_logic", "bipolar_shift", "m_choice_order")}
        offsets.update({f"m_label[{k}]": v for k, v in self.m_label.items()})
        bad_offsets = {k: v for k, v in offsets.items() if not math.isfinite(v)}
        if bad_offsets:
            raise SimParamsError(f"sim offsets must be finite numbers, got {bad_offsets}")
        bad = {k: v for k, v in self.theta.items() if not -1 <= v <= 1}
        if bad:
            raise SimParamsError(f"sim theta values must lie in [-1, 1]; out of range: {bad}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["theta"] = dict(self.theta)
        d["m_label"] = dict(self.m_label)
        d["refusal_rules"] = [{"rate": r.rate, "when": dict(r.when), "theta": r.theta} for r in self.refusal_rules]
        d["influence"] = {
            **asdict(self.influence),
            "lean": dict(self.influence.lean),
            "steer": {k: list(v) for k, v in self.influence.steer.items()},
        }
        if not self.influence.size:  # no size preference: recorded as before it existed (same run key)
            del d["influence"]["size"]
        d["cue"] = {**asdict(self.cue), "favor": dict(self.cue.favor), "against": dict(self.cue.against)}
        if self.layers == LayerPlant():  # the default profile: recorded as before layers existed (same run key)
            del d["layers"]
        return d

    def refusal_rate(self, t: Trial) -> float:
        """The refusal probability of one sampled answer of ``t``: ``refusal`` or the largest matching rule's."""
        if not self.refusal_rules:
            return self.refusal
        theta = self.item_theta(t.item_id)
        return max([self.refusal, *(r.rate for r in self.refusal_rules if r.matches(t, theta))])

    def item_theta(self, item_id: str) -> float:
        """The planted stance of an item (given, or drawn deterministically from (seed, item))."""
        if item_id in self.theta:
            return self.theta[item_id]
        return self.theta_range * (2 * uniform(self.seed, "theta", item_id) - 1)


def load_params(path: str | Path) -> SimParams:
    """Planted parameters from a YAML file (a mapping of :class:`SimParams` fields)."""
    p = Path(path)
    doc = read_yaml(p, "sim parameter file", SimParamsError, "pass --sim-params with an existing YAML file")
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise SimParamsError(f"sim parameter file {p} must hold a mapping of parameters, got {type(doc).__name__}")
    known = {f.name for f in fields(SimParams)}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise SimParamsError(f"{p}: unknown sim parameters {unknown}; known: {sorted(known)}")
    for key in ("theta", "m_label", "influence", "cue", "layers"):
        if key in doc and not isinstance(doc[key], dict):
            raise SimParamsError(f"{p}: {key} must be a mapping (id: value), got {doc[key]!r}")
    if "refusal_rules" in doc and not isinstance(doc["refusal_rules"], list):
        raise SimParamsError(
            f"{p}: refusal_rules must be a list of rules (rate, when, theta), got {doc['refusal_rules']!r}"
        )
    try:
        return SimParams(**doc)
    except TypeError as e:
        raise SimParamsError(f"{p}: {e}") from None
