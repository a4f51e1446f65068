"""How the influence summaries print a table, in one place so that the reports cannot drift apart.

NaN prints as ``n/a`` (a test that was not run is not a number), booleans as
yes / no, and a ``|`` inside a cell is escaped, because condition names,
labels and coded replies are free text that would otherwise break the row.
"""

from __future__ import annotations

import pandas as pd

from analysis.common.tables import md_table


def table_md(df: pd.DataFrame) -> str:
    """The Markdown table of ``df`` as every influence summary prints it (see the module docstring)."""
    return md_table(df, nan="n/a", yes_no=True, escape=True)


def table_section(heading: str, df: pd.DataFrame) -> list[str]:
    """``heading``, a blank line, the table of ``df`` and a blank line: one titled table of a summary."""
    return [heading, "", table_md(df), ""]
