"""The report sections of paper 000's appendix statistics: Markdown, and the figures drawn from the tables beside
them. The tables are computed once, in :mod:`analysis.influence.paper000_tables` (a run's in
:func:`analysis.influence.results.source_tables`, a comparison's in :func:`analysis.influence.compare.compare_frames`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import pandas as pd

from analysis.common.figures import pyplot
from analysis.common.report import Body, Drawing, Files, Table
from analysis.influence.tables import table_section


def larger_figure(by_ratio: pd.DataFrame) -> Any:
    """I.9 (Figures 15-19): the share of answers for the larger group against the size ratio, one line per pair,
    one panel per arm (no cue, cue toward A, cue toward B), from ``larger_by_ratio.csv``'s rows."""
    plt = pyplot()
    arms = [a for a in ("base", "A", "B") if a in set(by_ratio["arm"])]
    fig, axes = plt.subplots(1, len(arms), figsize=(4 * len(arms), 3.6), sharey=True, squeeze=False)
    for ax, arm in zip(axes[0], arms, strict=True):
        for pair, g in by_ratio[by_ratio["arm"] == arm].groupby("pair", sort=False):
            ax.plot(g["ratio"], g["rate"], marker="o", ms=3, label=str(pair))
        ax.axhline(0.5, color="0.8", lw=1, ls="--")
        ax.set_ylim(0, 1)
        ax.set_xlabel("larger / smaller group size")
        ax.set_title({"base": "no cue", "A": "cue toward A", "B": "cue toward B"}[arm])
    axes[0][0].set_ylabel("share choosing the larger group")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def paper000_md(tables: Mapping[str, pd.DataFrame]) -> list[str]:
    """The summary's section: Table 21, BB, and the I.9, I.12 and Table 4 tables where they were computed."""
    lines = [
        "## Paper 000 appendix tables",
        "",
        "Table 21 (`table21_neutral_asym.csv`): the share of baseline-neutral main-cue conditions with a significant "
        "Asym, per neutrality definition and threshold; BH-FDR over the benchmark's main cues, then restricted.",
        "",
        *table_section("### Table 21: baseline-neutral asymmetry rate", tables["table21_neutral_asym"]),
        *table_section("### Table 11's BB: mean max(f0(B), 1 - f0(B)), normal 95% CI", tables["baseline_bias"]),
    ]
    if "larger_summary" in tables:
        lines += table_section(
            "### I.9: choosing the larger group (per size pair: `larger_group.csv`; per ratio: "
            "`larger_by_ratio.csv`, `fig_larger_group.png`)",
            tables["larger_summary"],
        )
    if "invalid_by_arm" in tables:
        lines += table_section(
            "### I.12: invalid answers (refused, invalid, failed) by arm and larger-N side "
            "(per condition: `invalid_rates.csv`)",
            tables["invalid_by_arm"],
        )
    if "flip_rates_by_value" in tables:
        lines += table_section("### Table 4: sample-level flip rates per target value", tables["flip_rates_by_value"])
    if "value_counts" in tables:
        lines += table_section("### Table 3: primary values of the retained dilemmas", tables["value_counts"])
    if "max_asym_by_pair" in tables:
        lines += table_section(
            "### Table 13: the condition with the largest |Asym| per pair", tables["max_asym_by_pair"]
        )
    return lines


def figures(tables: Mapping[str, pd.DataFrame]) -> tuple[Drawing, ...]:
    """The run report's paper-000 figure: I.9's, drawn from ``larger_by_ratio`` (the first source's rows of
    ``larger_by_ratio.csv``), where the run's trials have group sizes."""
    by_ratio = tables.get("larger_by_ratio")
    if by_ratio is None or by_ratio.empty:
        return ()
    return (Drawing("fig_larger_group.png", partial(larger_figure, by_ratio)),)


def imported_section(tables: Mapping[str, pd.DataFrame]) -> Body:
    """The section of an imported run (condition-level data: Table 21, BB and Table 13) and its CSVs (``%.6g``)."""
    return paper000_md(tables), Files({stem: Table(t, float_format="%.6g") for stem, t in tables.items()})


# ============================================================================ across runs (probe compare)
def compare_md(tables: Mapping[str, pd.DataFrame]) -> list[str]:
    """The comparison summary's section: Table 21 pooled and per run, BB per model and reasoning mode, and the
    larger-group and invalid-answer tables where the runs have them."""
    lines = [
        "## Paper 000 appendix tables across runs",
        "",
        *table_section(
            "### Table 21: baseline-neutral asymmetry rate (pooled per benchmark)", tables["table21_neutral_asym"]
        ),
        *table_section("### Table 11's BB per reasoning mode", tables["baseline_bias"]),
        *table_section("### BB per model and reasoning mode", tables["baseline_bias_by_model"]),
        "Table 21 per run: `table21_by_run.csv`.",
        "",
    ]
    if "larger_group_by_run" in tables:
        lg = tables["larger_group_by_run"]
        lines += table_section("### I.9: share choosing the larger group, all pairs", lg[lg["pair"] == "all"])
    if "invalid_by_run" in tables:
        lines += table_section("### I.12: invalid answers by arm and larger-N side", tables["invalid_by_run"])
    return lines


# ============================================================================ the comparison's figures
HEADLINE = (
    ("mean |shift| (pp), all cues", "mean |shift| (pp)", 1.0),
    ("  neutral (test of f0(B) = 1/2): share with significant asymmetry (raw)", "neutral: sig. Asym (%)", 100.0),
    ("backfire share of significant effects (raw)", "backfire of sig. effects (%)", 100.0),
)
"""Figure 3's three numbers: (headline metric, label, scale)."""


def headline_figure(head: pd.DataFrame) -> Any:
    """Figure 3: per benchmark, the mean |shift|, the share of baseline-neutral conditions with a significant Asym
    and the backfire share of significant effects, from the comparison's ``headline.csv`` rows (CI bars where the
    headline has them)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(HEADLINE), figsize=(4 * len(HEADLINE), 3.4), squeeze=False)
    for ax, (metric, label, scale) in zip(axes[0], HEADLINE, strict=True):
        rows = head[head["metric"] == metric]
        x = list(range(len(rows)))
        val = rows["value"].astype(float).to_numpy() * scale
        lo = rows["ci_lo"].astype(float).to_numpy() * scale
        hi = rows["ci_hi"].astype(float).to_numpy() * scale
        ax.bar(x, val, color="tab:blue")
        err = [val - lo, hi - val]
        ax.errorbar(x, val, yerr=[[0 if e != e else e for e in err[0]], [0 if e != e else e for e in err[1]]],
                    fmt="none", color="k", lw=1)  # fmt: skip
        ax.set_xticks(x, list(rows["benchmark"]))
        ax.set_title(label)
    fig.tight_layout()
    return fig


def steer_box_figure(steer: pd.DataFrame, title: str) -> Any:
    """Figures 5, 7, 10(a) and 13: the steerability toward the cue's side per influence type, reasoning off and
    on side by side, from ``steer_by_condition.csv``'s rows of one benchmark."""
    plt = pyplot()
    infl = list(dict.fromkeys(steer["influence"]))
    modes = sorted(set(map(bool, steer["think"])))
    fig, ax = plt.subplots(figsize=(min(12, max(5, 0.9 * len(infl) * len(modes))), 3.8))
    width = 0.8 / len(modes)
    for j, mode in enumerate(modes):
        data = [steer[(steer["influence"] == i) & (steer["think"].astype(bool) == mode)]["s"].dropna() for i in infl]
        pos = [k + (j - (len(modes) - 1) / 2) * width for k in range(len(infl))]
        color = "tab:orange" if mode else "tab:blue"
        ax.boxplot([d.to_numpy() for d in data], positions=pos, widths=width * 0.9, manage_ticks=False,
                   patch_artist=True, boxprops={"facecolor": color, "alpha": 0.6}, flierprops={"markersize": 3})  # fmt: skip
        ax.bar([0], [0], color=color, alpha=0.6, label=f"reasoning {'on' if mode else 'off'}")
    ax.axhline(0, color="0.8", lw=1)
    ax.set_xticks(range(len(infl)), infl, rotation=30, ha="right")
    ax.set_ylabel("s toward the cue's side (log-odds)")
    ax.set_title(title)
    if len(modes) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def steer_baseline_figure(steer: pd.DataFrame, title: str) -> Any:
    """Figure 14 (left): |s| against the baseline bias |f0(B) - 0.5|, cues toward the baseline's preferred side and
    against it, from ``steer_by_condition.csv``'s rows of one benchmark."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    known = steer[steer["toward_preferred"].notna()]
    for flag, label in ((True, "toward preferred"), (False, "against preferred")):
        g = known[known["toward_preferred"].astype(bool) == flag]
        ax.scatter(g["baseline_bias"], g["s"].abs(), s=12, label=label)
    ax.set_xlabel("baseline bias |f0(B) - 0.5|")
    ax.set_ylabel("|s| (log-odds)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def compare_figures(tables: Mapping[str, pd.DataFrame], sfx: str = "", pre: str = "") -> tuple[Drawing, ...]:
    """The comparison's paper-000 figures, each drawn from a table beside it: Figure 3 from ``headline.csv``,
    Figures 5/7/10(a)/13 and 14 from ``steer_by_condition.csv`` (one per benchmark)."""
    out = []
    head = tables.get("headline")
    if head is not None and len(head):
        out.append(Drawing(f"fig_headline{sfx}.png", partial(headline_figure, head)))
    steer = tables["steer_by_condition"]
    for bench, g in steer.groupby("benchmark", sort=False):
        out.append(Drawing(f"fig_steer_by_influence_{bench}{sfx}.png",
                           partial(steer_box_figure, g, f"{pre}{bench}: steerability per influence type")))  # fmt: skip
        out.append(Drawing(f"fig_steer_vs_baseline_{bench}{sfx}.png",
                           partial(steer_baseline_figure, g, f"{pre}{bench}: |s| against baseline bias")))  # fmt: skip
    return tuple(out)
