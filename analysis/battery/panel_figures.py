"""Paper 003's cross-model figures in ``probe compare``: Figs. 1b, 2, 5 and 6, each a CSV, a Markdown table and a
PNG drawn from that CSV's frame.

* **Fig. 1b**, the components of the cross-form spread per configuration (:func:`incoherence_components`): the
  pooled sigma_repro of each run (the models table's), its bar split by variance share into the anchor-direction
  and the scale components, which add in quadrature (sigma_repro^2 = sigma_dir^2 + sigma_scale^2: "drawn by
  variance share, never stacked linearly"). ``fig1b_incoherence.csv``, ``fig1b_incoherence.png``.
* **Fig. 2**, the apparent yes/no bias and its split into order + lexical per configuration, story-averaged with
  bootstrap CIs (:func:`decomposition_table`). ``fig2_decomposition.csv``, ``fig2_decomposition_models.png``.
* **Figs. 5 and 6**, the verb x label x order projections of every label pair of every run
  (:func:`label_pairs_table`), on the panel's shared dilemmas, as the battery report computes them per run
  (:func:`analysis.battery.binary.projections`; complete stories only): order, logic, label and the label pull
  (Fig. 6's bar: the label projection, the logic one where the mapping is not crossed) with percentile bootstrap
  CIs over dilemmas, and with I-1's theta the per-pair joint fit's m for the order, logic and label channels
  (:func:`analysis.battery.joint_fit.fit_pair`, in theta units). ``label_pairs_by_model.csv``;
  ``fig5_projections_models.png`` (Fig. 5a: every pair's three projections per run, value and CI half-width);
  ``fig5b_collapse.csv`` / ``.png`` (Fig. 5b: the yes/no verb flip's lexical pull beside the A/B logic pull);
  ``lexicality_by_model.csv`` (mean |label pull| per lexicality level and the word-minus-non-lexical contrast)
  and ``fig6_lexicality_models.png`` (Fig. 6: per run, each pair's order bias and label pull, ordered
  non-lexical -> lexical).

A part with no data in the panel (no label pairs beyond Yes/No, no graded instrument) raises
:class:`~probe.errors.NotComputed`, so its section says why and writes nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.battery.compare import Context, RunData
from analysis.common.figures import pyplot
from analysis.common.report import Body, Drawing, Files, Table, titled
from analysis.common.tables import md_table
from probe.errors import NotComputed

PROJECTIONS = ("order", "label", "logic")
"""Fig. 5a's three projections, in its column order."""
PULLS = ("order", "logic", "label", "label_pull")
"""The story-averaged quantities of a pair that get a bootstrap CI."""
LEVELS = {0: "non-lexical", 1: "mark", 2: "word"}
"""The corpus's lexicality levels (Fig. 6's a-priori ordering)."""
FIT_CHANNELS = ("order", "logic", "label")


def _table(df: pd.DataFrame, index: bool = False) -> Table:
    return Table(df, index=index, float_format="%.6f")


# ------------------------------------------------------------------ Fig. 1b
def incoherence_components(models: pd.DataFrame) -> pd.DataFrame:
    """Per run with a pooled sigma_repro: the direction and scale components and their variance shares.

    ``share_dir = sigma_dir^2 / (sigma_dir^2 + sigma_scale^2)``; the bar of height sigma_repro is split into
    ``bar_dir = share_dir * sigma_repro`` (solid) and ``bar_scale`` (hatched). A run whose two components are
    both 0 gets NaN shares and empty segments.
    """
    need = ("sigma_repro", "sigma_dir", "sigma_scale")
    if any(c not in models.columns for c in need) or models["sigma_repro"].isna().all():
        raise NotComputed("no run has the pooled incoherence (the graded instrument I-1 on two or more forms)")
    t = models.loc[models["sigma_repro"].notna(), ["model", "reasoning", *need]].copy()
    var = t["sigma_dir"] ** 2 + t["sigma_scale"] ** 2
    t["share_dir"] = (t["sigma_dir"] ** 2 / var).where(var > 0)
    t["share_scale"] = (t["sigma_scale"] ** 2 / var).where(var > 0)
    t["bar_dir"] = (t["share_dir"] * t["sigma_repro"]).fillna(0.0)
    t["bar_scale"] = (t["share_scale"] * t["sigma_repro"]).fillna(0.0)
    return t


def fig1b(table: pd.DataFrame) -> Any:
    """Fig. 1b from ``fig1b_incoherence.csv``: one bar per run, split by variance share."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 0.7 * len(table) + 2), 3.6))
    x = np.arange(len(table))
    ax.bar(x, table["bar_dir"], color="#4c72b0", label="anchor direction (variance share)")
    ax.bar(x, table["bar_scale"], bottom=table["bar_dir"], color="white", edgecolor="#4c72b0", hatch="///",
           label="scale, wording, pole (variance share)")  # fmt: skip
    ax.set_xticks(x, [str(i) for i in table.index], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("sigma_repro (pooled, +-1 axis)")
    ax.set_title("Cross-form incoherence per configuration (Fig. 1b)", fontsize=10)
    ax.set_ylim(0, 1.35 * max(float(table["sigma_repro"].max()), 1e-9))
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


@titled("Components of the cross-form incoherence (Fig. 1b)")
def incoherence_section(c: Context) -> Body:
    assert c.models is not None  # a battery panel's context has it
    t = incoherence_components(c.models)
    lines = [
        "Per run: the pooled sigma_repro of the models table, split by variance share into the anchor-direction "
        "component sigma_dir and the scale component sigma_scale (scale, wording, pole), which add in quadrature: "
        "share_dir = sigma_dir^2 / (sigma_dir^2 + sigma_scale^2), bar_dir = share_dir x sigma_repro (the paper "
        "draws the decomposition by variance share, never stacked linearly). Figure `fig1b_incoherence.png`, "
        "drawn from `fig1b_incoherence.csv`.",
        "",
        md_table(t.reset_index(), "{:.3f}", nan="–"),
    ]
    files = Files(
        {"fig1b_incoherence": _table(t, index=True)}, (Drawing("fig1b_incoherence.png", functools.partial(fig1b, t)),)
    )
    return lines, files


# ------------------------------------------------------------------ Fig. 2
DECOMPOSITION = ("apparent", "order", "lexical")
"""Fig. 2's bars: the apparent yes/no bias and its two parts (apparent = order + lexical)."""


def decomposition_table(c: Context) -> pd.DataFrame:
    """Per run with the yes/no verb flip: the story-averaged apparent, order and lexical bias with bootstrap CIs."""
    from analysis.battery.yesno import story_mean_ci

    rows = {}
    for name, d in c.runs.items():
        if d.dec is None or d.dec.empty:
            continue
        ci = story_mean_ci(d.dec[list(DECOMPOSITION)], n_boot=c.n_boot, seed=c.seed)
        row: dict[str, Any] = {"model": d.run.model, "reasoning": "on" if d.run.reasoning else "off"}
        for k in DECOMPOSITION:
            row |= {k: ci.loc[k, "mean"], f"{k}_lo": ci.loc[k, "lo"], f"{k}_hi": ci.loc[k, "hi"]}
        row["n_items"] = int(ci.loc["apparent", "n"])
        rows[name] = row
    if not rows:
        raise NotComputed("no run has the yes/no verb flip (instrument binary, labels Yes/No)")
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "run"
    return out


def fig2(table: pd.DataFrame) -> Any:
    """Fig. 2 from ``fig2_decomposition.csv``: per run, apparent, order and lexical bias with 95% CIs."""
    plt = pyplot()
    x = np.arange(len(table))
    fig, ax = plt.subplots(figsize=(max(4.5, 0.9 * len(table) + 2), 3.6))
    colors = {"apparent": "#8172b3", "order": "#dd8452", "lexical": "#c44e52"}
    for k, col in enumerate(DECOMPOSITION):
        ax.bar(x + (k - 1) * 0.27, table[col], 0.27, yerr=_half(table, col), capsize=2, color=colors[col], label=col)
    ax.set_xticks(x, [str(i) for i in table.index], rotation=30, ha="right", fontsize=8)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel("story-averaged b")
    ax.set_title("The apparent yes/no bias = order + lexical (Fig. 2)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


@titled("The yes/no bias decomposed per model (Fig. 2)")
def decomposition_section(c: Context) -> Body:
    t = decomposition_table(c)
    lines = [
        f"Per run, on the shared dilemmas: the yes/no verb flip's apparent bias and its exact split into order "
        f"(toward the first-printed option) + lexical (toward the word yes), story-averaged, with {c.n_boot} "
        f"percentile bootstrap resamples over dilemmas (seed {c.seed}). Figure `fig2_decomposition_models.png`, "
        "drawn from `fig2_decomposition.csv`.",
        "",
        md_table(t.reset_index(), "{:+.3f}", nan="–"),
    ]
    drawing = Drawing("fig2_decomposition_models.png", functools.partial(fig2, t))
    return lines, Files({"fig2_decomposition": _table(t, index=True)}, (drawing,))


# ------------------------------------------------------------------ Figs. 5-6
def run_label_pairs(d: RunData, shared: Sequence[str], *, n_boot: int, seed: int) -> pd.DataFrame | None:
    """One run's label pairs (every pair but Yes/No) on ``shared``: projections with CIs, and the per-pair fit's m.

    None when the run has no label pair beyond Yes/No, or no story with every cell of any pair usable.
    """
    from analysis.battery import fit
    from analysis.battery.binary import cell_events, label_pull, lexicality_gradient, projections
    from analysis.battery.yesno import story_mean_ci
    from experiments.battery import BatterySpec, load_corpus

    per = d.per_trial[d.per_trial["item_id"].isin(set(shared))]
    if "instrument" not in per.columns or "labels" not in per.columns:
        return None
    b = per[(per["instrument"] == "binary") & (per["labels"] != "Yes/No") & (per["replicate"] == 0)]
    if b.empty:
        return None
    labels = load_corpus(d.opened.manifest.spec_as(BatterySpec).corpus)["binary"]["labels"]
    cb = {k for k, v in labels.items() if v.get("counterbalance")}
    opts = d.options[d.options["trial_id"].isin(b["trial_id"])]
    proj = projections(cell_events(b, opts), cb)
    if proj.empty:
        return None
    by_pair, _ = lexicality_gradient(proj, {k: int(v.get("lexicality", -1)) for k, v in labels.items()})
    corpus_order = [k for k in labels if k in by_pair.index]  # Fig. 6's order within a lexicality level
    by_pair = by_pair.reindex(corpus_order).sort_values("lexicality", kind="stable")
    pulls = label_pull(proj)
    for col in PULLS:
        ci = story_mean_ci(pulls[col].unstack("labels"), n_boot=n_boot, seed=seed)
        by_pair[f"{col}_lo"], by_pair[f"{col}_hi"] = ci["lo"], ci["hi"]
    by_pair["family"] = [str(labels.get(p, {}).get("family", "")) for p in by_pair.index]
    m = _pair_fits(d, b, list(by_pair.index), fit)
    return by_pair.join(m) if m is not None else by_pair


def _pair_fits(d: RunData, b: pd.DataFrame, pairs: list[str], fit: Any) -> pd.DataFrame | None:
    """Per pair: s and m per channel of the joint (order, logic, label) fit with I-1's theta (no resamples)."""
    from analysis.battery.joint_fit import fit_pair

    if d.theta is None:
        return None
    try:
        bt = fit.binary_trials(d.options[d.options["trial_id"].isin(b["trial_id"])], b)
    except NotComputed:
        return None
    rows = {}
    for pair in pairs:
        try:
            pf = fit_pair(d.theta.dropna(), bt, pair, n_boot=0)
        except NotComputed:
            continue
        row = {"s": pf.s, "clip_limited": "yes" if pf.clip_limited else "no"}
        row |= {f"m_{ch}": pf.m[pf.channels.index(ch)] for ch in FIT_CHANNELS if ch in pf.channels}
        rows[pair] = row
    return pd.DataFrame.from_dict(rows, orient="index") if rows else None


def label_pairs_table(runs: Mapping[str, RunData], shared: Sequence[str], *, n_boot: int, seed: int) -> pd.DataFrame:
    """Every run's label pairs, one row per (run, label pair), pairs in lexicality order (Figs. 5-6's table)."""
    parts = []
    for name, d in runs.items():
        t = run_label_pairs(d, shared, n_boot=n_boot, seed=seed)
        if t is not None:
            parts.append(t.rename_axis("label pair").reset_index().assign(run=name))
    if not parts:
        raise NotComputed(
            "no run has label pairs beyond Yes/No with a complete story (instrument binary, --label-pairs)"
        )
    long = pd.concat(parts, ignore_index=True)
    first = ["run", "label pair", "family", "lexicality", "n_items", "pull_from"]
    values = [c for c in long.columns if c not in first]
    return long[first + values]


def lexicality_table(long: pd.DataFrame) -> pd.DataFrame:
    """Per run: mean |label pull| per lexicality level, and the contrast words minus non-lexical.

    ``contrast``: over the pairs whose mapping is crossed (the label projection), as the battery report's;
    ``contrast_all``: with the uncrossed pairs too (``story``, which Fig. 6 groups among the words).
    """
    rows = {}
    for run, g in long.groupby("run", sort=False):
        row: dict[str, float] = {}
        crossed = g[g["pull_from"] == "label"]
        for lvl, name in LEVELS.items():
            row[f"abs_pull_{name}"] = float(crossed.loc[crossed["lexicality"] == lvl, "label_pull"].abs().mean())
        for key, frame in (("contrast", crossed), ("contrast_all", g)):
            words = frame.loc[frame["lexicality"] >= 2, "label_pull"].abs()
            nonlex = frame.loc[frame["lexicality"] == 0, "label_pull"].abs()
            row[key] = float(words.mean() - nonlex.mean()) if len(words) and len(nonlex) else float("nan")
        rows[run] = row
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "run"
    return out


def collapse_table(c: Context, long: pd.DataFrame) -> pd.DataFrame:
    """Fig. 5b per run: the yes/no verb flip's lexical pull (mean over dilemmas, CI) and the A/B logic pull (CI)."""
    from analysis.battery.yesno import story_mean_ci

    rows = {}
    ab = long[long["label pair"] == "A/B"].set_index("run")
    for name, d in c.runs.items():
        row = {
            k: float("nan") for k in ("lexical", "lexical_lo", "lexical_hi", "logic_AB", "logic_AB_lo", "logic_AB_hi")
        }
        if d.dec is not None and d.dec["lexical"].notna().any():
            ci = story_mean_ci(d.dec[["lexical"]], n_boot=c.n_boot, seed=c.seed).loc["lexical"]
            row.update(lexical=ci["mean"], lexical_lo=ci["lo"], lexical_hi=ci["hi"])
        if name in ab.index:
            r = ab.loc[name]
            row.update(logic_AB=r["logic"], logic_AB_lo=r["logic_lo"], logic_AB_hi=r["logic_hi"])
        rows[name] = row
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "run"
    return out


def _half(t: pd.DataFrame, col: str) -> np.ndarray:
    return ((t[f"{col}_hi"] - t[f"{col}_lo"]) / 2).to_numpy(float)


def fig5a(long: pd.DataFrame) -> Any:
    """Fig. 5a from ``label_pairs_by_model.csv``: one panel per projection (order, label, logic), runs x label
    pairs, each cell its value and 95% CI half-width."""
    plt = pyplot()
    pairs = list(dict.fromkeys(long.sort_values("lexicality", kind="stable")["label pair"]))
    runs = list(dict.fromkeys(long["run"]))
    idx = long.set_index(["run", "label pair"])
    fig, axes = plt.subplots(
        len(PROJECTIONS), 1, figsize=(max(7, 0.75 * len(pairs) + 2.5), 3 * (0.35 * len(runs) + 1.3))
    )
    for ax, q in zip(axes, PROJECTIONS, strict=True):
        val = np.full((len(runs), len(pairs)), np.nan)
        half = np.full_like(val, np.nan)
        for i, r in enumerate(runs):
            for j, p in enumerate(pairs):
                if (r, p) in idx.index:
                    row = idx.loc[(r, p)]
                    val[i, j], half[i, j] = row[q], (row[f"{q}_hi"] - row[f"{q}_lo"]) / 2
        im = ax.imshow(np.ma.masked_invalid(val), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
        for i, j in zip(*np.nonzero(np.isfinite(val)), strict=True):
            ax.text(j, i, f"{val[i, j]:+.2f}\n±{half[i, j]:.2f}", ha="center", va="center", fontsize=6)
        ax.set_xticks(range(len(pairs)), pairs, rotation=45, ha="right", fontsize=7)
        ax.set_yticks(range(len(runs)), runs, fontsize=7)
        ax.set_title(f"{q} projection, b = 2P - 1", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.02)
    fig.suptitle("Verb x label x order projections per label pair (Fig. 5a)", fontsize=10)
    fig.tight_layout()
    return fig


def fig5b(table: pd.DataFrame) -> Any:
    """Fig. 5b from ``fig5b_collapse.csv``: the lexical pull with the yes/no words beside the A/B logic pull."""
    plt = pyplot()
    x = np.arange(len(table))
    fig, ax = plt.subplots(figsize=(max(4.5, 0.8 * len(table) + 2), 3.6))
    for k, (col, name) in enumerate((("lexical", "lexical pull (yes/no words)"), ("logic_AB", "logic pull (A/B)"))):
        ax.bar(x + (k - 0.5) * 0.38, table[col], 0.38, yerr=_half(table, col), capsize=2, label=name)
    ax.set_xticks(x, [str(i) for i in table.index], rotation=30, ha="right", fontsize=8)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel("story-averaged b")
    ax.set_title("The collapse: word-attached vs verdict-attached pull (Fig. 5b)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def fig6(long: pd.DataFrame) -> Any:
    """Fig. 6 from ``label_pairs_by_model.csv``: per run, each pair's order bias and label pull with 95% CIs."""
    plt = pyplot()
    runs = list(dict.fromkeys(long["run"]))
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.6 * len(runs) + 0.6), squeeze=False, sharey=True)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        t = long[long["run"] == run].sort_values("lexicality", kind="stable")
        x = np.arange(len(t))
        ax.bar(x - 0.2, t["order"], 0.4, yerr=_half(t, "order"), capsize=2, color="#dd8452", label="order bias")
        ax.bar(x + 0.2, t["label_pull"], 0.4, yerr=_half(t, "label_pull"), capsize=2, color="#4c72b0",
               label="label pull")  # fmt: skip
        ax.set_xticks(x, [str(p) for p in t["label pair"]], rotation=45, ha="right", fontsize=7)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_title(f"{run}: label pairs non-lexical -> lexical (Fig. 6)", fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def _ci_wide(long: pd.DataFrame, col: str, runs: Sequence[str]) -> pd.DataFrame:
    """Pairs x runs: ``value [lo, hi]`` of ``col`` (the Markdown view of one projection)."""
    cell = [
        "–" if np.isnan(v) else f"{v:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        for v, lo, hi in zip(long[col], long[f"{col}_lo"], long[f"{col}_hi"], strict=True)
    ]
    wide = long.assign(cell=cell).pivot(index="label pair", columns="run", values="cell")
    order = list(dict.fromkeys(long.sort_values("lexicality", kind="stable")["label pair"]))
    return wide.reindex(index=order, columns=[r for r in runs if r in wide.columns]).fillna("–")


@titled("Label pairs across models: projections and the lexicality gradient (Figs. 5-6)")
def label_pairs_section(c: Context) -> Body:
    long = label_pairs_table(c.runs, c.shared, n_boot=c.n_boot, seed=c.seed)
    lex, collapse = lexicality_table(long), collapse_table(c, long)
    runs = list(c.runs)
    lines = [
        f"Every label pair beyond Yes/No of every run, on the {len(c.shared)} shared dilemmas, as the battery "
        "report's label map (complete stories only): order = mean(2 P(first printed) - 1); logic = mean(2 P(the "
        "label carrying the affirmative verdict) - 1); label = mean(2 P(the pair's nominal yes label) - 1) over "
        "both mappings; label_pull = the label projection (Fig. 6), the logic one where the mapping is not "
        f"crossed; {c.n_boot} percentile bootstrap resamples over dilemmas (seed {c.seed}). m_order, m_logic, "
        "m_label: the per-pair joint fit with I-1's theta (theta units; clip_limited: read only the ranking). "
        "`label_pairs_by_model.csv` holds every value; the figures are drawn from it.",
    ]
    for col, what in (("order", "order bias"), ("label_pull", "label pull"), ("logic", "logic (verdict-attached)")):
        lines += ["", f"{what}:", "", md_table(_ci_wide(long, col, runs), index=True, iterrows=True, escape=True)]
    if "m_label" in long.columns:
        m = long.pivot(index="label pair", columns="run", values="m_label")
        lines += [
            "",
            "m_label (theta units):",
            "",
            md_table(m, "{:+.3f}", nan="–", index=True, iterrows=True, escape=True),
        ]
    lines += [
        "",
        "Lexicality gradient: mean |label pull| per level (0 non-lexical, 1 mark, 2 word; crossed pairs) and the "
        "contrast words minus non-lexical (contrast_all: with the uncrossed pairs, as Fig. 6 groups story among the "
        "words):",
        "",
        md_table(lex.reset_index(), "{:+.3f}", nan="–"),
        "",
        "The collapse (Fig. 5b): the yes/no verb flip's lexical pull beside the A/B logic pull, 95% CIs:",
        "",
        md_table(collapse.reset_index(), "{:+.3f}", nan="–"),
    ]
    tables = {
        "label_pairs_by_model": _table(long),
        "lexicality_by_model": _table(lex, index=True),
        "fig5b_collapse": _table(collapse, index=True),
    }
    figures = (
        Drawing("fig5_projections_models.png", functools.partial(fig5a, long)),
        Drawing("fig5b_collapse.png", functools.partial(fig5b, collapse)),
        Drawing("fig6_lexicality_models.png", functools.partial(fig6, long)),
    )
    return lines, Files(tables, figures)


SECTIONS = (incoherence_section, decomposition_section, label_pairs_section)
"""The sections this module adds to the battery comparison (after the others)."""
