"""The one table toolkit of every report and comparison: the Markdown table writer and the long-form tables.

Every paper's report prints its frames through :func:`md_table` (or, for
rows it has already formatted, :func:`md_rows`). The options are the ways
the reports print a table and must keep printing it, byte for byte:

- ``fmt``: the format of a float cell (``"{:+.3f}"`` in the battery, ``"{:.3f}"`` elsewhere);
- ``nan``: the text of a NaN float (None: ``fmt`` applied to it, e.g. ``+nan``);
- ``index``: the frame's index as the first column (its name, or blank, as the header);
- ``iterrows``: cells as :meth:`pandas.DataFrame.iterrows` gives them, so that in a frame
  of numbers only an integer column is printed as a float (the battery's tables);
- ``yes_no``: booleans as yes / no (the influence tables; otherwise True / False);
- ``escape``: a ``|`` inside a cell escaped, so free text cannot break the row.

A run (or a panel of runs) that holds answer-slot readouts and samples is reported
from each source; its CSV tables hold both in long form, a ``source`` column first
(:func:`long_tables` for one run's tables, :func:`source_tables` for a comparison's
tables and dropped items), so a notebook can pivot them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd


def md_rows(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table of cells that are already text."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def md_table(
    df: pd.DataFrame,
    fmt: str = "{:.3f}",
    *,
    nan: str | None = "",
    index: bool = False,
    iterrows: bool = False,
    yes_no: bool = False,
    escape: bool = False,
) -> str:
    """A Markdown table of ``df`` (one line per row), with the options of the module docstring."""

    def cell(v: object) -> str:
        if yes_no and isinstance(v, bool | np.bool_):
            text = "yes" if v else "no"
        elif isinstance(v, float | np.floating):
            text = nan if nan is not None and np.isnan(v) else fmt.format(v)
        else:
            text = str(v)
        return text.replace("|", "\\|") if escape else text

    header = [str(df.index.name or "")] if index else []
    header += [str(c) for c in df.columns]
    if iterrows:
        body: Iterable[tuple[object, Sequence[object]]] = ((i, list(r)) for i, r in df.iterrows())
    else:
        body = zip(df.index, df.itertuples(index=False, name=None), strict=True)
    rows = [([str(i)] if index else []) + [cell(v) for v in r] for i, r in body]
    return "\n".join(md_rows([cell(h) if escape else h for h in header], rows))


def long_tables(per_source: Sequence[tuple[str, Mapping[str, pd.DataFrame]]]) -> dict[str, pd.DataFrame]:
    """Every table of every source in long form: a ``source`` column (``readout``, ``samples``; first, unless the
    table has it already), the sources' rows one after the other, so a notebook can pivot them."""
    names = list(dict.fromkeys(name for _, tables in per_source for name in tables))
    out = {}
    for name in names:
        parts = []
        for source, tables in per_source:
            if name not in tables:
                continue
            t = tables[name]
            if "source" not in t.columns:
                t = t.copy()
                t.insert(0, "source", source)
            parts.append(t)
        out[name] = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    return out


def source_tables(
    parts: Sequence[tuple[str, Mapping[str, pd.DataFrame | None], pd.DataFrame]],
) -> tuple[dict[str, pd.DataFrame | None], pd.DataFrame]:
    """(tables, dropped items) of the comparisons of each source in long form: a ``source`` column (first, unless
    a table has it already), as the one-run report writes a run with both sources. A table one source did not
    compute (None) stays unwritten only if no source computed it."""
    per = [(src, {k: v for k, v in tables.items() if v is not None}) for src, tables, _ in parts]
    names = list(dict.fromkeys(k for _, tables, _ in parts for k in tables))
    long = long_tables(per)
    dropped = long_tables([(src, {"dropped": d}) for src, _, d in parts])["dropped"]
    return {k: long.get(k) for k in names}, dropped
