"""The probe's dilemma set: schema, loader and validator.

Every experiment crosses prompt factors over the same list of dilemmas, so the
list has to be loaded identically on every run and machine: the order is the
file's order, nothing is sorted or de-duplicated silently, and any malformed
record stops the run with a message naming the file, the record and the field.
A typo in a dilemma file that was quietly ignored would change what the model
is asked without anyone noticing, which is exactly the kind of irrelevant
variation the probe exists to measure.

Supported formats:

* ``.yaml`` / ``.yml``: a list of mappings, or a mapping whose only key is
  ``dilemmas`` holding that list (the shipped file uses the latter so that it
  can carry a commented header).
* ``.jsonl``: one JSON object per line; blank lines are skipped.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, Protocol, TypeVar

import yaml

from probe.errors import ProbeError

__all__ = [
    "ALLOWED_FIELDS",
    "DEFAULT_DILEMMAS",
    "KINDS",
    "OPTIONAL_FIELDS",
    "POLES",
    "REQUIRED_FIELDS",
    "Dilemma",
    "DilemmaError",
    "load_dilemmas",
    "parse_dilemmas",
    "parse_records",
    "read_records",
    "string_fields",
]

Pole = Literal["action", "complement"]

#: The two courses of action a dilemma offers; the CBR pole is one of them.
POLES: Final[tuple[str, ...]] = ("action", "complement")

#: Coarse dilemma families, used to balance and stratify analyses.
KINDS: Final[tuple[str, ...]] = (
    "sacrificial",
    "omission",
    "redistribution",
    "honesty",
    "end_of_life",
    "other",
)

#: Fields every record must carry, in the order ``Dilemma.to_dict`` emits them.
REQUIRED_FIELDS: Final[tuple[str, ...]] = (
    "id",
    "title",
    "kind",
    "story",
    "action",
    "complement",
    "cbr_pole",
)
#: Fields a record may omit (with their defaults).
OPTIONAL_FIELDS: Final[Mapping[str, str]] = {"source": "probe"}
#: Everything a record may contain; anything else is treated as a typo.
ALLOWED_FIELDS: Final[tuple[str, ...]] = REQUIRED_FIELDS + tuple(OPTIONAL_FIELDS)

_ID_PATTERN: Final[re.Pattern[str]] = re.compile(r"[a-z0-9_]+")
# Action phrases are spliced into templates such as "Is it acceptable to {}?",
# so a trailing mark would double up with the template's own punctuation.
_TRAILING_PUNCTUATION: Final[str] = ".?!,;:"
_YAML_SUFFIXES: Final[frozenset[str]] = frozenset({".yaml", ".yml"})
_JSONL_SUFFIXES: Final[frozenset[str]] = frozenset({".jsonl"})

#: The dilemma set shipped with the probe. Resolved from this module's own
#: location, so it works from a checkout and from an installed package alike.
DEFAULT_DILEMMAS: Final[pathlib.Path] = pathlib.Path(__file__).resolve().parent / "data" / "dilemmas.yaml"


class DilemmaError(ProbeError, ValueError):
    """A dilemma file cannot be read or one of its records is invalid.

    Subclasses ``ValueError`` so callers that already treat bad input as a
    ``ValueError`` keep working. The message is always a single line naming
    the file and, where it applies, the record and field, so it can be shown
    to the user as is.
    """


@dataclass(frozen=True)
class Dilemma:
    """One validated dilemma.

    Frozen so that a dilemma can be shared between experiment conditions and
    used as a dict key without anyone mutating the wording mid-run.
    """

    id: str
    title: str
    kind: str
    story: str
    action: str
    complement: str
    cbr_pole: Pole
    source: str = "probe"

    def pole_text(self, pole: str) -> str:
        """Return the verb phrase for ``pole`` (``"action"`` or ``"complement"``).

        Prompt builders address the two options by pole name rather than by
        attribute so that the pole can itself be a crossed factor.
        """
        if pole == "action":
            return self.action
        if pole == "complement":
            return self.complement
        raise ValueError(f"dilemma {self.id!r}: pole must be 'action' or 'complement', got {pole!r}")

    @property
    def cbr_text(self) -> str:
        """The verb phrase of the cost-benefit-reasoning pole, for scoring."""
        return self.pole_text(self.cbr_pole)

    def to_dict(self) -> dict[str, str]:
        """Plain ``dict`` in schema field order, e.g. for writing JSONL.

        ``load_dilemmas`` on the written records gives back equal objects.
        """
        return {name: str(value) for name, value in asdict(self).items()}


def load_dilemmas(path: str | pathlib.Path | None = None) -> tuple[Dilemma, ...]:
    """Load and validate a dilemma file; ``None`` means the shipped set.

    Returns the dilemmas in file order. Raises ``DilemmaError`` for a missing,
    unreadable or unparsable file, an unsupported extension, an empty set, or
    any invalid record.
    """
    file = DEFAULT_DILEMMAS if path is None else pathlib.Path(path)
    records, lines = read_records(file, DEFAULT_DILEMMAS)
    return _parse(records, str(file), lines)


def select_dilemmas(dilemmas: tuple[Dilemma, ...], ids: Sequence[str]) -> tuple[Dilemma, ...]:
    """The dilemmas named in ``ids`` (``--items``), in file order; all of them when ``ids`` is empty.

    An unknown id fails here, listing the known ones, before any trial is built.
    """
    if not ids:
        return dilemmas
    known = {d.id for d in dilemmas}
    missing = [i for i in ids if i not in known]
    if missing:
        raise ValueError(f"unknown dilemma ids {missing}; known: {sorted(known)}")
    return tuple(d for d in dilemmas if d.id in ids)


def parse_dilemmas(records: list[object], source: str) -> tuple[Dilemma, ...]:
    """Validate already-decoded records; ``source`` names them in errors.

    Useful when dilemmas come from somewhere other than a file on disk (a test,
    a config blob). ``source`` is usually a file name.
    """
    return _parse(records, source, None)


# --------------------------------------------------------------------------
# reading


def read_records(file: pathlib.Path, shipped: pathlib.Path) -> tuple[list[object], list[int] | None]:
    """The raw records of a ``.yaml``/``.yml`` or ``.jsonl`` record file, and each one's line (JSONL only).

    Shared by every dilemma schema (this one and :mod:`experiments.cue.schema`);
    ``shipped`` is the set used when no path is given, named in the not-found message.
    """
    name = str(file)
    suffix = file.suffix.lower()
    if suffix not in _YAML_SUFFIXES | _JSONL_SUFFIXES:
        raise DilemmaError(f"{name}: unsupported file extension {file.suffix or '(none)'!r}; use .yaml, .yml or .jsonl")
    text = _read_text(file, shipped)
    if suffix in _JSONL_SUFFIXES:
        return _parse_jsonl(text, name)
    return _parse_yaml(text, name), None


def _read_text(file: pathlib.Path, shipped: pathlib.Path) -> str:
    """Read ``file`` as UTF-8 (a BOM is tolerated), mapping OS errors to DilemmaError."""
    name = str(file)
    if not file.exists():
        raise DilemmaError(
            f"{name}: file not found; check the path, or pass no path to use the shipped set at {shipped}"
        )
    if not file.is_file():
        raise DilemmaError(f"{name}: not a regular file; pass the path of a .yaml or .jsonl file")
    try:
        return file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DilemmaError(f"{name}: not valid UTF-8 (byte {exc.start}); re-save the file as UTF-8") from exc
    except OSError as exc:
        raise DilemmaError(f"{name}: cannot read file ({exc.strerror or exc}); check its permissions") from exc


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML loader that rejects duplicate mapping keys.

    Plain PyYAML keeps the last of two equal keys, so a record with two
    ``action:`` lines would silently lose one; here that is an error.
    """


def _construct_strict_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    """Build a mapping like SafeLoader does, but fail on a repeated key."""
    loader.flatten_mapping(node)
    seen: dict[Hashable, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, Hashable) and key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first on line {seen[key] + 1})",
                key_node.start_mark,
            )
        if isinstance(key, Hashable):
            seen[key] = key_node.start_mark.line
    mapping: dict[Any, Any] = loader.construct_mapping(node, deep=True)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_strict_mapping)


def _parse_yaml(text: str, name: str) -> list[object]:
    """Decode YAML text into the list of raw records."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DilemmaError(f"{name}: invalid YAML{where}: {problem}; fix the syntax") from exc
    if data is None:
        raise DilemmaError(f"{name}: file is empty; it must hold a list of dilemma records")
    if isinstance(data, Mapping):
        extra = sorted(str(k) for k in data if k != "dilemmas")
        if "dilemmas" not in data:
            raise DilemmaError(
                f"{name}: top-level mapping has no 'dilemmas' key; put the records "
                "under 'dilemmas:' or make the file a plain list"
            )
        if extra:
            raise DilemmaError(
                f"{name}: unknown top-level key(s) {', '.join(map(repr, extra))}; only 'dilemmas' is allowed"
            )
        data = data["dilemmas"]
    if not isinstance(data, list):
        raise DilemmaError(f"{name}: expected a list of dilemma records, got {type(data).__name__}")
    return data


def _parse_jsonl(text: str, name: str) -> tuple[list[object], list[int]]:
    """Decode JSONL text; returns the records and the line number of each."""
    records: list[object] = []
    lines: list[int] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, object_pairs_hook=_strict_json_object)
        except (json.JSONDecodeError, _DuplicateKeyError) as exc:
            detail = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise DilemmaError(
                f"{name}: line {lineno}: invalid JSON ({detail}); each non-blank line must be one JSON object"
            ) from exc
        records.append(record)
        lines.append(lineno)
    return records, lines


class _DuplicateKeyError(ValueError):
    """A JSON object repeats a key (json.loads would keep only the last)."""


def _strict_json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKeyError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


# --------------------------------------------------------------------------
# validation


class _Record(Protocol):
    @property
    def id(self) -> str: ...


RecordT = TypeVar("RecordT", bound=_Record)


def parse_records(
    records: Sequence[object],
    source: str,
    lines: Sequence[int] | None,
    parse: Callable[[Mapping[Any, Any], str], RecordT],
) -> tuple[RecordT, ...]:
    """Validate every record with ``parse(record, where)``, preserving order; ids must be unique.

    The frame every dilemma schema shares (this one and :mod:`experiments.cue.schema`):
    a non-empty list of mappings, each named in errors as ``where`` (file, record
    number, line and id where known), and no id twice. ``parse`` checks one
    record's own fields (see :func:`string_fields`).
    """
    if not isinstance(records, Sequence) or isinstance(records, (str, bytes)):
        raise DilemmaError(f"{source}: expected a list of dilemma records, got {type(records).__name__}")
    if not records:
        raise DilemmaError(f"{source}: contains no dilemmas; add at least one record")
    out: list[RecordT] = []
    first_seen: dict[str, int] = {}
    for index, record in enumerate(records, start=1):
        line = lines[index - 1] if lines is not None else None
        if not isinstance(record, Mapping):
            raise DilemmaError(
                f"{_where(source, index, line, None)}: must be a mapping of fields, got {type(record).__name__}"
            )
        # Name the record by its id in later messages, when the id is usable.
        raw_id = record.get("id")
        where = _where(source, index, line, raw_id.strip() if isinstance(raw_id, str) and raw_id.strip() else None)
        parsed = parse(record, where)
        if parsed.id in first_seen:
            raise DilemmaError(
                f"{_where(source, index, line, parsed.id)}: field 'id' duplicates "
                f"record {first_seen[parsed.id]}; ids must be unique"
            )
        first_seen[parsed.id] = index
        out.append(parsed)
    return tuple(out)


def _where(source: str, index: int, line: int | None, record_id: str | None) -> str:
    """Message prefix such as ``f.yaml: record 3 (id 'footbridge')``."""
    parts = []
    if line is not None:
        parts.append(f"line {line}")
    if record_id is not None:
        parts.append(f"id {record_id!r}")
    detail = f" ({', '.join(parts)})" if parts else ""
    return f"{source}: record {index}{detail}"


def string_fields(
    record: Mapping[Any, Any],
    where: str,
    allowed: Sequence[str],
    optional: Mapping[str, str],
    clean: Callable[[str], str],
) -> dict[str, str]:
    """A record's fields, all strings: ``allowed`` only, every one present unless ``optional`` (its default).

    Each value is passed through ``clean`` (e.g. ``str.strip``) and must not be
    empty then; ``id`` must be a slug ``[a-z0-9_]+``. Every error names ``where``
    and the field.
    """
    unknown = [str(key) for key in record if key not in allowed]
    if unknown:
        raise DilemmaError(f"{where}: field {unknown[0]!r} is not allowed; allowed fields are {', '.join(allowed)}")
    values: dict[str, str] = {}
    for field in allowed:
        if field not in record:
            if field in optional:
                values[field] = optional[field]
                continue
            raise DilemmaError(f"{where}: field {field!r} is missing")
        value = record[field]
        if not isinstance(value, str):
            raise DilemmaError(f"{where}: field {field!r} must be a string, got {type(value).__name__} {value!r}")
        value = clean(value)
        if not value:
            raise DilemmaError(f"{where}: field {field!r} must not be empty")
        values[field] = value
    if not _ID_PATTERN.fullmatch(values["id"]):
        raise DilemmaError(f"{where}: field 'id' must match [a-z0-9_]+, got {values['id']!r}")
    return values


def _parse(records: Sequence[object], source: str, lines: Sequence[int] | None) -> tuple[Dilemma, ...]:
    """Validate every record and build the dilemmas, preserving order."""
    return parse_records(records, source, lines, _parse_record)


def _parse_record(record: Mapping[Any, Any], where: str) -> Dilemma:
    """Validate one raw record and turn it into a ``Dilemma``."""
    values = string_fields(record, where, ALLOWED_FIELDS, OPTIONAL_FIELDS, str.strip)
    if values["kind"] not in KINDS:
        raise DilemmaError(f"{where}: field 'kind' must be one of {', '.join(KINDS)}, got {values['kind']!r}")
    if values["cbr_pole"] not in POLES:
        raise DilemmaError(f"{where}: field 'cbr_pole' must be 'action' or 'complement', got {values['cbr_pole']!r}")
    for field in POLES:
        phrase = values[field]
        if phrase[-1] in _TRAILING_PUNCTUATION:
            raise DilemmaError(
                f"{where}: field {field!r} must not end with punctuation "
                f"(it completes 'Should you ...?'), got {phrase!r}"
            )
        if phrase[0].isupper():
            raise DilemmaError(
                f"{where}: field {field!r} must start lowercase (it completes 'Should you ...?'), got {phrase!r}"
            )
    if values["action"] == values["complement"]:
        raise DilemmaError(f"{where}: field 'complement' must differ from 'action'")

    return Dilemma(
        id=values["id"],
        title=values["title"],
        kind=values["kind"],
        story=values["story"],
        action=values["action"],
        complement=values["complement"],
        cbr_pole="action" if values["cbr_pole"] == "action" else "complement",
        source=values["source"],
    )
