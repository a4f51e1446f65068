"""What a coded run adds to the influence report: ``coded_*.csv``, ``fig_coded_*.png`` and their sections.

Called by :mod:`analysis.influence.report` once ``probe code`` has written
``RUN/coding/<task>.parquet``; every number is computed by
:mod:`analysis.influence.coding`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.common.figures import pyplot, save_figure
from analysis.common.report import write_tables
from analysis.influence.coding import (
    TRACE_TASKS,
    backfire_patterns,
    compliance_vs_effect,
    join_effects,
    load_coding,
    rationale_by_arm,
    rationale_by_condition,
    with_factors,
)
from analysis.influence.tables import table_md, table_section
from probe.runs import Run


# ============================================================ report
def _short(df: pd.DataFrame, task: str, limit: int = 40) -> pd.DataFrame:
    """The table a summary shows: keys, n, modal code and the share of the top codes."""
    share_cols = [c for c in df.columns if c.startswith("share_")]
    top = df[share_cols].mean().sort_values(ascending=False).index[:6] if share_cols else []
    keep = [c for c in df.columns if not c.startswith(("share_", "n_")) or c in top or c == "n_sig_backfire"]
    return df[keep].head(limit)


def _figure_shares(table: pd.DataFrame, by: str, title: str, path: Path) -> Path:
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
    save_figure(fig, path, dpi=110)
    return path


def _figure_effect(joined: pd.DataFrame, path: Path) -> Path:
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
    save_figure(fig, path, dpi=110)
    return path


def coded_report(run: Run, eff: pd.DataFrame, out: Path) -> str:
    """Write the coded tables and figures of an influence run into ``out``; return the summary's Markdown ("" if uncoded).

    ``eff`` is :func:`experiments.influence.effects.effects` of the run's conditions.
    """

    lines: list[str] = []
    for task in TRACE_TASKS:
        got = load_coding(run.root, task)
        if got is None:
            continue
        raw, meta = got
        coded = with_factors(raw, run)
        c = meta["counts"]
        lines += [
            "",
            f"## Coded reasoning traces: {task}",
            "",
            f"Judge `{meta['judge']['name']}` ({meta['judge']['identity'].get('mode')}), taxonomy "
            f"`{Path(meta['taxonomy']['path']).name}` (sha256 {meta['taxonomy']['sha256'][:12]}), "
            f"{c['coded']} traces coded, {c['unparsed']} judge answers unparsed, skipped: "
            + ", ".join(f"{k} {v}" for k, v in c["skipped"].items())
            + ". Shares are mean judge probabilities; n_<code> count argmax labels.",
            "",
        ]
        if coded.empty:
            continue
        if task == "rationale":
            arm = rationale_by_arm(coded)
            cond = rationale_by_condition(coded)
            write_tables(out, {"coded_rationale_by_arm": arm, "coded_rationale_by_condition": cond})
            lines += table_section("### Primary rationale, no cue vs cued", _short(arm, task))
            lines += table_section("### Primary rationale by condition", _short(cond, task))
            fig = _figure_shares(arm, "arm", "primary rationale by arm", out / "fig_coded_rationale.png")
            lines += [f"Figure: `{fig.name}`", ""]
        if "direction" not in coded.columns:
            continue
        joined = join_effects(coded, eff)
        if joined.empty:
            continue
        if task == "compliance":
            per, by_label = compliance_vs_effect(joined)
            write_tables(out, {"coded_compliance_vs_effect": per, "coded_compliance_by_label": by_label})
            lines += table_section("### Compliance vs effect, by compliance label", by_label)
            lines += table_section("### Compliance vs effect, by condition", _short(per, task))
            fig = _figure_effect(joined, out / "fig_coded_compliance_effect.png")
            lines += [f"Figure: `{fig.name}`", ""]
        else:
            pat = backfire_patterns(joined)
            write_tables(out, {"coded_backfire_patterns": pat})
            lines += ["### Backfire patterns by factor (traces in conditions with s(d) < 0)", ""]
            lines += [
                table_md(_short(pat, task)) if len(pat) else "No backfiring condition has coded traces.",
                "",
            ]
    return "\n".join(lines)
