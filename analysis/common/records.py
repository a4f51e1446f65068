"""The one ``to_dict`` of the analysis result records (a frozen dataclass of numbers, read as one row).

The estimators return small frozen dataclasses (a pooled incoherence, a salt
floor, a correlation with its CI); a report writes one as a CSV row or puts
several into a frame. :class:`Record` gives them that row once, and the
columns a table takes from one (:meth:`Record.pick`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class Record:
    """Mixin of a result dataclass: :meth:`to_dict` is its fields, in declaration order (:func:`dataclasses.asdict`)."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """The fields as one row, in declaration order."""
        return asdict(cast("DataclassInstance", self))

    def pick(self, *names: str) -> dict[str, Any]:
        """The named fields as row entries, in the order given (the columns a table takes from this record)."""
        return {name: getattr(self, name) for name in names}
