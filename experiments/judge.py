"""Judges that turn free-choice replies into verdicts: PRO (the cost-benefit course), ANTI, NONCOMMIT.

Two judges, one interface (``judge(trials, samples) -> DataFrame``):

* ``rule`` (default): the reply commits to a course when it names exactly one
  of the two printed course phrases (case-insensitive), or when the shared
  parser finds exactly one of them; a refusal or a reply naming both or
  neither is NONCOMMIT. Deterministic and free, and honest about its limits:
  a reply that paraphrases the course is NONCOMMIT.
* a **logit judge**: any logit engine (the tiny model, a local model, a hub
  id) is asked which course the reply chooses and read at the answer slot
  over the three verdict labels; the whole distribution is kept, not just
  its argmax.

Every judgment stores the judge's name and, for the logit judge, the judge
prompt is reproducible from the trial and the transcript (kept in the run's
``generations`` table) for audit.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence
from typing import Any

import pandas as pd

from engines import make_engine
from probe.parse import parse_answer, split_reasoning
from probe.tables import JUDGMENTS
from probe.types import Message, Sample, Trial

VERDICTS = ("PRO", "ANTI", "NONCOMMIT")


def _verdict_of(trial: Trial, option: str) -> str:
    return "PRO" if trial.meaning[trial.options.index(option)] == "cbr" else "ANTI"


def rule_verdict(trial: Trial, text: str, *, think: bool) -> str:
    """PRO / ANTI / NONCOMMIT from which printed course the reply names (``think``: the reply's mode, as in
    :func:`probe.parse.split_reasoning`)."""
    _, answer = split_reasoning(text, think=think)
    low = answer.casefold()
    named = [o for o in trial.options if o.casefold() in low]
    if len(named) == 1:
        return _verdict_of(trial, named[0])
    parsed = parse_answer(answer, trial.options, think=think)
    if parsed.option is not None and len(named) != 2:
        return _verdict_of(trial, parsed.option)
    return "NONCOMMIT"


class RuleJudge:
    name = "rule"

    def __init__(self, *, think: bool) -> None:
        self.think = think
        """The judged replies come from a think-mode run (where their think block ends, :mod:`probe.parse`)."""

    def identity(self) -> dict[str, Any]:
        return {"judge": self.name}

    def judge(self, trials: Sequence[Trial], samples: Sequence[Sample]) -> pd.DataFrame:
        by_id = {t.trial_id: t for t in trials}
        rows = []
        for s in samples:
            v = rule_verdict(by_id[s.trial_id], s.text, think=self.think) if s.status != "error" else "NONCOMMIT"
            rows.append(
                {
                    "trial_id": s.trial_id,
                    "draw": s.replicate,
                    "verdict": v,
                    "p_pro": float(v == "PRO"),
                    "p_anti": float(v == "ANTI"),
                    "p_noncommit": float(v == "NONCOMMIT"),
                    "judge": self.name,
                }
            )
        return JUDGMENTS.write(rows)


JUDGE_TEMPLATE = (
    "You are labelling a reply to a moral dilemma. The two possible courses of action were:\n"
    "PRO: {pro}\nANTI: {anti}\n\nThe reply was:\n<<<\n{reply}\n>>>\n\n"
    "Which course does the reply choose? Answer PRO, ANTI, or NONCOMMIT if it does not commit to either."
)


def judge_trial(trial: Trial, sample: Sample, *, think: bool) -> Trial:
    """The judge's own trial for one reply (options are the three verdict labels; ``think``: the reply's mode)."""
    pro = trial.options[trial.meaning.index("cbr")]
    anti = trial.options[trial.meaning.index("anti")]
    _, reply = split_reasoning(sample.text, think=think)
    text = JUDGE_TEMPLATE.format(pro=pro, anti=anti, reply=reply.strip() or "(empty)")
    return Trial(
        trial_id=f"{trial.trial_id}:{sample.replicate}",
        experiment="judge",
        item_id=trial.item_id,
        factors={},
        messages=(Message("user", text),),
        options=VERDICTS,
        meaning=VERDICTS,
    )


class LogitJudge:
    """A logit engine read over PRO / ANTI / NONCOMMIT."""

    def __init__(self, engine: Any, *, think: bool) -> None:
        self.engine = engine
        self.think = think
        """The judged replies come from a think-mode run (the judge itself never reasons)."""
        self.name = f"logit:{engine.describe()['settings']['model'] if hasattr(engine, 'settings') else engine.name}"

    def identity(self) -> dict[str, Any]:
        return {"judge": "logit", **self.engine.identity()}

    def judge(self, trials: Sequence[Trial], samples: Sequence[Sample]) -> pd.DataFrame:
        by_id = {t.trial_id: t for t in trials}
        jt = [judge_trial(by_id[s.trial_id], s, think=self.think) for s in samples]
        rows = []
        for s, r in zip(samples, self.engine.readout(jt), strict=True):
            p = {sc.option: sc.prob for sc in r.scores}
            rows.append(
                {
                    "trial_id": s.trial_id,
                    "draw": s.replicate,
                    "verdict": r.greedy_option,
                    "p_pro": p["PRO"],
                    "p_anti": p["ANTI"],
                    "p_noncommit": p["NONCOMMIT"],
                    "judge": self.name,
                }
            )
        return JUDGMENTS.write(rows)


def judge_engine(spec: str, args: argparse.Namespace | None = None) -> Any:
    """Build and load the engine of a judge model ``spec`` with the run's engine flags, never in think mode.

    Shared by every judge (this module's verdicts, :mod:`probe.app.coding`'s codes): the
    judge answers at once, with no system prompt of the subject's.
    """
    a = copy.copy(args) if args is not None else argparse.Namespace()
    defaults = {
        "dtype": "auto",
        "device": "auto",
        "batch_size": 16,
        "think_budget": 512,
        "system": None,
        "max_new_tokens": 32,
        "seed": 0,
        "revision": None,
        "trust_remote_code": False,
    }
    for k, v in defaults.items():
        if not hasattr(a, k):
            setattr(a, k, v)
    a.model, a.engine, a.think, a.system = spec, "auto", False, None
    return make_engine(a).load()


def make_judge(spec: str, args: argparse.Namespace | None = None) -> RuleJudge | LogitJudge:
    """``rule`` or a logit model spec (built with the run's engine flags, never in think mode); an API model spec
    is :func:`experiments.judge_api.make_free_choice_judge`'s.

    The judge reads the run's replies in the run's mode (``args.think``): where a reply's think block ends.
    """
    think = bool(getattr(args, "think", False))
    if spec == "rule":
        return RuleJudge(think=think)
    engine = judge_engine(spec, args)
    if not hasattr(engine, "readout"):
        raise ValueError(
            f"judge {spec!r} is not a logit engine; use 'rule', a local model, or an API model "
            "(openai:<model>, anthropic:<model>, openai-compatible:<name>@<url>)"
        )
    return LogitJudge(engine, think=think)
