"""The inputs and comparisons of the GPU check's tiny-model steps: its trials, engines and differences.

:func:`parity_trials` (binary, 0-10 and 0-100 answers on :data:`PROMPTS`) and :func:`binary_trials`
(:data:`ASKS`) are the trials every step reads; :func:`engine` builds a Transformers engine on a device and
dtype, :func:`paths_of` lists its readout paths, and :func:`logprobs` and :func:`difference` compare two
paths' readouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PROMPTS = (
    "You are on a bridge over a track. Five people will die unless you push a man off. Is it acceptable to push him?",
    "A doctor could save five patients by taking one healthy visitor's organs. Should the doctor do it?",
    "You pass a child drowning in a pond; saving her ruins your suit. Must you save her?",
    "A hospital must cut its budget: fund the expensive treatment for one or cheap care for many?",
    "You promised a dying friend to hide his diary, but it proves another man innocent. Do you reveal it?",
    "The city can add a chemical to the water that prevents a disease but harms a few. Should it?",
    "Is it right to lie to protect a friend's feelings?",
    "Should a journalist publish a leaked document that endangers one source but informs millions?",
    "May a starving man steal bread from a rich baker?",
    "Should you report a colleague who cheats on small expenses?",
    "Is it wrong to break a law that is unjust?",
    "Should a self-driving car swerve to save five pedestrians and kill its passenger?",
    "Is it acceptable to eat meat?",
)
"""Thirteen dilemmas, each asked three ways: 39 trials."""


def parity_trials() -> list[Any]:
    """The 39 trials of the parity step: each prompt as Yes/No, as 0-10 and as 0-100 (multi-token options)."""
    from probe.types import Message, Trial

    out = []
    for k, text in enumerate(PROMPTS):
        for name, suffix, options in (
            ("yn", "Answer with Yes or No.", ("Yes", "No")),
            ("s10", "On a scale from 0 to 10, answer with a number only.", tuple(str(i) for i in range(11))),
            ("s100", "On a scale from 0 to 100, answer with a number only.", tuple(str(i) for i in range(101))),
        ):
            msgs = (Message("user", f"{text} {suffix}"),)
            out.append(Trial(f"{name}-{k}", "device_check", f"item{k}", {}, msgs, options, options))
    return out


ASKS = (
    "Answer with Yes or No.",
    "Reply Yes or No.",
    "Say Yes or No.",
    "Answer Yes or No only.",
    "Is the answer Yes or No?",
    "Yes or No?",
)
"""Six ways to ask for a forced binary: the moe steps' 78 forced-binary trials are the thirteen dilemmas x these (each
story shared by six prompts, as in a battery)."""


def binary_trials() -> list[Any]:
    """The moe steps' forced-binary trials: every prompt asked each way of :data:`ASKS` (78 distinct prompts)."""
    from probe.types import Message, Trial

    return [
        Trial(
            f"bin-{k}-{j}",
            "device_check",
            f"item{k}",
            {},
            (Message("user", f"{text} {ask}"),),
            ("Yes", "No"),
            ("Yes", "No"),
        )
        for k, text in enumerate(PROMPTS)
        for j, ask in enumerate(ASKS)
    ]


def logprobs(readouts: Sequence[Any]) -> list[list[float]]:
    return [[s.logprob for s in r.scores] for r in readouts]


def difference(a: Sequence[Any], b: Sequence[Any]) -> dict[str, float | int]:
    """Largest |logprob| and |p| difference over every option of every trial, and greedy options that differ."""
    lp = max(
        abs(x.logprob - y.logprob) for r, s in zip(a, b, strict=True) for x, y in zip(r.scores, s.scores, strict=True)
    )
    p = max(abs(x.prob - y.prob) for r, s in zip(a, b, strict=True) for x, y in zip(r.scores, s.scores, strict=True))
    flips = sum(r.greedy_option != s.greedy_option for r, s in zip(a, b, strict=True))
    return {"max_logprob_diff": lp, "max_prob_diff": p, "greedy_flips": flips}


def engine(model: str, device: str, dtype: str, **settings: Any) -> Any:
    from engines.hf import HFEngine, HFSettings

    return HFEngine(HFSettings(model=model, device=device, dtype=dtype, **settings)).load()


def paths_of(e: Any) -> list[str]:
    return ["branch", "plain"] if e.lm.tree_unsupported() else ["tree", "branch", "plain"]
