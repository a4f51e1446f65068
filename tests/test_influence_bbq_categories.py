"""BBQ beyond Age (issue 19, point 3): every upstream category, each matched the way upstream encodes it.

The records in tests/data/bbq (provenance and licence in its README) hold a
few ambiguous and disambiguated rows per category; the loader must keep the
ambiguous ones and put the stereotyped group on side B in each.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.influence import bbq

DATA = Path(__file__).parent / "data" / "bbq"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "bbq"
CATEGORIES = (
    "Age",
    "Disability_status",
    "Gender_identity",
    "Nationality",
    "Physical_appearance",
    "Race_ethnicity",
    "Race_x_SES",
    "Race_x_gender",
    "Religion",
    "SES",
    "Sexual_orientation",
)
# per category: the side-B answers (the stereotyped group) of its ambiguous rows, in file order
EXPECTED_B = {
    "Age": ["grandfather", "grandmother"],
    "Disability_status": ["man with the wheelchair"],
    "Gender_identity": ["girl", "woman"],
    "Nationality": ["Guinean", "British"],
    "Physical_appearance": ["fat", "fat"],
    "Race_ethnicity": ["Black", "Jamal Branch"],
    "Race_x_SES": ["Black, low-income"],
    "Race_x_gender": ["Black woman", "Black woman"],
    "Religion": ["Muslim"],
    "SES": ["cashier"],
    "Sexual_orientation": ["gay", "bisexual"],
}


@pytest.fixture(scope="module")
def loaded() -> bbq.BBQLoad:
    bd = bbq.load_bbq_design(None)
    return bbq.load_bbq(DATA, bd.aliases, bd.side_b)


def test_every_category_has_a_file_and_usable_items(loaded: bbq.BBQLoad) -> None:
    assert sorted(Path(f).stem for f in loaded.files) == sorted(CATEGORIES)
    assert loaded.skipped == {}
    got: dict[str, list[str]] = {}
    for item in loaded.items:
        got.setdefault(item.category, []).append(item.b_name)
    assert got == EXPECTED_B
    assert all(i.stereotyped == "B" for i in loaded.items if i.category not in ("Age", "SES"))


def test_nationality_matches_the_name_not_the_region_tag(loaded: bbq.BBQLoad) -> None:
    nat = [i for i in loaded.items if i.category == "Nationality"]
    assert [(i.a_name, i.a_tag, i.b_name, i.b_tag) for i in nat] == [
        ("Somali", "ArabStates", "Guinean", "Africa"),
        ("Brazilian", "LatinSouthAmerica", "British", "Europe"),
    ]
    labels = bbq.load_bbq_design(None).labels
    assert labels.side("Nationality", "Europe", "British") == ("British people", "a British person")


def test_gender_words_match_f_and_m_and_label_as_their_group(loaded: bbq.BBQLoad) -> None:
    labels = bbq.load_bbq_design(None).labels
    girl = next(i for i in loaded.items if i.category == "Gender_identity" and i.b_tag == "girl")
    assert labels.side(girl.category, girl.b_tag, girl.b_name) == ("women", "a woman")


def test_intersectional_tags_match_whole_before_parts() -> None:
    canon = bbq._norm
    # F-Black vs M-Black against ["F-Black"]: the whole tag singles out one answer
    assert bbq.stereotyped_hits("Race_x_gender", [("w", "F-Black"), ("m", "M-Black")], {"fblack"}, canon) == [
        True,
        False,
    ]
    # against ["Black"] both parts match: no unique stereotyped answer
    assert bbq.stereotyped_hits("Race_x_gender", [("w", "F-Black"), ("m", "M-Black")], {"black"}, canon) == [True, True]
    # Nationality by name; the region tag is ignored even if it were listed
    assert bbq.stereotyped_hits("Nationality", [("Irish", "Europe"), ("Japanese", "AsiaPacific")], {"japanese", "europe"},
                                canon) == [False, True]  # fmt: skip


@pytest.mark.skipif(not (SHARED / "Age.jsonl").exists(), reason="shared BBQ sample absent")
def test_usable_count_of_the_shared_age_file() -> None:
    bd = bbq.load_bbq_design(None)
    loaded = bbq.load_bbq(SHARED / "Age.jsonl", bd.aliases, bd.side_b)
    assert len(loaded.items) == 1840 and loaded.skipped == {}  # the count docs/influence.md states
