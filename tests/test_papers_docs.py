"""docs/papers.md (paper 000) runs as written: its sim / tiny block and its published-data block.

Running the blocks takes about a minute on 2 CPU cores, so those tests are marked slow (`make test-slow`);
the default suite parses every command with its own parser and checks that every published file it names
exists.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from probe.app.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "papers.md"


def _section() -> str:
    text = DOC.read_text()
    return text[text.index("## Paper 000") : text.index("## Paper 001")]


def _block(marker: str) -> list[list[str]]:
    """The lines of the ``sh`` block of paper 000 that contains ``marker``, as argument lists."""
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", _section(), flags=re.S) if marker in b]
    return [shlex.split(line) for line in block.strip().splitlines()]


def _runnable(args: list[str]) -> list[str]:
    """``args`` with the repository's data paths made absolute (the block runs in a scratch folder)."""
    return [str(ROOT / a) if a.startswith("tests/data/") else a for a in args]


def test_every_command_parses_and_names_files_that_exist() -> None:
    from probe.app.cli import build_parser

    parser = build_parser()
    sim = _block("--model sim")
    assert [c[:2] for c in sim] == [["probe", "run"]] * 3 + [["probe", "compare"]] + [["probe", "run"]] * 2 + [
        ["probe", "compare"]
    ]
    for args in sim:
        parser.parse_args(args[1:])  # exits on an unknown flag or value
    from analysis.influence.published import build_parser as published_parser

    for args in _block("analysis.influence.published"):
        if args[0] == "python":
            assert args[1:3] == ["-m", "analysis.influence.published"]
            ns = published_parser().parse_args(args[3:])
            assert (ROOT / ns.src).is_file(), ns.src
        else:
            parser.parse_args(args[1:])
    # every figure 1-25 and table 1-17, 21, 22 has a row
    rows = re.findall(r"^\| (Figure|Table) (\d+) \|", _section(), flags=re.M)
    assert sorted(int(n) for k, n in rows if k == "Figure") == list(range(1, 26))
    assert sorted(int(n) for k, n in rows if k == "Table") == [*range(1, 18), 21, 22]


def _run(commands: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from analysis.influence.published import main as published_main

    monkeypatch.chdir(tmp_path)
    for args in commands:
        args = _runnable(args)
        if args[0] == "python":
            assert published_main(args[3:]) == 0, args
        else:
            assert main(args[1:]) == 0, args


@pytest.mark.slow
def test_the_sim_and_tiny_block_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run(_block("--model sim"), tmp_path, monkeypatch)
    panel = tmp_path / "runs" / "p000-panel"
    for name in ("table21_neutral_asym.csv", "baseline_bias.csv", "larger_group_by_run.csv", "fig_headline.png"):
        assert (panel / name).is_file(), name
    report = tmp_path / "runs" / "p000-tri" / "report"
    for name in ("table21_neutral_asym.csv", "larger_by_ratio.csv", "fig_larger_group.png", "invalid_rates.csv"):
        assert (report / name).is_file(), name
    tiny = tmp_path / "runs" / "p000-tiny-panel"
    assert (tiny / "fig_reasoning_change_triage.png").is_file()
    assert set(pd.read_csv(tiny / "baseline_bias.csv")["think"]) == {False, True}


@pytest.mark.slow
def test_the_published_block_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run(_block("analysis.influence.published"), tmp_path, monkeypatch)
    pub = tmp_path / "runs" / "p000-published"
    bb = pd.read_csv(pub / "baseline_bias.csv")
    tri = bb[bb["benchmark"] == "triage"].set_index("think")["bb"]
    assert (round(100 * tri[False]), round(100 * tri[True])) == (67, 55)
    assert (tmp_path / "runs" / "p000-published-gpt" / "report" / "max_asym_by_pair.csv").is_file()
