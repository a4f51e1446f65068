"""The cue-visibility panel report: ``probe compare`` on cue runs writes CSV tables, ``summary.md`` and figures.

The quantities come from :func:`analysis.cue.compare.compare_cue_frames`
(its module docstring defines them), computed once into a
:class:`~analysis.cue.compare.CueComparison`; this module only formats them
(the summary's lines, the tables, figure functions that return their figures)
and :func:`~analysis.common.report.panel_body` gathers them. When every
run holds readouts and samples (:func:`analysis.cue.compare.compare_cue_sources`
gives two comparisons), every CSV holds both in long form (a ``source`` column),
each figure is drawn per source (``*_readout.png``, ``*_samples.png``) and the
summary has a part per source.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.figures import pyplot
from analysis.common.report import Body, Drawing, sources_panel_body
from analysis.common.tables import md_table
from analysis.cue.compare import (
    AVERAGED,
    MIN_MODELS,
    N_BOOT,
    SEED,
    CueComparison,
    compare_cue_sources,
)
from analysis.cue.decisions import Decision
from probe.panel import Panel


def compare_cue(panel: Panel, *, n_boot: int = N_BOOT, seed: int = SEED, decision: Decision = "greedy") -> Body:
    """The cue-visibility panel report: its summary, CSV tables and PNG figures (of each source where every run
    has both)."""
    parts = compare_cue_sources(panel, n_boot=n_boot, seed=seed, decision=decision)
    summaries = partial(_summary_md, panel, n_boot), partial(_sources_summary_md, panel, parts, n_boot)
    return sources_panel_body(parts, lambda p: p.dropped, _drawings, *summaries)


# ---------------------------------------------------------------------------- figures
def _drawings(res: CueComparison, tag: str = "") -> list[Drawing]:
    """The comparison's figures, each with its file name; ``tag`` (a source) suffixes the names and titles."""
    sfx, pre = (f"_{tag}", f"{tag}: ") if tag else ("", "")
    out = [Drawing(f"fig_cue_rankings{sfx}.png", partial(plot_rankings, res.models, res.arm, res.consequences, pre))]
    if res.attributes is not None and res.ols is not None:
        draw = partial(plot_gap_vs_attributes, res.models, res.attributes, res.ols, pre)
        out.append(Drawing(f"fig_cue_gap_vs_attributes{sfx}.png", draw))
    if res.paper is not None:
        from analysis.cue.paper_report import paper_drawings

        out += paper_drawings(res.paper, res.sign_tests, res.average_by_group, res.arm, tag)
    return out


def plot_rankings(models: pd.DataFrame, arm: str, consequences: str, prefix: str = "") -> Any:
    """Each run's macro net bias under Direct and under ``arm``, joined by a line (crossing lines: rank changes);
    ``prefix`` starts the title. The figure."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 0.3 * len(models) + 3))
    for r in models.itertuples():
        ax.plot([0, 1], [100 * r.direct_net, 100 * r.puzzled_net], marker="o")
        ax.annotate(str(r.name), (1.03, 100 * r.puzzled_net), fontsize=7, va="center")
        ax.annotate(str(r.name), (-0.03, 100 * r.direct_net), fontsize=7, va="center", ha="right")
    ax.axhline(0, color="0.7", lw=0.8)
    ax.set_xticks([0, 1], ["Direct", arm])
    ax.set_xlim(-0.6, 1.6)
    ax.set_ylabel("macro net bias (pp)")
    ax.set_title(f"{prefix}net bias per model ({consequences} consequences); crossing lines = rank changes", fontsize=8)
    fig.tight_layout()
    return fig


def plot_gap_vs_attributes(models: pd.DataFrame, attributes: pd.DataFrame, ols: pd.DataFrame, prefix: str = "") -> Any:
    """One panel per model attribute: each run's Gap against it, with the OLS line of ``ols`` where it was fitted
    (its R² and n in the title, after ``prefix``). The figure."""
    plt = pyplot()
    cols = [c for c in attributes.columns if c != "name"]
    data = models[["name", "gap"]].merge(attributes, on="name", how="left")
    fig, axes = plt.subplots(1, len(cols), figsize=(3.6 * len(cols), 3.4), squeeze=False)
    for ax, col in zip(axes[0], cols, strict=True):
        ax.scatter(data[col], 100 * data["gap"])
        for name, x, gap in zip(data["name"], data[col], data["gap"], strict=True):
            ax.annotate(str(name), (x, 100 * gap), fontsize=6)
        fit = ols[(ols["fit"] == col) & (ols["term"] == col)]
        if len(fit) and np.isfinite(fit["slope"].iloc[0]):
            xs = np.linspace(float(data[col].min()), float(data[col].max()), 10)
            ax.plot(xs, 100 * (fit["intercept"].iloc[0] + fit["slope"].iloc[0] * xs), color="black", lw=1)
            ax.set_title(f"{prefix}R² = {fit['r2'].iloc[0]:.2f}, n = {int(fit['n'].iloc[0])}", fontsize=8)
        ax.set_xlabel(col)
        ax.set_ylabel("Gap (pp)")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------- summary
def _pp_frame(df: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    out = df.copy()
    for c in cols:
        out[c] = 100 * out[c]
    return out


def _summary_md(panel: Panel, n_boot: int, res: CueComparison, figures: Sequence[str]) -> str:
    from analysis.common.report import panel_md

    lines = ["# Cue visibility across runs", "", *panel_md(panel), ""]
    lines += _summary_body(res, n_boot)
    if figures:
        lines += [f"![{f}]({f})" for f in figures] + [""]
    return "\n".join(lines)


def _sources_summary_md(panel: Panel, parts: Sequence[CueComparison], n_boot: int, figures: Sequence[str]) -> str:
    """The summary of a panel whose runs all hold readouts and samples: one part per source, each the one-source
    summary one heading level down."""
    from analysis.common.report import panel_md, source_part_md

    lines = ["# Cue visibility across runs", "", *panel_md(panel), ""]
    lines += [
        "Every run holds answer-slot readouts and sampled answers, so the comparison is computed from each source ("
        + " and ".join(str(p.source) for p in parts)
        + "; a sampled trial's greedy decision is its most frequent answer): every CSV holds both in long form "
        "(`source` column), every figure is drawn per source (`*_<source>.png`).",
        "",
    ]
    for p in parts:
        mine = [f for f in figures if f.endswith(f"_{p.source}.png")]
        shown = [*(f"![{f}]({f})" for f in mine), ""] if mine else []
        lines += source_part_md(str(p.source), _summary_body(p, n_boot), shown)
    return "\n".join(lines)


def _summary_body(res: CueComparison, n_boot: int) -> list[str]:
    """The summary after its header (the panel) and before its figures."""
    from analysis.common.report import dropped_md

    lines = [*dropped_md(res.dropped, len(res.items), "dilemmas"), ""]
    lines += [
        f"Headline arm: **{res.arm}** against Direct, {res.consequences} consequences. Net bias = Favor - Against "
        + (
            "(**greedy decisions**: the most probable option, the paper's temperature 0; `--decision expected` for "
            "expected decisions)"
            if res.decision == "greedy"
            else "(**expected decisions** over the answer distributions; the paper's reading is greedy, the default)"
        )
        + ", Favor and Against over their eligible denominators"
        ", macro = mean over gender and race groups, in pp, ± bootstrap SD over dilemmas "
        f"({n_boot} draws). Gap = net(Direct) - net(Puzzled) = ΔAgainst - ΔFavor.",
        "",
        "## Rankings",
        "",
        "Rank 1 = most favorable net bias (Direct, Puzzled) or smallest Gap; rank change = Puzzled rank - Direct rank.",
        "",
    ]
    lines += _rankings_md(res)
    lines += ["Kendall's tau-b between rankings (scipy; exact p for small panels without ties):", ""]
    lines += [md_table(res.kendall, nan="–"), ""]
    lines += [
        "## Sign tests across models",
        "",
        "Per group: how many runs shift each way (positive Gap / ΔAgainst = adverse shift), two-sided binomial p.",
        "",
        md_table(
            res.sign_tests[["value", "attr", "group", "n_models", "positive", "negative", "ties", "p_value"]], nan="–"
        ),
        "",
    ]
    lines += _attributes_md(res)
    if res.paper is not None:
        from analysis.cue.paper_report import paper_md

        lines += paper_md(res.paper, res.arm, res.consequences)
    lines += [f"- {n}" for n in res.notes]
    if res.notes:
        lines.append("")
    return lines


def _rankings_md(res: CueComparison) -> list[str]:
    """The ranking table: each run's net bias (Direct, Puzzled), the Gap and their ranks, then the Average rows."""
    pp = ["direct_net", "sd_direct_net", "puzzled_net", "sd_puzzled_net", "d_against", "d_favor", "gap", "sd_gap"]
    show = _pp_frame(res.models, pp)
    cols = [
        "name",
        "direct_net",
        "rank_direct",
        "puzzled_net",
        "rank_puzzled",
        "rank_change",
        "d_against",
        "d_favor",
        "gap",
        "sd_gap",
        "rank_gap",
    ]
    avg = _pp_frame(res.average, list(AVERAGED))
    lines = [md_table(pd.concat([show[cols], avg.reindex(columns=cols)], ignore_index=True), "{:.1f}", nan="–"), ""]
    lines += [
        "Average: the mean over the runs (the paper's Average rows); per group in `cue_average_by_group.csv`.",
        "",
    ]
    return lines


def _attributes_md(res: CueComparison) -> list[str]:
    """The OLS of the Gap on each model attribute (and how the puzzle solve rate was derived)."""
    lines = ["## Gap against model attributes", ""]
    if res.ols is None:
        lines += [
            "No attribute table (`--attributes CSV` or `attributes:` in the panel file) and no identity checks.",
            "",
        ]
    else:
        n = len(res.models)
        lines += [
            f"OLS `gap ~ attribute` (statsmodels) over {n} run(s); gap in proportion units (0.01 = 1 pp)."
            + (
                f" **Underpowered**: with fewer than {MIN_MODELS} models a slope's CI is wide and R² is unstable; "
                "read this as descriptive."
                if n < MIN_MODELS
                else ""
            ),
            "",
            md_table(res.ols, nan="–"),
            "",
        ]
        if "puzzle_solve_rate" in (res.attributes.columns if res.attributes is not None else []):
            how = (
                "macro-averaged over " + ", ".join(res.capability_arms) + " (the paper's Capability, App. O)"
                if res.capability == "macro"
                else f"on {res.arm} alone"
            )
            lines += [
                f"`puzzle_solve_rate`: both-correct (gender and race) identity-check accuracy, {how}, "
                f"{res.consequences} consequences (derived from the runs).",
                "",
            ]
    return lines
