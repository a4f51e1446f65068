"""The sections of the battery report's per-instrument parts, and the decorator that makes a section of a part.

:func:`part_section` turns a formatter of one computed part into a titled section that prints the part's
absent line or error instead when there is no value. The sections here format the parts of
:mod:`analysis.battery.instrument_parts`: the yes/no verb flip (I-3), the label map, the free choice (I-2),
the graded stance (I-1) and the (s, m) fits. They compute nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import pandas as pd

from analysis.battery import figures
from analysis.battery.fit import N_BOOT, SEED
from analysis.battery.instrument_parts import Choice, Fits, Graded, LabelMap, VerbFlip
from analysis.battery.results import BatteryResults
from analysis.common.report import Body, Drawing, Files, Section, Table, titled
from analysis.common.results import Part
from analysis.common.tables import md_table

# ------------------------------------------------------------------- sections
R = TypeVar("R")
V = TypeVar("V")
SectionFn = Callable[[BatteryResults], Section]


def part_section(
    title: str, part: Callable[[Any], Part[V]]
) -> Callable[[Callable[[R, V], Body]], Callable[[R], Section]]:
    """A section (:func:`titled`) of one computed part; the part's absent line when its instrument is absent.

    The body receives the results and the part's value (a part that failed raises its NotComputed there, so the
    section says why it is not computed); the section keeps the body's name and docstring, which
    :func:`run_sections` uses.
    """

    def wrap(body: Callable[[R, V], Body]) -> Callable[[R], Section]:
        @titled(title)
        @functools.wraps(body)
        def section(res: R) -> Body:
            p = part(res)
            if p.absent:
                return [p.absent], Files()
            return body(res, p.get())

        return section

    return wrap


@part_section("Forced binary, yes/no verb flip (I-3)", lambda res: res.verbflip)
def verbflip_section(res: BatteryResults, vf: VerbFlip) -> Body:
    """The yes/no verb-flip family: per-story cells, z, lexical, order, apparent (Eq. 1)."""
    table, ci = vf.table, vf.ci
    files = Files(
        {"binary_verbflip": Table(table, index=True, float_format="%.6f")},
        (
            Drawing(
                "fig_bias_decomposition.png",
                functools.partial(
                    figures.grouped_bars,
                    vf.bars,
                    ["order", "lexical", "apparent"],
                    "Yes/no bias decomposition per dilemma (apparent = order + lexical)",
                    "bias on the [-1, 1] axis",
                ),
            ),
        ),
    )
    if vf.parity is not None:
        files += Files({"binary_form_parity": Table(vf.parity, index=True, float_format="%.6f")})
    short = table[["z", "lexical", "order", "apparent", "sigma_z", "sigma_lexical", "sigma_order"]]
    ci_line = "; ".join(f"{q} {r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]" for q, r in ci.iterrows())
    lines = [
        f"{len(vf.dec)} dilemmas x {vf.n_forms} forms x approve/oppose x yes-first/no-first. "
        "lexical = pull toward the word yes (negative: toward no); order = pull toward the first-printed option "
        "(negative: toward the last); apparent = what one 'yes or no' question shows. "
        f"Identity apparent = order + lexical holds to {vf.identity:.1e}. sigma_<q>: the sampling-corrected spread "
        "of the per-form value across the wording forms (Fig. 3's error bars, descriptive); the two form-parity "
        "subsets (even / odd forms in corpus order) are in `binary_form_parity.csv`.",
        "",
        md_table(short, "{:+.3f}", index=True, iterrows=True),
        "",
        f"Story-averaged, 95% percentile bootstrap over dilemmas ({N_BOOT} resamples, seed {SEED}): {ci_line}.",
    ]
    rs = vf.resampling
    if rs is not None:
        lines += [
            "",
            f"Resampling: {rs.unanimous:.0%} of {rs.n_cells} cells (item x form x verb x order) unanimous across "
            f"their draws; between-form variance {rs.between_within:.1f}x the within-form (one-draw) variance "
            f"({rs.between_within_orders:.1f}x with print order inside the form); {rs.opposite_majority:.0%} of "
            f"{rs.n_items} dilemmas have two equivalent forms with opposite majority verdicts.",
        ]
    return lines, files


@part_section("Label map (I-3)", lambda res: res.labelmap)
def labelmap_section(res: BatteryResults, lm: LabelMap) -> Body:
    """Order / logic / label projections per label pair, and the lexicality gradient of the label pull (Figs. 5-6)."""
    by_pair, contrast, contrast_all, n_left = lm.gradient, lm.contrast, lm.contrast_all, lm.n_left
    files = Files(
        {
            "binary_labelmap": Table(lm.pulls, index=True, float_format="%.6f"),
            "binary_label_gradient": Table(by_pair, index=True, float_format="%.6f"),
        },
        (
            Drawing(
                "fig_label_gradient.png",
                functools.partial(
                    figures.grouped_bars,
                    by_pair[["order", "label_pull"]].rename(columns={"label_pull": "label pull"}),
                    ["order", "label pull"],
                    "Label pairs ordered non-lexical -> lexical: order bias and label pull",
                    "story-averaged bias",
                ),
            ),
        ),
    )
    show = by_pair[["lexicality", "order", "label_pull", "logic", "label", "z"]].copy()
    for col in ("order", "label_pull"):
        show[f"{col} CI"] = [
            f"[{lo:+.3f}, {hi:+.3f}]" for lo, hi in zip(by_pair[f"{col}_lo"], by_pair[f"{col}_hi"], strict=True)
        ]
    show["logic CI"] = [
        f"[{lo:+.3f}, {hi:+.3f}]" for lo, hi in zip(by_pair["logic_lo"], by_pair["logic_hi"], strict=True)
    ]
    show["n"] = by_pair["n_items"].astype(int).astype(str)
    show = show[
        ["lexicality", "n", "order", "order CI", "label_pull", "label_pull CI", "logic", "logic CI", "label", "z"]
    ]
    if "m_label" in by_pair.columns:
        show["m_label"] = by_pair["m_label"]
    show["lexicality"] = show["lexicality"].astype(int).astype(str)
    not_crossed = [str(p) for p in by_pair.index[by_pair["pull_from"] != "label"]]
    lines = [
        f"Per label pair, averaged over dilemmas (95% percentile bootstrap over dilemmas, {N_BOOT} resamples, seed "
        f"{SEED}): "
        "order = mean(2 P(first printed) - 1); label_pull = mean(2 P(the pair's nominal yes label) - 1) over "
        "both label-to-verdict mappings (Fig. 6; the label projection of Fig. 5); logic = mean(2 P(yes-mapped "
        "label) - 1), the verdict-attached pull; m_label = the label pull in theta units from the per-pair joint "
        "fit (order, logic, label; theta from I-1); n = stories with every cell of the pair usable. Lexicality: 0 "
        "non-lexical, 1 mark, 2 word.",
        "",
        md_table(show, "{:+.3f}", index=True, iterrows=True),
        "",
        f"Lexicality contrast (mean |label pull| on word pairs minus non-lexical pairs): {contrast:+.3f} (descriptive)"
        + (
            f"; pairs whose mapping is not counterbalanced ({', '.join(not_crossed)}) are left out of it, their "
            f"pull being the logic projection, not a label pull; with them, as Fig. 6 groups story among the "
            f"words: {contrast_all:+.3f}."
            if not_crossed
            else "."
        ),
    ]
    if lm.incomplete:
        per_pair = ", ".join(f"{pair} {n}" for pair, n in n_left.items())
        lines += [
            "",
            f"Complete stories only: a story enters a pair's projections only if every cell (verb x printed order "
            f"x mapping) has a usable answer; averaging the surviving cells would leak its stance into order, "
            f"logic and label. Left out ({per_pair}; cells named under Dropped stories and in "
            "`dropped_stories.csv`).",
        ]
    clipped = lm.clipped
    if clipped:
        lines += [
            "",
            f"m_label not shown for {', '.join(clipped)}: the per-pair fit is clip-limited (saturated, or s or m at "
            "a bound), so its m is not a pull in theta units.",
        ]
    if not_crossed:
        lines += [
            "",
            f"Mapping not counterbalanced for {', '.join(not_crossed)}: the label projection is not identified "
            "there, and its label pull is the logic projection (the pull toward the label carrying yes).",
        ]
    return lines, files


@part_section("Free choice (I-2)", lambda res: res.choice)
def choice_section(res: BatteryResults, ch: Choice) -> Body:
    """Free choice: P(PRO), P(ANTI), P(NONCOMMIT) per dilemma and the choice stance P(PRO) - P(ANTI)."""
    d, order_ci = ch.replies, ch.order_ci
    judge = ", ".join(sorted(set(d["judge"])))
    lines = [
        f"Verdicts by judge `{judge}` over {len(d)} replies ({d['framing'].nunique()} framings x 2 print orders per "
        "dilemma); stance = P(PRO) - P(ANTI); sigma_repro = its spread across the forms corrected for sampling "
        "(as I-1's; sigma_raw uncorrected; descriptive); order = pull toward the first-printed course (negative: "
        "toward the last). Transcripts: the run's `generations` table.",
        "",
        md_table(ch.summary, "{:+.3f}", index=True, iterrows=True),
        "",
        f"I-2 order bias, story-averaged: {order_ci['mean']:+.3f} [{order_ci['lo']:+.3f}, {order_ci['hi']:+.3f}] "
        f"(95% percentile bootstrap over dilemmas, {N_BOOT} resamples, seed {SEED}).",
    ]
    return lines, Files({"choice_by_item": Table(ch.per_item, index=True, float_format="%.6f")})


@part_section("Graded stance (I-1)", lambda res: res.graded)
def graded_section(res: BatteryResults, gr: Graded) -> Body:
    """I-1: theta per dilemma, its cross-form incoherence and components, G, the bipolar contrast, the salt floor."""
    gen, pooled, bipolar = gr.gen, gr.pooled, gr.bipolar
    lines = [
        f"theta = mean signed stance over {gr.n_forms} unipolar forms per dilemma (mean-based; "
        "theta_mode from each form's most likely value). sigma_repro = sampling-corrected cross-form spread; "
        "sigma_dir (anchor direction) and sigma_scale (scale, wording, pole) add in quadrature.",
        "",
        md_table(gr.summary, "{:+.3f}", index=True, iterrows=True),
        "",
        f"Generalizability G = {gen.G:.3f} (Var_items(theta) = {gen.var_items:.4f}, mean sigma_repro^2 = "
        f"{gen.mean_sigma2:.4f}, {gen.n_items} items)."
        if hasattr(gen, "mean_sigma2")
        else f"Generalizability: {gen}",
    ]
    lines += [
        "",
        f"Per-model incoherence (the paper's headline: variances pooled over dilemmas, then sqrt): sigma_repro = "
        f"{pooled.sigma_repro:.3f} (direction {pooled.sigma_dir:.3f}, scale {pooled.sigma_scale:.3f}, in "
        f"quadrature); sigma_repeat = {pooled.sigma_repeat:.3f} (the SD of one elicitation of a form, one draw in "
        f"one context, pooled over draws and salts alike; the standard error of a form's value, which sigma_repro "
        f"subtracts, is {pooled.sigma_value:.3f}); sigma_tot = "
        f"{pooled.sigma_tot:.3f} (sigma_tot^2 = sigma_repro^2 + sigma_repeat^2). Mean of per-item sigma_repro "
        f"(the estimator of the uncertainty statements; lower by Jensen's inequality): "
        f"{pooled.mean_item_sigma_repro:.3f}.",
    ]
    lines += _left_out_forms_lines(gr)
    if bipolar is not None:
        lines += [
            "",
            f"Bipolar contrast theta_bipolar - theta over {bipolar.n_items} dilemmas (measured, never in theta): "
            f"mean |.| = {bipolar.mean_abs:.3f} (the paper's summary), signed mean = {bipolar.mean:+.3f}.",
        ]
    if not gr.salt.absent:
        salt = gr.salt.get()
        floor, inv = salt.floor, salt.invariance
        lines += [
            "",
            f"Salt floor: within-form SD under salts {floor.within_sd_mean:.4f} (median {floor.within_sd_median:.4f}) "
            f"vs between-form SD {floor.between_sd_mean:.4f} (ratio {floor.ratio:.3f}; {floor.n_forms} forms). "
            f"{inv.invariant:.0%} of {inv.n_forms} forms keep the same most likely rating under every salt; salted "
            f"theta vs unsalted: r = {inv.r_theta:.3f} ({inv.n_items} dilemmas).",
        ]
    files = Files(
        {
            "graded_theta": Table(gr.table, index=True, float_format="%.6f"),
            "graded_pooled": Table(pd.DataFrame([pooled.to_dict()])),
        },
        (
            Drawing(
                "fig_stance.png",
                functools.partial(
                    figures.stance_bars,
                    gr.table,
                    "theta",
                    "sigma_repro",
                    "Stance theta per dilemma (bars: cross-form incoherence, descriptive)",
                    "theta (+1 endorses the cost-benefit pole)",
                ),
            ),
        ),
    )
    return lines, files


def _left_out_forms_lines(gr: Graded) -> list[str]:
    """The forms valued from their salted replicates (no usable unsalted answer) and those left out (none)."""
    fallback, empty_forms = gr.fallback, gr.empty_forms
    if not (len(fallback) or len(empty_forms)):
        return []

    def name(r: Any) -> str:
        return f"{r.item_id} {r.scale}/{r.wording}/{r.anchor}/{r.pole}"

    lines = [""]
    if len(fallback):
        shown = ", ".join(name(r) for r in fallback.head(5).itertuples())
        lines.append(
            f"{len(fallback)} forms had no usable unsalted answer (every draw refused): their value is the mean of "
            f"their salted replicates (the unsalted policy's fallback), e.g. {shown}."
        )
    if len(empty_forms):
        shown = ", ".join(name(r) for r in empty_forms.head(5).itertuples())
        lines.append(
            f"{len(empty_forms)} forms had no usable answer in any replicate and are left out (theta weighs the "
            f"two poles 1/2 each over the forms that remain), e.g. {shown}."
        )
    return lines


@part_section("Framing susceptibility m and decisiveness s", lambda res: res.fit)
def fit_section(res: BatteryResults, ft: Fits) -> Body:
    """The (s, m) fit per bias channel, with theta from I-1, and its bowtie / ridge figure."""
    from analysis.battery import fit

    bt, cf = ft.binary, ft.run
    not_fitted = [f"- {u.channel}: not fitted: {u.why}" for u in cf.unfitted]
    if cf.fits is None:
        return ["No channel could be fitted.", "", *not_fitted], Files()
    fits = cf.fits
    files = Files({"fit_sm": Table(fits, index=True, float_format="%.6f")})
    if ft.sides:
        files += Files(
            figures=(Drawing("fig_bowtie_ridge.png", functools.partial(figures.bowtie_ridge, ft.sides, fits)),)
        )
    show = fits[["s", "s_lo", "s_hi", "m", "m_lo", "m_hi", "r2", "n_items", "n_near_tie", "clip_limited"]].copy()
    show["clip_limited"] = show["clip_limited"].map({True: "yes", False: "no"})
    show["unidentified"] = fits["unidentified"].map(lambda why: "yes" if why else "no")
    show.index.name = "channel"
    lines = [
        "Joint least-squares fit of p+ = sigmoid((theta + m)/s) and p- = sigmoid((theta - m)/s) per channel, theta "
        f"from I-1; 95% percentile bootstrap over dilemmas ({N_BOOT} resamples, seed {SEED}). m > 0 pulls toward the channel's + "
        "side (order: the first-printed option; lexical: yes). clip_limited: saturated or degenerate fit, read only "
        "the m-ranking. unidentified: the items cannot separate s from m, read neither. logic and label are "
        f"measured on {', '.join(fit.IDENTIFYING_PAIRS)} alone, as the paper rests identification on it (every "
        "pair: the label map).",
        "",
        md_table(show, "{:+.3f}", index=True, iterrows=True),
        *_unidentified_lines({str(ch): str(why) for ch, why in fits["unidentified"].items()}),
        *(
            ["", "Each channel is fitted on its own complete stories; a channel that cannot be:", *not_fitted]
            if not_fitted
            else []
        ),
    ]
    arbitrary = set(bt.loc[bt["family"] == "arbitrary", "labels"])
    if arbitrary and not arbitrary & set(fit.IDENTIFYING_PAIRS):
        lines += [
            "",
            f"No logic / label fit: the run's arbitrary pairs ({', '.join(sorted(arbitrary))}) do not include "
            f"{', '.join(fit.IDENTIFYING_PAIRS)}; add it with --label-pairs.",
        ]
    joint = cf.joint
    if joint is not None:
        files += Files({"fit_joint": Table(joint, float_format="%.6f")})
        lines += ["", *_joint_lines(joint)]
    return lines, files


def _unidentified_lines(reasons: dict[str, str]) -> list[str]:
    """One line per fit whose s and m the items cannot tell apart, saying why."""
    bad = {k: why for k, why in reasons.items() if why}
    return ["", *(f"- {k}: unidentified, {why}" for k, why in bad.items())] if bad else []


def _joint_lines(joint: pd.DataFrame) -> list[str]:
    """The joint-fit table of the (s, m) section and the sentence that tells it from the per-channel fit."""
    cols = ["family", "channel", "s", "s_lo", "s_hi", "m", "m_lo", "m_hi", "r2", "n_items", "n_cells", "clip_limited"]
    show = joint.reindex(columns=cols).copy()
    show["clip_limited"] = show["clip_limited"].map({True: "yes", False: "no"}).fillna("")
    why = joint.reindex(columns=["unidentified"])["unidentified"].fillna("").astype(str)
    show["unidentified"] = why.map(lambda w: "yes" if w else "no").where(joint["s"].notna(), "")
    for col in ("n_items", "n_cells"):
        show[col] = show[col].map(lambda v: "" if pd.isna(v) else str(int(v)))
    show = show.set_index("family")
    lines = [
        "Joint fit per label family: P(CBR) of every design cell of every dilemma = sigmoid((theta + sum_c m_c "
        "sgn_c) / s), sgn_c = +1 on channel c's + side, one s for all channels of the family (same loss, bootstrap "
        "and seed). The per-channel fit above is the paper's estimand: each of its sides averages over the other "
        "channels' offsets, which flattens it, so its s absorbs them (reads high when another channel has an offset); "
        "the joint fit has one s for the family and each m adjusted for the others.",
        "",
        md_table(show, "{:+.3f}", index=True, iterrows=True),
        *_unidentified_lines(dict(zip(joint["family"].astype(str), why, strict=True))),
    ]
    notes = joint[joint["note"].fillna("") != ""] if "note" in joint.columns else joint.iloc[0:0]
    if len(notes):
        lines += ["", *(f"- {r['family']} {r['channel']}: {r['note']}".replace("  ", " ") for _, r in notes.iterrows())]
    return lines
