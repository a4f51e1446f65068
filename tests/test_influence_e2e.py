"""End to end: `probe run influence-*` on the tiny model and the real data samples, then `probe analyze`.

Random draws: the tiny model's sampled answers come from the Transformers engine's per-(trial, draw) seeds,
honoured across processes (tests/test_determinism.py); every assertion here is deterministic, false-failure
rate 0.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from probe.app.cli import main

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data not present")
REPORT = {
    "summary.md",
    "conditions.csv",
    "effects.csv",
    "headline.csv",
    "by_influence.csv",
    "by_pair.csv",
    "by_model.csv",
    "noise_floor.csv",
    "response_quality.csv",
    "fig_steerability.png",
}


def _report(out: Path) -> tuple[set[str], pd.DataFrame, str]:
    files = {p.name for p in (out / "report").iterdir()}
    return files, pd.read_csv(out / "report" / "conditions.csv"), (out / "report" / "summary.md").read_text()


@pytest.mark.trained  # the tiny model answers the audit prompts in format (docs/testing.md)
def test_triage_tiny_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "triage"
    args = ["run", "influence-triage", "--model", "tiny", "--out", str(out), "--quiet"]
    args += ["--factors", "gender", "--sizes", "1-2", "--influences", "role_play,few_shot"]
    assert main([*args, "--controls", "rerun,negated"]) == 0
    files, cond, summary = _report(out)
    assert REPORT | {"controls_negated.csv", "fig_conditions_00_gender.png"} <= files
    assert len(cond) == 2 + 1  # two cues, and the negated role-play
    assert set(cond["n_items"]) == {4} and set(cond["test_basis"]) == {"bootstrap"}
    for col in ("f0_B", "fA_B", "fB_B"):
        assert cond[col].between(0, 1).all()
    assert "answer-slot readouts" in summary and "bootstrap standard error over prompts" in summary
    capsys.readouterr()
    assert main(["analyze", str(out)]) == 0
    assert "# Influence audit, moral triage: tiny" in capsys.readouterr().out


@pytest.mark.trained  # the tiny model answers the audit prompts in format (docs/testing.md)
def test_triage_tiny_sampled_counts(tmp_path: Path) -> None:
    out = tmp_path / "sampled"
    args = ["run", "influence-triage", "--model", "tiny", "--out", str(out), "--quiet", "--factors", "age"]
    args += ["--sizes", "1", "--influences", "emotional", "--samples", "3", "--no-readout", "--max-new-tokens", "3"]
    assert main(args) == 0
    files, cond, summary = _report(out)
    assert files >= REPORT
    assert set(cond["test_basis"]) == {"counts"}
    quality = pd.read_csv(out / "report" / "response_quality.csv")
    assert set(quality["arm"]) == {"base", "rerun", "cued"} and (quality["answers"] > 0).all()
    assert "sampled answers" in summary


@pytest.mark.trained  # the tiny model answers the audit prompts in format (docs/testing.md)
@needs_data
def test_bbq_tiny_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "bbq"
    args = ["run", "influence-bbq", "--model", "tiny", "--bbq", str(SHARED / "bbq"), "--out", str(out), "--quiet"]
    assert main([*args, "--bbq-limit", "2", "--influences", "survey,few_shot", "--controls", "none"]) == 0
    files, cond, summary = _report(out)
    assert REPORT - {"noise_floor.csv"} <= files
    assert set(cond["pair"]) == {"Age_neg", "Age_nonneg"}
    assert set(cond["group_a"]) == {"nonOld"} and set(cond["group_b"]) == {"old"}
    assert "Influence audit, BBQ" in summary


@pytest.mark.trained  # the tiny model answers the audit prompts in format (docs/testing.md)
@needs_data
def test_dd_tiny_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dd"
    args = ["run", "influence-dd", "--model", "tiny", "--dd", str(SHARED / "daily_dilemmas"), "--out", str(out)]
    assert main([*args, "--quiet"]) == 2  # the paper's threshold (20) leaves nothing in a 4-dilemma sample
    assert "lower --dd-min-count" in capsys.readouterr().err
    assert main([*args, "--quiet", "--dd-min-count", "1", "--dd-limit", "2", "--influences", "emotional"]) == 0
    files, cond, summary = _report(out)
    assert REPORT | {"flip_rates.csv"} <= files
    # per value: each of the two dilemmas' four values is a condition with one dilemma
    assert len(cond) == 4 and set(cond["group_b"]) == {"other"}
    flips = pd.read_csv(out / "report" / "flip_rates.csv")
    assert list(flips["influence"]) == ["emotional", "all"] and flips["comparisons"].iloc[-1] == 4
    assert "Sample-level flip rates" in summary
