"""What the verbs of the ``probe`` command line share: a verb tied to its handler, and the report a run writes.

Light on purpose (no pandas): building the parser imports it.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

Handler = Callable[[argparse.Namespace], int]


def add_verb(sub: Any, name: str, func: Handler, **parser: Any) -> argparse.ArgumentParser:
    """Add the verb ``name`` to ``sub``, run by ``func`` and described by its docstring.

    The docstring's first line is the verb's line in ``probe --help``; the
    paragraph after it, its ``--help`` description (line breaks read as spaces).
    An ``epilog`` (examples, a file format) is printed as written, line breaks
    kept. ``parser``: further ``add_parser`` arguments, e.g. ``help`` and
    ``description`` for a handler that serves several verbs.
    """
    summary, _, rest = inspect.cleandoc(func.__doc__ or "").partition("\n")
    parser.setdefault("help", summary)
    parser.setdefault("description", " ".join(rest.split()))
    if "epilog" in parser:
        parser.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
    p: argparse.ArgumentParser = sub.add_parser(name, **parser)
    p.set_defaults(func=func)
    return p


def add_no_report(p: argparse.ArgumentParser | argparse._ArgumentGroup, when: str) -> None:
    """The ``--no-report`` flag that :func:`report_unless_skipped` obeys; ``when``: e.g. ``after merging``."""
    p.add_argument("--no-report", action="store_true", help=f"do not write the report {when}")


def report_unless_skipped(a: argparse.Namespace, run: Path) -> None:
    """Write the report of the run folder ``run`` and print where, unless ``--no-report`` was given."""
    if a.no_report:
        return
    from analysis.report import write_report  # imports pandas

    paths = write_report(run)
    print(f"report: {paths[0].parent}")
