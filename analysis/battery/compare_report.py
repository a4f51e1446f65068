"""``probe compare`` for the crossed-frame battery (paper 003) and the plain yes/no battery: the report.

One report across the runs of a panel (``docs/panels.md``): the runs are
matched on the items they all hold, every per-run quantity is recomputed on
those shared items (so G, the decomposition and (s, m) describe the same item
set in every column), and then:

* **models side by side**: theta with its incoherence sigma_repro, G (with a
  bootstrap CI over items), the yes/no decomposition (order / lexical /
  apparent) with the logical (label-map) pull, (s, m) per channel and the
  joint (s, m) fit per label family;
* **agreement of the item ordering**: the pairwise r^2 matrix of theta, a
  consensus ordering (mean over runs of theta standardized within each run),
  the outlier items (largest spread of standardized theta across runs) and the
  outlier models (lowest mean r with the others);
* **deliberation**: for each (reasoning off, reasoning on) pair of one model,
  paired item-bootstrap differences (off - on, the paper's sign) of mean sigma_repro, G, |m| and
  s per channel and of the joint fit (every resample redraws the same items
  for both runs and refits both);
* **human anchors** from a user CSV (:func:`analysis.battery.compare_humans.load_humans`), beside the models,
  with the model-human agreement and the human framing shift;
* **logit vs sampled**: a readout run and a sampled-only run of one model,
  matched per trial: the readout temperature (:mod:`analysis.battery.calibration`)
  and the agreement of the cell-level quantities.

Every number is computed by :mod:`analysis.battery.compare`, once, into its
:class:`~analysis.battery.compare.Context` (:func:`panel_context`,
:func:`yesno_context`); this module's sections only format it into Markdown
lines, :class:`~analysis.common.report.Table` s and
:class:`~analysis.common.report.Drawing` s (its figure functions return the
figures), and :func:`analysis.common.report.write_report_files` writes them. A
section that cannot be computed says why; the others still run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from analysis.battery.compare import N_OUTLIERS, Context, panel_context, yesno_context
from analysis.battery.compare_humans import HUMAN_VS
from analysis.battery.fit import LEVEL, N_BOOT, SEED
from analysis.battery.panel_figures import SECTIONS as PAPER_SECTIONS
from analysis.common.figures import pyplot
from analysis.common.report import (
    Body,
    Drawing,
    Files,
    Section,
    Table,
    dropped_md,
    dropped_table,
    panel_md,
    run_sections,
    titled,
)
from analysis.common.tables import md_table
from probe.panel import Panel


def _table(df: pd.DataFrame, index: bool = True) -> Table:
    """A CSV of the comparison: six decimals, as every table of it."""
    return Table(df, index=index, float_format="%.6f")


@titled("Panel and item matching")
def matching_section(c: Context) -> Body:
    lines = [
        *panel_md(c.panel),
        "",
        *dropped_md(c.dropped[c.dropped["run"] != "humans"], len(c.shared), "dilemmas"),
    ]
    return lines, dropped_table(c.dropped)


@titled("Models side by side: stance, incoherence, G, decomposition")
def models_section(c: Context) -> Body:
    """Per run on the shared items (:func:`analysis.battery.compare.models_table`), with the per-item tables."""
    table = c.models
    assert table is not None  # a battery panel's context has it
    long = [d.inc.assign(run=name).reset_index() for name, d in c.runs.items() if d.inc is not None]
    tables = {"models": _table(table)}
    figures: list[Drawing] = []
    lines = [
        f"Every quantity on the {len(c.shared)} shared dilemmas. theta: mean signed stance over the unipolar graded "
        "forms; sigma_repro: the per-model incoherence, the paper's headline (per-item variances pooled over "
        "dilemmas, then sqrt), split into sigma_dir and sigma_scale in quadrature, with sigma_repeat (the SD of one "
        "elicitation of a form: one draw in one context) and sigma_tot = sqrt(sigma_repro^2 + sigma_repeat^2); mean_sigma_repro: the mean of "
        "per-item sigma_repro (lower by Jensen's inequality; descriptive); G = Var_items(theta) / (Var_items(theta) "
        f"+ mean sigma_repro^2) with a {LEVEL:.0%} percentile bootstrap over items ({c.n_boot} resamples, seed "
        f"{c.seed}); z, order, lexical, apparent: the yes/no verb-flip decomposition, mean over items; logic_AB: "
        "the logical (verdict-attached) pull with the fully arbitrary A/B labels, on which the paper rests "
        "identification (every pair: the battery report's label map).",
        "",
        md_table(table.reset_index(), "{:+.3f}", nan="–"),
    ]
    missing = [f"- {n}: {k}: {why}" for n, d in c.runs.items() for k, why in d.why.items() if k != "fit"]
    if missing:
        lines += ["", "Not available:", *missing]
    if long:
        stance_long = pd.concat(long, ignore_index=True)
        cols = ["run", "item_id", "theta", "sigma_repro", "sigma_dir", "sigma_scale", "n_forms"]
        tables["stance_by_item"] = _table(stance_long[cols], index=False)
        wide = c.theta_table()
        if c.human_values is not None:
            for m in c.human_values.columns:
                wide[f"humans ({m})"] = c.human_values[m].reindex(wide.index)
        tables["theta_by_model"] = _table(wide.rename_axis("item_id"))
        figures.append(Drawing("fig_stance_models.png", functools.partial(_stance_figure, c)))
    decs = [d.dec.assign(run=n).reset_index() for n, d in c.runs.items() if d.dec is not None]
    if decs:
        tables["decomposition_by_item"] = _table(pd.concat(decs, ignore_index=True), index=False)
        figures.append(Drawing("fig_decomposition_models.png", functools.partial(_decomposition_figure, c)))
    return lines, Files(tables, tuple(figures))


@titled("Framing susceptibility m and decisiveness s")
def fits_section(c: Context) -> Body:
    rows = []
    for name, d in c.runs.items():
        if d.fits is None:
            continue
        for ch, f in d.fits.iterrows():
            rows.append({"run": name, "channel": ch, **{k: f[k] for k in ("s", "s_lo", "s_hi", "m", "m_lo", "m_hi")}})
            rows[-1].update(r2=f["r2"], n_items=int(f["n_items"]), clip_limited="yes" if f["clip_limited"] else "no")
    if not rows:
        why = "; ".join(f"{n}: {d.why.get('fit', '?')}" for n, d in c.runs.items())
        per_channel = [f"- {n}: {u.channel}: {u.why}" for n, d in c.runs.items() for u in d.unfitted]
        return [f"No run could be fitted ({why}).", *per_channel], Files()
    table = pd.DataFrame(rows)
    files = Files(
        {"fit_sm": _table(table, index=False)},
        (Drawing("fig_sm_models.png", functools.partial(_fit_figure, table)),),
    )
    lines = [
        "Per run and channel, the joint fit of p+ = sigmoid((theta + m)/s), p- = sigmoid((theta - m)/s) on the shared "
        f"items (theta from I-1 of the same run); {LEVEL:.0%} percentile bootstrap over items ({c.n_boot} resamples, "
        f"seed {c.seed}). clip_limited: read only the ranking of m.",
        "",
        md_table(table, "{:+.3f}", nan="–"),
    ]
    skipped = [f"- {n}: {d.why['fit']}" for n, d in c.runs.items() if d.fits is None and "fit" in d.why]
    skipped += [f"- {n}: {u.channel}: {u.why}" for n, d in c.runs.items() for u in d.unfitted]
    if skipped:
        lines += ["", "Not fitted:", *skipped]
    joints = [d.joint.assign(run=n) for n, d in c.runs.items() if d.joint is not None]
    if joints:
        joint = pd.concat(joints, ignore_index=True)
        cols = ["run", "family", "channel", "s", "s_lo", "s_hi", "m", "m_lo", "m_hi", "r2", "n_items", "n_cells"]
        joint = joint.reindex(columns=[*cols, "clip_limited", "note"])
        files += Files({"fit_joint": _table(joint, index=False)})
        show = joint.copy()
        show["clip_limited"] = show["clip_limited"].map({True: "yes", False: "no"}).fillna("")
        show["note"] = show["note"].fillna("")
        for col in ("n_items", "n_cells"):
            show[col] = show[col].map(lambda v: "" if pd.isna(v) else str(int(v)))
        if not (show["note"] != "").any():
            show = show.drop(columns=["note"])
        lines += [
            "",
            "Joint fit per run and label family: P(CBR) of every design cell = sigmoid((theta + sum_c m_c sgn_c) / s), "
            "one s for all channels of the family, each m adjusted for the others (same loss, bootstrap and seed). The "
            "per-channel s above averages each side over the other channels' offsets and so reads high when another "
            "channel has one; the joint s does not.",
            "",
            md_table(show, "{:+.3f}", nan="–"),
        ]
    return lines, files


@titled("Dropped stories")
def dropped_stories_section(c: Context) -> Body:
    """Per run: the shared stories a table left out for an empty design cell (label map, (s, m) fit), and why."""
    rows = [
        {"run": n, "dilemma": x.item_id, "table": x.analysis, "reason": x.reason}
        for n, d in c.runs.items()
        for x in d.dropped
    ]
    if not rows:
        return [], Files()
    table = pd.DataFrame(rows).drop_duplicates().sort_values(["run", "dilemma", "table"], kind="stable")
    lines = [
        "Stories left out of a table because a design cell had no usable answer (every draw refused or "
        "unparsable): averaging the surviving cells would leak the story's stance into the bias. The runs are "
        "still matched on the shared dilemmas; these stories are missing from the named table only.",
        "",
        *(f"- {r.run}: {r.dilemma}, {r.table}: {r.reason}" for r in table.itertuples()),
    ]
    return lines, Files({"dropped_stories": _table(table, index=False)})


@titled("Agreement of the item ordering across runs")
def agreement_section(c: Context) -> Body:
    ag = c.agreement.get()
    theta, reference, rule, r, r2, cons, per_run = (
        ag.theta,
        ag.reference,
        ag.rule,
        ag.r,
        ag.r2,
        ag.consensus,
        ag.per_run,
    )
    files = Files(
        {
            "agreement_r2": _table(r2),
            "agreement_r": _table(r.rename_axis("run")),
            "consensus": _table(cons),
            "agreement_models": _table(per_run),
            "agreement_r2_by_run": _table(ag.r2_by_run),
            "agreement_r2_summary": _table(ag.r2_groups),
        },
        (Drawing("fig_agreement_r2.png", functools.partial(_heatmap, r2)),),
    )
    top = cons.sort_values("disagreement", ascending=False).head(N_OUTLIERS)
    worst = per_run.sort_values("mean_r_with_others")
    lines = [
        f"Pearson r^2 of theta between runs over the {len(theta)} shared dilemmas with theta in every run "
        "(`agreement_r.csv` keeps the sign):",
        "",
        md_table(r2.reset_index(), "{:.3f}", nan="–"),
        "",
        f"Consensus ordering: the raw mean theta over the reference runs ({', '.join(reference)}: {rule}), as "
        "the paper's frontier-mean consensus; rank 1 = most cost-benefit. Disagreement: the SD across all runs of "
        "theta standardized within each run (`consensus.csv` has every item).",
        "",
        "Outlier items (largest disagreement):",
        "",
        md_table(top[["rank", "consensus", "disagreement"]].reset_index(), "{:+.3f}", nan="–"),
        "",
        "Outlier models (lowest mean r with the other runs first); consensus_r2: the consensus-alignment r^2 "
        "(leave-one-out for a reference run):",
        "",
        md_table(worst.reset_index(), "{:+.3f}", nan="–"),
        "",
        "Mean r^2 summaries (the paper's Table S2; descriptive, no CI): mean pairwise r^2 of per-item theta within "
        "the reference set and with the human anchor (human 2P - 1 where given, else the rating), and the same for "
        "the runs outside the set; per run in `agreement_r2_by_run.csv`:",
        "",
        md_table(ag.r2_groups.reset_index(), "{:.3f}", nan="–"),
    ]
    return lines, files


@titled("Deliberation: reasoning off - on")
def deliberation_section(c: Context) -> Body:
    p = c.deliberation
    if p.absent:
        return [p.absent], Files()
    dl = p.get()
    notes = [f"- {off.model}: {off.name} vs {on.name}: not computed: {why}" for off, on, why in dl.skipped]
    if dl.table is None:
        return notes, Files()
    table = dl.table
    files = Files(
        {"deliberation": _table(table, index=False)},
        (Drawing("fig_deliberation.png", functools.partial(_deliberation_figure, table)),),
    )
    show = table.drop(columns=["off_run", "on_run", "n_boot_ok"]).copy()
    show["excludes_0"] = show["excludes_0"].map({True: "yes", False: "no"})
    lines = [
        "Per model, reasoning off minus on (the paper's sign; positive = smaller with reasoning on) on the "
        "items both runs hold: mean sigma_repro (incoherence), G, "
        "per channel abs_m = |m|, m and s, and the joint fit per label family (s: channel joint:<family>; abs_m "
        f"and m: joint:<family>:<channel>). CIs: {LEVEL:.0%} percentile bootstrap over items ({c.n_boot} "
        f"resamples, seed {c.seed}); each resample draws the same items for both runs and refits (s, m) in both, "
        "so the difference is paired. The per-channel s absorbs the other channels' offsets (each side averages "
        "over them), so a change of s that shows per channel but not in the joint s is that artefact (e.g. a "
        "smaller m_order making the lexical s look smaller), not a change of decisiveness.",
        "",
        md_table(show, "{:+.3f}", nan="–"),
        *(["", *notes] if notes else []),
    ]
    return lines, files


@titled("Human anchors")
def humans_section(c: Context) -> Body:
    p = c.anchors
    if p.absent:
        return [p.absent], Files()
    ha = p.get()
    h, table = ha.humans, ha.table
    files = Files(
        {"humans_agreement": _table(table, index=False), "humans_by_item": _table(ha.by_item)},
        (Drawing("fig_humans.png", functools.partial(_humans_figure, ha.by_item, ha.per_item, list(c.runs))),),
    )
    lines = [
        f"Human table `{c.panel.humans}`: {h['item_id'].nunique()} of the shared dilemmas; human values on the "
        "stance axis [-1, 1] (p_cbr as 2 p - 1; rating as 2 (rating - lo) / (hi - lo) - 1), averaged over frames. "
        "Both are compared with the model's graded theta, as the paper anchors its stance axis (Fig. 1a: human "
        "2P - 1 beside theta; r^2 of per-item theta); choice rates also with the forced-binary story stance z "
        "(row model = z). "
        f"r: Pearson with a {LEVEL:.0%} percentile bootstrap over items; mean |diff| with the same bootstrap.",
        "",
        md_table(table, "{:+.3f}", nan="–"),
    ]
    if ha.noise is not None:
        se, n_rows = ha.noise
        lines += ["", f"Human sampling noise: mean binomial SE of 2 p_cbr - 1 = {se:.3f} ({n_rows} rows with n)."]
    if ha.left_out:
        lines += [
            "",
            f"{len(ha.left_out)} human items are not shared by every run and were dropped: {', '.join(ha.left_out)}.",
        ]
    if ha.shift is not None:
        files += Files({"humans_framing": _table(ha.shift, index=False)})
        lines += [
            "",
            "Framing shift of the human sample: per measure, the mean over items of (value in the frame - value in "
            "the reference frame, the first in the file), with a bootstrap CI over items:",
            "",
            md_table(ha.shift, "{:+.3f}", nan="–"),
        ]
    return lines, files


@titled("Logit readout vs sampled behaviour (across runs)")
def logit_sampled_section(c: Context) -> Body:
    p = c.logit_sampled
    if p.absent:
        return [p.absent], Files()
    ls = p.get()
    notes = [f"- {r} vs {s}: not computed: {why}" for r, s, why in ls.skipped]
    lines: list[str] = []
    files = Files()
    if ls.heads is not None and ls.cells is not None:
        files = Files(
            {
                "logit_vs_sampled": _table(ls.heads, index=False),
                "logit_vs_sampled_cells": _table(ls.cells, index=False),
            }
        )
        lines = [
            "Trials matched by id (same spec: same trials). T = fitted readout temperature relative to the sampling "
            f"temperature tau ({LEVEL:.0%} profile-likelihood interval; T = 1: sampling at tau draws from "
            "softmax(logits / tau)); r_trial and mad_trial compare the readout P(CBR) with the sampled frequency per "
            "trial (mad_trial_tempered after re-tempering the readout at the fitted T).",
            "",
            md_table(ls.heads, "{:.3f}", nan="–"),
            "",
            "Cell-level quantities per item, readout vs sampled (z, lexical, order of the yes/no verb flip; theta "
            "pooled over replicates):",
            "",
            md_table(ls.cells, "{:+.3f}", nan="–"),
        ]
    return lines + (["", *notes] if notes else []), files


@titled("Planted vs recovered (synthetic subjects)")
def planted_section(c: Context) -> Body:
    """For sim runs: r^2 of the planted thetas beside the recovered r^2 matrix."""
    r2 = c.planted
    if r2 is None:
        return [], Files()
    lines = [
        "r^2 of the planted thetas (compare with the recovered matrix above):",
        "",
        md_table(r2.reset_index(), "{:.3f}", nan="–"),
    ]
    return lines, Files({"planted_r2": _table(r2)})


# ------------------------------------------------------------------ figures
def _grid(n: int, width: float = 3.6, height: float = 3.2) -> tuple[Any, list[Any]]:
    plt = pyplot()
    cols = min(n, 4)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _finish(fig: Any, title: str) -> Any:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _item_order(c: Context) -> list[str]:
    """The dilemmas by their mean theta over the runs (the order of the per-model figures)."""
    theta = c.theta_table()
    return [str(i) for i in theta.mean(axis=1).sort_values().index]


def _stance_figure(c: Context) -> Any:
    runs = [(n, d) for n, d in c.runs.items() if d.inc is not None]
    order = _item_order(c)
    fig, axes = _grid(len(runs), 3.4, 0.2 * len(order) + 1.4)
    for ax, (name, d) in zip(axes, runs, strict=True):
        assert d.inc is not None
        inc = d.inc.reindex(order)
        ax.barh(range(len(order)), inc["theta"], xerr=inc["sigma_repro"], color="#4c72b0", ecolor="#333", capsize=1.5)
        ax.set_yticks(range(len(order)), order if ax is axes[0] else [""] * len(order), fontsize=6)
        ax.axvline(0, color="black", lw=0.7)
        ax.set_xlim(-1.05, 1.05)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("theta (bars: sigma_repro)", fontsize=8)
    return _finish(fig, "Stance theta per dilemma, items in consensus order")


def _decomposition_figure(c: Context) -> Any:
    runs = [(n, d) for n, d in c.runs.items() if d.dec is not None]
    order = [i for i in _item_order(c) if all(d.dec is not None and i in d.dec.index for _, d in runs)]
    order = order or [str(i) for i in runs[0][1].dec.index]  # type: ignore[union-attr]
    fig, axes = _grid(len(runs), 4.2, 3.2)
    x = np.arange(len(order))
    for ax, (name, d) in zip(axes, runs, strict=True):
        assert d.dec is not None
        dec = d.dec.reindex(order)
        for k, col in enumerate(("order", "lexical", "apparent")):
            ax.bar(x + (k - 1) * 0.27, dec[col].to_numpy(float), 0.27, label=col)
        ax.axhline(0, color="black", lw=0.7)
        ax.set_xticks(x, order, rotation=70, ha="right", fontsize=5)
        ax.set_ylim(-1.05, 1.05)
        ax.set_title(name, fontsize=9)
    axes[0].legend(fontsize=6)
    return _finish(fig, "Yes/no bias decomposition per dilemma (apparent = order + lexical)")


def _fit_figure(table: pd.DataFrame) -> Any:
    channels = list(dict.fromkeys(table["channel"]))
    fig, axes = _grid(len(channels), 4.0, 0.35 * table["run"].nunique() + 1.6)
    runs = list(dict.fromkeys(table["run"]))
    for ax, ch in zip(axes, channels, strict=True):
        t = table[table["channel"] == ch].set_index("run").reindex(runs)
        y = np.arange(len(runs))
        err = np.vstack([t["m"] - t["m_lo"], t["m_hi"] - t["m"]]).clip(min=0)
        ax.errorbar(t["m"], y, xerr=err, fmt="o", color="#c44e52", label="m")
        ax.set_yticks(y, runs, fontsize=7)
        ax.invert_yaxis()
        ax.axvline(0, color="black", lw=0.7)
        ax.set_xlabel("m (95% CI)", fontsize=8)
        ax.set_title(f"{ch}: m (s in labels)", fontsize=9)
        for k, (_, row) in enumerate(t.iterrows()):
            ax.annotate(f"s={row['s']:.2f}", (row["m"], k), textcoords="offset points", xytext=(4, 4), fontsize=6)
    return _finish(fig, "Framing susceptibility m per channel and run (s printed beside)")


def _heatmap(r2: pd.DataFrame) -> Any:
    plt = pyplot()
    n = len(r2)
    fig, ax = plt.subplots(figsize=(1.0 * n + 2.5, 0.8 * n + 2))
    im = ax.imshow(r2.to_numpy(float), vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(n), list(r2.columns), rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(n), list(r2.index), fontsize=7)
    for i in range(n):
        for j in range(n):
            v = float(r2.iloc[i, j])
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.6 else "black")
    fig.colorbar(im, ax=ax, label="r^2 of theta")
    ax.set_title("Agreement of the item ordering (r^2 of theta)", fontsize=10)
    fig.tight_layout()
    return fig


def _deliberation_figure(table: pd.DataFrame) -> Any:
    models = list(dict.fromkeys(table["model"]))
    labels = [f"{q} {ch}".strip() for q, ch in zip(table["quantity"], table["channel"], strict=True)]
    table = table.assign(label=labels)
    fig, axes = _grid(len(models), 4.4, 0.3 * table.groupby("model").size().max() + 1.5)
    for ax, m in zip(axes, models, strict=True):
        t = table[table["model"] == m]
        y = np.arange(len(t))
        err = np.vstack([t["off_minus_on"] - t["lo"], t["hi"] - t["off_minus_on"]]).clip(min=0)
        ax.errorbar(t["off_minus_on"], y, xerr=err, fmt="o", color="#4c72b0")
        ax.set_yticks(y, list(t["label"]), fontsize=7)
        ax.invert_yaxis()
        ax.axvline(0, color="black", lw=0.7)
        ax.set_title(str(m), fontsize=9)
        ax.set_xlabel("off - on (95% CI)", fontsize=8)
    return _finish(fig, "Deliberation effects: reasoning off minus on")


def _humans_figure(by_item: pd.DataFrame, per_item: pd.DataFrame, runs: list[str]) -> Any:
    panels = []
    for name in runs:
        for measure in per_item.columns:
            col = f"{name} ({HUMAN_VS[measure]})"
            if col in by_item.columns:
                panels.append((name, measure, col))
    fig, axes = _grid(max(len(panels), 1), 3.2, 3.1)
    for ax, (name, measure, col) in zip(axes, panels, strict=False):
        ax.scatter(by_item[f"humans_{measure}"], by_item[col], s=12)
        ax.plot([-1, 1], [-1, 1], color="grey", lw=0.8, ls="--")
        ax.set(xlim=(-1.05, 1.05), ylim=(-1.05, 1.05))
        ax.set_xlabel(f"humans ({measure}, stance axis)", fontsize=8)
        ax.set_ylabel(f"{name}: {HUMAN_VS[measure]}", fontsize=8)
        ax.set_title(name, fontsize=9)
    return _finish(fig, "Models against the human anchors")


@titled("Where the readout forms, side by side")
def layers_section(c: Context) -> Body:
    """The layer profiles of the runs made with ``--layers``, on the shared items; no section when none was."""
    if not c.layers:
        return [], Files()
    from analysis.battery.layers import QUANTITIES, WITHIN, profiles_side_by_side

    wide = profiles_side_by_side(c.layers)
    flat = wide.copy()
    flat.columns = [f"{run}: {q}" for run, q in wide.columns]
    formed = pd.DataFrame({name: p.formed for name, p in c.layers.items()}).T.rename_axis("run")
    formed = formed[[q for q in QUANTITIES if q in formed]]
    lines = [
        "Each quantity at each layer the run read (`--layers`; the logit lens at the answer slot, docs/methods.md), "
        "story-averaged on the shared dilemmas, runs side by side (`layer_profiles.csv`; each run's intervals are "
        "in its own report). Layers are the runs' own: a deeper model has more.",
        "",
        md_table(flat.reset_index(), "{:+.3f}", nan="–"),
        "",
        f"The first layer from which each stays within {WITHIN:.0%} of its final value:",
        "",
        md_table(formed.reset_index(), "{}", nan="–"),
    ]
    figure = Drawing("fig_layer_profiles.png", functools.partial(_layers_figure, c))
    return lines, Files({"layer_profiles": _table(flat), "layer_formed": _table(formed)}, (figure,))


def _layers_figure(c: Context) -> Any:
    """One panel per quantity: layer on x, one line per run."""
    from analysis.battery.layers import QUANTITIES

    quantities = [q for q in QUANTITIES if any(q in set(p.table["quantity"]) for p in c.layers.values())]
    fig, axes = pyplot().subplots(1, len(quantities), figsize=(3.2 * len(quantities), 3.2), squeeze=False)
    for ax, q in zip(axes[0], quantities, strict=True):
        for name, p in c.layers.items():
            d = p.table[p.table["quantity"] == q].sort_values("layer")
            ax.plot(d["layer"], d["mean"], marker="o", ms=2, label=name)
        ax.axhline(0, color="black", lw=0.6)
        ax.set_title(q, fontsize=9)
        ax.set_xlabel("layer", fontsize=8)
    axes[0][0].legend(fontsize=7)
    return _finish(fig, "Where the readout forms")


# ------------------------------------------------------------------ entry points
SECTIONS: list[Callable[[Context], Section]] = [
    matching_section,
    models_section,
    fits_section,
    dropped_stories_section,
    agreement_section,
    deliberation_section,
    humans_section,
    logit_sampled_section,
    planted_section,
    layers_section,
    *PAPER_SECTIONS,  # Figs. 1b, 5, 6 across models (analysis/battery/panel_figures.py)
]


def compare_battery(panel: Panel, *, n_boot: int = N_BOOT, seed: int = SEED) -> Body:
    """The battery comparison of ``panel``: its summary lines, CSV tables and figures."""
    c = panel_context(panel, n_boot=n_boot, seed=seed)
    head = [
        f"# Crossed-frame battery: comparison of {len(panel.runs)} runs",
        "",
        f"- panel: {panel.source}; {len(c.shared)} shared dilemmas",
        "- spreads (sigma_repro, disagreement) are descriptive; CIs are percentile bootstraps over items",
        "",
    ]
    body, files = run_sections(SECTIONS, c)
    return head + body, files


# ------------------------------------------------------------------ yes/no
@titled("Cells and decomposition side by side")
def yesno_cells_section(c: Context) -> Body:
    cells = c.yesno.get()
    table, long = cells.table, cells.long
    tables = {"models": _table(table), "yesno_cells": _table(long, index=False)}
    for col in ("z", "lexical", "order"):
        wide = long.pivot(index="item_id", columns="run", values=col).reindex(columns=list(c.runs))
        tables[f"yesno_{col}_by_model"] = _table(wide)
    lines = [
        "Per run, on the shared dilemmas: P(CBR) per (verb x printed order) cell, averaged over forms "
        "(`yesno_cells.csv`), and the decomposition; the table shows the means over items "
        "(z = mean 2P - 1; lexical: pull toward yes; order: pull toward the first-printed option).",
        "",
        md_table(table.reset_index(), "{:+.3f}", nan="–"),
    ]
    figure = Drawing("fig_decomposition_models.png", functools.partial(_decomposition_figure, c))
    return lines, Files(tables, (figure,))


@titled("Agreement of the item ordering (z)")
def yesno_agreement_section(c: Context) -> Body:
    ag = c.z_agreement.get()
    lines = [
        f"Pearson r^2 of the story stance z between runs ({len(ag.z)} dilemmas); consensus = the mean z over the runs:",
        "",
        md_table(ag.r2.reset_index(), "{:.3f}", nan="–"),
        "",
        md_table(ag.per_run.reset_index(), "{:+.3f}", nan="–"),
    ]
    return lines, Files({"agreement_r2": _table(ag.r2), "consensus": _table(ag.consensus)})


def compare_yesno(panel: Panel, *, n_boot: int = N_BOOT, seed: int = SEED) -> Body:
    """The yes/no comparison: cells and decomposition side by side, agreement of z, logit vs sampled."""
    c = yesno_context(panel, n_boot=n_boot, seed=seed)
    head = [f"# Yes/no battery: comparison of {len(panel.runs)} runs", "", f"- {len(c.shared)} shared dilemmas", ""]
    sections = [matching_section, yesno_cells_section, yesno_agreement_section, logit_sampled_section, layers_section]
    body, files = run_sections(sections, c)
    return head + body, files
