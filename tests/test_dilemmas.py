"""Tests for the shipped dilemma set and its loader.

The set is the fixed backbone every experiment crosses factors over, so these
tests pin both its content constraints (balance across kinds, wording that fits
the prompt templates) and the loader's promise that bad files fail loudly with
a message naming the file, record and field.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections import Counter
from typing import Any

import pytest
import yaml

from experiments.dilemmas import (
    ALLOWED_FIELDS,
    DEFAULT_DILEMMAS,
    KINDS,
    Dilemma,
    DilemmaError,
    load_dilemmas,
    parse_dilemmas,
)

# ---------------------------------------------------------------------------
# helpers


def _record(**overrides: Any) -> dict[str, Any]:
    """A valid raw record; ``overrides`` replace fields (``None`` deletes one)."""
    record: dict[str, Any] = {
        "id": "test_case",
        "title": "Test case",
        "kind": "sacrificial",
        "story": "You are standing beside a lever. A runaway cart is heading for five people.",
        "action": "pull the lever",
        "complement": "leave the lever alone and let the cart continue",
        "cbr_pole": "action",
        "source": "probe",
    }
    for key, value in overrides.items():
        if value is None:
            record.pop(key, None)
        else:
            record[key] = value
    return record


def _write_yaml(path: pathlib.Path, records: list[Any]) -> pathlib.Path:
    path.write_text(yaml.safe_dump({"dilemmas": records}, sort_keys=False), encoding="utf-8")
    return path


def _write_jsonl(path: pathlib.Path, records: list[Any]) -> pathlib.Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def shipped() -> tuple[Dilemma, ...]:
    return load_dilemmas()


# ---------------------------------------------------------------------------
# the shipped set


def test_default_path_points_at_shipped_file() -> None:
    assert DEFAULT_DILEMMAS.is_file()
    assert DEFAULT_DILEMMAS.name == "dilemmas.yaml"
    assert load_dilemmas(DEFAULT_DILEMMAS) == load_dilemmas()


def test_shipped_set_size_and_unique_ids(shipped: tuple[Dilemma, ...]) -> None:
    assert len(shipped) >= 18
    ids = [d.id for d in shipped]
    assert len(ids) == len(set(ids))


def test_shipped_set_balance(shipped: tuple[Dilemma, ...]) -> None:
    kinds = Counter(d.kind for d in shipped)
    assert set(kinds) <= set(KINDS)
    assert kinds["sacrificial"] >= 8
    assert kinds["omission"] >= 4
    poles = Counter(d.cbr_pole for d in shipped)
    assert poles["complement"] >= 2
    assert poles["action"] >= 2


def test_shipped_stories_fit_prompt_templates(shipped: tuple[Dilemma, ...]) -> None:
    for d in shipped:
        words = len(d.story.split())
        assert 40 <= words <= 200, (d.id, words)
        assert d.story.startswith("You "), d.id
        assert "?" not in d.story, d.id
        assert d.source == "probe", d.id
        for phrase in (d.action, d.complement):
            assert phrase[0].islower(), (d.id, phrase)
            assert phrase[-1] not in ".?!,;:", (d.id, phrase)
            assert not phrase.startswith(("to ", "not ")), (d.id, phrase)
            assert phrase == phrase.strip() and "  " not in phrase, (d.id, phrase)


def test_shipped_order_is_file_order(shipped: tuple[Dilemma, ...]) -> None:
    raw = yaml.safe_load(DEFAULT_DILEMMAS.read_text(encoding="utf-8"))["dilemmas"]
    assert [d.id for d in shipped] == [r["id"] for r in raw]


# ---------------------------------------------------------------------------
# Dilemma API


def test_pole_text_and_to_dict(shipped: tuple[Dilemma, ...]) -> None:
    d = shipped[0]
    assert d.pole_text("action") == d.action
    assert d.pole_text("complement") == d.complement
    assert d.cbr_text == d.pole_text(d.cbr_pole)
    with pytest.raises(ValueError, match="pole"):
        d.pole_text("acton")
    as_dict = d.to_dict()
    assert tuple(as_dict) == ALLOWED_FIELDS
    assert all(isinstance(v, str) for v in as_dict.values())
    assert parse_dilemmas([as_dict], "mem") == (d,)


def test_dilemma_is_frozen(shipped: tuple[Dilemma, ...]) -> None:
    with pytest.raises(AttributeError):
        shipped[0].id = "other"  # type: ignore[misc]


# ---------------------------------------------------------------------------
# round trips


def test_jsonl_round_trip(shipped: tuple[Dilemma, ...], tmp_path: pathlib.Path) -> None:
    path = _write_jsonl(tmp_path / "set.jsonl", [d.to_dict() for d in shipped])
    assert load_dilemmas(path) == shipped


def test_jsonl_blank_lines_skipped(tmp_path: pathlib.Path) -> None:
    a, b = _record(id="a"), _record(id="b")
    path = tmp_path / "set.jsonl"
    path.write_text(f"\n{json.dumps(a)}\n   \n{json.dumps(b)}\n\n", encoding="utf-8")
    assert [d.id for d in load_dilemmas(path)] == ["a", "b"]


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_yaml_round_trip(shipped: tuple[Dilemma, ...], tmp_path: pathlib.Path, suffix: str) -> None:
    path = _write_yaml(tmp_path / f"set{suffix}", [d.to_dict() for d in shipped])
    assert load_dilemmas(path) == shipped


def test_yaml_plain_list_and_string_path(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text(yaml.safe_dump([_record()]), encoding="utf-8")
    (d,) = load_dilemmas(str(path))
    assert d.id == "test_case"


def test_whitespace_stripped_and_source_defaults() -> None:
    (d,) = parse_dilemmas([_record(title="  Padded  \n", action=" pull the lever \n", source=None)], "mem")
    assert d.title == "Padded"
    assert d.action == "pull the lever"
    assert d.source == "probe"


# ---------------------------------------------------------------------------
# validation errors: file, record number and field are always named

# (record overrides, field the message must name)
INVALID_RECORDS: list[tuple[str, dict[str, Any], str]] = [
    ("missing_title", {"title": None}, "title"),
    ("missing_story", {"story": None}, "story"),
    ("missing_cbr_pole", {"cbr_pole": None}, "cbr_pole"),
    ("empty_action", {"action": "   "}, "action"),
    ("empty_source", {"source": ""}, "source"),
    ("non_string_story", {"story": 42}, "story"),
    ("non_string_id", {"id": 7}, "id"),
    ("bad_slug_upper", {"id": "Footbridge"}, "id"),
    ("bad_slug_dash", {"id": "foot-bridge"}, "id"),
    ("bad_cbr_pole", {"cbr_pole": "acton"}, "cbr_pole"),
    ("bad_kind", {"kind": "trolley"}, "kind"),
    ("action_period", {"action": "pull the lever."}, "action"),
    ("action_question", {"action": "pull the lever?"}, "action"),
    ("complement_bang", {"complement": "walk away!"}, "complement"),
    ("action_capital", {"action": "Pull the lever"}, "action"),
    ("same_phrases", {"complement": "pull the lever"}, "complement"),
    ("unknown_field", {"acton": "pull the lever"}, "acton"),
]


@pytest.mark.parametrize("suffix", [".yaml", ".jsonl"])
@pytest.mark.parametrize(
    ("overrides", "field"),
    [pytest.param(o, f, id=name) for name, o, f in INVALID_RECORDS],
)
def test_invalid_record_is_reported(tmp_path: pathlib.Path, suffix: str, overrides: dict[str, Any], field: str) -> None:
    records = [
        _record(id="first"),
        _record(id="second"),
        _record(**{"id": "third", **overrides}),
    ]
    writer = _write_yaml if suffix == ".yaml" else _write_jsonl
    path = writer(tmp_path / f"broken{suffix}", records)
    with pytest.raises(DilemmaError) as info:
        load_dilemmas(path)
    message = str(info.value)
    assert path.name in message
    assert "record 3" in message
    assert f"'{field}'" in message
    assert "\n" not in message


def test_error_message_shape(tmp_path: pathlib.Path) -> None:
    path = _write_yaml(
        tmp_path / "dilemmas.yaml",
        [_record(id="a"), _record(id="b"), _record(id="footbridge", cbr_pole="acton")],
    )
    with pytest.raises(DilemmaError) as info:
        load_dilemmas(path)
    assert str(info.value).endswith(
        "dilemmas.yaml: record 3 (id 'footbridge'): field 'cbr_pole' must be 'action' or 'complement', got 'acton'"
    )


def test_unknown_field_lists_allowed_fields() -> None:
    with pytest.raises(DilemmaError) as info:
        parse_dilemmas([_record(sorce="probe")], "mem.yaml")
    message = str(info.value)
    assert "'sorce'" in message
    for field in ALLOWED_FIELDS:
        assert field in message


def test_duplicate_id_names_both_records(tmp_path: pathlib.Path) -> None:
    path = _write_yaml(
        tmp_path / "dup.yaml",
        [_record(id="same"), _record(id="other"), _record(id="same")],
    )
    with pytest.raises(DilemmaError) as info:
        load_dilemmas(path)
    message = str(info.value)
    assert "dup.yaml" in message
    assert "record 3" in message and "record 1" in message
    assert "'id'" in message


def test_non_mapping_record(tmp_path: pathlib.Path) -> None:
    path = _write_yaml(tmp_path / "list.yaml", [_record(), ["not", "a", "mapping"]])
    with pytest.raises(DilemmaError, match=r"list\.yaml: record 2: must be a mapping"):
        load_dilemmas(path)


def test_jsonl_record_errors_also_name_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text(
        json.dumps(_record(id="a")) + "\n\n" + json.dumps(_record(id="b", kind="nope")) + "\n",
        encoding="utf-8",
    )
    with pytest.raises(DilemmaError, match=r"set\.jsonl: record 2 \(line 3, id 'b'\): field 'kind'"):
        load_dilemmas(path)


def test_duplicate_yaml_key_rejected(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "dupkey.yaml"
    path.write_text(
        "- id: a\n  title: A\n  kind: other\n  story: You are here.\n"
        "  action: do it\n  action: do it again\n  complement: leave it\n  cbr_pole: action\n",
        encoding="utf-8",
    )
    with pytest.raises(
        DilemmaError,
        match=r"dupkey\.yaml: invalid YAML at line 6.*duplicate key 'action'",
    ):
        load_dilemmas(path)


def test_duplicate_json_key_rejected(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "dupkey.jsonl"
    good = json.dumps(_record())
    path.write_text(good + "\n" + good[:-1] + ', "id": "again"}\n', encoding="utf-8")
    with pytest.raises(DilemmaError, match=r"dupkey\.jsonl: line 2: .*duplicate key 'id'"):
        load_dilemmas(path)


# ---------------------------------------------------------------------------
# file-level errors


def test_missing_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(DilemmaError, match=r"nowhere\.yaml: file not found"):
        load_dilemmas(path)


def test_directory_is_not_a_file(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    with pytest.raises(DilemmaError, match=r"folder\.yaml: not a regular file"):
        load_dilemmas(folder)


def test_bad_json_line_number(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(
        json.dumps(_record(id="a")) + "\n\n" + '{"id": "b", "title": \n',
        encoding="utf-8",
    )
    with pytest.raises(DilemmaError, match=r"broken\.jsonl: line 3: invalid JSON"):
        load_dilemmas(path)


def test_invalid_yaml_syntax(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "syntax.yaml"
    path.write_text("dilemmas:\n  - id: [unclosed\n", encoding="utf-8")
    with pytest.raises(DilemmaError, match=r"syntax\.yaml: invalid YAML at line \d+"):
        load_dilemmas(path)


@pytest.mark.parametrize("name", ["set.json", "set.txt", "set"])
def test_unsupported_extension(tmp_path: pathlib.Path, name: str) -> None:
    path = tmp_path / name
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(DilemmaError, match=re.escape(name) + r": unsupported file extension"):
        load_dilemmas(path)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("empty.yaml", ""),
        ("empty_list.yaml", "[]\n"),
        ("empty_key.yaml", "dilemmas: []\n"),
        ("blank.jsonl", "\n  \n"),
    ],
)
def test_empty_set(tmp_path: pathlib.Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DilemmaError, match=re.escape(name)):
        load_dilemmas(path)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("items: []\n", "no 'dilemmas' key"),
        ("dilemmas: []\nversion: 2\n", "unknown top-level key"),
        ("dilemmas: {id: x}\n", "expected a list"),
        ("just a string\n", "expected a list"),
    ],
)
def test_bad_yaml_top_level(tmp_path: pathlib.Path, text: str, fragment: str) -> None:
    path = tmp_path / "top.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DilemmaError, match=r"top\.yaml: .*" + re.escape(fragment)):
        load_dilemmas(path)


def test_non_utf8_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "latin.yaml"
    path.write_bytes("- id: caf\xe9\n".encode("latin-1"))
    with pytest.raises(DilemmaError, match=r"latin\.yaml: not valid UTF-8"):
        load_dilemmas(path)


def test_parse_dilemmas_empty_and_non_list() -> None:
    with pytest.raises(DilemmaError, match=r"mem: contains no dilemmas"):
        parse_dilemmas([], "mem")
    with pytest.raises(DilemmaError, match=r"mem: expected a list"):
        parse_dilemmas("not a list", "mem")  # type: ignore[arg-type]
