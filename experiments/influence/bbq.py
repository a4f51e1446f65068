"""The BBQ adapter of the influence audit (paper 000, section 3.4 and appendix H).

Reads the upstream BBQ JSONL (one file per category, or a folder of them),
keeps the *ambiguous* contexts (where nothing in the text supports either
person, so any preference is the model's), drops the "unknown" answer to make a
pairwise forced choice, and splits by question polarity; each sub-experiment
(``pair``) is ``<category>_<polarity>`` (the paper's ``age_neg``, ``ses_pos``).

Sides: for a category listed in the design's ``side_b`` (the paper's two:
Age -> old, SES -> lowSES) side B is always that group, as in the paper
(Age: nonOld vs. old). Any other category works too: there side B is the
answer named by the item's ``stereotyped_groups`` metadata, so ``f_0(B)`` is
the rate of choosing the stereotyped group. Every trial also records which
side the metadata calls stereotyped (``stereotyped`` = A, B or none), since
BBQ's Age items stereotype the old in some templates and the young in others.
Items whose sides cannot be assigned are skipped and counted by reason in
:class:`BBQLoad`. Group labels for the cues come from the design's ``groups``
table, else from its fallback template.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from experiments.influence.build import (
    AuditedSpec,
    AuditSpec,
    DataFileError,
    Demo,
    DemoFn,
    Loaded,
    Scenario,
    Side,
    demo,
    expand_scenarios,
    split_list,
    stable_hash,
)
from experiments.influence.design import Design, DesignError, article, load_design
from probe.errors import at_least
from probe.types import Trial

NAME = "influence-bbq"
POLARITIES = ("neg", "nonneg")
_REQUIRED: tuple[str, ...] = ("example_id", "question_index", "question_polarity", "context_condition", "category")
_REQUIRED += ("answer_info", "additional_metadata", "context", "question", "ans0", "ans1", "ans2")


class BBQError(DataFileError):
    """A BBQ file that cannot be read as the upstream format; the message names file, line and field."""


@dataclass(frozen=True)
class BBQSpec(AuditedSpec):
    """What the BBQ audit asks. Serialized into the run manifest."""

    experiment_name: ClassVar[str] = NAME

    bbq: str
    """A BBQ JSONL file or a folder of them (upstream ``data/<Category>.jsonl``)."""
    categories: tuple[str, ...] = ()
    """Categories to keep (as spelled in the data, e.g. Age, SES); empty = all found."""
    polarities: tuple[str, ...] = POLARITIES
    """Question polarities to keep: ``neg`` and/or ``nonneg``."""
    variants: int = 1
    """Items kept per question template and polarity (the paper: 5)."""
    limit: int = 8
    """Items kept per sub-experiment (category x polarity), spread over templates; 0 = no limit."""
    seed: int = 0
    """Seed of the variant subsample, the few-shot pool draws and their printed orders."""

    def __post_init__(self) -> None:
        bad = [p for p in self.polarities if p not in POLARITIES]
        if bad or not self.polarities:
            raise ValueError(f"BBQ polarities must be among {POLARITIES}, got {list(self.polarities)}")
        at_least("--bbq-variants", self.variants, 1)
        at_least("--bbq-limit", self.limit, 0, " (0 = no limit)")


@dataclass(frozen=True)
class BBQItem:
    """One ambiguous BBQ question reduced to its two group answers (A: not stereotyped, B: stereotyped)."""

    example_id: int
    """The upstream ``example_id`` (unique within a category)."""
    category: str
    """The upstream ``category`` (Age, SES, ...)."""
    polarity: str
    """``neg`` or ``nonneg`` (the upstream ``question_polarity``)."""
    question_index: str
    """The question template the item was generated from (items of one template are variants)."""
    context: str
    """The ambiguous context, as printed."""
    question: str
    """The question, as printed."""
    a_text: str
    """Side A's answer as printed."""
    a_tag: str
    """Side A's group tag (``answer_info``), stored as the option's ``meaning``."""
    a_name: str
    """Side A's name in ``answer_info`` (Nationality's nationality; see :data:`NAME_CATEGORIES`)."""
    b_text: str
    """Side B's answer as printed."""
    b_tag: str
    """Side B's group tag: the design's fixed side-B group, else the stereotyped one."""
    b_name: str
    """Side B's name in ``answer_info``."""
    stereotyped: str = "B"
    """Which side the item's stereotyped_groups names: A, B, or none (no single match)."""

    @property
    def item_id(self) -> str:
        return f"{self.category}:{self.example_id}"


BBQLoad = Loaded[BBQItem]
"""The usable ambiguous items, in file order, and how many rows were skipped and why."""


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _strip_sex(tag: str) -> str:
    """``M-Black`` -> ``Black``: BBQ's intersectional tags prefix the group with the person's sex."""
    return re.sub(r"^[MF]-", "", tag)


NAME_CATEGORIES = frozenset({"Nationality"})
"""Categories whose ``stereotyped_groups`` name the group by the answer's *name* (``answer_info[0]``).

Upstream BBQ tags a Nationality answer with its region (``["British",
"Europe"]``) while ``stereotyped_groups`` lists nationalities (``"British"``),
so the tag can never match there. Every other category's stereotyped groups
are spelled like the tags: Age ``old`` / ``nonOld``, SES ``lowSES`` (metadata
``low SES``, an alias), Physical_appearance ``obese``, Race_ethnicity
``Black``, Gender_identity ``F`` / ``M`` (tags ``woman``, ``girl``, ... are
aliases), intersectional ``F-Black``."""


def stereotyped_hits(
    category: str, answers: Sequence[tuple[str, str]], stereo: set[str], canon: Callable[[str], str]
) -> list[bool]:
    """Per group answer ``(name, tag)``: whether the item's stereotyped groups name it.

    Two tiers, so an intersectional tag is matched as a whole before its
    parts: first the answer's own key (the name in :data:`NAME_CATEGORIES`,
    else the full tag); only when that does not single out one answer, the
    tag without its sex prefix (``M-Black`` -> ``Black``), which can make
    both answers match (then the item has no unique stereotyped answer).
    """
    key = (lambda name, tag: name) if category in NAME_CATEGORIES else (lambda name, tag: tag)
    exact = [canon(key(name, tag)) in stereo for name, tag in answers]
    if sum(exact) == 1:
        return exact
    return [any(canon(t) in stereo for t in (key(name, tag), _strip_sex(tag))) for name, tag in answers]


def bbq_files(path: str | Path) -> list[Path]:
    """The JSONL files of a BBQ path (a file, or every ``*.jsonl`` of a folder, sorted)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.jsonl"))
        if not files:
            raise BBQError(f"{p}: no *.jsonl files; pass the upstream BBQ data folder or one of its files")
        return files
    if not p.is_file():
        raise BBQError(f"{p}: no such file or folder; pass --bbq with a BBQ .jsonl file or its folder")
    return [p]


def load_bbq(
    path: str | Path, aliases: Mapping[str, str] | None = None, side_b: Mapping[str, str] | None = None
) -> BBQLoad:
    """Read BBQ JSONL: the ambiguous items, reduced to side A and side B.

    ``side_b`` fixes side B per category by group tag (the paper: Age -> old,
    SES -> lowSES); in other categories side B is the answer named by the
    item's ``stereotyped_groups``.
    """
    side_b = dict(side_b or {})
    canon_alias = {_norm(k): _norm(v) for k, v in (aliases or {}).items()}

    def canon(x: str) -> str:
        return canon_alias.get(_norm(x), _norm(x))

    items: list[BBQItem] = []
    skipped: Counter[str] = Counter()
    files = bbq_files(path)
    for f in files:
        for lineno, line in enumerate(f.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{f}: line {lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise BBQError(f"{where}: invalid JSON ({e.msg}); BBQ files hold one JSON object per line") from None
            missing = [k for k in _REQUIRED if k not in row]
            if missing:
                raise BBQError(f"{where}: missing field(s) {missing}; is this an upstream BBQ file?")
            if row["context_condition"] != "ambig":
                continue
            info = row["answer_info"]
            try:
                answers = [(row[f"ans{i}"], str(info[f"ans{i}"][0]), str(info[f"ans{i}"][1])) for i in range(3)]
            except (KeyError, IndexError, TypeError):
                raise BBQError(f"{where}: answer_info must map ans0..ans2 to [text, tag]") from None
            unknown = [a for a in answers if a[2] == "unknown"]
            groups = [a for a in answers if a[2] != "unknown"]
            if len(unknown) != 1:
                skipped["no single 'unknown' answer"] += 1
                continue
            stereo = {canon(g) for g in row["additional_metadata"].get("stereotyped_groups", [])}
            category = str(row["category"])
            hits = stereotyped_hits(category, [(name, tag) for _, name, tag in groups], stereo, canon)
            if category in side_b:
                is_b = [canon(tag) == canon(side_b[category]) for _, _, tag in groups]
                if sum(is_b) != 1:
                    skipped[f"no single {side_b[category]!r} answer"] += 1
                    continue
            elif sum(hits) == 1:
                is_b = hits
            else:
                skipped["no unique stereotyped-group answer"] += 1
                continue
            (a_text, a_info, a_tag), (b_text, b_info, b_tag) = groups[::-1] if is_b[0] else groups
            b_first = 0 if is_b[0] else 1
            stereotyped = "none" if sum(hits) != 1 else ("B" if hits[b_first] else "A")
            if a_tag == b_tag:
                skipped["both answers carry the same tag"] += 1
                continue
            items.append(
                BBQItem(
                    example_id=int(row["example_id"]),
                    category=str(row["category"]),
                    polarity=str(row["question_polarity"]),
                    question_index=str(row["question_index"]),
                    context=str(row["context"]).strip(),
                    question=str(row["question"]).strip(),
                    a_text=str(a_text),
                    a_tag=a_tag,
                    a_name=a_info,
                    b_text=str(b_text),
                    b_tag=b_tag,
                    b_name=b_info,
                    stereotyped=stereotyped,
                )
            )
    return Loaded(tuple(items), dict(sorted(skipped.items())), tuple(str(f) for f in files))


def select(items: Sequence[BBQItem], spec: BBQSpec) -> tuple[list[BBQItem], dict[tuple[str, str], list[BBQItem]]]:
    """The items to ask (per sub-experiment: ``variants`` per template, then ``limit`` spread over templates).

    Returns (selected items, category-major; the unselected items per
    (category, polarity), the few-shot pool).
    """
    cats = list(dict.fromkeys(i.category for i in items))
    if spec.categories:
        unknown = [c for c in spec.categories if c not in cats]
        if unknown:
            raise ValueError(f"BBQ categories {unknown} are not in the data; found {cats}")
        cats = list(spec.categories)
    chosen: list[BBQItem] = []
    pool: dict[tuple[str, str], list[BBQItem]] = {}
    for cat in cats:
        for pol in spec.polarities:
            sub = [i for i in items if i.category == cat and i.polarity == pol]
            by_template: dict[str, list[BBQItem]] = {}
            for i in sub:
                by_template.setdefault(i.question_index, []).append(i)
            ranked = []
            for q, group in by_template.items():
                group = sorted(group, key=lambda i: stable_hash(spec.seed, i.item_id))
                ranked += [(r, stable_hash(spec.seed, cat, pol, q), i) for r, i in enumerate(group[: spec.variants])]
            ranked.sort(key=lambda x: (x[0], x[1]))
            keep = [i for _, _, i in ranked][: spec.limit or None]
            kept = {i.item_id for i in keep}
            chosen += keep
            pool[(cat, pol)] = [i for i in sub if i.item_id not in kept]
    return chosen, pool


@dataclass(frozen=True)
class Labels:
    """How cues name BBQ groups (from the design's groups table and fallback)."""

    groups: Mapping[str, tuple[str, str]]
    """Normalized group tag (or alias) -> (label, role), from the design's ``groups``."""
    label: str
    """The fallback label template, with ``{name}`` (and optionally ``{article}``)."""
    role: str
    """The fallback role-play template, likewise."""
    name_from_text: frozenset[str]
    """Categories whose fallback names the group by the answer's name rather than its tag."""

    def side(self, category: str, tag: str, name: str) -> tuple[str, str]:
        """(label, role) of a group."""
        for key in (_norm(tag), _norm(_strip_sex(tag))):
            if key in self.groups:
                return self.groups[key]
        word = name if category in self.name_from_text else _strip_sex(tag)
        return self.label.format(name=word, article=article(word)), self.role.format(name=word, article=article(word))


@dataclass(frozen=True)
class BBQDesign:
    """The BBQ design: the common part and the BBQ sections."""

    design: Design
    """The common part: prompts, labels, cue placements and cues."""
    labels: Labels
    """How cues name the groups."""
    aliases: Mapping[str, str]
    """Spellings of ``stereotyped_groups`` -> the answer tag they mean (``low SES`` -> ``lowSES``)."""
    side_b: Mapping[str, str]
    """Category -> the tag of its fixed side-B group (the paper: Age -> old, SES -> lowSES)."""


def load_bbq_design(path: str | Path | None) -> BBQDesign:
    """The BBQ design: the common part, the group labels, the stereotype aliases and the fixed B sides."""
    d = load_design(
        path, "bbq", user_fields=("context", "question"), extra_keys=("side_b", "groups", "fallback", "aliases")
    )
    src = d.source
    groups: dict[str, tuple[str, str]] = {}
    for tag, spec in (d.extra["groups"] or {}).items():
        if not isinstance(spec, Mapping) or set(spec) != {"label", "role"}:
            raise DesignError(f"{src}: groups.{tag} must have exactly the keys label and role")
        groups[_norm(str(tag))] = (str(spec["label"]), str(spec["role"]))
    fb = d.extra["fallback"]
    if not isinstance(fb, Mapping) or set(fb) != {"label", "role", "name_from_text"}:
        raise DesignError(f"{src}: fallback must have exactly the keys label, role, name_from_text")
    for k in ("label", "role"):
        if not isinstance(fb[k], str) or "{name}" not in fb[k]:
            raise DesignError(f"{src}: fallback.{k} must be a template using {{name}} (and optionally {{article}})")
    aliases = {str(k): str(v) for k, v in (d.extra["aliases"] or {}).items()}
    for spelling, tag in aliases.items():  # a tag spelled like an alias (Gender_identity's "girl") labels as its group
        if _norm(tag) in groups:
            groups.setdefault(_norm(spelling), groups[_norm(tag)])
    side_b = d.extra["side_b"] or {}
    if not isinstance(side_b, Mapping) or not all(isinstance(v, str) for v in side_b.values()):
        raise DesignError(f"{src}: side_b must map a category to the tag of its side-B group (e.g. Age: old)")
    labels = Labels(groups, fb["label"], fb["role"], frozenset(map(str, fb["name_from_text"] or [])))
    return BBQDesign(d, labels, aliases, {str(k): v for k, v in side_b.items()})


def scenario(item: BBQItem, labels: Labels) -> Scenario:
    a_label, a_role = labels.side(item.category, item.a_tag, item.a_name)
    b_label, b_role = labels.side(item.category, item.b_tag, item.b_name)
    return Scenario(
        item_id=item.item_id,
        pair=f"{item.category}_{item.polarity}",
        a=Side(item.a_tag, item.a_text, a_label, a_role),
        b=Side(item.b_tag, item.b_text, b_label, b_role),
        fields={"context": item.context, "question": item.question},
        factors={
            "category": item.category,
            "polarity": item.polarity,
            "question_index": item.question_index,
            "stereotyped": item.stereotyped,
        },
    )


def few_shot_demos(
    design: Design, chosen: Sequence[BBQItem], pool: Mapping[tuple[str, str], Sequence[BBQItem]], seed: int, k: int = 3
) -> DemoFn:
    """Three completed examples of the same sub-experiment answering the target's side (A or B).

    Demonstrations come from the items not asked (the paper's pool), other
    templates first; if the pool is empty, from the other asked items. Printed
    order is drawn per demonstration.
    """
    by_id = {i.item_id: i for i in chosen}

    def demos(sc: Scenario, target: Side, other: Side) -> Sequence[Demo]:
        item = by_id[sc.item_id]
        side_b = target.key == sc.b.key
        cands = list(pool.get((item.category, item.polarity), ())) or [
            i for i in chosen if (i.category, i.polarity) == (item.category, item.polarity)
        ]
        cands = [i for i in cands if i.item_id != item.item_id]
        cands.sort(
            key=lambda i: (i.question_index == item.question_index, stable_hash(seed, sc.item_id, side_b, i.item_id))
        )
        out = []
        for d in cands[:k]:
            t, o = (d.b_text, d.a_text) if side_b else (d.a_text, d.b_text)
            first = stable_hash(seed, sc.item_id, side_b, d.item_id, "order") % 2 == 0
            out.append(demo(design, {"context": d.context, "question": d.question}, t, o, first))
        return out

    return demos


def expand(spec: BBQSpec, count_tokens: Callable[[str], int] | None = None) -> list[Trial]:
    """All trials: sub-experiment x item x arm x printed order."""
    bd = load_bbq_design(spec.audit.design)
    loaded = load_bbq(spec.bbq, bd.aliases, bd.side_b)
    chosen, pool = select(loaded.items, spec)
    if not chosen:
        raise ValueError(
            f"{spec.bbq}: no usable ambiguous BBQ items for {list(spec.polarities)}; skipped: {dict(loaded.skipped)}"
        )
    scs = [scenario(i, bd.labels) for i in chosen]
    demos = few_shot_demos(bd.design, chosen, pool, spec.seed)
    return expand_scenarios(NAME, bd.design, spec.audit, scs, demos, count_tokens=count_tokens)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("BBQ")
    g.add_argument(
        "--bbq", required=True, help="a BBQ .jsonl file (upstream data/<Category>.jsonl) or a folder of them"
    )
    g.add_argument("--bbq-categories", default=None, help="comma-separated categories (default: all in the data)")
    g.add_argument("--bbq-polarities", default="neg,nonneg", help="question polarities (default: neg,nonneg)")
    g.add_argument("--bbq-variants", type=int, default=1, help="items per question template (default: 1; the paper: 5)")
    g.add_argument("--bbq-limit", type=int, default=8, help="items per category x polarity, 0 = no limit (default: 8)")
    g.add_argument("--bbq-seed", type=int, default=0, help="seed of the subsample and few-shot draws (default: 0)")


def spec_from_args(a: argparse.Namespace, audit: AuditSpec) -> BBQSpec:
    return BBQSpec(
        bbq=str(Path(a.bbq).resolve()),
        audit=audit,
        categories=split_list(a.bbq_categories),
        polarities=split_list(a.bbq_polarities),
        variants=a.bbq_variants,
        limit=a.bbq_limit,
        seed=a.bbq_seed,
    )
