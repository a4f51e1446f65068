"""``probe analyze``: write a run's report (CSV tables, a Markdown summary, figures) under ``RUN/report/``.

The experiment of the run decides what its report holds (its report function, in the paper's package,
found by the experiment's name in :mod:`analysis.registry`, returns the summary lines and files); this module
adds "What the numbers rest on" (:mod:`analysis.common.checks`) and, for a partial store, the header saying
so, and writes the whole report once (:func:`analysis.common.report.write_report_files`).
"""

from __future__ import annotations

from pathlib import Path

from analysis.common.report import Body, Files, Table, write_report_files
from probe.errors import StoreError
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
    lines, files = report_of(opened.manifest.experiment)(opened)
    check_lines, check_files = checks(opened)
    text = "\n".join(lines).rstrip("\n") + "\n\n" + "\n".join(check_lines)
    if not integrity.complete:
        text = "\n".join(integrity.partial_header()) + "\n" + text
    return write_report_files(opened.root / "report", [text], files + check_files)


def checks(run: Run) -> Body:
    """ "What the numbers rest on" (:mod:`analysis.common.checks`): its summary lines and CSV tables."""
    from analysis.common import checks

    lines, tables = checks.checks_section(
        run.manifest,
        run.load("readout_trials"),
        run.trial_meta(),
        run.load("samples"),
        run.load("generations"),
        {t.trial_id: t.options for t in run.trial_list},
        run.load("readout_options"),
    )
    return lines, Files({stem: Table(t, index=True, float_format="%.6f") for stem, t in tables.items()})
