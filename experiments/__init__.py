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
import dataclasses
import importlib
import pkgutil
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, Self, cast

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

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        """Inverse of :meth:`to_dict` (a run manifest's spec, :meth:`probe.record.Manifest.spec_as`): each field
        read as its declared type (JSON lists back to tuples, nested specs to their dataclass), a field the
        manifest lacks at its default (a spec written before the field existed); an unknown field or a value of
        another type is a ValueError naming it."""
        return cast("Self", _from_json(cls, {k: v for k, v in d.items() if k != "experiment"}, cls.__name__))


def _from_json(kind: Any, value: Any, where: str) -> Any:
    """``value`` (parsed JSON) as type ``kind``: a dataclass, tuple, union, Literal, mapping or scalar."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        if not isinstance(value, Mapping):
            raise ValueError(f"{where} is {value!r}, not an object")
        hints = typing.get_type_hints(kind)
        fields = {f.name: f for f in dataclasses.fields(kind) if f.init}
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ValueError(f"{where} has no field {', '.join(unknown)}")
        return kind(**{k: _from_json(hints[k], v, f"{where}.{k}") for k, v in value.items()})
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return _from_json(option, value, where)
            except ValueError:
                continue
        raise ValueError(f"{where} is {value!r}, not {kind}")
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{where} is {value!r}, not one of {args}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where} is {value!r}, not a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_json(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ValueError(f"{where} is {value!r}, not {len(args)} values")
        return tuple(_from_json(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin in (dict, Mapping) or kind in (dict, Mapping) or origin is typing.get_origin(Mapping[str, Any]):
        if not isinstance(value, Mapping):
            raise ValueError(f"{where} is {value!r}, not an object")
        vt = args[1] if len(args) == 2 else Any
        return {str(k): _from_json(vt, v, f"{where}[{k!r}]") for k, v in value.items()}
    if kind is Any:
        return value
    if kind is type(None):
        if value is not None:
            raise ValueError(f"{where} is {value!r}, not null")
        return None
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind in (str, int, bool) and type(value) is kind:
        return value
    raise ValueError(f"{where} is {value!r}, not {getattr(kind, '__name__', kind)}")


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
