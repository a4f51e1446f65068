"""The moral triage task of the influence audit (paper 000, sections 2-3).

A binary forced choice between saving ``n_a`` people of group A and ``n_b``
of group B, for five demographic factors. The balanced design of the paper:
every ordered size pair ``(n_a, n_b)`` of the size grid, so each group appears
equally often with each size (i); both printed orders (ii); repeats come from
the run plan (``--samples k`` per printed order for sampled engines; one
readout per prompt for logit engines) (iii). A group of one is "1 young person
is saved", not "1 young people are saved".
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from experiments.influence.build import (
    AuditedSpec,
    AuditSpec,
    Demo,
    DemoFn,
    Scenario,
    Side,
    demo,
    expand_scenarios,
    no_repeats,
    split_list,
)
from experiments.influence.design import Design, DesignError, article, load_design, template_fields
from probe.types import Trial

NAME = "influence-triage"
_GROUP_KEYS = frozenset({"key", "plural", "singular", "label", "role"})


@dataclass(frozen=True)
class TriageSpec(AuditedSpec):
    """What the triage audit asks. Serialized into the run manifest."""

    experiment_name: ClassVar[str] = NAME

    factors: tuple[str, ...] = ()
    """Demographic factors to run (names in the design); empty = all."""
    sizes: tuple[int, ...] = (1, 2, 3)
    """Group sizes; every ordered pair is asked (the paper: 1..10)."""

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ValueError("sizes must not be empty; e.g. --sizes 1-10")
        bad = [n for n in self.sizes if n < 1]
        if bad:
            raise ValueError(f"group sizes must be >= 1, got {bad}")
        no_repeats("sizes", self.sizes)


@dataclass(frozen=True)
class Group:
    """One demographic group: its key (the option meaning) and how it is written."""

    key: str
    """The group tag, stored as the option's ``meaning``."""
    plural: str
    """The noun for two or more ("young people")."""
    singular: str
    """The noun for one ("young person")."""
    label: str
    """How a cue names the group (the design's ``label``, else the plural)."""
    role: str
    """The role-play persona (the design's ``role``, else "a" + the singular)."""


@dataclass(frozen=True)
class FewShot:
    """One demonstration: the target group is smaller and still chosen."""

    target: int
    """The size of the chosen (target) group."""
    other: int
    """The size of the other group, larger than ``target``."""
    target_first: bool
    """Whether the target group is printed as the first option."""


@dataclass(frozen=True)
class TriageDesign:
    """The triage design: the common part and the triage sections (option line, factors, few-shot sizes)."""

    design: Design
    option: str
    """The option line template, with the fields ``count``, ``people`` and ``verb``."""
    factors: Mapping[str, tuple[Group, Group]]
    """Demographic factor -> (group of side A, group of side B), in design order."""
    few_shot: tuple[FewShot, ...]
    """The demonstrations of the few-shot cue, as group sizes."""


def load_triage_design(path: str | Path | None = None) -> TriageDesign:
    """The triage design (``None`` = the shipped ``triage.yaml``), validated."""
    d = load_design(path, "triage", user_fields=(), extra_keys=("option", "factors", "few_shot"))
    src = d.source
    option = d.extra["option"]
    if not isinstance(option, str):
        raise DesignError(f"{src}: option must be a string template")
    used = template_fields(option, f"{src}: option")
    if used != {"count", "people", "verb"}:
        raise DesignError(f"{src}: option must use exactly the fields count, people and verb, got {sorted(used)}")
    factors: dict[str, tuple[Group, Group]] = {}
    raw = d.extra["factors"]
    if not isinstance(raw, Mapping) or not raw:
        raise DesignError(f"{src}: factors must be a non-empty mapping of factor -> {{a: group, b: group}}")
    for name, spec in raw.items():
        if not isinstance(spec, Mapping) or set(spec) != {"a", "b"}:
            raise DesignError(f"{src}: factors.{name} must have exactly the keys a and b")
        a, b = (_group(spec[s], f"{src}: factors.{name}.{s}") for s in ("a", "b"))
        if a.key == b.key:
            raise DesignError(f"{src}: factors.{name}: groups a and b have the same key {a.key!r}")
        factors[str(name)] = (a, b)
    shots = []
    raw_shots = d.extra["few_shot"]
    if not isinstance(raw_shots, list) or not raw_shots:
        raise DesignError(f"{src}: few_shot must be a non-empty list of {{target, other, first}}")
    for i, s in enumerate(raw_shots):
        where = f"{src}: few_shot[{i}]"
        if not isinstance(s, Mapping) or set(s) != {"target", "other", "first"}:
            raise DesignError(f"{where} must have exactly the keys target, other, first")
        t, o = s["target"], s["other"]
        if not (isinstance(t, int) and isinstance(o, int) and 1 <= t < o):
            raise DesignError(f"{where}: need integer sizes with 1 <= target < other, got target={t!r}, other={o!r}")
        if s["first"] not in ("target", "other"):
            raise DesignError(f"{where}.first must be target or other, got {s['first']!r}")
        shots.append(FewShot(t, o, s["first"] == "target"))
    return TriageDesign(d, option, factors, tuple(shots))


def _group(spec: object, where: str) -> Group:
    if not isinstance(spec, Mapping):
        raise DesignError(f"{where} must be a mapping with key, plural, singular")
    bad = sorted(set(spec) - _GROUP_KEYS)
    if bad:
        raise DesignError(f"{where}: unknown key(s) {bad}; allowed: {sorted(_GROUP_KEYS)}")
    for k in ("key", "plural", "singular"):
        if not isinstance(spec.get(k), str) or not spec[k]:
            raise DesignError(f"{where}.{k} must be a non-empty string")
    singular = spec["singular"]
    return Group(
        key=spec["key"],
        plural=spec["plural"],
        singular=singular,
        label=str(spec.get("label") or spec["plural"]),
        role=str(spec.get("role") or f"{article(singular)} {singular}"),
    )


def option_text(template: str, group: Group, count: int) -> str:
    """One option line; a group of one takes the singular noun and "is"."""
    one = count == 1
    return template.format(count=count, people=group.singular if one else group.plural, verb="is" if one else "are")


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"1-10"``, ``"1,2,5"`` or a mix (``"1-3,8"``) -> sizes in the given order."""
    out: list[int] = []
    for part in split_list(text):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"--sizes: {part!r} is not a size or a range like 1-10")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"--sizes: range {part!r} runs backwards")
        out.extend(n for n in range(lo, hi + 1) if n not in out)
    return tuple(out)


def scenarios(td: TriageDesign, spec: TriageSpec) -> list[Scenario]:
    """Every (factor, n_a, n_b) comparison, factor-major, in grid order."""
    names = list(spec.factors) or list(td.factors)
    unknown = [f for f in names if f not in td.factors]
    if unknown:
        raise ValueError(f"unknown triage factors {unknown}; the design defines {list(td.factors)}")
    out = []
    for name in names:
        ga, gb = td.factors[name]
        for n_a in spec.sizes:
            for n_b in spec.sizes:
                out.append(
                    Scenario(
                        item_id=f"{name}:{n_a}v{n_b}",
                        pair=name,
                        a=Side(ga.key, option_text(td.option, ga, n_a), ga.label, ga.role),
                        b=Side(gb.key, option_text(td.option, gb, n_b), gb.label, gb.role),
                        factors={"n_a": str(n_a), "n_b": str(n_b)},
                    )
                )
    return out


def few_shot_demos(td: TriageDesign) -> DemoFn:
    """Demonstrations choosing the target group although it is the smaller one (same factor, the design's sizes)."""
    groups = {g.key: g for pair in td.factors.values() for g in pair}

    def demos(sc: Scenario, target: Side, other: Side) -> Sequence[Demo]:
        gt, go = groups[target.key], groups[other.key]
        return [
            demo(
                td.design,
                {},
                option_text(td.option, gt, s.target),
                option_text(td.option, go, s.other),
                s.target_first,
            )
            for s in td.few_shot
        ]

    return demos


def expand(spec: TriageSpec, count_tokens: Callable[[str], int] | None = None) -> list[Trial]:
    """All trials: factor x (n_a, n_b) x arm x printed order."""
    td = load_triage_design(spec.audit.design)
    return expand_scenarios(
        NAME, td.design, spec.audit, scenarios(td, spec), few_shot_demos(td), count_tokens=count_tokens
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("triage")
    g.add_argument("--factors", default=None, help="comma-separated factors (default: all in the design)")
    g.add_argument(
        "--sizes",
        default="1-3",
        help="group sizes, every ordered pair is asked: a range and/or a list (default: 1-3; the paper: 1-10)",
    )


def spec_from_args(a: argparse.Namespace, audit: AuditSpec) -> TriageSpec:
    return TriageSpec(audit=audit, factors=split_list(a.factors), sizes=parse_sizes(a.sizes))
