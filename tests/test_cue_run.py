"""End to end: `probe run cue --model tiny` and `probe analyze` (reduced), logit and sampled.

Random draws: the tiny model's sampled answers come from the Transformers engine's per-(trial, draw) seeds,
honoured across processes (tests/test_determinism.py); every assertion here is deterministic, false-failure
rate 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis.cue.across_models import run_gap_table
from analysis.cue.decisions import decision_frame
from probe.app.cli import main
from probe.runs import open_run
from tests.cue_store import sampled_cue_report
from tests.report_files import assert_wrote


def _run(out: Path, *extra: str) -> None:
    assert main(["run", "cue", "--model", "tiny", "--out", str(out), "--quiet", *extra]) == 0


def test_logit_run_and_analyze(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cue"
    _run(out, "--items", "rent_arrears,last_dose")
    report = out / "report"
    assert_wrote(
        report,
        {
            "summary.md",
            "cue_bias.csv",
            "cue_gap.csv",
            "cue_solve.csv",
            "cue_status.csv",
            "cue_net_bias.png",
            "puzzles.jsonl",
            "cue_topic.csv",
            "cue_intersection.csv",
        },
    )
    summary = (report / "summary.md").read_text()
    for heading in (
        "Identity recovery",
        "Decision bias",
        "Direct (D) vs puzzled-hard (P)",
        "Cue Visibility Gap",
        "Status bias",
        "Decision bias by topic",
        "Decision bias by gender x race",
    ):
        assert heading in summary
    assert "checked against the stored prompts" in summary

    bias = pd.read_csv(report / "cue_bias.csv")
    assert set(bias["reading"]) == {"greedy", "expected", "greedy, all parsable", "correct-only"}
    assert set(bias.loc[bias["headline"], "reading"]) == {"greedy"}
    assert set(bias.loc[bias["reading"] == "greedy, all parsable", "denominator"]) == {"all"}
    assert "greedy decisions, eligible denominators" in summary and "Gap (all parsable)" in summary
    assert set(bias["arm"]) == {"direct", "puzzled-hard", "named"}
    groups = set(bias.loc[bias["attr"] == "gender", "group"])
    assert groups <= {"man", "woman", "non-binary"} and groups
    gap = pd.read_csv(report / "cue_gap.csv")
    exp = gap[gap["reading"] == "expected"]
    assert (exp["gap"] - (exp["d_against"] - exp["d_favor"])).abs().max() < 3e-6  # the CSV keeps 6 decimals
    puzzles = [json.loads(line) for line in (report / "puzzles.jsonl").read_text().splitlines()]
    assert len(puzzles) == 1 and puzzles[0]["difficulty"] == "hard"  # 2 dilemmas share one puzzle (reuse 5)

    # the analysis reads P(benefit) straight from the stored readouts
    store = open_run(out)
    opts, per_trial, source = store.choice_probs()
    assert source == "readout"
    df = decision_frame(opts, per_trial)
    ro = store.load("readout_options").merge(opts[["trial_id", "option", "meaning"]], on=["trial_id", "option"])
    direct = ro[ro["meaning"] == "benefit"].set_index("trial_id")["prob"]
    pd.testing.assert_series_equal(df.set_index("trial_id")["p"], direct.reindex(df["trial_id"]), check_names=False)

    capsys.readouterr()
    assert main(["analyze", str(out)]) == 0
    assert "# cue visibility: tiny" in capsys.readouterr().out
    table = run_gap_table(out, n_boot=0)
    assert set(table["arm"]) == {"puzzled-hard", "named"}


def test_report_on_a_sampled_store_uses_parsed_frequencies(tmp_path: Path) -> None:
    """A sampled-only run dir, written without a model: frequencies among parsed answers drive the events.

    Neutral picks the benefit option in 2 of 3 samples (p_s = 2/3), Direct in 3 of 3, Puzzled in 0 of 3.
    Per answer: Direct favor = (1/3 * 1) / (1/3) = 1, against = 0; Puzzled favor 0, against = (2/3 * 1) / (2/3) = 1.
    So every group's Gap = (1 - 0) - (0 - 1) = 2. One what-if trial never parses: an abstention, left out.
    """
    from experiments.cue import CueSpec, expand
    from probe.types import Sample

    spec = CueSpec(
        items=("rent_arrears", "fallen_fence"), conditions=("neutral", "direct", "puzzled"), probes=("what_if",)
    )
    trials = expand(spec)
    samples: list[Sample] = []
    abstained: str | None = None
    for t in trials:
        benefit = t.options[t.meaning.index("benefit")]
        harm = t.options[t.meaning.index("harm")]
        cond = t.factors["condition"]
        plan: dict[str, list[str | None]] = {
            "neutral": [benefit, benefit, harm],
            "direct": [benefit] * 3,
            "puzzled": [harm] * 3,
        }
        answers = plan[cond]
        if abstained is None and cond == "direct":
            abstained, answers = t.trial_id, [None] * 3
        for d, a in enumerate(answers):
            samples.append(Sample(t.trial_id, d, a or "maybe", a, "ok" if a else "invalid"))
    report = sampled_cue_report(tmp_path / "run", spec, trials, samples, draws=3)
    summary = (report / "summary.md").read_text()
    assert "probabilities from: samples (3 samples per trial at T = 1.0)" in summary
    assert "abstentions (trials without a parsed answer, left out): decision 0, what_if 1" in summary
    bias = pd.read_csv(report / "cue_bias.csv")
    exp = bias[bias["reading"] == "expected"]
    d = exp[(exp["arm"] == "direct") & (exp["group"] != "macro")]
    assert (d["favor"] == 1).all() and (d["against"] == 0).all()
    assert d["n"].sum() == 2 * (2 * 4 - 1)  # 8 what-if answers, one abstained, counted per gender and per race
    gap = pd.read_csv(report / "cue_gap.csv")
    g = gap[gap["reading"] == "expected"]
    assert set(g["arm"]) == {"puzzled-hard"}
    assert (g["gap"] == 2).all() and (g["d_against"] == 1).all() and (g["d_favor"] == -1).all()


DRAWS = 8


@pytest.mark.slow
def test_sampled_run_uses_parsed_frequencies(tmp_path: Path) -> None:
    """Decision bias from sampled answers only. tiny often answers off-format on these long prompts: with 3 draws
    a trial no Neutral / what-if pair of the one dilemma was answered (no bias to report); 8 seeded draws answer
    both and still leave abstentions."""
    out = tmp_path / "cue-s"
    _run(
        out,
        "--items",
        "fallen_fence",
        "--conditions",
        "neutral,direct,puzzled",
        "--probes",
        "what_if,check",
        "--samples",
        str(DRAWS),
        "--no-readout",
    )
    store = open_run(out)
    assert store.choice_probs()[2] == "samples"
    samples = store.load("samples")
    assert len(samples) == DRAWS * len(store.trial_list)
    summary = (out / "report" / "summary.md").read_text()
    assert f"probabilities from: samples ({DRAWS} samples per trial at T = 1.0)" in summary
    n_abstain = (samples.groupby("trial_id")["status"].apply(lambda s: (s != "ok").all())).sum()
    assert "abstentions (trials without a parsed answer, left out)" in summary
    assert n_abstain > 0  # the tiny model often answers off-format on these long prompts: abstentions are data
    bias = pd.read_csv(out / "report" / "cue_bias.csv")
    assert {"direct", "puzzled-hard"} <= set(bias["arm"])
    solve = pd.read_csv(out / "report" / "cue_solve.csv")
    assert (solve["answered"] < 1).any()


def test_bad_flags_exit_with_status_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "cue", "--model", "tiny", "--out", str(tmp_path / "x"), "--difficulties", "medium"])
    assert code == 2
    assert "difficulties" in capsys.readouterr().err


@pytest.mark.slow
def test_default_reduced_run_end_to_end(tmp_path: Path) -> None:
    """The README's `probe run cue --model tiny`: the whole reduced default."""
    out = tmp_path / "cue-default"
    _run(out)
    store = open_run(out)
    assert store.manifest.n_trials == 492
    assert (out / "report" / "cue_net_bias.png").stat().st_size > 10_000
