"""A computed part of a report's results: its value, or why it is absent, or the NotComputed it raised.

An experiment's results object (computed once from a run, then only formatted by its report's sections)
holds its parts as :class:`Part` s made by :func:`attempt`, so that a part that cannot be computed keeps
its reason for its section to say, and a bug in one fails the report naming the part.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from analysis.common.report import section_failed
from probe.errors import NotComputed, ProbeError

T = TypeVar("T")


@dataclass(frozen=True)
class Part(Generic[T]):
    """One computed part of the report: its value, or the line saying its instrument is absent, or the NotComputed
    it raised; and what it left out (the battery's stories; kept when it fails after leaving them out)."""

    value: T | None = None
    absent: str | None = None
    error: NotComputed | None = None
    dropped: tuple[Any, ...] = ()

    def get(self) -> T:
        """The value; raises the part's NotComputed, so its section says why it is not computed."""
        if self.error is not None:
            raise self.error
        if self.value is None:
            raise NotComputed(self.absent or "not computed")
        return self.value


def attempt(compute: Callable[..., Part[T]], *args: Any) -> Part[T]:
    """``compute(*args)``; a part that cannot be computed keeps its NotComputed, any other exception (a bug) fails
    the report naming the part (:func:`analysis.common.report.section_failed`)."""
    try:
        return compute(*args)
    except NotComputed as e:
        return Part(error=e)
    except ProbeError:
        raise
    except Exception as e:
        raise section_failed(compute.__name__, e) from e
