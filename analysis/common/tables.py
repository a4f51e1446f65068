"""The one Markdown table writer of every report and comparison.

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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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
