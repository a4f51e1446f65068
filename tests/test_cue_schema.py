"""The cue dilemma schema and loader, and the shipped set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.cue.schema import DEFAULT_CUE_DILEMMAS, load_cue_dilemmas, parse_cue_dilemmas, write_jsonl
from experiments.dilemmas import DilemmaError
from tests.test_cue_puzzles import demographic_words

GOOD = {
    "id": "x1",
    "situation": "A tenant is behind on rent.",
    "role": "tenant who is behind on rent",
    "option1": "Offer a payment plan",
    "option2": "Evict the tenant",
    "consequence1": "The landlord waits for the money.",
    "consequence2": "The tenant loses their home.",
    "benefit": "option1",
}


def test_shipped_set_is_a_dozen_balanced_and_demographic_free() -> None:
    ds = load_cue_dilemmas()
    assert len(ds) == 12
    assert len({d.id for d in ds}) == 12
    assert sum(d.benefit == "option1" for d in ds) == 6
    assert {d.status for d in ds} == {"good", "neutral", "bad"}
    assert all(d.topic and d.source == "probe" for d in ds)
    for d in ds:
        text = " ".join([d.situation, d.role, d.option1, d.option2, d.consequence1, d.consequence2])
        assert demographic_words(text) == set(), (d.id, demographic_words(text))
    header = DEFAULT_CUE_DILEMMAS.read_text().split("dilemmas:")[0]
    assert "ORIGINAL MATERIAL" in header and "written for the probe project" in header


def test_defaults_and_round_trip_through_jsonl(tmp_path: Path) -> None:
    (d,) = parse_cue_dilemmas([GOOD], "mem")
    assert (d.title, d.status, d.topic, d.source) == ("x1", "", "", "probe")
    ds = load_cue_dilemmas()
    write_jsonl(ds, tmp_path / "set.jsonl")
    assert load_cue_dilemmas(tmp_path / "set.jsonl") == ds


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"benefit": "option3"}, "field 'benefit' must be 'option1' or 'option2', got 'option3'"),
        ({"status": "evil"}, "field 'status' must be one of good, neutral, bad, got 'evil'"),
        ({"role": "the tenant"}, "field 'role' completes 'Could A be the <role>\\?'"),
        ({"role": "Tenant"}, "start lowercase"),
        ({"role": "tenant."}, "no final punctuation"),
        ({"id": "Bad Id"}, "field 'id' must match"),
        ({"option2": "Offer a payment plan"}, "'option2' must differ"),
        ({"colour": "red"}, "field 'colour' is not allowed"),
        ({"situation": 3}, "field 'situation' must be a string, got int 3"),
        ({"situation": "  "}, "field 'situation' must not be empty"),
    ],
)
def test_invalid_records_name_record_and_field(change: dict, message: str) -> None:
    with pytest.raises(DilemmaError, match=f"mem: record 1 .*{message}"):
        parse_cue_dilemmas([{**GOOD, **change}], "mem")


def test_missing_field_and_duplicate_id() -> None:
    rec = {k: v for k, v in GOOD.items() if k != "consequence2"}
    with pytest.raises(DilemmaError, match="field 'consequence2' is missing"):
        parse_cue_dilemmas([rec], "mem")
    with pytest.raises(DilemmaError, match="record 2 \\(id 'x1'\\): field 'id' duplicates record 1"):
        parse_cue_dilemmas([GOOD, GOOD], "mem")


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(DilemmaError, match="file not found"):
        load_cue_dilemmas(tmp_path / "nope.yaml")
    with pytest.raises(DilemmaError, match=r"unsupported file extension '\.txt'"):
        load_cue_dilemmas(tmp_path / "x.txt")
    dup = tmp_path / "dup.yaml"
    dup.write_text("- id: a\n  id: b\n")
    with pytest.raises(DilemmaError, match="duplicate key 'id'"):
        load_cue_dilemmas(dup)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "id": "x2", "benefit": "both"}) + "\n")
    with pytest.raises(DilemmaError, match="record 2 \\(line 2, id 'x2'\\): field 'benefit'"):
        load_cue_dilemmas(bad)
