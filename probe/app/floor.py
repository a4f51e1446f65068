"""A run's own numeric floor: how much its readouts move when a trial is read alone instead of in its batch.

In float32 the Transformers engine's readout paths agree within 3.2e-5 nats (smol); in bfloat16 the same trial
read in another batch, on another path or with another tree size moves by up to a few tenths of a nat
(docs/gpu.md). So every run that reads the slot with a local model measures its own floor once its trials are
done: it re-reads a fixed sample of :data:`FLOOR_TRIALS` of them alone (batch size 1, the plain path: the
reference every path is tested against) and records the largest difference from the stored readouts in the
manifest (``numeric_floor``). The report prints it in "What the numbers rest on" (:func:`analysis.common.checks.floor_line`): differences between readouts
below the floor mean nothing.

In think mode the stored readouts were read after reasoning that a re-read would have to generate again (at
budget length, one trial at a time); there the floor is measured on the slots without reasoning instead: the
same sample read in one batch and alone, which is the same rounding question.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engines.base import ReadsAlone, ReasonsFirst
from probe.types import Readout, Trial

FLOOR_TRIALS = 32
"""Trials of the sample that is re-read alone (a few seconds of a run; enough to find the large differences).
``PROBE_FLOOR_TRIALS`` sets another number (0: no floor)."""


def floor_trials() -> int:
    """How many trials the floor re-reads: ``PROBE_FLOOR_TRIALS``, else :data:`FLOOR_TRIALS`."""
    import os

    raw = os.environ.get("PROBE_FLOOR_TRIALS", "")
    try:
        n = int(raw) if raw else FLOOR_TRIALS
    except ValueError:
        raise ValueError(f"PROBE_FLOOR_TRIALS must be a whole number of trials (0: no floor), got {raw!r}") from None
    if n < 0:
        raise ValueError(f"PROBE_FLOOR_TRIALS must be >= 0 (0: no floor), got {n}")
    return n


def floor_sample(trials: Sequence[Trial], k: int | None = None) -> list[Trial]:
    """``k`` of ``trials``, the same for every run of the same trials: the smallest hashes of their trial ids."""
    k = floor_trials() if k is None else k
    return sorted(trials, key=lambda t: hashlib.sha256(t.trial_id.encode()).hexdigest())[:k]


def floor_figures(
    reference: Mapping[str, tuple[Sequence[float], Sequence[float], str]], alone: Sequence[Readout]
) -> dict[str, Any]:
    """The largest |logprob| and |p| difference and the greedy flips between ``reference`` (trial id -> (option
    logprobs, option probabilities, greedy option)) and the same trials read ``alone``."""
    lp = p = 0.0
    flips = 0
    for r in alone:
        logprobs, probs, greedy = reference[r.trial_id]
        lp = max([lp, *(abs(s.logprob - x) for s, x in zip(r.scores, logprobs, strict=True))])
        p = max([p, *(abs(s.prob - x) for s, x in zip(r.scores, probs, strict=True))])
        flips += r.greedy_option != greedy
    return {"trials": len(alone), "max_logprob_diff": lp, "max_prob_diff": p, "greedy_flips": flips}


def of_readouts(readouts: Sequence[Readout]) -> dict[str, tuple[list[float], list[float], str]]:
    return {r.trial_id: ([s.logprob for s in r.scores], [s.prob for s in r.scores], r.greedy_option) for r in readouts}


def of_tables(options: Any, per_trial: Any) -> dict[str, tuple[list[float], list[float], str]]:
    """The stored readouts (the ``readout_options`` and ``readout_trials`` tables) as :func:`floor_figures` takes them."""
    greedy = dict(zip(per_trial["trial_id"], per_trial["greedy_option"], strict=True))
    out: dict[str, tuple[list[float], list[float], str]] = {}
    for tid, rows in options.sort_values(["trial_id", "option_index"]).groupby("trial_id", sort=False):
        out[str(tid)] = (rows["logprob"].tolist(), rows["prob"].tolist(), str(greedy[tid]))
    return out


def measure_floor(
    engine: object,
    trials: Sequence[Trial],
    stored: Callable[[], Mapping[str, tuple[Sequence[float], Sequence[float], str]]],
) -> dict[str, Any] | None:
    """The floor of a run on ``engine`` (None where the engine cannot read a trial alone: sim, api).

    ``stored()`` gives the run's stored readouts; it is not called in think mode (see the module docstring).
    """
    if not isinstance(engine, ReadsAlone) or not trials:
        return None
    think = engine.settings.think
    if think and not isinstance(engine, ReasonsFirst):
        return None
    sample = floor_sample(trials)
    if not sample:
        return None
    reference: Mapping[str, tuple[Sequence[float], Sequence[float], str]]
    if isinstance(engine, ReasonsFirst) and think:
        batched_engine = engine.without_reasoning()
        reference = of_readouts(batched_engine.readout(sample))
        solo = batched_engine.reading_alone()
    else:
        wanted = {t.trial_id for t in sample}
        reference = {tid: ref for tid, ref in stored().items() if tid in wanted}
        solo = engine.reading_alone()
    alone = [solo.readout([t])[0] for t in sample]
    figures = floor_figures(reference, alone)
    figures["how"] = (
        "the slots without reasoning, read in one batch and alone (think mode)"
        if think
        else "re-read alone (batch size 1, plain path) against the run's stored readouts"
    )
    figures["dtype"] = engine.describe().get("dtype")
    return figures
