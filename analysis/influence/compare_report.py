"""The influence panel report: ``probe compare`` on influence runs writes CSV tables, ``summary.md`` and figures.

The quantities come from :func:`analysis.influence.compare.compare_frames`
(its module docstring defines them), computed once into a frozen
:class:`~analysis.influence.compare.InfluenceComparison`; this module only
formats them (the summary's lines, the tables, the figures' drawings) and
:func:`~analysis.common.report.panel_body` gathers them. When every
run holds readouts and samples (:func:`analysis.influence.compare.compare_sources`
gives two comparisons), every CSV holds both in long form (a ``source`` column,
:func:`analysis.common.tables.source_tables`), each figure is drawn per source
(``*_readout.png``, ``*_samples.png``) and the summary has a part per source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.figures import pyplot
from analysis.common.report import Body, Drawing, sources_panel_body
from analysis.common.tables import md_table
from analysis.influence import paper000_report
from analysis.influence.asym import AsymFit
from analysis.influence.compare import N_BOOT, SEED, InfluenceComparison, compare_sources
from analysis.influence.flags import PRACTICAL_SHIFT
from analysis.influence.report import asym_md
from probe.panel import Panel


def compare_influence(panel: Panel, *, n_boot: int = N_BOOT, seed: int = SEED, asym_model: str = "crossed") -> Body:
    """The influence panel report: its summary, CSV tables and PNG figures (of each source where every run has
    both)."""
    parts = compare_sources(panel, n_boot=n_boot, seed=seed, asym_model=asym_model)
    summaries = partial(_summary_md, panel, n_boot), partial(_sources_summary_md, panel, parts, n_boot)
    return sources_panel_body(parts, lambda p: p.dropped_items, figures, *summaries)


# ---------------------------------------------------------------------------- figures
def figures(res: InfluenceComparison, tag: str = "") -> tuple[Drawing, ...]:
    """The comparison's figures, each with its file name; ``tag`` (a source) suffixes the names and titles."""
    sfx, pre = (f"_{tag}", f"{tag}: ") if tag else ("", "")
    main = res.conditions[res.conditions["variant"] == "cue"]
    drawings = [
        Drawing(
            f"fig_steerability_by_model_{bench}{sfx}.png",
            partial(steerability_figure, g, f"{pre}{bench}: steerability per run (mean over conditions)"),
        )
        for bench, g in main.groupby("benchmark", sort=False)
    ]
    if not res.change.empty:
        ch = res.change[res.change["direction"] != "both"]
        drawings += [
            Drawing(
                f"fig_reasoning_change_{bench}{sfx}.png",
                partial(change_figure, g, f"{pre}{bench}: reasoning on minus off"),
            )
            for bench, g in ch.groupby("benchmark", sort=False)
        ]
    if len(res.asym_data):
        scopes = [f for f in res.fits if f.scope != "pooled" and f.structure == res.asym_model]
        drawings.append(Drawing(f"fig_asym_vs_bias{sfx}.png", partial(asym_figure, res.asym_data, scopes, pre)))
    return (*drawings, *paper000_report.compare_figures(res.tables, sfx, pre))


def steerability_figure(g: pd.DataFrame, title: str) -> Any:
    """Per run, the mean s(A) and s(B) of each influence type over the main-cue conditions ``g`` of a benchmark."""
    plt = pyplot()
    runs = list(dict.fromkeys(g["run"]))
    infl = list(dict.fromkeys(g["influence"]))
    cols = min(4, len(runs))
    rows = math.ceil(len(runs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows + 0.6), sharey=True, squeeze=False)
    x = np.arange(len(infl))
    for ax, run in zip(axes.flat, runs, strict=False):
        sub = g[g["run"] == run].groupby("influence", sort=False)[["s_A", "s_B"]].mean().reindex(infl)
        ax.bar(x - 0.2, sub["s_A"], 0.4, label="s(A)", color="tab:blue")
        ax.bar(x + 0.2, sub["s_B"], 0.4, label="s(B)", color="tab:orange")
        ax.axhline(0, color="0.3", lw=0.8)
        ax.set_xticks(x, infl, rotation=45, ha="right", fontsize=7)
        ax.set_title(run, fontsize=8)
    for ax in list(axes.flat)[len(runs) :]:
        ax.axis("off")
    axes[0, 0].set_ylabel("mean steerability (log-odds)")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def change_figure(g: pd.DataFrame, title: str) -> Any:
    """Per model, the change s(on) - s(off) of each influence type and direction with its CI (rows of a
    benchmark's ``reasoning_change`` table, directions A and B)."""
    plt = pyplot()
    models = list(dict.fromkeys(g["model"]))
    fig, axes = plt.subplots(
        1,
        len(models),
        figsize=(3.4 * len(models), 0.35 * g["influence"].nunique() * 2 + 1.6),
        sharex=True,
        squeeze=False,
    )
    for ax, model in zip(axes[0], models, strict=True):
        sub = g[g["model"] == model].reset_index(drop=True)
        y = np.arange(len(sub))[::-1]
        colors = np.where(sub["direction"] == "A", "tab:blue", "tab:orange")
        ax.hlines(y, sub["change_lo"], sub["change_hi"], color=colors, lw=2)
        ax.scatter(sub["change"], y, color=colors, zorder=3, s=14)
        ax.axvline(0, color="0.3", lw=0.8)
        ax.set_yticks(y, [f"{r.influence} → {r.direction}" for r in sub.itertuples()], fontsize=7)
        ax.set_title(model, fontsize=8)
        ax.set_xlabel("s(on) - s(off), 95% CI", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def asym_figure(data: pd.DataFrame, scopes: Sequence[AsymFit], pre: str = "") -> Any:
    """|Asym| against |baseline bias| per benchmark (the fits ``scopes``), with the fitted line; ``pre`` starts the
    titles."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(scopes), figsize=(4 * len(scopes), 3.6), squeeze=False)
    for ax, fit in zip(axes[0], scopes, strict=True):
        sub = data[data["benchmark"] == fit.scope]
        for mr, gg in sub.groupby("model_reasoning", sort=False):
            ax.scatter(gg["baseline_bias"], gg["abs_asym"], s=12, label=mr)
        if math.isfinite(fit.beta):
            xs = np.linspace(0, max(0.5, float(sub["baseline_bias"].max())), 20)
            ax.plot(xs, fit.intercept + fit.beta * xs, color="black", lw=1)
        r2 = f", marginal R² {fit.variances.r2_marginal:.2f}" if math.isfinite(fit.variances.r2_marginal) else ""
        ax.set_title(f"{pre}{fit.scope}: β = {fit.beta:.2f}{r2}", fontsize=8)
        ax.set_xlabel("|baseline bias| = |f0(B) - 0.5|")
        ax.set_ylabel("|Asym| (log-odds)")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------- summary
_BY = ["conditions", "f0_B", "|delta|", "|steer|", "steer", "|asym|", "sig", "practical", "bf_of_sig"]
"""Columns of the per-group tables; ``practical`` (share of effects with |shift| >= PRACTICAL_SHIFT) stands beside
``sig``."""


def _summary_md(panel: Panel, n_boot: int, res: InfluenceComparison, figures: Sequence[str]) -> str:
    from analysis.common.report import panel_md

    lines = ["# Influence audit across runs", "", *panel_md(panel), ""]
    lines += _summary_body(res, n_boot)
    if figures:
        lines += ["Figures: " + ", ".join(f"`{f}`" for f in figures), ""]
    return "\n".join(lines)


def _sources_summary_md(panel: Panel, parts: Sequence[InfluenceComparison], n_boot: int, figures: Sequence[str]) -> str:
    """The summary of a panel whose runs all hold readouts and samples: one part per source, each the one-source
    summary one heading level down."""
    from analysis.common.report import panel_md, source_part_md

    names = [str(p.source) for p in parts]
    lines = ["# Influence audit across runs", "", *panel_md(panel), ""]
    lines += [
        f"Every run holds answer-slot readouts and sampled answers, so the comparison is computed from each source "
        f"({' and '.join(names)}; readout s is the log-odds of the mean probabilities, sampled s the paper's +1/2 "
        "rule, docs/influence.md): every CSV holds both in long form (`source` column), every figure is drawn per "
        "source (`*_<source>.png`).",
        "",
    ]
    for p in parts:
        mine = [f for f in figures if f.endswith(f"_{p.source}.png")]
        shown = ["Figures: " + ", ".join(f"`{f}`" for f in mine), ""] if mine else []
        lines += source_part_md(str(p.source), _summary_body(p, n_boot), shown)
    return "\n".join(lines)


def _summary_body(res: InfluenceComparison, n_boot: int) -> list[str]:
    """The summary from its matching section on (the header and the figure list are the caller's)."""
    t = res.tables
    lines = _matching_md(res, n_boot)
    lines += _headline_md(t["headline"])
    lines += [
        "## Per model and reasoning mode (main cues)",
        "",
        md_table(t["by_model"][["benchmark", "model", "think", *_BY]], nan="–"),
        "",
    ]
    lines += ["## Per reasoning mode", "", md_table(t["by_reasoning"][["benchmark", "think", *_BY]], nan="–"), ""]
    lines += [
        "## Per influence type and reasoning mode",
        "",
        md_table(t["by_influence_reasoning"][["benchmark", "influence", "think", *_BY]], nan="–"),
        "",
    ]
    lines += _reasoning_change_md(res.change)
    lines += [
        "## |Asym| against |baseline bias|",
        "",
        *asym_md(res.fits, res.asym_model),
    ]
    return lines + paper000_report.compare_md(t)


def _matching_md(res: InfluenceComparison, n_boot: int) -> list[str]:
    """How the runs were matched on items and conditions, and how the conditions are recomputed on them."""
    from analysis.common.report import dropped_md

    lines = ["## Matching", ""]
    if res.imported:
        lines += [
            f"Imported runs ({', '.join(res.imported)}) hold condition-level counts: they are not matched on items, "
            "their conditions enter as imported, and no item bootstrap is computed for them (their share of the "
            "headline CIs is a cluster bootstrap over (run, factor) clusters).",
            "",
        ]
    for m in res.matched:
        lines += [f"**{m.benchmark}**: {len(m.conditions)} conditions on {len(m.items)} items.", ""]
        lines += [*dropped_md(m.dropped_items, len(m.items)), ""]
        if len(m.dropped_conditions):
            lines += [
                f"{m.dropped_conditions['condition'].nunique()} conditions not in every run were dropped "
                "(`dropped_conditions.csv`).",
                "",
            ]
    lines += [
        "Each run's conditions are recomputed on the matched items; steerability s(d) is the log-odds shift "
        "toward d (+1/2 continuity correction), Asym = s(B) - s(A); BH-FDR within benchmark x variant x test family "
        f"over all runs; CIs from {n_boot} cluster-bootstrap replicates of the items.",
        "",
    ]
    return lines


def _headline_md(head: pd.DataFrame) -> list[str]:
    """The headline rows the summary shows, per benchmark."""
    lines = ["## Headline per benchmark", ""]
    if not len(head):
        return lines
    keep = head[
        head["metric"].isin(
            [
                "conditions",
                "mean |shift| (pp), all cues",
                "mean |shift| (pp), all cues, bias-corrected",
                "effects with significant shift (BH-FDR)",
                f"effects with |shift| >= {100 * PRACTICAL_SHIFT:g} pp (practical threshold)",
                "conditions with significant asymmetry (BH-FDR)",
            ]
        )
    ]
    cols = ["benchmark", "metric", "value", "ci_lo", "ci_hi", "note"]
    return [*lines, md_table(keep[cols].astype({"value": float}), nan="–"), ""]


def _reasoning_change_md(change: pd.DataFrame) -> list[str]:
    """Reasoning on minus off per model and influence type (both cue directions)."""
    lines = ["## Reasoning on minus off", ""]
    if change.empty:
        lines += ["No model has both a reasoning-off and a reasoning-on run in this panel.", ""]
    else:
        lines += [
            "Per influence type, over both cue directions (per direction and per condition in `reasoning_change.csv` "
            "and `reasoning_change_conditions.csv`). change = mean s(on) - s(off); |s| change = mean |s(on)| - "
            "mean |s(off)|; 95% CIs from a paired bootstrap over items (both runs reweighted by the same draw). "
            "amplified / dampened: the CI of the |s| change lies above / below 0.",
            "",
        ]
        both = change[change["direction"] == "both"]
        show = both[
            [
                "benchmark",
                "model",
                "influence",
                "abs_s_off",
                "abs_s_on",
                "abs_change",
                "abs_change_lo",
                "abs_change_hi",
                "pct_change",
                "change",
                "change_lo",
                "change_hi",
                "verdict",
            ]
        ]
        lines += [md_table(show, nan="–"), ""]
    return lines
