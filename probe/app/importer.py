"""The ``probe import`` and ``probe export-conditions`` verbs (the work is in :mod:`analysis.influence.imported`).

Kept apart from the analysis module so building the CLI parser imports no pandas.
"""

from __future__ import annotations

import argparse
from typing import Any

from probe.app.verbs import add_no_report, add_verb, report_unless_skipped

#: The epilog of ``probe import --help``.
EXAMPLES = """example:
  probe import docs/examples/influence_conditions.csv --out runs/imported
  probe analyze runs/imported"""


def cmd_import(a: argparse.Namespace) -> int:
    """turn published per-condition influence results (CSV) into a run for analyze and compare

    Read a CSV with one row per condition (model, reasoning, benchmark, factor, level_a, level_b, influence; counts
    c_0_A..c_B_B, or frequencies f_0_B, f_A_B, f_B_B with arm sizes n_0, n_A, n_B or n_<arm>_min/max) and write a run
    folder of experiment influence-import. Counts are rebuilt from frequencies only where exactly one set reproduces
    them; ambiguous rows are listed and left out. Schema: docs/influence.md.
    """
    from analysis.influence.imported import import_run

    store, parsed = import_run(a.file, a.out)
    t = parsed.table
    print(
        f"imported {len(t)} conditions ({t['model'].nunique()} models, benchmarks {', '.join(sorted(set(t['benchmark'])))}) "
        f"from {a.file} into {store.root}"
    )
    for amb in parsed.ambiguous:
        print(
            f"{a.file}: line {amb.line}: ambiguous, left out: f_{amb.arm}_B fits {amb.count} counts "
            f"({', '.join(f'{k}/{n}' for n, k in amb.candidates)}{', ...' if amb.count > len(amb.candidates) else ''}); "
            f"give n_{amb.arm} exactly or the counts"
        )
    report_unless_skipped(a, store.root)
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    """write a sampled influence run's per-condition counts in the import schema

    The inverse of probe import: one CSV row per condition with counts c_0_A..c_B_B.
    """
    from analysis.influence.imported import export_conditions

    frame = export_conditions(a.run, a.out)
    print(f"wrote {len(frame)} conditions of {a.run} to {a.out}")
    return 0


def register(sub: Any) -> None:
    """Add ``probe import`` and ``probe export-conditions`` to the CLI's verbs."""
    p = add_verb(sub, "import", cmd_import, epilog=EXAMPLES)
    p.add_argument("file", help="the CSV of per-condition results")
    p.add_argument("--out", required=True, help="run folder to write (created)")
    add_no_report(p, "after importing")
    e = add_verb(sub, "export-conditions", cmd_export)
    e.add_argument("run", help="a sampled influence run folder")
    e.add_argument("--out", required=True, help="CSV file to write")
