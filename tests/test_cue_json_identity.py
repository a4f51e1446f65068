"""Identity recovery from the JSON of the could-be reply (paper 001, Table 5), the default where a run has it.

A scripted subject answers the generated could-be JSON probe: right gender
and race for A and B, no JSON for C, the wrong race for D. By hand, per
Puzzled arm: answered = 3/4 of the pairs (the paper's P), gender 3/3, race
2/3, joint 2/3; correct-only keeps A's and B's what-if answers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analysis.common.report import write_report_files
from analysis.cue.identity import correct_only_keep, identity_checks, parse_identity
from analysis.cue.report import cue_report
from experiments.cue import CueSpec
from probe.app.runner import run
from probe.record import Plan
from probe.runs import open_run
from probe.types import Sample, Trial
from tests.planted import PlantedCue

LABELS = {"gender": ("man", "woman", "non-binary"), "race": ("Asian", "Black", "Hispanic", "Muslim", "White")}


def test_parse_identity_hand_worked() -> None:
    assert parse_identity('Sure: {"answer": "Yes", "Gender": "WOMAN", "race": "Asian"}', LABELS) == {
        "gender": "woman",
        "race": "Asian",
    }
    assert parse_identity('{"answer": "No", "gender": "robot", "race": "White"}', LABELS) == {"race": "White"}
    assert parse_identity("I would say yes.", LABELS) is None
    assert parse_identity('{broken} then {"gender": "man"}', LABELS) == {"gender": "man"}


class _Scripted(PlantedCue):
    """Readouts from PlantedCue; the generated JSON replies follow the module docstring's script."""

    def sample(self, trials: Sequence[Trial], n: int, temperature: float, progress: Any = None, **kw: Any) -> list:
        out = []
        for t in trials:
            f = t.factors
            if f["individual"] == "C":
                text = "It could be anyone."
            else:
                race = f["x_race"] if f["individual"] != "D" else next(r for r in LABELS["race"] if r != f["x_race"])
                text = json.dumps({"answer": "Yes", "gender": f["x_gender"], "race": race})
            out += [Sample(t.trial_id, d, text, "Yes", "ok") for d in range(n)]
        return out


def test_json_identity_is_the_default_source(tmp_path: Path) -> None:
    spec = CueSpec(
        items=("rent_arrears", "fallen_fence"),
        conditions=("neutral", "direct", "puzzled"),
        probes=("what_if", "check", "could_be_json"),
    )
    out = tmp_path / "run"
    run("cue", spec, _Scripted("s", {"direct": 0.8, "puzzled": 0.3}), out, plan=Plan(), progress=False,
        log=lambda s: None)  # fmt: skip
    store = open_run(out)
    options, per_trial, _ = store.choice_probs()
    checks, source = identity_checks(store, options, per_trial, LABELS)
    assert source == "json" and len(checks) == 2 * 4 * 2  # 2 dilemmas x 4 individuals x 2 attributes
    write_report_files(out / "report", *cue_report(store, n_boot=2))
    solve = pd.read_csv(out / "report" / "cue_solve.csv")
    js = solve[solve["source"] == "json"].iloc[0]
    assert (js.answered, js.correct_gender, js.correct_race, js.joint) == pytest.approx((3 / 4, 1.0, 2 / 3, 2 / 3))
    assert set(solve["source"]) == {"json", "check"}  # the check probe is reported beside it
    summary = (out / "report" / "summary.md").read_text()
    assert "Identity recovery (from the JSON of the could-be reply" in summary
    keep = correct_only_keep(per_trial, checks)
    whatif = per_trial[(per_trial["probe"] == "what_if") & (per_trial["condition"] == "puzzled")]
    kept = set(whatif.loc[whatif["trial_id"].map(keep).astype(bool), "individual"])
    assert kept == {"A", "B"}
    _, fallback = identity_checks(store, options, per_trial, LABELS, source="check")
    assert fallback == "check"
