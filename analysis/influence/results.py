"""The computed parts of the influence audit's reports (paper 000): what each shows, computed once.

Computation apart from presentation (scikit-learn's estimators compute, its
Displays only draw): :func:`influence_results` reads one run and computes
every number of :func:`analysis.influence.report.influence_report` once (each
source's audit and its tables, the flags above its headline, the two sources
side by side, the coded traces) into a frozen :class:`InfluenceResults`;
:func:`imported_results` does the same for an imported run
(:class:`ImportedResults`). The estimators are :mod:`analysis.influence.audit`,
:mod:`analysis.influence.flags`, :mod:`analysis.influence.asym`,
:mod:`analysis.influence.imported` and :mod:`analysis.influence.coding`; the
report's sections only format what is here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.influence import arms, flags, paper000_tables
from analysis.influence.asym import AsymFit, asym_fits, asym_frame
from analysis.influence.audit import (
    Audit,
    analyze_sources,
    combine_runs,
    headline,
    negation_match,
    panel_tables,
    placebo_gap,
    response_quality,
    share,
    source_agreement,
    summary_by,
)
from analysis.influence.coding import CodedTask, coded_tasks
from analysis.influence.imported import ambiguous_frame, imported_conditions
from analysis.influence.rationales import RationaleTables, rationales_of
from experiments.influence.effects import ALPHA, N_BOOT, SEED, effects, run_clip
from probe.record import Manifest, Provenance
from probe.runs import Run, as_run


# ============================================================================ one run
@dataclass(frozen=True)
class Flags:
    """What the flags above a source's headline read (:mod:`analysis.influence.flags`): the tie, position or
    label following, and the practical size beside the share of significant effects (main cues)."""

    tie: flags.Tie
    following: flags.Following | None
    size: flags.Practical
    """The practical size of the main-cue shifts."""
    sig: float
    """The share of main-cue effects significant (raw)."""
    effects: int
    """The main-cue effects (condition x direction)."""


def readout_flags(main: pd.DataFrame, orders: pd.DataFrame, alpha: float = ALPHA) -> Flags:
    """The flags of the main-cue condition table ``main`` and its per-order readouts ``orders``
    (:func:`analysis.influence.flags.order_readouts`)."""
    eff = effects(main, alpha)
    return Flags(
        tie=flags.tie_readout(main),
        following=flags.following(orders),
        size=flags.practical_size(eff["delta"]),
        sig=share(eff["sig"]),
        effects=len(eff),
    )


@dataclass(frozen=True)
class SourceResults:
    """One source's audit (readouts or samples) and the report's tables and flags of it."""

    audit: Audit
    tables: Mapping[str, pd.DataFrame]
    """The report's tables of this source by CSV stem (:func:`source_tables`)."""
    flags: Flags


def source_tables(audit: Audit) -> dict[str, pd.DataFrame]:
    """The report's tables of one source's audit (the one-source report's tables, as they always were)."""
    c = audit.conditions
    main = c[c["variant"] == "cue"]
    tables: dict[str, pd.DataFrame] = {
        "conditions": c,
        "effects": effects(c),
        "headline": headline(c, audit.delta_reps, audit.noise),
        "by_influence": summary_by(main, "influence"),
        "by_pair": summary_by(main, "pair"),
        "by_model": summary_by(main, ["model", "think"]),
        "noise_floor": audit.noise,
        "response_quality": response_quality(audit.cells, audit.source),
        "order_readouts": flags.order_readouts(audit.cells),
    }
    if (c["variant"] == "placebo").any():
        tables["controls_placebo"] = placebo_gap(c)
    if (c["variant"] == "negated").any():
        tables["controls_negated"] = negation_match(c)
    if audit.flips is not None:
        tables["flip_rates"] = audit.flips
    tables.update(paper000_tables.source_tables(audit))  # paper 000's appendix tables (Table 21, I.9, I.12, ...)
    tables.update(arm_tables(c))
    return tables


def arm_tables(c: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The tables of paper 000's extra arms, only where the run holds them (:mod:`analysis.influence.arms`)."""
    out: dict[str, pd.DataFrame] = {}
    if (c["variant"] == arms.RANDOM).any():
        out["controls_random"] = arms.random_contexts(c)
        out["table17_random"] = arms.table17(c)
    if arms.has_paraphrases(c):
        out["by_wording"] = arms.by_wording(c)
    return out


def source_results(audit: Audit) -> SourceResults:
    tables = source_tables(audit)
    c = audit.conditions
    return SourceResults(audit, tables, readout_flags(c[c["variant"] == "cue"], tables["order_readouts"]))


SIDE_COLS = ("delta_A", "delta_B", "s_A", "s_B", "asym", "n_asym")
"""The main-cue effects shown for both sources side by side."""


@dataclass(frozen=True)
class Sides:
    """A run with readouts and samples, both sources side by side."""

    agreement: pd.DataFrame
    """Where the sources disagree (:func:`analysis.influence.audit.source_agreement`)."""
    temperature: pd.DataFrame
    """The readout temperature (:func:`analysis.battery.calibration.run_temperature`)."""
    main: pd.DataFrame
    """The main-cue conditions both sources hold: the condition columns, then :data:`SIDE_COLS` of the readouts
    (suffix ``_r``) and of the samples (``_s``)."""


def sides(run: Run, readout: Audit, samples: Audit) -> Sides:
    from analysis.battery.calibration import run_temperature
    from experiments.influence import COND

    keys = list(COND)
    r, s = readout.conditions, samples.conditions
    main_r, main_s = r[r["variant"] == "cue"], s[s["variant"] == "cue"]
    both = main_r[[*keys, *SIDE_COLS]].merge(main_s[[*keys, *SIDE_COLS]], on=keys, suffixes=("_r", "_s"))
    return Sides(source_agreement(readout, samples), run_temperature(run), both)


@dataclass(frozen=True)
class InfluenceResults:
    """Everything the influence report of one run shows, computed once (:func:`influence_results`)."""

    root: Path
    manifest: Manifest
    n_boot: int
    clip: float
    """The clip of the run's readout log-odds (:func:`experiments.influence.effects.run_clip`)."""
    sources: tuple[SourceResults, ...]
    """Per source the run holds, readouts first; the report is the first's."""
    sides: Sides | None
    """Both sources side by side (a run with readouts and samples); None for a run with one."""
    coded: tuple[CodedTask, ...]
    """The coded reasoning traces (``probe code``) of the first source's effects; empty when uncoded."""
    rationales: RationaleTables | None = None
    """Every rationale the traces state (``probe code --task rationales``; paper 000 K.3-K.5, L); None: not coded."""


def influence_results(
    run: Run | str | Path, benchmark: str, *, n_boot: int = N_BOOT, seed: int = SEED
) -> InfluenceResults:
    """Analyse an influence run of ``benchmark`` from each source it holds
    (:func:`analysis.influence.audit.analyze_sources`) and compute what its report shows."""
    run = as_run(run)
    audits = analyze_sources(run, benchmark, n_boot=n_boot, seed=seed)
    per_source = tuple(source_results(a) for a in audits)
    return InfluenceResults(
        root=run.root,
        manifest=run.manifest,
        n_boot=n_boot,
        clip=run_clip(run),
        sources=per_source,
        sides=sides(run, audits[0], audits[1]) if len(audits) == 2 else None,
        coded=coded_tasks(run, per_source[0].tables["effects"]),
        rationales=rationales_of(run),
    )


# ============================================================================ imported run
@dataclass(frozen=True)
class Variance:
    """How the variance of Asym changes its Wald test: main-cue conditions significant at 0.05 with the baseline
    counted four times (correct), twice, and under the latter only."""

    conditions: int
    four: int
    twice: int
    twice_only: int


def variance_counts(main: pd.DataFrame) -> Variance:
    sig4, sig2 = main["p_asym"] < 0.05, main["p_asym_2x"] < 0.05
    return Variance(len(main), int(sig4.sum()), int(sig2.sum()), int((sig2 & ~sig4).sum()))


@dataclass(frozen=True)
class ImportedResults:
    """Everything the report of an imported run shows, computed once (:func:`imported_results`)."""

    root: Path
    provenance: Provenance
    conditions: pd.DataFrame
    """The run's conditions, from counts, FDR within benchmark x variant x family."""
    effects: pd.DataFrame
    panel: Mapping[str, pd.DataFrame]
    """:func:`analysis.influence.audit.panel_tables` of the conditions."""
    fits: tuple[AsymFit, ...]
    asym_data: pd.DataFrame
    ambiguous: pd.DataFrame
    """The rows ``probe import`` left out as ambiguous (``ambiguous.csv``)."""
    variance: Variance
    paper000: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    """Paper 000's appendix tables of the conditions (:func:`analysis.influence.paper000_tables.imported_tables`)."""


def imported_results(run: Run) -> ImportedResults:
    """The conditions of an imported run from its counts, the tables of a native report and the |Asym| fits."""
    cond = combine_runs([imported_conditions(run, label=run.root.name)])
    amb_path = run.root / "ambiguous.csv"
    return ImportedResults(
        root=run.root,
        provenance=run.manifest.provenance or Provenance.from_dict({}),
        conditions=cond,
        effects=effects(cond),
        panel=panel_tables(cond),
        fits=tuple(asym_fits(cond)),
        asym_data=asym_frame(cond),
        ambiguous=pd.read_csv(amb_path) if amb_path.exists() else ambiguous_frame(()),
        variance=variance_counts(cond[cond["variant"] == "cue"]),
        paper000=paper000_tables.imported_tables(cond),
    )
