"""Prompt designs and cue templates of the influence audit, loaded from YAML.

The paper (000) is a set of *wordings*: a base prompt per benchmark and one
sentence (or system prompt, or demonstration turns) per influence type, each
with a matched A/B variant. Keeping them as data means a user can reproduce
the paper's exact wording, or test their own, without touching code; so the
loader is strict (unknown keys, unknown template fields and duplicate keys are
errors that name the file and the field) because a silently ignored typo would
change what the model is asked.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from experiments.dilemmas import _StrictLoader  # the project's duplicate-key-rejecting YAML loader
from probe.errors import ProbeError

DATA: Final[Path] = Path(__file__).resolve().parent.parent / "data" / "influence"
"""The shipped designs: ``triage.yaml``, ``bbq.yaml``, ``dd.yaml``."""

CUE_KINDS: Final[tuple[str, ...]] = ("sentence", "system", "turns", "random")
"""sentence: one sentence in the user message; system: replaces the system prompt; turns: prior demonstrations;
random: a control context that names no group (paper 000, J.4), placed like a sentence."""
DIRECTED_KINDS: Final[tuple[str, ...]] = ("sentence", "system", "turns")
"""The kinds that name a group (the cues proper); ``--influences`` defaults to the cues of these kinds."""
VARIANTS: Final[tuple[str, ...]] = ("cue", "placebo", "negated")
SLOTS: Final[tuple[str, ...]] = ("start", "after_question", "end")
"""Where a sentence cue can go: named fields of the user template."""
CUE_FIELDS: Final[frozenset[str]] = frozenset({"target", "other", "target_role", "other_role"})
RANDOM_FIELDS: Final[frozenset[str]] = frozenset({"gibberish"})
"""The fields of a random context's template: ``{gibberish}``, a string derived from the trial id."""
WORDING_SEP: Final[str] = "~"
"""Joins a cue and its paraphrase in the ``influence`` factor of a paraphrase arm (``survey~poll``)."""
PAPER_WORDING: Final[str] = "paper"
"""The name of a cue's own wording (its ``text``) among its paraphrases (``--wordings``)."""
STEP_BY_STEP: Final[str] = "Think step-by-step before answering."
"""The chain-of-thought instruction of paper 000's step-by-step condition (Table 2), the default ``step_by_step``."""
_COMMON_KEYS: Final[tuple[str, ...]] = ("system", "user", "labels", "positions", "brackets", "cues")
_OPTIONAL_KEYS: Final[tuple[str, ...]] = ("step_by_step",)
_CUE_KEYS: Final[frozenset[str]] = frozenset(
    {"kind", "position", "bracket", "text", "placebo", "negated", "paraphrases"}
)


class DesignError(ProbeError, ValueError):
    """A design file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Position:
    """A named place for a sentence cue: the user-template slot and how the cue is joined there."""

    name: str
    """Its name in the design (``positions.<name>``), as ``--positions`` takes it."""
    slot: str
    """The user-template field it fills: one of :data:`SLOTS`."""
    format: str
    """Format string with the field ``{cue}`` (e.g. ``"\\n\\n{cue}"`` for a blank line before)."""


@dataclass(frozen=True)
class Cue:
    """One influence type: its kind, its default position and bracket, and its templates."""

    name: str
    """The influence type (``cues.<name>``), as ``--influences`` takes it."""
    kind: str
    """One of :data:`CUE_KINDS`."""
    position: str = ""
    """A sentence cue's own position (a key of :attr:`Design.positions`); empty for the other kinds."""
    bracket: str = ""
    """A sentence cue's own bracket style (a key of :attr:`Design.brackets`); empty for the other kinds."""
    text: str = ""
    """The cue template, with the fields of :data:`CUE_FIELDS`; empty for a turns cue."""
    placebo: str = ""
    """The placebo template (an irrelevant sentence naming the side); empty = no placebo."""
    negated: str = ""
    """The negated template (points away from the side it names); empty = no negated variant."""
    paraphrases: Mapping[str, str] = field(default_factory=dict)
    """Lexical paraphrases of ``text``: name -> template (same fields), in design order; ``--wordings`` picks them."""

    def wording(self, name: str) -> str:
        """The cue template of wording ``name``: :data:`PAPER_WORDING` is ``text``, else a paraphrase."""
        if name == PAPER_WORDING:
            return self.text
        if name not in self.paraphrases:
            raise DesignError(
                f"cue {self.name!r} has no paraphrase {name!r}; it has {[PAPER_WORDING, *self.paraphrases]}"
            )
        return self.paraphrases[name]

    def template(self, variant: str) -> str:
        """The template of ``variant`` (cue, placebo or negated); empty if the cue has none."""
        if variant == "cue":
            return self.text
        if variant == "placebo":
            return self.placebo
        if variant == "negated":
            return self.negated
        raise ValueError(f"cue variant must be one of {VARIANTS}, got {variant!r}")

    def has(self, variant: str) -> bool:
        """Whether this cue can be run as ``variant`` (few-shot turns exist only as the cue itself)."""
        if self.kind in ("turns", "random"):
            return variant == "cue"
        return bool(self.template(variant))


@dataclass(frozen=True)
class Design:
    """A benchmark's prompt design: system prompt, user template, labels, cue placements and cues."""

    source: str
    """The design file, as error messages name it."""
    system: str
    """The system prompt; empty = none."""
    user: str
    """The user template: the benchmark's fields, ``option_1``/``option_2``, ``label_1``/``label_2`` and slots."""
    labels: tuple[str, str]
    """The answer labels of the first and second printed option."""
    positions: Mapping[str, Position]
    """The named places a sentence cue can go, in design order."""
    brackets: Mapping[str, str]
    """Bracket style -> format string with ``{cue}``."""
    cues: Mapping[str, Cue]
    """The influence types, in design order."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """The benchmark's own sections (triage: option, factors, few_shot; bbq: groups...; dd: roles...)."""
    step_by_step: str = STEP_BY_STEP
    """The instruction ``--step-by-step`` prepends to the last user message (optional key; default the paper's)."""

    def cue(self, name: str) -> Cue:
        if name not in self.cues:
            raise DesignError(f"{self.source}: unknown influence type {name!r}; the design defines {list(self.cues)}")
        return self.cues[name]


def template_fields(text: str, where: str) -> set[str]:
    """The field names a format string uses; a malformed template is an error naming ``where``."""
    try:
        return {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
    except ValueError as e:
        raise DesignError(f"{where}: malformed template ({e}); double literal braces as {{{{ and }}}}") from None


def _check_fields(text: str, allowed: set[str] | frozenset[str], where: str, required: Sequence[str] = ()) -> None:
    used = template_fields(text, where)
    bad = sorted(f for f in used if f not in allowed)
    if bad:
        raise DesignError(f"{where}: unknown template field(s) {bad}; allowed: {sorted(allowed)}")
    missing = [f for f in required if f not in used]
    if missing:
        raise DesignError(f"{where}: the template must use {missing}")


def _str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise DesignError(f"{where} must be a string, got {type(value).__name__} {value!r}")
    return value


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise DesignError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def read_yaml(path: Path) -> Any:
    """Parse a YAML file strictly (duplicate keys are errors)."""
    if not path.is_file():
        raise DesignError(f"{path}: design file not found; pass the path of a YAML design (see {DATA})")
    try:
        return yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise DesignError(f"{path}: invalid YAML{where}: {getattr(e, 'problem', None) or e}") from None


def load_design(
    path: str | Path | None,
    benchmark: str,
    *,
    user_fields: Sequence[str],
    extra_keys: Sequence[str],
) -> Design:
    """Load and validate a design file (``None`` = the shipped ``<benchmark>.yaml``).

    ``user_fields`` are the benchmark's own fields of the user template (e.g.
    ``context`` and ``question`` for BBQ); ``extra_keys`` its own top-level
    sections, returned unparsed in :attr:`Design.extra` for the benchmark to
    validate.
    """
    file = DATA / f"{benchmark}.yaml" if path is None else Path(path)
    src = str(file)
    doc = _mapping(read_yaml(file), src)
    allowed = [*_COMMON_KEYS, *_OPTIONAL_KEYS, *extra_keys]
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        raise DesignError(f"{src}: unknown top-level key(s) {unknown}; allowed: {allowed}")
    missing = [k for k in (*_COMMON_KEYS, *extra_keys) if k not in doc]
    if missing:
        raise DesignError(f"{src}: missing top-level key(s) {missing}")
    system = _str(doc["system"] or "", f"{src}: system")
    user = _str(doc["user"], f"{src}: user")
    _check_fields(
        user,
        {*SLOTS, "option_1", "option_2", "label_1", "label_2", *user_fields},
        f"{src}: user",
        required=("option_1", "option_2", *user_fields),
    )
    labels = doc["labels"]
    if not (isinstance(labels, list) and len(labels) == 2 and all(isinstance(x, str) and x for x in labels)):
        raise DesignError(f"{src}: labels must be a list of two non-empty strings, got {labels!r}")
    if labels[0] == labels[1]:
        raise DesignError(f"{src}: labels must differ, got {labels!r}")
    positions: dict[str, Position] = {}
    for name, spec in _mapping(doc["positions"], f"{src}: positions").items():
        where = f"{src}: positions.{name}"
        spec = _mapping(spec, where)
        if set(spec) != {"slot", "format"}:
            raise DesignError(f"{where} must have exactly the keys slot and format, got {sorted(spec)}")
        slot = _str(spec["slot"], f"{where}.slot")
        if slot not in SLOTS:
            raise DesignError(f"{where}.slot must be one of {SLOTS}, got {slot!r}")
        if slot not in template_fields(user, f"{src}: user"):
            raise DesignError(f"{where}: the user template has no {{{slot}}} field for this position")
        fmt = _str(spec["format"], f"{where}.format")
        _check_fields(fmt, {"cue"}, f"{where}.format", required=("cue",))
        positions[str(name)] = Position(str(name), slot, fmt)
    brackets: dict[str, str] = {}
    for name, fmt in _mapping(doc["brackets"], f"{src}: brackets").items():
        where = f"{src}: brackets.{name}"
        _check_fields(_str(fmt, where), {"cue"}, where, required=("cue",))
        brackets[str(name)] = fmt
    if "default" in positions or "default" in brackets:
        raise DesignError(f"{src}: 'default' is reserved (it means each cue's own position/bracket); rename it")
    cues: dict[str, Cue] = {}
    for name, spec in _mapping(doc["cues"], f"{src}: cues").items():
        cues[str(name)] = _parse_cue(str(name), _mapping(spec, f"{src}: cues.{name}"), src, positions, brackets)
    if not cues:
        raise DesignError(f"{src}: cues is empty; define at least one influence type")
    return Design(
        source=src,
        system=system,
        user=user,
        labels=(labels[0], labels[1]),
        positions=positions,
        brackets=brackets,
        cues=cues,
        extra={k: doc[k] for k in extra_keys},
        step_by_step=_step_by_step(doc, src),
    )


def _step_by_step(doc: Mapping[str, Any], src: str) -> str:
    text = _str(doc.get("step_by_step", STEP_BY_STEP), f"{src}: step_by_step")
    _check_fields(text, set(), f"{src}: step_by_step")
    if not text.strip():
        raise DesignError(f"{src}: step_by_step is empty; drop the key for the paper's {STEP_BY_STEP!r}")
    return text


def _parse_cue(
    name: str, spec: Mapping[str, Any], src: str, positions: Mapping[str, Position], brackets: Mapping[str, str]
) -> Cue:
    where = f"{src}: cues.{name}"
    bad = sorted(set(spec) - _CUE_KEYS)
    if bad:
        raise DesignError(f"{where}: unknown key(s) {bad}; allowed: {sorted(_CUE_KEYS)}")
    kind = spec.get("kind")
    if kind not in CUE_KINDS:
        raise DesignError(f"{where}.kind must be one of {CUE_KINDS}, got {kind!r}")
    texts = {k: _str(spec.get(k, ""), f"{where}.{k}") for k in ("text", "placebo", "negated")}
    if kind == "turns":
        extra = sorted(k for k in ("text", "placebo", "negated", "position", "bracket", "paraphrases") if spec.get(k))
        if extra:
            raise DesignError(
                f"{where}: a turns cue (few-shot) takes no {extra}; its demonstrations are built per item"
            )
        return Cue(name, kind)
    if not texts["text"]:
        raise DesignError(f"{where}.text is missing")
    if kind == "random":
        _check_random(spec, texts, where)
    else:
        for k, t in texts.items():
            if t:
                _check_named(t, f"{where}.{k}")
    paraphrases = _paraphrases(spec.get("paraphrases"), where) if kind != "random" else {}
    position = bracket = ""
    if kind in ("sentence", "random"):
        position = _str(spec.get("position", ""), f"{where}.position")
        bracket = _str(spec.get("bracket", "none"), f"{where}.bracket")
        if position not in positions:
            raise DesignError(f"{where}.position must be one of {list(positions)}, got {position!r}")
        if bracket not in brackets:
            raise DesignError(f"{where}.bracket must be one of {list(brackets)}, got {bracket!r}")
    elif spec.get("position") or spec.get("bracket"):
        raise DesignError(f"{where}: a system cue replaces the system prompt; it takes no position or bracket")
    return Cue(name, kind, position, bracket, texts["text"], texts["placebo"], texts["negated"], paraphrases)


def _check_named(text: str, where: str) -> None:
    """A cue template (text, placebo, negated, paraphrase) must name the group it points at."""
    _check_fields(text, CUE_FIELDS, where)
    if not template_fields(text, where) & {"target", "target_role"}:
        raise DesignError(f"{where}: the template must name the group, with {{target}} or {{target_role}}")


def _check_random(spec: Mapping[str, Any], texts: Mapping[str, str], where: str) -> None:
    """A random context (J.4) names no group: only ``{gibberish}``, no placebo, negated or paraphrases."""
    bad = sorted(k for k in ("placebo", "negated", "paraphrases") if spec.get(k))
    if bad:
        raise DesignError(f"{where}: a random context names no group, so it takes no {bad}")
    used = template_fields(texts["text"], f"{where}.text")
    named = sorted(used & CUE_FIELDS)
    if named:
        raise DesignError(f"{where}.text: a random context names no group, got {named}; use kind: sentence for a cue")
    _check_fields(texts["text"], RANDOM_FIELDS, f"{where}.text")


def _paraphrases(raw: object, where: str) -> dict[str, str]:
    """A cue's ``paraphrases``: name -> template, each naming the group like the cue's text."""
    if raw is None:
        return {}
    out: dict[str, str] = {}
    for name, text in _mapping(raw, f"{where}.paraphrases").items():
        w = f"{where}.paraphrases.{name}"
        if str(name) == PAPER_WORDING or WORDING_SEP in str(name):
            raise DesignError(f"{w}: {PAPER_WORDING!r} and names with {WORDING_SEP!r} are reserved; rename it")
        _check_named(_str(text, w), w)
        out[str(name)] = text
    return out


def article(word: str) -> str:
    """``a`` or ``an`` for ``word`` by its first letter (good enough for group and value names; override in YAML)."""
    return "an" if word[:1].lower() in "aeiou" else "a"
