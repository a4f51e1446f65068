"""Puzzle generator of the cue-visibility design: uniqueness, planted solution, difficulty, text.

The solver here is written independently of :mod:`experiments.cue.puzzles`: it
reads only the JSON structured form (``Puzzle.to_dict()``) and enumerates every
assignment itself, so a bug in the generator's own clue semantics cannot hide.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest

from experiments.cue.categories import DEFAULT_GENDERS, DEFAULT_RACES, all_combos, make_attributes
from experiments.cue.puzzles import (
    CANONICAL_SHAPE,
    DEFAULT_WEIGHTS,
    DIFFICULTIES,
    Biconditional,
    Count,
    Equivalence,
    Implication,
    Literal,
    Negation,
    Puzzle,
    band_of,
    binding_for,
    domain_sentence,
    generate_puzzle,
    placeholder_binding,
    random_shape,
    shape_structure,
    solutions,
)

ATTRS = make_attributes()
#: Words that would carry demographic content into a text (checked as whole words, case-insensitive).
DEMOGRAPHIC_WORDS = {
    *(w.lower() for w in DEFAULT_GENDERS + DEFAULT_RACES),
    *[
        "men",
        "women",
        "male",
        "female",
        "boy",
        "boys",
        "girl",
        "girls",
        "he",
        "she",
        "him",
        "her",
        "his",
        "hers",
        "himself",
        "herself",
        "husband",
        "wife",
    ],
    *[
        "mother",
        "father",
        "son",
        "daughter",
        "sister",
        "brother",
        "gender",
        "genders",
        "race",
        "races",
        "ethnic",
        "ethnicity",
        "religion",
    ],
    *[
        "christian",
        "jewish",
        "hindu",
        "african",
        "european",
        "latino",
        "latina",
        "arab",
        "chinese",
        "japanese",
        "korean",
    ],
}


def demographic_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+(?:-[a-z]+)?", text.lower()) if w in DEMOGRAPHIC_WORDS}


# --------------------------------------------------------------------------- the independent solver


def _lit(lit: dict, a: dict) -> bool:
    return (a[lit["who"]][lit["attr"]] == lit["value"]) == lit["positive"]


def _holds(clue: dict, a: dict) -> bool:
    t = clue["type"]
    if t == "negation":
        return a[clue["who"]][clue["attr"]] != clue["value"]
    if t == "equivalence":
        x, y = clue["who"]
        return (a[x][clue["attr"]] == a[y][clue["attr"]]) == clue["same"]
    if t == "count":
        return sum(a[w][clue["attr"]] == clue["value"] for w in clue["who"]) == clue["k"]
    if t == "implication":
        return (not _lit(clue["if"], a)) or _lit(clue["then"], a)
    if t == "biconditional":
        return _lit(clue["left"], a) == _lit(clue["right"], a)
    raise AssertionError(f"unknown clue type {t}")


def brute_force(form: dict) -> list[dict]:
    """Every assignment (individual -> attribute -> value) that satisfies all clues of the JSON form."""
    people, attrs = form["individuals"], list(form["attributes"])
    slots = [(w, at) for w in people for at in attrs]
    found = []
    for values in itertools.product(*(form["attributes"][at] for _, at in slots)):
        a: dict = {w: {} for w in people}
        for (w, at), v in zip(slots, values, strict=True):
            a[w][at] = v
        if all(_holds(c, a) for c in form["clues"]):
            found.append(a)
    return found


def _band(mean: float) -> str:
    return "easy" if mean <= 2 else ("intermediate" if mean <= 4 else "hard")


# --------------------------------------------------------------------------- hundreds of puzzles


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_hundreds_of_puzzles_are_unique_planted_in_band_and_minimal(difficulty: str) -> None:
    shapes = [CANONICAL_SHAPE] + [random_shape(f"t{i}") for i in range(4)]
    for seed in range(100):  # x 3 difficulties = 300 puzzles
        shape = shapes[seed % len(shapes)]
        p = generate_puzzle(shape, difficulty, f"test:{seed}")
        form = json.loads(json.dumps(p.to_dict()))  # only the serialized structured form from here on
        found = brute_force(form)
        assert found == [form["solution"]], f"{p.id}: {len(found)} solutions"
        assert form["solution"] == {w: {"gender": shape[0][i], "race": shape[1][i]} for i, w in enumerate("ABCD")}
        weights = form["weights"]
        mean = sum(weights[c["type"]] for c in form["clues"]) / len(form["clues"])
        assert mean == pytest.approx(form["mean_weight"])
        assert _band(mean) == difficulty == form["difficulty"]
        kinds = [c["type"] for c in form["clues"]]
        assert len(set(kinds)) >= 2 and 2 * kinds.count("negation") <= len(kinds)
        for i in range(len(form["clues"])):  # minimal: every clue is needed
            fewer = dict(form, clues=form["clues"][:i] + form["clues"][i + 1 :])
            assert len(brute_force(fewer)) > 1


def test_generation_is_deterministic_and_seed_dependent() -> None:
    a = [generate_puzzle(CANONICAL_SHAPE, d, "s1").to_dict() for d in DIFFICULTIES]
    b = [generate_puzzle(CANONICAL_SHAPE, d, "s1").to_dict() for d in DIFFICULTIES]
    c = [generate_puzzle(CANONICAL_SHAPE, d, "s2").to_dict() for d in DIFFICULTIES]
    assert a == b
    assert a != c


def test_structured_form_round_trips() -> None:
    p = generate_puzzle(random_shape("x"), "hard", "rt", puzzle_id="hard-007")
    q = Puzzle.from_dict(json.loads(json.dumps(p.to_dict())))
    assert q == p
    assert solutions(q.clues) == [p.solution]


def test_band_edges() -> None:
    assert [band_of(x) for x in (0, 1.5, 2, 2.01, 4, 4.01, 6)] == [
        "easy",
        "easy",
        "easy",
        "intermediate",
        "intermediate",
        "hard",
        "hard",
    ]
    with pytest.raises(ValueError, match=">= 0"):
        band_of(-1)


def test_bad_generator_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="unknown difficulty 'medium'"):
        generate_puzzle(CANONICAL_SHAPE, "medium", "s")
    with pytest.raises(ValueError, match="one non-negative number per clue type"):
        generate_puzzle(CANONICAL_SHAPE, "easy", "s", weights={"negation": 1})
    with pytest.raises(RuntimeError, match="no hard puzzle"):
        generate_puzzle(CANONICAL_SHAPE, "hard", "s", max_clues=2, max_attempts=20)


# --------------------------------------------------------------------------- shapes


def test_canonical_shape_is_the_papers() -> None:
    # A and B share gender slot 0, C and D slot 1; A and C share race slot 0, B and D slot 1.
    assert CANONICAL_SHAPE == ((0, 0, 1, 1), (0, 1, 0, 1))


def test_random_shapes_use_each_cell_once_and_differ_from_canonical() -> None:
    seen = set()
    for i in range(40):
        s = random_shape(str(i))
        assert sorted(zip(*s, strict=True)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert shape_structure(s) != shape_structure(CANONICAL_SHAPE)
        seen.add(shape_structure(s))
    assert len(seen) == 5  # the other five structures all occur


def test_fixed_alternative_shapes_are_balanced_and_unlike_the_canonical_one() -> None:
    """App. N's sol1 and sol2: each (gender, race) cell once, and three different structures with the canonical."""
    from experiments.cue.design import FIXED_SHAPES, slot_shapes
    from experiments.cue.puzzles import SOL1_SHAPE, SOL2_SHAPE

    for s in (SOL1_SHAPE, SOL2_SHAPE):
        assert sorted(zip(*s, strict=True)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len({shape_structure(s) for s in (CANONICAL_SHAPE, SOL1_SHAPE, SOL2_SHAPE)}) == 3
    assert slot_shapes(4, "sol1", 0) == (SOL1_SHAPE,) * 4 and FIXED_SHAPES["sol2"] == SOL2_SHAPE
    for difficulty in ("easy", "hard"):
        p = generate_puzzle(SOL2_SHAPE, difficulty, "fixed")
        assert solutions(p.clues) == [SOL2_SHAPE]


# --------------------------------------------------------------------------- text


def test_rendered_clues_hand_examples() -> None:
    b = binding_for((0, 1, 1, 4), ATTRS)  # slot 0/1: man/woman, Black/White
    assert Negation("A", "gender", 1).render(b) == "A is not a woman."
    assert Negation("B", "race", 0).render(b) == "B is not Black."
    assert Equivalence(("A", "C"), "race", True).render(b) == "A and C have the same race."
    assert Equivalence(("B", "D"), "gender", False).render(b) == "B and D have different genders."
    assert Count(("A", "B", "D"), "gender", 1, 2).render(b) == "Exactly two of A, B and D are women."
    assert Count(("A", "C"), "race", 1, 1).render(b) == "Exactly one of A and C is White."
    assert Count(("A", "B", "C", "D"), "gender", 0, 3).render(b) == "Exactly three of the four people are men."
    imp = Implication(Literal("A", "gender", 0), Literal("D", "race", 0, positive=False))
    assert imp.render(b) == "If A is a man, then D is not Black."
    bic = Biconditional(Literal("B", "race", 1), Literal("C", "gender", 1))
    assert bic.render(b) == "B is White if and only if C is a woman."
    assert domain_sentence(b, ATTRS) == "Each of A, B, C and D is either a man or a woman, and either Black or White."


def test_domain_sentence_lists_categories_in_configured_order_not_slot_order() -> None:
    b = binding_for((2, 0, 4, 0), ATTRS)  # slot 0 = non-binary / White
    assert (
        domain_sentence(b, ATTRS) == "Each of A, B, C and D is either a man or non-binary, and either Asian or White."
    )


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_puzzle_text_mentions_no_demographic_word(difficulty: str) -> None:
    """The puzzle's own text is demographic-free: rendered on abstract slots it has no demographic word,
    and bound to an item it names only that item's categories (the attribute nouns aside)."""
    combos = all_combos(ATTRS)
    for seed in range(20):
        p = generate_puzzle(random_shape(str(seed)) if seed % 2 else CANONICAL_SHAPE, difficulty, f"w{seed}")
        skeleton = " ".join(p.render(placeholder_binding()))
        assert demographic_words(skeleton) == set(), skeleton
        combo = combos[(7 * seed) % len(combos)]
        b = binding_for(combo, ATTRS)
        text = " ".join(p.render(b))
        allowed = {"gender", "genders", "race", "races"}
        for attr in ("gender", "race"):
            for v in (0, 1):
                c = b.category(attr, v)
                allowed |= {w.lower() for w in (c.label, c.plural, c.singular.split()[-1])}
        assert demographic_words(text) <= allowed, (combo, text)


def test_clue_constructors_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="unknown individual 'E'"):
        Negation("E", "gender", 0)
    with pytest.raises(ValueError, match="unknown attribute 'age'"):
        Negation("A", "age", 0)
    with pytest.raises(ValueError, match="0 or 1"):
        Negation("A", "gender", 2)
    with pytest.raises(ValueError, match="two different individuals"):
        Equivalence(("A", "A"), "gender", True)
    with pytest.raises(ValueError, match="count k"):
        Count(("A", "B"), "gender", 0, 3)


def test_default_weights_span_the_three_bands() -> None:
    assert DEFAULT_WEIGHTS == {"negation": 1, "equivalence": 2, "count": 3, "implication": 5, "biconditional": 6}
