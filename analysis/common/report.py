"""The one report writer: sections, ``summary.md``, and the parts every comparison shares.

A paper's report (or comparison) is a list of sections, each made by a
function that returns a :class:`Section` (Markdown lines and the files it
wrote; :func:`titled` makes one of a function that writes the lines and
files); :func:`run_sections` runs them so that one that cannot be computed
(it raises :class:`~probe.errors.NotComputed`) says why while the others
still run, and one that fails otherwise (a bug) fails the report naming it
(:class:`~probe.errors.ReportError`, :func:`section_failed`), and :func:`write_summary` writes
``summary.md`` atomically. :func:`panel_md`, :func:`dropped_md` and
:func:`write_dropped` are the panel table and the dropped-items log of every
``probe compare`` report; :func:`write_tables` is the one CSV writer of the
reports, and :func:`write_panel_report` the shared order of a comparison's
files (tables, dropped items, figures, then the summary that names them).
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec

import pandas as pd

from analysis.common.figures import save_figure
from probe.errors import NotComputed, ProbeError, ReportError
from probe.files import atomic_write_text
from probe.panel import Panel

SUMMARY = "summary.md"
REPORT_SUFFIXES = (".md", ".csv", ".png")
PANEL_DPI = 110
"""The resolution of a comparison's figures."""


@dataclass
class Section:
    title: str
    lines: list[str]
    files: list[Path]


P = ParamSpec("P")
Body = tuple[list[str], list[Path]]
"""What a section's function writes: its Markdown lines (none: the section is left out) and its files."""


def titled(title: str) -> Callable[[Callable[P, Body]], Callable[P, Section]]:
    """Make a section of a function that writes a :data:`Body`: the section's ``title`` is said here, once.

    The section keeps the function's name and docstring, which :func:`run_sections` names it by when it
    cannot be computed.
    """

    def wrap(body: Callable[P, Body]) -> Callable[P, Section]:
        @functools.wraps(body)
        def section(*args: P.args, **kwargs: P.kwargs) -> Section:
            lines, files = body(*args, **kwargs)
            return Section(title, lines, files)

        return section

    return wrap


def run_sections(
    sections: Sequence[Callable[..., Section]], *args: Any, why: bool = False
) -> tuple[list[str], list[Path]]:
    """The Markdown body (``## title`` per section with lines) and the files of ``sections`` called on ``args``.

    A section that raises :class:`~probe.errors.NotComputed` becomes one line "Not computed: ..." (with ``why``,
    the first line of its maker's docstring in brackets); the others still run. Any other exception is a bug,
    never "not enough data" (numpy's broadcasting errors and pandas' indexing errors are ValueErrors too): the
    report fails with a :class:`~probe.errors.ReportError` naming the section (:func:`section_failed`).
    """
    body: list[str] = []
    files: list[Path] = []
    for make in sections:
        try:
            s = make(*args)
        except NotComputed as e:
            name = make.__name__.replace("_section", "").replace("_", " ").capitalize()
            title = (make.__doc__ or make.__name__).strip().splitlines()[0]
            s = Section(name, [f"Not computed ({title}): {e}" if why else f"Not computed: {e}"], [])
        except ProbeError:  # the project's own errors say what to do (a damaged run, a section already named)
            raise
        except Exception as e:
            raise section_failed(make.__name__, e) from e
        if s.lines:
            body += [f"## {s.title}", "", *s.lines, ""]
        files += s.files
    return body, files


def section_failed(name: str, error: BaseException) -> ReportError:
    """The error of report section (or computed part) ``name`` that failed with ``error``, an exception other
    than :class:`~probe.errors.NotComputed`: the section's name and the last line of the traceback."""
    last = traceback.format_exception_only(type(error), error)[-1].strip()
    return ReportError(f"report section {name} failed (a bug in the analysis, not in the run): {last}")


def write_summary(out: Path, text: str) -> Path:
    """Write ``out/summary.md`` atomically; returns its path."""
    path = out / SUMMARY
    atomic_write_text(path, text)
    return path


def report_files(out: Path, extra: Sequence[str] = ()) -> list[Path]:
    """The report files in ``out`` (Markdown, CSV, PNG, and files ending in ``extra``), sorted."""
    return sorted(p for p in out.iterdir() if p.suffix in (*REPORT_SUFFIXES, *extra))


def panel_md(panel: Panel) -> list[str]:
    """The Markdown lines describing the panel (one row per run)."""
    lines = ["| name | model | reasoning | experiment | run |", "|---|---|---|---|---|"]
    for r in panel.runs:
        lines.append(f"| {r.name} | {r.model} | {'on' if r.reasoning else 'off'} | {r.experiment} | `{r.path}` |")
    return lines + reasoning_md(panel)


def source_part_md(source: str, body: Sequence[str], figures: Sequence[str]) -> list[str]:
    """One source's part of the summary of a panel whose runs hold readouts and samples: its heading, the
    one-source summary ``body`` one heading level down, then its ``figures`` lines."""
    return [f"## Source: {source}", "", *("#" + ln if ln.startswith("#") else ln for ln in body), *figures]


def reasoning_md(panel: Panel) -> list[str]:
    """For the panel's think-mode runs: how many reasoning traces hit the budget or looped (none: no lines)."""
    from analysis.common.checks import BUDGET_WARNING, reasoning_table

    rows = []
    for r in panel.runs:
        run = r.run()
        engine = run.manifest.engine
        if not engine.think:  # no reasoning: its readouts need not be read
            continue
        table = reasoning_table(run.load("readout_trials"), pd.DataFrame({"trial_id": []}))
        if table.empty:
            continue
        traces, hit, loops = (int(table[c].sum()) for c in ("traces", "hit_budget", "looped"))
        budget = engine.setting("think_budget", "?")
        flag = " **(over the warning share)**" if hit > BUDGET_WARNING * traces else ""
        rows.append(f"| {r.name} | {budget} | {hit} of {traces}{flag} | {loops} |")
    if not rows:
        return []
    return [
        "",
        f"Think-mode reasoning (readouts; a share over {BUDGET_WARNING:.0%} hitting the budget is flagged):",
        "",
        "| run | budget | hit the budget | looped |",
        "|---|---|---|---|",
        *rows,
    ]


def dropped_md(dropped: pd.DataFrame, n_shared: int, what: str = "items") -> list[str]:
    """One sentence (and a short table) on the items matched and dropped across runs."""
    if dropped.empty:
        return [f"All runs hold the same {n_shared} {what}; nothing was dropped."]
    per_run = dropped.groupby("run", sort=False)["item_id"].nunique()
    lines = [
        f"Runs were matched on the {n_shared} {what} they all hold; "
        f"{dropped['item_id'].nunique()} {what} were dropped (listed in `dropped_items.csv`):",
        "",
        "| run | dropped | reason (first) |",
        "|---|---|---|",
    ]
    for run, n in per_run.items():
        first = dropped.loc[dropped["run"] == run, "reason"].iloc[0]
        lines.append(f"| {run} | {n} | {first} |")
    return lines


def write_dropped(dropped: pd.DataFrame, out: Path) -> None:
    atomic_write_text(out / "dropped_items.csv", dropped.to_csv(index=False))


def write_tables(out: Path, tables: Mapping[str, pd.DataFrame | None], float_format: str = "%.6g") -> None:
    """Write each frame of ``tables`` to ``out/<name>.csv`` atomically, without the index; None writes no file.

    One writer, so that every table of a report is written the same way; the
    number format is the report's own (``%.6g``; the battery and cue reports
    keep ``%.6f``) and must not change, or the saved reports would.
    """
    for name, df in tables.items():
        if df is not None:
            atomic_write_text(out / f"{name}.csv", df.to_csv(index=False, float_format=float_format))


def write_panel_report(
    out: Path,
    tables: Mapping[str, pd.DataFrame | None],
    dropped: pd.DataFrame,
    figures: Callable[[], Iterable[tuple[str, Any]]],
    summary: Callable[[list[str]], str],
) -> list[Path]:
    """Write a comparison into ``out``: its CSV ``tables``, ``dropped_items.csv``, the figures, then ``summary.md``.

    ``figures`` only draws: it yields each figure with its file name, and each is saved here (PNG at
    :data:`PANEL_DPI`) before the next is drawn. The figures come before the summary because the summary names
    them (``summary`` gets the figure file names). Returns :func:`report_files`.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_tables(out, tables)
    write_dropped(dropped, out)
    names = [save_figure(fig, out / name, dpi=PANEL_DPI).name for name, fig in figures()]
    write_summary(out, summary(names))
    return report_files(out)
