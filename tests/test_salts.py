"""probe.salts: deterministic salted replicates and where they go."""

from __future__ import annotations

import math
import string

import pytest

from probe.salts import SaltSpec, apply_salt, make_salt


def _is_hex(s: str) -> bool:
    return bool(s) and all(c in string.hexdigits.lower() for c in s)


def _two_hex_per_token(s: str) -> int:
    """A fake tokenizer that merges hex characters in pairs."""
    return math.ceil(len(s) / 2)


def _digit_runs(s: str) -> int:
    """A fake tokenizer: each maximal run of digits or of letters is one token."""
    runs = 0
    prev = None
    for c in s:
        kind = c.isdigit()
        if kind != prev:
            runs += 1
            prev = kind
    return runs


@pytest.mark.parametrize("count_tokens", [None, len, _two_hex_per_token])
def test_replicate_zero_is_unsalted(count_tokens) -> None:
    assert make_salt(0, SaltSpec(count=3, seed=5), count_tokens) == ""


def test_negative_replicate_rejected() -> None:
    with pytest.raises(ValueError, match="replicate"):
        make_salt(-1, SaltSpec(count=2))


@pytest.mark.parametrize("count_tokens", [None, len, _two_hex_per_token, _digit_runs])
def test_deterministic_and_distinct(count_tokens) -> None:
    spec = SaltSpec(count=6, seed=11, n_tokens=4)
    first = [make_salt(r, spec, count_tokens) for r in range(1, 6)]
    again = [make_salt(r, SaltSpec(count=6, seed=11, n_tokens=4), count_tokens) for r in range(1, 6)]
    assert first == again
    assert len(set(first)) == len(first)  # replicates differ
    other_seed = [make_salt(r, SaltSpec(count=6, seed=12, n_tokens=4), count_tokens) for r in range(1, 6)]
    assert all(a != b for a, b in zip(first, other_seed, strict=True))  # seeds differ


def test_count_does_not_change_a_replicates_salt() -> None:
    assert make_salt(2, SaltSpec(count=3, seed=1)) == make_salt(2, SaltSpec(count=50, seed=1))


@pytest.mark.parametrize("n_tokens", [1, 3, 8, 64])
def test_without_tokenizer_two_hex_chars_per_token(n_tokens: int) -> None:
    salt = make_salt(1, SaltSpec(count=2, n_tokens=n_tokens))
    assert len(salt) == 2 * n_tokens
    assert _is_hex(salt)


@pytest.mark.parametrize("count_tokens", [len, _two_hex_per_token, _digit_runs])
@pytest.mark.parametrize("n_tokens", [1, 2, 5, 8])
def test_with_tokenizer_exact_token_count(count_tokens, n_tokens: int) -> None:
    spec = SaltSpec(count=4, seed=3, n_tokens=n_tokens)
    for r in range(1, 4):
        salt = make_salt(r, spec, count_tokens)
        assert _is_hex(salt)
        assert count_tokens(salt) == n_tokens


def test_with_len_tokenizer_length_is_n_tokens() -> None:
    assert len(make_salt(1, SaltSpec(count=2, n_tokens=7), len)) == 7


def test_impossible_tokenizer_raises() -> None:
    with pytest.raises(RuntimeError, match="exactly 2 tokens"):
        make_salt(1, SaltSpec(count=2, n_tokens=2), lambda s: 3)


# ---------------------------------------------------------------- apply_salt


def test_apply_salt_places() -> None:
    assert apply_salt("SYS", "Q?", "abcd", "user_start") == ("SYS", "abcd\n\nQ?")
    assert apply_salt("SYS", "Q?", "abcd", "user_end") == ("SYS", "Q?\n\nabcd")
    assert apply_salt("SYS", "Q?", "abcd", "system") == ("SYS\n\nabcd", "Q?")
    assert apply_salt(None, "Q?", "abcd", "system") == ("abcd", "Q?")
    assert apply_salt("", "Q?", "abcd", "system") == ("abcd", "Q?")
    assert apply_salt(None, "Q?", "abcd", "user_start") == (None, "abcd\n\nQ?")


@pytest.mark.parametrize("place", ["user_start", "user_end", "system"])
def test_empty_salt_changes_nothing(place) -> None:
    assert apply_salt("SYS", "Q?", "", place) == ("SYS", "Q?")
    assert apply_salt(None, "Q?", "", place) == (None, "Q?")


# ---------------------------------------------------------------- SaltSpec validation


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"count": 0}, "count"),
        ({"count": -3}, "count"),
        ({"n_tokens": 0}, "n_tokens"),
        ({"n_tokens": 65}, "n_tokens"),
        ({"place": "assistant"}, "place"),
    ],
)
def test_salt_spec_validation_names_the_field(kwargs, field: str) -> None:
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        SaltSpec(**kwargs)


@pytest.mark.parametrize("kwargs", [{"count": 1}, {"n_tokens": 1}, {"n_tokens": 64}, {"place": "system"}])
def test_salt_spec_boundaries_accepted(kwargs) -> None:
    SaltSpec(**kwargs)
