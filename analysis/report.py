"""``probe analyze``: write a run's report (CSV tables, a Markdown summary, figures) under ``RUN/report/``.

The experiment of the run decides what its report holds (its report function, in the paper's package,
found by the experiment's name in :mod:`analysis.registry`); this module checks the store and appends
"What the numbers rest on" (:mod:`analysis.common.checks`).
"""

from __future__ import annotations

from pathlib import Path

from probe.errors import StoreError
from probe.files import atomic_write_text
from probe.runs import Run, open_run


def write_report(run: str | Path, *, allow_partial: bool = False) -> list[Path]:
    """Write ``RUN/report/`` for whatever experiment the run holds; returns the files written.

    A store with a damaged or missing chunk is refused (``StoreError``) unless
    ``allow_partial``; then the report covers the verified chunks and its
    summary starts by saying so.
    """
    from analysis.registry import report_of

    opened = open_run(run, allow_partial=allow_partial)
    integrity = opened.integrity
    if not integrity.complete and not allow_partial:
        raise StoreError(integrity.refusal())
    out = opened.root / "report"
    paths = report_of(opened.manifest.experiment)(opened, out)
    paths = paths + append_checks(opened, out)
    summary = out / "summary.md"
    if not integrity.complete and summary.exists():
        atomic_write_text(summary, "\n".join(integrity.partial_header()) + "\n" + summary.read_text())
    return paths


def append_checks(run: Run, out: Path) -> list[Path]:
    """Append "What the numbers rest on" (:mod:`analysis.common.checks`) to ``summary.md``; write its CSV tables."""
    from analysis.common import checks
    from analysis.common.report import Files, Table, write_files

    lines, tables = checks.checks_section(
        run.manifest,
        run.load("readout_trials"),
        run.trial_meta(),
        run.load("samples"),
        run.load("generations"),
        {t.trial_id: t.options for t in run.trial_list},
        run.load("readout_options"),
    )
    summary = out / "summary.md"
    head = summary.read_text().rstrip("\n") + "\n\n" if summary.exists() else ""
    atomic_write_text(summary, head + "\n".join(lines))
    return write_files(out, Files({stem: Table(t, index=True, float_format="%.6f") for stem, t in tables.items()}))
