"""Cue visibility: Neutral / Direct / Puzzled / Named identity (paper 001).

Each dilemma and each demographic assignment of four individuals A-D is held
fixed while only the way the identity reaches the model changes: not at all
(Neutral, the per-dilemma baseline), as explicit labels (Direct), as the
unique solution of a logic puzzle (Puzzled, at one or more difficulty
levels), or as culturally coded first names (Named); FormalNamed (opt-in,
paper App. S) gives the names together with the Puzzled skeleton over
abstract attributes, the same reasoning load with no identity content. Per individual the model
is asked whether X could be the described person (could-be), which option it
would choose assuming X is (what-if), and, where the identity is implicit,
which gender and which race X has (the puzzle-solving check). The analysis
(:mod:`analysis.cue.metrics`) turns the what-if answers into In-favor and Against
events against the Neutral baseline and the Cue Visibility Gap.

The default is reduced (the shipped 12 dilemmas, one combination each, hard
puzzles, with consequences: 492 trials) so that ``probe run cue --model tiny``
finishes in a minute or two on a CPU; ``--combos 3 --difficulties
easy,intermediate,hard --consequences with,without`` is the paper's full
design over the dilemma set.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from experiments import Experiment
from experiments.cue.categories import (
    DEFAULT_GENDERS,
    DEFAULT_RACES,
    Attribute,
    all_combos,
    check_names,
    load_names,
    make_attributes,
    pick_names,
)
from experiments.cue.design import SHAPES, Item, n_slots, plan_items, puzzle_bank, slot_shapes
from experiments.cue.prompts import (
    DECISION_OPTIONS,
    WORDINGS,
    YES_NO,
    check_question,
    could_be_json_question,
    could_be_question,
    decision_meaning,
    decision_question,
    direct_block,
    formal_named_block,
    named_block,
    prompt,
    puzzled_block,
)
from experiments.cue.puzzles import DIFFICULTIES, INDIVIDUALS, Puzzle
from experiments.cue.schema import CueDilemma, load_cue_dilemmas
from experiments.yesno import add_dilemma_arguments, add_salt_arguments, dilemma_path, salts_from_args
from probe.salts import SaltSpec, make_salt, salted_trials
from probe.types import Trial

NAME = "cue"
CONDITIONS = ("neutral", "direct", "puzzled", "named", "formal_named")
DEFAULT_CONDITIONS = ("neutral", "direct", "puzzled", "named")
"""The conditions asked unless ``--conditions`` says otherwise (FormalNamed is the App. S control, opt-in)."""
PROBES = ("could_be", "what_if", "check", "could_be_json")
DEFAULT_PROBES = ("could_be", "what_if", "check")
"""Probes asked unless ``--probes`` says otherwise; ``could_be_json`` is generated text (no slot readout), opt-in."""
CONSEQUENCES = ("with", "without")
#: Conditions in which the check probe is asked (the identity is implicit there).
CHECK_CONDITIONS = ("puzzled", "named", "formal_named")


def _subset(name: str, values: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    bad = [v for v in values if v not in allowed]
    if bad or not values or len(set(values)) != len(values):
        raise ValueError(f"{name}: {list(values)} must be distinct values from {list(allowed)}, at least one")


@dataclass(frozen=True)
class CueSpec:
    """What the cue-visibility battery asks. Serialized into the run manifest."""

    dilemmas: str | None = None
    """Path of a cue dilemma file (YAML/JSONL); None = the project's own set."""
    items: tuple[str, ...] = ()
    """Restrict to these dilemma ids (empty = all)."""
    conditions: tuple[str, ...] = DEFAULT_CONDITIONS
    probes: tuple[str, ...] = DEFAULT_PROBES
    wordings: tuple[str, ...] = ("main",)
    """What-if wordings asked (main, v1, v2, v3; App. Q). A paraphrase's trials carry the factor ``wording``;
    the main wording's do not, so runs made before the paraphrases keep their trial ids."""
    consequences: tuple[str, ...] = ("with",)
    """Show the options' negative consequences (``with``), hide them (``without``), or both."""
    difficulties: tuple[str, ...] = ("hard",)
    """Puzzle difficulty levels of the Puzzled condition."""
    combos: int = 1
    """Demographic combinations per dilemma (the paper: 3)."""
    puzzle_reuse: int = 5
    """Dilemmas that share one puzzle per level (the paper: 5), each with its own combinations."""
    shape: str = "canonical"
    """Puzzle solution shape: the paper's canonical one, App. N's fixed ``sol1`` / ``sol2``, or a random one per slot."""
    seed: int = 0
    """Seed of the combinations, shapes, puzzles and names."""
    genders: tuple[str, ...] = DEFAULT_GENDERS
    races: tuple[str, ...] = DEFAULT_RACES
    names: str | None = None
    """YAML file of first names per 'race/gender' for the Named condition; None = the built-in lists."""
    salts: SaltSpec = field(default_factory=SaltSpec)

    def __post_init__(self) -> None:
        _subset("conditions", self.conditions, CONDITIONS)
        _subset("probes", self.probes, PROBES)
        _subset("wordings", self.wordings, tuple(WORDINGS))
        _subset("consequences", self.consequences, CONSEQUENCES)
        if {"puzzled", "formal_named"} & set(self.conditions):
            _subset("difficulties", self.difficulties, DIFFICULTIES)
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {list(SHAPES)}, got {self.shape!r}")
        if self.puzzle_reuse < 1:
            raise ValueError(f"puzzle_reuse must be >= 1, got {self.puzzle_reuse}")
        attrs = self.attributes()  # validates the category lists
        if not 1 <= self.combos <= len(all_combos(attrs)):
            raise ValueError(f"combos must be in 1..{len(all_combos(attrs))}, got {self.combos}")

    def attributes(self) -> tuple[Attribute, Attribute]:
        return make_attributes(self.genders, self.races)

    def to_dict(self) -> dict[str, Any]:
        return {"experiment": NAME, **asdict(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CueSpec:
        """Inverse of :meth:`to_dict` (reads a run manifest's spec)."""
        kw = {k: v for k, v in d.items() if k != "experiment"}
        for k in ("items", "conditions", "probes", "wordings", "consequences", "difficulties", "genders", "races"):
            if k in kw:
                kw[k] = tuple(kw[k])
        if "salts" in kw:
            kw["salts"] = SaltSpec(**kw["salts"])
        return cls(**kw)


@dataclass(frozen=True)
class Design:
    """The expanded design: items, the puzzle bank per level, names per item (Named)."""

    dilemmas: tuple[CueDilemma, ...]
    items: tuple[Item, ...]
    puzzles: Mapping[str, tuple[Puzzle, ...]]
    names: Mapping[tuple[str, int], tuple[str, ...]]


def build_design(spec: CueSpec) -> Design:
    """Dilemmas, items, puzzles and names of a spec; deterministic in the spec."""
    dilemmas = load_cue_dilemmas(spec.dilemmas)
    if spec.items:
        known = [d.id for d in dilemmas]
        missing = [i for i in spec.items if i not in known]
        if missing:
            raise ValueError(f"unknown dilemma ids {missing}; known: {known}")
        dilemmas = tuple(d for d in dilemmas if d.id in spec.items)
    attrs = spec.attributes()
    items = plan_items(dilemmas, attrs, combos=spec.combos, reuse=spec.puzzle_reuse, shape=spec.shape, seed=spec.seed)
    puzzles: dict[str, tuple[Puzzle, ...]] = {}
    if {"puzzled", "formal_named"} & set(spec.conditions):  # FormalNamed reuses Puzzled's skeletons per level
        shapes = slot_shapes(n_slots(len(dilemmas), spec.puzzle_reuse), spec.shape, spec.seed)
        puzzles = {lv: puzzle_bank(lv, shapes, spec.seed) for lv in spec.difficulties}
    names: dict[tuple[str, int], tuple[str, ...]] = {}
    if {"named", "formal_named"} & set(spec.conditions):
        table = load_names(spec.names)
        check_names(table, attrs)
        for it in items:
            people = [it.person(w, attrs) for w in INDIVIDUALS]
            names[(it.dilemma.id, it.k)] = pick_names(
                [(race, gender) for gender, race in people], table, f"{spec.seed}:{it.dilemma.id}:{it.k}"
            )
    return Design(dilemmas, tuple(items), puzzles, names)


def _arms(spec: CueSpec) -> list[tuple[str, str]]:
    """(condition, difficulty) of the identity conditions, in trial order."""
    arms: list[tuple[str, str]] = []
    if "direct" in spec.conditions:
        arms.append(("direct", ""))
    if "puzzled" in spec.conditions:
        arms += [("puzzled", lv) for lv in spec.difficulties]
    if "named" in spec.conditions:
        arms.append(("named", ""))
    if "formal_named" in spec.conditions:
        arms += [("formal_named", lv) for lv in spec.difficulties]
    return arms


def expand(spec: CueSpec, count_tokens: Callable[[str], int] | None = None) -> list[Trial]:
    """All trials in a fixed order: dilemma (Neutral first), combination, condition/level,
    consequences, individual, probe, replicate."""
    design = build_design(spec)
    attrs = spec.attributes()
    salts = [make_salt(r, spec.salts, count_tokens) for r in range(spec.salts.count)]
    trials: list[Trial] = []

    def add(
        d: CueDilemma, factors: dict[str, str], text: str, options: tuple[str, ...], meaning: tuple[str, ...]
    ) -> None:
        factors = {**factors, "status": d.status, "topic": d.topic}
        trials.extend(salted_trials(NAME, d.id, factors, text, options, meaning, salts, spec.salts.place))

    blank = {
        "combo": "",
        "demographics": "",
        "individual": "",
        "difficulty": "",
        "puzzle": "",
        "x_gender": "",
        "x_race": "",
    }
    by_dilemma: dict[str, list[Item]] = {}
    for it in design.items:
        by_dilemma.setdefault(it.dilemma.id, []).append(it)
    for d in design.dilemmas:
        if "neutral" in spec.conditions:
            for cons in spec.consequences:
                text = prompt(d, None, cons == "with", decision_question(None, d))
                f = {"condition": "neutral", "probe": "decision", "consequences": cons, **blank}
                add(d, f, text, DECISION_OPTIONS, decision_meaning(d))
        for it in by_dilemma[d.id]:
            people = [it.person(w, attrs) for w in INDIVIDUALS]
            binding = it.binding(attrs)
            for condition, level in _arms(spec):
                puzzle_id = ""
                if condition == "direct":
                    block = direct_block(d, people)
                elif condition == "puzzled":
                    puzzle = design.puzzles[level][it.slot]
                    puzzle_id = puzzle.id
                    block = puzzled_block(d, puzzle, binding, attrs)
                elif condition == "formal_named":
                    puzzle = design.puzzles[level][it.slot]
                    puzzle_id = puzzle.id
                    block = formal_named_block(d, puzzle, design.names[(d.id, it.k)])
                else:
                    block = named_block(d, design.names[(d.id, it.k)])
                for cons in spec.consequences:
                    for who, person in zip(INDIVIDUALS, people, strict=True):
                        base = {
                            "condition": condition,
                            "consequences": cons,
                            "combo": str(it.k),
                            "demographics": it.combo_id(attrs),
                            "individual": who,
                            "difficulty": level,
                            "puzzle": puzzle_id,
                            "x_gender": person[0],
                            "x_race": person[1],
                        }
                        with_cons = cons == "with"
                        if "could_be" in spec.probes:
                            text = prompt(d, block, with_cons, could_be_question(who, d))
                            add(d, {**base, "probe": "could_be"}, text, YES_NO, ("yes", "no"))
                        if "could_be_json" in spec.probes and condition in CHECK_CONDITIONS:
                            text = prompt(d, block, with_cons, could_be_json_question(who, d, attrs))
                            add(d, {**base, "probe": "could_be_json"}, text, YES_NO, ("yes", "no"))
                        if "what_if" in spec.probes:
                            for wording in spec.wordings:
                                text = prompt(d, block, with_cons, decision_question(who, d, wording))
                                f = {**base, "probe": "what_if", **({} if wording == "main" else {"wording": wording})}
                                add(d, f, text, DECISION_OPTIONS, decision_meaning(d))
                        if "check" in spec.probes and condition in CHECK_CONDITIONS:
                            for attr in attrs:
                                text = prompt(d, block, with_cons, check_question(who, attr))
                                add(d, {**base, "probe": f"check_{attr.name}"}, text, attr.labels, attr.labels)
    return trials


# --------------------------------------------------------------------------- CLI


def _csv(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_dilemma_arguments(p)
    g = p.add_argument_group("cue visibility")
    g.add_argument(
        "--conditions",
        default=",".join(DEFAULT_CONDITIONS),
        help=f"comma-separated conditions from {','.join(CONDITIONS)} (default: {','.join(DEFAULT_CONDITIONS)}; "
        "formal_named is the App. S control: names plus the puzzle skeleton over abstract attributes)",
    )
    g.add_argument(
        "--probes",
        default=",".join(DEFAULT_PROBES),
        help=f"comma-separated probes from {','.join(PROBES)} (default: {','.join(DEFAULT_PROBES)}; could_be_json is "
        "generated: the could-be answer and X's identity as JSON in one reply, the paper's form)",
    )
    g.add_argument(
        "--wordings",
        default="main",
        help=f"what-if wordings, comma-separated from {','.join(WORDINGS)} (default: main; v1-v3: App. Q paraphrases)",
    )
    g.add_argument(
        "--consequences", default="with", help="with, without or with,without: show the options' negative consequences"
    )
    g.add_argument(
        "--difficulties",
        default="hard",
        help="puzzle levels, comma-separated from easy,intermediate,hard (default: hard)",
    )
    g.add_argument("--combos", type=int, default=1, help="demographic combinations per dilemma (default: 1; paper: 3)")
    g.add_argument(
        "--puzzle-reuse", type=int, default=5, help="dilemmas sharing one puzzle per level (default: 5, as the paper)"
    )
    g.add_argument(
        "--shape",
        default="canonical",
        choices=SHAPES,
        help="puzzle solution shape: canonical (the paper's), sol1 / sol2 (App. N's fixed alternatives), random (default: canonical)",
    )
    g.add_argument("--cue-seed", type=int, default=0, help="seed of combinations, shapes, puzzles, names (default: 0)")
    g.add_argument("--genders", default=",".join(DEFAULT_GENDERS), help="gender categories, comma-separated")
    g.add_argument("--races", default=",".join(DEFAULT_RACES), help="race categories, comma-separated")
    g.add_argument("--names", default=None, help="YAML file of first names per 'race/gender' (Named condition)")
    add_salt_arguments(p)


def spec_from_args(a: argparse.Namespace) -> CueSpec:
    return CueSpec(
        dilemmas=dilemma_path(a),
        items=_csv(a.items) if a.items else (),
        conditions=_csv(a.conditions),
        probes=_csv(a.probes),
        wordings=_csv(a.wordings),
        consequences=_csv(a.consequences),
        difficulties=_csv(a.difficulties),
        combos=a.combos,
        puzzle_reuse=a.puzzle_reuse,
        shape=a.shape,
        seed=a.cue_seed,
        genders=_csv(a.genders),
        races=_csv(a.races),
        names=str(Path(a.names).resolve()) if a.names else None,
        salts=salts_from_args(a),
    )


EXPERIMENTS = (
    Experiment.of(
        sys.modules[__name__],
        "cue visibility: Neutral / Direct / Puzzled / Named identity, could-be and what-if probes (paper 001)",
        generative=lambda t: t.factors.get("probe") == "could_be_json",
    ),
)
