"""The instruments of the three papers, as data plus small builders.

Every module in this package that defines ``EXPERIMENTS`` (a tuple of
:class:`Experiment`) is found automatically, so adding an experiment means
adding a module, not editing a central table. Experiment modules must be
cheap to import (no torch, no engines at module level).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from probe.store import RunStore
    from probe.types import Trial


class Spec(Protocol):
    """What an experiment spec provides: a frozen dataclass that serializes to the manifest."""

    def to_dict(self) -> dict[str, Any]: ...


class ManifestSpec:
    """The manifest form of a frozen spec dataclass, written once: ``{"experiment": name, **fields}``.

    A spec class names its experiment in ``experiment_name``, a ``ClassVar`` so that
    :func:`dataclasses.asdict` leaves it out: the manifest (and the run key) hold the
    experiment name once and then exactly the spec's fields.
    """

    experiment_name: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return {"experiment": self.experiment_name, **asdict(cast("DataclassInstance", self))}


@dataclass(frozen=True)
class Experiment:
    """One runnable experiment: its CLI flags, its spec, its trials and its report."""

    name: str
    summary: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    """Add the experiment's own flags to ``probe run NAME``."""
    spec_from_args: Callable[[argparse.Namespace], Spec]
    expand: Callable[..., list[Trial]]
    """``expand(spec, count_tokens=None) -> trials`` in a fixed order."""
    report: Callable[[RunStore, Path], list[Path]]
    """Write the report files of a finished run into the given folder; return their paths."""
    generative: Callable[[Trial], bool] | None = None
    """Trials for which the runner generates text (and judges it) instead of reading the slot."""
    reply_tokens: Callable[[Any], int] | None = None
    """``reply_tokens(spec)``: the token cap of the generated trials' replies (None: the engine's --max-new-tokens)."""
    judge_options: Callable[[argparse.Namespace], Any] | None = None
    """Build the judge for generated trials from the CLI arguments (None: no judging)."""
    compare: Callable[..., list[Path]] | None = None
    """``compare(panel, out, *, n_boot=..., seed=...)``: write the cross-run report of a panel of runs of this
    experiment (``probe compare``); None: not comparable. Experiments that share one function (e.g. the three
    influence benchmarks) can be compared together."""


def lazy(target: str) -> Callable[..., Any]:
    """``"module:function"``, imported on first call: experiment modules stay cheap to import (no analysis code)."""
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"lazy target must be 'module:function', got {target!r}")

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"lazy({target})"
    return call


def all_experiments() -> dict[str, Experiment]:
    """Every experiment in the package, by name (sorted)."""
    found: dict[str, Experiment] = {}
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{mod.name}")
        for exp in getattr(module, "EXPERIMENTS", ()):
            if exp.name in found:
                raise RuntimeError(f"experiment name {exp.name!r} is defined twice (second in {module.__name__})")
            found[exp.name] = exp
    return dict(sorted(found.items()))


def get_experiment(name: str) -> Experiment:
    table = all_experiments()
    if name not in table:
        raise ValueError(f"unknown experiment {name!r}; available: {', '.join(table)}")
    return table[name]
