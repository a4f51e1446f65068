"""Where the readout forms: the layer profile of the battery and yes/no reports recovers the synthetic subject's
planted layer profile (a stance that forms at one depth, an order pull and a lexical pull at later depths).

Tolerances: each formation layer within 1 layer of the planted one, read at every layer (the planted terms ramp
up linearly over ``ramp`` layers, so a quantity is within 10% of its final value only from its planted layer on,
unless the pulls that arrive later move it by more than 10%: the pulls here are small beside s); a quantity with
no planted term has no formation layer; before a term's ramp begins it is 0 within 1e-12; the last layer's row
is the final report's figure exactly.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from analysis.battery.layers import FLOOR, formed_from, layer_options

PLANT = {"n_blocks": 24, "stance": 8, "order": 16, "lexical": 22, "ramp": 4}
ITEMS = "pond_child,dam_spillway,mine_cart_bridge"
PARAMS = f"""theta: {{pond_child: 0.5, dam_spillway: 0.6, mine_cart_bridge: 0.4}}
s: 0.5
m_order: 0.15
m_word: -0.12
layers: {PLANT}
""".replace("'", "")


def test_formed_from_is_the_first_layer_that_stays_within_ten_percent():
    v = pd.Series([0.0, 0.5, 0.95, 1.2, 0.98, 1.0], index=[0, 4, 8, 12, 16, 20])
    assert formed_from(v) == 16  # 12 is 20% off, 8 is within 10% but 12 after it is not
    assert formed_from(pd.Series([0.0, -0.3, -0.5], index=[0, 1, 2])) == 2
    assert formed_from(pd.Series([0.3, 0.01], index=[0, 1])) is None  # final within FLOOR of 0
    assert formed_from(pd.Series([0.0, FLOOR * 2], index=[0, 1])) == 1


def test_layer_options_replaces_the_probabilities_by_the_layers():
    opts = pd.DataFrame(
        {"trial_id": ["a", "a"], "option": ["Yes", "No"], "meaning": ["cbr", "anti"], "prob": [0.9, 0.1]}
    )
    layers = pd.DataFrame(
        {"trial_id": ["a"] * 4, "layer": [0, 0, 1, 1], "option": ["Yes", "No"] * 2, "prob": [0.5, 0.5, 0.9, 0.1]}
    ).assign(logprob=lambda d: d["prob"].map(math.log))
    at0 = layer_options(opts, layers, 0)
    assert at0["prob"].tolist() == [0.5, 0.5] and list(at0.columns[:4]) == list(opts.columns)


@pytest.fixture(scope="module")
def params(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "layers.yaml"
    path.write_text(PARAMS)
    return path


def _report(tmp: Path, experiment: str, params: Path) -> tuple[str, pd.DataFrame]:
    from probe.app.cli import main

    out = tmp / experiment
    args = ["run", experiment, "--model", f"sim:{params}", "--items", ITEMS, "--layers", "all", "--out", str(out)]
    assert main([*args, "--quiet"]) == 0
    assert (out / "report" / "layer_profile.png").stat().st_size > 5_000
    return (out / "report" / "summary.md").read_text(), pd.read_csv(out / "report" / "layer_profile.csv")


def _wide(table: pd.DataFrame) -> pd.DataFrame:
    return table.pivot(index="layer", columns="quantity", values="mean")


@pytest.mark.draws  # the sim's planted parameters, deterministic from its seed; the bootstrap's seed is fixed
def test_the_battery_report_recovers_the_planted_layer_profile(tmp_path: Path, params: Path):
    summary, table = _report(tmp_path, "battery", params)
    assert "## Where the readout forms" in summary
    wide = _wide(table)
    assert list(wide.index) == list(range(25))
    from analysis.battery.layers import formed_from as formed

    planted = {"z": 8, "theta": 8, "order": 16, "lexical": 22, "label": 22}
    for q, layer in planted.items():
        assert abs(formed(wide[q]) - layer) <= 1, (q, formed(wide[q]))
        start = PLANT[{"z": "stance", "theta": "stance", "order": "order"}.get(q, "lexical")] - PLANT["ramp"]
        assert wide[q].loc[:start].abs().max() <= 1e-12  # absent before its ramp begins
    assert formed(wide["logic"]) is None  # m_logic = 0: nothing planted, nothing formed
    assert f"- I-1 stance theta (graded): layer {formed(wide['theta'])} of 24" in summary
    final = pd.read_csv(tmp_path / "battery" / "report" / "binary_verbflip.csv", index_col=0)
    assert wide.loc[24, "order"] == pytest.approx(final.loc["mean", "order"], abs=1e-12)


@pytest.mark.draws
def test_the_yesno_report_recovers_the_planted_layer_profile(tmp_path: Path, params: Path):
    summary, table = _report(tmp_path, "yesno", params)
    wide = _wide(table)
    assert {q: formed_from(wide[q]) for q in ("z", "order", "lexical")} == {"z": 8, "order": 16, "lexical": 22}
    final = pd.read_csv(tmp_path / "yesno" / "report" / "yesno_by_item.csv", index_col=0)
    for q in ("z", "order", "lexical"):
        assert wide.loc[24, q] == pytest.approx(final.loc["mean", q], abs=1e-12)
    assert "layer 22 of 24" in summary


@pytest.mark.parametrize("experiment", ["yesno", "battery"])
def test_a_report_without_layers_has_no_layer_section(tmp_path: Path, experiment: str):
    """No section, not even a "not computed" line: the report is the one made before layers existed."""
    from probe.app.cli import main

    out = tmp_path / "plain"
    assert main(["run", experiment, "--model", "sim", "--items", "pond_child", "--out", str(out), "--quiet"]) == 0
    summary = (out / "report" / "summary.md").read_text()
    assert "Where the readout forms" not in summary and "## Layers" not in summary and "--layers" not in summary
    assert not (out / "report" / "layer_profile.csv").exists()


def test_sim_layer_profile_is_validated_and_recorded_only_when_planted():
    from engines.sim.params import LayerPlant, SimParams, SimParamsError

    assert "layers" not in SimParams().to_dict()  # the default profile keeps today's run key
    assert (
        SimParams(layers={"n_blocks": 12, "stance": 4, "order": 8, "lexical": 12}).to_dict()["layers"]["n_blocks"] == 12
    )
    with pytest.raises(SimParamsError, match=r"layers\.order = 30 is past layers\.n_blocks = 24"):
        LayerPlant(order=30)


@pytest.mark.draws
def test_compare_shows_the_layer_profiles_side_by_side(tmp_path: Path, params: Path):
    from probe.app.cli import main

    other = tmp_path / "other.yaml"
    other.write_text(PARAMS.replace("stance: 8", "stance: 12"))
    runs = []
    for name, p in (("a", params), ("b", other)):
        out = tmp_path / name
        args = ["run", "yesno", "--model", f"sim:{p}", "--items", ITEMS, "--layers", "every:4", "--out", str(out)]
        assert main([*args, "--quiet", "--no-report"]) == 0
        runs.append(str(out))
    plain = tmp_path / "plain"  # a run without layers stays out of the section
    assert (
        main(["run", "yesno", "--model", "sim", "--items", ITEMS, "--out", str(plain), "--quiet", "--no-report"]) == 0
    )
    cmp = tmp_path / "cmp"
    assert main(["compare", *runs, str(plain), "--names", "a,b,plain", "--out", str(cmp), "--quiet"]) == 0
    assert "## Where the readout forms, side by side" in (cmp / "summary.md").read_text()
    wide = pd.read_csv(cmp / "layer_profiles.csv", index_col=0)
    assert list(wide.index) == [0, 4, 8, 12, 16, 20, 24]
    assert {"a: z", "b: z", "a: order", "b: lexical"} <= set(wide.columns)
    assert not any(c.startswith("plain") for c in wide.columns)
    formed = pd.read_csv(cmp / "layer_formed.csv", index_col=0)
    assert formed.loc["a", "z"] == 8 and formed.loc["b", "z"] == 12  # the planted stance depths
