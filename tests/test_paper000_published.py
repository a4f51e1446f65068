"""Paper 000's numbers reproduced through `probe import` on its published data (tests/data/paper000, SOURCES.md).

Each expected value is the paper's, at the precision it prints it (percentages to one decimal, BB to whole
percent). What the data do not allow is said in docs/papers.md and pinned here where this project's value differs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.influence import paper000 as p
from analysis.influence.published import convert
from analysis.influence.results import imported_results
from probe.app.cli import main
from probe.runs import open_run

DATA = Path(__file__).parent / "data" / "paper000"
SUMMARY = {"triage": "trolley_summary", "bbq": "bbq_summary", "dd": "dailydilemmas_summary"}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """The three published summaries imported (the paper's nine model configurations), by benchmark."""
    root = tmp_path_factory.mktemp("paper000")
    out = {}
    for bench, stem in SUMMARY.items():
        csv = root / f"{bench}.csv"
        convert(DATA / f"{stem}.csv.gz", csv, bench)
        assert main(["import", str(csv), "--out", str(root / bench), "--no-report"]) == 0
        out[bench] = imported_results(open_run(root / bench))
    return out


def pct(x: float) -> float:
    return round(100 * x, 1)


def _headline(res, metric: str) -> float:
    h = res.panel["headline"]
    return float(h.loc[h["metric"] == metric, "value"].iloc[0])


def test_imports_every_condition_the_paper_reports(imported):
    # 9 model configurations x 5 factors x 7 influences (triage); BBQ: 4 sub-experiments x 9 x 7; DD: 567 (G.1).
    assert {b: len(r.conditions) for b, r in imported.items()} == {"triage": 350, "bbq": 252, "dd": 567}


def test_headline_shifts_section_4_1(imported):
    # "15.0 pp on triage, 17.7 pp on BBQ, and 12.3 pp on DailyDilemmas"; one-sentence user-message cues
    # "13.0 pp / 19.3 pp / 15.4 pp"
    for bench, allc, one in (("triage", 15.0, 13.0), ("bbq", 17.7, 19.3), ("dd", 12.3, 15.4)):
        assert round(_headline(imported[bench], "mean |shift| (pp), all cues"), 1) == allc
        assert round(_headline(imported[bench], "mean |shift| (pp), one-sentence user-message cues"), 1) == one


def test_table_21_dailydilemmas(imported):
    # Section 4.2: "the rate is 8.8% (3.4% under BH-FDR), and the asymmetry signal is detectable in 18.5% of all
    # conditions"; the margin and Wilson rows of Table 21 (the authors' paper_numbers.json: n 70, 10.0 / 7.1 /
    # 5.7; Wilson: no neutral condition). The paper's Wald test counts the baseline twice: p_asym_2x.
    t = p.neutral_asym_table(imported["dd"].conditions, p="p_asym_2x").set_index("neutrality")
    assert t.loc["binom", "n_neutral"] == 147
    assert (pct(t.loc["binom", "sig_0.05"]), pct(t.loc["binom", "sig_0.01"]), pct(t.loc["binom", "sig_bh"])) == (
        8.8,
        4.1,
        3.4,
    )
    assert t.loc["margin", "n_neutral"] == 70
    assert (pct(t.loc["margin", "sig_0.05"]), pct(t.loc["margin", "sig_0.01"]), pct(t.loc["margin", "sig_bh"])) == (
        10.0,
        7.1,
        5.7,
    )
    assert t.loc["wilson", "n_neutral"] == 0
    assert pct(t.loc["all", "sig_0.05"]) == 18.5


def test_table_21_bbq_margin_row(imported):
    # BBQ: the margin row (n 51: 35.3 / 25.5 / 25.5) as the paper's. (Its every-condition row, 31.0 / 19.0 /
    # 19.0, pairs the p-values of pvalues_by_condition with the summaries, Llama's 28 rows joined to both of
    # Llama's modes; from the summaries alone: 31.0 / 18.3 / 17.9.)
    t = p.neutral_asym_table(imported["bbq"].conditions, p="p_asym_2x").set_index("neutrality")
    assert t.loc["margin", "n_neutral"] == 51
    assert (pct(t.loc["margin", "sig_0.05"]), pct(t.loc["margin", "sig_0.01"]), pct(t.loc["margin", "sig_bh"])) == (
        35.3,
        25.5,
        25.5,
    )
    assert (pct(t.loc["all", "sig_0.05"]), pct(t.loc["all", "sig_0.01"]), pct(t.loc["all", "sig_bh"])) == (
        31.0,
        18.3,
        17.9,
    )
    # Not the paper's binomial row (n 28, 39.3%): its pipeline tests f0(B) on 125 x 8 = 1000 answers where BBQ's
    # arms hold 250 (125 questions x both orders); on the data, 66 conditions are neutral.
    assert t.loc["binom", "n_neutral"] == 66 and pct(t.loc["binom", "sig_0.05"]) == 34.8


def test_table_21_triage_differs_and_why(imported):
    # Not the paper's 44.4% (n 135): its p-values come from a second table of counts (pvalues_by_condition,
    # which agrees with the summaries' flags on 87% of conditions, and its Llama rows are joined to both of
    # Llama's reasoning modes); the summaries alone give n 136 and 39.7%.
    t = p.neutral_asym_table(imported["triage"].conditions, p="p_asym_2x").set_index("neutrality")
    assert t.loc["binom", "n_neutral"] == 136 and pct(t.loc["binom", "sig_0.05"]) == 39.7


def test_table_11_baseline_bias(imported):
    # I.9 / Table 11: "The average frequency of choosing the baseline-preferred option drops from 67% (95% CI
    # 65-69%) without reasoning to 55% (54-56%) with reasoning".
    bb = p.baseline_bias(imported["triage"].conditions).set_index("think")
    for think, want in ((False, (67, 65, 69)), (True, (55, 54, 56))):
        got = tuple(round(100 * bb.loc[think, c]) for c in ("bb", "bb_lo", "bb_hi"))
        assert got == want
    assert bb.loc[False, "conditions"] == bb.loc[True, "conditions"] == 175


def test_compare_tables_of_the_published_triage_summary(imported):
    # the comparison's paper-000 tables (what probe compare adds) on the imported conditions: BB per model as in
    # the run's own report, Table 21 for both tests
    from analysis.influence.paper000_tables import compare_tables

    t = compare_tables(imported["triage"].conditions, {})
    want = p.baseline_bias(imported["triage"].conditions, by=("benchmark", "model", "think"))
    assert t["baseline_bias_by_model"].equals(want) and len(want) == 10  # 5 models x 2 modes (Llama's CoT: on)
    assert set(t["table21_neutral_asym"]["test"]) == {"Wald, baseline x4", "Wald, baseline x2 (the paper's)"}
    assert "larger_group_by_run" not in t  # condition-level data has no group sizes


@pytest.mark.slow
def test_compare_of_the_published_triage_summary(imported, tmp_path):
    # probe compare on the imported run beside a small sim run: the imported models' BB as in the run's own
    # report, Table 21 for both tests, and the figures drawn from the tables beside them.
    import pandas as pd

    sim = tmp_path / "sim"
    args = ["run", "influence-triage", "--model", "sim", "--factors", "gender", "--sizes", "1-2", "--out", str(sim)]
    assert main([*args, "--quiet", "--no-report"]) == 0
    out = tmp_path / "cmp"
    assert (
        main(["compare", str(imported["triage"].root), str(sim), "--out", str(out), "--quiet", "--n-boot", "20"]) == 0
    )
    got = pd.read_csv(out / "baseline_bias_by_model.csv")
    want = p.baseline_bias(imported["triage"].conditions, by=("benchmark", "model", "think"))
    merged = want.merge(got, on=["benchmark", "model", "think"], suffixes=("", "_cmp"))
    assert len(merged) == 10  # 5 models x 2 modes (Llama's step-by-step prompt: on)
    assert (merged["bb"] - merged["bb_cmp"]).abs().max() < 1e-6
    for f in ("fig_headline.png", "fig_steer_by_influence_triage.png", "fig_steer_vs_baseline_triage.png"):
        assert (out / f).stat().st_size > 0
    t21 = pd.read_csv(out / "table21_neutral_asym.csv")
    assert set(t21["test"]) == {"Wald, baseline x4", "Wald, baseline x2 (the paper's)"}
    lg = pd.read_csv(out / "larger_group_by_run.csv")
    assert set(lg["model"]) == {"sim"}  # condition-level data has no group sizes


@pytest.fixture(scope="module")
def compared(imported):
    """The per-benchmark tables of the three imported runs (one benchmark each: what probe compare's by_influence,
    by_pair, by_model and headline hold per benchmark), one after the other."""
    import pandas as pd

    names = ("headline", "by_influence", "by_pair", "by_model")
    return {n: pd.concat([imported[b].panel[n] for b in ("triage", "bbq", "dd")], ignore_index=True) for n in names}


def _row(t, **keys):
    sel = t
    for k, v in keys.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, keys
    return sel.iloc[0]


def test_tables_6_to_10_prose_numbers(compared):
    by_infl, by_pair, by_model = compared["by_influence"], compared["by_pair"], compared["by_model"]
    # Table 8 (I.4): "survey claims and weak evidence exhibit high backfire rates (30.9% and 37.5%)"
    assert pct(_row(by_infl, benchmark="triage", influence="survey")["bf_of_sig"]) == 30.9
    assert pct(_row(by_infl, benchmark="triage", influence="weak_evidence")["bf_of_sig"]) == 37.5
    # Table 9 (I.5): "f0(rich) = 0.25 ... |Asym| = 1.85"; young-vs-old "|Asym| = 1.04"
    wealth = _row(by_pair, benchmark="triage", pair="wealth")
    assert (round(wealth["f0_B"], 2), round(wealth["|asym|"], 2)) == (0.25, 1.85)
    assert round(_row(by_pair, benchmark="triage", pair="age_group")["|asym|"], 2) == 1.04
    # Table 10 (I.6): GPT-5.2 backfires "75% without reasoning, 27% with"; Llama without reasoning |Asym| = 2.64
    assert round(100 * _row(by_model, benchmark="triage", model="gpt-5-2", think=False)["bf_of_sig"]) == 75
    assert round(100 * _row(by_model, benchmark="triage", model="gpt-5-2", think=True)["bf_of_sig"]) == 27
    assert round(_row(by_model, benchmark="triage", model="llama-33-70b", think=False)["|asym|"], 2) == 2.64
    # Table 6: "Survey preference achieves high significance (79.2%) with very low backfiring (1.8%)"; few-shot,
    # emotional and virtue appeal "|Steer| > 1.2"
    survey = _row(by_infl, benchmark="bbq", influence="survey")
    assert (pct(survey["sig"]), pct(survey["bf_of_sig"])) == (79.2, 1.8)
    for infl in ("few_shot", "emotional", "virtue_appeal"):
        assert _row(by_infl, benchmark="bbq", influence=infl)["|steer|"] > 1.2
    # Table 7: GPT-5.2 without reasoning "has an unusually high significant backfire rate (72.7%)"
    assert pct(_row(by_model, benchmark="bbq", model="gpt-5-2", think=False)["bf_of_sig"]) == 72.7
    # Table 5 / 4.2: ses_neg "f0(B) = 0.68"
    assert round(_row(by_pair, benchmark="bbq", pair="ses_neg")["f0_B"], 2) == 0.68


def test_backfire_shares_section_4_3(compared):
    head = compared["headline"]

    def value(bench, metric):
        return float(_row(head, benchmark=bench, metric=metric)["value"])

    raw = "backfire share of significant effects (raw)"
    # "10.5% on BBQ"; DailyDilemmas "0.2%"; I.2: baseline-neutral 13.4%, toward the preferred option 13.1%
    assert pct(value("bbq", raw)) == 10.5
    assert pct(value("dd", raw)) == 0.2
    assert pct(value("triage", "backfire share of significant effects, neutral")) == 13.4
    assert pct(value("triage", "backfire share of significant effects, toward preferred")) == 13.1
    # Not to the paper's precision (its flags come from the arms' true sizes; the summaries give frequencies, so
    # arms with discarded answers are rebuilt at n_comparisons x 8): triage 17.7% -> 17.6%, away 26.1% -> 25.9%.
    assert pct(value("triage", raw)) == 17.6
    assert pct(value("triage", "backfire share of significant effects, away from preferred")) == 25.9


def test_tables_12_and_13_gpt_5_2(tmp_path):
    # I.10-I.11 on GPT-5.2's rows alone: wealth's baseline "85% without reasoning, 74% with" for the poor, age
    # "old chosen in 42% of cases"; the age factor's largest |Asym| is the user-preference cue in both modes ("this
    # still happens with reasoning"); "Weak evidence always backfires in both reasoning conditions when the
    # context effect is significant"; backfire rates 75% / 27% (Table 10).
    csv = tmp_path / "gpt.csv"
    convert(DATA / "trolley_summary.csv.gz", csv, "triage", models="gpt-5-2")
    assert main(["import", str(csv), "--out", str(tmp_path / "gpt"), "--no-report"]) == 0
    res = imported_results(open_run(tmp_path / "gpt"))
    t13 = p.max_asym_by_pair(res.conditions)
    wealth = t13[t13["pair"] == "wealth"].set_index("think")
    assert round(100 * (1 - wealth.loc[False, "f0_B"])) == 85 and round(100 * (1 - wealth.loc[True, "f0_B"])) == 74
    age = t13[t13["pair"] == "age_group"].set_index("think")
    assert round(100 * age.loc[False, "f0_B"]) == 42
    assert set(age["influence"]) == {"user_preference"}
    by_infl = res.panel["by_influence"].set_index("influence")
    assert by_infl.loc["weak_evidence", "bf_of_sig"] == 1.0
    with pytest.raises(ValueError, match="not in"):
        convert(DATA / "trolley_summary.csv.gz", csv, "triage", models="gpt-9")
