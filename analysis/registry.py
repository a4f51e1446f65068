"""Which report and which comparison each experiment has, by experiment name, imported plainly.

The experiments (:mod:`experiments`) are the instruments and know nothing of
analysis; this table is the one place that ties an experiment's name to the
function that writes its report (``probe analyze``) and, for the comparable
ones, to the function that writes a panel's comparison (``probe compare``).
A reader (a person, grep, mypy, an import graph) follows the call from here.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Final, Protocol

from analysis.battery.compare_report import compare_battery, compare_yesno
from analysis.battery.report import battery_report, yesno_report
from analysis.cue.compare_report import compare_cue
from analysis.cue.report import cue_report
from analysis.influence.compare_report import compare_influence
from analysis.influence.followup_report import report as followup_report
from analysis.influence.report import imported_report, influence_report
from experiments import battery, cue, followup, get_experiment, yesno
from experiments.influence import BENCHMARKS, imported

if TYPE_CHECKING:
    from analysis.common.report import Body
    from probe.panel import Panel
    from probe.runs import Run


class Report(Protocol):
    """The report of a finished run: its summary lines and files (:data:`analysis.common.report.Body`), computed
    from the run and written by :func:`analysis.report.write_report`."""

    def __call__(self, run: Run, /) -> Body: ...


class Compare(Protocol):
    """The cross-run report of a panel of runs: its summary lines and files (:data:`analysis.common.report.Body`),
    written by :func:`analysis.compare.write_comparison`.

    ``n_boot`` / ``seed``: the bootstrap resamples and seed of every CI; a
    comparison has its own defaults, used when ``probe compare`` is not given them.
    """

    def __call__(self, panel: Panel, /, *, n_boot: int = ..., seed: int = ...) -> Body: ...


REPORTS: Final[dict[str, Report]] = {
    battery.NAME: battery_report,
    yesno.NAME: yesno_report,
    cue.NAME: cue_report,
    followup.NAME: followup_report,
    imported.NAME: imported_report,
    **{b.name: partial(influence_report, benchmark=b.key) for b in BENCHMARKS},
}
"""The report of each experiment; the influence benchmarks share one, told which benchmark it reads."""

COMPARISONS: Final[dict[str, Compare]] = {
    battery.NAME: compare_battery,
    yesno.NAME: compare_yesno,
    cue.NAME: compare_cue,
    imported.NAME: compare_influence,
    **{b.name: compare_influence for b in BENCHMARKS},
}
"""The comparison of each comparable experiment. Experiments that share one function (the influence
benchmarks and imported influence results) can be compared together in one panel."""


def report_of(experiment: str) -> Report:
    """The report of ``experiment`` (an unknown name fails as :func:`experiments.get_experiment` does)."""
    get_experiment(experiment)
    return REPORTS[experiment]


def comparable() -> str:
    """The comparable experiments, for an error message."""
    return ", ".join(sorted(COMPARISONS)) or "(none)"
