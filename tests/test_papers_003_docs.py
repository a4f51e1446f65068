"""docs/papers.md's paper 003 section runs as written: its sim commands, the files its rows name, and its example input files.

Running the whole runnable block takes about 35 s on 2 CPU cores, so those tests are marked slow (`make
test-slow`); the default suite parses every command with the CLI's own parser and reads the example files.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from probe.app.cli import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "papers.md"


def _section() -> str:
    """Paper 003's section of the shared page."""
    text = DOC.read_text()
    start = text.index("## Paper 003")
    return text[start : text.index("## Paper", start + 1)] if "## Paper" in text[start + 1 :] else text[start:]
NEEDS_MORE = {"deliberation.csv", "fig_deliberation.png"}
"""Files the sim block cannot write: a model with reasoning off and on."""


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _section(), flags=re.S)


def _commands(which: str) -> list[list[str]]:
    """The lines of a shell block (``sim``: the runnable one; ``paper``: the paper's design), after `probe`."""
    (block,) = [b for b in _blocks("sh") if ("--model sim" in b) == (which == "sim")]
    out = []
    for line in block.strip().splitlines():
        args = shlex.split(line)
        assert args[0] == "probe", line
        out.append(args[1:])
    return out


def _example(lang: str) -> str:
    (block,) = [re.sub(r"^  ", "", b, flags=re.M) for b in _blocks(lang)]
    return block


def test_every_command_parses_and_the_example_files_are_read(tmp_path: Path) -> None:
    from analysis.battery.compare import load_humans
    from experiments.dilemmas import load_dilemmas
    from probe.app.cli import build_parser

    parser = build_parser()
    assert [c[0] for c in _commands("sim")] == ["run"] * 3 + ["compare"]
    assert [c[0] for c in _commands("paper")] == ["run"] * 2 + ["compare"]
    for args in _commands("sim") + _commands("paper"):
        parser.parse_args(args)  # exits on an unknown flag or value
    dilemmas = tmp_path / "cheung.jsonl"
    dilemmas.write_text(_example("jsonl"))
    assert len(dilemmas.read_text().splitlines()) == 3
    assert [d.id for d in load_dilemmas(dilemmas)] == ["ward_rota", "dam_gate", "exam_leak"]
    humans = tmp_path / "humans.csv"
    humans.write_text(_example("csv"))
    assert len(humans.read_text().splitlines()) == 3
    h = load_humans(humans)
    assert h.set_index("item_id")["value"].to_dict() == pytest.approx(
        {"mine_cart_bridge": -0.38, "freight_yard_switch": 0.56}
    )


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("papers003")
    mp = pytest.MonkeyPatch()
    mp.chdir(root)
    try:
        for args in _commands("sim"):
            assert main(args) == 0, args
    finally:
        mp.undo()
    return root


@pytest.mark.slow
def test_every_file_a_row_names_is_written(ran: Path) -> None:
    text = _section()
    panel = set(re.findall(r"`PANEL/([\w.]+)`", text))
    run = set(re.findall(r"`RUN/report/([\w.]+)`", text))
    assert {"fig1b_incoherence.png", "fig5_projections_models.png", "fig6_lexicality_models.png"} <= panel
    for name in panel - NEEDS_MORE:
        assert (ran / "runs/p003-panel" / name).is_file(), name
    for name in run:
        assert (ran / "runs/p003-a/report" / name).is_file(), name
    pairs = pd.read_csv(ran / "runs/p003-panel/label_pairs_by_model.csv")
    assert pairs.groupby("run")["label pair"].nunique().tolist() == [13, 13, 13]  # every pair, not one


@pytest.mark.slow
def test_the_example_inputs_run(ran: Path, tmp_path: Path) -> None:
    humans = tmp_path / "humans.csv"
    humans.write_text(_example("csv"))
    cmp = tmp_path / "cmp"
    args = ["compare", str(ran / "runs/p003-a"), str(ran / "runs/p003-b"), "--humans", str(humans)]
    assert main([*args, "--n-boot", "20", "--out", str(cmp), "--quiet"]) == 0
    wide = pd.read_csv(cmp / "theta_by_model.csv", index_col="item_id")
    assert wide.loc["mine_cart_bridge", "humans (p_cbr)"] == pytest.approx(-0.38)
    dilemmas = tmp_path / "cheung.jsonl"
    dilemmas.write_text(_example("jsonl"))
    out = tmp_path / "own"
    assert main(["run", "battery", "--model", "sim", "--dilemmas", str(dilemmas), "--out", str(out), "--quiet"]) == 0
    theta = pd.read_csv(out / "report" / "graded_theta.csv", index_col=0)
    assert set(theta.index) >= {"ward_rota", "dam_gate", "exam_leak"}
