"""The battery report and the yes/no report (paper 003): every table and figure the run's instruments allow.

Results, sections, writer: :func:`analysis.battery.results.battery_results`
computes what the report shows once, into a frozen :class:`BatteryResults`;
each section formats its part and the parts it names into Markdown lines,
:class:`~analysis.common.report.Table` s and
:class:`~analysis.common.report.Drawing` s (the figures of
:mod:`analysis.battery.figures`) and computes nothing; and
:func:`analysis.common.report.write_report_files` writes them. A part whose
instrument is absent says what is missing instead, and a part that cannot be
computed says why in its section, so a partial run still yields the tables it
can (``probe analyze`` never fails because, say, the free-choice instrument
was not run). The yes/no report is made the same way from
:func:`analysis.battery.results.yesno_results`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import pandas as pd

from analysis.battery import figures
from analysis.battery.calibration import POOLED
from analysis.battery.fit import N_BOOT, SEED
from analysis.battery.frames import Frames, load_frames
from analysis.battery.instrument_parts import Choice, Fits, Graded, LabelMap, ReadoutTemperature, VerbFlip
from analysis.battery.results import BatteryResults, Planted, Validity, YesNoResults, battery_results, yesno_results
from analysis.common.report import Body, Drawing, Files, Section, Table, run_sections, titled
from analysis.common.results import Part
from analysis.common.tables import md_table
from experiments.yesno import YesNoSpec
from probe.record import Plan
from probe.runs import Run

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


class Calibrated(Protocol):
    """What the readout-temperature section formats: the temperature part, and the (s, m) fits shown beside it
    (None in a report without them)."""

    @property
    def calibration(self) -> Part[ReadoutTemperature]: ...

    @property
    def fits(self) -> pd.DataFrame | None: ...


@part_section("Readout temperature", lambda res: res.calibration)
def calibration_section(res: Calibrated, t: ReadoutTemperature) -> Body:
    """Readout temperature T per instrument (at the slot and on all parsed answers), parse rules, beside s."""
    counts = t.counts
    files = Files({"parse_rules": Table(counts, index=True)})
    rule_lines = _parse_rule_lines(counts)
    if t.table is None:  # no temperature was fitted: the part says why
        return [str(t.why), "", *rule_lines], files
    files += Files({"calibration_T": Table(t.table, float_format="%.6f")})
    tau, rows = t.tau, t.rows
    by = {(r.instrument, r.answers): r for r in rows}
    head = rows[0].instrument
    temp = functools.partial(_temperature, by)  # T at the slot or on all parsed answers of an instrument
    head_cal = by[(head, "all")].calibration
    if t.points is not None and head_cal is not None:
        files += _calibration_figure(t.points, head, tau, head_cal.T)
    s_line = ""
    fits = res.fits
    if fits is not None and len(fits):
        s_line = (
            " Decisiveness s (temperature-free greedy readouts): "
            + ", ".join(f"{ch} {row['s']:.3f}" for ch, row in fits.iterrows())
            + "; T and s are different quantities."
        )
    level = next((r.calibration.level for r in rows if r.calibration is not None), 0.95)
    lines = [
        f"Readout temperature T = fitted temperature / tau (tau = {tau:g}): T = 1 when sampling at tau draws from "
        f"softmax(readout logits / tau); {level:.0%} profile-likelihood intervals. Headline ({head}):",
        f"- {head}, answers at the slot: T = {temp(head, 'slot')}: the check that sampling and readout agree "
        "(contains 1 for a faithful engine)",
        f"- {head}, all parsed answers: T = {temp(head, 'all')}: how well the readout predicts behaviour",
    ]
    if (POOLED, "all") in by:
        lines.append(f"- pooled over instruments: at the slot {temp(POOLED, 'slot')}; all parsed {temp(POOLED, 'all')}")
    show = t.table.set_index("instrument").drop(columns="level")
    for col in ("n_samples", "n_trials", "n_trials_r"):
        show[col] = show[col].map(lambda v: "" if pd.isna(v) else str(int(v)))
    show["note"] = show["note"].fillna("")
    lines += ["", md_table(show, "{:.3f}", index=True, iterrows=True)]
    for r in rows:
        if r.answers == "slot" and r.excludes_one and r.calibration is not None:
            c = r.calibration
            lines += [
                "",
                f"WARNING: {r.instrument}: T at the slot = {c.T:.3f} [{c.T_lo:.3f}, {c.T_hi:.3f}] excludes 1: the "
                "sampled answers at the slot do not follow the readout distribution (a different prompt rendering, "
                "top-k/top-p or a server-side change of the logits, a multi-token option the sampler did not follow).",
            ]
    if s_line:
        lines += ["", s_line.strip()]
    lines += ["", *rule_lines]
    return lines, files


def _parse_rule_lines(counts: pd.DataFrame) -> list[str]:
    """How many draws each parse rule decided, per instrument, and how many stored answers today's parser reads
    otherwise."""
    rule_lines = [
        "Parse rules (probe.parse): how many draws each rule decided, per instrument. exact: the reply's first "
        "sentence is exactly one option (an answer at the slot); stated: a last line 'Answer: X'; standalone: one "
        "option found anywhere in the reply; refusal; invalid: none of these.",
        "",
        md_table(counts, "{:+.3f}", index=True, iterrows=True),
    ]
    if counts["disagree"].sum():
        rule_lines += [
            "",
            f"{int(counts.loc[counts.index[-1], 'disagree'])} stored answers differ from today's parser (a run "
            "parsed by an older version): the rules above are today's; the 'all' temperatures use the stored answers.",
        ]
    return rule_lines


def _temperature(by: Mapping[tuple[str, str], Any], instrument: str, answers: str) -> str:
    """A temperature with its interval and counts, or why there is none."""
    r = by.get((instrument, answers))
    if r is None:
        return "n/a"
    c = r.calibration
    if c is None:
        return f"not fitted ({r.reason})"
    return f"{c.T:.3f} [{c.T_lo:.3f}, {c.T_hi:.3f}] ({c.n_samples} answers, {r.n_trials} trials)"


def _calibration_figure(points: pd.DataFrame, head: str, tau: float, T: float) -> Files:
    """The readout probabilities against the sampled frequencies of the headline instrument (table and figure)."""
    return Files(
        {"calibration": Table(points, float_format="%.6f")},
        (
            Drawing(
                "fig_calibration.png",
                functools.partial(
                    figures.scatter_xy,
                    points["p_readout"].to_numpy(),
                    points["p_sampled"].to_numpy(),
                    f"{head}: readout vs sampled (tau = {tau:g}, T all parsed = {T:.3f})",
                    "logit readout probability",
                    "sampled frequency (all parsed answers)",
                ),
            ),
        ),
    )


@part_section("Convergent validity", lambda res: res.validity)
def validity_section(res: BatteryResults, v: Validity) -> Body:
    """Convergent validity: I-2 and I-3 stances against theta, I-2 against the binary stance z (Pearson r, CI)."""
    lines = []
    for p in v.pairs:
        c = p.correlation
        if c is not None:
            lines.append(
                f"- {p.name} vs {p.other}: r = {c.r:+.3f} [{c.lo:+.3f}, {c.hi:+.3f}] (95% bootstrap over items, "
                f"n = {c.n})"
            )
        elif p.blocker:
            lines.append(f"- {p.name} vs {p.other}: no correlation reported: {p.blocker}.")
        else:
            lines.append(f"- {p.name} vs {p.other}: not in this run.")
    if v.table is None:
        return lines, Files()
    return lines, Files({"validity": Table(v.table, index=True, float_format="%.6f")})


@titled("Planted vs recovered (synthetic subject)")
def planted_section(res: BatteryResults) -> Body:
    """For a run of the synthetic subject: the planted parameters beside what the analysis recovered."""
    if res.planted.absent:  # not a run of the synthetic subject: no section
        return [], Files()
    pl: Planted = res.planted.get()
    lines = []
    if pl.theta_r is not None:
        lines.append(f"- theta: r(planted, recovered) = {pl.theta_r:.3f} over {pl.n_theta} items")
    files = Files()
    if len(pl.table):
        lines += ["", md_table(pl.table, "{:+.3f}", index=True, iterrows=True), ""]
        files = Files({"planted_vs_recovered": Table(pl.table, index=True)})
    lines.append(f"- readout temperature planted T = {pl.T:g} (recovered: see Readout temperature)")
    return lines, files


@titled("Dropped stories")
def dropped_section(res: BatteryResults) -> Body:
    """The stories a table left out (a design cell with no usable answer), and why; empty when none were."""
    dropped = res.dropped
    if not dropped:
        return [], Files()
    table = pd.DataFrame([{"dilemma": d.item_id, "table": d.analysis, "reason": d.reason} for d in dropped])
    table = table.drop_duplicates().sort_values(["dilemma", "table"], kind="stable")
    lines = [
        f"{table['dilemma'].nunique()} stories left out of at least one table: a cell with no usable answer has no "
        "P(CBR), so the story has no balanced split there (the paper drops such stories too).",
        "",
        *(f"- {r.dilemma}, {r.table}: {r.reason}" for r in table.itertuples()),
    ]
    return lines, Files({"dropped_stories": Table(table)})


@titled("Where the readout forms")
def layers_section(res: BatteryResults | YesNoResults) -> Body:
    """Each quantity at each layer of ``--layers`` with its interval, where each formed, a figure and a CSV; no
    section without ``--layers``."""
    if res.layers.absent:
        return [], Files()
    from analysis.battery.layers import profile_figure, profile_lines

    profile = res.layers.get()
    files = Files(
        {"layer_profile": Table(profile.table, float_format="%.6f")},
        (Drawing("layer_profile.png", lambda: profile_figure(profile)),),
    )
    return profile_lines(profile), files


SECTIONS: list[SectionFn] = [
    graded_section,
    verbflip_section,
    labelmap_section,
    choice_section,
    fit_section,
    calibration_section,
    validity_section,
    dropped_section,
    planted_section,
]
"""The battery report's sections, in order; :func:`layers_section` follows them in a run with ``--layers`` (a report
without layers is the report it was before they existed)."""


def battery_head(run: Run, f: Frames) -> list[str]:
    """The title and the run's description that open the battery summary."""
    man = f.manifest
    eng = man.engine
    return [
        f"# Crossed-frame battery: {man.model}",
        "",
        f"- run `{run.root}`: {man.n_trials} trials, run key `{man.run_key}`; engine "
        f"{eng.kind or '?'} ({eng.model_class or ''} {eng.dtype or ''} {eng.device or ''})",
        f"- probabilities from: {f.source}; think mode: {man.think}",
        "- error bars: incoherence spreads are descriptive; CIs are percentile bootstraps over items (inferential)",
        "",
    ]


def battery_report(run: Run) -> Body:
    """The battery report: every section's lines, tables and figures, from results computed once."""
    f = load_frames(run)
    res = battery_results(f)
    body, files = run_sections(SECTIONS if res.layers.absent else [*SECTIONS, layers_section], res, why=True)
    return battery_head(run, f) + body, files


# ------------------------------------------------------------------- the yes/no battery
def yesno_summary(run: Run, res: YesNoResults) -> tuple[list[str], Files]:
    """The yes/no report's lines and files: the run, the cells and decomposition per dilemma, the dropped stories,
    the salt noise floor and (a run with samples and readouts) the readout temperature."""
    man = run.manifest
    table = res.table
    short = table[
        [
            "p_cbr_approve_yes_first",
            "p_cbr_approve_no_first",
            "p_cbr_oppose_yes_first",
            "p_cbr_oppose_no_first",
            "z",
            "lexical",
            "order",
            "apparent",
        ]
    ]
    short = short.set_axis(
        ["P approve yf", "P approve nf", "P oppose yf", "P oppose nf", "z", "lexical", "order", "apparent"], axis=1
    ).rename_axis("dilemma")
    eng, plan, source = man.engine, man.plan or Plan(), res.source
    lines = [
        f"# yes/no battery: {man.model}",
        "",
        f"- run: `{run.root}`, {man.n_trials} trials, run key `{man.run_key}`",
        f"- engine {eng.kind or '?'}, model `{eng.model_path}`"
        + "".join(f", {v}" for v in (eng.model_class, eng.dtype, eng.device) if v),
        f"- think mode: {man.think}; forms: {', '.join(man.spec_as(YesNoSpec).forms)}",
        f"- probabilities from: {source}"
        + (f" ({plan.samples} samples per trial at T = {plan.temperature})" if source == "samples" else ""),
        f"- mean option coverage ({'option mass at the answer slot' if source == 'readout' else 'share of parsed answers'}): "
        f"{res.coverage_mean:.3f} (min over dilemmas {res.coverage_min:.3f})",
        "",
        "P = P(cost-benefit answer) per verb x printed order cell, averaged over wording forms; approve:",
        "yes endorses the cost-benefit pole, oppose: yes rejects it; yf / nf: yes / no printed first.",
        "z = mean(2P - 1) is the story's stance; lexical = pull toward the",
        "word yes (negative: toward no); order = pull toward the first-printed option; apparent = lexical + order.",
        "",
        md_table(short, "{:+.3f}", nan=None, index=True, iterrows=True),
        "",
    ]
    files = Files({"yesno_by_item": Table(table, index=True, float_format="%.6f")})
    if res.dropped:
        lines += [
            f"Dropped stories ({len(res.dropped)}): a cell with no usable answer has no P(CBR), so the story has no "
            "balanced split.",
            "",
            *(f"- {d.item_id}: {d.reason}" for d in res.dropped),
            "",
        ]
    salt = res.salt
    if salt is not None:
        lines += [
            f"Salt noise floor: median within-form SD of P(CBR) over {salt.n_replicates} "
            f"replicates = {salt.median:.4f} (max {salt.max:.4f}).",
            "",
        ]
        files += Files({"yesno_salt_noise": Table(salt.sd.to_frame(), index=True, float_format="%.6f")})
    if not res.calibration.absent:
        body, calibration_files = run_sections([calibration_section], res, why=True)
        lines += body
        files += calibration_files
    if not res.layers.absent:
        body, layer_files = run_sections([layers_section], res, why=True)
        lines += body
        files += layer_files
    return lines, files


def yesno_report(run: Run) -> Body:
    """The yes/no report: per-dilemma P(CBR) cells and the lexical / order decomposition."""
    return yesno_summary(run, yesno_results(run))
