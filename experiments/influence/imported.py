"""``influence-import``: per-condition influence results made by ``probe import``, not by ``probe run``.

Registered as an experiment so ``probe analyze`` and ``probe compare`` find
its report and comparison like any other run's (by its name, in
:mod:`analysis.registry`; see :mod:`analysis.influence.imported`). Its hooks are stubs (no flags, not
runnable, no trials), so it is registered field by field rather than through
:meth:`experiments.Experiment.of`, which would present them as the module's
``add_arguments``, ``spec_from_args`` and ``expand``.
"""

from __future__ import annotations

import argparse
from typing import Any

from experiments import Experiment

NAME = "influence-import"


def _no_args(p: argparse.ArgumentParser) -> None:
    """An imported run has no flags of its own."""


def _not_runnable(a: argparse.Namespace) -> Any:
    raise ValueError(
        "influence-import runs are made by `probe import FILE --out RUN` from per-condition results, not by probe run"
    )


def _no_trials(spec: Any, count_tokens: Any = None) -> list[Any]:
    return []


EXPERIMENT = Experiment(
    name=NAME,
    summary="imported per-condition influence results (made by `probe import`, not runnable)",
    add_arguments=_no_args,
    spec_from_args=_not_runnable,
    expand=_no_trials,
)
