"""The computed parts of the cue-visibility report (paper 001): every number it shows, computed once from the run.

Computation apart from presentation (scikit-learn's estimators compute, its
Displays only draw): :func:`cue_results` reads the run and computes every
part of :mod:`analysis.cue.report` once (the numbers from
:mod:`analysis.cue.metrics`, the flags from :mod:`analysis.cue.flags`) into a
frozen :class:`CueResults`: the design and coverage of the run, its puzzles
regenerated and checked (:func:`check_puzzles`), identity recovery against
chance per reading (:class:`Recovery`), the decision-bias readings with their
breakdowns, degenerate cells and, on a run with readouts and samples, the
other source and where the two disagree (:class:`Decisions`,
:class:`SourceAgreement`), and the status bias (:class:`Status`). The report
only formats it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.battery.calibration import run_temperature
from analysis.common.results import Part
from analysis.cue import flags
from analysis.cue.decisions import ATTRS, CELL, REFERENCE, Decision, Denominator, decision_frame, with_baseline
from analysis.cue.identity import check_frame, correct_only_keep, identity_checks, solve_rates, status_bias
from analysis.cue.metrics import (
    BREAKDOWNS,
    MACRO,
    breakdown_tables,
    decision_bias,
    formal_named_share,
    macro_left_out,
    wording_table,
)
from probe.record import Plan

if TYPE_CHECKING:
    from experiments.cue import CueSpec
    from probe.record import Manifest
    from probe.runs import Run
    from probe.types import Trial

Readings = Mapping[str, tuple[pd.DataFrame, pd.DataFrame]]
"""(bias, gap) tables of :func:`analysis.cue.metrics.decision_bias` per reading (:data:`VARIANTS`, correct-only)."""

HEADLINE = "greedy"
"""The key of the headline results: greedy decisions, eligible denominators (see :data:`VARIANTS`)."""
VARIANTS: dict[str, tuple[Decision, Denominator]] = {
    "greedy": ("greedy", "eligible"),
    "expected": ("expected", "eligible"),
    "greedy, all parsable": ("greedy", "all"),
}
"""The decision-bias readings a report computes: (decision, denominator) per label."""


@dataclass(frozen=True)
class Puzzles:
    """The run's puzzles regenerated from its spec and checked against the stored prompts (:func:`check_puzzles`)."""

    rows: tuple[str, ...] = ()
    """One JSON line per puzzle (``puzzles.jsonl``); written only when none is ``mismatched``."""
    mismatched: tuple[str, ...] = ()
    """Puzzles whose regenerated lines are not in the stored prompt of their first trial."""
    error: str | None = None
    """Why the puzzles were not regenerated (the run's dilemma file could not be read again); None: they were."""


@dataclass(frozen=True)
class Recovery:
    """One reading of identity recovery (from the JSON of the could-be replies or from the check probe)."""

    source: str
    """``json`` or ``check``."""
    used: bool
    """Whether the correct-only tables keep the pairs this reading recovered."""
    solve: pd.DataFrame
    """:func:`analysis.cue.identity.solve_rates`, with the ``source`` column (``cue_solve.csv``)."""
    chances: tuple[flags.Chance, ...]
    """Each recovery rate against chance (:func:`analysis.cue.flags.recovery_vs_chance`)."""
    low_coverage: pd.DataFrame | None
    """The check probes below the coverage floor (:func:`analysis.cue.flags.low_coverage`); None for the JSON
    reading, which does not read them."""


@dataclass(frozen=True)
class SourceAgreement:
    """A run with readouts and samples: the headline reading from each source, and where they disagree."""

    sources: tuple[str, str]
    """The report's source (its tables), then the other."""
    first: tuple[pd.DataFrame, pd.DataFrame]
    second: tuple[pd.DataFrame, pd.DataFrame]
    """(bias, gap) of the headline reading from each source."""
    agreement: pd.DataFrame
    """:func:`cue_agreement` (``cue_source_agreement.csv``)."""
    temperature: pd.DataFrame
    """:func:`analysis.battery.calibration.run_temperature` (``calibration_T.csv``)."""


@dataclass(frozen=True)
class Decisions:
    """The decision-bias readings of a run with answered Neutral and what-if trials, and what they rest on."""

    readings: Readings
    """(bias, gap) per reading, the headline first, then correct-only where the run has identity checks."""
    bias: pd.DataFrame
    gap: pd.DataFrame
    """Every reading of every source in long form (``cue_bias.csv``, ``cue_gap.csv``)."""
    arms: tuple[str, ...]
    head: str | None
    """The Puzzled arm the paper headlines (:func:`headline_of`); None: no arm beside Direct."""
    order: tuple[tuple[str, str], ...]
    """The (attr, group) cells in display order (:func:`group_order`)."""
    consequences: tuple[str, ...]
    """The consequences settings of the headline reading, ``with`` first."""
    left_out: Mapping[str, pd.DataFrame]
    """Per reading, the groups its macro rows left out (:func:`analysis.cue.metrics.macro_left_out`)."""
    shares: pd.DataFrame
    """FormalNamed's share of the gap (:func:`analysis.cue.metrics.formal_named_share`)."""
    changes: pd.DataFrame
    """Changed greedy decisions per cell (:func:`analysis.cue.flags.decision_changes`, ``cue_degenerate.csv``)."""
    stuck: pd.DataFrame
    """Per arm, the groups whose greedy Gap is 0 by construction (:func:`analysis.cue.flags.stuck_gaps`)."""
    low_coverage: pd.DataFrame
    """The decision and what-if probes below the coverage floor."""
    figure_bias: pd.DataFrame
    figure_arms: tuple[str, ...]
    """What the net-bias figure draws: the headline bias (and the headline arm on the solved pairs), its arms."""
    wordings: pd.DataFrame | None
    """Per what-if wording (:func:`analysis.cue.metrics.wording_table`); None: the run has one wording."""
    breakdowns: Mapping[str, tuple[pd.DataFrame, pd.DataFrame]]
    """(bias, gap) per breakdown of :data:`analysis.cue.metrics.BREAKDOWNS` that has cells."""
    breakdown_pairs: pd.Series | None
    """Pairs per arm where neither Direct nor the headline arm ever changes a Neutral decision (the breakdown
    tables are degenerate; :func:`degenerate_pairs`); None: they change some."""
    sources: SourceAgreement | None
    """The other source, on a run with readouts and samples; else None."""


@dataclass(frozen=True)
class Status:
    """The status bias of the could-be probe (:func:`analysis.cue.identity.status_bias`)."""

    table: pd.DataFrame
    """``cue_status.csv``."""
    order: tuple[tuple[str, str], ...]
    low_coverage: pd.DataFrame
    """The could-be probe, when below the coverage floor."""


@dataclass(frozen=True)
class CueResults:
    """Everything the cue report of one run shows, computed once (:func:`cue_results`)."""

    root: Path
    manifest: Manifest
    spec: CueSpec
    plan: Plan
    source: str
    """Where the option probabilities come from (``readout`` or ``samples``)."""
    n_dilemmas: int
    coverage: pd.Series
    """Mean option coverage per probe."""
    abstentions: pd.Series | None
    """Trials without a parsed answer per probe (a sampled run); None: the run has no such count."""
    puzzles: Puzzles
    recovery: tuple[Recovery, ...]
    """The reading the correct-only tables use, then the alternative; empty: no identity checks."""
    decisions: Part[Decisions]
    status: Status | None


def cue_results(run: Run, *, n_boot: int = 1000, seed: int = 0) -> CueResults:
    """Compute every part of the cue report of ``run`` (``n_boot`` bootstrap draws over dilemmas, ``seed``)."""
    from experiments.cue import CueSpec

    man = run.manifest
    spec = man.spec_as(CueSpec)
    labels = attribute_labels(spec)
    options, per_trial, source = run.choice_probs()
    checks, id_source = identity_checks(run, options, per_trial, labels)
    return CueResults(
        root=run.root,
        manifest=man,
        spec=spec,
        plan=man.plan or Plan(),
        source=source,
        n_dilemmas=per_trial["item_id"].nunique(),
        coverage=per_trial.groupby("probe")["coverage"].mean(),
        abstentions=(per_trial["n_ok"] == 0).groupby(per_trial["probe"]).sum() if "n_ok" in per_trial.columns else None,
        puzzles=check_puzzles(spec, run.trial_list),
        recovery=compute_recovery(checks, id_source, options, per_trial, labels, seed),
        decisions=compute_decisions(run, options, per_trial, source, checks, labels, n_boot=n_boot, seed=seed),
        status=compute_status(options, per_trial, labels, n_boot=n_boot, seed=seed),
    )


def attribute_labels(spec: CueSpec) -> dict[str, tuple[str, ...]]:
    """The labels of each demographic attribute of a cue spec (the options of its identity checks)."""
    return {a.name: a.labels for a in spec.attributes()}


def check_puzzles(cue_spec: CueSpec, trials: Sequence[Trial]) -> Puzzles:
    """Regenerate the run's puzzles from its spec (for ``puzzles.jsonl``), checked against the stored prompts.

    Puzzles are a pure function of the spec, so they are not stored with the
    trials; the check guards against a changed generator or a moved dilemma file.
    """
    from experiments.cue import build_design
    from experiments.cue.puzzles import placeholder_binding

    try:
        design = build_design(cue_spec)
    except (ValueError, OSError) as e:  # untrusted input: the run's dilemma file, read again
        return Puzzles(error=str(e))
    attrs = cue_spec.attributes()
    items = {(it.dilemma.id, str(it.k)): it for it in design.items}
    seen: dict[str, Trial] = {}
    for t in trials:
        pid = t.factors.get("puzzle", "")
        if pid and pid not in seen and t.factors.get("condition") == "puzzled":  # FormalNamed binds other words
            seen[pid] = t
    rows, mismatched = [], []
    for level, bank in design.puzzles.items():
        for p in bank:
            rows.append(json.dumps(p.to_dict() | {"level": level, "skeleton": list(p.render(placeholder_binding()))}))
            first = seen.get(p.id)
            if first is not None:
                item = items.get((first.item_id, first.factors.get("combo", "")))
                lines = p.render(item.binding(attrs)) if item else ("?",)
                if not all(line in first.messages[-1].content for line in lines):
                    mismatched.append(p.id)
    return Puzzles(tuple(rows), tuple(mismatched))


def compute_recovery(
    checks: pd.DataFrame,
    id_source: str,
    options: pd.DataFrame,
    per_trial: pd.DataFrame,
    labels: Mapping[str, Sequence[str]],
    seed: int,
) -> tuple[Recovery, ...]:
    """Identity recovery from ``checks`` (read from ``id_source``) and, where that is the JSON of the could-be
    replies, from the check probe beside it (not used by the correct-only tables); empty without checks."""
    if checks.empty:
        return ()
    n_options = {a: len(v) for a, v in labels.items()}
    check_probes = [f"check_{a}" for a in n_options]

    def reading(frame: pd.DataFrame, source: str, used: bool) -> Recovery:
        low = flags.low_coverage(per_trial, check_probes) if source == "check" else None
        chances = tuple(flags.recovery_vs_chance(frame, n_options, seed=seed))
        return Recovery(source, used, solve_rates(frame).assign(source=source), chances, low)

    out = [reading(checks, id_source, True)]
    probe_checks = check_frame(options, per_trial) if id_source == "json" else checks.iloc[0:0]
    if not probe_checks.empty:  # the alternative reading beside the paper's
        out.append(reading(probe_checks, "check", False))
    return tuple(out)


def compute_decisions(
    run: Run,
    options: pd.DataFrame,
    per_trial: pd.DataFrame,
    source: str,
    checks: pd.DataFrame,
    labels: Mapping[str, Sequence[str]],
    *,
    n_boot: int,
    seed: int,
) -> Part[Decisions]:
    """The decision-bias readings (:data:`VARIANTS`, and correct-only on the recovered pairs where ``checks`` has
    any) and every table and flag beside them; absent without answered Neutral and what-if trials."""
    answered = per_trial["coverage"] > 0  # a sampled trial with no parsed answer is an abstention
    neutral_ok = (per_trial["condition"] == "neutral") & answered
    whatif_ok = (per_trial["probe"] == "what_if") & answered
    if not (neutral_ok.any() and whatif_ok.any()):
        return Part(absent="Decision bias needs answered Neutral and what-if trials; this run has none of one of them.")
    readings = {
        k: decision_bias(options, per_trial, decision=d, denominator=den, n_boot=n_boot, seed=seed)
        for k, (d, den) in VARIANTS.items()
    }
    how = dict(VARIANTS)
    if not checks.empty:
        keep = correct_only_keep(per_trial, checks)
        readings["correct-only"] = decision_bias(options, per_trial, keep=keep, n_boot=n_boot, seed=seed)
        how["correct-only"] = VARIANTS[HEADLINE]
    bias, gap = long_readings(readings, how, source)
    other = other_source(run, source, readings[HEADLINE], n_boot=n_boot, seed=seed)
    if other is not None:
        o_bias, o_gap = long_readings(other[0], how, other[1].sources[1])
        bias, gap = pd.concat([bias, o_bias], ignore_index=True), pd.concat([gap, o_gap], ignore_index=True)
    main_bias, main_gap = readings[HEADLINE]
    arms = tuple(dict.fromkeys(main_bias["arm"]))
    head = headline_of(arms)
    order = group_order(main_bias, labels)
    cons = tuple(c for c in ("with", "without") if c in set(main_bias["consequences"]))
    changes = flags.decision_changes(with_baseline(decision_frame(options, per_trial)))
    fig_arms = [a for a in dict.fromkeys((REFERENCE, head, "named")) if a is not None and a in arms]
    fig_bias = main_bias
    if "correct-only" in readings and head is not None and head != REFERENCE:
        solved = readings["correct-only"][0]
        fig_bias = pd.concat([main_bias, solved[solved["arm"] == head].assign(arm=f"{head} (solved only)")])
        fig_arms.insert(2, f"{head} (solved only)")
    wordings = None
    if "wording" in per_trial.columns and per_trial["wording"].fillna("").astype(str).ne("").any():
        wordings = wording_table(options, per_trial, n_boot=n_boot, seed=seed)
    breakdowns = {}
    for by in BREAKDOWNS:
        bb, bg = breakdown_tables(options, per_trial, by, n_boot=n_boot, seed=seed)
        if not bb.empty:
            breakdowns[by] = (bb, bg)
    stuck_pairs = None
    if head is not None and REFERENCE in arms and breakdowns:  # the breakdown tables need both arms
        stuck_pairs = degenerate_pairs(changes, head, cons[0])
    return Part(
        Decisions(
            readings=readings,
            bias=bias,
            gap=gap,
            arms=arms,
            head=head,
            order=order,
            consequences=cons,
            left_out={k: macro_left_out(b, g) for k, (b, g) in readings.items()},
            shares=formal_named_share(main_gap),
            changes=changes,
            stuck=flags.stuck_gaps(changes),
            low_coverage=flags.low_coverage(per_trial, ["decision", "what_if"]),
            figure_bias=fig_bias,
            figure_arms=tuple(fig_arms),
            wordings=wordings,
            breakdowns=breakdowns,
            breakdown_pairs=stuck_pairs,
            sources=other[1] if other is not None else None,
        )
    )


def compute_status(
    options: pd.DataFrame, per_trial: pd.DataFrame, labels: Mapping[str, Sequence[str]], *, n_boot: int, seed: int
) -> Status | None:
    """The status bias of the could-be probe, its groups in display order, its low coverage; None without it."""
    if not (per_trial["probe"] == "could_be").any():
        return None
    sb = status_bias(options, per_trial, n_boot=n_boot, seed=seed)
    if sb.empty:
        return None
    return Status(sb, group_order(sb, labels), flags.low_coverage(per_trial, ["could_be"]))


def long_readings(
    readings: Readings, how: Mapping[str, tuple[Decision, Denominator]], source: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The bias and gap tables of every reading one after the other, each row tagged with its ``source``, its
    reading and that reading's decision and denominator (``how``), and whether it is the headline."""

    def tag(frame: pd.DataFrame, k: str) -> pd.DataFrame:
        out = frame.assign(reading=k, decision=how[k][0], denominator=how[k][1], headline=k == HEADLINE)
        out.insert(0, "source", source)
        return out

    bias = pd.concat([tag(b, k) for k, (b, _) in readings.items()], ignore_index=True)
    gap = pd.concat([tag(g, k) for k, (_, g) in readings.items()], ignore_index=True)
    return bias, gap


def other_source(
    run: Run, source: str, headline: tuple[pd.DataFrame, pd.DataFrame], *, n_boot: int, seed: int
) -> tuple[Readings, SourceAgreement] | None:
    """On a run with readouts and samples: the readings of :data:`VARIANTS` from the source the report's tables
    did not use (``source`` is theirs, ``headline`` their headline reading), and where the two headlines
    disagree; None on a run with one source."""
    other = [s for s in run.sources if s != source]
    if not other:
        return None
    options, per_trial, o_src = run.choice_probs(other[0])
    readings = {
        k: decision_bias(options, per_trial, decision=d, denominator=den, n_boot=n_boot, seed=seed)
        for k, (d, den) in VARIANTS.items()
    }
    agreement = cue_agreement(headline, readings[HEADLINE], (source, o_src))
    return readings, SourceAgreement((source, o_src), headline, readings[HEADLINE], agreement, run_temperature(run))


def headline_of(arms: Sequence[str]) -> str | None:
    """The Puzzled arm the paper headlines: the hardest level present (else the first arm beside Direct)."""
    for lv in ("hard", "intermediate", "easy"):
        if f"puzzled-{lv}" in arms:
            return f"puzzled-{lv}"
    return next((a for a in arms if a != REFERENCE), None)


def group_order(bias: pd.DataFrame, labels: Mapping[str, Sequence[str]]) -> tuple[tuple[str, str], ...]:
    """The (attr, group) cells of ``bias`` in display order: the spec's labels per attribute, then the rest sorted
    (the macro row left out)."""
    present = set(bias[["attr", "group"]].itertuples(index=False, name=None))
    order = [(a, g) for a in ATTRS for g in labels.get(a, ()) if (a, g) in present]
    order += sorted(p for p in present if p not in order and p != MACRO)
    return tuple(order)


def degenerate_pairs(changes: pd.DataFrame, head: str, cons: str) -> pd.Series | None:
    """Pairs per arm (Direct, ``head``; ``cons`` consequences) when neither arm ever changes a Neutral greedy
    decision, so a breakdown's Favor, Against, Net and Gap are 0 or n/a by construction; else None."""
    sub = changes[(changes["consequences"] == cons) & changes["arm"].isin([REFERENCE, head])]
    if sub.empty or not sub["identical"].all():
        return None
    return sub[sub["attr"] == sub["attr"].iloc[0]].groupby("arm", sort=False)["pairs"].sum()


AGREE_COLS = {"bias": ("favor", "against", "net"), "gap": ("gap",)}
"""The cue's effects compared across sources: In-favor, Against, Net per arm and group, the Gap per arm and group."""


def cue_agreement(
    first: tuple[pd.DataFrame, pd.DataFrame], second: tuple[pd.DataFrame, pd.DataFrame], sources: tuple[str, str]
) -> pd.DataFrame:
    """Per (arm, consequences, attr, group) and effect (favor, against, net, gap; greedy decisions, eligible
    denominators): each source's value, the difference ``first - second`` with the SE ``hypot(sd_1, sd_2)`` of the
    two dilemma bootstraps (conservative: both sources answer the same dilemmas, so their errors correlate
    positively), a z test, and BH-FDR within each effect (the influence report's correction; the cue report had
    none), ``disagree``: q < 0.05."""
    from experiments.influence import stats as st

    parts = []
    for table, cols in AGREE_COLS.items():
        i = 0 if table == "bias" else 1
        m = first[i].merge(second[i], on=CELL, suffixes=("_1", "_2"))
        for col in cols:
            d = m[CELL].copy()
            d["effect"] = col
            d[sources[0]], d[sources[1]] = m[f"{col}_1"], m[f"{col}_2"]
            d["diff"] = m[f"{col}_1"] - m[f"{col}_2"]
            d["diff_se"] = np.hypot(m[f"sd_{col}_1"], m[f"sd_{col}_2"])
            d["p"] = st.z_pvalue(st.z_from_se(d["diff"], d["diff_se"]))
            d["q"] = st.bh_adjust(d["p"])
            parts.append(d)
    out = pd.concat(parts, ignore_index=True)
    out["disagree"] = out["q"] < 0.05
    return out
