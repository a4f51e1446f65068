"""The battery report (paper 003): every table and figure the run's instruments allow.

The sections only format: :func:`analysis.battery.results.battery_results`
computes what they show once, into a frozen :class:`BatteryResults`, and each
section formats its part and the parts it names (Markdown lines and the files
it writes). A part whose instrument is absent says what is missing instead,
and a part that cannot be computed says why in its section, so a partial run
still yields the tables it can (``probe analyze`` never fails because, say,
the free-choice instrument was not run).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from analysis.battery import figures, yesno
from analysis.battery.fit import N_BOOT, SEED
from analysis.battery.results import (
    BatteryResults,
    Choice,
    Fits,
    Frames,
    Graded,
    LabelMap,
    Part,
    VerbFlip,
    battery_results,
    load_frames,
)
from analysis.common.figures import pyplot, save_figure
from analysis.common.report import Body, Section, report_files, run_sections, titled, write_summary
from analysis.common.tables import md_table
from experiments.battery import BatterySpec
from experiments.yesno import YesNoSpec
from probe.errors import NotComputed
from probe.files import atomic_write_text
from probe.record import Plan
from probe.runs import Run


def _with_mean(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    out.loc["mean"] = df.mean(numeric_only=True)
    return out


def corpus_form_order(corpus: str | None, forms: set[str]) -> list[str]:
    """The run's verb-flip forms in corpus order (the order of ``binary.forms`` in the corpus file).

    The form-parity split of Fig. 3 takes even / odd forms in this order,
    whatever order ``--forms`` named them in and under every preset (issue
    27: ``--preset full`` used to sort them alphabetically). Forms the corpus
    does not list (an edited corpus) follow, sorted.
    """
    from experiments.battery import load_corpus

    listed = [str(x) for x in load_corpus(corpus)["binary"]["forms"] if x in forms]
    return listed + sorted(forms - set(listed))


# ------------------------------------------------------------------- sections
V = TypeVar("V")
SectionFn = Callable[[Frames, BatteryResults, Path], Section]


def part_section(
    title: str, part: Callable[[BatteryResults], Part[V]]
) -> Callable[[Callable[[Frames, BatteryResults, V, Path], Body]], SectionFn]:
    """A section (:func:`titled`) of one computed part; the part's absent line when its instrument is absent.

    The body receives the part's value (a part that failed raises its NotComputed there, so the section says
    why it is not computed); the section keeps the body's name and docstring, which :func:`run_sections` uses.
    """

    def wrap(body: Callable[[Frames, BatteryResults, V, Path], Body]) -> SectionFn:
        @titled(title)
        @functools.wraps(body)
        def section(f: Frames, res: BatteryResults, out: Path) -> Body:
            p = part(res)
            if p.absent:
                return [p.absent], []
            return body(f, res, p.get(), out)

        return section

    return wrap


@part_section("Forced binary, yes/no verb flip (I-3)", lambda res: res.verbflip)
def verbflip_section(f: Frames, res: BatteryResults, vf: VerbFlip, out: Path) -> Body:
    """The yes/no verb-flip family: per-story cells, z, lexical, order, apparent (Eq. 1)."""
    b, cells, dec = vf.trials, vf.cells, vf.dec
    from analysis.battery.yesno import (
        form_decomposition,
        i3_incoherence,
        p_cbr,
        parity_split,
        story_mean_ci,
        trial_variance,
    )

    yn = f.instrument("binary")
    yn = yn[yn["labels"] == "Yes/No"].assign(cbr_verb=lambda d: d["verb"])
    forms = form_decomposition(yn, p_cbr(f.options), trial_variance(f.options))
    spread = i3_incoherence(forms[forms.index.get_level_values("item_id").isin(dec.index)])
    order_of_forms = corpus_form_order(f.manifest.spec_as(BatterySpec).corpus, set(yn["form"]))
    files = []
    if len(order_of_forms) >= 2:
        with contextlib.suppress(NotComputed):
            split = parity_split(yn[yn["item_id"].isin(dec.index)], p_cbr(f.options), order_of_forms)
            split.index.name = "dilemma"
            atomic_write_text(out / "binary_form_parity.csv", split.to_csv(float_format="%.6f"))
            files.append(out / "binary_form_parity.csv")
    table = _with_mean(cells.join(dec).join(spread.drop(columns="n_forms")))
    table.index.name = "dilemma"
    atomic_write_text(out / "binary_verbflip.csv", table.to_csv(float_format="%.6f"))
    ci = story_mean_ci(dec[["z", "lexical", "order", "apparent"]], n_boot=N_BOOT, seed=SEED)
    fig = figures.grouped_bars(
        _with_mean(dec[["order", "lexical", "apparent"]]),
        ["order", "lexical", "apparent"],
        out / "fig_bias_decomposition.png",
        "Yes/no bias decomposition per dilemma (apparent = order + lexical)",
        "bias on the [-1, 1] axis",
    )
    identity = float((dec["apparent"] - dec["order"] - dec["lexical"]).abs().max())
    n_forms = b["form"].nunique()
    short = table[["z", "lexical", "order", "apparent", "sigma_z", "sigma_lexical", "sigma_order"]]
    ci_line = "; ".join(f"{q} {r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]" for q, r in ci.iterrows())
    lines = [
        f"{len(dec)} dilemmas x {n_forms} forms x approve/oppose x yes-first/no-first. "
        "lexical = pull toward the word yes (negative: toward no); order = pull toward the first-printed option "
        "(negative: toward the last); apparent = what one 'yes or no' question shows. "
        f"Identity apparent = order + lexical holds to {identity:.1e}. sigma_<q>: the sampling-corrected spread of "
        "the per-form value across the wording forms (Fig. 3's error bars, descriptive); the two form-parity "
        "subsets (even / odd forms in corpus order) are in `binary_form_parity.csv`.",
        "",
        md_table(short, "{:+.3f}", index=True, iterrows=True),
        "",
        f"Story-averaged, 95% percentile bootstrap over dilemmas ({N_BOOT} resamples, seed {SEED}): {ci_line}.",
    ]
    if f.source == "samples":
        from analysis.battery.yesno import resampling_diagnostics

        with contextlib.suppress(NotComputed):
            rs = resampling_diagnostics(yn, f.options)
            lines += [
                "",
                f"Resampling: {rs.unanimous:.0%} of {rs.n_cells} cells (item x form x verb x order) unanimous across "
                f"their draws; between-form variance {rs.between_within:.1f}x the within-form (one-draw) variance "
                f"({rs.between_within_orders:.1f}x with print order inside the form); {rs.opposite_majority:.0%} of "
                f"{rs.n_items} dilemmas have two equivalent forms with opposite majority verdicts.",
            ]
    return lines, [out / "binary_verbflip.csv", fig, *files]


@part_section("Label map (I-3)", lambda res: res.labelmap)
def labelmap_section(f: Frames, res: BatteryResults, lm: LabelMap, out: Path) -> Body:
    """Order / logic / label projections per label pair, and the lexicality gradient of the label pull (Figs. 5-6)."""
    pulls, by_pair, contrast, contrast_all = lm.pulls, lm.gradient, lm.contrast, lm.contrast_all
    incomplete, n_left = lm.incomplete, lm.n_left
    by_pair.index.name = "label pair"
    atomic_write_text(out / "binary_labelmap.csv", pulls.to_csv(float_format="%.6f"))
    atomic_write_text(out / "binary_label_gradient.csv", by_pair.to_csv(float_format="%.6f"))
    fig = figures.grouped_bars(
        by_pair[["order", "label_pull"]].rename(columns={"label_pull": "label pull"}),
        ["order", "label pull"],
        out / "fig_label_gradient.png",
        "Label pairs ordered non-lexical -> lexical: order bias and label pull",
        "story-averaged bias",
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
    if incomplete:
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
    return lines, [out / "binary_labelmap.csv", out / "binary_label_gradient.csv", fig]


@part_section("Free choice (I-2)", lambda res: res.choice)
def choice_section(f: Frames, res: BatteryResults, ch: Choice, out: Path) -> Body:
    """Free choice: P(PRO), P(ANTI), P(NONCOMMIT) per dilemma and the choice stance P(PRO) - P(ANTI)."""
    from analysis.battery.yesno import story_mean_ci

    j, d, per_item = f.judgments, ch.replies, ch.per_item
    order_ci = story_mean_ci(per_item[["order"]], n_boot=N_BOOT, seed=SEED).loc["order"]
    per_item.index.name = "dilemma"
    atomic_write_text(out / "choice_by_item.csv", per_item.to_csv(float_format="%.6f"))
    judge = ", ".join(sorted(set(j["judge"])))
    lines = [
        f"Verdicts by judge `{judge}` over {len(j)} replies ({d['framing'].nunique()} framings x 2 print orders per "
        "dilemma); stance = P(PRO) - P(ANTI); sigma_repro = its spread across the forms corrected for sampling "
        "(as I-1's; sigma_raw uncorrected; descriptive); order = pull toward the first-printed course (negative: "
        "toward the last). Transcripts: the run's `generations` table.",
        "",
        md_table(_with_mean(per_item), "{:+.3f}", index=True, iterrows=True),
        "",
        f"I-2 order bias, story-averaged: {order_ci['mean']:+.3f} [{order_ci['lo']:+.3f}, {order_ci['hi']:+.3f}] "
        f"(95% percentile bootstrap over dilemmas, {N_BOOT} resamples, seed {SEED}).",
    ]
    return lines, [out / "choice_by_item.csv"]


@part_section("Graded stance (I-1)", lambda res: res.graded)
def graded_section(f: Frames, res: BatteryResults, gr: Graded, out: Path) -> Body:
    """I-1: theta per dilemma, its cross-form incoherence and components, G, the bipolar contrast, the salt floor."""
    from analysis.battery import stance

    g, gt, fallback, empty_forms = gr.trials, gr.graded, gr.fallback, gr.empty_forms
    inc, gen, table, bipolar, pooled = gr.inc, gr.gen, gr.table, gr.bipolar, gr.pooled
    table.index.name = "dilemma"
    atomic_write_text(out / "graded_theta.csv", table.to_csv(float_format="%.6f"))
    fig = figures.stance_bars(
        table,
        "theta",
        "sigma_repro",
        out / "fig_stance.png",
        "Stance theta per dilemma (bars: cross-form incoherence, descriptive)",
        "theta (+1 endorses the cost-benefit pole)",
    )
    lines = [
        f"theta = mean signed stance over {int(inc['n_forms'].median())} unipolar forms per dilemma (mean-based; "
        "theta_mode from each form's most likely value). sigma_repro = sampling-corrected cross-form spread; "
        "sigma_dir (anchor direction) and sigma_scale (scale, wording, pole) add in quadrature.",
        "",
        md_table(_with_mean(table.drop(columns=["n_forms"])), "{:+.3f}", index=True, iterrows=True),
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
    if len(fallback) or len(empty_forms):

        def name(r: Any) -> str:
            return f"{r.item_id} {r.scale}/{r.wording}/{r.anchor}/{r.pole}"

        lines += [""]
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
    if bipolar is not None:
        lines += [
            "",
            f"Bipolar contrast theta_bipolar - theta over {bipolar.n_items} dilemmas (measured, never in theta): "
            f"mean |.| = {bipolar.mean_abs:.3f} (the paper's summary), signed mean = {bipolar.mean:+.3f}.",
        ]
    if (g["replicate"] > 0).any():
        floor = stance.salt_floor(stance.salt_spread(gt[~gt["bipolar"]], "mean_x", stance.FORM))
        inv = stance.salt_invariance(gt)
        lines += [
            "",
            f"Salt floor: within-form SD under salts {floor.within_sd_mean:.4f} (median {floor.within_sd_median:.4f}) "
            f"vs between-form SD {floor.between_sd_mean:.4f} (ratio {floor.ratio:.3f}; {floor.n_forms} forms). "
            f"{inv.invariant:.0%} of {inv.n_forms} forms keep the same most likely rating under every salt; salted "
            f"theta vs unsalted: r = {inv.r_theta:.3f} ({inv.n_items} dilemmas).",
        ]
    atomic_write_text(out / "graded_pooled.csv", pd.DataFrame([pooled.to_dict()]).to_csv(index=False))
    return lines, [out / "graded_theta.csv", out / "graded_pooled.csv", fig]


@part_section("Framing susceptibility m and decisiveness s", lambda res: res.fit)
def fit_section(f: Frames, res: BatteryResults, ft: Fits, out: Path) -> Body:
    """The (s, m) fit per bias channel, with theta from I-1, and its bowtie / ridge figure."""
    from analysis.battery import fit

    th, bt, cf = res.theta, ft.binary, ft.run
    assert th is not None  # the fit needs theta
    not_fitted = [f"- {u.channel}: not fitted: {u.why}" for u in cf.unfitted]
    if cf.fits is None:
        return ["No channel could be fitted.", "", *not_fitted], []
    fits = cf.fits
    atomic_write_text(out / "fit_sm.csv", fits.to_csv(float_format="%.6f"))
    files = [out / "fit_sm.csv"]
    sides = {}
    for ch in fits.index:
        try:
            sides[ch] = fit.channel_sides(bt, ch).join(th, how="inner")
        except NotComputed:
            continue
    if sides:
        files.append(_bowtie_figure(sides, fits, out / "fig_bowtie_ridge.png"))
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
        atomic_write_text(out / "fit_joint.csv", joint.to_csv(index=False, float_format="%.6f"))
        files.append(out / "fit_joint.csv")
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


def _bowtie_figure(sides: dict[str, pd.DataFrame], fits: pd.DataFrame, path: Path) -> Path:
    from analysis.battery.fit import predict

    plt = pyplot()
    fig, axes = plt.subplots(2, len(sides), figsize=(4 * len(sides), 7), squeeze=False)
    grid = np.linspace(-1, 1, 201)
    for j, (ch, d) in enumerate(sides.items()):
        s, m = float(fits.loc[ch, "s"]), float(fits.loc[ch, "m"])
        pp, pm = predict(grid, s, m)
        ax = axes[0][j]
        ax.scatter(d["z"], d["bias"], s=14)
        ax.plot(pp + pm - 1, pp - pm, color="#c44e52")
        ax.set(title=f"{ch}: bowtie (s={s:.2f}, m={m:+.2f})", xlabel="story stance z", ylabel="bias p+ - p-")
        ax = axes[1][j]
        ax.scatter(d["theta"], d["bias"], s=14)
        ax.plot(grid, pp - pm, color="#c44e52")
        ax.set(title=f"{ch}: ridge", xlabel="theta (I-1)", ylabel="bias p+ - p-")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return path


@titled("Readout temperature")
def calibration_section(f: Frames, res: BatteryResults, out: Path) -> Body:
    """Readout temperature T per instrument (at the slot and on all parsed answers), parse rules, beside s."""
    from analysis.battery.calibration import (
        POOLED,
        calibrate_by_instrument,
        calibration_table,
        rule_counts,
        sample_rules,
        temperature_table,
    )
    from probe.views import count_samples

    if f.samples.empty:
        return ["Needs --samples N (and readouts, from a logit engine)."], []
    rules = sample_rules(f.samples, f.trial_list, think=f.manifest.think)
    counts = rule_counts(rules, f.trial_list)
    atomic_write_text(out / "parse_rules.csv", counts.to_csv())
    files: list[Path] = [out / "parse_rules.csv"]
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
    if f.readout_options.empty:
        return ["Needs readouts beside the samples (a logit engine).", "", *rule_lines], files
    tau = (f.manifest.plan or Plan()).temperature  # no plan: Plan's default
    if tau <= 0:
        return ["Samples were greedy (temperature 0): no temperature to fit.", "", *rule_lines], files
    rows = calibrate_by_instrument(
        f.readout_options, f.samples, f.trial_list, tau, think=f.manifest.think, rules=rules
    )
    table = temperature_table(rows)
    atomic_write_text(out / "calibration_T.csv", table.to_csv(index=False, float_format="%.6f"))
    files.append(out / "calibration_T.csv")
    by = {(r.instrument, r.answers): r for r in rows}
    head = rows[0].instrument

    def _t(instrument: str, answers: str) -> str:
        r = by.get((instrument, answers))
        if r is None:
            return "n/a"
        c = r.calibration
        if c is None:
            return f"not fitted ({r.reason})"
        return f"{c.T:.3f} [{c.T_lo:.3f}, {c.T_hi:.3f}] ({c.n_samples} answers, {r.n_trials} trials)"

    head_ids = {t.trial_id for t in f.trial_list if str(t.factors.get("instrument", "all")) == head}
    sopts = count_samples(f.samples[f.samples["trial_id"].isin(head_ids)], f.trial_list)[0]
    head_cal = by[(head, "all")].calibration
    if head_cal is not None:
        ptable = calibration_table(f.readout_options, sopts, meaning="cbr" if "cbr" in set(sopts["meaning"]) else None)
        fig = figures.scatter_xy(
            ptable["p_readout"].to_numpy(),
            ptable["p_sampled"].to_numpy(),
            out / "fig_calibration.png",
            f"{head}: readout vs sampled (tau = {tau:g}, T all parsed = {head_cal.T:.3f})",
            "logit readout probability",
            "sampled frequency (all parsed answers)",
        )
        atomic_write_text(out / "calibration.csv", ptable.to_csv(index=False, float_format="%.6f"))
        files += [out / "calibration.csv", fig]
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
        f"- {head}, answers at the slot: T = {_t(head, 'slot')}: the check that sampling and readout agree "
        "(contains 1 for a faithful engine)",
        f"- {head}, all parsed answers: T = {_t(head, 'all')}: how well the readout predicts behaviour",
    ]
    if (POOLED, "all") in by:
        lines.append(f"- pooled over instruments: at the slot {_t(POOLED, 'slot')}; all parsed {_t(POOLED, 'all')}")
    show = table.set_index("instrument").drop(columns="level")
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


@titled("Convergent validity")
def validity_section(f: Frames, res: BatteryResults, out: Path) -> Body:
    """Convergent validity: I-2 and I-3 stances against theta, I-2 against the binary stance z (Pearson r, CI)."""
    from analysis.battery.stance import correlation_blocker, pearson_ci

    th = res.theta
    if th is None:
        return ["Needs the graded instrument (theta)."], []
    lines, rows = [], {}
    pairs = (
        ("I-2 choice stance", res.choice_stance, "theta", th),
        ("I-3 story stance z", res.z, "theta", th),
        ("I-2 choice stance", res.choice_stance, "the symmetrised binary stance z", res.z),
    )
    for name, series, other_name, other in pairs:
        if series is None or other is None:
            lines.append(f"- {name} vs {other_name}: not in this run.")
            continue
        why = correlation_blocker(series, other, (name, other_name))
        if why:
            lines.append(f"- {name} vs {other_name}: no correlation reported: {why}.")
            continue
        c = pearson_ci(series, other, n_boot=N_BOOT, seed=SEED)
        rows[name if other_name == "theta" else f"{name} vs z"] = {"r": c.r, "lo": c.lo, "hi": c.hi, "n": c.n}
        lines.append(
            f"- {name} vs {other_name}: r = {c.r:+.3f} [{c.lo:+.3f}, {c.hi:+.3f}] (95% bootstrap over items, n = {c.n})"
        )
    files = []
    if rows:
        atomic_write_text(out / "validity.csv", pd.DataFrame(rows).T.to_csv(float_format="%.6f"))
        files.append(out / "validity.csv")
    return lines, files


@titled("Planted vs recovered (synthetic subject)")
def planted_section(f: Frames, res: BatteryResults, out: Path) -> Body:
    """For a run of the synthetic subject: the planted parameters beside what the analysis recovered."""
    eng = f.manifest.engine
    if eng.kind != "sim":
        return [], []
    from analysis.battery.fit import IDENTIFYING_PAIRS
    from engines.sim import SimParams

    params = SimParams(**eng.params)
    fit_pairs = IDENTIFYING_PAIRS
    lines = []
    th = res.theta
    if th is not None and len(th) > 2:
        planted = pd.Series({i: params.item_theta(str(i)) for i in th.index})
        r = float(np.corrcoef(planted.to_numpy(), th.to_numpy())[0, 1])
        lines.append(f"- theta: r(planted, recovered) = {r:.3f} over {len(th)} items")
    fits = res.fits
    word = {pair: params.m_label.get(pair, params.m_word) for pair in ("Yes/No", *fit_pairs)}
    truth = {
        "order": params.m_order,
        "lexical": word["Yes/No"] + params.m_logic,
        "logic": params.m_logic,
        "label": word[fit_pairs[0]],
    }
    rows = {}
    if fits is not None:
        for ch, row in fits.iterrows():
            rows[ch] = {
                "s planted": params.s,
                "s": row["s"],
                "s CI": f"[{row['s_lo']:.3f}, {row['s_hi']:.3f}]",
                "m planted": truth.get(str(ch), float("nan")),
                "m": row["m"],
                "m CI": f"[{row['m_lo']:.3f}, {row['m_hi']:.3f}]",
            }
    joint = res.joint
    if joint is not None:
        fitted = joint[joint.reindex(columns=["m"])["m"].notna()]
        for _, row in fitted.iterrows():
            ch, fam = str(row["channel"]), str(row["family"])
            m_true = truth.get(ch, float("nan"))
            if fam == "arbitrary" and ch == "logic" and "label" not in set(fitted["channel"]):
                m_true = params.m_logic + word[fit_pairs[0]]  # label not identified: the logic cells carry both
            rows[f"joint:{fam}:{ch}"] = {
                "s planted": params.s,
                "s": row["s"],
                "s CI": f"[{row['s_lo']:.3f}, {row['s_hi']:.3f}]",
                "m planted": m_true,
                "m": row["m"],
                "m CI": f"[{row['m_lo']:.3f}, {row['m_hi']:.3f}]",
            }
    gradient = res.label_gradient
    if gradient is not None and "m_label" in gradient.columns:
        for pair, row in gradient.iterrows():
            if pd.isna(row["m_label"]):
                continue
            rows[f"label pull: {pair}"] = {
                "s planted": float("nan"),
                "s": float("nan"),
                "s CI": "",
                "m planted": params.m_label.get(str(pair), params.m_word),
                "m": row["m_label"],
                "m CI": f"b = {row['label_pull']:+.3f} [{row['label_pull_lo']:+.3f}, {row['label_pull_hi']:+.3f}]",
            }
    table = pd.DataFrame(rows).T
    if len(table):
        table.index.name = "channel"
        lines += ["", md_table(table, "{:+.3f}", index=True, iterrows=True), ""]
        atomic_write_text(out / "planted_vs_recovered.csv", table.to_csv())
    lines.append(f"- readout temperature planted T = {params.T:g} (recovered: see Readout temperature)")
    return lines, [out / "planted_vs_recovered.csv"] if len(table) else []


@titled("Dropped stories")
def dropped_section(f: Frames, res: BatteryResults, out: Path) -> Body:
    """The stories a table left out (a design cell with no usable answer), and why; empty when none were."""
    dropped = res.dropped
    if not dropped:
        return [], []
    table = pd.DataFrame([{"dilemma": d.item_id, "table": d.analysis, "reason": d.reason} for d in dropped])
    table = table.drop_duplicates().sort_values(["dilemma", "table"], kind="stable")
    atomic_write_text(out / "dropped_stories.csv", table.to_csv(index=False))
    lines = [
        f"{table['dilemma'].nunique()} stories left out of at least one table: a cell with no usable answer has no "
        "P(CBR), so the story has no balanced split there (the paper drops such stories too).",
        "",
        *(f"- {r.dilemma}, {r.table}: {r.reason}" for r in table.itertuples()),
    ]
    return lines, [out / "dropped_stories.csv"]


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


def battery_report(run: Run, out: Path) -> list[Path]:
    """Write every section's tables and figures, and ``summary.md`` with all of them."""
    out.mkdir(parents=True, exist_ok=True)
    f = load_frames(run)
    man = f.manifest
    eng = man.engine
    head = [
        f"# Crossed-frame battery: {man.model}",
        "",
        f"- run `{run.root}`: {man.n_trials} trials, run key `{man.run_key}`; engine "
        f"{eng.kind or '?'} ({eng.model_class or ''} {eng.dtype or ''} {eng.device or ''})",
        f"- probabilities from: {f.source}; think mode: {man.think}",
        "- error bars: incoherence spreads are descriptive; CIs are percentile bootstraps over items (inferential)",
        "",
    ]
    body, files = run_sections(SECTIONS, f, battery_results(f), out, why=True)
    return [write_summary(out, "\n".join(head + body)), *files]


def yesno_report(run: Run, out: Path) -> list[Path]:
    """Per-dilemma P(CBR) cells and the lexical / order decomposition, as CSV and Markdown."""
    man = run.manifest
    opts, per_trial, source = run.choice_probs()
    pc = yesno.p_cbr(opts)
    with_verb = yesno.with_cbr_verb(per_trial, opts)
    cells = yesno.cell_table(with_verb, pc)
    dropped = yesno.dropped_stories(with_verb, pc)
    dec = yesno.decompose(cells)
    table = cells.join(dec)
    table.loc["mean"] = table.mean(numeric_only=True)
    cov = per_trial.groupby("item_id")["coverage"].mean()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "yesno_by_item.csv", table.to_csv(float_format="%.6f"))
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
    short.columns = ["P approve yf", "P approve nf", "P oppose yf", "P oppose nf", "z", "lexical", "order", "apparent"]
    short.index.name = "dilemma"
    eng, plan = man.engine, man.plan or Plan()
    lines = [
        f"# yes/no battery: {man.model}",
        "",
        f"- run: `{run.root}`, {man.n_trials} trials, run key `{man.run_key}`",
        f"- engine {eng.kind or '?'}, model `{eng.model_path}`"
        + "".join(f", {v}" for v in (eng.model_class, eng.dtype, eng.device) if v),
        f"- think mode: {man.think}; forms: {', '.join(man.spec_as(YesNoSpec).forms)}",
        f"- probabilities from: {source}"
        + (
            f" ({plan.samples} samples per trial at T = {plan.temperature})"
            if source == "samples"
            else ""
        ),
        f"- mean option coverage ({'option mass at the answer slot' if source == 'readout' else 'share of parsed answers'}): "
        f"{cov.mean():.3f} (min over dilemmas {cov.min():.3f})",
        "",
        "P = P(cost-benefit answer) per verb x printed order cell, averaged over wording forms; approve:",
        "yes endorses the cost-benefit pole, oppose: yes rejects it; yf / nf: yes / no printed first.",
        "z = mean(2P - 1) is the story's stance; lexical = pull toward the",
        "word yes (negative: toward no); order = pull toward the first-printed option; apparent = lexical + order.",
        "",
        md_table(short, "{:+.3f}", nan=None, index=True, iterrows=True),
        "",
    ]
    if dropped:
        lines += [
            f"Dropped stories ({len(dropped)}): a cell with no usable answer has no P(CBR), so the story has no "
            "balanced split.",
            "",
            *(f"- {d.item_id}: {d.reason}" for d in dropped),
            "",
        ]
    if per_trial["replicate"].nunique() > 1:
        sd = yesno.salt_noise(per_trial, pc)
        lines += [
            f"Salt noise floor: median within-form SD of P(CBR) over {per_trial['replicate'].nunique()} "
            f"replicates = {sd.median():.4f} (max {sd.max():.4f}).",
            "",
        ]
        atomic_write_text(out / "yesno_salt_noise.csv", sd.to_frame().to_csv(float_format="%.6f"))
    if not run.load("samples").empty and not run.load("readout_options").empty:
        # a run that reads the slot and samples (locally or through one server): the battery's calibration
        body, _ = run_sections([calibration_section], load_frames(run), BatteryResults(), out, why=True)
        lines += body
    write_summary(out, "\n".join(lines))
    return report_files(out)
