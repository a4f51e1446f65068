"""The one report writer: computed results, sections that only format them, and one writer of every file.

A report is made in three steps (scikit-learn's split of estimator and
Display): an experiment's results object is computed once from the run (or
the panel); its sections turn results into Markdown lines, :class:`Table` s
and :class:`Drawing` s and compute nothing, so a report or a comparison is a
:data:`Body` (its summary lines and :class:`Files`); and
:func:`write_report_files` is the one place that writes one, every table
once, every figure at :data:`FIGURE_DPI`, each file atomically
(:func:`analysis.report.write_report` for ``probe analyze``,
:func:`analysis.compare.write_comparison` for ``probe compare``).

A section is a function that returns a :class:`Section` (:func:`titled`
makes one of a function returning a :data:`Body`); :func:`run_sections` runs
them so that one that cannot be computed (it raises
:class:`~probe.errors.NotComputed`) says why while the others still run, and
one that fails otherwise (a bug) fails the report naming it
(:class:`~probe.errors.ReportError`, :func:`section_failed`); a figure whose
drawing fails does the same, named by its file. :func:`panel_md`,
:func:`dropped_md` and :func:`dropped_table` are the panel table and the
dropped-items log of every ``probe compare`` report, and :func:`panel_body`
the shared shape of a comparison's summary and files.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

import pandas as pd

from analysis.common.figures import save_figure
from probe.errors import NotComputed, ProbeError, ReportError
from probe.files import atomic_write_text
from probe.panel import Panel

SUMMARY = "summary.md"
FIGURE_DPI = 110
"""The resolution of every figure of every report."""


@dataclass(frozen=True)
class Table:
    """One CSV file of a report: the frame and how it is written (index or not, the number format).

    The format of each table is its report's own (``%.6g``, ``%.6f`` or pandas' default) and must not
    change, or the saved reports would.
    """

    frame: pd.DataFrame
    index: bool = False
    float_format: str | None = None

    def text(self) -> str:
        return self.frame.to_csv(index=self.index, float_format=self.float_format)


@dataclass(frozen=True)
class Drawing:
    """One figure of a report: its file name and the function that draws it (returns a matplotlib figure,
    saving nothing); :func:`write_files` draws and saves one at a time."""

    name: str
    draw: Callable[[], Any]


@dataclass(frozen=True)
class Files:
    """What a report or a section writes beside its summary lines: CSV tables by stem, figures, other text
    files by name (``puzzles.jsonl``). ``+`` joins two; a name given twice is a bug and raises."""

    tables: Mapping[str, Table] = field(default_factory=dict)
    figures: tuple[Drawing, ...] = ()
    texts: Mapping[str, str] = field(default_factory=dict)

    def __add__(self, other: Files) -> Files:
        names = [*self.names(), *other.names()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"report files written twice: {', '.join(twice)}")
        return Files({**self.tables, **other.tables}, (*self.figures, *other.figures), {**self.texts, **other.texts})

    def names(self) -> list[str]:
        """The file names, in the order :func:`write_files` writes them."""
        return [*(f"{k}.csv" for k in self.tables), *self.texts, *(d.name for d in self.figures)]


@dataclass(frozen=True)
class Section:
    title: str
    lines: list[str]
    files: Files = Files()


P = ParamSpec("P")
Body = tuple[list[str], Files]
"""What a section's function returns: its Markdown lines (none: the section is left out) and its files."""


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


def run_sections(sections: Sequence[Callable[..., Section]], *args: Any, why: bool = False) -> tuple[list[str], Files]:
    """The Markdown body (``## title`` per section with lines) and the files of ``sections`` called on ``args``.

    A section that raises :class:`~probe.errors.NotComputed` becomes one line "Not computed: ..." (with ``why``,
    the first line of its maker's docstring in brackets); the others still run. Any other exception is a bug,
    never "not enough data" (numpy's broadcasting errors and pandas' indexing errors are ValueErrors too): the
    report fails with a :class:`~probe.errors.ReportError` naming the section (:func:`section_failed`).
    """
    body: list[str] = []
    files = Files()
    for make in sections:
        try:
            s = make(*args)
        except NotComputed as e:
            name = make.__name__.replace("_section", "").replace("_", " ").capitalize()
            title = (make.__doc__ or make.__name__).strip().splitlines()[0]
            s = Section(name, [f"Not computed ({title}): {e}" if why else f"Not computed: {e}"])
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


def write_files(out: Path, files: Files) -> list[Path]:
    """The one writer of a report's files: each table of ``files`` as ``out/<stem>.csv``, each text file, then
    each figure drawn and saved as a PNG at :data:`FIGURE_DPI` before the next is drawn; every file atomically.
    Returns the paths written, in that order."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, table in files.tables.items():
        atomic_write_text(out / f"{stem}.csv", table.text())
        written.append(out / f"{stem}.csv")
    for name, text in files.texts.items():
        atomic_write_text(out / name, text)
        written.append(out / name)
    for d in files.figures:
        try:
            fig = d.draw()
        except ProbeError:
            raise
        except Exception as e:  # a bug in a figure function: the report fails naming the figure
            raise section_failed(f"figure {d.name}", e) from e
        written.append(save_figure(fig, out / d.name, dpi=FIGURE_DPI))
    return written


def write_report_files(out: Path, summary: Sequence[str], files: Files) -> list[Path]:
    """Write a report into ``out``: its ``files`` (:func:`write_files`), then ``summary.md`` from the
    ``summary`` lines (the summary names the files, so it comes last). Returns the paths written, sorted."""
    written = write_files(out, files)
    atomic_write_text(Path(out) / SUMMARY, "\n".join(summary))
    return sorted([*written, Path(out) / SUMMARY])


def panel_md(panel: Panel) -> list[str]:
    """The Markdown lines describing the panel (one row per run)."""
    frame = panel.framed  # a run read in the plain frame: say each run's frame (chat-only panels read as before)
    head = ["name", "model", "reasoning", *(["frame"] if frame else []), "experiment", "run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in panel.runs:
        cells = [r.name, r.model, "on" if r.reasoning else "off", *([r.frame] if frame else []), r.experiment]
        lines.append("| " + " | ".join(cells) + f" | `{r.path}` |")
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


def dropped_table(dropped: pd.DataFrame) -> Files:
    """``dropped_items.csv`` of a comparison."""
    return Files({"dropped_items": Table(dropped)})


def panel_body(
    tables: Mapping[str, Table],
    dropped: pd.DataFrame,
    figures: Sequence[Drawing],
    summary: Callable[[list[str]], str],
) -> Body:
    """A comparison's summary and files: its CSV ``tables``, ``dropped_items.csv`` and the ``figures``; the
    summary is what ``summary`` makes of the figures' file names."""
    return [summary([d.name for d in figures])], Files(tables) + dropped_table(dropped) + Files(figures=tuple(figures))


def g6_tables(frames: Mapping[str, pd.DataFrame | None]) -> dict[str, Table]:
    """CSV tables written with ``%.6g``; a table not computed (None) is not written."""
    return {stem: Table(t, float_format="%.6g") for stem, t in frames.items() if t is not None}


class _SourcePart(Protocol):
    """One source's comparison (readout or samples) of a panel."""

    @property
    def source(self) -> Any: ...

    def csv_tables(self) -> Mapping[str, pd.DataFrame | None]: ...


S = TypeVar("S", bound=_SourcePart)


def sources_panel_body(
    parts: Sequence[S],
    dropped: Callable[[S], pd.DataFrame],
    drawings: Callable[[S, str], Sequence[Drawing]],
    summary: Callable[[S, list[str]], str],
    sources_summary: Callable[[list[str]], str],
) -> Body:
    """A comparison computed per source (:func:`panel_body`): one source's tables, figures and ``summary``;
    or, where every run holds both sources, the tables in long form (a ``source`` column), each figure drawn
    per source (``drawings`` with the source as its tag) and ``sources_summary``."""
    if len(parts) == 1:
        one = parts[0]
        return panel_body(g6_tables(one.csv_tables()), dropped(one), drawings(one, ""), functools.partial(summary, one))
    from analysis.common.tables import source_tables

    tables, gone = source_tables([(str(p.source), p.csv_tables(), dropped(p)) for p in parts])
    figures = [d for p in parts for d in drawings(p, str(p.source))]
    return panel_body(g6_tables(tables), gone, figures, sources_summary)
