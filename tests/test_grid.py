"""probe.grid: a crossing of named factors with a fixed order."""

from __future__ import annotations

import pytest

from probe.grid import Grid

FACTORS = {"form": ["a", "b", "c"], "verb": ["approve", "oppose"], "order": ["yf", "nf"]}


def test_len_is_product_of_levels() -> None:
    assert len(Grid.of(FACTORS)) == 3 * 2 * 2
    assert len(Grid.of({"x": ["1"]})) == 1


def test_iteration_order_last_factor_fastest() -> None:
    g = Grid.of({"f": ["a", "b"], "v": ["x", "y", "z"], "o": ["0", "1"]})
    expected = [{"f": f, "v": v, "o": o} for f in ["a", "b"] for v in ["x", "y", "z"] for o in ["0", "1"]]
    cells = list(g)
    assert cells == expected
    assert [list(c) for c in cells] == [["f", "v", "o"]] * len(expected)  # keys in factor order
    assert cells[:3] == [{"f": "a", "v": "x", "o": "0"}, {"f": "a", "v": "x", "o": "1"}, {"f": "a", "v": "y", "o": "0"}]


def test_levels_keep_given_order() -> None:
    g = Grid.of({"o": ["z", "a", "m"]})
    assert [c["o"] for c in g] == ["z", "a", "m"]
    assert g.names == ("o",)


def test_getitem_matches_iteration_for_every_index() -> None:
    g = Grid.of(FACTORS)
    cells = list(g)
    n = len(g)
    for i in range(-n, n):
        assert g[i] == cells[i], i
        assert list(g[i]) == list(FACTORS)


@pytest.mark.parametrize("index", [12, 13, -13, 100])
def test_getitem_out_of_range(index: int) -> None:
    with pytest.raises(IndexError, match="out of range"):
        Grid.of(FACTORS)[index]


def test_empty_levels_rejected() -> None:
    with pytest.raises(ValueError, match="'verb' has no levels"):
        Grid.of({"form": ["a"], "verb": []})


def test_repeated_levels_rejected() -> None:
    with pytest.raises(ValueError, match="'form' has repeated levels"):
        Grid.of({"form": ["a", "b", "a"]})


def test_tuples_and_generators_accepted() -> None:
    g = Grid.of({"x": ("p", "q"), "y": (s for s in ["1", "2"])})
    assert list(g) == [{"x": "p", "y": "1"}, {"x": "p", "y": "2"}, {"x": "q", "y": "1"}, {"x": "q", "y": "2"}]
