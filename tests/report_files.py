"""What the tests that check a report folder share: the files it must hold, named on failure."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def assert_wrote(written: Path | Iterable[Path], expected: Iterable[str]) -> set[str]:
    """Assert that every name in ``expected`` is a file of ``written`` (a folder, or the paths a writer returned).

    Returns the names written, for further checks. On failure the message
    lists only the missing names, not two whole sets to diff by eye.
    """
    paths = written.iterdir() if isinstance(written, Path) else written
    names = {p.name for p in paths}
    missing = sorted(set(expected) - names)
    assert not missing, f"missing from the report: {', '.join(missing)} (written: {', '.join(sorted(names))})"
    return names
