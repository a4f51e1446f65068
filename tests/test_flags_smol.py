"""On the real model every machine has (SmolLM2-135M-Instruct, ``smol``): the degenerate-reading flags appear.

smol's greedy what-if decision never leaves its Neutral one, its identity answers are one label for every pair,
and on the triage audit it follows the first-printed option (P about 0.8 in both orders), so the order-balanced
baseline reads 1/2 in every condition. The reduced runs take about 25 s each; the full defaults (the issue's
commands, about 30 s and 60 s on a free machine) are marked slow. Readouts are deterministic (no sampling):
false-failure rate 0.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from probe.app.cli import main


def _summary(out: Path, *args: str) -> str:
    assert main(["run", *args, "--model", "smol", "--out", str(out), "--quiet"]) == 0
    return (out / "report" / "summary.md").read_text()


def _assert_cue_flags(summary: str) -> None:
    for arm in ("direct", "named", "puzzled-hard"):
        assert re.search(
            rf"- \*\*degenerate: {arm}\*\* \(with consequences\): greedy decision identical to Neutral in every pair "
            r"in all \d+ groups \(identical/pairs: man (\d+)/\1",
            summary,
        ), arm
    assert "the greedy Gap vs direct is 0 by construction in all" in summary
    assert "chance 1/3 (33.3%) for 3 options" in summary and "chance 1/5 (20.0%) for 5 options" in summary
    assert "**not distinguishable from chance**" in summary and "**above chance**" not in summary
    assert "**low option coverage** under the identity-recovery table: mean option mass check_gender" in summary
    assert "**low option coverage** under the decision-bias tables: mean option mass decision" in summary


def _assert_influence_flags(summary: str, conditions: int) -> None:
    head = summary[summary.index("## Headline") : summary.index("| metric |")]
    assert f"- **tie readout**: f0(B) is within 1 pp of 1/2 in all {conditions} conditions" in head
    assert re.search(
        r"- \*\*position/label following\*\*: with no cue the readout favours the first-printed option in both "
        r"printed orders \(mean P\(first-printed option\) = mean P\(label A\): 0\.[6-9]\d with side A printed first, "
        r"0\.[6-9]\d with side B printed first",
        head,
    )
    assert "- **significant but small**" in head and "(0%) >= 5 pp" in head


def test_cue_smol_reduced_names_its_degenerate_tables(tmp_path: Path) -> None:
    _assert_cue_flags(_summary(tmp_path / "cue", "cue", "--items", "rent_arrears", "--probes", "what_if,check"))


def test_influence_smol_reduced_flags_the_tie_and_the_position_following(tmp_path: Path) -> None:
    args = ["influence-triage", "--factors", "gender", "--sizes", "1-2", "--influences", "survey,role_play"]
    _assert_influence_flags(_summary(tmp_path / "inf", *args), conditions=2)


@pytest.mark.slow
def test_cue_smol_default(tmp_path: Path) -> None:
    """The issue's `probe run cue --model smol` (492 trials)."""
    summary = _summary(tmp_path / "cue", "cue")
    _assert_cue_flags(summary)
    assert "greedy decision identical to Neutral in every pair in all 8 groups" in summary


@pytest.mark.slow
def test_influence_smol_default(tmp_path: Path) -> None:
    """The issue's `probe run influence-triage --model smol` (1,440 trials, 35 conditions)."""
    _assert_influence_flags(_summary(tmp_path / "inf", "influence-triage"), conditions=35)
