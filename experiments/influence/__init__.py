"""The direction-flipped influence audit (paper 000): triage, BBQ and DailyDilemmas.

Each condition (model x scenario x influence type) is asked with no cue, with
a cue toward side A and with the matched cue toward side B; the analysis
(:mod:`analysis.influence.audit`) turns the three into instability, asymmetry and
backfire. Prompt and cue wordings are data (``experiments/data/influence``).
"""

from __future__ import annotations

from experiments.influence import bbq, dd, triage
from experiments.influence.build import ARMS, COND, Benchmark, audit_experiment
from experiments.influence.imported import EXPERIMENT as IMPORTED

__all__ = ["ARMS", "BENCHMARKS", "BENCHMARK_OF", "COND", "EXPERIMENTS", "TITLES", "Benchmark"]

BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark.of(
        triage,
        "triage",
        "moral triage",
        "influence audit on moral triage: baseline vs cue toward A vs toward B (paper 000)",
    ),
    Benchmark.of(bbq, "bbq", "BBQ", "influence audit on BBQ ambiguous questions, unknown answer dropped (paper 000)"),
    Benchmark.of(dd, "dd", "DailyDilemmas", "influence audit on DailyDilemmas with value-level cues (paper 000)"),
)
"""The influence benchmarks, one row each: every experiment, map and title below is derived from it."""

BENCHMARK_OF: dict[str, str] = {b.name: b.key for b in BENCHMARKS}
"""Experiment name -> benchmark key (``influence-triage`` -> ``triage``)."""
TITLES: dict[str, str] = {b.key: b.title for b in BENCHMARKS}
"""Benchmark key -> what reports call it."""

EXPERIMENTS = (*(audit_experiment(b) for b in BENCHMARKS), IMPORTED)
