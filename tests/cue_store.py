"""A sampled-only cue run written without a model, and its report: the cue report's tests set planted answers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from experiments.cue import CueSpec
    from probe.types import Sample, Trial


def sampled_cue_report(
    run: Path, spec: CueSpec, trials: Sequence[Trial], samples: Sequence[Sample], draws: int
) -> Path:
    """Store ``samples`` (``draws`` per trial at T = 1) of ``spec``'s ``trials`` at ``run``, report it; the report folder.

    The manifest is the smallest a cue run needs (synthetic engine, no
    readout), and the report uses 20 bootstrap draws: the tests read the
    planted frequencies, not the intervals.
    """
    from analysis.common.report import write_report_files
    from analysis.cue.report import cue_report
    from probe.runs import as_run
    from probe.store import RunStore
    from probe.tables import sample_table

    manifest = {
        "run_key": "test",
        "experiment": "cue",
        "spec": spec.to_dict(),
        "plan": {"readout": False, "samples": draws, "temperature": 1.0},
        "engine": {"settings": {"model": "synthetic"}},
        "n_trials": len(trials),
    }
    store = RunStore.open(run, manifest, trials)
    store.write_chunk(0, {"samples": sample_table(samples)})
    write_report_files(run / "report", *cue_report(as_run(store), n_boot=20))
    return run / "report"
