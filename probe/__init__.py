"""probe: measure what language models value, crossing the frames of the question.

``import probe`` stays cheap: the notebook API is imported on first use.

>>> import probe
>>> run = probe.open_run("runs/battery-smol")   # doctest: +SKIP
>>> run.options.groupby("instrument", observed=True)["prob"].mean()   # doctest: +SKIP

See docs/python.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probe.runs import Run, open_run

__all__ = ["Run", "open_run"]


def __getattr__(name: str) -> Any:
    """``probe.open_run`` and ``probe.Run``, imported from :mod:`probe.runs` when first asked for."""
    if name in __all__:
        from probe import runs

        return getattr(runs, name)
    raise AttributeError(f"module 'probe' has no attribute {name!r}")
