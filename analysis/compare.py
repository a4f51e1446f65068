"""``probe compare``: one report across the runs of a panel.

The experiment decides what a comparison means (its comparison function, found
by the experiment's name in :mod:`analysis.registry`); this module checks that
the runs can be compared, hands the panel over, and writes what the
comparison returns (:func:`analysis.common.report.write_report_files`) with
the part every comparison shares, the panel table (``panel.csv``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from analysis.common.report import Files, Table, write_report_files
from analysis.cue.compare_report import compare_cue
from analysis.cue.decisions import Decision
from analysis.influence.compare_report import compare_influence
from analysis.registry import COMPARISONS, Compare, comparable
from probe.panel import Panel, PanelError


def comparison_of(panel: Panel) -> tuple[str, Compare]:
    """The compare function shared by every run of the panel, with a name for it."""
    from experiments import get_experiment

    funcs: dict[str, Compare] = {}
    for name in panel.experiments:
        get_experiment(name)
        if name not in COMPARISONS:
            raise PanelError(f"experiment {name!r} has no cross-run comparison; comparable: {comparable()}")
        funcs[name] = COMPARISONS[name]
    distinct = set(map(id, funcs.values()))
    if len(distinct) > 1:
        raise PanelError(
            f"the panel mixes experiments that are compared differently ({', '.join(funcs)}); "
            "compare runs of one experiment (or of one family, e.g. the influence benchmarks)"
        )
    return ", ".join(funcs), next(iter(funcs.values()))


def write_comparison(
    panel: Panel,
    out: str | Path,
    *,
    n_boot: int | None = None,
    seed: int | None = None,
    asym_model: str | None = None,
    decision: Decision | None = None,
) -> list[Path]:
    """Write the panel's comparison into ``out``; returns the files written (sorted).

    ``n_boot`` / ``seed``: bootstrap resamples and seed of every CI (None: the comparison's defaults).
    ``asym_model``: the headline structure of the influence |Asym| fit (influence panels only).
    ``decision``: greedy (default) or expected decisions of a cue panel (cue panels only).
    """
    _, func = comparison_of(panel)
    if n_boot is not None and n_boot < 2:
        raise PanelError(f"--n-boot must be at least 2, got {n_boot}")
    if asym_model is not None and not all(e.startswith("influence-") for e in panel.experiments):
        raise PanelError(
            f"--asym-model applies to influence panels only; this panel holds {', '.join(panel.experiments)}"
        )
    if decision is not None and panel.experiments != ("cue",):
        raise PanelError(f"--decision applies to cue panels only; this panel holds {', '.join(panel.experiments)}")
    boot = {k: v for k, v in (("n_boot", n_boot), ("seed", seed)) if v is not None}
    if asym_model is not None:  # an influence panel (checked above): its comparison, with the option
        lines, files = compare_influence(panel, asym_model=asym_model, **boot)
    elif decision is not None:  # a cue panel (checked above)
        lines, files = compare_cue(panel, decision=decision, **boot)
    else:
        lines, files = func(panel, **boot)
    return write_report_files(Path(out), lines, Files({"panel": Table(panel.table())}) + files)


def runs_from_args(
    runs: Sequence[str], panel: str | None, names: str | None, humans: str | None, attributes: str | None
) -> Panel:
    """The panel of ``probe compare``: a panel file, or run folders (not both)."""
    from probe.panel import load_panel, panel_from_runs

    if panel and runs:
        raise PanelError("give either run folders or --panel FILE, not both (list extra runs in the panel file)")
    if panel:
        p = load_panel(panel)
        if humans or attributes or names:
            raise PanelError("with --panel, give humans / attributes / names in the panel file")
        return p
    if not runs:
        raise PanelError("nothing to compare: give run folders (probe compare RUN RUN ...) or --panel FILE")
    return panel_from_runs(runs, names=names.split(",") if names else None, humans=humans, attributes=attributes)
