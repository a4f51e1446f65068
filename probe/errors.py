"""The project's one error root.

Every error of the project derives from :class:`ProbeError`, and keeps the
builtin base it had before (``ValueError`` for "change the arguments",
``RuntimeError`` for a run that cannot go on, ``ImportError`` for a missing
extra), so ``except ValueError`` around a call still works. The command line
catches :class:`ProbeError` once and prints it as one line with exit status 2.

Two exceptions of the API engine stay plain: ``TransportError`` and
``ProviderRefusal`` (:mod:`engines.api_providers`) are signals inside the
engine's retry loop (retry the call; record a refusal), never errors that
leave it; what leaves is :class:`~engines.api.TransportGaveUp`.
"""

from __future__ import annotations


class ProbeError(Exception):
    """Every error of the project derives from this class."""


class StoreError(ProbeError, RuntimeError):
    """A run directory that cannot be used as asked; the message says how to proceed.

    Here rather than in :mod:`probe.store`, so that :mod:`probe.lock` (whose
    ``LockError`` is one) and the store import each other in neither direction.
    """


class ModelError(ProbeError, ValueError):
    """A model spec that cannot be loaded; the message says why and what to do.

    Here so that :mod:`probe.models` and its :mod:`probe.models.gguf` both raise it and import each other one way.
    """


def at_least(name: str, value: int, low: int, note: str = "") -> None:
    """Refuse ``value`` below ``low``, naming the parameter, the bound and the value received.

    A plain ``ValueError`` (as the specs' checks always raised): the command line
    reports it as a bad argument. ``note`` explains the bound, e.g. ``" (0 = all)"``.
    """
    if value < low:
        raise ValueError(f"{name} must be >= {low}{note}, got {value}")
