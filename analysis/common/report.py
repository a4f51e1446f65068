"""The one report writer: sections, ``summary.md``, and the parts every comparison shares.

A paper's report (or comparison) is a list of sections, each made by a
function that returns a :class:`Section` (Markdown lines and the files it
wrote); :func:`run_sections` runs them so that one that cannot be computed
says why while the others still run, and :func:`write_summary` writes
``summary.md`` atomically. :func:`panel_md`, :func:`dropped_md` and
:func:`write_dropped` are the panel table and the dropped-items log of every
``probe compare`` report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from probe.files import atomic_write_text
from probe.panel import Panel

SUMMARY = "summary.md"
REPORT_SUFFIXES = (".md", ".csv", ".png")


@dataclass
class Section:
    title: str
    lines: list[str]
    files: list[Path]


def run_sections(
    sections: Sequence[Callable[..., Section]], *args: Any, why: bool = False
) -> tuple[list[str], list[Path]]:
    """The Markdown body (``## title`` per section with lines) and the files of ``sections`` called on ``args``.

    A section that raises ``ValueError`` becomes one line "Not computed: ..." (with ``why``, the
    first line of its maker's docstring in brackets); the others still run.
    """
    body: list[str] = []
    files: list[Path] = []
    for make in sections:
        try:
            s = make(*args)
        except ValueError as e:
            name = make.__name__.replace("_section", "").replace("_", " ").capitalize()
            title = (make.__doc__ or make.__name__).strip().splitlines()[0]
            s = Section(name, [f"Not computed ({title}): {e}" if why else f"Not computed: {e}"], [])
        if s.lines:
            body += [f"## {s.title}", "", *s.lines, ""]
        files += s.files
    return body, files


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
    return lines


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
