"""A report section that cannot be computed says why; one that fails otherwise fails the report (issue 46, section 1).

``NotComputed`` is raised on purpose by an estimator (too few items, a degenerate design, a missing instrument)
and is the only exception :func:`analysis.common.report.run_sections` turns into "Not computed: ...". Any other
exception, numpy's broadcasting errors and pandas' indexing errors included (they are ValueErrors too), is a bug:
``probe analyze`` and ``probe run``'s report step fail with exit status 1 and one line naming the section.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.common.report import Body, Drawing, Files, Section, Table, run_sections, titled, write_files
from probe.errors import NotComputed, ProbeError, ReportError
from tests.test_store import run_cli

ITEMS = "mine_cart_bridge,freight_yard_switch,pond_child"


def _broadcast() -> np.ndarray:
    return np.ones(3) + np.ones(4)  # ValueError: operands could not be broadcast together


@titled("Fine")
def fine_section() -> Body:
    """A section that computes."""
    return ["fine"], Files()


@titled("Thin")
def thin_section() -> Body:
    """A section whose data are too thin."""
    raise NotComputed("needs at least 3 items, got 2")


@titled("Broken")
def broken_section() -> Body:
    """A section with a bug."""
    _broadcast()
    return ["never"], Files()


def test_not_computed_says_why_and_the_other_sections_run() -> None:
    body, _ = run_sections([thin_section, fine_section])
    assert body == ["## Thin", "", "Not computed: needs at least 3 items, got 2", "", "## Fine", "", "fine", ""]
    body, _ = run_sections([thin_section], why=True)
    assert "Not computed (A section whose data are too thin.): needs at least 3 items, got 2" in body
    assert issubclass(NotComputed, ProbeError) and issubclass(NotComputed, ValueError)  # a caller's except still works


def test_a_broadcasting_error_fails_the_report_naming_the_section() -> None:
    with pytest.raises(ReportError) as caught:
        run_sections([fine_section, broken_section, thin_section])
    message = str(caught.value)
    assert message.startswith("report section broken_section failed")
    assert message.endswith("ValueError: operands could not be broadcast together with shapes (3,) (4,)")
    assert isinstance(caught.value.__cause__, ValueError)  # the traceback is kept for a debugger or -X dev


@pytest.mark.parametrize(
    "error",
    [
        ValueError("a bare ValueError"),
        KeyError("column"),
        IndexError("index 5 is out of bounds"),
        ZeroDivisionError("division by zero"),
        TypeError("unsupported operand"),
        np.linalg.LinAlgError("Singular matrix"),
    ],
)
def test_not_computed_is_the_only_exception_turned_into_not_computed(error: Exception) -> None:
    def failing_section() -> Section:
        raise error

    with pytest.raises(ReportError, match=f"report section failing_section failed .*{type(error).__name__}"):
        run_sections([failing_section])


def test_the_project_s_own_errors_pass_unchanged() -> None:
    from probe.errors import StoreError

    def damaged_section() -> Section:
        raise StoreError("the run's spec does not read as BatterySpec")

    with pytest.raises(StoreError, match="does not read"):
        run_sections([damaged_section])


@pytest.fixture(scope="module")
def battery_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sections") / "battery"
    run_cli("run", "battery", "--model", "sim", "--out", str(out), "--items", ITEMS, "--instruments", "graded,binary",
            "--quiet", "--no-report")  # fmt: skip
    return out


def test_probe_analyze_fails_naming_the_section_of_a_planted_bug(
    battery_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from analysis.battery import yesno
    from probe.app.cli import main

    assert main(["analyze", str(battery_run)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(yesno, "i3_incoherence", lambda forms: pd.Series(_broadcast()))  # used by compute_verbflip
    assert main(["analyze", str(battery_run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("probe analyze: error: report section compute_verbflip failed")
    assert "ValueError: operands could not be broadcast together" in err[0]


def test_a_bug_in_a_computed_part_names_the_part(
    battery_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from analysis.battery import instrument_parts

    monkeypatch.setattr(instrument_parts, "decompose", lambda cells: pd.DataFrame(_broadcast()))
    assert "report section compute_verbflip failed" in _analyze_error(battery_run, capsys)


def test_a_bug_in_a_figure_function_names_the_figure(
    battery_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from analysis.battery import figures

    monkeypatch.setattr(figures, "grouped_bars", lambda *args: _broadcast())
    assert "report section figure fig_bias_decomposition.png failed" in _analyze_error(battery_run, capsys)


def _analyze_error(run: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """What `probe analyze` says on stderr when a planted broadcast bug fails the report (status 1)."""
    from probe.app.cli import main

    assert main(["analyze", str(run)]) == 1
    err = capsys.readouterr().err
    assert "could not be broadcast" in err
    return err


def test_probe_run_s_report_step_fails_the_same_way_and_keeps_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from analysis.battery import yesno
    from probe.app.cli import main
    from probe.store import RunStore

    monkeypatch.setattr(yesno, "i3_incoherence", lambda forms: pd.Series(_broadcast()))
    out = tmp_path / "run"
    args = ["run", "battery", "--model", "sim", "--out", str(out), "--items", ITEMS, "--instruments", "binary"]
    assert main([*args, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "probe run: error: report section compute_verbflip failed" in err and "probe analyze" in err
    assert len(RunStore(out).load("readout_trials")) > 0  # the results stay stored


# ------------------------------------------------------------------ the one writer
def _bars() -> object:
    from analysis.common.figures import pyplot

    fig, ax = pyplot().subplots(figsize=(2, 1))
    ax.bar([0, 1], [1.0, 2.0])
    return fig


def test_the_writer_writes_each_table_as_declared_and_every_figure_at_one_dpi(tmp_path: Path) -> None:
    from PIL import Image

    from analysis.common.report import FIGURE_DPI, write_report_files

    frame = pd.DataFrame({"x": [1.0 / 3, 2.0]}, index=pd.Index(["a", "b"], name="k"))
    files = Files({"plain": Table(frame), "fixed": Table(frame, index=True, float_format="%.6f")})
    files += Files(figures=(Drawing("fig_bars.png", _bars),), texts={"notes.jsonl": '{"a": 1}\n'})
    paths = write_report_files(tmp_path, ["# Title", "", "body"], files)
    assert [p.name for p in paths] == ["fig_bars.png", "fixed.csv", "notes.jsonl", "plain.csv", "summary.md"]
    assert (tmp_path / "plain.csv").read_text() == frame.to_csv(index=False)
    assert (tmp_path / "fixed.csv").read_text() == "k,x\na,0.333333\nb,2.000000\n"
    assert (tmp_path / "summary.md").read_text() == "# Title\n\nbody"
    with Image.open(tmp_path / "fig_bars.png") as im:  # 2 x 1 inches at the one resolution
        assert im.size == (2 * FIGURE_DPI, FIGURE_DPI)
    assert not list(tmp_path.glob("*.tmp*"))  # every file replaced in one step


def test_a_file_named_twice_is_a_bug() -> None:
    one = Files({"t": Table(pd.DataFrame({"x": [1]}))})
    with pytest.raises(ValueError, match=r"written twice: t\.csv"):
        one + one
    with pytest.raises(ValueError, match=r"written twice: f\.png"):
        Files(figures=(Drawing("f.png", _bars),)) + Files(figures=(Drawing("f.png", _bars),))


def test_sections_return_their_files_and_write_nothing(tmp_path: Path) -> None:
    @titled("With a table")
    def table_section() -> Body:
        """A section with a table."""
        return ["see the table"], Files({"t": Table(pd.DataFrame({"x": [1]}))})

    body, files = run_sections([table_section, thin_section, fine_section])
    assert body[:3] == ["## With a table", "", "see the table"] and list(files.tables) == ["t"]
    assert write_files(tmp_path / "out", files) == [tmp_path / "out" / "t.csv"]
