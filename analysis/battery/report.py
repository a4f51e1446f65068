"""The battery report and the yes/no report (paper 003): every table and figure the run's instruments allow.

Results, sections, writer: :func:`analysis.battery.results.battery_results`
computes what the report shows once, into a frozen :class:`~analysis.battery.results.BatteryResults`;
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

The sections of the per-instrument parts are in
:mod:`analysis.battery.instrument_sections` (with :func:`~analysis.battery.instrument_sections.part_section`), the
readout-temperature section both reports share in
:mod:`analysis.battery.calibration_section`; this module holds the sections
that read several parts (validity, planted, dropped stories, layers) and
puts each report together (:func:`battery_report`, :func:`yesno_report`).
"""

from __future__ import annotations

import pandas as pd

from analysis.battery.calibration_section import calibration_section
from analysis.battery.frames import Frames, load_frames
from analysis.battery.instrument_sections import (
    SectionFn,
    choice_section,
    fit_section,
    graded_section,
    labelmap_section,
    part_section,
    verbflip_section,
)
from analysis.battery.results import BatteryResults, Planted, Validity, YesNoResults, battery_results, yesno_results
from analysis.common.report import Body, Drawing, Files, Table, run_sections, titled
from analysis.common.tables import md_table
from experiments.yesno import YesNoSpec
from probe.record import Plan
from probe.runs import Run


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
