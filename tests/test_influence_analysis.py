"""The influence audit's analysis (analysis.influence.audit): hand-built cells, and recovery of planted steerabilities.

The recovery tests run the whole pipeline (expand -> runner -> run store ->
report) on the planted-steerability subject of tests/planted.py: each trial's
P(choose B) is ``sigmoid(base[pair] + shift)``, with the shift planted per
(pair, influence, direction). The analysis must give back the planted s(A),
s(B), Asym and backfire.

Random draws: every subject, draw and bootstrap here is seeded (the planted subject's seed and the bootstrap
seeds), and tests/test_determinism.py checks that the seeds are honoured across processes; so every assertion
here is deterministic, false-failure rate 0. Thresholds were set at these seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis.common.report import write_report_files
from analysis.influence import audit as inf
from analysis.influence import report
from experiments.influence import effects as ie
from experiments.influence import stats as st
from experiments.influence.build import AuditSpec
from experiments.influence.triage import TriageSpec
from probe.app.runner import run
from probe.record import Plan
from probe.runs import as_run
from tests.planted import TRIAGE_BASE, TRIAGE_SHIFTS, PlantedInfluence

# ====================================================================== hand-built cells


def _cell(item: str, direction: str, n: float, k: float, *, pair: str = "p", influence: str = "survey", **kw: Any):
    base = direction in ("base", "rerun")
    return {
        "trial_id": f"{item}-{direction}-{influence}-{kw.get('order', 'a_first')}",
        "item_id": item,
        "pair": pair,
        "influence": "none" if base else influence,
        "variant": "none" if base else kw.get("variant", "cue"),
        "kind": "none" if base else kw.get("kind", "sentence"),
        "position": "none" if base else "start",
        "bracket": "none",
        "direction": direction,
        "named": "none" if base else kw.get("named", direction),
        "group_a": kw.get("group_a", "a"),
        "group_b": kw.get("group_b", "b"),
        "order": kw.get("order", "a_first"),
        "n": float(n),
        "k": float(k),
        "stratum": pair,
    }


def _hand_cells() -> pd.DataFrame:
    rows = [
        # item i1: all three arms; item i2: all three arms; item i3: no toward-B trial -> left out of the condition
        _cell("i1", "base", 30, 15),
        _cell("i1", "A", 30, 10),
        _cell("i1", "B", 30, 20),
        _cell("i2", "base", 30, 15),
        _cell("i2", "A", 30, 5),
        _cell("i2", "B", 30, 20),
        _cell("i3", "base", 30, 30),
        _cell("i3", "A", 30, 30),
        _cell("i1", "rerun", 30, 16),
        _cell("i2", "rerun", 30, 13),
    ]
    return pd.DataFrame(rows)


def test_contributions_keep_items_asked_in_all_three_arms() -> None:
    ct = ie.contributions(_hand_cells())
    assert list(ct.conditions["influence"]) == ["survey"]
    assert ct.items == ("i1", "i2", "i3")
    # arm totals over i1 and i2 only (i3 lacks the cue toward B)
    np.testing.assert_array_equal(ct.n.sum(axis=2)[:, 0], [60, 60, 60])
    np.testing.assert_array_equal(ct.k.sum(axis=2)[:, 0], [30, 15, 40])


def test_condition_table_on_counts_matches_the_hand_worked_statistics() -> None:
    res = ie.condition_table(ie.contributions(_hand_cells()), "samples", n_boot=200)
    row = res.table.iloc[0]
    assert row["f0_B"] == 0.5 and row["fA_B"] == 0.25 and row["fB_B"] == pytest.approx(40 / 60)
    assert row["delta_A"] == pytest.approx(0.25) and row["delta_B"] == pytest.approx(1 / 6)
    assert row["s_A"] == pytest.approx(math.log(45.5 / 15.5))
    assert row["s_B"] == pytest.approx(math.log(40.5 / 20.5))
    asym, var, _, p = st.wald_asym(30, 60, 15, 60, 40, 60)
    assert row["asym"] == pytest.approx(float(asym)) and row["p_asym"] == pytest.approx(float(p))
    assert row["asym_var"] == pytest.approx(float(var))
    assert row["p_baseline"] == pytest.approx(1.0)
    assert row["p_delta_A"] == pytest.approx(float(st.two_proportion_z(45, 60, 30, 60)[1]))
    assert row["test_basis"] == "counts"
    assert row["n_items"] == 2
    assert res.delta_reps.shape == (200, 1, 2)
    # every bootstrap replicate resamples i1/i2/i3 within the stratum; the CI brackets the estimate
    assert row["delta_A_lo"] <= row["delta_A"] <= row["delta_A_hi"]


def test_readout_runs_are_tested_on_the_bootstrap_se() -> None:
    cells = _hand_cells()
    cells["n"] = 1.0  # probabilities: one prompt per trial
    cells["k"] = cells["k"] / 30
    t = ie.condition_table(ie.contributions(cells), "readout", n_boot=500).table.iloc[0]
    assert t["test_basis"] == "bootstrap"
    assert t["f0_B"] == pytest.approx(0.5)
    # f_0(B) is 1/2 in both items: zero bootstrap spread, zero estimate -> p = 1
    assert t["p_baseline"] == pytest.approx(1.0)
    assert t["p_delta_A"] == pytest.approx(float(st.z_pvalue(t["delta_A"] / t["delta_A_se"])))
    with pytest.raises(ValueError, match="source"):
        ie.condition_table(ie.contributions(cells), "guess")


def test_value_level_rekeys_each_dilemma_into_both_values() -> None:
    cells = pd.DataFrame(
        [
            _cell("d1", "base", 10, 3, pair="x|y", group_a="x", group_b="y"),
            _cell("d1", "A", 10, 1, pair="x|y", group_a="x", group_b="y"),
            _cell("d1", "B", 10, 6, pair="x|y", group_a="x", group_b="y"),
        ]
    )
    v = ie.value_level(cells)
    x, y = v[v["pair"] == "x"], v[v["pair"] == "y"]
    assert list(x["k"]) == [3, 1, 6] and list(x["direction"]) == ["base", "A", "B"]
    # in y's condition, side A is y: counts of choosing the other side (x) = n - k, directions swap
    assert list(y["k"]) == [7, 9, 4] and list(y["direction"]) == ["base", "B", "A"]
    assert set(v["stratum"]) == {"all"}
    t = ie.condition_table(ie.contributions(v), "samples", n_boot=50).table.set_index("pair")
    assert t.loc["x", "s_A"] == pytest.approx(t.loc["y", "s_B"])  # the same cue seen from both values


def test_noise_floor_compares_the_rerun_on_common_items() -> None:
    nf = inf.noise_floor(_hand_cells())
    assert list(nf["items"]) == [2]
    assert nf["f0_B"].iloc[0] == pytest.approx(0.5)
    assert nf["f0_B_rerun"].iloc[0] == pytest.approx(29 / 60)
    assert nf["abs_diff"].iloc[0] == pytest.approx(1 / 60)


def test_flip_rates_hand_example() -> None:
    rows = [
        _cell("d1", "base", 4, 1),  # baseline chooses A
        _cell("d1", "A", 4, 0),  # toward A, stays A: no flip (baseline already on target)
        _cell("d1", "B", 4, 3),  # toward B, flips to B: toward flip
        _cell("d2", "base", 4, 3),  # baseline chooses B
        _cell("d2", "A", 4, 3),  # toward A, stays B: no flip
        _cell("d2", "B", 4, 1),  # toward B, flips to A: away flip (sample-level backfire)
        _cell("d3", "base", 4, 2),  # a tie: left out
        _cell("d3", "A", 4, 0),
    ]
    fr = inf.flip_rates(pd.DataFrame(rows)).set_index("influence")
    assert fr.loc["all", "comparisons"] == 4
    assert fr.loc["all", "overall"] == pytest.approx(0.5)
    assert fr.loc["all", "toward"] == pytest.approx(0.5)  # d1->B flips; d2->A does not
    assert fr.loc["all", "away"] == pytest.approx(0.5)  # d2->B flips away; d1->A does not


def _table(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows).assign(benchmark="triage", variant="cue")


def test_fdr_and_flags_within_benchmark_and_family() -> None:
    p_asym = [0.001, 0.02, 0.04, 0.3]
    t = _table(
        [
            {
                "pair": f"p{i}",
                "p_baseline": 0.5 if i < 2 else 0.001,
                "p_asym": p,
                "p_delta_A": p,
                "p_delta_B": 0.9,
                "baseline_bias": 0.01 * i,
                "f0_ci_lo": 0.46,
                "f0_ci_hi": 0.54 + 0.005 * i,
                "s_A": 0.5 - 0.3 * i,
                "s_B": 0.1,
            }
            for i, p in enumerate(p_asym)
        ]
    )
    out = ie.with_fdr(t, ("benchmark", "variant"))
    np.testing.assert_allclose(out["q_asym"], st.bh_adjust(p_asym))
    np.testing.assert_allclose(np.concatenate([out["q_delta_A"], out["q_delta_B"]]), st.bh_adjust(p_asym + [0.9] * 4))
    assert list(out["neutral_binom"]) == [True, True, False, False]
    assert list(out["neutral_margin"]) == [True, True, True, True]
    assert list(out["neutral_ci"]) == [True, True, False, False]
    assert list(out["sig_asym"]) == [True, True, True, False]
    # BH by hand, m = 4: 0.001*4, 0.02*4/2, 0.04*4/3, 0.3 -> 0.004, 0.04, 0.0533, 0.3
    np.testing.assert_allclose(out["q_asym"], [0.004, 0.04, 0.04 * 4 / 3, 0.3])
    assert list(out["sig_asym_bh"]) == [True, True, False, False]
    assert list(out["backfire_A"]) == [False, False, True, True] and not out["backfire_B"].any()


def _conditions(**over: Any) -> pd.DataFrame:
    base = {
        "pair": ["g", "g", "h", "h"],
        "influence": ["survey", "few_shot", "survey", "few_shot"],
        "variant": "cue",
        "kind": ["sentence", "turns", "sentence", "turns"],
        "position": "start",
        "bracket": "none",
        "benchmark": "triage",
        "model": "m",
        "think": False,
        "run": "r",
        "f0_B": [0.5, 0.5, 0.8, 0.8],
        "fA_B": [0.3, 0.6, 0.5, 0.9],
        "fB_B": [0.7, 0.5, 0.9, 0.85],
        "s_A": [0.8, -0.4, 1.4, -0.8],
        "s_B": [0.8, 0.0, 0.8, 0.35],
        "p_baseline": [0.9, 0.9, 0.001, 0.001],
        "p_delta_A": [0.001, 0.01, 0.001, 0.01],
        "p_delta_B": [0.001, 0.9, 0.01, 0.3],
        "p_asym": [0.9, 0.2, 0.04, 0.001],
        "baseline_bias": [0.0, 0.0, 0.3, 0.3],
        "f0_ci_lo": [0.48, 0.48, 0.7, 0.7],
        "f0_ci_hi": [0.52, 0.52, 0.9, 0.9],
    }
    base.update(over)
    t = pd.DataFrame(base)
    t["delta_A"] = t["f0_B"] - t["fA_B"]
    t["delta_B"] = t["fB_B"] - t["f0_B"]
    t["asym"] = t["s_B"] - t["s_A"]
    t["n_asym"] = st.normalized_asym(t["s_A"], t["s_B"])
    return ie.with_fdr(t)


def test_effects_relation_and_backfire() -> None:
    e = ie.effects(_conditions()).set_index(["pair", "influence", "direction"])
    assert e.loc[("g", "few_shot", "A"), "backfire"]  # s_A < 0
    assert e.loc[("g", "survey", "A"), "relation"] == "neutral"
    assert e.loc[("h", "survey", "B"), "relation"] == "toward_preferred"  # baseline prefers B (0.8)
    assert e.loc[("h", "survey", "A"), "relation"] == "away_from_preferred"


def test_summary_by_and_headline_hand_values() -> None:
    c = _conditions()
    by = inf.summary_by(c, "influence").set_index("influence")
    # survey: |delta| over (g: 0.2, 0.2; h: 0.3, 0.1) -> 0.2; significant effects 4 of 4, none backfire
    assert by.loc["survey", "|delta|"] == pytest.approx(0.2)
    assert by.loc["survey", "sig"] == 1.0 and by.loc["survey", "bf_of_sig"] == 0.0
    # few_shot: effects (g,A) delta -0.1 sig backfire, (g,B) ns, (h,A) delta -0.1 sig backfire, (h,B) ns
    assert by.loc["few_shot", "sig"] == 0.5 and by.loc["few_shot", "bf_of_sig"] == 1.0
    head = inf.headline(c).set_index("metric")["value"]
    assert head["conditions"] == 4
    assert head["mean |shift| (pp), all cues"] == pytest.approx(100 * np.mean([0.2, 0.2, 0.1, 0, 0.3, 0.1, 0.1, 0.05]))
    assert head["mean |shift| (pp), one-sentence user-message cues"] == pytest.approx(100 * 0.2)
    assert head["backfire share of significant effects (raw)"] == pytest.approx(2 / 6)
    assert head["baseline-neutral conditions (test of f0(B) = 1/2)"] == 2
    # the neutral ones (g) have p_asym 0.9 and 0.2; all four are within the margin, two of them asymmetric
    assert head["  neutral (test of f0(B) = 1/2): share with significant asymmetry (raw)"] == 0.0
    assert head["  neutral (|f0(B) - 0.5| < 0.05): share with significant asymmetry (raw)"] == 0.0
    assert head["conditions with significant asymmetry (raw)"] == 0.5
    lean, asym = c["f0_B"] - 0.5, c["s_B"] - c["s_A"]
    assert head["signed correlation r(f0(B) - 0.5, Asym)"] == pytest.approx(np.corrcoef(lean, asym)[0, 1])
    by_model = inf.summary_by(c, ["model", "think"])
    assert len(by_model) == 1 and by_model["conditions"].iloc[0] == 4


def test_combine_runs_redoes_fdr_across_models() -> None:
    a, b = _conditions(), _conditions(model="n", run="r2", think=True)
    both = inf.combine_runs([a, b])
    np.testing.assert_allclose(both["q_asym"], st.bh_adjust(np.concatenate([a["p_asym"], b["p_asym"]])))
    by_think = inf.summary_by(both, "think")
    assert list(by_think["conditions"]) == [4, 4]
    head = inf.headline(both).set_index("metric")
    assert head.loc["mean |shift| (pp), all cues", "note"] == "cluster bootstrap"
    with pytest.raises(ValueError, match=r"conditions\.csv"):
        inf.combine_runs([a.drop(columns=["model"])])
    panels = inf.panel_tables(both)
    assert set(panels) == {"headline", "by_influence", "by_pair", "by_model", "by_reasoning", "by_influence_reasoning"}
    assert len(panels["by_model"]) == 2 and len(panels["by_influence_reasoning"]) == 4
    assert set(panels["headline"]["benchmark"]) == {"triage"}


def test_placebo_and_negation_controls() -> None:
    c = pd.concat(
        [
            _conditions(),
            _conditions(variant="placebo", s_A=[0.1] * 4, s_B=[0.1] * 4),
            _conditions(variant="negated", fA_B=[0.6, 0.4, 0.85, 0.7], fB_B=[0.4, 0.6, 0.7, 0.9]),
        ],
        ignore_index=True,
    )
    gap = inf.placebo_gap(c).set_index("influence")
    assert gap.loc["survey", "|s| cue"] == pytest.approx(np.mean([0.8, 1.1]))
    assert gap.loc["survey", "gap"] == pytest.approx(np.mean([0.8, 1.1]) - 0.1)
    neg = inf.negation_match(c).set_index("influence")
    # survey: the plain cue moves both directions significantly (4 effects); "not A" moves toward B here,
    # i.e. delta_A of the negated row has the opposite sign: 0 matches
    assert neg.loc["survey", "significant cue effects"] == 4
    assert neg.loc["survey", "negation match"] == 0.0


# ============================================================== planted-steerability subject

BASE = TRIAGE_BASE
PLANTED = TRIAGE_SHIFTS


def planted_engine() -> PlantedInfluence:
    """P(B) = sigmoid(BASE[pair] + planted shift toward the cue's side), the same for every prompt of an arm."""
    return PlantedInfluence("planted", PLANTED, BASE)


SPEC = TriageSpec(
    audit=AuditSpec(influences=("survey", "emotional", "weak_evidence")),
    factors=("gender", "age"),
    sizes=(1, 2, 3, 4, 5),
)


def _planted_s(pair: str, influence: str, d: str) -> float:
    return PLANTED[(influence, d)]


def test_planted_steerabilities_are_recovered_from_readouts(tmp_path: Path) -> None:
    store = run("influence-triage", SPEC, planted_engine(), tmp_path / "r", progress=False, log=lambda s: None)
    audit = inf.analyze(as_run(store), "triage", n_boot=200)
    t = audit.conditions.set_index(["pair", "influence"])
    for (pair, infl), row in t.iterrows():
        for d in ("A", "B"):
            planted = _planted_s(pair, infl, d)
            # every prompt of an arm reads the same P(B), so the logit of the mean probability is the planted
            # log-odds and the readout rule (no pseudo-count) gives the planted s exactly; the old rule (+1/2 per
            # cell over the 50 prompts) read it up to 0.12 short
            lo = np.log(
                row[["f0_B", "fA_B", "fB_B"]].to_numpy(float) / (1 - row[["f0_B", "fA_B", "fB_B"]].to_numpy(float))
            )
            exact = lo[2] - lo[0] if d == "B" else lo[0] - lo[1]
            assert row[f"s_{d}"] == pytest.approx(exact, abs=1e-12)  # the difference of its own f columns' logits
            assert row[f"s_{d}"] == pytest.approx(planted, abs=1e-9)  # and the planted value
            assert row["clipped"] == ""
        assert row["asym"] == pytest.approx(_planted_s(pair, infl, "B") - _planted_s(pair, infl, "A"), abs=1e-9)
    eff = ie.effects(audit.conditions).set_index(["pair", "influence", "direction"])
    assert bool(eff.loc[("gender", "weak_evidence", "A"), "backfire"])
    assert not bool(eff.loc[("gender", "weak_evidence", "B"), "backfire"])


def test_planted_steerabilities_are_recovered_from_samples(tmp_path: Path) -> None:
    store = run(
        "influence-triage",
        SPEC,
        planted_engine(),
        tmp_path / "s",
        plan=Plan(readout=False, samples=20),
        progress=False,
        log=lambda s: None,
    )
    paths = write_report_files(tmp_path / "s" / "report", *report.influence_report(store, "triage", n_boot=300))
    assert {"summary.md", "conditions.csv", "headline.csv", "by_influence.csv", "fig_steerability.png"} <= {
        p.name for p in paths
    }
    c = pd.read_csv(tmp_path / "s" / "report" / "conditions.csv").set_index(["pair", "influence"])
    assert set(c["test_basis"]) == {"counts"}
    # conditions in design order (factor, then influence type), although sampled tables come in hash order
    assert list(c.index) == [(p, i) for p in ("gender", "age") for i in ("survey", "emotional", "weak_evidence")]
    covered = 0
    for (pair, infl), row in c.iterrows():
        for d in ("A", "B"):
            planted = _planted_s(pair, infl, d)
            se = math.sqrt(row["asym_var"])  # a conservative yardstick for one s (its variance is smaller)
            assert abs(row[f"s_{d}"] - planted) < 3 * se, (pair, infl, d)
            covered += row[f"s_{d}_lo"] <= planted <= row[f"s_{d}_hi"]
        true_asym = _planted_s(pair, infl, "B") - _planted_s(pair, infl, "A")
        assert abs(row["asym"] - true_asym) < 3.5 * math.sqrt(row["asym_var"])
    assert covered >= 10  # of 12 planted steerabilities inside their 95% bootstrap CI
    # the planted asymmetry of emotional (0.5 vs 2.0) and the backfire of weak evidence are detected
    assert (c.xs("emotional", level="influence")["p_asym"] < 0.05).all()
    assert (c.xs("survey", level="influence")["p_asym"] > 0.001).all()
    wk = c.xs("weak_evidence", level="influence")
    assert ((wk["s_A"] < 0) & (wk["p_delta_A"] < 0.05)).all()


def test_report_is_results_then_formatting_then_one_writer(tmp_path: Path) -> None:
    """The report computes once (a frozen :class:`InfluenceResults`), formats without writing a file (the figure
    functions return figures), and :func:`analysis.common.report.write_report_files` writes what the formatting named."""
    import dataclasses

    from analysis.common.figures import pyplot
    from analysis.common.report import write_report_files
    from analysis.influence.results import influence_results

    store = run("influence-triage", SPEC, planted_engine(), tmp_path / "r", progress=False, log=lambda s: None)
    res = influence_results(as_run(store), "triage", n_boot=50)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.n_boot = 1  # type: ignore[misc]
    lines, files = report.influence_md(res)
    assert report.influence_md(res)[0] == lines  # formatting computes nothing new: the same lines again
    assert not (tmp_path / "r" / "report").exists()
    names = [d.name for d in files.figures]
    assert names == [
        "fig_conditions_00_gender.png",
        "fig_conditions_01_age.png",
        "fig_steerability.png",
        "fig_larger_group.png",  # paper 000's I.9 (analysis/influence/paper000_report.py)
    ]
    assert all(f"`{n}`" in "\n".join(lines) for n in names)
    fig = files.figures[-1].draw()
    assert type(fig).__name__ == "Figure"
    pyplot().close(fig)
    out = tmp_path / "out"
    written = {p.name for p in write_report_files(out, lines, files)}
    assert {*names, "summary.md", *(f"{stem}.csv" for stem in files.tables)} == written
    assert (out / "summary.md").read_text() == "\n".join(lines)
