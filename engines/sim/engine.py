"""The synthetic subject: an engine that answers every instrument from planted parameters.

Why it exists: an estimator is only trustworthy if it gives back what was put
in. The sim answers the battery of paper 003 (graded rating I-1, free choice
I-2, forced binary I-3; and the plain ``yesno`` battery) from parameters we
choose, so the analysis can be checked against known truth: planted stances
theta, framing offsets m, decisiveness s, readout temperature T, per-form
scatter, salt noise and refusals.

The response model (all of it documented in ``docs/battery-analysis.md``):

* **Two-option trials** (binary, choice): with ``sgn_c = +1`` when the CBR
  option is the one channel ``c`` pulls toward (else -1)::

      P_readout(CBR) = sigmoid((theta + sum_c m_c sgn_c + e_form + e_ctx) / s)

  channels: ``m_order`` (toward the first-printed option), ``m_word`` (toward
  the pair's canonical first label, e.g. *Yes*, *A*; ``m_label`` overrides it
  per pair), ``m_logic`` (toward the affirmative verdict). Choice trials use
  ``s_choice`` and ``m_choice_order`` only.
* **Graded trials**: a distribution over the options' stances ``x`` (the
  trial's ``meaning``), peaked at ``mu = theta + anchor and scale contrasts +
  e_form + e_ctx (+ bipolar_shift on bipolar scales)`` with width ``width``,
  exponentially tilted so that its mean is exactly ``mu`` (then the
  mean-based theta of the analysis is unbiased by construction).
* **Readout vs sampling (the temperature convention).** The sim's option
  logits ``z`` give the readout ``prob = softmax(z)`` (what a logit readout
  reports at temperature 1). Sampling at temperature ``tau`` draws from
  ``softmax(z / (tau * T))``. A faithful model has ``T = 1`` (sampling at
  ``tau`` draws from ``softmax(logits / tau)``); a sim with ``T != 1`` is a
  subject whose sampled behaviour is sharper (``T < 1``) or flatter than its
  readout, which is what the readout-temperature fit must detect.
  ``tau = 0`` is greedy (the argmax).
* **Influence audit trials** (paper 000; factors ``pair``, ``direction``,
  ``influence``, ``variant``): ``logit P(B) = lean[pair] + shift + e_prompt +
  e_trial`` with ``shift = +s_B`` under a cue toward B, ``-s_A`` under a cue
  toward A, 0 at the baseline (:class:`InfluencePlant`; placebo cues shift 0,
  negated cues ``negated`` times the cue's own). ``e_prompt`` (SD
  ``sigma_prompt``) is shared by the arms of one prompt (item x printed order),
  ``e_trial`` (SD ``sigma_trial``) is the arm's own. So the steerability the
  readout rule targets is ``logit E[sigmoid(lean + s + e)] - logit E[sigmoid(lean + e)]``
  over the prompts (:meth:`InfluencePlant.target_s`; = s when the scatter is 0).
* **Cue visibility trials** (paper 001; ``probe`` ``decision`` / ``what_if``,
  meanings benefit / harm): the Neutral decision of a dilemma is the benefit
  option with probability ``neutral_benefit``; a what-if answer where the
  Neutral one is not the benefit option is In-favor with probability
  ``(favor[arm, X's gender] + favor[arm, X's race]) / 2``, one where it is the
  benefit option Against with ``(against[..] + against[..]) / 2``
  (:class:`CuePlant`); the readout puts log-odds ``margin`` on the decided option.
* **Contexts.** ``e_ctx`` is drawn per (trial cell, salt string) with SD
  ``sigma_salt``; the unsalted context (salt ``""``) is one draw like any
  other, so all replicates are exchangeable and the salt floor is measurable.

Everything is a deterministic function of (parameters, seed, trial): the
readout of a trial does not depend on what else is in the batch, and sample
draw ``d`` of a trial is seeded from (sampling seed, trial id, d).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from engines.base import Draws, Engine, ProgressFn, Supports, check_shared
from engines.sim.noise import draw_uniforms, normal, uniform
from engines.sim.params import (
    SimParams,
    SimParamsError,
    load_params,
)
from probe.layers import LayerSpec
from probe.parse import Parsed, parse_answer
from probe.types import LayerReadout, OptionScore, Readout, Sample, Trial

_MU_LIMIT = 0.99
"""Graded centres are clipped to [-0.99, 0.99] (a mean at the scale's end needs an infinite tilt)."""

REFUSAL_TEXT = "I can't answer that question."
"""Recognized by :func:`probe.parse.parse_answer` as a refusal."""
NONCOMMIT_TEXT = "Both courses carry grave costs, and there is no clear answer here."
"""Names no course and no option: the parser calls it invalid, the rule judge NONCOMMIT."""


@lru_cache(maxsize=65536)
def _parse(text: str, options: tuple[str, ...]) -> Parsed:
    return parse_answer(text, options, think=False)  # the sim has no think mode


_TOKEN = re.compile(r"\w{1,4}|[^\w\s]")


def count_tokens(text: str) -> int:
    """The sim's tokenizer: runs of up to 4 word characters, and each other non-space character.

    Roughly a BPE's 4 characters per token, and monotone in the length of a
    hex string, so fixed-length salts can be drawn (:func:`probe.salts.make_salt`).
    """
    return len(_TOKEN.findall(text))


@lru_cache(maxsize=65536)
def _token_ids(text: str) -> tuple[int, ...]:
    return tuple(int.from_bytes(hashlib.sha256(t.encode()).digest()[:3], "little") for t in _TOKEN.findall(text))


# ----------------------------------------------------------------- the subject
def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    out: np.ndarray = e / e.sum()
    return out


def graded_logits(x: np.ndarray, mu: float, width: float) -> np.ndarray:
    """Logits over stances ``x``: a peak at ``mu`` of width ``width``, tilted so the mean is exactly ``mu``.

    ``z_i = -(x_i - mu)^2 / (2 width^2) + lam * x_i``; the mean is increasing in
    ``lam`` and spans (min x, max x), so one root gives mean == mu.
    """
    lo, hi = float(x.min()), float(x.max())
    if not lo < mu < hi:
        raise ValueError(f"graded centre {mu} must lie strictly inside the option stances [{lo}, {hi}]")
    base = -((x - mu) ** 2) / (2 * width**2)

    def moments(lam: float) -> tuple[float, float]:
        q = _softmax(base + lam * x)
        m = float(q @ x)
        return m - mu, float(q @ (x - m) ** 2)

    # safeguarded Newton (d mean / d lam = variance > 0): bisect whenever a step leaves the bracket
    a, b = -1.0, 1.0
    while moments(a)[0] > 0:
        a *= 4
    while moments(b)[0] < 0:
        b *= 4
    lam = 0.0
    for _ in range(200):
        g, v = moments(lam)
        if abs(g) < 1e-13:
            break
        if g < 0:
            a = lam
        else:
            b = lam
        step = lam - g / v if v > 0 else (a + b) / 2
        lam = step if a < step < b else (a + b) / 2
    z: np.ndarray = base + lam * x
    return z - z.max()


def _instrument(t: Trial) -> str:
    """graded, binary, choice (trial contract), or other (answered with fixed pseudo-random logits)."""
    inst = t.factors.get("instrument")
    if inst in ("graded", "binary", "choice"):
        return inst
    if inst is None and sorted(t.meaning) == ["anti", "cbr"]:
        return "binary"  # the yesno battery: no instrument factor
    return "other"


def _is_influence(t: Trial) -> bool:
    """An influence-audit trial (paper 000): sides A and B as meanings, a cue direction."""
    f = t.factors
    return "direction" in f and "group_b" in f and "pair" in f and set(t.meaning) <= {f.get("group_a"), f["group_b"]}


def _is_cue_decision(t: Trial) -> bool:
    """A cue-visibility Neutral decision or what-if trial (paper 001): benefit / harm options."""
    return t.factors.get("probe") in ("decision", "what_if") and sorted(t.meaning) == ["benefit", "harm"]


SUPPORTS = Supports(
    "sim",
    plain="the sim engine renders no prompt (it reads trials as data), so it has no plain frame; drop --frame",
    think=False,
    layers=True,
)
"""The synthetic subject renders no prompt (no frame to choose), has no think mode, and reads its planted layer
profile at chosen layers (``--layers``)."""


def _size_shift(size: float, factors: Mapping[str, object]) -> float:
    """``size * log(n_b / n_a)``: the planted larger-group preference of a triage trial (0 without two sizes)."""
    if not size:
        return 0.0
    try:
        n_a, n_b = float(str(factors["n_a"])), float(str(factors["n_b"]))
    except (KeyError, ValueError):
        return 0.0
    return size * math.log(n_b / n_a) if n_a > 0 and n_b > 0 else 0.0


def _form_key(t: Trial) -> list[object]:
    return [t.item_id, sorted(t.factors.items())]


class SimEngine(Engine):
    """A logit engine whose answers come from :class:`SimParams` (see the module docstring)."""

    name = "sim"

    def __init__(
        self,
        params: SimParams | None = None,
        *,
        model: str = "sim",
        seed: int = 0,
        layers: LayerSpec | str | None = None,
    ) -> None:
        self.params = params or SimParams()
        self.model = model
        self.seed = seed
        """Seed of the sampled draws (the shared ``--seed``); the planted ones use ``params.seed``."""
        spec = check_shared(SUPPORTS, layers=layers)[1] if isinstance(layers, str) else layers
        self.layers = spec.text if spec is not None else None
        """``--layers``: the layers of the planted profile (``params.layers``) each readout also reads."""
        self._read: tuple[int, ...] = spec.resolve(self.params.layers.n_blocks) if spec is not None else ()
        """Those layers resolved on the planted profile, at once: a layer past its last fails before any readout."""

    # ------------------------------------------------------------- contract
    reply_rows = 64
    """Free-text reply rows the runner decodes in one ``sample`` call, across chunks (a draw does not depend on
    its batch here, so this only exercises the runner's look-ahead; :func:`probe.app.runner.plan_replies`)."""

    def load(self) -> SimEngine:
        return self

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "settings": {"model": self.model, "seed": self.seed},
            "model_path": self.model,
            "model_class": "SimEngine",
            "params": self.params.to_dict(),
            "conventions": "readout prob = softmax(z); sampling at tau draws from softmax(z / (tau * T))",
        }

    def identity(self) -> dict[str, Any]:
        layers = {"layers": self.layers} if self.layers is not None else {}
        return {"engine": self.name, "model": self.model, "seed": self.seed, "params": self.params.to_dict(), **layers}

    # ------------------------------------------------------------- the model
    def _ctx(self, t: Trial) -> float:
        """Per-context noise: every context (salt string, the empty one included) is one draw."""
        p = self.params
        return p.sigma_salt * normal(p.seed, "ctx", *_form_key(t), t.salt) if p.sigma_salt else 0.0

    def binary_pull(self, t: Trial) -> float:
        """The planted offset toward the CBR option of a forced-binary trial (sum of m_c * sgn_c)."""
        order, word, logic = self.pull_terms(t)
        return order + word + logic

    def pull_terms(self, t: Trial) -> tuple[float, float, float]:
        """The order, word (label) and logic terms m_c * sgn_c of :meth:`binary_pull`."""
        p = self.params
        cbr = t.options[t.meaning.index("cbr")]
        labels = t.factors.get("labels", "/".join(t.options) if len(t.options) == 2 else "")
        yes_label = t.factors.get("yes_label") or labels.split("/")[0]
        if yes_label not in t.options:
            raise ValueError(
                f"trial {t.trial_id}: yes_label {yes_label!r} is not one of its options {list(t.options)}; "
                "binary trials need a yes_label factor (or a labels factor whose first label is printed)"
            )
        affirmative = cbr == yes_label
        canonical = affirmative == (t.factors.get("mapping", "canonical") != "swapped")
        m_word = p.m_label.get(labels, p.m_word)
        sgn = {True: 1.0, False: -1.0}
        return p.m_order * sgn[t.meaning[0] == "cbr"], m_word * sgn[canonical], p.m_logic * sgn[affirmative]

    def cbr_margin(self, t: Trial, inst: str) -> float:
        """The readout logit of CBR minus anti for a two-option trial."""
        p = self.params
        theta = p.item_theta(t.item_id)
        scatter = p.sigma_binary * normal(p.seed, "form", *_form_key(t)) if p.sigma_binary else 0.0
        if inst == "choice":
            pull = p.m_choice_order * (1.0 if t.meaning[0] == "cbr" else -1.0)
            return (theta + pull + scatter + self._ctx(t)) / (p.s_choice or p.s)
        return (theta + self.binary_pull(t) + scatter + self._ctx(t)) / p.s

    def anchor_contrast(self, item_id: str) -> float:
        """The planted anchor-direction contrast d of an item (+d ascending, -d descending)."""
        p = self.params
        return p.sigma_dir * normal(p.seed, "dir", item_id) if p.sigma_dir else 0.0

    def scale_contrast(self, item_id: str) -> float:
        """The planted scale contrast c of an item (+c on 0-10 and bipolar-5, -c on the finer scales)."""
        p = self.params
        return p.sigma_scale * normal(p.seed, "scale", item_id) if p.sigma_scale else 0.0

    def graded_centre(self, t: Trial) -> float:
        """The planted mean stance of a graded trial (clipped to +-0.99)."""
        p = self.params
        f = t.factors
        x = [float(m) for m in t.meaning]
        mu = p.item_theta(t.item_id) + self._ctx(t)
        d, c = self.anchor_contrast(t.item_id), self.scale_contrast(t.item_id)
        mu += d if f.get("anchor") == "ascending" else -d
        mu += c if f.get("scale") in ("0-10", "bipolar-5") else -c
        if p.sigma_form:
            mu += p.sigma_form * normal(p.seed, "form", *_form_key(t))
        if _bipolar(t.options):
            mu += p.bipolar_shift
        lim = _MU_LIMIT * max(abs(min(x)), abs(max(x)))
        return float(np.clip(mu, -lim, lim))

    def logits(self, t: Trial) -> np.ndarray:
        """The sim's option logits ``z`` of a trial (readout = softmax(z))."""
        inst = _instrument(t)
        if inst in ("binary", "choice"):
            if sorted(t.meaning) != ["anti", "cbr"]:
                raise ValueError(
                    f"trial {t.trial_id}: a {inst} trial needs one 'cbr' and one 'anti' option, got {list(t.meaning)}"
                )
            half = self.cbr_margin(t, inst) / 2
            return np.array([half if m == "cbr" else -half for m in t.meaning])
        if inst == "graded":
            try:
                x = np.array([float(m) for m in t.meaning])
            except ValueError:
                raise ValueError(
                    f"trial {t.trial_id}: graded meanings must be stances as decimal strings, got {list(t.meaning)}"
                ) from None
            return graded_logits(x, self.graded_centre(t), self.params.width)
        if _is_influence(t):
            half = self.influence_margin(t) / 2
            return np.array([half if m == t.factors["group_b"] else -half for m in t.meaning])
        if _is_cue_decision(t):
            half = self.cue_margin(t) / 2
            return np.array([half if m == "benefit" else -half for m in t.meaning])
        # no planted structure: fixed pseudo-random logits
        return np.array([normal(self.params.seed, "other", t.trial_id, o) for o in t.options])

    def layer_logits(self, t: Trial, layer: int) -> np.ndarray:
        """The option logits the readout at ``layer`` reads (:class:`engines.sim.params.LayerPlant`): the stance
        terms scaled by the stance ramp, the order pull by the order ramp, the word and logic pulls by the lexical
        ramp; a graded trial's centre by the stance ramp; any other trial's logits by the stance ramp."""
        p, plant = self.params, self.params.layers
        r_s, r_o, r_x = (plant.scale(formed, layer) for formed in (plant.stance, plant.order, plant.lexical))
        inst = _instrument(t)
        if inst in ("binary", "choice"):
            self.logits(t)  # the final readout's checks of the trial
            theta = p.item_theta(t.item_id)
            scatter = p.sigma_binary * normal(p.seed, "form", *_form_key(t)) if p.sigma_binary else 0.0
            stance = (theta + scatter + self._ctx(t)) * r_s
            if inst == "choice":
                pull = p.m_choice_order * (1.0 if t.meaning[0] == "cbr" else -1.0)
                margin = (stance + pull * r_o) / (p.s_choice or p.s)
            else:
                order, word, logic = self.pull_terms(t)
                margin = (stance + order * r_o + (word + logic) * r_x) / p.s
            return np.array([margin / 2 if m == "cbr" else -margin / 2 for m in t.meaning])
        if inst == "graded":
            x = np.array([float(m) for m in t.meaning])
            return graded_logits(x, self.graded_centre(t) * r_s, p.width)
        return self.logits(t) * r_s

    def layer_readouts(self, t: Trial, final: Readout) -> tuple[LayerReadout, ...]:
        """The readout of ``t`` at each layer of ``--layers`` on the planted profile; the last layer's is the
        final readout ``final``."""
        if self.layers is None:
            return ()
        cov, last = self.params.coverage, self.params.layers.n_blocks
        out = []
        for layer in self._read:
            if layer == last:
                scores = final.scores
                logp, prob = [s.logprob for s in scores], [s.prob for s in scores]
            else:
                z = self.layer_logits(t, layer)
                prob = _softmax(z).tolist()
                logp = (z - (z.max() + math.log(np.exp(z - z.max()).sum())) + math.log(cov)).tolist()
            best = t.options[int(np.argmax(prob))]
            out.append(LayerReadout(layer, tuple(logp), tuple(prob), cov, best))
        return tuple(out)

    def influence_margin(self, t: Trial) -> float:
        """The readout log-odds of side B of an influence-audit trial (:class:`InfluencePlant`)."""
        plant = self.params.influence
        f = t.factors
        pair, direction, variant = str(f["pair"]), str(f["direction"]), str(f.get("variant", "cue"))
        shift = 0.0
        if direction in ("A", "B"):
            s_a, s_b = plant.steer_of(pair, str(f.get("influence", "")))
            scale = {"cue": 1.0, "placebo": 0.0, "negated": plant.negated}.get(variant, 1.0)
            shift = scale * (s_b if direction == "B" else -s_a)
        seed = self.params.seed
        e = plant.sigma_prompt * normal(seed, "influence-prompt", t.item_id, pair, f.get("order", ""))
        if plant.sigma_trial:
            e += plant.sigma_trial * normal(seed, "influence-trial", *_form_key(t))
        return plant.lean_of(pair) + shift + _size_shift(plant.size, f) + e + self._ctx(t)

    def cue_margin(self, t: Trial) -> float:
        """The readout log-odds of the benefit option of a Neutral or what-if trial (:class:`CuePlant`)."""
        plant = self.params.cue
        f = t.factors
        seed = self.params.seed
        neutral_benefit = uniform(seed, "cue-neutral", t.item_id, f.get("consequences", "")) < plant.neutral_benefit
        if f.get("probe") == "decision":
            chose_benefit = neutral_benefit
        else:
            arm = str(f.get("condition", ""))
            if f.get("difficulty"):
                arm += f"-{f['difficulty']}"
            event = "against" if neutral_benefit else "favor"
            rate = plant.answer_rate(event, arm, str(f.get("x_gender", "")), str(f.get("x_race", "")))
            happens = uniform(seed, "cue-event", *_form_key(t)) < rate
            chose_benefit = happens != neutral_benefit  # In-favor: benefit after a Neutral harm; Against: the reverse
        return plant.margin if chose_benefit else -plant.margin

    def probs(self, t: Trial, temperature: float = 1.0) -> np.ndarray:
        """``softmax(z / temperature)``: the readout at 1; sampling at tau draws from ``temperature = tau * T``."""
        return _softmax(self.logits(t) / temperature)

    # --------------------------------------------------------------- readout
    def readout(self, trials: Sequence[Trial], progress: ProgressFn | None = None) -> list[Readout]:
        """The answer-slot distribution of each trial: softmax of the sim's logits, times ``coverage``."""
        out = []
        cov = self.params.coverage
        for t in trials:
            z = self.logits(t)
            prob = _softmax(z)
            logp = z - (z.max() + math.log(np.exp(z - z.max()).sum())) + math.log(cov)
            scores = tuple(
                OptionScore(option=o, token_ids=_token_ids(o), logprob=lp, prob=pr)
                for o, lp, pr in zip(t.options, logp.tolist(), prob.tolist(), strict=True)
            )
            n_prompt = sum(count_tokens(m.content) for m in t.messages) + count_tokens(t.assistant_prefix)
            out.append(
                Readout(
                    trial_id=t.trial_id,
                    scores=scores,
                    coverage=cov,
                    greedy_option=t.options[int(np.argmax(prob))],
                    top_other=(("<other>", 1.0 - cov),) if cov < 1 else (),
                    prompt_tokens=n_prompt,
                    computed_tokens=n_prompt + sum(len(s.token_ids) for s in scores),
                )
            )
            if self.layers is not None:
                out[-1] = replace(out[-1], layers=self.layer_readouts(t, out[-1]))
            if progress:
                progress(1)
        return out

    # -------------------------------------------------------------- sampling
    def _sample(self, trials: Sequence[Trial], draws: Draws, progress: ProgressFn | None) -> list[Sample]:
        """``n`` answers per trial drawn from softmax(z / (temperature * T)) (argmax at 0), parsed; trial-major.

        ``stop_at_answer`` changes nothing here: a sim reply is its answer and nothing after it.

        Each draw uses three uniforms hashed from (seed, trial, draw) (refusal,
        non-commitment, option), always all three, so changing a rate does not
        move the other draws, and a draw does not depend on the batch.
        """
        draws.check()
        n, temperature = draws.n, draws.temperature
        p = self.params
        out = []
        for t in trials:
            inst = _instrument(t)
            z = self.logits(t)
            if temperature == 0:
                cdf = None
                greedy = int(np.argmax(z))
            else:
                cdf = np.cumsum(_softmax(z / (temperature * p.T)))
            n_prompt = sum(count_tokens(m.content) for m in t.messages)
            refusal = p.refusal_rate(t)
            for d in range(n):
                u_refuse, u_commit, u_option = draw_uniforms(self.seed, t.trial_id, d)
                if u_refuse < refusal:
                    text = REFUSAL_TEXT
                elif inst == "choice" and u_commit < p.noncommit:
                    text = NONCOMMIT_TEXT
                else:
                    k = greedy if cdf is None else min(int(np.searchsorted(cdf, u_option * cdf[-1])), len(cdf) - 1)
                    text = _answer_text(t.options[k], inst, d)
                parsed = _parse(text, t.options)
                out.append(
                    Sample(
                        trial_id=t.trial_id,
                        replicate=d,
                        text=text,
                        option=parsed.option,
                        status=parsed.status,
                        prompt_tokens=n_prompt,
                        completion_tokens=count_tokens(text),
                    )
                )
            if progress:
                progress(n)
        return out


def _bipolar(options: Sequence[str]) -> bool:
    """A graded scale is bipolar when its printed values go below zero (-5..5, -50..50)."""
    try:
        return min(float(o) for o in options) < 0
    except ValueError:
        return False


def _answer_text(option: str, inst: str, draw: int) -> str:
    """How the sim states an answer: a free-choice sentence naming the course, or the label in one of three forms."""
    if inst == "choice":
        return f"I would {option}."
    return (option, f"Answer: {option}", f"{option}.")[draw % 3]


# ------------------------------------------------------------------------ CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The sim's own flags (``--sim-*``)."""
    g = p.add_argument_group("synthetic subject (--model sim)")
    g.add_argument(
        "--sim-params",
        default=None,
        help="YAML file of planted parameters (engines/sim/params.py SimParams); or sim:PATH",
    )
    g.add_argument("--sim-seed", type=int, default=None, help="seed of the planted parameters (overrides the file's)")


def from_args(model: str, a: argparse.Namespace) -> SimEngine:
    """``sim`` (default parameters) or ``sim:PATH`` / ``--sim-params PATH`` (a YAML of planted parameters)."""
    spec_path = model.split(":", 1)[1] if model.startswith("sim:") else None
    flag_path = getattr(a, "sim_params", None)
    if spec_path and flag_path and Path(spec_path).resolve() != Path(flag_path).resolve():
        raise SimParamsError(
            f"two parameter files given ({spec_path} in --model, {flag_path} in --sim-params); give one"
        )
    path = spec_path or flag_path
    params = load_params(path) if path else SimParams()
    if getattr(a, "sim_seed", None) is not None:
        params = replace(params, seed=a.sim_seed)
    _, layers = check_shared(
        SUPPORTS,
        frame=getattr(a, "frame", "auto"),
        think=getattr(a, "think", False),
        layers=getattr(a, "layers", None),
    )
    return SimEngine(params, model=model, seed=getattr(a, "seed", 0), layers=layers)
