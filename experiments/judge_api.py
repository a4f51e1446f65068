"""The free-choice (I-2) judge through the API engine: ``--judge openai:<model>``, ``anthropic:<model>`` or
``openai-compatible:<name>@<url>``.

Paper 003 judged its free-choice transcripts with a frontier model ("verdicts (PRO/ANTI/NONCOMMIT) are judged from
the free text by Claude Opus 4.8"). This judge asks the same question as the local logit judge
(:data:`experiments.judge.JUDGE_TEMPLATE`, one user message per reply, built by
:func:`experiments.judge.judge_trial`), but samples the answer through the project's API engine (its transport,
retries, concurrency and spending limits: the engine :func:`experiments.judge.judge_engine` builds from the run's
flags) and parses the reply into PRO, ANTI or NONCOMMIT with the shared parser. It writes the run's
``judgments`` table in the local judge's format (:data:`probe.tables.JUDGMENTS`), which the battery's I-2 section
reads (:func:`analysis.battery.results.compute_choice`).

* ``n`` draws per reply (default 1, at temperature 0: a transcription task); ``p_pro``, ``p_anti``,
  ``p_noncommit`` are the shares of the parsed draws, ``verdict`` the most frequent (ties: NONCOMMIT).
* A judge answer that parses into no verdict (every draw off the three labels, or a refusal) is NONCOMMIT with
  ``p_noncommit = 1``: the judge did not name a course, so the reply is not counted for either; the run's
  ``judge`` column names the judge, and the count of such answers goes to the judge's log line.
* An ``openai-compatible:`` judge is always sampled (``/v1/chat/completions``), never read at the slot through
  the server engine, so that every API judge answers the same way whatever its provider.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from experiments.judge import VERDICTS, judge_engine, judge_trial, make_judge
from probe.tables import JUDGMENTS
from probe.types import Sample, Trial

API_SCHEMES = ("openai:", "anthropic:", "openai-compatible:")
"""The model specs of the API engine (:mod:`engines`'s scheme table): a judge named so is sampled."""


def is_api_spec(spec: str) -> bool:
    """``spec`` names a model behind the API engine (``openai:``, ``anthropic:``, ``openai-compatible:``)."""
    return spec.startswith(API_SCHEMES)


def shares(draws: Sequence[Sample]) -> dict[str, float] | None:
    """The share of each verdict among the draws that parsed into one; None when none did."""
    parsed = [s.option for s in draws if s.status == "ok" and s.option in VERDICTS]
    if not parsed:
        return None
    return {v: parsed.count(v) / len(parsed) for v in VERDICTS}


def verdict_of(p: dict[str, float] | None) -> str:
    """The most frequent verdict; NONCOMMIT on a tie or when no draw parsed."""
    if p is None:
        return "NONCOMMIT"
    top = max(p.values())
    best = [v for v in VERDICTS if p[v] == top]
    return best[0] if len(best) == 1 else "NONCOMMIT"


class ApiJudge:
    """PRO / ANTI / NONCOMMIT sampled from an API model on :data:`experiments.judge.JUDGE_TEMPLATE`."""

    def __init__(
        self,
        engine: Any,
        spec: str,
        *,
        think: bool,
        n: int = 1,
        temperature: float = 0.0,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if n < 1:
            raise ValueError(f"an API judge needs n >= 1 draws per reply, got {n}")
        if temperature < 0:
            raise ValueError(f"an API judge's temperature must be >= 0, got {temperature}")
        self.engine = engine
        self.think = think
        """The judged replies come from a think-mode run (the judge itself never reasons)."""
        self.n = n
        self.temperature = temperature
        self.name = f"api:{spec}"
        self.unparsed = 0
        """Judge answers so far that parsed into no verdict (counted NONCOMMIT)."""
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    def identity(self) -> dict[str, Any]:
        return {"judge": "api", "n": self.n, "temperature": self.temperature, **self.engine.identity()}

    def judge(self, trials: Sequence[Trial], samples: Sequence[Sample]) -> pd.DataFrame:
        by_id = {t.trial_id: t for t in trials}
        jt = [judge_trial(by_id[s.trial_id], s, think=self.think) for s in samples]
        draws: dict[str, list[Sample]] = {}
        for d in self.engine.sample(jt, self.n, self.temperature, stop_at_answer=True) if jt else []:
            draws.setdefault(d.trial_id, []).append(d)
        rows = []
        unparsed = 0
        for s, t in zip(samples, jt, strict=True):
            p = shares(draws.get(t.trial_id, [])) if s.status != "error" else None
            unparsed += p is None and s.status != "error"
            q = p or {"PRO": 0.0, "ANTI": 0.0, "NONCOMMIT": 1.0}
            rows.append(
                {
                    "trial_id": s.trial_id,
                    "draw": s.replicate,
                    "verdict": verdict_of(p),
                    "p_pro": q["PRO"],
                    "p_anti": q["ANTI"],
                    "p_noncommit": q["NONCOMMIT"],
                    "judge": self.name,
                }
            )
        if unparsed:
            self.unparsed += unparsed
            self._log(f"judge {self.name}: {unparsed} of {len(jt)} answers named no verdict (counted NONCOMMIT)")
        return JUDGMENTS.write(rows)


def make_api_judge(spec: str, args: argparse.Namespace | None = None) -> ApiJudge:
    """The API judge for ``spec``, its engine built with the run's flags (never in think mode, never a readout)."""
    if not is_api_spec(spec):
        raise ValueError(
            f"{spec!r} is not an API model spec; use openai:<model>, anthropic:<model> or "
            "openai-compatible:<name>@<url>"
        )
    subject = str(getattr(args, "model", ""))
    if getattr(args, "dry_run", False) and not is_api_spec(subject):
        raise ValueError(
            f"--dry-run estimates an API subject's calls and stops before the first; with the local subject "
            f"{subject!r} the run would go on and call the judge {spec} for real: drop --dry-run (the judge makes "
            "one call per free-choice reply)"
        )
    a = copy.copy(args) if args is not None else argparse.Namespace()
    a.no_readout = True  # sampled, whatever the provider (module docstring)
    engine = judge_engine(spec, a)
    return ApiJudge(engine, spec, think=bool(getattr(args, "think", False)))


def make_free_choice_judge(spec: str, args: argparse.Namespace | None = None) -> Any:
    """The run's ``--judge``: an API model spec gives an :class:`ApiJudge`, anything else
    :func:`experiments.judge.make_judge` (``rule`` or a logit model)."""
    return make_api_judge(spec, args) if is_api_spec(spec) else make_judge(spec, args)
