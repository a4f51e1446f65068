"""The item design: which demographic combination and which puzzle each dilemma gets.

Following paper 001 (Section 3.3): every dilemma is paired with ``combos``
distinct demographic combinations (an *item* is a dilemma with one
combination); at each difficulty level a dilemma gets one puzzle, used with
all of its combinations; and each puzzle is reused for up to ``reuse``
dilemmas, always with distinct combinations, so the puzzle text cannot drive
a demographic correlation. Dilemma ``i`` (in file order) uses puzzle slot
``i mod n_slots`` with ``n_slots = ceil(n_dilemmas / reuse)``; slot ``s`` has
one solution shape shared by all levels, so an item's demographic assignment
is the same under Direct and under every Puzzled level.

Combinations are drawn from a seeded shuffle of all ordered combinations
(120 by default), walked cyclically, skipping one already used by the same
puzzle slot; this keeps exposure to every category nearly balanced.
Everything is a pure function of the inputs and the seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from experiments.cue.categories import Attribute, Combo, all_combos, combo_labels
from experiments.cue.puzzles import (
    ATTRIBUTES,
    CANONICAL_SHAPE,
    INDIVIDUALS,
    SOL1_SHAPE,
    SOL2_SHAPE,
    Assignment,
    Binding,
    Puzzle,
    binding_for,
    generate_puzzle,
    random_shape,
)
from experiments.cue.schema import CueDilemma

SHAPES = ("canonical", "sol1", "sol2", "random")
FIXED_SHAPES: dict[str, Assignment] = {"canonical": CANONICAL_SHAPE, "sol1": SOL1_SHAPE, "sol2": SOL2_SHAPE}
"""The shapes every puzzle of a run shares: the paper's canonical one and App. N's two fixed alternatives."""


@dataclass(frozen=True)
class Item:
    """One dilemma with one demographic combination and its puzzle slot."""

    dilemma: CueDilemma
    k: int
    """Index of the combination within the dilemma (0..combos-1)."""
    slot: int
    """Puzzle slot: the item's puzzle at level L is ``bank[L][slot]``."""
    combo: Combo
    shape: Assignment
    """Which value slot each individual holds (the puzzles' planted solution)."""

    def binding(self, attributes: Sequence[Attribute]) -> Binding:
        return binding_for(self.combo, attributes)

    def person(self, who: str, attributes: Sequence[Attribute]) -> tuple[str, ...]:
        """The category labels of ``who``, one per attribute (gender, race)."""
        b = self.binding(attributes)
        i = INDIVIDUALS.index(who)
        return tuple(b.category(a, self.shape[ai][i]).label for ai, a in enumerate(ATTRIBUTES))

    def combo_id(self, attributes: Sequence[Attribute]) -> str:
        return combo_labels(self.combo, attributes)


def n_slots(n_dilemmas: int, reuse: int) -> int:
    if reuse < 1:
        raise ValueError(f"puzzle reuse must be >= 1 (dilemmas per puzzle), got {reuse}")
    return max(1, math.ceil(n_dilemmas / reuse))


def slot_shapes(n: int, shape: str, seed: int) -> tuple[Assignment, ...]:
    """The solution shape of each puzzle slot: a fixed one (canonical, sol1, sol2) for all, or a random one per slot."""
    if shape not in SHAPES:
        raise ValueError(f"unknown puzzle shape {shape!r}; choose from {list(SHAPES)}")
    if shape in FIXED_SHAPES:
        return (FIXED_SHAPES[shape],) * n
    return tuple(random_shape(f"{seed}:{s}") for s in range(n))


def plan_items(
    dilemmas: Sequence[CueDilemma],
    attributes: Sequence[Attribute],
    *,
    combos: int = 1,
    reuse: int = 5,
    shape: str = "canonical",
    seed: int = 0,
) -> list[Item]:
    """The items in order (dilemma, then combination index)."""
    if combos < 1:
        raise ValueError(f"combos per dilemma must be >= 1, got {combos}")
    slots = n_slots(len(dilemmas), reuse)
    shapes = slot_shapes(slots, shape, seed)
    stream = all_combos(attributes)
    random.Random(f"probe-cue-combos:{seed}").shuffle(stream)
    per_slot = math.ceil(len(dilemmas) / slots) * combos
    if per_slot > len(stream):
        raise ValueError(
            f"a puzzle would need {per_slot} distinct demographic combinations but only {len(stream)} exist; "
            "lower --combos or --puzzle-reuse"
        )
    used: list[set[Combo]] = [set() for _ in range(slots)]
    pointer = 0
    items = []
    for i, d in enumerate(dilemmas):
        s = i % slots
        for k in range(combos):
            for step in range(len(stream)):
                c = stream[(pointer + step) % len(stream)]
                if c not in used[s]:
                    break
            used[s].add(c)
            pointer = (pointer + step + 1) % len(stream)
            items.append(Item(d, k, s, c, shapes[s]))
    return items


def puzzle_bank(difficulty: str, shapes: Sequence[Assignment], seed: int) -> tuple[Puzzle, ...]:
    """One verified puzzle per slot at ``difficulty``, deterministic in the seed."""
    return tuple(
        generate_puzzle(shape, difficulty, f"{seed}:{s}", puzzle_id=f"{difficulty}-{s:03d}")
        for s, shape in enumerate(shapes)
    )
