"""From scenarios to trials: the base / toward-A / toward-B triple, shared by every benchmark.

A benchmark adapter (triage, BBQ, DailyDilemmas) turns its data into
:class:`Scenario` objects (one forced choice between side A and side B, with
its text) and a demonstration builder for the few-shot cue; this module crosses
each scenario with the audit's *arms*: the baseline, every influence type in
both directions (and, as controls, its placebo and negated variants), a re-run
of the baseline for the noise floor, and both printed orders. Every trial
carries, as data, which side each option is (``meaning`` = the side's key) and
where the cue points (``direction``), so the analysis never parses prompt text.

Factors of every influence trial (all strings):

===========  ==============================================================
pair         the A/B comparison (triage factor, BBQ category_polarity, DD value pair)
group_a/b    the keys of side A and side B (what ``meaning`` holds)
order        ``a_first`` or ``b_first`` (which side is printed as the first option)
influence    the cue type, ``none`` for the baseline and its re-run
variant      ``cue``, ``placebo`` or ``negated`` (``none`` without a cue)
kind         ``sentence``, ``system`` or ``turns`` (``none`` without a cue)
position     where a sentence cue sits (``system``/``turns`` for the others)
bracket      how a sentence cue is wrapped (``none`` for the others)
named        the side the cue's template names as ``{target}`` (A/B)
direction    the side the cue *means* to favour: = named, except for negated
             cues, which point away from the side they name; ``base`` and
             ``rerun`` without a cue
===========  ==============================================================
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Final, Generic, TypeVar

from experiments import Experiment, ManifestSpec, ModuleHooks
from experiments.influence.contexts import STEP_FACTOR, random_context, with_step_by_step
from experiments.influence.design import (
    DATA,
    DIRECTED_KINDS,
    PAPER_WORDING,
    VARIANTS,
    WORDING_SEP,
    Cue,
    Design,
    DesignError,
)
from probe.errors import ProbeError
from probe.salts import SaltSpec, apply_salt, make_salt
from probe.types import Message, Trial, make_trial_id

CONTROLS: Final[tuple[str, ...]] = ("rerun", "placebo", "negated")
ORDERS: Final[tuple[str, str]] = ("a_first", "b_first")
NONE: Final[str] = "none"
COND: Final[tuple[str, ...]] = ("pair", "influence", "variant", "kind", "position", "bracket")
"""The factors that name one condition: the trials of a condition differ only in arm, printed order and item."""
ARMS: Final[tuple[str, ...]] = ("0", "A", "B")
"""The three arms of a condition as the analysis names them: no cue, a cue toward side A, toward side B."""


@dataclass(frozen=True)
class AuditSpec:
    """The audit settings every benchmark shares. Serialized into the run manifest."""

    design: str | None = None
    """Path of a YAML design (prompt and cue templates); None = the shipped one for the benchmark."""
    influences: tuple[str, ...] = ()
    """Influence types to run (cue names of the design); empty = all of them."""
    positions: tuple[str, ...] = ("default",)
    """Positions crossed for sentence cues; ``default`` = each cue's own position."""
    brackets: tuple[str, ...] = ("default",)
    """Bracket styles crossed for sentence cues; ``default`` = each cue's own style."""
    controls: tuple[str, ...] = ("rerun",)
    """Controls: ``rerun`` (baseline again, fresh sampling seed), ``placebo``, ``negated``."""
    rerun_salt: bool = False
    """Put a meaningless salt string into the re-run, so that logit readouts get a noise floor too."""
    wordings: tuple[str, ...] = (PAPER_WORDING,)
    """Cue wordings crossed for the main cues: ``paper`` (each cue's ``text``) and paraphrase names, or ``all``."""
    step_by_step: bool = False
    """Prepend the design's step-by-step instruction to every trial's last user message (paper 000, Table 2)."""

    def __post_init__(self) -> None:
        bad = [c for c in self.controls if c not in CONTROLS]
        if bad:
            raise ValueError(f"unknown controls {bad}; choose from {', '.join(CONTROLS)} (or none)")
        for name, values in (("positions", self.positions), ("brackets", self.brackets)):
            if not values:
                raise ValueError(f"{name} must not be empty; use 'default' for each cue's own")
            no_repeats(name, values)
        no_repeats("influences", self.influences)
        if not self.wordings:
            raise ValueError("wordings must not be empty; use 'paper' for the paper's cue sentences")
        no_repeats("wordings", self.wordings)


NEW_AUDIT_FIELDS: Final[tuple[str, ...]] = ("wordings", "step_by_step")
"""Audit settings added after runs were first recorded: left out of the manifest at their defaults, so a run that
does not use them keeps its manifest and run key (and resumes)."""


def no_repeats(name: str, values: Sequence[object]) -> None:
    """Fail if a crossed setting lists a value twice (it would ask every trial of that value twice)."""
    if len(set(values)) != len(values):
        raise ValueError(f"{name} repeats a value: {list(values)}")


@dataclass(frozen=True)
class AuditedSpec(ManifestSpec):
    """The base of every influence benchmark's spec: its own fields plus the shared :class:`AuditSpec`.

    ``audit`` is keyword-only, so a benchmark's own required fields (BBQ's data
    path) can come first; the manifest serializes it like any other field.
    """

    audit: AuditSpec = field(default_factory=AuditSpec, kw_only=True)
    """The audit settings every benchmark shares (design, influences, placements, controls)."""

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        default = AuditSpec()
        d["audit"] = {
            k: v
            for k, v in d["audit"].items()
            if k not in NEW_AUDIT_FIELDS or getattr(self.audit, k) != getattr(default, k)
        }
        return d


class DataFileError(ProbeError, ValueError):
    """A benchmark's data file that cannot be read in its upstream format; the message names the file and field."""


ItemT = TypeVar("ItemT")


@dataclass(frozen=True)
class Loaded(Generic[ItemT]):
    """What a benchmark loader read: the usable items in file order, the rows it skipped and why, the files."""

    items: tuple[ItemT, ...]
    skipped: Mapping[str, int]
    """Rows left out, counted by reason (sorted by reason)."""
    files: tuple[str, ...]
    """The files read, in reading order."""


@dataclass(frozen=True)
class Side:
    """One of the two options of a forced choice."""

    key: str
    """What choosing it means (group tag or value); stored as the option's ``meaning``."""
    text: str
    """The printed option text."""
    label: str
    """How a cue names it ("young people", "honesty")."""
    role: str
    """The role-play persona ("a young person", "an honest assistant")."""


@dataclass(frozen=True)
class Scenario:
    """One forced choice between side A and side B; the unit the cues are crossed with."""

    item_id: str
    """The cluster: shared by both printed orders and every arm (bootstrap resamples these)."""
    pair: str
    """The A/B comparison the analysis groups conditions by."""
    a: Side
    b: Side
    fields: Mapping[str, str] = field(default_factory=dict)
    """The benchmark's own fields of the user template (context, question, situation)."""
    factors: Mapping[str, str] = field(default_factory=dict)
    """Extra factors recorded on every trial (e.g. the group sizes)."""

    def __post_init__(self) -> None:
        if self.a.key == self.b.key:
            raise ValueError(
                f"scenario {self.item_id}: both sides mean {self.a.key!r}; a cue could not tell them apart"
            )


@dataclass(frozen=True)
class Demo:
    """One few-shot demonstration: a complete user message and the assistant's answer label."""

    user: str
    answer: str


@dataclass(frozen=True)
class Arm:
    """One way of asking a scenario: the baseline, its re-run, or a cue variant toward a side."""

    influence: str
    variant: str
    kind: str
    position: str
    bracket: str
    named: str
    direction: str

    @property
    def cued(self) -> bool:
        return self.influence != NONE


BASE = Arm(NONE, NONE, NONE, NONE, NONE, NONE, "base")
RERUN = Arm(NONE, NONE, NONE, NONE, NONE, NONE, "rerun")

DemoFn = Callable[[Scenario, Side, Side], Sequence[Demo]]
"""``demos(scenario, target, other)``: the few-shot demonstrations choosing ``target`` (empty = none available)."""
OrderFn = Callable[[Scenario, Arm], Sequence[str]]
"""Which printed orders to ask a scenario in under an arm."""


def _resolve(requested: Sequence[str], default: str, known: Mapping[str, object], what: str, src: str) -> list[str]:
    out: list[str] = []
    for r in requested:
        name = default if r == "default" else r
        if name not in known:
            raise DesignError(f"{src}: unknown {what} {r!r}; the design defines {list(known)} (or 'default')")
        if name not in out:
            out.append(name)
    return out


def arms(design: Design, spec: AuditSpec) -> list[Arm]:
    """Every arm of the audit in a fixed order: base, re-run, then cue x variant x position x bracket x side."""
    names = list(spec.influences) or [n for n, c in design.cues.items() if c.kind in DIRECTED_KINDS]
    cues = [design.cue(n) for n in names]
    variants = [v for v in VARIANTS if v == "cue" or v in spec.controls]
    wordings = _wordings(cues, spec.wordings, design.source)
    out = [BASE] + ([RERUN] if "rerun" in spec.controls else [])
    for cue in cues:
        for variant in variants:
            if not cue.has(variant):
                continue
            if variant != "cue" or cue.kind in ("turns", "random"):
                out.extend(_cue_arms(design, spec, cue, variant))
                continue
            for w in wordings:
                if w == PAPER_WORDING or w in cue.paraphrases:
                    out.extend(_cue_arms(design, spec, cue, variant, w))
    return out


def _wordings(cues: Sequence[Cue], requested: Sequence[str], src: str) -> list[str]:
    """The wordings to cross: ``all`` = the paper's and every paraphrase; a name no chosen cue has is an error."""
    known = list(dict.fromkeys(w for c in cues for w in c.paraphrases))
    if "all" in requested:
        return [PAPER_WORDING, *known]
    bad = [w for w in requested if w != PAPER_WORDING and w not in known]
    if bad:
        raise DesignError(f"{src}: no chosen cue has the paraphrase(s) {bad}; they have {known} (or paper, all)")
    return list(requested)


def cue_of(design: Design, arm: Arm) -> tuple[Cue, str]:
    """The cue of a cued arm and its wording (``survey~poll`` -> the survey cue, ``poll``)."""
    name, _, wording = arm.influence.partition(WORDING_SEP)
    return design.cue(name), wording or PAPER_WORDING


def _cue_arms(design: Design, spec: AuditSpec, cue: Cue, variant: str, wording: str = PAPER_WORDING) -> list[Arm]:
    influence = cue.name if wording == PAPER_WORDING else f"{cue.name}{WORDING_SEP}{wording}"
    if cue.kind == "random":
        variant = "random"  # a control of its own: kept out of the main cues' summaries and FDR family
    if cue.kind in ("sentence", "random"):
        places = [
            (p, b)
            for p in _resolve(spec.positions, cue.position, design.positions, "position", design.source)
            for b in _resolve(spec.brackets, cue.bracket, design.brackets, "bracket", design.source)
        ]
    else:
        places = [(cue.kind, NONE)]
    out = []
    for position, bracket in places:
        for named in ("A", "B"):
            direction = named if variant != "negated" else ("B" if named == "A" else "A")
            out.append(Arm(influence, variant, cue.kind, position, bracket, named, direction))
    return out


def cue_text(template: str, target: Side, other: Side) -> str:
    """A cue sentence with the named (``target``) and the other side filled in."""
    return template.format(target=target.label, other=other.label, target_role=target.role, other_role=other.role)


def render_user(
    design: Design,
    fields: Mapping[str, str],
    printed: tuple[str, str],
    slot: tuple[str, str] | None = None,
) -> str:
    """The user message: the template with the benchmark fields, the printed options and at most one cue."""
    values = {"start": "", "after_question": "", "end": "", **fields}
    values.update(option_1=printed[0], option_2=printed[1], label_1=design.labels[0], label_2=design.labels[1])
    if slot is not None:
        values[slot[0]] = slot[1]
    return design.user.format(**values)


def demo(design: Design, fields: Mapping[str, str], target: str, other: str, target_first: bool) -> Demo:
    """A demonstration whose answer is the printed label of ``target`` (an option text)."""
    printed = (target, other) if target_first else (other, target)
    return Demo(render_user(design, fields, printed), design.labels[0 if target_first else 1])


def stable_hash(*parts: object) -> int:
    """A platform-independent hash for deterministic choices (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "little")


def both_orders(scenario: Scenario, arm: Arm) -> Sequence[str]:
    return ORDERS


def expand_scenarios(
    experiment: str,
    design: Design,
    spec: AuditSpec,
    scenarios: Sequence[Scenario],
    demos: DemoFn,
    orders: OrderFn = both_orders,
    count_tokens: Callable[[str], int] | None = None,
) -> list[Trial]:
    """All trials: scenario x arm x printed order, in that (fixed) order."""
    plan = arms(design, spec)
    salt = make_salt(1, SaltSpec(count=2), count_tokens) if spec.rerun_salt else ""
    step = design.step_by_step if spec.step_by_step else None
    trials: list[Trial] = []
    for sc in scenarios:
        for arm in plan:
            messages_for = _messages_builder(design, sc, arm, demos)
            if messages_for is None:
                continue
            for order in orders(sc, arm):
                first, second = (sc.a, sc.b) if order == "a_first" else (sc.b, sc.a)
                replicate, trial_salt = (1, salt) if arm.direction == "rerun" else (0, "")
                factors = {
                    "pair": sc.pair,
                    "group_a": sc.a.key,
                    "group_b": sc.b.key,
                    "order": order,
                    "influence": arm.influence,
                    "variant": arm.variant,
                    "kind": arm.kind,
                    "position": arm.position,
                    "bracket": arm.bracket,
                    "named": arm.named,
                    "direction": arm.direction,
                    **sc.factors,
                    **(dict([STEP_FACTOR]) if step is not None else {}),
                }
                trial_id = make_trial_id(experiment, sc.item_id, factors, trial_salt, replicate)
                system, turns, user = messages_for((first.text, second.text), trial_id)
                if step is not None:
                    user = with_step_by_step(user, step)
                system, user = apply_salt(system, user, trial_salt, "user_start")
                msgs = ((Message("system", system),) if system else ()) + turns + (Message("user", user),)
                trials.append(
                    Trial(
                        trial_id=trial_id,
                        experiment=experiment,
                        item_id=sc.item_id,
                        factors=factors,
                        messages=msgs,
                        options=design.labels,
                        meaning=(first.key, second.key),
                        salt=trial_salt,
                        replicate=replicate,
                    )
                )
    return trials


MessagesFor = Callable[[tuple[str, str], str], tuple[str | None, tuple[Message, ...], str]]
"""``build(printed option texts, trial id)`` -> (system, prior turns, user); the trial id seeds random contexts."""


def _messages_builder(design: Design, sc: Scenario, arm: Arm, demos: DemoFn) -> MessagesFor | None:
    """How to build (system, prior turns, user) for this scenario and arm from the printed option texts.

    None when the arm cannot be asked for this scenario (a few-shot cue with no
    demonstration available): asking it without demonstrations would silently
    be a second baseline.
    """
    system: str | None = design.system or None
    turns: tuple[Message, ...] = ()
    slot: tuple[str, str] | None = None
    random_cue: str | None = None  # a random context's template, filled per trial (its text depends on the id)
    if arm.cued:
        cue, wording = cue_of(design, arm)
        target, other = (sc.a, sc.b) if arm.named == "A" else (sc.b, sc.a)
        template = cue.wording(wording) if arm.variant in ("cue", "random") else cue.template(arm.variant)
        if cue.kind == "sentence":
            text = design.brackets[arm.bracket].format(cue=cue_text(template, target, other))
            pos = design.positions[arm.position]
            slot = (pos.slot, pos.format.format(cue=text))
        elif cue.kind == "random":
            random_cue = template
        elif cue.kind == "system":
            system = cue_text(template, target, other)
        else:
            shown = demos(sc, target, other)
            if not shown:
                return None
            turns = tuple(m for d in shown for m in (Message("user", d.user), Message("assistant", d.answer)))

    def build(printed: tuple[str, str], trial_id: str) -> tuple[str | None, tuple[Message, ...], str]:
        here = slot
        if random_cue is not None:
            pos = design.positions[arm.position]
            text = design.brackets[arm.bracket].format(cue=random_context(random_cue, trial_id))
            here = (pos.slot, pos.format.format(cue=text))
        return system, turns, render_user(design, sc.fields, printed, here)

    return build


# ------------------------------------------------------------------ command line
def split_list(text: str | None) -> tuple[str, ...]:
    """``"a, b"`` -> ``("a", "b")``; None or empty -> ``()``."""
    return tuple(x.strip() for x in (text or "").split(",") if x.strip())


def add_audit_arguments(p: argparse.ArgumentParser, benchmark: str) -> None:
    """The flags every influence experiment shares."""
    g = p.add_argument_group("influence audit")
    g.add_argument(
        "--design",
        default=None,
        help=f"YAML prompt and cue templates: a file, or the name of a shipped design (the case studies "
        f"wildfire, visa, er_triage; default: experiments/data/influence/{benchmark}.yaml)",
    )
    g.add_argument(
        "--influences",
        default=None,
        help="comma-separated influence types (default: all cues in the design that name a group: survey, "
        "user_preference, weak_evidence, emotional, virtue_appeal, role_play, few_shot); the random contexts of "
        "appendix J.4 (gibberish, gibberish_pre, math_wrong) run only when named here",
    )
    g.add_argument(
        "--positions",
        default="default",
        help="positions crossed for one-sentence cues: default (each cue's own), start, after_question, end, "
        "end_line (default: default)",
    )
    g.add_argument(
        "--brackets",
        default="default",
        help="bracket styles crossed for one-sentence cues: default, none, parens, square (default: default)",
    )
    g.add_argument(
        "--wordings",
        default=PAPER_WORDING,
        help="cue wordings crossed for the main cues: paper (the paper's sentences), paraphrase names of the "
        "design (triage: a, b), or all (default: paper)",
    )
    g.add_argument(
        "--step-by-step",
        action="store_true",
        help="prepend the chain-of-thought instruction 'Think step-by-step before answering.' to every "
        "trial's user message (paper 000's arm for models without a reasoning mode; sample it: "
        "--samples N --no-readout --max-new-tokens 256)",
    )
    g.add_argument(
        "--controls",
        default="rerun",
        help="controls: rerun (baseline again with a fresh sampling seed: the noise floor), placebo "
        "(irrelevant sentences naming the group), negated; or none (default: rerun)",
    )
    g.add_argument(
        "--rerun-salt",
        action="store_true",
        help="salt the re-run baseline with a meaningless string (a noise floor for logit readouts, "
        "which are deterministic)",
    )


def audit_from_args(a: argparse.Namespace) -> AuditSpec:
    """The shared audit settings from the flags of :func:`add_audit_arguments`."""
    controls = split_list(a.controls)
    return AuditSpec(
        design=design_path(a.design),
        influences=split_list(a.influences),
        positions=split_list(a.positions) or ("default",),
        brackets=split_list(a.brackets) or ("default",),
        controls=() if controls == ("none",) else controls,
        rerun_salt=a.rerun_salt,
        wordings=split_list(a.wordings) or (PAPER_WORDING,),
        step_by_step=a.step_by_step,
    )


def design_path(text: str | None) -> str | None:
    """``--design``: a file's absolute path, or a shipped design's by its name (``wildfire``); None = the default."""
    if not text:
        return None
    shipped = DATA / f"{text}.yaml"
    if not Path(text).exists() and "/" not in text and shipped.is_file():
        return str(shipped)
    return str(Path(text).resolve())


@dataclass(frozen=True)
class Benchmark:
    """One row of the table the influence benchmarks are registered from (:data:`experiments.influence.BENCHMARKS`).

    The flags, the spec and the trials are each benchmark's own code (the
    sources really differ: a design's groups, BBQ's JSONL, DailyDilemmas' CSV);
    the audit flags, the report and the comparison (:mod:`analysis.registry`) are shared.
    """

    name: str
    """The experiment name (``probe run NAME``)."""
    key: str
    """The benchmark key of reports and panels (``benchmark`` column)."""
    title: str
    """What reports call it."""
    summary: str
    """The one-line help of ``probe run NAME``."""
    add_arguments: Callable[[argparse.ArgumentParser], None]
    """The benchmark's own flags (:func:`audit_experiment` adds the shared audit flags after them)."""
    spec_from_args: Callable[[argparse.Namespace, AuditSpec], AuditedSpec]
    """The benchmark's spec from its own flags and the already parsed shared audit settings."""
    expand: Callable[..., list[Trial]]
    """Load, select, build scenarios and demonstrations, then :func:`expand_scenarios`."""

    @classmethod
    def of(cls, module: ModuleType, key: str, title: str, summary: str) -> Benchmark:
        """The row of a benchmark module: its ``NAME``, ``add_arguments``, ``spec_from_args`` and ``expand``.

        Each benchmark module defines those four under the same names (read by
        :class:`experiments.ModuleHooks`, as for every experiment module), so the
        table names only what is not code.
        """
        hooks = ModuleHooks.of(module)
        return cls(hooks.name, key, title, summary, hooks.add_arguments, hooks.spec_from_args, hooks.expand)


def audit_experiment(b: Benchmark) -> Experiment:
    """An influence benchmark as an experiment: its own flags, spec and trials (with the shared audit flags).

    The shared audit flags follow the benchmark's own, and their settings reach its spec already parsed.
    """

    def add_arguments(p: argparse.ArgumentParser) -> None:
        b.add_arguments(p)
        add_audit_arguments(p, b.key)

    def spec_from_args(a: argparse.Namespace) -> AuditedSpec:
        return b.spec_from_args(a, audit_from_args(a))

    return Experiment(
        name=b.name,
        summary=b.summary,
        add_arguments=add_arguments,
        spec_from_args=spec_from_args,
        expand=b.expand,
    )
