"""What a coded run adds to the influence report: ``coded_*.csv``, ``fig_coded_*.png`` and their sections.

The influence report's results hold one :class:`analysis.influence.coding.CodedTask` per task that
``probe code`` has coded (``RUN/coding/<task>.parquet``), every number computed by
:mod:`analysis.influence.coding`; :func:`coded_md` formats them into the summary's lines and the report's
files, and the figure functions here only draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.figures import pyplot
from analysis.common.report import Body, Drawing, Files, g6_tables
from analysis.influence.coding import CodedTask
from analysis.influence.tables import table_md, table_section


# ============================================================ figures
def shares_figure(table: pd.DataFrame, by: str, title: str) -> Any:
    """Stacked bars of the ``share_<code>`` columns of ``table``, one bar per row (labelled by column ``by``)."""
    plt = pyplot()

    share_cols = [c for c in table.columns if c.startswith("share_")]
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(table) + 2))
    left = np.zeros(len(table))
    cmap = plt.get_cmap("tab20")
    for i, col in enumerate(share_cols):
        vals = table[col].to_numpy(dtype=float)
        ax.barh(np.arange(len(table)), vals, left=left, color=cmap(i % 20), label=col[len("share_") :])
        left += vals
    ax.set_yticks(np.arange(len(table)), [str(v) for v in table[by]])
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of traces (mean judge probability)")
    ax.set_title(title)
    ax.legend(fontsize=6, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.25), frameon=False)
    fig.tight_layout()
    return fig


def effect_figure(joined: pd.DataFrame) -> Any:
    """Box plots of the cued traces' s(d), one per compliance label (:func:`analysis.influence.coding.join_effects`)."""
    plt = pyplot()

    labels = sorted(joined["label"].unique())
    fig, ax = plt.subplots(figsize=(6, 3.5))
    data = [joined.loc[joined["label"] == lab, "s"].to_numpy(dtype=float) for lab in labels]
    ax.boxplot(data, showfliers=False)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=20, fontsize=7)
    for i, d in enumerate(data, start=1):
        ax.scatter(np.full(len(d), i) + np.linspace(-0.15, 0.15, len(d)), d, s=6, color="0.3", zorder=3)
    ax.axhline(0, color="0.8", lw=1, ls="--")
    ax.set_ylabel("s(d) of the trace's condition (log-odds)")
    ax.set_title("effect of the cue by how the trace treats it")
    fig.tight_layout()
    return fig


# ============================================================ sections
def _short(df: pd.DataFrame, limit: int = 40) -> pd.DataFrame:
    """The table a summary shows: keys, n, modal code and the share of the top codes (by mean share)."""
    share_cols = [c for c in df.columns if c.startswith("share_")]
    top = df[share_cols].mean().sort_values(ascending=False).index[:6] if share_cols else []
    keep = [c for c in df.columns if not c.startswith(("share_", "n_")) or c in top or c == "n_sig_backfire"]
    return df[keep].head(limit)


def _tables(tables: dict[str, pd.DataFrame | None]) -> Files:
    """The coded CSVs, as the influence report writes its own (``%.6g``)."""
    return Files(g6_tables(tables))


def task_md(t: CodedTask) -> Body:
    """One coded task's part of the summary (its heading, the judge, its tables and figure) and its files."""
    m, c = t.meta, t.meta["counts"]
    lines = [
        f"## Coded reasoning traces: {t.task}",
        "",
        f"Judge `{m['judge']['name']}` ({m['judge']['identity'].get('mode')}), taxonomy "
        f"`{Path(m['taxonomy']['path']).name}` (sha256 {m['taxonomy']['sha256'][:12]}), "
        f"{c['coded']} traces coded, {c['unparsed']} judge answers unparsed, skipped: "
        + ", ".join(f"{k} {v}" for k, v in c["skipped"].items())
        + ". Shares are mean judge probabilities; n_<code> count argmax labels.",
        "",
    ]
    files = _tables(
        {
            "coded_rationale_by_arm": t.by_arm,
            "coded_rationale_by_condition": t.by_condition,
            "coded_compliance_vs_effect": t.vs_effect,
            "coded_compliance_by_label": t.by_label,
            "coded_backfire_patterns": t.patterns,
        }
    )
    if t.by_arm is not None and t.by_condition is not None:
        fig = Drawing("fig_coded_rationale.png", partial(shares_figure, t.by_arm, "arm", "primary rationale by arm"))
        lines += table_section("### Primary rationale, no cue vs cued", _short(t.by_arm))
        lines += table_section("### Primary rationale by condition", _short(t.by_condition))
        lines += [f"Figure: `{fig.name}`", ""]
        files += Files(figures=(fig,))
    if t.joined is not None and t.vs_effect is not None and t.by_label is not None:
        fig = Drawing("fig_coded_compliance_effect.png", partial(effect_figure, t.joined))
        lines += table_section("### Compliance vs effect, by compliance label", t.by_label)
        lines += table_section("### Compliance vs effect, by condition", _short(t.vs_effect))
        lines += [f"Figure: `{fig.name}`", ""]
        files += Files(figures=(fig,))
    if t.patterns is not None:
        lines += ["### Backfire patterns by factor (traces in conditions with s(d) < 0)", ""]
        lines += [
            table_md(_short(t.patterns)) if len(t.patterns) else "No backfiring condition has coded traces.",
            "",
        ]
    return lines, files


def coded_md(tasks: Sequence[CodedTask]) -> Body:
    """The coded tasks' part of the summary (none: no lines), a blank line between two tasks, and their files."""
    lines: list[str] = []
    files = Files()
    for t in tasks:
        body, more = task_md(t)
        lines += [*([""] if lines else []), *body]
        files += more
    return lines, files
