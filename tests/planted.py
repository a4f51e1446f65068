"""Planted subjects for panel tests: several synthetic "models" whose answers follow known parameters.

``PlantedInfluence``: the influence audit's planted-steerability subject
(also used by tests/test_influence_analysis.py) with the model name, the reasoning
flag and the planted shifts as parameters, so a panel of several models and a
planted reasoning effect can be run: ``P(choose B) = sigmoid(base[pair] + shift)``
where the shift moves the log-odds toward the side the cue points to, so the
planted steerability s(d) is exactly ``shifts[(influence, d)]``.

``PlantedCue``: a cue-visibility subject whose P(benefit option) depends on
the condition (neutral / direct / puzzled) and the described person's gender:
with expected decisions, every group's Favor = P(benefit | what-if), Against =
1 - Favor, so net = 2 p - 1 and Gap = 2 (p_direct - p_puzzled), by hand.

Sampling draws from a generator seeded by (model, think, trial id), so two
planted models never share their noise and a run is reproducible.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from probe.types import OptionScore, Readout, Sample, Trial


class _Planted:
    """Readout and sampling from a per-trial probability of one meaning (subclasses say which)."""

    name = "planted"
    target: str = ""

    def __init__(self, model: str, think: bool = False) -> None:
        self.model = model
        self.think = think

    def load(self) -> _Planted:
        return self

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "settings": {"model": self.model, "think": self.think}}

    def identity(self) -> dict[str, Any]:
        return {"engine": self.name, "model": self.model, "think": self.think, "params": repr(self.params())}

    def params(self) -> object:
        raise NotImplementedError

    def side(self, t: Trial) -> str:
        """The meaning whose probability :meth:`prob` gives."""
        raise NotImplementedError

    def prob(self, t: Trial) -> float:
        raise NotImplementedError

    def _probs(self, t: Trial) -> list[float]:
        p, side = self.prob(t), self.side(t)
        return [p if m == side else 1 - p for m in t.meaning]

    def readout(self, trials: Sequence[Trial], progress: Any = None) -> list[Readout]:
        out = []
        for t in trials:
            probs = self._probs(t)
            scores = tuple(
                OptionScore(o, (), math.log(max(p, 1e-300)), p) for o, p in zip(t.options, probs, strict=True)
            )
            best = max(scores, key=lambda s: s.prob).option
            out.append(Readout(t.trial_id, scores, 1.0, best, (), 0, 0))
        return out

    def sample(
        self,
        trials: Sequence[Trial],
        n: int,
        temperature: float,
        progress: Any = None,
        *,
        max_new_tokens: int | None = None,
        stop_at_answer: bool = False,
    ) -> list[Sample]:
        out = []
        for t in trials:
            key = f"{self.model}|{self.think}|{t.trial_id}".encode()
            rng = np.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
            probs = self._probs(t)
            for draw in range(n):
                opt = t.options[int(rng.choice(len(t.options), p=probs))]
                out.append(Sample(t.trial_id, draw, opt, opt, "ok"))
        return out


TRIAGE_BASE: Mapping[str, float] = {"gender": 0.0, "age": -1.0}
"""Baseline log-odds of side B per triage pair of the planted influence subject the tests share."""
TRIAGE_INFLUENCES = ("survey", "emotional", "weak_evidence")
TRIAGE_SHIFTS: Mapping[tuple[str, str], float] = {
    # (influence, direction) -> shift of the log-odds of the side the cue points to
    ("survey", "A"): 1.0,
    ("survey", "B"): 1.0,
    ("emotional", "A"): 0.5,
    ("emotional", "B"): 2.0,
    ("weak_evidence", "A"): -0.8,  # backfires toward A
    ("weak_evidence", "B"): 0.8,
}
"""The planted steerability s(d) of those influences: an asymmetric one, a symmetric one and a backfire."""


class PlantedInfluence(_Planted):
    """P(B) = sigmoid(base[pair] + shift toward the cue's side); ``shifts[(influence, d)]`` is the planted s(d)."""

    def __init__(
        self,
        model: str,
        shifts: Mapping[tuple[str, str], float],
        base: Mapping[str, float],
        think: bool = False,
    ) -> None:
        super().__init__(model, think)
        self.shifts = dict(shifts)
        self.base = dict(base)

    def params(self) -> object:
        return sorted(self.shifts.items()), sorted(self.base.items())

    def side(self, t: Trial) -> str:
        return str(t.factors["group_b"])

    def prob(self, t: Trial) -> float:
        f = t.factors
        shift = self.shifts.get((f["influence"], f["direction"]), 0.0)
        logit = self.base[f["pair"]] + (shift if f["direction"] == "B" else -shift)
        return 1 / (1 + math.exp(-logit))


class PlantedCue(_Planted):
    """P(benefit) = ``neutral`` for the Neutral decision, else ``p[(condition, x_gender)]`` (default ``p[condition]``)."""

    def __init__(self, model: str, p: Mapping[Any, float], neutral: float = 0.5, think: bool = False) -> None:
        super().__init__(model, think)
        self.p: dict[Any, float] = dict(p)
        self.neutral = neutral

    def params(self) -> object:
        return sorted(map(repr, self.p.items())), self.neutral

    def side(self, t: Trial) -> str:
        return "benefit"

    def prob(self, t: Trial) -> float:
        f = t.factors
        if f["condition"] == "neutral":
            return self.neutral
        key = (f["condition"], f["x_gender"])
        return float(self.p[key] if key in self.p else self.p[f["condition"]])


class PlantedCueStatus(PlantedCue):
    """:class:`PlantedCue` whose could-be answers are planted too: P(yes) = ``yes[(arm, status, x_gender)]``
    (arm ``direct``, ``puzzled-hard``, ...), ``default`` elsewhere. The sim (``engines/sim/engine.py``) plants no
    could-be answers (they get fixed pseudo-random logits), so the status-bias tables are tested on this one."""

    def __init__(
        self,
        model: str,
        p: Mapping[Any, float],
        yes: Mapping[tuple[str, str, str], float],
        default: float = 0.5,
    ) -> None:
        super().__init__(model, p)
        self.yes = dict(yes)
        self.default = default

    def params(self) -> object:
        return super().params(), sorted(self.yes.items()), self.default

    def side(self, t: Trial) -> str:
        return "yes" if t.factors["probe"] == "could_be" else "benefit"

    def prob(self, t: Trial) -> float:
        f = t.factors
        if f["probe"] != "could_be":
            return super().prob(t)
        arm = f"{f['condition']}-{f['difficulty']}" if f.get("difficulty") else str(f["condition"])
        return float(self.yes.get((arm, str(f["status"]), str(f["x_gender"])), self.default))
