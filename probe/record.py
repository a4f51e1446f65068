"""The run record: ``manifest.json`` as a typed, frozen :class:`Manifest`.

The runner builds one (:meth:`Manifest.build`), the store writes it
(:func:`probe.store.write_run_files`) and returns it (:meth:`probe.store.RunStore.manifest`),
and every layer above reads its typed fields: which experiment, spec, plan and
engine made the run, its identity and run key, its shard, trial count and
provenance. The questions every report, panel and the viewer ask of a run, *which
model*, *did it reason first* and *what is it called*, are answered here once
(:attr:`Manifest.model`, :attr:`Manifest.think`, :attr:`Manifest.display_name`).

A manifest is read exactly as it was written: :meth:`Manifest.to_dict` gives
back every key, including ones this version does not know (fields added after
the run such as ``throughput``), so :meth:`Manifest.with_fields` round-trips a
file byte for byte. Old manifests read too: every field a manifest may lack has
a default, and a field of the wrong type is a :class:`probe.errors.StoreError`
naming it (a run folder is untrusted input).

Its parts are typed all the way down: the plan is a :class:`Plan`, the spec is
read as its experiment's own type with :meth:`Manifest.spec_as` (the spec
classes live in ``experiments/``, which this core module does not import, so
the reader names the type it expects). Every manifest records the version of
its format (``format``, :data:`MANIFEST_FORMAT`); a manifest without one is
format 1, as written before the field existed, and reads the same.

``Manifest`` is also a read-only mapping of the stored JSON (``run.manifest["engine"]``
works as docs/python.md shows); code in this project reads the typed fields.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, overload

from probe.errors import StoreError

__all__ = ["MANIFEST_FORMAT", "EngineRecord", "Manifest", "Plan", "Provenance", "RecordedSpec", "display_name"]

MANIFEST_FORMAT = 2
"""Version of ``manifest.json``. Format 1 (no ``format`` field; probe up to fd38b79): the same fields, the plan
possibly absent (an imported run) or partial. Format 2 adds the field; a reader refuses a newer one."""

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _mapping(doc: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """``doc[key]`` as a mapping: absent or null is empty; anything else than an object is an error naming it."""
    value = doc.get(key)
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise StoreError(f"{where}: {key!r} is {type(value).__name__}, not a JSON object; the manifest is damaged")
    return MappingProxyType(dict(value))


def _optional_int(doc: Mapping[str, Any], key: str) -> int | None:
    value = doc.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def display_name(model: str, think: bool) -> str:
    """What a run is called where no name was given: its model, and ``think`` when it reasoned first."""
    return model + (" think" if think else "")


@dataclass(frozen=True)
class Plan:
    """What a run collects per trial (``probe run``'s --no-readout, --samples, --temperature, --sample-only)."""

    readout: bool = True
    """Read the answer-slot distribution (logit engines only)."""
    samples: int = 0
    """Sampled answers per trial (0 = none)."""
    temperature: float = 1.0
    """Sampling temperature."""
    sample_only: tuple[tuple[str, str], ...] = ()
    """Sample only the trials whose factors match all these (name, value) pairs (empty = all)."""

    def samples_for(self, trial: Any) -> bool:
        """Whether ``trial`` (a :class:`probe.types.Trial`) is sampled under :attr:`sample_only`."""
        return all(trial.factors.get(k) == v for k, v in self.sample_only)

    def __post_init__(self) -> None:
        if self.samples < 0:
            raise ValueError(f"samples must be >= 0, got {self.samples}")
        if not self.readout and self.samples == 0:
            raise ValueError("nothing to collect: ask for readouts or for --samples N")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")

    def to_dict(self) -> dict[str, Any]:
        """The plan as the manifest and the run's identity record it (the run key hashes this)."""
        return {
            "readout": self.readout,
            "sample_only": [list(p) for p in self.sample_only],
            "samples": self.samples,
            "temperature": self.temperature,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], *, where: str = "manifest.json") -> Plan:
        """The plan a manifest recorded (absent fields at their defaults); a damaged one is a StoreError."""
        unknown = sorted(set(doc) - {"readout", "samples", "temperature", "sample_only"})
        readout, samples = doc.get("readout", True), doc.get("samples", 0)
        temperature, only = doc.get("temperature", 1.0), doc.get("sample_only") or []
        pairs_ok = isinstance(only, list) and all(
            isinstance(p, list | tuple) and len(p) == 2 and all(isinstance(v, str) for v in p) for p in only
        )
        if (
            unknown
            or not isinstance(readout, bool)
            or not isinstance(samples, int)
            or isinstance(samples, bool)
            or not isinstance(temperature, int | float)
            or isinstance(temperature, bool)
            or not pairs_ok
        ):
            raise StoreError(f"{where}: 'plan' is not a plan ({dict(doc)!r}); the manifest is damaged")
        try:
            return cls(readout, samples, float(temperature), tuple((str(k), str(v)) for k, v in only))
        except ValueError as e:
            raise StoreError(f"{where}: 'plan' {dict(doc)!r}: {e}") from None


class RecordedSpec(Protocol):
    """An experiment spec type that reads itself back from the manifest (``experiments.ManifestSpec`` and
    ``experiments.cue.CueSpec``): what :meth:`Manifest.spec_as` takes."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Any: ...


SpecT = TypeVar("SpecT", bound=RecordedSpec)


class _Text:
    """A text field of the engine's record, read-only; None where the engine recorded none."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self.key = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = name

    @overload
    def __get__(self, rec: None, owner: type | None = None) -> _Text: ...

    @overload
    def __get__(self, rec: EngineRecord, owner: type | None = None) -> str | None: ...

    def __get__(self, rec: EngineRecord | None, owner: type | None = None) -> _Text | str | None:
        if rec is None:  # the class's attribute: the descriptor, with its doc
            return self
        value = rec.raw.get(self.key)
        return None if value is None else str(value)


@dataclass(frozen=True)
class EngineRecord:
    """What the manifest records of the engine (``engine.describe()``): its kind, its settings and, for a local
    model, the folder it was loaded from."""

    kind: str
    """``hf``, ``vllm``, ``sim``, ``api``, ``server``, ``imported``, ... (``""`` where the manifest has none)."""
    settings: Mapping[str, Any]
    """The engine's settings as recorded (``asdict`` of its settings dataclass)."""
    model_path: str | None
    """The resolved model folder of a local engine."""
    raw: Mapping[str, Any] = field(repr=False)
    """The whole record, as written (dtype, placement, devices, versions, ...)."""

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> EngineRecord:
        settings = _mapping(doc, "settings", "manifest engine")
        path = doc.get("model_path")
        return cls(
            kind=str(doc.get("engine") or ""),
            settings=settings,
            model_path=str(path) if path else None,
            raw=MappingProxyType(dict(doc)),
        )

    def setting(self, name: str, default: Any = None) -> Any:
        """One recorded setting (``default`` when this engine kind has no such setting)."""
        return self.settings.get(name, default)

    @property
    def model(self) -> str | None:
        """The model as the user named it (``--model``), else the name the engine gives, else its folder."""
        named = self.settings.get("model") or self.raw.get("model") or self.model_path
        return str(named) if named else None

    @property
    def think(self) -> bool:
        """Whether the engine reasoned before the answer slot (think mode)."""
        return bool(self.settings.get("think", False))

    @property
    def frame(self) -> str:
        """The prompt frame the trials were rendered in: ``plain`` or ``chat`` (``chat`` where none is recorded: every
        run before frames existed, and engines that render no tokens)."""
        rec = self.raw.get("frame")
        return str(rec.get("used", "chat")) if isinstance(rec, Mapping) else "chat"

    @property
    def frame_asked(self) -> str | None:
        """What ``--frame`` asked for (``auto``, ``chat``, ``plain``), where recorded."""
        rec = self.raw.get("frame")
        return str(rec["asked"]) if isinstance(rec, Mapping) and "asked" in rec else None

    @property
    def system_prompt(self) -> Mapping[str, Any] | None:
        """What trials without a system turn were rendered with (``{"text", "source"}``), where recorded."""
        sp = self.raw.get("system_prompt")
        return sp if isinstance(sp, Mapping) else None

    model_class = _Text("The model's class (``Qwen3ForCausalLM``, ...) where a local engine loaded one.")
    dtype = _Text("The weights' dtype of a local model (None for engines without weights here).")
    head_dtype = _Text("The dtype of the final projection at the positions read, where it differs by design.")
    device = _Text("The device a local model was loaded on.")
    placement = _Text("How the weights were placed (``auto``, ``split``, ... or ``given``).")

    @property
    def params(self) -> Mapping[str, Any]:
        """The planted parameters of the synthetic subject (``sim``); empty for other engines."""
        return _mapping(self.raw, "params", "manifest engine")


@dataclass(frozen=True)
class Provenance:
    """Where an imported run's numbers came from (``probe import``)."""

    kind: str
    """``imported``."""
    source: str | None
    """The imported file, as resolved at import time."""
    source_sha256: str | None
    rows: int | None
    """Data rows in the file."""
    imported_rows: int | None
    ambiguous_rows: tuple[int, ...]
    """File lines left out as ambiguous."""
    imported_at: str | None

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Provenance:
        def text(key: str) -> str | None:
            return None if doc.get(key) is None else str(doc[key])

        amb = doc.get("ambiguous_rows")
        return cls(
            kind=str(doc.get("kind") or ""),
            source=text("source"),
            source_sha256=text("source_sha256"),
            rows=_optional_int(doc, "rows"),
            imported_rows=_optional_int(doc, "imported_rows"),
            ambiguous_rows=tuple(int(a) for a in amb) if isinstance(amb, list) else (),
            imported_at=text("imported_at"),
        )


@dataclass(frozen=True, eq=False)
class Manifest(Mapping[str, Any]):
    """One run's ``manifest.json``, typed (see the module docstring)."""

    experiment: str
    run_key: str
    format: int
    """The manifest format (:data:`MANIFEST_FORMAT`; 1 for a manifest written before the field)."""
    identity: Mapping[str, Any]
    """What defines the run (experiment, spec, plan, model, settings); its hash is the run key."""
    spec: Mapping[str, Any]
    """The experiment's spec as stored; :meth:`spec_as` reads it as its type."""
    plan: Plan | None
    """What the run collected; None for a run that records no plan (an imported one)."""
    engine: EngineRecord
    shard: Mapping[str, Any] | None
    """This folder's shard (index, count) while it is one; None for a whole or merged run."""
    n_trials: int | None
    """Trials in trials.jsonl (None in a manifest written before the count was recorded)."""
    chunk_size: int | None
    trials_sha256: str | None
    provenance: Provenance | None
    """Where an imported run's numbers came from (``probe import``); None for a run probe computed."""
    numeric_floor: Mapping[str, Any] | None
    """The re-read of a few trials alone (:mod:`probe.app.floor`), where measured."""
    merged_from: tuple[str, ...]
    """The shard folders ``probe merge`` joined into this run."""
    _raw: Mapping[str, Any] = field(repr=False)

    # ------------------------------------------------------------ making one
    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], *, where: str = "manifest.json") -> Manifest:
        """The record of a stored manifest; a field of the wrong type is a StoreError naming it."""
        if not isinstance(doc, Mapping):
            raise StoreError(f"{where} is not a manifest (a JSON object)")
        raw = copy.deepcopy(dict(doc))
        version = raw.get("format", 1)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise StoreError(f"{where}: 'format' is {version!r}, not a manifest format; the manifest is damaged")
        if version > MANIFEST_FORMAT:
            raise StoreError(
                f"{where} is manifest format {version}, written by a newer probe; this one reads up to format "
                f"{MANIFEST_FORMAT}: update probe to read it"
            )
        plan = _mapping(raw, "plan", where) if raw.get("plan") is not None else None
        shard = raw.get("shard")
        provenance, floor = raw.get("provenance"), raw.get("numeric_floor")
        merged = raw.get("merged_from") or []
        return cls(
            experiment=str(raw.get("experiment") or ""),
            run_key=str(raw.get("run_key") or ""),
            format=version,
            identity=_mapping(raw, "identity", where),
            spec=_mapping(raw, "spec", where),
            plan=Plan.from_dict(plan, where=where) if plan is not None else None,
            engine=EngineRecord.from_dict(_mapping(raw, "engine", where)),
            shard=shard if isinstance(shard, Mapping) else None,
            n_trials=_optional_int(raw, "n_trials"),
            chunk_size=_optional_int(raw, "chunk_size"),
            trials_sha256=str(raw["trials_sha256"]) if raw.get("trials_sha256") else None,
            provenance=Provenance.from_dict(provenance) if isinstance(provenance, Mapping) else None,
            numeric_floor=floor if isinstance(floor, Mapping) else None,
            merged_from=tuple(str(m) for m in merged) if isinstance(merged, list) else (),
            _raw=MappingProxyType(raw),
        )

    @classmethod
    def build(cls, *, run_key: str, identity: Mapping[str, Any], plan: Plan | None = None, **fields: Any) -> Manifest:
        """A new run's record, in the current format: its key, identity and plan, and the other top-level fields
        (experiment, spec, engine, packages, project_commit, created, shard, n_trials, chunk_size)."""
        doc = {"format": MANIFEST_FORMAT, "run_key": run_key, "identity": dict(identity), **fields}
        return cls.from_dict(doc if plan is None else {**doc, "plan": plan.to_dict()})

    def with_fields(self, **fields: Any) -> Manifest:
        """The same record with top-level ``fields`` added or replaced."""
        return Manifest.from_dict({**self._raw, **fields})

    def to_dict(self) -> dict[str, Any]:
        """The manifest as stored: every key, known or not (a deep copy the caller may change)."""
        return copy.deepcopy(dict(self._raw))

    @property
    def created(self) -> str | None:
        """When the run was started (ISO 8601, UTC)."""
        value = self._raw.get("created")
        return None if value is None else str(value)

    @property
    def project_commit(self) -> str | None:
        """The git commit of probe that wrote the run, where known."""
        value = self._raw.get("project_commit")
        return None if value is None else str(value)

    # ------------------------------------------------------------ what every reader asks
    @property
    def model(self) -> str:
        """The model a run measured (one definition for reports, panels and the viewer)."""
        named = self.engine.model or self.identity.get("model") or self.engine.kind
        return str(named) if named else "?"

    @property
    def think(self) -> bool:
        """Whether the run's engine reasoned first (think mode)."""
        return self.engine.think

    @property
    def display_name(self) -> str:
        """What the run is called where no name was given: :attr:`model`, plus ``think`` in think mode."""
        return display_name(self.model, self.think)

    @property
    def shard_of(self) -> tuple[int, int] | None:
        """(index, count) of this shard folder; None for a whole or merged run (or an unreadable shard record)."""
        rec = self.shard or _EMPTY
        index, count = rec.get("index"), rec.get("count")
        return (index, count) if isinstance(index, int) and isinstance(count, int) else None

    def source_runs(self) -> tuple[Path, ...]:
        """The run folders this run's spec refers to (a follow-up run's source run), in spec order."""
        return tuple(
            Path(v) for v in self.spec.values() if isinstance(v, str) and v and (Path(v) / "manifest.json").is_file()
        )

    @property
    def imported(self) -> bool:
        """A run whose numbers were imported (``probe import``), not computed by probe."""
        return self.provenance is not None and self.provenance.kind == "imported"

    def spec_as(self, kind: type[SpecT]) -> SpecT:
        """The spec as its experiment's type (``man.spec_as(BatterySpec).corpus``); a spec of another experiment,
        or one that type cannot read, is a StoreError naming both."""
        name = getattr(kind, "experiment_name", None)
        stored = self.spec.get("experiment")
        if name is not None and stored != name:
            raise StoreError(f"the run's spec is of experiment {stored!r}, not {name!r} ({kind.__name__})")
        try:
            return kind.from_dict(self.spec)  # type: ignore[no-any-return]
        except (TypeError, ValueError, KeyError) as e:
            raise StoreError(f"the run's spec does not read as {kind.__name__}: {e}") from None

    def identified(self, name: str, default: Any = None) -> Any:
        """One field of the identity (model, think, system_prompt, ...)."""
        return self.identity.get(name, default)

    # ------------------------------------------------------------ the stored JSON, read-only
    def __getitem__(self, key: str) -> Any:
        return self._raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)
