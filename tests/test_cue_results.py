"""The cue report's puzzle check (analysis.cue.results.check_puzzles): the puzzles regenerated from a run's spec
are written to ``puzzles.jsonl`` only when they match the stored prompts, and a spec whose dilemma file cannot be
read again says so. Deterministic: the design is a pure function of the spec."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from analysis.cue.report import _puzzles_body
from analysis.cue.results import Puzzles, check_puzzles
from experiments.cue import CueSpec, expand
from probe.types import Message

SPEC = CueSpec(items=("rent_arrears", "fallen_fence"), conditions=("neutral", "direct", "puzzled"), probes=("what_if",))


def test_regenerated_puzzles_match_the_stored_prompts() -> None:
    puzzles = check_puzzles(SPEC, expand(SPEC))
    assert puzzles.rows and not puzzles.mismatched and puzzles.error is None
    lines, files = _puzzles_body(puzzles)
    assert lines == [
        f"- puzzles: {len(puzzles.rows)}, structured form in `puzzles.jsonl` (checked against the stored prompts)"
    ]
    rows = [json.loads(r) for r in files.texts["puzzles.jsonl"].splitlines()]
    assert len(rows) == len(puzzles.rows) and all("skeleton" in r and "level" in r for r in rows)


def test_a_changed_prompt_is_named_and_nothing_is_written() -> None:
    trials = expand(SPEC)
    i = next(i for i, t in enumerate(trials) if t.factors.get("condition") == "puzzled")
    changed = trials[i].messages[-1]
    trials[i] = dataclasses.replace(trials[i], messages=(*trials[i].messages[:-1], Message(changed.role, "edited")))
    puzzles = check_puzzles(SPEC, trials)
    assert puzzles.mismatched == (trials[i].factors["puzzle"],)
    lines, files = _puzzles_body(puzzles)
    assert lines == [
        f"- puzzles: regenerated puzzles {[trials[i].factors['puzzle']]} differ from the stored prompts; "
        "puzzles.jsonl not written"
    ]
    assert not files.texts


def test_an_unreadable_dilemma_file_is_said(tmp_path: Path) -> None:
    spec = dataclasses.replace(SPEC, dilemmas=str(tmp_path / "gone.jsonl"))
    puzzles = check_puzzles(spec, [])
    assert puzzles == Puzzles(error=puzzles.error) and puzzles.error
    (line,), files = _puzzles_body(puzzles)
    assert line.startswith("- puzzles: not regenerated (") and not files.texts
