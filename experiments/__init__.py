"""The instruments of the three papers, as data plus small builders.

``get_experiment`` maps a name to its spec class and expander; the CLI and the
run store go through it, so adding an experiment is one entry in ``_table``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from probe.types import Trial


@dataclass(frozen=True)
class Experiment:
    name: str
    summary: str
    spec: type
    expand: Callable[..., list[Trial]]


def _table() -> dict[str, Experiment]:
    from experiments import yesno

    return {
        yesno.NAME: Experiment(
            yesno.NAME, "forced yes/no: verb x printed order x wording form", yesno.YesNoSpec, yesno.expand
        ),
    }


EXPERIMENT_NAMES: tuple[str, ...] = ("yesno",)


def get_experiment(name: str) -> Experiment:
    table = _table()
    if name not in table:
        raise ValueError(f"unknown experiment {name!r}; available: {sorted(table)}")
    return table[name]
