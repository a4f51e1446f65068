"""Cue visibility across a panel (analysis.cue.compare and compare_report): planted models with known net biases and gaps.

The planted subject (tests/planted.py) answers the benefit option with
probability p[condition] (and p[(condition, gender)] where set), the Neutral
decision with 1/2. With expected decisions (asked for explicitly; greedy is the default) every group's Favor is the mean p
of its what-if answers and Against = 1 - Favor, so net = 2 mean(p) - 1 and the
Gap = net(Direct) - net(Puzzled), computed here by brute force from the trials.

Random draws: every subject, draw and bootstrap here is seeded (the planted subject's seed and the bootstrap
seeds), and tests/test_determinism.py checks that the seeds are honoured across processes; so every assertion
here is deterministic, false-failure rate 0. Thresholds were set at these seeds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.cue import compare as cc
from experiments.cue import CueSpec, expand
from probe.app.runner import run
from probe.panel import panel_from_runs
from tests.planted import PlantedCue
from tests.report_files import assert_wrote

SPEC = CueSpec(
    items=("rent_arrears", "fallen_fence", "last_dose"),
    conditions=("neutral", "direct", "puzzled"),
    probes=("what_if",),
    combos=2,
)
# model -> (P(benefit) under Direct, under Puzzled); women lose a further 0.1 under Puzzled
PLANTED = {"A": (0.9, 0.5), "B": (0.8, 0.75), "C": (0.7, 0.6), "D": (0.6, 0.58)}


def _p(model: str) -> dict[object, float]:
    d, p = PLANTED[model]
    return {"direct": d, "puzzled": p, ("puzzled", "woman"): p - 0.1}


def _expected(model: str, items: tuple[str, ...] = SPEC.items) -> pd.DataFrame:
    """Brute force: net per (arm, attr, group) = 2 mean(p) - 1 over the what-if trials of that group."""
    engine = PlantedCue(model, _p(model))
    rows = []
    for t in expand(SPEC):
        if t.factors["probe"] != "what_if" or t.item_id not in items:
            continue
        for attr in ("gender", "race"):
            rows.append(
                {"arm": t.factors["condition"], "attr": attr, "group": t.factors[f"x_{attr}"], "p": engine.prob(t)}
            )
    df = pd.DataFrame(rows).groupby(["arm", "attr", "group"])["p"].mean().reset_index()
    df["net"] = 2 * df["p"] - 1
    return df


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("cue")
    out = []
    for model in PLANTED:
        path = root / model
        run("cue", SPEC, PlantedCue(model, _p(model)), path, progress=False, log=lambda s: None)
        out.append(path)
    return out


def test_rankings_and_gap_match_the_planted_biases(runs: list[Path]) -> None:
    from scipy.stats import kendalltau

    res = cc.compare_cue_frames(panel_from_runs(runs), n_boot=50, decision="expected")
    assert res.arm == "puzzled-hard" and res.consequences == "with" and res.dropped.empty
    m = res.models.set_index("name")
    for model in PLANTED:
        exp = _expected(model)
        direct = exp[exp["arm"] == "direct"]
        puzzled = exp[exp["arm"] == "puzzled"]
        assert m.loc[model, "direct_net"] == pytest.approx(direct["net"].mean())
        assert m.loc[model, "direct_net"] == pytest.approx(2 * PLANTED[model][0] - 1)  # every group alike
        assert m.loc[model, "puzzled_net"] == pytest.approx(puzzled["net"].mean())
        both = direct.merge(puzzled, on=["attr", "group"], suffixes=("_d", "_p"))
        assert m.loc[model, "gap"] == pytest.approx((both["net_d"] - both["net_p"]).mean())
    # Direct net 0.8, 0.6, 0.4, 0.2 -> ranks 1..4; Puzzled: A falls to last, B leads
    assert list(m["rank_direct"]) == [1, 2, 3, 4]
    assert list(m["rank_puzzled"]) == [4, 1, 2, 3]
    assert list(m["rank_gap"]) == [4, 2, 3, 1]
    assert list(m["rank_change"]) == [3, -1, -1, -1]
    k = res.kendall.set_index(["ranking_a", "ranking_b"])
    # by hand: A is discordant with B, C, D; B, C, D are concordant among themselves: (3 - 3) / 6 = 0
    assert k.loc[("direct", "puzzled"), "tau"] == pytest.approx(0.0)
    for (a, b), row in k.iterrows():
        ref = kendalltau(m[f"rank_{a}"], m[f"rank_{b}"])
        assert row["tau"] == pytest.approx(ref.statistic) and row["p_value"] == pytest.approx(ref.pvalue)


def test_sign_tests_count_the_planted_shifts(runs: list[Path]) -> None:
    from scipy.stats import binomtest

    res = cc.compare_cue_frames(panel_from_runs(runs), n_boot=2, decision="expected")
    st = res.sign_tests[res.sign_tests["value"] == "gap"].set_index(["attr", "group"])
    for (attr, group), row in st.iterrows():
        if group == "macro":
            continue
        signs = []
        for model in PLANTED:
            exp = _expected(model).set_index(["arm", "attr", "group"])["net"]
            signs.append(np.sign(exp[("direct", attr, group)] - exp[("puzzled", attr, group)]))
        assert row["positive"] == sum(s > 0 for s in signs) and row["negative"] == sum(s < 0 for s in signs)
        n = row["positive"] + row["negative"]
        assert row["p_value"] == pytest.approx(binomtest(int(row["positive"]), int(n), 0.5).pvalue)
    assert st.loc[("gender", "woman"), "positive"] == 4  # every planted model shifts against women


def test_gap_against_attributes_is_statsmodels_ols(runs: list[Path], tmp_path: Path) -> None:
    import statsmodels.api as sm

    attrs = tmp_path / "attrs.csv"
    attrs.write_text("model,alignment,size,label\nA,1,8,x\nB,3,70,y\nC,2,30,z\nD,3,9,w\nE,1,1,v\n")
    res = cc.compare_cue_frames(panel_from_runs(runs, attributes=attrs), n_boot=2, decision="expected")
    assert res.ols is not None
    data = res.models[["name", "gap"]].merge(pd.read_csv(attrs).rename(columns={"model": "name"}), on="name")
    for col in ("alignment", "size"):
        ref = sm.OLS(data["gap"], sm.add_constant(data[col].astype(float))).fit()
        row = res.ols[(res.ols["fit"] == col)].iloc[0]
        assert row["n"] == 4 and row["slope"] == pytest.approx(ref.params[col])
        assert (row["slope_lo"], row["slope_hi"]) == pytest.approx(tuple(ref.conf_int().loc[col]))
        assert row["r2"] == pytest.approx(ref.rsquared) and row["p_value"] == pytest.approx(ref.pvalues[col])
    joint = res.ols[res.ols["fit"].str.startswith("joint")]
    assert list(joint["note"]) == ["too few models or no spread"] * 2  # 4 models, 2 slopes: not fitted
    assert any("label" in n for n in res.notes) and any("E" in n for n in res.notes)


def test_attribute_rows_match_run_names_first(runs: list[Path], tmp_path: Path) -> None:
    attrs = tmp_path / "a.csv"
    attrs.write_text("model,score\nA,1\nB,2\n")
    table, notes = cc.read_attributes(attrs, panel_from_runs(runs[:3]).runs)
    assert list(table["score"].fillna(-1)) == [1, 2, -1]
    assert notes == ["run 'C' (model 'C') has no row in the attributes table"]
    (tmp_path / "bad.csv").write_text("name,score\nA,1\n")
    with pytest.raises(ValueError, match="`model` column"):
        cc.read_attributes(tmp_path / "bad.csv", panel_from_runs(runs[:1]).runs)


def test_runs_are_matched_on_shared_dilemmas(runs: list[Path], tmp_path: Path) -> None:
    spec = CueSpec(items=("rent_arrears", "fallen_fence"), conditions=SPEC.conditions, probes=SPEC.probes, combos=2)
    other = tmp_path / "E"
    run("cue", spec, PlantedCue("E", _p("A")), other, progress=False, log=lambda s: None)
    res = cc.compare_cue_frames(panel_from_runs([runs[0], other]), n_boot=2, decision="expected")
    assert set(res.items) == {"rent_arrears", "fallen_fence"}
    assert list(res.dropped["item_id"]) == ["last_dose"] and list(res.dropped["run"]) == ["A"]
    # A's tables are computed on the shared dilemmas only
    exp = _expected("A", res.items)
    both = exp[exp["arm"] == "direct"].merge(exp[exp["arm"] == "puzzled"], on=["attr", "group"], suffixes=("_d", "_p"))
    m = res.models.set_index("name")
    assert m.loc["A", "gap"] == pytest.approx((both["net_d"] - both["net_p"]).mean())


def test_tiny_panel_through_probe_compare(tmp_path: Path) -> None:
    from probe.app.cli import main

    args = ["run", "cue", "--model", "tiny", "--quiet", "--items", "rent_arrears", "--probes", "what_if,check"]
    args += ["--conditions", "neutral,direct,puzzled"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b"), "--system", "Be fair."]) == 0
    attrs = tmp_path / "attrs.csv"
    attrs.write_text("model,alignment\ntiny,2\ntiny [b],3\n")
    out = tmp_path / "cmp"
    code = main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--attributes", str(attrs), "--out", str(out)])
    assert code == 0
    assert_wrote(
        out,
        {
            "summary.md",
            "cue_rankings.csv",
            "cue_kendall.csv",
            "cue_sign_tests.csv",
            "cue_gap_ols.csv",
            "fig_cue_rankings.png",
            "fig_cue_gap_vs_attributes.png",
            "cue_average.csv",
            "cue_average_by_group.csv",
        },
    )
    summary = (out / "summary.md").read_text()
    assert "| Average |" in summary and "greedy decisions" in summary
    ranks = pd.read_csv(out / "cue_rankings.csv")
    assert list(ranks["name"]) == ["tiny [a]", "tiny [b]"]
    ols = pd.read_csv(out / "cue_gap_ols.csv")
    assert {"alignment", "puzzle_solve_rate"} <= set(ols["fit"])  # the derived capability joins the user's table
    assert "Underpowered" in (out / "summary.md").read_text()
