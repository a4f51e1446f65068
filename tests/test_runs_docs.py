"""docs/python.md as written: its worked example and the query engine's block run, and its column table is
probe.runs.COLUMNS."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from probe import tables, trial_index
from probe.app.cli import main
from probe.query import Page
from probe.runs import COLUMNS, TRIAL_COLUMNS

DOC = Path(__file__).resolve().parent.parent / "docs" / "python.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_worked_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trial_index, "cache_dir", lambda: tmp_path / "view-cache")
    example = next(b for b in _blocks("sh") if "probe run" in b)
    commands = [shlex.split(line) for line in example.splitlines() if line.startswith("probe ")]
    assert len(commands) == 2
    for argv in commands:
        assert main(argv[1:]) == 0
    first = next(b for b in _blocks("python") if "counts_line" in b)
    ns: dict[str, object] = {"__name__": "__docs__"}
    exec(compile(first, str(DOC), "exec"), ns)  # the opening block, on the first run
    paging = next(b for b in _blocks("python") if "run.page(" in b)
    exec(compile(paging, str(DOC), "exec"), ns)  # the query engine's block, on the run the opening block opened
    page = ns["page"]
    assert isinstance(page, Page) and 0 < len(page.rows) == min(page.total, 50)
    code = next(b for b in _blocks("python") if "savefig" in b)
    capsys.readouterr()
    exec(compile(code, str(DOC), "exec"), {"__name__": "__docs__"})
    out = capsys.readouterr().out
    assert re.fullmatch(r"22 dilemmas; r = -?\d\.\d{3}\n", out), out
    assert (tmp_path / "p_cbr.png").stat().st_size > 5_000


def test_the_column_table_is_the_contract() -> None:
    text = DOC.read_text()
    rows = re.findall(r"^\| (all|readouts|options|samples|codes|layers) \| `([a-z_]+)` \| ([a-z0-9]+) \|", text, flags=re.M)
    documented: dict[str, dict[str, str]] = {}
    for frame, column, dtype in rows:
        documented.setdefault(frame, {})[column] = dtype
    assert documented.pop("all") == TRIAL_COLUMNS
    assert documented == {k: v for k, v in COLUMNS.items() if k != "trials"}


def test_the_column_table_says_what_the_declaration_says() -> None:
    """The "what" of each documented column is the doc of its one declaration (probe.tables)."""
    rows = re.findall(
        r"^\| (all|readouts|options|samples|codes|layers) \| `([a-z_]+)` \| [a-z0-9]+ \| (.*) \|$", DOC.read_text(), flags=re.M
    )
    declared = {("all", c.name): c.doc for c in tables.TRIAL_COLUMNS}
    declared |= {(kind, n): c.doc for kind, t in tables.FRAMES.items() for n, c in t.columns().items()}
    assert {(frame, column): what for frame, column, what in rows} == declared
