"""The battery's instruments, judges and report on the tiny model.

Random draws: the tiny model's sampled answers use the Transformers engine's per-(trial, draw) seeds and the
sim subject its SimParams seed; both are honoured across processes (tests/test_determinism.py), so every
assertion here is deterministic, false-failure rate 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.battery import REDUCED, BatterySpec, CorpusError, expand, graded_question, load_corpus
from experiments.dilemmas import load_dilemmas
from experiments.judge import RuleJudge, rule_verdict
from probe.types import Sample

D = {d.id: d for d in load_dilemmas()}
ACTION = D["mine_cart_bridge"]  # cbr_pole: action
COMPLEMENT = D["dam_spillway"]  # cbr_pole: complement


def test_full_design_counts_per_item():
    trials = expand(BatterySpec(items=(ACTION.id,)))
    by = {}
    for t in trials:
        by[t.factors["instrument"]] = by.get(t.factors["instrument"], 0) + 1
    # graded 4 scales x 3 wordings x 2 anchors x 2 poles; choice 12 framings x 2 orders;
    # binary 12 forms x 4 + 12 pairs with the mapping crossed x 8 + story x 4
    assert by == {"graded": 48, "choice": 24, "binary": 48 + 96 + 4}
    assert len({t.trial_id for t in trials}) == len(trials)
    assert [t.trial_id for t in expand(BatterySpec(items=(ACTION.id,)))] == [t.trial_id for t in trials]


def test_reduced_preset_keeps_every_crossing():
    trials = expand(BatterySpec(items=(ACTION.id,), **REDUCED))
    graded = [t for t in trials if t.factors["instrument"] == "graded"]
    assert {(t.factors["anchor"], t.factors["pole"]) for t in graded} == {
        (a, p) for a in ("ascending", "descending") for p in ("action", "complement")
    }
    binary = [t for t in trials if t.factors["instrument"] == "binary"]
    assert {(t.factors["verb"], t.factors["order"]) for t in binary} == {
        (v, o) for v in ("approve", "oppose") for o in ("yes_first", "no_first")
    }


@pytest.mark.parametrize(
    "d,scale,anchor,pole,value,x",
    [
        (ACTION, "0-10", "ascending", "action", "10", 1.0),
        (ACTION, "0-10", "ascending", "action", "0", -1.0),
        (ACTION, "0-10", "descending", "action", "10", -1.0),
        (ACTION, "0-10", "ascending", "complement", "10", -1.0),
        (ACTION, "0-100", "ascending", "action", "75", 0.5),
        (ACTION, "bipolar-5", "ascending", "action", "0", 0.0),
        (ACTION, "bipolar-5", "ascending", "action", "-5", -1.0),
        (COMPLEMENT, "0-10", "ascending", "complement", "10", 1.0),
        (COMPLEMENT, "0-10", "descending", "action", "2", -0.6),  # 2 of 10, descending: fairly acceptable anti act
    ],
)
def test_graded_meanings_by_hand(d, scale, anchor, pole, value, x):
    text, options, meanings = graded_question(d, load_corpus(), scale, "acceptable", anchor, pole)
    assert float(meanings[options.index(value)]) == pytest.approx(x)
    assert d.pole_text(pole) in text


def test_descending_anchor_swaps_the_printed_end_labels():
    asc, _, _ = graded_question(ACTION, load_corpus(), "0-10", "acceptable", "ascending", "action")
    desc, _, _ = graded_question(ACTION, load_corpus(), "0-10", "acceptable", "descending", "action")
    assert "0 (completely unacceptable) to 10 (completely acceptable)" in asc
    assert "0 (completely acceptable) to 10 (completely unacceptable)" in desc


def test_bad_specs_and_corpora_fail_clearly(tmp_path: Path):
    with pytest.raises(ValueError, match="unknown instruments"):
        BatterySpec(instruments=("graded", "essay"))
    with pytest.raises(ValueError, match="unknown label pairs"):
        BatterySpec(label_pairs=("Si/No",))
    bad = tmp_path / "c.yaml"
    bad.write_text("graded: {}\n")
    with pytest.raises(CorpusError, match="missing section 'binary'"):
        load_corpus(str(bad))


def _choice_trial():
    return next(t for t in expand(BatterySpec(items=(ACTION.id,), instruments=("choice",))))


def test_rule_judge_verdicts():
    t = _choice_trial()
    cbr = t.options[t.meaning.index("cbr")]
    anti = t.options[t.meaning.index("anti")]
    assert rule_verdict(t, f"After thinking it over, I would {cbr}.", think=False) == "PRO"
    assert rule_verdict(t, f"<think>maybe {cbr}</think>\n\nI choose to {anti}.", think=False) == "ANTI"
    assert rule_verdict(t, f"Either {cbr} or {anti}; I cannot say.", think=False) == "NONCOMMIT"
    assert rule_verdict(t, "I can't help with that.", think=False) == "NONCOMMIT"
    table = RuleJudge(think=False).judge([t], [Sample(t.trial_id, 0, f"I would {cbr}", None, "invalid")])
    assert table.loc[0, ["p_pro", "p_anti", "p_noncommit"]].tolist() == [1.0, 0.0, 0.0]


def test_logit_judge_keeps_the_distribution(tiny_engine):
    from experiments.judge import LogitJudge

    t = _choice_trial()
    cbr = t.options[t.meaning.index("cbr")]
    table = LogitJudge(tiny_engine, think=False).judge([t], [Sample(t.trial_id, 0, f"I would {cbr}.", None, "invalid")])
    row = table.iloc[0]
    assert row[["p_pro", "p_anti", "p_noncommit"]].sum() == pytest.approx(1.0)
    assert row["verdict"] in ("PRO", "ANTI", "NONCOMMIT")


def test_battery_runs_end_to_end_on_tiny(tmp_path: Path):
    from tests.test_store import run_cli

    out = tmp_path / "b"
    run_cli(
        "run", "battery", "--model", "tiny", "--out", str(out), "--items", f"{ACTION.id},{COMPLEMENT.id}", "--quiet"
    )
    summary = (out / "report" / "summary.md").read_text()
    for title in ("verb flip", "Label map", "Free choice"):
        assert title in summary
    assert (out / "report" / "fig_bias_decomposition.png").stat().st_size > 1000
    from probe.store import RunStore

    gens = RunStore(out).load("generations")
    assert len(gens) == 2 * 2 * len(REDUCED["framings"])  # one greedy reply per choice trial, kept for audit
    assert len(RunStore(out).load("judgments")) == len(gens)


def test_sim_battery_report_recovers_planted_parameters(tmp_path: Path):
    from tests.test_store import run_cli

    params = tmp_path / "p.yaml"
    params.write_text("seed: 3\ns: 0.3\nm_order: -0.15\nm_word: -0.1\nm_logic: 0.05\nsigma_form: 0.05\n")
    out = tmp_path / "sim"
    run_cli(
        "run", "battery", "--model", "sim", "--sim-params", str(params), "--out", str(out), "--samples", "4", "--quiet"
    )
    import pandas as pd

    rec = pd.read_csv(out / "report" / "planted_vs_recovered.csv", index_col=0)
    assert rec.loc["order", "m"] == pytest.approx(-0.15, abs=0.03)
    assert rec.loc["label", "m"] == pytest.approx(-0.10, abs=0.03)
    summary = (out / "report" / "summary.md").read_text()
    for title in (
        "Graded stance",
        "Generalizability G",
        "Framing susceptibility",
        "Readout temperature",
        "Convergent validity",
        "Planted vs recovered",
    ):
        assert title in summary
    for fig in (
        "fig_stance.png",
        "fig_bias_decomposition.png",
        "fig_bowtie_ridge.png",
        "fig_calibration.png",
        "fig_label_gradient.png",
    ):
        assert (out / "report" / fig).stat().st_size > 1000, fig


def test_choice_meanings_follow_the_printed_order():
    """The trial contract: options in print order, each with its meaning (issue 18: anti_first said cbr first)."""
    from experiments.battery import anti_text, cbr_text

    for t in expand(BatterySpec(items=(ACTION.id, COMPLEMENT.id), instruments=("choice",))):
        d = D[t.item_id]
        by_meaning = dict(zip(t.meaning, t.options, strict=True))
        assert by_meaning == {"cbr": cbr_text(d), "anti": anti_text(d)}, t.factors
        assert t.meaning[0] == ("cbr" if t.factors["order"] == "cbr_first" else "anti")


def test_sample_only_leaves_other_free_text_trials_one_greedy_reply(tmp_path: Path):
    """--sample-only instrument=binary samples the binary trials only: a free-choice trial gets one greedy
    reply (it used to get --samples draws of up to 512 tokens each, which dominated the run)."""
    from probe.store import RunStore
    from tests.test_store import run_cli

    items = f"{ACTION.id},{COMPLEMENT.id}"
    only = tmp_path / "only"
    run_cli("run", "battery", "--model", "sim", "--out", str(only), "--items", items, "--samples", "3",
            "--sample-only", "instrument=binary", "--quiet", "--no-report")  # fmt: skip
    store = RunStore(only)
    gens, samples = store.load("generations"), store.load("samples")
    assert len(gens) == gens["trial_id"].nunique() > 0 and set(gens["draw"]) == {0}
    trials = {t.trial_id: t for t in store.trials()}
    assert {trials[i].factors["instrument"] for i in samples["trial_id"]} == {"binary"}
    assert samples.groupby("trial_id").size().eq(3).all()
    every = tmp_path / "every"
    run_cli("run", "battery", "--model", "sim", "--out", str(every), "--items", items, "--samples", "3", "--quiet",
            "--no-report")  # fmt: skip
    assert RunStore(every).load("generations").groupby("trial_id").size().eq(3).all()
