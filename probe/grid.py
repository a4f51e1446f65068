"""The battery is a grid: named factors crossed in a fixed order.

Like scikit-learn's ``ParameterGrid``: deterministic order (factors in the
order given, levels in the order given, last factor fastest), ``len``, index ->
cell, and a stable id per cell.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Grid:
    """A crossing of factors; each factor is a non-empty tuple of distinct string levels."""

    factors: tuple[tuple[str, tuple[str, ...]], ...]

    @classmethod
    def of(cls, factors: Mapping[str, Sequence[str]]) -> Grid:
        items = []
        for name, levels in factors.items():
            lv = tuple(levels)
            if not lv:
                raise ValueError(f"factor {name!r} has no levels")
            if len(set(lv)) != len(lv):
                raise ValueError(f"factor {name!r} has repeated levels: {list(lv)}")
            items.append((name, lv))
        return cls(tuple(items))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.factors)

    def __len__(self) -> int:
        n = 1
        for _, lv in self.factors:
            n *= len(lv)
        return n

    def __iter__(self) -> Iterator[dict[str, str]]:
        for combo in itertools.product(*(lv for _, lv in self.factors)):
            yield dict(zip(self.names, combo, strict=True))

    def __getitem__(self, index: int) -> dict[str, str]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"grid index {index} out of range for {len(self)} cells")
        index %= len(self)
        out: dict[str, str] = {}
        for name, lv in reversed(self.factors):
            index, r = divmod(index, len(lv))
            out[name] = lv[r]
        return {n: out[n] for n in self.names}
