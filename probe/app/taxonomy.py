"""The coding tasks' data files: taxonomies (codes and judge prompt) and hand-labelled validation sets.

A taxonomy is a YAML data file (``experiments/data/taxonomies/<task>.yaml``):
the codes (id, label, definition, example) and the judge prompt template;
:func:`load_taxonomy` validates it and names the file, the code and the field
of any error. A validation set (``experiments/data/validation/<task>.yaml``)
holds texts a person coded, each with its gold code (:func:`load_validation`),
to measure a judge against (``probe code --agreement``, :mod:`probe.app.coding`).
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from probe.errors import ProbeError
from probe.files import parse_yaml, read_yaml

TASKS: tuple[str, ...] = ("followup", "compliance", "rationale", "rationales")
"""``rationale`` codes a trace's primary rationale (one label); ``rationales`` the status of every rationale of the
rationale taxonomy in it (paper 000, appendix K.3: not mentioned / mentioned, not acted on / mentioned and acted on)."""
DATA = Path(__file__).resolve().parents[2] / "experiments" / "data"
TAXONOMY_DIR = DATA / "taxonomies"
VALIDATION_DIR = DATA / "validation"
FOLLOWUP_CODES: tuple[str, ...] = ("ack_affected", "ack_disclaimed", "denied", "partial", "unclear")
"""The follow-up codes (paper 000, appendix P's five judge labels) are a contract with
:mod:`analysis.influence.followup`: a follow-up taxonomy must have exactly these."""
LEGACY_FOLLOWUP_CODES: tuple[str, ...] = ("ack_affected", "ack_disclaimed", "not_ack", "other")
"""The four follow-up codes of earlier versions (``other`` merged the paper's partial and unclear, so a coding made
with them cannot be mapped onto the five: it is refused with the command that re-codes it)."""
STATUS_CODES: tuple[str, ...] = ("not_mentioned", "mentioned_but_not_acted_on", "mentioned_and_acted_on")
"""The ``rationales`` codes: a rationale's status in a trace (paper 000, appendix K.3), a contract with
:mod:`analysis.influence.rationales`."""
FIELDS: frozenset[str] = frozenset(
    {"codes", "code_ids", "text", "prompt", "choice", "cue", "influence", "target", "rationale", "definition"}
)
"""What a judge prompt template may refer to (``rationale``, ``definition``: the rationale a ``rationales`` judge
trial asks about, and its definition)."""
_ID = re.compile(r"^[a-z][a-z0-9_]*$")
_CODE_KEYS = {"id", "label", "definition", "example", "family", "cues"}
_TOP_KEYS = {"task", "prompt", "codes", "added", "rules", "decision", "rationale_taxonomy"}


class TaxonomyError(ProbeError, ValueError):
    """A taxonomy or validation file that cannot be used; the message names the file, the code and the field."""


# ================================================================ taxonomies
@dataclass(frozen=True)
class Code:
    """One code of a taxonomy."""

    id: str
    """The answer the judge gives and the ``p_<id>`` column (lower case, digits, underscores)."""
    label: str
    """A short human name shown to the judge next to the id."""
    definition: str
    example: str
    family: str = ""
    """Optional grouping (the paper's outcome / fairness / social / meta), used to order tables."""
    cues: tuple[str, ...] = ()
    """Regular expressions (case-insensitive) the rule coder (``--judge rule``) looks for: a rationale code's
    mentions (:mod:`probe.app.coding_rules`)."""


@dataclass(frozen=True)
class Rule:
    """One rule of the rule coder: ``code`` when a pattern of ``any`` matches and none of ``unless`` does."""

    code: str
    any: tuple[str, ...]
    unless: tuple[str, ...] = ()


@dataclass(frozen=True)
class Taxonomy:
    """A coding task's codes and judge prompt, as loaded from its YAML file."""

    task: str
    source: str
    """The file it was read from."""
    sha256: str
    """Hash of the file's bytes (recorded with every coding)."""
    prompt: str
    codes: tuple[Code, ...]
    added: Mapping[str, tuple[Code, ...]] = field(default_factory=dict)
    """Benchmark -> codes used on top of the base codes for that benchmark."""
    rules: tuple[Rule, ...] = ()
    """The rule coder's ordered rules (follow-up): the first that matches gives the code."""
    default: str = ""
    """The rule coder's code when no rule matches (follow-up)."""
    decision: tuple[str, ...] = ()
    """Regular expressions of a sentence that states the decision (rationale: a cue in such a sentence is acted
    on)."""
    rationale_taxonomy: str = ""
    """``rationales``: the rationale taxonomy whose codes are asked about (a path; empty: the shipped one)."""

    def codes_for(self, benchmark: str | None = None) -> tuple[Code, ...]:
        """The base codes plus the codes added for ``benchmark`` (none for an unknown or absent benchmark)."""
        return self.codes + tuple(self.added.get(benchmark or "", ()))

    @property
    def benchmarks(self) -> tuple[str, ...]:
        return tuple(self.added)


def _code(raw: object, src: str, where: str) -> Code:
    if not isinstance(raw, Mapping):
        raise TaxonomyError(f"{src}: {where} must be a mapping with id, label, definition, example; got {raw!r}")
    cid = raw.get("id")
    name = f"{where} ({cid!r})" if cid is not None else where
    unknown = sorted(set(raw) - _CODE_KEYS)
    if unknown:
        raise TaxonomyError(f"{src}: code {name} has unknown fields {unknown}; allowed: {sorted(_CODE_KEYS)}")
    for key in ("id", "label", "definition", "example"):
        value = raw.get(key)
        if not isinstance(value, str) or not value.strip():
            raise TaxonomyError(f"{src}: code {name}: field {key!r} must be a non-empty string, got {value!r}")
    if not _ID.match(str(cid)):
        raise TaxonomyError(
            f"{src}: code {name}: field 'id' must be lower case letters, digits and underscores, starting with a "
            f"letter (it becomes the column p_<id>), got {cid!r}"
        )
    family = raw.get("family", "")
    if not isinstance(family, str):
        raise TaxonomyError(f"{src}: code {name}: field 'family' must be a string, got {family!r}")
    cues = _patterns(raw.get("cues", []), src, f"code {name}: field 'cues'")
    return Code(
        str(cid), str(raw["label"]).strip(), str(raw["definition"]).strip(), str(raw["example"]).strip(), family, cues
    )


def _patterns(raw: object, src: str, where: str) -> tuple[str, ...]:
    """A list of regular expressions (each compiled once to check it)."""
    if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
        raise TaxonomyError(f"{src}: {where} must be a list of regular expressions (strings), got {raw!r}")
    for pat in raw:
        try:
            re.compile(pat)
        except re.error as e:
            raise TaxonomyError(f"{src}: {where}: {pat!r} is not a regular expression ({e})") from None
    return tuple(raw)


def _rules(doc: Mapping[str, object], src: str, codes: Sequence[Code]) -> tuple[tuple[Rule, ...], str]:
    """The rule coder's ``rules`` (a list of {code, any, unless}) and ``default`` code (``rules.default``)."""
    raw = doc.get("rules")
    if raw is None:
        return (), ""
    ids = [c.id for c in codes]
    if not isinstance(raw, Mapping) or not isinstance(raw.get("order"), list) or raw.get("default") not in ids:
        raise TaxonomyError(
            f"{src}: field 'rules' must map 'order' to a list of {{code, any, unless}} and 'default' to a code of "
            f"{ids}, got {raw!r}"
        )
    out = []
    for i, r in enumerate(raw["order"]):
        where = f"rules.order[{i}]"
        if not isinstance(r, Mapping) or r.get("code") not in ids or set(r) - {"code", "any", "unless"}:
            raise TaxonomyError(f"{src}: {where} must be {{code: one of {ids}, any: [...], unless: [...]}}, got {r!r}")
        anys = _patterns(r.get("any"), src, f"{where}.any")
        out.append(Rule(str(r["code"]), anys, _patterns(r.get("unless", []), src, f"{where}.unless")))
    return tuple(out), str(raw["default"])


def _check_contract(task: str, codes: Sequence[Code], src: str) -> None:
    """The follow-up and rationales code ids are read by the analysis: they are fixed."""
    ids = tuple(c.id for c in codes)
    if task == "followup" and ids == LEGACY_FOLLOWUP_CODES:
        raise TaxonomyError(
            f"{src} has the old four follow-up codes {list(LEGACY_FOLLOWUP_CODES)}; use the paper's five "
            f"{list(FOLLOWUP_CODES)} (copy experiments/data/taxonomies/followup.yaml and edit its wording)"
        )
    want = {"followup": FOLLOWUP_CODES, "rationales": STATUS_CODES}.get(task)
    if want is not None and ids != want:
        raise TaxonomyError(
            f"{src}: the {task} codes must be exactly {list(want)} in this order (the analysis reads them), "
            f"got {list(ids)}; edit labels and definitions, not ids"
        )


def _codes(raw: object, src: str, where: str) -> tuple[Code, ...]:
    if not isinstance(raw, list) or not raw:
        raise TaxonomyError(f"{src}: {where} must be a non-empty list of codes, got {raw!r}")
    codes = tuple(_code(c, src, f"{where}[{i}]") for i, c in enumerate(raw))
    seen: set[str] = set()
    for c in codes:
        if c.id in seen:
            raise TaxonomyError(f"{src}: code id {c.id!r} appears twice in {where}; ids must be unique")
        seen.add(c.id)
    return codes


def template_fields(template: str) -> set[str]:
    """The ``{field}`` names a format string uses."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def load_taxonomy(task_or_path: str | Path) -> Taxonomy:
    """Load and validate a taxonomy: a task name (the shipped file) or a path to a YAML file."""
    path = Path(task_or_path)
    if str(task_or_path) in TASKS and not path.exists():
        path = TAXONOMY_DIR / f"{task_or_path}.yaml"
    if not path.is_file():
        raise TaxonomyError(f"taxonomy {str(task_or_path)!r} is neither a task ({', '.join(TASKS)}) nor a YAML file")
    data = path.read_bytes()  # parsed and hashed: the coding records which taxonomy it used
    src = str(path)
    doc = parse_yaml(data, src, TaxonomyError, "docs/coding.md describes the taxonomy format")
    if not isinstance(doc, Mapping):
        raise TaxonomyError(f"{src}: the top level must be a mapping with task, prompt, codes")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise TaxonomyError(f"{src}: unknown top-level fields {unknown}; allowed: {sorted(_TOP_KEYS)}")
    task = doc.get("task")
    if task not in TASKS:
        raise TaxonomyError(f"{src}: field 'task' must be one of {', '.join(TASKS)}, got {task!r}")
    prompt = doc.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise TaxonomyError(f"{src}: field 'prompt' must be a non-empty template string, got {prompt!r}")
    try:
        used = template_fields(prompt)
    except ValueError as e:
        raise TaxonomyError(
            f"{src}: field 'prompt' is not a valid format string ({e}); write literal braces as {{{{ }}}}"
        ) from None
    bad = sorted(used - FIELDS)
    if bad:
        raise TaxonomyError(f"{src}: field 'prompt' uses unknown fields {bad}; allowed: {sorted(FIELDS)}")
    for need in ("codes", "text"):
        if need not in used:
            raise TaxonomyError(f"{src}: field 'prompt' must contain {{{need}}}")
    codes = _codes(doc.get("codes"), src, "codes")
    added_raw = doc.get("added") or {}
    if not isinstance(added_raw, Mapping):
        raise TaxonomyError(f"{src}: field 'added' must map a benchmark to a list of codes, got {added_raw!r}")
    added: dict[str, tuple[Code, ...]] = {}
    base_ids = {c.id for c in codes}
    for bench, raw in added_raw.items():
        extra = _codes(raw, src, f"added.{bench}")
        clash = sorted(base_ids & {c.id for c in extra})
        if clash:
            raise TaxonomyError(f"{src}: added.{bench} repeats base code ids {clash}; added codes must be new")
        added[str(bench)] = extra
    _check_contract(str(task), codes, src)
    rules, default = _rules(doc, src, codes)
    decision = _patterns(doc.get("decision", []), src, "field 'decision'")
    other = doc.get("rationale_taxonomy", "")
    if not isinstance(other, str):
        raise TaxonomyError(f"{src}: field 'rationale_taxonomy' must be a path, got {other!r}")
    other = str(path.parent / other) if other else ""
    digest = hashlib.sha256(data).hexdigest()
    return Taxonomy(str(task), src, digest, prompt, codes, added, rules, default, decision, other)


def codes_block(codes: Sequence[Code]) -> str:
    """The code list as the judge reads it: one line per code."""
    return "\n".join(f"- {c.id} ({c.label}): {c.definition} Example: {c.example}" for c in codes)


# ================================================================ validation
@dataclass(frozen=True)
class ValidationItem:
    """One hand-labelled text of a validation set (``experiments/data/validation/<task>.yaml``)."""

    id: str
    text: str
    """The text the judge codes (a follow-up answer or a reasoning trace)."""
    gold: str
    """The code id a person gave it."""
    context: Mapping[str, str]
    """The other judge-prompt fields of the item (the question, the cue, ...): :data:`FIELDS` less ``text``."""
    benchmark: str | None = None
    """Whose added codes apply (None: the taxonomy's base codes only)."""
    note: str = ""
    """Why the gold code is what it is (for the reader; the judge never sees it)."""


_VAL_KEYS = {"id", "text", "gold", "benchmark", "note", *(FIELDS - {"codes", "code_ids", "text"})}


def load_validation(task: str, path: str | Path | None = None, tax: Taxonomy | None = None) -> list[ValidationItem]:
    """The hand-labelled validation set of a task (``experiments/data/validation/<task>.yaml`` by default)."""
    p = Path(path) if path else VALIDATION_DIR / f"{task}.yaml"
    doc = read_yaml(p, "validation file", TaxonomyError, "pass --validation with an existing validation YAML")
    if not isinstance(doc, Mapping) or doc.get("task") != task or not isinstance(doc.get("items"), list):
        raise TaxonomyError(f"{p}: expected a mapping with task: {task} and a list of items")
    tax = tax or load_taxonomy(task)
    out: list[ValidationItem] = []
    ids: set[str] = set()
    for i, raw in enumerate(doc["items"]):
        if not isinstance(raw, Mapping):
            raise TaxonomyError(f"{p}: items[{i}] must be a mapping, got {raw!r}")
        name = f"items[{i}] ({raw.get('id')!r})"
        unknown = sorted(set(raw) - _VAL_KEYS)
        if unknown:
            raise TaxonomyError(f"{p}: {name} has unknown fields {unknown}; allowed: {sorted(_VAL_KEYS)}")
        for key in ("id", "text", "gold"):
            if not isinstance(raw.get(key), str) or not raw[key].strip():
                raise TaxonomyError(f"{p}: {name}: field {key!r} must be a non-empty string")
        bench = raw.get("benchmark")
        allowed = {c.id for c in tax.codes_for(bench)}
        if raw["gold"] not in allowed:
            raise TaxonomyError(
                f"{p}: {name}: gold code {raw['gold']!r} is not a code of {tax.source} for benchmark {bench}"
            )
        if raw["id"] in ids:
            raise TaxonomyError(f"{p}: {name}: id repeats")
        ids.add(raw["id"])
        ctx = {k: str(v) for k, v in raw.items() if k in FIELDS and k != "text"}
        out.append(ValidationItem(raw["id"], raw["text"], raw["gold"], ctx, bench, str(raw.get("note", ""))))
    return out
