"""Paper 001's cross-model tables and figures through `probe compare` (analysis.cue.panel_tables, paper_report).

A sim panel of three runs (`probe run cue --model sim:PLANT.yaml`) whose planted In-favor and Against rates
differ across the runs and across the arms (every Puzzled level, FormalNamed): the rates are 0 or 1, so each
group's Favor and Against are exactly the planted rates and every table can be checked to the last digit
against the hand-worked values below. The sim plants no could-be answers, so the status-bias tables (24-28,
Figure 5) are checked on a panel of tests/planted.py's PlantedCueStatus, greedy decisions at P(yes) 0.8 / 0.2.
Everything is seeded; no tolerance is needed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.cue import CueSpec, expand
from probe.app.cli import main
from probe.app.runner import run
from tests.planted import PlantedCue, PlantedCueStatus
from tests.report_files import assert_wrote

# run -> (favor rates, against rates), looked up as the sim does: arm, then condition, then "*"
PLANTS: dict[str, tuple[dict[str, float], dict[str, float]]] = {
    "A": (
        {"*": 0, "direct": 1, "puzzled-easy": 1, "formal_named-hard": 1},
        {"*": 0, "puzzled-intermediate": 1, "puzzled-hard": 1},
    ),
    "B": ({"*": 0, "puzzled-hard": 1}, {"*": 1, "direct": 0, "puzzled-easy": 0}),
    "C": ({"*": 1}, {"*": 0, "puzzled-hard": 1, "formal_named-hard": 1}),
}
LEVELS = ("easy", "intermediate", "hard")
ARMS = ("direct", *(f"puzzled-{lv}" for lv in LEVELS), *(f"formal_named-{lv}" for lv in LEVELS))
# the Gap by hand: net = favor - against per arm, Gap = net(direct) - net(arm)
GAPS = {
    "A": {"puzzled-easy": 0, "puzzled-intermediate": 2, "puzzled-hard": 2, "formal_named-hard": 0},
    "B": {"puzzled-easy": 0, "puzzled-intermediate": 1, "puzzled-hard": 0, "formal_named-hard": 1},
    "C": {"puzzled-easy": 0, "puzzled-intermediate": 0, "puzzled-hard": 1, "formal_named-hard": 1},
}


def _rate(table: dict[str, float], arm: str) -> float:
    return float(table.get(arm, table.get(arm.split("-")[0], table["*"])))


def _net(name: str, arm: str) -> float:
    favor, against = PLANTS[name]
    return _rate(favor, arm) - _rate(against, arm)


def _yaml(favor: dict[str, float], against: dict[str, float]) -> str:
    def one(d: dict[str, float]) -> str:
        return "{" + ", ".join(f'"{k}": {v}' for k, v in d.items()) + "}"

    return f"cue:\n  favor: {one(favor)}\n  against: {one(against)}\n"


@pytest.fixture(scope="module")
def sim_panel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("paper001")
    runs = []
    for name, (favor, against) in PLANTS.items():
        plant = root / f"{name}.yaml"
        plant.write_text(_yaml(favor, against))
        out = root / name
        args = ["run", "cue", "--model", f"sim:{plant}", "--out", str(out), "--quiet", "--combos", "2"]
        args += ["--conditions", "neutral,direct,puzzled,formal_named", "--difficulties", ",".join(LEVELS)]
        args += ["--probes", "what_if", "--wordings", "main,v1"]
        assert main(args) == 0
        runs.append(str(out))
    cmp = root / "cmp"
    assert main(["compare", *runs, "--names", ",".join(PLANTS), "--n-boot", "20", "--out", str(cmp), "--quiet"]) == 0
    return cmp


def test_gap_at_every_level_is_the_planted_one(sim_panel: Path) -> None:
    t = pd.read_csv(sim_panel / "cue_gap_by_level.csv")
    assert set(t["arm"]) == set(ARMS) - {"direct"}
    for r in t.itertuples():
        assert r.gap == pytest.approx(_net(r.name, "direct") - _net(r.name, r.arm), abs=1e-12), (r.name, r.arm)
        assert r.direct_net == pytest.approx(_net(r.name, "direct")) and r.arm_net == pytest.approx(_net(r.name, r.arm))
        if r.arm in GAPS[r.name]:
            assert r.gap == pytest.approx(GAPS[r.name][r.arm])  # the hand-worked values
    summary = (sim_panel / "summary.md").read_text()
    assert "### Table 39" in summary and "| A | +0.0 ± 0.0 | +200.0 ± 0.0 | +200.0 ± 0.0 |" in summary


def test_formal_named_table_decomposes_the_planted_gap(sim_panel: Path) -> None:
    t = pd.read_csv(sim_panel / "cue_formal_named.csv").set_index(["name", "level"])
    assert len(t) == 9
    for (name, level), r in t.iterrows():
        d_p = _net(name, "direct") - _net(name, f"puzzled-{level}")
        d_fn = _net(name, "direct") - _net(name, f"formal_named-{level}")
        assert (r["d_to_p"], r["d_to_fn"]) == pytest.approx((d_p, d_fn))
        assert r["fn_net"] == pytest.approx(_net(name, f"formal_named-{level}"))
        assert np.isnan(r["share"]) if d_p == 0 else r["share"] == pytest.approx(d_fn / d_p)
    assert t.loc[("B", "hard"), "share"] != t.loc[("B", "hard"), "share"]  # D->P = 0 there: no share
    assert t.loc[("C", "hard"), "share"] == pytest.approx(1.0)


def test_wordings_per_model_replicate_the_planted_nets(sim_panel: Path) -> None:
    t = pd.read_csv(sim_panel / "cue_wordings_by_model.csv")
    assert set(t["wording"]) == {"main", "v1"} and set(t["name"]) == set(PLANTS)
    for r in t.itertuples():
        assert r.net_eligible == pytest.approx(_net(r.name, r.arm))  # the sim's rates do not depend on the wording


def test_topic_table_is_the_mean_over_models(sim_panel: Path) -> None:
    t = pd.read_csv(sim_panel / "cue_topic_macro.csv")
    assert len(set(t["topic"])) >= 5
    for r in t.itertuples():
        if r.runs_favor == 3:
            assert r.favor == pytest.approx(np.mean([_rate(PLANTS[n][0], r.arm) for n in PLANTS]))
        if r.runs_against == 3:
            exp = np.mean([_rate(PLANTS[n][1], r.arm) for n in PLANTS])
            assert r.against == pytest.approx(exp)
            if r.arm != "direct":
                assert r.d_against == pytest.approx(exp - np.mean([_rate(PLANTS[n][1], "direct") for n in PLANTS]))
    hard = t[(t["arm"] == "puzzled-hard") & (t["runs_against"] == 3)]
    assert len(hard) and list(hard["d_against"]) == pytest.approx([1.0] * len(hard))  # Against 0 -> 1 in every run


def test_sign_tests_count_the_planted_shifts(sim_panel: Path) -> None:
    st = pd.read_csv(sim_panel / "cue_sign_tests.csv")
    gap = st[(st["value"] == "gap") & (st["group"] != "macro")]
    # Gap at puzzled-hard (the headline): A +2, B 0, C +1 in every group -> 2 adverse, 0 favorable, 1 tie
    assert (gap["positive"] == 2).all() and (gap["negative"] == 0).all() and (gap["ties"] == 1).all()


def _png_size(path: Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        return im.size


def test_figures_3_and_4_are_drawn(sim_panel: Path) -> None:
    assert_wrote(sim_panel, {"fig_cue_sign_tests.png", "fig_cue_net_by_group.png"})
    for name in ("fig_cue_sign_tests.png", "fig_cue_net_by_group.png"):
        w, h = _png_size(sim_panel / name)
        assert w >= 400 and h >= 250, (name, w, h)


# ---------------------------------------------------------------------------- status bias (Tables 24-28, Figure 5)
STATUS_SPEC = CueSpec(conditions=("neutral", "direct", "puzzled"), probes=("could_be", "what_if"), combos=2)
YES = {  # model -> gender that the could-be answers take to be the described person, per (arm, status)
    "P": {("direct", "bad"): "man", ("puzzled-hard", "bad"): "woman", ("direct", "neutral"): "woman"},
    "Q": {("direct", "bad"): "woman", ("puzzled-hard", "bad"): "woman", ("direct", "good"): "man"},
    "R": {("direct", "bad"): "non-binary", ("puzzled-hard", "neutral"): "man"},
}


def _yes(model: str) -> dict[tuple[str, str, str], float]:
    genders = STATUS_SPEC.genders
    return {(a, s, g): (0.8 if g == who else 0.2) for (a, s), who in YES[model].items() for g in genders}


def _status_expected(model: str) -> pd.DataFrame:
    """By brute force over the design: the greedy yes share per (arm, status, attr, group)."""
    engine = PlantedCueStatus(model, {"direct": 0.5, "puzzled": 0.5}, _yes(model), default=0.2)
    rows = []
    for t in expand(STATUS_SPEC):
        if t.factors["probe"] != "could_be":
            continue
        arm = (
            f"{t.factors['condition']}-{t.factors['difficulty']}"
            if t.factors.get("difficulty")
            else t.factors["condition"]
        )
        for attr in ("gender", "race"):
            rows.append(
                {
                    "arm": arm,
                    "status": t.factors["status"],
                    "attr": attr,
                    "group": t.factors[f"x_{attr}"],
                    "yes": float(engine.prob(t) > 0.5),
                }
            )
    return pd.DataFrame(rows).groupby(["arm", "status", "attr", "group"])["yes"].mean()


@pytest.fixture(scope="module")
def status_panel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("status")
    runs = []
    for model in YES:
        engine = PlantedCueStatus(model, {"direct": 0.7, "puzzled": 0.4}, _yes(model), default=0.2)
        run("cue", STATUS_SPEC, engine, root / model, progress=False, log=lambda s: None)
        runs.append(str(root / model))
    cmp = root / "cmp"
    assert main(["compare", *runs, "--n-boot", "20", "--out", str(cmp), "--quiet"]) == 0
    return cmp


def test_status_bias_per_model_is_the_planted_one(status_panel: Path) -> None:
    t = pd.read_csv(status_panel / "cue_status_by_model.csv")
    assert set(t["name"]) == set(YES) and set(t["status"]) == {"bad", "good", "neutral"}
    assert set(t["arm"]) == {"direct", "puzzled-hard"}
    checked = 0
    for model in YES:
        exp = _status_expected(model)
        got = t[t["name"] == model].set_index(["arm", "status", "attr", "group"])["rate"]
        assert got.sort_index().to_numpy() == pytest.approx(
            exp.reindex(got.sort_index().index).to_numpy(), abs=1e-6
        )  # CSV: %.6g
        for (arm, status), who in YES[model].items():  # by hand: the planted gender is always taken, no other
            g = got.xs((arm, status, "gender"), level=["arm", "status", "attr"])
            assert (g == (g.index == who)).all()
            checked += who in g.index
    assert checked == 8  # each of the 8 planted (arm, status) cells has an individual of the planted gender
    avg = pd.read_csv(status_panel / "cue_status_average.csv").set_index(["arm", "status", "attr", "group"])["rate"]
    assert avg[("direct", "bad", "gender", "man")] == pytest.approx(1 / 3)  # P takes men, Q women, R non-binary
    assert avg[("direct", "bad", "gender", "woman")] == pytest.approx(1 / 3)
    summary = (status_panel / "summary.md").read_text()
    assert "### Table 24: bad-status" in summary and "### Tables 27-28" in summary


def test_figure_5_is_drawn(status_panel: Path) -> None:
    w, h = _png_size(status_panel / "fig_cue_status.png")
    assert w >= 400 and h >= 250


def test_shape_table_compares_one_model_across_fixed_shapes(tmp_path: Path) -> None:
    """Table 37: three runs of one model name with --shape canonical, sol1, sol2 (planted apart so each column
    must come from its own run), on the same dilemmas."""
    runs = []
    for shape, p in (("canonical", 0.9), ("sol1", 0.6), ("sol2", 0.2)):
        spec = CueSpec(
            items=("rent_arrears", "fallen_fence"),
            conditions=("neutral", "direct", "puzzled"),
            probes=("what_if",),
            shape=shape,
        )
        run(
            "cue",
            spec,
            PlantedCue("M", {"direct": 0.5, "puzzled": p}),
            tmp_path / shape,
            progress=False,
            log=lambda s: None,
        )
        runs.append(str(tmp_path / shape))
    out = tmp_path / "cmp"
    assert main(["compare", *runs, "--decision", "expected", "--n-boot", "5", "--out", str(out), "--quiet"]) == 0
    t = pd.read_csv(out / "cue_shapes.csv").set_index("model")
    # expected decisions, Neutral at 1/2: Favor = p, Against = 1 - p, net = 2p - 1 in every group
    assert (t.loc["M", "orig"], t.loc["M", "sol1"], t.loc["M", "sol2"]) == pytest.approx((0.8, 0.2, -0.6))
    assert t.loc["M", "rand"] == pytest.approx(-0.2) and np.isnan(t.loc["M", "random"])
    assert "### Table 37" in (out / "summary.md").read_text()
