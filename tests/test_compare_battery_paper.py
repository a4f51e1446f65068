"""Paper 003's cross-model figures through ``probe compare``: a sim panel of three battery runs whose planted order,
logic and per-pair label pulls differ, on all thirteen label pairs.

Every new table is checked against what was planted (the per-pair joint fit's m in theta units, the signs of the
story-averaged pulls), against the battery report's own label map of the same run (the same dilemmas: the same
numbers), and against a hand computation (Fig. 1b's variance shares, the lexicality contrast); each new PNG is
opened and its size checked.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

PAIRS = ("A/B", "1/2", "$/%", "+/-", "Y/N", "check/cross", "thumbs", "T/F", "Ja/Nein", "Oui/Non", "ZH", "I do/I do not")
ALL_PAIRS = (*PAIRS, "story")
PLANTED = {
    "a": {"seed": 1, "m_order": -0.2, "m_word": -0.1, "m_logic": 0.0, "m_label": {"Ja/Nein": -0.3, "ZH": 0.2}},
    "b": {"seed": 2, "m_order": 0.1, "m_word": -0.1, "m_logic": 0.15, "m_label": {"Ja/Nein": 0.25, "A/B": 0.0}},
    "c": {"seed": 3, "m_order": -0.2, "m_word": 0.2, "m_logic": 0.0, "m_label": {"A/B": -0.15, "ZH": -0.35}},
}
"""Per run: the sim's planted offsets (theta units); a pair without its own m_label pulls with m_word."""
ITEMS = "mine_cart_bridge,freight_yard_switch,overloaded_raft,transplant_traveler,falling_drone,pond_child,kidney_stranger,hospital_budget"
"""Eight dilemmas keep the panel to a few seconds; the sim's readouts carry no sampling noise."""
RUN = {"a": "sim [a]", "b": "sim [b]", "c": "sim [c]"}
TOL = 0.03
"""|fitted m - planted m| (the sim battery report's own tolerance, tests/test_battery.py)."""


def _yaml(p: dict) -> str:
    labels = ", ".join(f'"{k}": {v}' for k, v in p["m_label"].items())
    keys = ("seed", "m_order", "m_word", "m_logic")
    return "s: 0.3\nsigma_form: 0.05\n" + "".join(f"{k}: {p[k]}\n" for k in keys) + f"m_label: {{{labels}}}\n"


@pytest.fixture(scope="module")
def panel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from probe.app.cli import main

    root = tmp_path_factory.mktemp("paper003")
    for name, p in PLANTED.items():
        (root / f"{name}.yaml").write_text(_yaml(p))
        args = [
            "run",
            "battery",
            "--model",
            "sim",
            "--sim-params",
            str(root / f"{name}.yaml"),
            "--out",
            str(root / name),
        ]
        args += [
            "--items",
            ITEMS,
            "--label-pairs",
            ",".join(ALL_PAIRS),
            "--quiet",
            *(["--no-report"] if name != "a" else []),
        ]
        assert main(args) == 0
    out = root / "cmp"
    assert main(["compare", *(str(root / n) for n in PLANTED), "--out", str(out), "--quiet", "--n-boot", "200"]) == 0
    return out


def test_every_label_pair_of_every_run_recovers_its_planted_pulls(panel: Path) -> None:
    long = pd.read_csv(panel / "label_pairs_by_model.csv", keep_default_na=False, na_values=[""])
    assert len(long) == 3 * 13
    for name, p in PLANTED.items():
        t = long[long["run"] == RUN[name]].set_index("label pair")
        assert list(t.index) == list(ALL_PAIRS)  # Fig. 6's order: non-lexical -> marks -> words
        assert (t["clip_limited"] == "no").all()
        assert t["m_order"].to_numpy() == pytest.approx(p["m_order"], abs=TOL)
        assert t.loc[list(PAIRS), "m_logic"].to_numpy() == pytest.approx(p["m_logic"], abs=TOL)
        # story prints the courses themselves, one mapping: the word pull rides on the verdict's label
        assert t.loc["story", "m_logic"] == pytest.approx(p["m_logic"] + p["m_word"], abs=TOL)
        for pair in PAIRS:
            want = p["m_label"].get(pair, p["m_word"])
            assert t.loc[pair, "m_label"] == pytest.approx(want, abs=TOL), (name, pair)
            if abs(want) >= 0.1:  # the story-averaged label pull (Fig. 6's bar) carries the planted sign
                assert np.sign(t.loc[pair, "label_pull"]) == np.sign(want), (name, pair)
                assert t.loc[pair, "label_pull_lo"] <= t.loc[pair, "label_pull"] <= t.loc[pair, "label_pull_hi"]
        # story's mapping is not crossed: no label projection; its pull is the logic projection
        assert np.isnan(t.loc["story", "label"]) and t.loc["story", "pull_from"] != "label"
        assert t.loc["story", "label_pull"] == pytest.approx(t.loc["story", "logic"])
        assert np.sign(t.loc["A/B", "order"]) == np.sign(p["m_order"])


def test_the_cross_model_table_equals_the_runs_own_label_map(panel: Path) -> None:
    """The panel shares every dilemma, so run a's rows are its report's label gradient, to round-off."""
    long = pd.read_csv(panel / "label_pairs_by_model.csv", keep_default_na=False, na_values=[""])
    mine = long[long["run"] == RUN["a"]].set_index("label pair")
    own = pd.read_csv(panel.parent / "a" / "report" / "binary_label_gradient.csv", index_col=0)
    for col in ("order", "logic", "label", "label_pull", "z", "n_items"):  # the CIs: other resample counts
        assert mine[col].to_numpy(float) == pytest.approx(
            own.reindex(mine.index)[col].to_numpy(float), abs=1e-6, nan_ok=True
        ), col
    assert mine["m_label"].to_numpy(float) == pytest.approx(
        own.reindex(mine.index)["m_label"].to_numpy(float), abs=1e-5, nan_ok=True
    )


def test_lexicality_contrast_and_collapse_by_hand(panel: Path) -> None:
    long = pd.read_csv(panel / "label_pairs_by_model.csv", keep_default_na=False, na_values=[""])
    lex = pd.read_csv(panel / "lexicality_by_model.csv", index_col="run")
    for run, t in long.groupby("run"):
        crossed = t[t["pull_from"] == "label"]
        words = crossed[crossed["lexicality"] == 2]["label_pull"].abs().mean()
        nonlex = crossed[crossed["lexicality"] == 0]["label_pull"].abs().mean()
        assert lex.loc[run, "contrast"] == pytest.approx(words - nonlex, abs=1e-6)
        assert lex.loc[run, "abs_pull_mark"] == pytest.approx(
            crossed[crossed["lexicality"] == 1]["label_pull"].abs().mean(), abs=1e-6
        )
    # run a: non-lexical pairs pull with m_word = -0.1 except A/B (also m_word); words add Ja/Nein -0.3, ZH +0.2
    assert lex.loc[RUN["a"], "contrast"] > 0.05
    collapse = pd.read_csv(panel / "fig5b_collapse.csv", index_col="run")
    ab = long[long["label pair"] == "A/B"].set_index("run")
    assert collapse["logic_AB"].to_numpy() == pytest.approx(ab.loc[collapse.index, "logic"].to_numpy(), abs=1e-6)
    assert collapse.loc[RUN["b"], "logic_AB"] > 0.05 and abs(collapse.loc[RUN["a"], "logic_AB"]) < 0.02
    # the verb flip's lexical pull follows m_word + m_logic (Yes/No carries both): a -0.1, c +0.2
    assert collapse.loc[RUN["a"], "lexical"] < 0 < collapse.loc[RUN["c"], "lexical"]


def test_fig2_decomposition_per_model(panel: Path) -> None:
    t = pd.read_csv(panel / "fig2_decomposition.csv", index_col="run")
    items = pd.read_csv(panel / "decomposition_by_item.csv")
    for name, p in PLANTED.items():
        row, per = t.loc[RUN[name]], items[items["run"] == RUN[name]]
        for col in ("apparent", "order", "lexical"):  # the story mean of the per-dilemma table, inside its CI
            assert row[col] == pytest.approx(per[col].mean(), abs=1e-6)
            assert row[f"{col}_lo"] <= row[col] <= row[f"{col}_hi"]
        assert row["apparent"] == pytest.approx(row["order"] + row["lexical"], abs=1e-5)  # the crossing identity
        assert np.sign(row["order"]) == np.sign(p["m_order"])
        assert np.sign(row["lexical"]) == np.sign(p["m_word"] + p["m_logic"])  # Yes/No carries word and verdict


def test_fig1b_shares_by_hand(panel: Path) -> None:
    t = pd.read_csv(panel / "fig1b_incoherence.csv", index_col="run")
    models = pd.read_csv(panel / "models.csv", index_col="run")
    assert list(t.index) == list(RUN.values())
    share = models["sigma_dir"] ** 2 / (models["sigma_dir"] ** 2 + models["sigma_scale"] ** 2)
    assert t["share_dir"].to_numpy() == pytest.approx(share.to_numpy(), rel=1e-3)  # models.csv: 6 decimals
    assert (t["bar_dir"] + t["bar_scale"]).to_numpy() == pytest.approx(models["sigma_repro"].to_numpy(), abs=1e-6)


def test_each_new_figure_is_drawn(panel: Path) -> None:
    from PIL import Image

    for name in (
        "fig1b_incoherence.png",
        "fig5_projections_models.png",
        "fig5b_collapse.png",
        "fig6_lexicality_models.png",
    ):
        with Image.open(panel / name) as im:
            w, h = im.size
        assert w >= 400 and h >= 300, name
        assert (panel / name).stat().st_size > 10_000, name
    summary = (panel / "summary.md").read_text()
    assert "## Components of the cross-form incoherence (Fig. 1b)" in summary
    assert "## The yes/no bias decomposed per model (Fig. 2)" in summary
    assert "## Label pairs across models: projections and the lexicality gradient (Figs. 5-6)" in summary
