"""Paper 000's appendix statistics (analysis/influence/paper000.py): hand-worked examples and planted sims."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.influence import paper000 as p


def _cond(rows):
    cols = ["benchmark", "variant", "neutral_binom", "neutral_margin", "neutral_ci", "p_asym", "q_asym", "f0_B"]
    return pd.DataFrame(rows, columns=cols)


def test_neutral_asym_table_hand_worked():
    # four triage conditions: three binom-neutral (p_asym .03, .004, .0005), one not (.001); margin-neutral: the
    # first two; Wilson: none. BH over the four: sorted .0005 .001 .004 .03 -> q = .002 .002 .00533 .03, all
    # below .05. A placebo row that must be left out.
    c = _cond(
        [
            ["triage", "cue", True, True, False, 0.03, 0.06, 0.52],
            ["triage", "cue", True, True, False, 0.004, 0.02, 0.47],
            ["triage", "cue", True, False, False, 0.0005, 0.003, 0.41],
            ["triage", "cue", False, False, False, 0.001, 0.004, 0.9],
            ["triage", "placebo", True, True, True, 0.0, 0.0, 0.5],
        ]
    )
    t = p.neutral_asym_table(c).set_index("neutrality")
    assert t.loc["binom", "n_neutral"] == 3
    assert t.loc["binom", "sig_0.05"] == 1.0
    assert t.loc["binom", "sig_0.01"] == pytest.approx(2 / 3)
    assert t.loc["binom", "sig_0.001"] == pytest.approx(1 / 3)
    assert t.loc["binom", "sig_bh"] == 1.0
    assert t.loc["margin", "n_neutral"] == 2 and t.loc["margin", "sig_0.01"] == 0.5 and t.loc["margin", "sig_bh"] == 1.0
    assert t.loc["wilson", "n_neutral"] == 0 and math.isnan(t.loc["wilson", "sig_0.05"])
    # with p .03 -> .3 the BH q of the first becomes .3 (rank 4 of 4): not significant
    c.loc[0, "p_asym"] = 0.3
    t = p.neutral_asym_table(c).set_index("neutrality")
    assert t.loc["binom", "sig_bh"] == pytest.approx(2 / 3) and t.loc["binom", "sig_0.05"] == pytest.approx(2 / 3)
    t2 = p.neutral_asym_table(c.assign(p_asym_2x=0.001), p="p_asym_2x").set_index("neutrality")
    assert t2.loc["binom", "sig_0.001"] == 0.0 and t2.loc["binom", "sig_0.01"] == 1.0


def _cells(rows):
    cols = ["pair", "direction", "variant", "influence", "n_a", "n_b", "n", "k"]
    return pd.DataFrame(rows, columns=cols)


def test_larger_group_hand_worked():
    # 1 v 3: 6 of 8 chose B (the larger); 3 v 1: 2 of 8 chose B, so 6 chose the larger A; 2 v 2 is left out;
    # 2 v 4 under a cue toward A: 1 of 4 chose B. A placebo trial is left out.
    c = _cells(
        [
            ["age", "base", "none", "none", "1", "3", 8, 6],
            ["age", "base", "none", "none", "3", "1", 8, 2],
            ["age", "base", "none", "none", "2", "2", 8, 8],
            ["age", "A", "cue", "survey", "2", "4", 4, 1],
            ["age", "A", "placebo", "survey", "2", "4", 4, 4],
        ]
    )
    t = p.larger_group(c)
    base = t[t["arm"] == "base"].iloc[0]
    assert (base["small"], base["large"], base["answers"], base["larger"], base["rate"]) == (1, 3, 16, 12, 0.75)
    cued = t[t["arm"] == "A"].iloc[0]
    assert (cued["small"], cued["large"], cued["rate"]) == (2, 4, 0.25)
    r = p.larger_by_ratio(t)
    assert set(r["ratio"]) == {3.0, 2.0}
    s = p.larger_summary(t).set_index(["pair", "arm"])
    assert s.loc[("all", "base"), "rate"] == 0.75


def test_larger_group_recovers_a_planted_size_preference():
    # Trial-level counts, drawn here (the sim's own plant is the next test's):
    # logit P(larger) = 1.2 * log(large / small), 400 answers per size pair, seeded.
    rng = np.random.default_rng(7)
    rows, planted = [], {}
    for a in range(1, 5):
        for b in range(1, 5):
            if a == b:
                continue
            big_b = b > a
            pl = 1 / (1 + math.exp(-1.2 * math.log(max(a, b) / min(a, b))))
            planted[(min(a, b), max(a, b))] = pl
            k_larger = int(rng.binomial(400, pl))
            rows.append(["gender", "base", "none", "none", str(a), str(b), 400, k_larger if big_b else 400 - k_larger])
    t = p.larger_group(_cells(rows))
    for _, r in t.iterrows():
        assert r["rate"] == pytest.approx(planted[(r["small"], r["large"])], abs=0.06)
    by_ratio = p.larger_by_ratio(t)
    rate = by_ratio.set_index("ratio")["rate"]
    for ratio, r in rate.items():  # pooled by ratio: the planted rate of that ratio
        assert r == pytest.approx(1 / (1 + ratio**-1.2), abs=0.05)
    assert rate[4.0] > rate[1.333] + 0.15


def test_larger_group_recovers_the_sims_planted_size_preference(tmp_path):
    """The synthetic subject's larger-group plant (``influence.size``) through a triage run's readouts: with the
    scatter off, the readout rate of the larger group is exactly sigmoid(size * log(large / small)), in the
    baseline arm and, shifted by the cue, in the cued arms; size 0 gives no preference."""
    from analysis.influence.audit import analyze_sources
    from probe.app.cli import main
    from probe.runs import open_run

    def larger_rates(size: float, name: str) -> pd.DataFrame:
        yaml = f"seed: 0\ninfluence: {{size: {size}, sigma_prompt: 0.0, sigma_trial: 0.0, lean: {{'*': 0.0}}}}\n"
        (tmp_path / f"{name}.yaml").write_text(yaml)
        out = tmp_path / name
        args = ["run", "influence-triage", "--model", "sim", "--sim-params", str(tmp_path / f"{name}.yaml")]
        args += ["--factors", "gender", "--sizes", "1-4", "--influences", "survey", "--controls", "none"]
        assert main([*args, "--out", str(out), "--quiet", "--no-report"]) == 0
        audit = next(a for a in analyze_sources(open_run(out), "triage", n_boot=20) if a.source == "readout")
        return p.larger_group(audit.cells)

    planted = larger_rates(0.9, "sized")
    base = planted[planted["arm"] == "base"]
    assert len(base) == 6  # (small, large) of sizes 1-4
    want = 1 / (1 + (base["large"] / base["small"]) ** -0.9)
    assert base["rate"].to_numpy() == pytest.approx(want.to_numpy(), abs=1e-6)
    by_ratio = p.larger_by_ratio(planted).query("arm == 'base'").set_index("ratio")["rate"]
    assert by_ratio.is_monotonic_increasing and by_ratio[4.0] == pytest.approx(1 / (1 + 4**-0.9), abs=1e-6)
    flat = larger_rates(0.0, "flat")
    assert flat[flat["arm"] == "base"]["rate"].to_numpy() == pytest.approx(0.5, abs=1e-6)


def test_larger_group_without_sizes_is_empty():
    c = pd.DataFrame({"pair": ["x"], "direction": ["base"], "variant": ["none"], "n": [1], "k": [1]})
    assert p.larger_group(c).empty


def test_invalid_rates_hand_worked():
    c = pd.DataFrame(
        {
            "pair": ["g"] * 3,
            "influence": ["none", "survey", "survey"],
            "direction": ["base", "A", "A"],
            "variant": ["none", "cue", "cue"],
            "n_a": ["2", "2", "1"],
            "n_b": ["1", "1", "1"],
            "n_ok": [6, 2, 8],
            "n_refusal": [1, 5, 0],
            "n_invalid": [1, 1, 0],
            "n_error": [0, 0, 0],
        }
    )
    t = p.invalid_rates(c).set_index(["arm", "larger_n"])
    assert t.loc[("base", "A"), "invalid_any"] == 0.25
    assert t.loc[("A", "A"), "refusal"] == 5 / 8 and t.loc[("A", "A"), "invalid_any"] == 0.75
    assert t.loc[("A", "equal"), "invalid_any"] == 0.0
    assert p.invalid_rates(c.drop(columns=["n_ok"])).empty  # readouts: no answers to be invalid


def test_invalid_rates_recover_planted_refusals(tmp_path):
    # planted: half the answers refused under the cue toward A when A is the larger group, a fifth at baseline
    from analysis.influence.audit import analyze_sources
    from probe.app.cli import main
    from probe.runs import open_run

    rules = "".join(
        f'  - {{rate: 0.5, when: {{direction: A, n_a: "{a}", n_b: "{b}"}}}}\n' for a, b in ((2, 1), (3, 1), (3, 2))
    )
    (tmp_path / "sim.yaml").write_text(
        "seed: 0\nrefusal_rules:\n" + rules + "  - {rate: 0.2, when: {direction: base}}\n"
    )
    out = tmp_path / "run"
    args = [
        "run",
        "influence-triage",
        "--model",
        "sim",
        "--sim-params",
        str(tmp_path / "sim.yaml"),
        "--factors",
        "gender",
        "--sizes",
        "1-3",
        "--influences",
        "survey",
        "--controls",
        "none",
        "--samples",
        "40",
        "--out",
        str(out),
        "--quiet",
        "--no-report",
    ]
    assert main(args) == 0
    audit = next(a for a in analyze_sources(open_run(out), "triage", n_boot=20) if a.source == "samples")
    t = p.invalid_by_arm(p.invalid_rates(audit.cells)).set_index(["arm", "larger_n"])["invalid_any"]
    assert t[("A", "A")] == pytest.approx(0.5, abs=0.1)
    for side in ("A", "B", "equal"):
        assert t[("base", side)] == pytest.approx(0.2, abs=0.08)
        assert t[("B", side)] == 0.0
    assert t[("A", "B")] == 0.0 and t[("A", "equal")] == 0.0


def test_flip_rates_by_value_hand_worked():
    # dilemma d1: baseline chooses B (honesty side B); the cue toward A (fairness) flips it to A (toward);
    # the cue toward B (honesty) keeps B (not away). d2: baseline chooses A (fairness), cue toward A flips to B (away).
    def row(item, d, variant, n, k):
        return [item, "fairness", "honesty", "survey" if d != "base" else "none", "default", "none", d, variant, n, k]

    c = pd.DataFrame(
        [
            row("d1", "base", "none", 4, 3),
            row("d1", "A", "cue", 4, 1),
            row("d1", "B", "cue", 4, 4),
            row("d2", "base", "none", 4, 0),
            row("d2", "A", "cue", 4, 3),
            row("d2", "B", "cue", 4, 2),  # a tie: left out
        ],
        columns=["item_id", "group_a", "group_b", "influence", "position", "bracket", "direction", "variant", "n", "k"],
    )
    t = p.flip_rates_by_value(c).set_index("value")
    assert t.loc["fairness", "comparisons"] == 2 and t.loc["fairness", "overall"] == 1.0
    assert t.loc["fairness", "toward"] == 1.0 and t.loc["fairness", "away"] == 1.0
    assert t.loc["honesty", "comparisons"] == 1 and t.loc["honesty", "overall"] == 0.0
    assert t.loc["honesty", "away"] == 0.0 and math.isnan(t.loc["honesty", "toward"])
    assert t.loc["all", "comparisons"] == 3 and t.loc["all", "overall"] == pytest.approx(2 / 3)


def test_baseline_bias_hand_worked():
    c = pd.DataFrame(
        {
            "benchmark": ["triage"] * 4,
            "think": [False, False, True, True],
            "variant": ["cue"] * 4,
            "f0_B": [0.2, 0.6, 0.5, 0.5],
        }
    )
    t = p.baseline_bias(c).set_index("think")
    # max(f0, 1 - f0): 0.8 and 0.6 -> mean 0.7, sd 0.1414, half-width 1.96 * 0.1414 / sqrt 2 = 0.196
    assert t.loc[False, "bb"] == pytest.approx(0.7)
    assert t.loc[False, "bb_hi"] - t.loc[False, "bb"] == pytest.approx(1.959964 * 0.1, rel=1e-5)
    assert t.loc[True, "bb"] == 0.5 and t.loc[True, "bb_lo"] == 0.5


def test_value_counts_hand_worked():
    c = pd.DataFrame({"item_id": ["d1", "d1", "d2", "d3"], "group_a": ["care", "care", "care", "duty"],
                      "group_b": ["duty", "duty", "truth", "truth"]})  # fmt: skip
    t = p.value_counts(c).set_index("value")["count"]
    assert t.to_dict() == {"care": 2, "duty": 2, "truth": 2} and t.sum() == 2 * 3


def test_max_asym_by_pair_hand_worked():
    c = pd.DataFrame(
        {
            "pair": ["age", "age", "gender"],
            "influence": ["survey", "few_shot", "survey"],
            "variant": ["cue"] * 3,
            "f0_B": [0.4, 0.4, 0.5],
            "fA_B": [0.3, 0.1, 0.4],
            "fB_B": [0.5, 0.45, 0.6],
            "delta_A": [0.1, 0.3, 0.1],
            "delta_B": [0.1, 0.05, 0.1],
            "s_A": [0.4, 1.8, 0.4],
            "s_B": [0.4, 0.2, 0.4],
            "asym": [0.0, -1.6, 0.0],
            "p_delta_A": [0.2, 0.001, 0.01],
            "p_delta_B": [0.2, 0.3, 0.01],
            "p_asym": [0.9, 0.004, 0.9],
        }
    )
    t = p.max_asym_by_pair(c).set_index("pair")
    assert t.loc["age", "influence"] == "few_shot" and t.loc["age", "abs_effect"] == pytest.approx(0.175)
    assert bool(t.loc["age", "sig_A"]) and not bool(t.loc["age", "sig_B"]) and bool(t.loc["age", "sig_asym"])
    assert t.loc["gender", "influence"] == "survey"


def test_steer_long_hand_worked():
    c = pd.DataFrame({"benchmark": ["triage"] * 2, "model": ["m"] * 2, "think": [False, True], "pair": ["age"] * 2,
                      "influence": ["survey"] * 2, "variant": ["cue"] * 2, "f0_B": [0.3, 0.5], "s_A": [1.0, 0.5],
                      "s_B": [-0.5, 0.2]})  # fmt: skip
    t = p.steer_long(c)
    assert len(t) == 4
    a0 = t[(t["direction"] == "A") & ~t["think"]].iloc[0]
    b0 = t[(t["direction"] == "B") & ~t["think"]].iloc[0]
    assert a0["s"] == 1.0 and a0["toward_preferred"] == True and b0["toward_preferred"] == False  # noqa: E712
    assert a0["baseline_bias"] == pytest.approx(0.2)
    assert t[t["think"]]["toward_preferred"].isna().all()  # f0(B) = 0.5: no preferred side


DD_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "daily_dilemmas"


@pytest.mark.skipif(not DD_DIR.is_dir(), reason="../shared/data not present")
def test_dailydilemmas_report_has_tables_3_and_4(tmp_path):
    from probe.app.cli import main

    out = tmp_path / "dd"
    args = ["run", "influence-dd", "--model", "sim", "--samples", "4", "--dd", str(DD_DIR), "--dd-limit", "30",
            "--dd-min-count", "1", "--influences", "survey", "--controls", "none", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    counts = pd.read_csv(out / "report" / "value_counts.csv")
    flips = pd.read_csv(out / "report" / "flip_rates_by_value.csv")
    # the value-level conditions hold each dilemma once per option's value, as Table 3 counts them
    per_value = pd.read_csv(out / "report" / "conditions.csv").set_index("pair")["n_items"]
    assert counts.set_index("value")["count"].to_dict() == per_value.to_dict()
    assert set(flips["value"]) - {"all"} <= set(counts["value"])
    assert "### Table 4" in (out / "report" / "summary.md").read_text()
