"""FormalNamed (paper 001, App. S): the Named block plus the Puzzled skeleton over abstract attributes.

Checks: the FormalNamed prompt carries the same puzzle (same id, same clue
structure) as the Puzzled prompt of the item, rendered over favorite numbers
and letters, with the names and no demographic word; its unique solution is
the puzzle's; and on a planted subject the report's share of the gap via
FormalNamed is gap(FN) / gap(P), by hand.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analysis.common.report import write_report_files
from analysis.cue.metrics import decision_bias, formal_named_share
from analysis.cue.report import cue_report
from experiments.cue import CueSpec, build_design, expand
from experiments.cue.prompts import formal_attributes, formal_binding
from experiments.cue.puzzles import solutions
from probe.app.runner import run
from probe.runs import open_run
from tests.planted import PlantedCue

SPEC = CueSpec(
    items=("rent_arrears", "fallen_fence"),
    conditions=("neutral", "direct", "puzzled", "formal_named"),
    probes=("what_if", "check"),
)


def test_formal_named_prompt_is_the_puzzle_skeleton_over_abstract_attributes() -> None:
    trials = expand(SPEC)
    design = build_design(SPEC)
    fn = [t for t in trials if t.factors["condition"] == "formal_named"]
    pz = [t for t in trials if t.factors["condition"] == "puzzled"]
    assert fn and len(fn) == len(pz)  # the same probes, individuals and checks
    assert {t.factors["difficulty"] for t in fn} == {"hard"}
    words = [c.label for a in SPEC.attributes() for c in a.categories]
    for t in fn:
        text = t.messages[-1].content
        puzzle = next(p for p in design.puzzles["hard"] if p.id == t.factors["puzzle"])
        for line in puzzle.render(formal_binding()):
            assert line in text
        names = design.names[(t.item_id, int(t.factors["combo"]))]
        assert all(f"{w}: {n}" in text for w, n in zip("ABCD", names, strict=True))
        block = text.split("\n\n")[1]  # the people block (situation, people, options, question)
        assert not any(re.search(rf"\b{re.escape(w)}\b", block) for w in words)
    # the same puzzle id in both conditions of an item, and one solution over the abstract words too
    by_item = {(t.item_id, t.factors["combo"]): t.factors["puzzle"] for t in pz}
    assert all(by_item[(t.item_id, t.factors["combo"])] == t.factors["puzzle"] for t in fn)
    puzzle = design.puzzles["hard"][0]
    assert len(solutions(puzzle.clues)) == 1
    assert [c.label for c in formal_attributes()[0].categories] == ["1", "2"]


def test_the_share_of_the_gap_via_formal_named_by_hand(tmp_path: Path) -> None:
    """Expected decisions, Neutral P(benefit) = 1/2: every group's net = 2 p - 1.

    Direct 0.9 -> +0.8, Puzzled 0.4 -> -0.2, FormalNamed 0.6 -> +0.2: D->P = 1.0, D->FN = 0.6, share 60%.
    """
    spec = CueSpec(items=SPEC.items, conditions=SPEC.conditions, probes=("what_if",))
    engine = PlantedCue("fn", {"direct": 0.9, "puzzled": 0.4, "formal_named": 0.6})
    out = tmp_path / "run"
    run("cue", spec, engine, out, progress=False, log=lambda s: None)
    options, per_trial, _ = open_run(out).choice_probs()
    _, gap = decision_bias(options, per_trial, decision="expected", n_boot=0)
    share = formal_named_share(gap).iloc[0]
    assert (share.level, share.gap_p, share.gap_fn, share.share) == ("hard", pytest.approx(1.0), pytest.approx(0.6),
                                                                     pytest.approx(0.6))  # fmt: skip
    write_report_files(out / "report", *cue_report(open_run(out), n_boot=2))
    summary = (out / "report" / "summary.md").read_text()
    assert "FormalNamed-hard" in summary and "formal_named-hard" in summary
