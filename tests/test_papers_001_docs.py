"""docs/papers.md's paper 001 section runs as written: its sim commands, the files its rows name, and its example input files.

Running the whole runnable block takes about 20 s on 2 CPU cores, so those tests are marked slow (`make
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
    """Paper 001's section of the shared page."""
    text = DOC.read_text()
    start = text.index("## Paper 001")
    return text[start : text.index("## Paper", start + 1)] if "## Paper" in text[start + 1 :] else text[start:]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _section(), flags=re.S)


def _commands() -> list[list[str]]:
    """The lines of the runnable block (the one on the synthetic subject), as argument lists after `probe`."""
    (block,) = [b for b in _blocks("sh") if "--model sim" in b]
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
    from experiments.cue.categories import load_names
    from probe.app.cli import build_parser

    parser = build_parser()
    commands = _commands()
    assert [c[0] for c in commands] == ["run"] * 3 + ["compare"] + ["run"] * 2 + ["compare"]
    for args in commands:
        parser.parse_args(args)  # exits on an unknown flag or value
    dilemmas = tmp_path / "dilemmas.jsonl"
    dilemmas.write_text(_example("jsonl"))
    assert len(dilemmas.read_text().splitlines()) == 3
    out = tmp_path / "own"
    assert main(["run", "cue", "--model", "sim", "--dilemmas", str(dilemmas), "--out", str(out), "--quiet"]) == 0
    bias = pd.read_csv(out / "report" / "cue_bias.csv")
    assert set(bias["arm"]) >= {"direct", "puzzled-hard"}
    names = tmp_path / "names.yaml"
    names.write_text(_example("yaml"))
    assert len(names.read_text().splitlines()) == 3
    assert load_names(str(names))[("White", "man")] == ("Greg", "Todd", "Brad")


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("papers001")
    mp = pytest.MonkeyPatch()
    mp.chdir(root)
    try:
        for args in _commands():
            assert main(args) == 0, args
    finally:
        mp.undo()
    return root


@pytest.mark.slow
def test_every_file_a_row_names_is_written(ran: Path) -> None:
    text = _section()
    panel = {m for m in re.findall(r"`PANEL/([\w.]+)`", text)}
    run = {m for m in re.findall(r"`RUN/report/([\w.]+)`", text)}
    assert {"fig_cue_sign_tests.png", "cue_gap_by_level.csv", "cue_formal_named.csv"} <= panel
    for name in panel - {"cue_shapes.csv", "cue_gap_ols.csv", "cue_attributes.csv", "fig_cue_gap_vs_attributes.png"}:
        assert (ran / "runs/p001-panel" / name).is_file(), name
    assert (ran / "runs/p001-shapes/cue_shapes.csv").is_file()
    for name in run:
        assert (ran / "runs/p001-a/report" / name).is_file(), name
    assert (ran / "runs/p001-a/trials.jsonl").is_file()
    shapes = pd.read_csv(ran / "runs/p001-shapes/cue_shapes.csv")
    assert list(shapes["model"]) == ["sim"] and shapes[["orig", "sol1", "sol2", "rand"]].notna().all(axis=None)


@pytest.mark.slow
def test_the_attributes_example_is_read(ran: Path, tmp_path: Path) -> None:
    attrs = tmp_path / "attrs.csv"
    attrs.write_text(_example("csv"))
    assert len(attrs.read_text().splitlines()) == 3
    cmp = tmp_path / "cmp"
    args = ["compare", str(ran / "runs/p001-a"), str(ran / "runs/p001-b"), "--attributes", str(attrs)]
    assert main([*args, "--n-boot", "20", "--out", str(cmp), "--quiet"]) == 0
    got = pd.read_csv(cmp / "cue_attributes.csv").set_index("name")["alignment"]
    assert got.to_dict() == {"sim [p001-a]": 1, "sim [p001-b]": 3}
