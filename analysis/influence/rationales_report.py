"""What a ``rationales`` coding adds to the influence report: the paper's rationale figures and table (K.4, K.5, L).

Numbers come from :mod:`analysis.influence.rationales`; this module formats them and draws. Nothing is added to a
run without ``coding/rationales.parquet``. Files (paper 000's numbers: triage / BBQ / DailyDilemmas):

* ``coded_rationales_mentioned.csv``, ``fig_coded_rationales_mentioned.png``: per arm, the share of traces that
  mention and that act on each rationale (Figures 28 / 29; on triage all traces);
* triage: ``coded_rationales_mentioned_smaller.csv`` (Figure 24: the traces that chose the smaller group);
* with a primary coding too: ``coded_rationale_primary.csv``, ``fig_coded_rationale_primary.png`` (Figure 23 on
  triage, over the smaller-group traces; Figures 26 / 27) and ``coded_rationale_backfires.csv`` (appendix L.2).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.figures import pyplot
from analysis.common.report import Body, Drawing, Files, g6_tables
from analysis.influence.rationales import RationaleTables
from analysis.influence.tables import table_section


def bars_figure(table: pd.DataFrame, value: str, label: str, title: str) -> Any:
    """Horizontal bars of ``value`` per ``label`` (rows), one colour per arm."""
    plt = pyplot()

    arms = list(dict.fromkeys(table["arm"].astype(str)))
    names = list(dict.fromkeys(table[label].astype(str)))
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(names) * max(1, len(arms)) + 1.5))
    h = 0.8 / max(1, len(arms))
    for i, arm in enumerate(arms):
        g = table[table["arm"].astype(str) == arm].set_index(label)[value]
        vals = [float(g.get(n, 0.0)) for n in names]
        ax.barh(np.arange(len(names)) + i * h, vals, height=h, label=f"{arm}")
    ax.set_yticks(np.arange(len(names)) + h * (len(arms) - 1) / 2, names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of traces")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    return fig


def rationales_md(t: RationaleTables | None) -> Body:
    """The section and files of a run's ``rationales`` coding (None: no lines, no files)."""
    if t is None:
        return [], Files()
    lines = [
        "## Every rationale the traces state (paper 000, appendices K.3-K.5, L)",
        "",
        "Per arm and rationale: traces, how many mention the rationale (any status but not_mentioned) and act on it "
        "(mentioned_and_acted_on); soft_* are mean judge probabilities.",
        "",
        *table_section("### Rationales mentioned and acted on, per arm", t.mentioned),
    ]
    figs = [Drawing("fig_coded_rationales_mentioned.png",
                    partial(bars_figure, t.mentioned, "share_mentioned", "rationale", "rationales mentioned"))]  # fmt: skip
    if t.mentioned_smaller is not None:
        lines += table_section("### Triage, traces that chose the smaller group (Figure 24)", t.mentioned_smaller)
    if t.primary is not None:
        where = "traces that chose the smaller group (Figure 23)" if t.triage else "all traces (Figures 26 / 27)"
        lines += table_section(f"### Primary rationale per arm, {where}", t.primary)
        figs.append(Drawing("fig_coded_rationale_primary.png",
                            partial(bars_figure, t.primary, "share", "primary", f"primary rationale, {where}")))  # fmt: skip
    if t.backfires is not None:
        lines += table_section("### Backfire traces (chose the side the cue was not for; appendix L.2)", t.backfires)
    lines += ["Figures: " + ", ".join(f"`{d.name}`" for d in figs), ""]
    tables = {
        "coded_rationales_mentioned": t.mentioned,
        "coded_rationales_mentioned_smaller": t.mentioned_smaller,
        "coded_rationale_primary": t.primary,
        "coded_rationale_backfires": t.backfires,
    }
    return lines, Files(g6_tables(tables), tuple(figs))
