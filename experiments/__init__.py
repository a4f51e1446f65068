"""The instruments of the three papers, as data plus small builders.

Every module in this package that defines ``EXPERIMENTS`` (a tuple of
:class:`Experiment`) is found automatically, so adding an experiment means
adding a module, not editing a central table. Experiment modules must be
cheap to import (no torch, no engines at module level).

An experiment module defines its hooks under four fixed names (``NAME``,
``add_arguments``, ``spec_from_args``, ``expand``; :class:`ModuleHooks`) and
registers itself with :meth:`Experiment.of`, which reads them, so the
registration names only what is not code (the summary, the optional hooks).
The influence benchmark modules follow the same convention through
:meth:`experiments.influence.Benchmark.of`.

Experiments import no analysis code: an experiment's report and comparison are
registered by its name in :mod:`analysis.registry`.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

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


HOOK_NAMES: Final[tuple[str, ...]] = ("NAME", "add_arguments", "spec_from_args", "expand")
"""The names under which an experiment (or influence benchmark) module defines its hooks."""


@dataclass(frozen=True)
class ModuleHooks:
    """The four hooks an experiment module defines under the names of :data:`HOOK_NAMES`.

    The one place that knows those names: :meth:`Experiment.of` and
    :meth:`experiments.influence.Benchmark.of` both read a module through it.
    Their signatures are the reader's concern (a benchmark's ``spec_from_args``
    also takes the parsed audit settings).
    """

    name: str
    """``NAME``: the experiment name (``probe run NAME``)."""
    add_arguments: Callable[[argparse.ArgumentParser], None]
    """``add_arguments(parser)``: the module's own flags."""
    spec_from_args: Callable[..., Any]
    """``spec_from_args(args, ...)``: the spec from the parsed flags."""
    expand: Callable[..., list[Trial]]
    """``expand(spec, count_tokens=None)``: the trials in a fixed order."""

    @classmethod
    def of(cls, module: ModuleType) -> ModuleHooks:
        """Read the hooks of ``module``; fail naming the module and every name it lacks."""
        missing = [name for name in HOOK_NAMES if not hasattr(module, name)]
        if missing:
            raise TypeError(
                f"experiment module {module.__name__} does not define {', '.join(missing)}; "
                f"an experiment module defines {', '.join(HOOK_NAMES)}"
            )
        return cls(*(getattr(module, name) for name in HOOK_NAMES))


@dataclass(frozen=True)
class Experiment:
    """One runnable experiment: its CLI flags, its spec and its trials (its report: :mod:`analysis.registry`)."""

    name: str
    summary: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    """Add the experiment's own flags to ``probe run NAME``."""
    spec_from_args: Callable[[argparse.Namespace], Spec]
    expand: Callable[..., list[Trial]]
    """``expand(spec, count_tokens=None) -> trials`` in a fixed order."""
    generative: Callable[[Trial], bool] | None = None
    """Trials for which the runner generates text (and judges it) instead of reading the slot."""
    reply_tokens: Callable[[Any], int] | None = None
    """``reply_tokens(spec)``: the token cap of the generated trials' replies (None: the engine's --max-new-tokens)."""
    judge_options: Callable[[argparse.Namespace], Any] | None = None
    """Build the judge for generated trials from the CLI arguments (None: no judging)."""

    @classmethod
    def of(cls, module: ModuleType, summary: str, **optional: Any) -> Experiment:
        """The experiment of a module that defines the four hooks of :class:`ModuleHooks` under their names.

        ``optional`` sets the optional fields (``generative``, ``reply_tokens``,
        ``judge_options``). A module registers itself at its end, after
        its hooks are defined, with ``Experiment.of(sys.modules[__name__], ...)``:
        the module object is in :data:`sys.modules` from the start of its import,
        and passing the module (not its name) keeps this a plain read of its
        attributes, the same as :meth:`experiments.influence.Benchmark.of`.
        """
        hooks = ModuleHooks.of(module)
        return cls(hooks.name, summary, hooks.add_arguments, hooks.spec_from_args, hooks.expand, **optional)


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
