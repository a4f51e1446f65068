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
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from experiments.dilemmas import DilemmaError, parse_records, read_records, string_fields

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
    records, lines = read_records(file, DEFAULT_CUE_DILEMMAS)
    return parse_cue_dilemmas(records, str(file), lines)


def parse_cue_dilemmas(
    records: Sequence[object], source: str, lines: Sequence[int] | None = None
) -> tuple[CueDilemma, ...]:
    """Validate decoded records (``source`` names them in errors), keeping their order."""
    return parse_records(records, source, lines, _record)


def _record(record: Mapping[Any, Any], where: str) -> CueDilemma:
    # Runs of white space (YAML line breaks included) fold to one space.
    values = string_fields(record, where, ALLOWED, OPTIONAL, lambda v: " ".join(v.split()))
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
