"""The readout-temperature section, shared by the battery report and the yes/no report.

:func:`calibration_section` formats :class:`~analysis.battery.instrument_parts.ReadoutTemperature` (the
temperature per instrument and answer source, the parse-rule counts and the calibration figure) for any
results with a ``calibration`` part (:class:`Calibrated`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Protocol

import pandas as pd

from analysis.battery import figures
from analysis.battery.calibration import POOLED
from analysis.battery.instrument_parts import ReadoutTemperature
from analysis.battery.instrument_sections import part_section
from analysis.common.report import Body, Drawing, Files, Table
from analysis.common.results import Part
from analysis.common.tables import md_table


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
