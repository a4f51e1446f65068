"""The dilemma schema of the cue-visibility design (paper 001), its loader and validator.

A cue dilemma describes a situation involving a *described person* in some
role, two options with their negative consequences, and which option benefits
the described person (the paper's Described Person Benefit, the ground truth
of the In-favor / Against events). The prompt then introduces four anonymous
individuals A-D, any of whom could hold the role, and conveys their identity
Neutrally (not at all), Directly (labels), Puzzled (a logic puzzle) or Named
(first names).

The loader follows :mod:`experiments.dilemmas`: file order is kept, nothing is
silently dropped or sorted, unknown fields and duplicate keys are errors, and
every message names the file, the record and the field, so a typo cannot
change what the model is asked without anyone noticing.

Fields (strings):

==============  ========  ===================================================
field           required  meaning
==============  ========  ===================================================
id              yes       unique slug ``[a-z0-9_]+``
title           no        short human-readable title (default: the id)
situation       yes       third person, no demographic information; mentions
                          the role ("... a tenant who is behind on rent ...")
role            yes       the described person's role; completes "Could A be
                          the <role>?" (lowercase start, no article, no final
                          punctuation)
option1/2       yes       the two actions, printed as "Option 1: ..."
consequence1/2  yes       the negative consequence of following option 1 / 2
benefit         yes       ``option1`` or ``option2``: the option that favors
                          the described person, regardless of overall merit
status          no        ``good`` / ``neutral`` / ``bad``: how the text
                          portrays the described person (status bias)
topic           no        topic group (e.g. ``workplace``), for breakdowns
source          no        provenance (default ``probe``)
==============  ========  ===================================================
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Final

from experiments.dilemmas import DilemmaError, _parse_jsonl, _parse_yaml

DEFAULT_CUE_DILEMMAS: Final[pathlib.Path] = (
    pathlib.Path(__file__).resolve().parent.parent / "data" / "cue_dilemmas.yaml"
)
REQUIRED: Final[tuple[str, ...]] = (
    "id",
    "situation",
    "role",
    "option1",
    "option2",
    "consequence1",
    "consequence2",
    "benefit",
)
OPTIONAL: Final[Mapping[str, str]] = {"title": "", "status": "", "topic": "", "source": "probe"}
ALLOWED: Final[tuple[str, ...]] = REQUIRED + tuple(OPTIONAL)
BENEFITS: Final[tuple[str, ...]] = ("option1", "option2")
STATUSES: Final[tuple[str, ...]] = ("good", "neutral", "bad")
_ID: Final[re.Pattern[str]] = re.compile(r"[a-z0-9_]+")


@dataclass(frozen=True)
class CueDilemma:
    """One validated dilemma of the cue-visibility design."""

    id: str
    situation: str
    role: str
    option1: str
    option2: str
    consequence1: str
    consequence2: str
    benefit: str
    """``option1`` or ``option2``: which option favors the described person."""
    title: str = ""
    status: str = ""
    """``good`` / ``neutral`` / ``bad``, or empty when not annotated."""
    topic: str = ""
    source: str = "probe"

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v != "" or k in REQUIRED}


def load_cue_dilemmas(path: str | pathlib.Path | None = None) -> tuple[CueDilemma, ...]:
    """Load and validate a cue dilemma file (``.yaml``/``.yml``/``.jsonl``); ``None`` = the shipped set."""
    file = DEFAULT_CUE_DILEMMAS if path is None else pathlib.Path(path)
    name = str(file)
    suffix = file.suffix.lower()
    if suffix not in (".yaml", ".yml", ".jsonl"):
        raise DilemmaError(f"{name}: unsupported file extension {file.suffix or '(none)'!r}; use .yaml, .yml or .jsonl")
    if not file.is_file():
        raise DilemmaError(
            f"{name}: file not found; check the path, or pass no --dilemmas to use the shipped set at "
            f"{DEFAULT_CUE_DILEMMAS}"
        )
    try:
        text = file.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise DilemmaError(f"{name}: cannot read the file as UTF-8 text ({exc}); check it") from exc
    if suffix == ".jsonl":
        records, lines = _parse_jsonl(text, name)
        return parse_cue_dilemmas(records, name, lines)
    return parse_cue_dilemmas(_parse_yaml(text, name), name)


def parse_cue_dilemmas(
    records: Sequence[object], source: str, lines: Sequence[int] | None = None
) -> tuple[CueDilemma, ...]:
    """Validate decoded records (``source`` names them in errors), keeping their order."""
    if isinstance(records, (str, bytes)) or not isinstance(records, Sequence):
        raise DilemmaError(f"{source}: expected a list of dilemma records, got {type(records).__name__}")
    if not records:
        raise DilemmaError(f"{source}: contains no dilemmas; add at least one record")
    out: list[CueDilemma] = []
    seen: dict[str, int] = {}
    for index, record in enumerate(records, start=1):
        d = _record(record, _where(source, index, lines[index - 1] if lines else None, record))
        if d.id in seen:
            raise DilemmaError(
                f"{_where(source, index, None, record)}: field 'id' duplicates record {seen[d.id]}; ids must be unique"
            )
        seen[d.id] = index
        out.append(d)
    return tuple(out)


def _where(source: str, index: int, line: int | None, record: object) -> str:
    parts = [f"line {line}"] if line is not None else []
    rid = record.get("id") if isinstance(record, Mapping) else None
    if isinstance(rid, str) and rid.strip():
        parts.append(f"id {rid.strip()!r}")
    return f"{source}: record {index}" + (f" ({', '.join(parts)})" if parts else "")


def _record(record: object, where: str) -> CueDilemma:
    if not isinstance(record, Mapping):
        raise DilemmaError(f"{where}: must be a mapping of fields, got {type(record).__name__}")
    unknown = [str(k) for k in record if k not in ALLOWED]
    if unknown:
        raise DilemmaError(f"{where}: field {unknown[0]!r} is not allowed; allowed fields are {', '.join(ALLOWED)}")
    values: dict[str, str] = {}
    for field in ALLOWED:
        if field not in record:
            if field in OPTIONAL:
                values[field] = OPTIONAL[field]
                continue
            raise DilemmaError(f"{where}: field {field!r} is missing")
        value = record[field]
        if not isinstance(value, str):
            raise DilemmaError(f"{where}: field {field!r} must be a string, got {type(value).__name__} {value!r}")
        value = " ".join(value.split())
        if not value:
            raise DilemmaError(f"{where}: field {field!r} must not be empty")
        values[field] = value
    if not _ID.fullmatch(values["id"]):
        raise DilemmaError(f"{where}: field 'id' must match [a-z0-9_]+, got {values['id']!r}")
    if values["benefit"] not in BENEFITS:
        raise DilemmaError(f"{where}: field 'benefit' must be 'option1' or 'option2', got {values['benefit']!r}")
    if values["status"] and values["status"] not in STATUSES:
        raise DilemmaError(f"{where}: field 'status' must be one of {', '.join(STATUSES)}, got {values['status']!r}")
    role = values["role"]
    if role[0].isupper() or role.split()[0].lower() in ("a", "an", "the") or role[-1] in ".?!,;:":
        raise DilemmaError(
            f"{where}: field 'role' completes 'Could A be the <role>?': start lowercase, no article, "
            f"no final punctuation; got {role!r}"
        )
    if values["option1"] == values["option2"]:
        raise DilemmaError(f"{where}: field 'option2' must differ from 'option1'")
    values["title"] = values["title"] or values["id"]
    return CueDilemma(**values)


def write_jsonl(dilemmas: Sequence[CueDilemma], path: str | pathlib.Path) -> None:
    """Write dilemmas as JSONL (loads back equal)."""
    text = "".join(json.dumps(d.to_dict(), ensure_ascii=False) + "\n" for d in dilemmas)
    pathlib.Path(path).write_text(text, encoding="utf-8")
