"""``probe compare`` on battery and yes/no panels: planted sim models recover their planted differences.

Random draws: every subject, draw and bootstrap here is seeded (SimParams seeds of the planted models,
--n-boot/--seed of the comparison), and tests/test_determinism.py checks that the seeds are honoured across
processes; so every assertion here is deterministic, false-failure rate 0. Thresholds were set at these seeds;
a 95% interval checked for covering a planted value would miss it one run in 20 at fresh seeds, which is why
the seeds stay fixed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.battery.compare_agreement import agreement, g_of
from analysis.battery.compare_humans import HumanTableError, framing_shift, load_humans
from analysis.battery.compare_report import compare_battery
from analysis.common.report import write_report_files
from engines.sim.engine import SimEngine
from engines.sim.params import SimParams
from experiments.battery import REDUCED, BatterySpec
from experiments.dilemmas import load_dilemmas
from probe.app.runner import run
from probe.panel import load_panel
from probe.record import Plan
from tests.report_files import assert_wrote

ITEMS = tuple(d.id for d in load_dilemmas()[:12])
A = {"seed": 1, "s": 0.3, "m_order": 0.15, "m_word": 0.05, "sigma_form": 0.12}
A_ON = {**A, "m_order": 0.05, "sigma_form": 0.04}
"""The reasoning-on run of model A: same seed and thetas, |m_order| down by 0.10, incoherence down."""
B = {"seed": 2, "s": 0.4, "m_word": 0.1, "sigma_form": 0.08}


def _theta_c() -> dict[str, float]:
    """Model C: a planted stance that partly follows A's (so the planted r^2 is neither 0 nor 1)."""
    a, c = SimParams(seed=1), SimParams(seed=3)
    return {i: 0.6 * a.item_theta(i) + 0.4 * c.item_theta(i) for i in ITEMS}


C = {"seed": 3, "s": 0.25, "m_order": -0.1, "sigma_form": 0.06, "theta": _theta_c()}


def sim_run(out: Path, params: dict, items=ITEMS, **plan) -> Path:
    spec = BatterySpec(items=tuple(items), instruments=("graded", "binary"), **REDUCED)
    run("battery", spec, SimEngine(SimParams(**params)), out, plan=Plan(**plan), progress=False, log=lambda s: None)
    return out


def write_panel(path: Path, runs: list[tuple[str, str, str, bool]], humans: Path | None = None) -> Path:
    lines = ["runs:"]
    for run_dir, name, model, reasoning in runs:
        lines.append(f"  - {{run: {run_dir}, name: {name}, model: {model}, reasoning: {str(reasoning).lower()}}}")
    if humans:
        lines.append(f"humans: {humans}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("panel")
    for name, params in (("A", A), ("A_on", A_ON), ("B", B), ("C", C)):
        sim_run(root / name, params)
    return root


@pytest.fixture(scope="module")
def report(runs: Path) -> Path:
    panel = write_panel(
        runs / "panel.yaml",
        [("A", "A", "A", False), ("A_on", "A think", "A", True), ("B", "B", "B", False), ("C", "C", "C", False)],
    )
    out = runs / "cmp"
    write_report_files(out, *compare_battery(load_panel(panel), n_boot=500))
    return out


# --------------------------------------------------------------- estimators by hand
def test_g_and_agreement_by_hand():
    th = np.array([0.5, -0.2, 0.1, 0.7])
    sg = np.array([0.1, 0.2, 0.0, 0.1])
    var = np.var(th, ddof=1)
    assert float(g_of(th, sg)) == pytest.approx(var / (var + np.mean(sg**2)))
    t = pd.DataFrame({"a": th, "b": 2 * th + 1, "c": [0.1, 0.3, -0.5, 0.0]}, index=list("wxyz"))
    r, cons, per_run = agreement(t)
    assert r.loc["a", "c"] == pytest.approx(stats.pearsonr(t["a"], t["c"]).statistic)
    z = (t - t.mean()) / t.std(ddof=1)
    assert cons.loc["w", "consensus"] == pytest.approx(t.loc["w"].mean())  # raw mean theta (the paper's)
    assert cons.loc["w", "disagreement"] == pytest.approx(z.loc["w"].std(ddof=1))
    # consensus alignment: r^2 with the mean of the other reference runs (leave-one-out)
    assert per_run.loc["c", "consensus_r2"] == pytest.approx(
        stats.pearsonr(t["c"], (t["a"] + t["b"]) / 2).statistic ** 2
    )
    # a reference set: consensus over a and b only; c (not in it) is aligned with that whole consensus
    _, cons_ab, per_ab = agreement(t, ["a", "b"])
    assert cons_ab.loc["x", "consensus"] == pytest.approx((t.loc["x", "a"] + t.loc["x", "b"]) / 2)
    assert per_ab.loc["c", "consensus_r2"] == pytest.approx(
        stats.pearsonr(t["c"], (t["a"] + t["b"]) / 2).statistic ** 2
    )
    assert per_ab.loc["a", "consensus_r2"] == pytest.approx(1.0)  # b = 2a + 1: perfectly aligned
    assert list(per_ab["in_reference"]) == [True, True, False]
    with pytest.raises(ValueError, match="reference runs"):
        agreement(t, ["nope"])
    assert per_run.loc["c", "mean_r_with_others"] == pytest.approx((r.loc["c", "a"] + r.loc["c", "b"]) / 2)
    assert per_run["mean_r_with_others"].idxmin() == "c"  # the outlier model
    assert list(cons["rank"]) == sorted(cons["rank"])


# --------------------------------------------------------------- planted panels
def test_r2_matrix_matches_the_planted_theta_correlations(report: Path):
    r2 = pd.read_csv(report / "agreement_r2.csv", index_col=0)
    planted = pd.read_csv(report / "planted_r2.csv", index_col=0)
    assert list(r2.index) == ["A", "A think", "B", "C"]
    assert np.abs(r2.to_numpy() - planted.loc[r2.index, r2.columns].to_numpy()).max() < 0.05
    # and the planted matrix is the one computed here from the planted thetas
    items = pd.read_csv(report / "consensus.csv")["item_id"]
    ta = [SimParams(**A).item_theta(i) for i in items]
    tb = [SimParams(**B).item_theta(i) for i in items]
    tc = [C["theta"][i] for i in items]
    assert planted.loc["A", "B"] == pytest.approx(stats.pearsonr(ta, tb).statistic ** 2, abs=1e-5)
    assert planted.loc["A", "C"] == pytest.approx(stats.pearsonr(ta, tc).statistic ** 2, abs=1e-5)
    assert 0.2 < planted.loc["A", "C"] < 0.95
    models = pd.read_csv(report / "agreement_models.csv", index_col=0)
    assert set(models.index) == {"A", "A think", "B", "C"}


def test_deliberation_recovers_the_planted_change(report: Path):
    d = pd.read_csv(report / "deliberation.csv").fillna({"channel": ""})
    row = d[(d["quantity"] == "abs_m") & (d["channel"] == "order")].iloc[0]
    # off - on, the paper's sign (issue 18): planted |m_order| 0.15 -> 0.05 gives +0.10
    assert row["lo"] <= 0.10 <= row["hi"]
    assert row["off_minus_on"] == pytest.approx(row["off"] - row["on"])
    assert row["lo"] > 0  # excludes 0
    inc = d[d["quantity"] == "sigma_repro"].iloc[0]
    assert inc["off_minus_on"] > 0 and inc["lo"] > 0  # planted sigma_form 0.12 -> 0.04: less incoherent
    assert inc["off"] == pytest.approx(0.12, abs=0.03) and inc["on"] == pytest.approx(0.04, abs=0.02)
    g = d[d["quantity"] == "G"].iloc[0]
    assert g["off_minus_on"] < 0  # G rises with reasoning on
    lex = d[(d["quantity"] == "abs_m") & (d["channel"] == "lexical")].iloc[0]
    assert lex["lo"] <= 0 <= lex["hi"]  # unchanged m_word
    assert set(d["model"]) == {"A"}


def test_models_table_and_files(report: Path):
    m = pd.read_csv(report / "models.csv", index_col=0)
    assert m.loc["A", "mean_sigma_repro"] > m.loc["A think", "mean_sigma_repro"]
    assert m.loc["A", "G_lo"] <= m.loc["A", "G"] <= m.loc["A", "G_hi"]
    fits = pd.read_csv(report / "fit_sm.csv")
    order = fits[fits["channel"] == "order"].set_index("run")
    assert order.loc["A", "m"] == pytest.approx(0.15, abs=0.03)
    assert order.loc["C", "m"] == pytest.approx(-0.10, abs=0.03)
    summary = (report / "summary.md").read_text()
    for title in ("Models side by side", "Agreement of the item ordering", "Deliberation", "Outlier models"):
        assert title in summary
    assert "No human table" in summary and "No pair of a readout run" in summary
    for fig in ("fig_stance_models.png", "fig_decomposition_models.png", "fig_sm_models.png", "fig_agreement_r2.png"):
        assert (report / fig).stat().st_size > 1000, fig
    assert (report / "fig_deliberation.png").stat().st_size > 1000


def test_item_matching_reports_the_drops(runs: Path, tmp_path: Path):
    sub = sim_run(tmp_path / "sub", B, items=ITEMS[:8])
    panel = write_panel(tmp_path / "p.yaml", [(str(runs / "A"), "A", "A", False), (str(sub), "Bsub", "B", False)])
    write_report_files(tmp_path / "out", *compare_battery(load_panel(panel), n_boot=200))
    dropped = pd.read_csv(tmp_path / "out" / "dropped_items.csv")
    assert sorted(dropped["item_id"]) == sorted(ITEMS[8:])
    assert set(dropped["run"]) == {"A"} and set(dropped["reason"]) == {"not in run(s): Bsub"}
    assert pd.read_csv(tmp_path / "out" / "models.csv")["n_items"].tolist() == [8, 8]
    assert "4 dilemmas were dropped" in (tmp_path / "out" / "summary.md").read_text()


# --------------------------------------------------------------- human anchors
def _humans_csv(path: Path, rows: list[dict]) -> Path:
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_human_anchors_recover_the_planted_agreement(runs: Path, tmp_path: Path):
    rng = np.random.default_rng(5)
    planted = {i: SimParams(**A).item_theta(i) for i in ITEMS}
    stance = {i: float(np.clip(t + rng.normal(0, 0.2), -1, 1)) for i, t in planted.items()}
    rows = [{"item_id": i, "rating": 1 + 6 * (x + 1) / 2, "rating_lo": 1, "rating_hi": 7} for i, x in stance.items()]
    rows.append({"item_id": "not_a_dilemma", "rating": 4, "rating_lo": 1, "rating_hi": 7})
    humans = _humans_csv(tmp_path / "humans.csv", rows)
    panel = write_panel(
        tmp_path / "p.yaml", [(str(runs / "A"), "A", "A", False), (str(runs / "B"), "B", "B", False)], humans
    )
    out = tmp_path / "out"
    write_report_files(out, *compare_battery(load_panel(panel), n_boot=500))
    agree = pd.read_csv(out / "humans_agreement.csv").set_index("run")
    h, p = np.array([stance[i] for i in ITEMS]), np.array([planted[i] for i in ITEMS])
    assert agree.loc["A", "r"] == pytest.approx(stats.pearsonr(h, p).statistic, abs=0.03)
    assert agree.loc["A", "mean_abs_diff"] == pytest.approx(np.abs(h - p).mean(), abs=0.03)
    assert agree.loc["A", "r_lo"] <= agree.loc["A", "r"] <= agree.loc["A", "r_hi"]
    assert agree.loc["B", "r"] < agree.loc["A", "r"]
    assert agree.loc["A", "model"] == "theta" and agree.loc["A", "n_items"] == len(ITEMS)
    by_item = pd.read_csv(out / "theta_by_model.csv", index_col=0)
    assert by_item.loc[ITEMS[0], "humans (rating)"] == pytest.approx(stance[ITEMS[0]], abs=1e-5)
    dropped = pd.read_csv(out / "dropped_items.csv")
    assert dropped[dropped["run"] == "humans"]["item_id"].tolist() == ["not_a_dilemma"]
    assert (out / "fig_humans.png").stat().st_size > 1000


def test_human_choice_rates_with_frames(runs: Path, tmp_path: Path):
    s = A["s"]
    rows = []
    for i in ITEMS:
        p = float(1 / (1 + math.exp(-SimParams(**A).item_theta(i) / s)))
        rows.append({"item_id": i, "frame": "yes_first", "p_cbr": p, "n": 200})
        rows.append({"item_id": i, "frame": "no_first", "p_cbr": min(max(p - 0.1, 0.0), 1.0), "n": 200})
    humans = _humans_csv(tmp_path / "humans.csv", rows)
    h = load_humans(humans)
    shift = framing_shift(h, n_boot=300)
    v = h.pivot(index="item_id", columns="frame", values="value")
    assert shift.loc[0, "frame"] == "no_first" and shift.loc[0, "reference"] == "yes_first"
    assert shift.loc[0, "shift"] == pytest.approx((v["no_first"] - v["yes_first"]).mean())
    assert shift.loc[0, "lo"] <= shift.loc[0, "shift"] <= shift.loc[0, "hi"]
    panel = write_panel(
        tmp_path / "p.yaml", [(str(runs / "A"), "A", "A", False), (str(runs / "C"), "C", "C", False)], humans
    )
    out = tmp_path / "out"
    write_report_files(out, *compare_battery(load_panel(panel), n_boot=300))
    agree = pd.read_csv(out / "humans_agreement.csv").set_index(["run", "model"])
    # the paper's anchor: human 2 P - 1 against the graded theta (issue 18), and z beside it
    theta_a = np.array([SimParams(**A).item_theta(i) for i in ITEMS])
    human = np.array(
        [(2 * r["p_cbr"] - 1 + 2 * rr["p_cbr"] - 1) / 2 for r, rr in zip(rows[::2], rows[1::2], strict=True)]
    )
    assert agree.loc[("A", "theta"), "human"] == "p_cbr"
    assert agree.loc[("A", "theta"), "r"] == pytest.approx(stats.pearsonr(theta_a, human).statistic, abs=0.01)
    assert agree.loc[("A", "theta"), "r2"] == pytest.approx(agree.loc[("A", "theta"), "r"] ** 2)
    assert agree.loc[("A", "z"), "r"] > 0.95
    assert (out / "humans_framing.csv").exists()
    assert "Framing shift of the human sample" in (out / "summary.md").read_text()


@pytest.mark.parametrize(
    "text,match",
    [
        ("item_id,p_cbr\na,0.5\nb,1.5\n", r"row 2 \(line 3\), column p_cbr: a choice rate must lie in \[0, 1\]"),
        ("item_id,p_cbr\na,half\n", r"row 1 \(line 2\), column p_cbr: not a number"),
        ("item_id,rating\na,3\n", "needs `rating_lo` and `rating_hi`"),
        ("item_id,rating,rating_lo,rating_hi\na,9,1,7\n", r"column rating: 9 lies outside its scale \[1, 7\]"),
        ("item_id,p_cbr,n\na,0.5,0\n", "column n: must be a whole number >= 1"),
        ("item_id,p_cbr\na,0.5\na,0.6\n", "item 'a' repeats row 1"),
        ("item,p_cbr\na,0.5\n", r"unknown column\(s\) \['item'\]"),
        ("item_id,frame\na,x\n", "needs a `p_cbr` column"),
        ("item_id,p_cbr,frame\na,0.5,\n", "column frame: empty"),
    ],
)
def test_bad_human_tables_name_file_row_and_column(tmp_path: Path, text: str, match: str):
    f = tmp_path / "h.csv"
    f.write_text(text)
    with pytest.raises(HumanTableError, match=match) as e:
        load_humans(f)
    assert str(f) in str(e.value)


# --------------------------------------------------------------- logit vs sampled
def test_logit_vs_sampled_recovers_the_planted_temperature(tmp_path: Path):
    params = {**A, "T": 1.5}
    items = ITEMS[:6]
    sim_run(tmp_path / "r", params, items=items)
    sim_run(tmp_path / "s", params, items=items, readout=False, samples=20, temperature=1.0)
    panel = write_panel(tmp_path / "p.yaml", [("r", "AT", "AT", False), ("s", "AT sampled", "AT", False)])
    out = tmp_path / "out"
    write_report_files(out, *compare_battery(load_panel(panel), n_boot=200))
    t = pd.read_csv(out / "logit_vs_sampled.csv").iloc[0]
    assert t["T_lo"] <= 1.5 <= t["T_hi"] and t["T"] == pytest.approx(1.5, abs=0.1)
    assert t["readout_run"] == "AT" and t["sampled_run"] == "AT sampled"
    cells = pd.read_csv(out / "logit_vs_sampled_cells.csv").set_index("quantity")
    assert set(cells.index) >= {"z", "lexical", "order", "theta"}
    assert cells.loc["theta", "r"] > 0.99 and cells.loc["z", "r"] > 0.9


def test_yesno_panel_side_by_side_and_logit_vs_sampled(tmp_path: Path):
    from experiments.yesno import YesNoSpec
    from probe.panel import panel_from_runs

    spec = YesNoSpec(items=ITEMS[:6])
    eng = SimEngine(SimParams(seed=4, s=0.3, m_order=0.1, T=0.7))
    run("yesno", spec, eng, tmp_path / "r", progress=False, log=lambda s: None)
    plan = Plan(readout=False, samples=30, temperature=1.0)
    run("yesno", spec, eng, tmp_path / "s", plan=plan, progress=False, log=lambda s: None)
    from analysis.compare import write_comparison

    files = write_comparison(panel_from_runs([tmp_path / "r", tmp_path / "s"]), tmp_path / "out")
    assert_wrote(files, {"yesno_cells.csv", "models.csv", "logit_vs_sampled.csv", "fig_decomposition_models.png"})
    cells = pd.read_csv(tmp_path / "out" / "yesno_cells.csv")
    assert len(cells) == 2 * 6
    models = pd.read_csv(tmp_path / "out" / "models.csv", index_col=0)
    assert models["order"].iloc[0] > 0.1  # planted pull toward the first-printed option
    t = pd.read_csv(tmp_path / "out" / "logit_vs_sampled.csv").iloc[0]
    assert t["T_lo"] <= 0.7 <= t["T_hi"]


# --------------------------------------------------------------- CLI
def test_cli_errors(runs: Path, tmp_path: Path, capsys):
    from experiments.yesno import YesNoSpec
    from probe.app.cli import main

    run("yesno", YesNoSpec(items=ITEMS[:3]), SimEngine(), tmp_path / "y", progress=False, log=lambda s: None)
    assert main(["compare", str(runs / "A"), str(tmp_path / "y"), "--out", str(tmp_path / "o")]) == 2
    assert "mixes experiments" in capsys.readouterr().err
    assert main(["compare", str(runs / "A"), str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "is not a run folder" in capsys.readouterr().err
    bad = tmp_path / "h.csv"
    bad.write_text("item_id,p_cbr\nx,2\n")
    argv = ["compare", str(runs / "A"), str(runs / "B"), "--humans", str(bad), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    assert "row 1 (line 2), column p_cbr" in capsys.readouterr().err


def test_tiny_panel_through_probe_compare(tiny_engine, tmp_path: Path, capsys):
    """Two small runs of the tiny model (a few items, one more in the second) via `probe compare`.

    The reduced preset cut to one scale, wording and form and one arbitrary pair keeps every crossing the
    comparison reads (anchor x pole, verb x order, the counterbalanced mapping) in a few seconds on a CPU.
    """
    from probe.app.cli import main

    for name, items in (("t1", ITEMS[:3]), ("t2", ITEMS[:4])):
        small = {"scales": ("0-10",), "wordings": ("acceptable",), "forms": ("acceptable",), "label_pairs": ("A/B",)}
        spec = BatterySpec(items=items, instruments=("graded", "binary"), **{**REDUCED, **small})
        run("battery", spec, tiny_engine, tmp_path / name, progress=False, log=lambda s: None)
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "t1"), str(tmp_path / "t2"), "--out", str(out), "--quiet"]) == 0
    assert "comparison of 2 runs" in capsys.readouterr().out
    dropped = pd.read_csv(out / "dropped_items.csv")
    assert dropped["item_id"].tolist() == [ITEMS[3]]
    for f in ("summary.md", "models.csv", "agreement_r2.csv", "fit_sm.csv", "fig_stance_models.png", "panel.csv"):
        assert (out / f).stat().st_size > 50, f
    assert pd.read_csv(out / "panel.csv")["name"].tolist() == ["tiny [t1]", "tiny [t2]"]
    assert pd.read_csv(out / "models.csv")["n_items"].tolist() == [3, 3]


def test_joint_fit_shows_no_change_of_s_where_only_m_order_changed(report: Path):
    """A and A think share s = 0.3; only m_order moves (0.15 -> 0.05). Per channel, the lexical s still 'changes'
    (its sides average over the order offset); the joint fit shows no change of s and recovers the |m_order| drop."""
    d = pd.read_csv(report / "deliberation.csv").fillna({"channel": ""}).set_index(["quantity", "channel"])
    joint_s = d.loc[("s", "joint:yesno")]
    assert joint_s["lo"] <= 0 <= joint_s["hi"] and not joint_s["excludes_0"]
    assert joint_s["off"] == pytest.approx(0.3, rel=0.03) and joint_s["on"] == pytest.approx(0.3, rel=0.03)
    m_order = d.loc[("abs_m", "joint:yesno:order")]
    assert m_order["lo"] <= 0.10 <= m_order["hi"] and m_order["lo"] > 0  # off - on
    lexical = d.loc[("abs_m", "joint:yesno:lexical")]
    assert lexical["lo"] <= 0 <= lexical["hi"]  # unchanged m_word
    assert d.loc[("s", "lexical"), "excludes_0"]  # the per-channel artefact the joint fit removes
    arb = d.loc[("s", "joint:arbitrary")]  # A/B: order, logic and label fitted together
    assert arb["lo"] <= 0 <= arb["hi"] and d.loc[("abs_m", "joint:arbitrary:order"), "lo"] > 0
    joint = pd.read_csv(report / "fit_joint.csv").set_index(["run", "family", "channel"])
    assert joint.loc[("A", "yesno", "order"), "m"] == pytest.approx(0.15, abs=0.01)
    assert joint.loc[("A", "arbitrary", "label"), "m"] == pytest.approx(0.05, abs=0.01)
    assert joint.loc[("B", "yesno", "lexical"), "m"] == pytest.approx(0.1, abs=0.01)
    summary = (report / "summary.md").read_text()
    assert "Joint fit per run and label family" in summary and "joint:yesno:order" in summary


def test_consensus_reference_set_from_the_panel_file_or_the_papers_default(runs: Path, tmp_path: Path):
    """Issue 18, point 5: the panel file marks the reference runs; by default the sampled (frontier) runs."""
    from analysis.battery.compare_agreement import consensus_reference

    lines = [
        "runs:",
        f"  - {{run: {runs / 'A'}, name: A, consensus: true}}",
        f"  - {{run: {runs / 'B'}, name: B, consensus: true}}",
        f"  - {{run: {runs / 'C'}, name: C, consensus: false}}",
    ]
    (tmp_path / "p.yaml").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    write_report_files(out, *compare_battery(load_panel(tmp_path / "p.yaml"), n_boot=100))
    cons = pd.read_csv(out / "consensus.csv", index_col=0)
    assert np.allclose(cons["consensus"], (cons["A"] + cons["B"]) / 2, atol=1e-6)
    models = pd.read_csv(out / "agreement_models.csv", index_col=0)
    r2_c = stats.pearsonr(cons["C"], (cons["A"] + cons["B"]) / 2).statistic ** 2
    assert models.loc["C", "consensus_r2"] == pytest.approx(r2_c, abs=1e-5)
    assert "marked `consensus: true`" in (out / "summary.md").read_text()
    # no marks: the paper's frontier set is the sampled runs; these are all logit readouts, so every run
    panel = load_panel(write_panel(tmp_path / "q.yaml", [(str(runs / n), n, n, False) for n in ("A", "B")]))
    fake = {n: type("R", (), {"source": src})() for n, src in (("A", "readout"), ("B", "samples"))}
    assert consensus_reference(panel, fake, ["A", "B"])[0] == ["B"]  # type: ignore[arg-type]
    fake["B"].source = "readout"
    assert consensus_reference(panel, fake, ["A", "B"])[0] == ["A", "B"]  # type: ignore[arg-type]


def test_mean_r2_summaries_by_hand():
    """Table S2 (issue 18): mean pairwise r^2 within the reference set, with the humans, and for the other runs."""
    from analysis.battery.compare_agreement import mean_r2_summary

    t = pd.DataFrame(
        {"a": [0.5, -0.2, 0.1, 0.7], "b": [0.4, 0.0, 0.2, 0.5], "c": [0.1, 0.3, -0.5, 0.0], "d": [0, 1, 0, 1.0]},
        index=list("wxyz"),
    )
    human = pd.Series([0.6, -0.1, 0.0, 0.9], index=list("wxyz"))
    r2 = t.corr() ** 2
    hr = {c: stats.pearsonr(t[c], human).statistic ** 2 for c in t.columns}
    per_run, groups = mean_r2_summary(t, ["a", "b", "c"], human)
    assert per_run.loc["a", "mean_r2_reference"] == pytest.approx((r2.loc["a", "b"] + r2.loc["a", "c"]) / 2)
    assert per_run.loc["d", "mean_r2_reference"] == pytest.approx(r2.loc["d", ["a", "b", "c"]].mean())
    assert per_run.loc["c", "r2_human"] == pytest.approx(hr["c"])
    pairs = [r2.loc["a", "b"], r2.loc["a", "c"], r2.loc["b", "c"]]
    assert groups.loc["reference-reference", "mean_r2"] == pytest.approx(np.mean(pairs))
    assert groups.loc["reference-human", "mean_r2"] == pytest.approx(np.mean([hr["a"], hr["b"], hr["c"]]))
    assert groups.loc["other-reference", "mean_r2"] == pytest.approx(per_run.loc["d", "mean_r2_reference"])
    assert groups.loc["other-human", "mean_r2"] == pytest.approx(hr["d"])
    assert groups["n"].tolist() == [3, 3, 1, 1]
    _, no_humans = mean_r2_summary(t, ["a", "b"])
    assert np.isnan(no_humans.loc["reference-human", "mean_r2"])


def test_assert_wrote_names_only_the_missing_files(tmp_path: Path) -> None:
    (tmp_path / "summary.md").write_text("x")
    assert assert_wrote(tmp_path, {"summary.md"}) == {"summary.md"}
    with pytest.raises(AssertionError, match=r"missing from the report: a\.csv, b\.png \(written: summary\.md\)"):
        assert_wrote(tmp_path, {"summary.md", "b.png", "a.csv"})
