"""The project's one error root.

Every error of the project derives from :class:`ProbeError`, and keeps the
builtin base it had before (``ValueError`` for "change the arguments",
``RuntimeError`` for a run that cannot go on, ``ImportError`` for a missing
extra), so ``except ValueError`` around a call still works. The command line
catches :class:`ProbeError` once and prints it as one line, with exit status 2
("change the arguments or the run"), except :class:`ReportError`, a bug in a
report's analysis, which exits with status 1 (other arguments will not help).

Two exceptions of the API engine stay plain: ``TransportError`` and
``ProviderRefusal`` (:mod:`engines.api.providers`) are signals inside the
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


class NotComputed(ProbeError, ValueError):
    """An estimate that cannot be computed on this run's data, raised on purpose with the reason: too few items,
    a degenerate design, a missing instrument.

    It is the one exception a report turns into "Not computed: <reason>" while its other sections run on
    (:func:`analysis.common.report.run_sections`); any other exception of a section is a bug and fails the report
    (:class:`ReportError`). A ``ValueError``, as the estimators raised before, so a caller's
    ``except ValueError`` still catches it; code in ``analysis/`` catches it by name.
    """


class ReportError(ProbeError, RuntimeError):
    """A report section (or a computed part of one) failed with an exception other than :class:`NotComputed`:
    a bug in the analysis, not a property of the data. The message names the section and ends with the
    exception's last traceback line; the exception is chained (``__cause__``). ``probe analyze`` and
    ``probe run``'s report step exit with status 1 on it (the run's results stay stored)."""


def at_least(name: str, value: int, low: int, note: str = "") -> None:
    """Refuse ``value`` below ``low``, naming the parameter, the bound and the value received.

    A plain ``ValueError`` (as the specs' checks always raised): the command line
    reports it as a bad argument. ``note`` explains the bound, e.g. ``" (0 = all)"``.
    """
    if value < low:
        raise ValueError(f"{name} must be >= {low}{note}, got {value}")
