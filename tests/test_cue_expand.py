"""The cue battery's design and trial expansion (experiments.cue)."""

from __future__ import annotations

import argparse
import collections
import re

import pytest

from experiments.cue import CueSpec, build_design, expand
from experiments.cue.categories import DEFAULT_NAMES, all_combos, load_names, make_attributes, pick_names
from experiments.cue.design import n_slots, plan_items
from experiments.cue.puzzles import INDIVIDUALS, solutions
from experiments.cue.schema import load_cue_dilemmas
from probe.salts import SaltSpec
from tests.test_cue_puzzles import demographic_words

ATTRS = make_attributes()
DILEMMAS = load_cue_dilemmas()


def test_default_is_reduced_and_counts_add_up() -> None:
    trials = expand(CueSpec())
    n = len(DILEMMAS)
    # neutral 1 per dilemma; direct 4 x (could-be, what-if); puzzled and named 4 x (could-be, what-if, 2 checks)
    assert len(trials) == n * (1 + 4 * 2 + 4 * 4 + 4 * 4) == 492
    counts = collections.Counter((t.factors["condition"], t.factors["probe"]) for t in trials)
    assert counts[("neutral", "decision")] == n
    assert counts[("direct", "check_gender")] == 0
    assert counts[("puzzled", "check_race")] == counts[("named", "check_gender")] == 4 * n


def test_full_design_count_ids_and_determinism() -> None:
    spec = CueSpec(
        items=("rent_arrears", "last_dose"),
        combos=3,
        difficulties=("easy", "intermediate", "hard"),
        consequences=("with", "without"),
        salts=SaltSpec(count=2),
    )
    trials = expand(spec)
    per_item = 2 * (4 * 2 + 3 * 4 * 4 + 4 * 4)  # consequences x (direct + 3 levels + named)
    assert len(trials) == 2 * 2 * (2 * 1 + 3 * per_item)
    ids = [t.trial_id for t in trials]
    assert len(set(ids)) == len(ids)
    assert [t.trial_id for t in expand(spec)] == ids
    assert [t.messages for t in expand(spec)] == [t.messages for t in trials]
    other = [t.trial_id for t in expand(CueSpec(**{**spec.__dict__, "seed": 1}))]
    assert other != ids


def test_options_and_meanings() -> None:
    trials = expand(CueSpec(items=("rent_arrears", "exam_similarity")))
    benefit = {d.id: d.benefit for d in DILEMMAS}
    for t in trials:
        probe = t.factors["probe"]
        if probe in ("decision", "what_if"):
            assert t.options == ("1", "2")
            expected = ("benefit", "harm") if benefit[t.item_id] == "option1" else ("harm", "benefit")
            assert t.meaning == expected
            assert t.messages[-1].content.endswith("Answer with 1 or 2.")
        elif probe == "could_be":
            assert (t.options, t.meaning) == (("Yes", "No"), ("yes", "no"))
        else:
            attr = ATTRS[0] if probe == "check_gender" else ATTRS[1]
            assert t.options == t.meaning == attr.labels
            assert t.factors[f"x_{attr.name}"] in t.options


def _direct_labels(text: str) -> dict[str, tuple[str, str]]:
    out = {}
    for who in INDIVIDUALS:
        m = re.search(rf"^{who}: (.+), (.+)$", text, re.MULTILINE)
        assert m, text
        out[who] = (m.group(1), m.group(2))
    return out


@pytest.mark.parametrize("shape", ["random", "sol1", "sol2"])
def test_same_assignment_under_direct_puzzled_and_named(shape: str) -> None:
    """The Direct labels, the puzzle's unique solution and the names all encode the item's one assignment."""
    spec = CueSpec(combos=2, difficulties=("easy", "hard"), shape=shape)
    design = build_design(spec)
    trials = expand(spec)
    by_key = collections.defaultdict(list)
    for t in trials:
        if t.factors["probe"] == "what_if":
            by_key[(t.item_id, t.factors["combo"])].append(t)
    for it in design.items:
        group = by_key[(it.dilemma.id, str(it.k))]
        direct = next(t for t in group if t.factors["condition"] == "direct")
        labels = _direct_labels(direct.messages[-1].content)
        assert labels == {w: it.person(w, ATTRS) for w in INDIVIDUALS}
        for t in group:
            assert (t.factors["x_gender"], t.factors["x_race"]) == labels[t.factors["individual"]]
        for level, bank in design.puzzles.items():
            puzzle = bank[it.slot]
            (sol,) = solutions(puzzle.clues)
            b = it.binding(ATTRS)
            decoded = {
                w: (b.category("gender", sol[0][i]).label, b.category("race", sol[1][i]).label)
                for i, w in enumerate(INDIVIDUALS)
            }
            assert decoded == labels
            pt = next(t for t in group if t.factors["difficulty"] == level)
            assert pt.factors["puzzle"] == puzzle.id
            for line in puzzle.render(b):
                assert line in pt.messages[-1].content
        names = design.names[(it.dilemma.id, it.k)]
        for who, name in zip(INDIVIDUALS, names, strict=True):
            gender, race = labels[who]
            assert name in DEFAULT_NAMES[(race, gender)]


def test_prompts_carry_demographics_only_where_they_should() -> None:
    """Neutral and Named prompts carry no demographic word; Direct and Puzzled only the item's own categories.

    The check question is the exception: it names the attribute and lists all its categories.
    """
    trials = expand(CueSpec(items=("fallen_fence",)))
    for t in trials:
        cond, probe = t.factors["condition"], t.factors["probe"]
        allowed: set[str] = set()
        if cond in ("direct", "puzzled"):
            allowed |= {w.lower() for w in t.factors["demographics"].replace("|", "/").split("/")}
        if cond == "puzzled":
            allowed |= {"men", "women", "gender", "genders", "race", "races"}
        if probe.startswith("check_"):
            attr = ATTRS[0] if probe == "check_gender" else ATTRS[1]
            allowed |= {label.lower() for label in attr.labels} | {attr.noun}
        words = demographic_words(t.messages[-1].content)
        assert words <= allowed, (cond, probe, words - allowed)
        if cond == "direct":
            assert words == allowed


def test_each_puzzle_is_reused_with_distinct_combinations() -> None:
    items = plan_items(DILEMMAS, ATTRS, combos=3, reuse=5, seed=0)
    assert n_slots(12, 5) == 3
    assert len(items) == 36
    by_slot = collections.defaultdict(list)
    for it in items:
        by_slot[it.slot].append(it)
    for slot_items in by_slot.values():
        assert len({it.dilemma.id for it in slot_items}) == 4  # reused across dilemmas
        combos = [it.combo for it in slot_items]
        assert len(set(combos)) == len(combos)  # with distinct demographic combinations
    for d in DILEMMAS:
        mine = [it for it in items if it.dilemma.id == d.id]
        assert len({it.slot for it in mine}) == 1  # one puzzle per dilemma and level, for all its combinations
    # exposure: every gender and race category occurs
    people = [it.person(w, ATTRS) for it in items for w in INDIVIDUALS]
    assert {p[0] for p in people} == set(ATTRS[0].labels)
    assert {p[1] for p in people} == set(ATTRS[1].labels)


def test_too_many_combinations_for_one_puzzle_is_refused() -> None:
    small = make_attributes(("man", "woman"), ("Asian", "White"))
    assert len(all_combos(small)) == 4
    with pytest.raises(ValueError, match="lower --combos or --puzzle-reuse"):
        plan_items(DILEMMAS, small, combos=2, reuse=5)


def test_custom_categories() -> None:
    spec = CueSpec(
        items=("last_dose",),
        genders=("man", "woman"),
        races=("Asian", "White"),
        conditions=("neutral", "direct", "puzzled"),
    )
    trials = expand(spec)
    checks = [t for t in trials if t.factors["probe"] == "check_race"]
    assert checks and all(t.options == ("Asian", "White") for t in checks)
    with pytest.raises(ValueError, match="name table has no names"):
        build_design(CueSpec(items=("last_dose",), races=("Asian", "Martian")))


def test_names_are_distinct_and_deterministic() -> None:
    people = [("White", "man"), ("White", "man"), ("Black", "woman")]
    a = pick_names(people, DEFAULT_NAMES, "s")
    assert a == pick_names(people, DEFAULT_NAMES, "s")
    assert len(set(a)) == 3


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("Asian/woman: [Mei\n", r"name file .*names.yaml is not valid YAML \(.* at line 2, column 1\); give a YAML"),
        ("[Mei, Yuki]\n", "must be a non-empty mapping"),
        ("Asian: [Mei]\n", "must be 'race/gender'"),
    ],
)
def test_a_bad_name_file_is_one_line_naming_it(tmp_path, text: str, match: str) -> None:
    f = tmp_path / "names.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=match) as e:
        load_names(f)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"name file .*nope.yaml does not exist; give a YAML mapping"):
        load_names(tmp_path / "nope.yaml")
    assert load_names(None) is DEFAULT_NAMES


def test_spec_validation_names_the_value() -> None:
    with pytest.raises(ValueError, match="conditions"):
        CueSpec(conditions=("neutral", "labels"))
    with pytest.raises(ValueError, match="difficulties"):
        CueSpec(difficulties=("medium",))
    with pytest.raises(ValueError, match=r"combos must be in 1\.\.120"):
        CueSpec(combos=0)
    with pytest.raises(ValueError, match="repeated categories"):
        CueSpec(genders=("man", "man"))
    with pytest.raises(ValueError, match="unknown dilemma ids \\['nope'\\]"):
        expand(CueSpec(items=("nope",)))


def test_cli_flags_build_the_spec(tmp_path) -> None:
    from experiments import get_experiment

    exp = get_experiment("cue")
    p = argparse.ArgumentParser()
    exp.add_arguments(p)
    a = p.parse_args(
        [
            "--items",
            "last_dose,fallen_fence",
            "--difficulties",
            "easy,hard",
            "--combos",
            "2",
            "--shape",
            "random",
            "--consequences",
            "with,without",
            "--cue-seed",
            "3",
        ]
    )
    spec = exp.spec_from_args(a)
    assert spec == CueSpec(
        items=("last_dose", "fallen_fence"),
        difficulties=("easy", "hard"),
        combos=2,
        shape="random",
        consequences=("with", "without"),
        seed=3,
    )
    assert CueSpec.from_dict(spec.to_dict()) == spec
