"""The three benchmark workloads, expanded from the project's real batteries.

* ``forced_binary``: the yes/no battery of :mod:`experiments.yesno` (verb x
  printed order x wording form per dilemma; two single-token options).
* ``graded``: each dilemma story under 12 graded forms (wording x anchor
  direction x pole) asking for a rating from 0 to 100, with the 101 numbers as
  options. With Qwen-style digit splitting ``7`` is one token, ``42`` two and
  ``100`` three, and ``1`` / ``10`` / ``100`` are prefixes of each other: the
  multi-token, prefix-sharing case.
* ``salted``: the yes/no battery with K salted replicates (the unsalted one
  included); a salt at the start of the user message breaks the shared prefix
  between replicates, so this is the case where less is shared.

A workload is pure data (:class:`WorkloadSpec`), so the peer subprocesses
expand exactly the same trials from the same spec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from probe.types import Message, Trial, make_trial_id

NAMES = ("forced_binary", "graded", "salted")

# wording -> question; {act} is the pole's verb phrase.
GRADED_WORDINGS: dict[str, str] = {
    "acceptable": "How morally acceptable is it to {act}?",
    "permissible": "How permissible is it for you to {act}?",
    "should": "To what extent should you {act}?",
}
GRADED_ANCHORS: dict[str, str] = {
    "ascending": "Answer on a scale from 0 (not at all) to 100 (completely), with a number only.",
    "descending": "Answer on a scale from 0 (completely) to 100 (not at all), with a number only.",
}
SCALE = tuple(str(v) for v in range(101))


@dataclass(frozen=True)
class WorkloadSpec:
    """Which workload, on which dilemmas (empty = all), with how many salted replicates."""

    name: str
    items: tuple[str, ...] = ()
    salts: int = 1

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            raise ValueError(f"unknown workload {self.name!r}; choose from {', '.join(NAMES)}")
        if self.salts < 1:
            raise ValueError(f"salts must be >= 1, got {self.salts}")


def graded_trials(items: tuple[str, ...] = ()) -> list[Trial]:
    """Each dilemma under 12 graded forms (wording x anchor x pole), options 0..100."""
    from experiments.dilemmas import load_dilemmas

    dilemmas = [d for d in load_dilemmas(None) if not items or d.id in items]
    out = []
    for d in dilemmas:
        for wording, question in GRADED_WORDINGS.items():
            for anchor, scale in GRADED_ANCHORS.items():
                for pole in ("action", "complement"):
                    act = d.action if pole == "action" else d.complement
                    factors = {"wording": wording, "anchor": anchor, "pole": pole}
                    out.append(
                        Trial(
                            trial_id=make_trial_id("bench_graded", d.id, factors, "", 0),
                            experiment="bench_graded",
                            item_id=d.id,
                            factors=factors,
                            messages=(Message("user", f"{d.story}\n\n{question.format(act=act)} {scale}"),),
                            options=SCALE,
                            meaning=SCALE,
                        )
                    )
    return out


def expand_workload(spec: WorkloadSpec, count_tokens: Callable[[str], int]) -> list[Trial]:
    """The trials of ``spec`` in a fixed order (``count_tokens`` draws salts to a fixed token length)."""
    from experiments.yesno import YesNoSpec, expand
    from probe.salts import SaltSpec

    if spec.name == "graded":
        return graded_trials(spec.items)
    salts = SaltSpec(count=spec.salts if spec.name == "salted" else 1)
    return expand(YesNoSpec(items=spec.items, salts=salts), count_tokens=count_tokens)
