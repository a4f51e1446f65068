"""docs/python.md as written: its worked example runs, and its column table is probe.runs.COLUMNS."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from probe import runs as runs_mod
from probe.app.cli import main
from probe.runs import COLUMNS, TRIAL_COLUMNS

DOC = Path(__file__).resolve().parent.parent / "docs" / "python.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_worked_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runs_mod, "_cache_dir", lambda: tmp_path / "view-cache")
    example = next(b for b in _blocks("sh") if "probe run" in b)
    commands = [shlex.split(line) for line in example.splitlines() if line.startswith("probe ")]
    assert len(commands) == 2
    for argv in commands:
        assert main(argv[1:]) == 0
    first = next(b for b in _blocks("python") if "counts_line" in b)
    exec(compile(first, str(DOC), "exec"), {"__name__": "__docs__"})  # the opening block, on the first run
    code = next(b for b in _blocks("python") if "savefig" in b)
    capsys.readouterr()
    exec(compile(code, str(DOC), "exec"), {"__name__": "__docs__"})
    out = capsys.readouterr().out
    assert re.fullmatch(r"22 dilemmas; r = -?\d\.\d{3}\n", out), out
    assert (tmp_path / "p_cbr.png").stat().st_size > 5_000


def test_the_column_table_is_the_contract() -> None:
    text = DOC.read_text()
    rows = re.findall(r"^\| (all|readouts|options|samples|codes) \| `([a-z_]+)` \| ([a-z0-9]+) \|", text, flags=re.M)
    documented: dict[str, dict[str, str]] = {}
    for frame, column, dtype in rows:
        documented.setdefault(frame, {})[column] = dtype
    assert documented.pop("all") == TRIAL_COLUMNS
    assert documented == {k: v for k, v in COLUMNS.items() if k != "trials"}
