"""The influence audit's reports (paper 000): the Markdown summary, CSV tables and figures of one run, of an
imported run (``probe import``), and the Markdown of the |Asym| fits.

Every number comes from the run's results, computed once
(:func:`analysis.influence.results.influence_results`,
:func:`~analysis.influence.results.imported_results`); the functions here only
format them into Markdown lines and :class:`~analysis.common.report.Table` s,
the figure functions only draw (they return the figure), and
:func:`~analysis.common.report.write_report_files` writes every file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.battery.calibration import temperature_lines
from analysis.common.figures import pyplot
from analysis.common.report import Body, Drawing, Files, Table
from analysis.common.tables import long_tables, md_table
from analysis.influence import flags, paper000_report
from analysis.influence.arms import ARM_SECTIONS, step_lines
from analysis.influence.asym import FORMULA, AsymFit
from analysis.influence.audit import Audit
from analysis.influence.coding_report import coded_md
from analysis.influence.rationales_report import rationales_md
from analysis.influence.results import (
    SIDE_COLS,
    Flags,
    ImportedResults,
    InfluenceResults,
    SourceResults,
    Variance,
    imported_results,
    influence_results,
)
from analysis.influence.tables import table_md, table_section
from experiments.influence.effects import ALPHA, BENCHMARKS, N_BOOT, SEED
from probe.record import Plan
from probe.runs import Run


def influence_report(run: Run | str | Path, benchmark: str, *, n_boot: int = N_BOOT, seed: int = SEED) -> Body:
    """The influence audit report of one run: its summary lines, CSV tables and PNG figures.

    A run with readouts and samples is analysed from each (:func:`analysis.influence.audit.analyze_sources`):
    the CSVs hold both in long form (``source``), the summary shows the readout report, then both side by
    side with the readout temperature and where the two disagree (:func:`sources_md`).
    """
    return influence_md(influence_results(run, benchmark, n_boot=n_boot, seed=seed))


def influence_md(res: InfluenceResults) -> Body:
    """The summary's lines and the report's files: the first source's report, both sources side by side (a run
    with two), then the coded traces (a coded run)."""
    drawings = figures(res.sources[0].audit)
    tables = long_tables([(s.audit.source, s.tables) for s in res.sources])
    side: list[str] = []
    if res.sides is not None:
        tables["source_agreement"] = res.sides.agreement
        tables["calibration_T"] = res.sides.temperature
        side = sources_md(res)
    coded, coded_files = coded_md(res.coded)
    rat, rat_files = rationales_md(res.rationales)
    lines = [*summary_md(res, res.sources[0], [d.name for d in drawings]), *side, *coded, *rat]
    lines += paper000_report.paper000_md(res.sources[0].tables)  # names its own figure
    drawings += paper000_report.figures(res.sources[0].tables)
    files = Files({stem: Table(t, float_format="%.6g") for stem, t in tables.items()}, drawings) + coded_files
    files += rat_files
    return lines, files


# ============================================================================ figures
def conditions_figure(g: pd.DataFrame, title: str) -> Any:
    """f_A(B), f_0(B) and f_B(B) of each condition of one pair (rows of the condition table ``g``)."""
    plt = pyplot()

    places = g.groupby("influence")[["position", "bracket"]].apply(lambda x: len(x.drop_duplicates()))
    labels = [  # the place is shown only where the user crossed several
        r.influence
        + ("" if r.variant == "cue" else f" ({r.variant})")
        + (f" @{r.position}/{r.bracket}" if places[r.influence] > 1 else "")
        for r in g.itertuples()
    ]
    height = 0.4 * len(g) + 1.6
    fig, ax = plt.subplots(figsize=(7, height))
    y = np.arange(len(g))[::-1]
    ax.hlines(y, g["fA_B"], g["fB_B"], color="0.75", lw=2, zorder=1)
    ax.scatter(g["fA_B"], y, marker="<", color="tab:blue", label="cue toward A: f_A(B)", zorder=2)
    ax.scatter(g["f0_B"], y, marker="|", s=200, color="black", label="no cue: f_0(B)", zorder=3)
    ax.scatter(g["fB_B"], y, marker=">", color="tab:orange", label="cue toward B: f_B(B)", zorder=2)
    ax.axvline(0.5, color="0.85", lw=1, ls="--", zorder=0)
    ax.set_yticks(y, labels)
    ax.set_ylim(-0.7, len(g) - 0.3)
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel(f"share choosing B ({g['group_b'].iloc[0]}) over A ({g['group_a'].iloc[0]})")
    ax.set_title(title)
    fig.legend(loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.35 / height, 1, 1))
    return fig


def steerability_figure(main: pd.DataFrame) -> Any:
    """s(A) against s(B) of the main-cue conditions ``main``, one colour per influence type."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5, 5))
    for infl, g in main.groupby("influence", sort=False):
        ax.scatter(g["s_A"], g["s_B"], label=infl, s=18)
    lim = float(np.nanmax(np.abs(main[["s_A", "s_B"]].to_numpy()))) * 1.1 or 1.0
    ax.plot([-lim, lim], [-lim, lim], color="0.7", lw=1, ls="--")
    ax.axhline(0, color="0.85", lw=1)
    ax.axvline(0, color="0.85", lw=1)
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_xlabel("s(A): steerability toward A (log-odds)")
    ax.set_ylabel("s(B): steerability toward B (log-odds)")
    ax.set_title("above the diagonal: easier to steer toward B")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def figures(audit: Audit, max_pairs: int = 12) -> tuple[Drawing, ...]:
    """The report's figures of one source's audit: the conditions of each of the first ``max_pairs`` pairs, and
    the steerabilities of the main cues."""
    c = audit.conditions
    drawings = [
        Drawing(
            f"fig_conditions_{i:02d}_{_slug(pair)}.png",
            partial(conditions_figure, g.reset_index(drop=True), f"{BENCHMARKS[audit.benchmark]}: {pair}"),
        )
        for i, (pair, g) in enumerate(c.groupby("pair", sort=False))
        if i < max_pairs
    ]
    main = c[c["variant"] == "cue"]
    if len(main):
        drawings.append(Drawing("fig_steerability.png", partial(steerability_figure, main)))
    return tuple(drawings)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in text)[:40]


_SHOW = ["pair", "influence", "n_items", "f0_B", "fA_B", "fB_B", "delta_A", "delta_B", "s_A", "s_B", "asym"]
_SIDE_HEAD = (
    "mean |shift| (pp), all cues",
    "effects with significant shift (raw)",
    "effects with significant shift (BH-FDR)",
    "backfire share of significant effects (raw)",
    "conditions with significant asymmetry (raw)",
    "conditions with significant asymmetry (BH-FDR)",
)


def sources_md(res: InfluenceResults) -> list[str]:
    """The summary's side-by-side section of a run with readouts and samples: the readout temperature, the headline
    and the main-cue effects of both sources, and where they disagree beyond their intervals."""
    assert res.sides is not None, "a run with two sources has them side by side"
    plan = res.manifest.plan or Plan()
    agreement, both = res.sides.agreement, res.sides.main
    lines = [
        "## Readouts and samples side by side",
        "",
        f"This run holds answer-slot readouts and {plan.samples} sampled answers per trial at "
        f"tau = {plan.temperature}: every effect is computed from each (`source` in the CSVs). The readout "
        "log-odds take no pseudo-count, the sampled ones the paper's 1/2 per cell. A readout probability is the "
        "untempered softmax, so the two agree where sampling at tau draws from softmax(logits / tau): the readout "
        "temperature T below is 1 there (T = fitted temperature / tau, on the trials that have both; 95% "
        "profile-likelihood interval).",
        "",
    ]
    lines += temperature_lines(res.sides.temperature)
    head = [s.tables["headline"].set_index("metric")["value"] for s in res.sources]
    rows = [{"metric": m, "readout": head[0].get(m), "samples": head[1].get(m)} for m in _SIDE_HEAD]
    lines += ["", "Headline, main cues:", "", table_md(pd.DataFrame(rows)), ""]
    show = both[["pair", "influence"]].copy()
    for col in SIDE_COLS:
        show[f"{col} r"], show[f"{col} s"] = both[f"{col}_r"], both[f"{col}_s"]
    lines += table_section("### Main-cue conditions (r: readouts, s: samples)", show.head(60))
    paired = bool(agreement["paired"].all()) if len(agreement) else True
    dis = agreement[agreement["disagree"]]
    lines += [
        "### Where the sources disagree",
        "",
        "Per condition and effect, readout minus samples with its 95% "
        + (
            "**paired** bootstrap interval (one item resample reweights both sources; expanded for few item "
            "clusters) and t test on its standard error"
            if paired
            else "interval and z test on its standard error"
        )
        + ", BH-FDR within benchmark x variant x family (shift, steerability, "
        f"asymmetry), as the report's own tests. {len(dis)} of {len(agreement)} comparisons disagree (q < {ALPHA}); "
        "all in `source_agreement.csv`.",
        "",
    ]
    if len(dis):
        cols = ["pair", "influence", "variant", "metric", "readout", "samples", "diff", "diff_lo", "diff_hi", "q"]
        lines += [table_md(dis[cols].head(40)), ""]
    return lines


def flags_md(f: Flags, source: str = "readout") -> list[str]:
    """The flags above the headline: tie in every condition, position / label following, significant but small.

    The practical size of the shifts is always stated; the other lines appear only when they apply.
    """
    lines = [*flags.tie_lines(f.tie), *flags.following_lines(f.following)]
    lines += flags.practical_lines(f.sig, f.size, source)
    lines.append(
        f"- practical size beside the significance shares: {flags.practical_note(f.size)} (practical threshold "
        f"{100 * flags.PRACTICAL_SHIFT:g} pp; {100 * f.sig:.0f}% of effects significant, raw)"
        if f.effects and not math.isnan(f.sig)
        else "- no effects to size"
    )
    return lines


def summary_md(res: InfluenceResults, src: SourceResults, figures: Sequence[str]) -> list[str]:
    """The summary of one source's audit ``src`` of the run: what it rests on, the flags and the headline, the
    tables by influence, pair and condition, the controls, and the ``figures``."""
    audit, tables = src.audit, src.tables
    c = audit.conditions
    checks = flags_md(src.flags, audit.source)
    lines = _summary_head(res, audit)
    lines += [
        "",
        "## Headline",
        "",
        *checks,
        *([""] if checks else []),
        table_md(tables["headline"]),
        "",
    ]
    lines += _order_section(tables["order_readouts"])
    lines += table_section("## By influence type", tables["by_influence"])
    lines += table_section("## By pair (factor / sub-experiment / value)", tables["by_pair"])
    lines += table_section("## Conditions (main cues)", c[c["variant"] == "cue"][_SHOW].head(60))
    if len(c[c["variant"] == "cue"]) > 60:
        lines += [f"(first 60 of {int((c['variant'] == 'cue').sum())}; all in conditions.csv)", ""]
    lines += _noise_section(tables["noise_floor"], audit.source)
    for key, title in (
        ("controls_placebo", "Placebo cues (irrelevant, same form)"),
        ("controls_negated", "Negated cues"),
        ("flip_rates", "Sample-level flip rates"),
        *ARM_SECTIONS,
    ):
        if key in tables:
            lines += table_section(f"## {title}", tables[key])
    lines += table_section("## Response quality", tables["response_quality"])
    if figures:
        lines += [
            "Figures (f_A(B), f_0(B), f_B(B) per condition; s(A) vs s(B)): " + ", ".join(f"`{f}`" for f in figures),
            "",
        ]
    return lines


def _summary_head(res: InfluenceResults, audit: Audit) -> list[str]:
    """The summary's title and what it rests on: the run, its conditions, how frequencies and tests are taken."""
    man = res.manifest
    plan = man.plan or Plan()
    c = audit.conditions
    name = BENCHMARKS[audit.benchmark]
    if audit.source == "readout":
        basis = (
            "Probabilities come from **answer-slot readouts** (one per prompt, no counts): a cell frequency is "
            "the mean option probability over the prompts, its log-odds the logit of that mean with **no "
            "pseudo-count** (no sampling noise inside a prompt to temper), and every test is a z test on the "
            f"**bootstrap standard error over prompts** ({res.n_boot} cluster-bootstrap replicates of the items), "
            "not a binomial test."
        )
    else:
        basis = (
            f"Frequencies are **sampled answers** ({plan.samples} per trial at T = {plan.temperature}; "
            "refusals and unparseable answers left out, see response quality). Tests on counts: exact binomial "
            "for f0(B) = 1/2, pooled two-proportion z for each shift, Wald z for Asym (baseline variance counted "
            f"four times); CIs from {res.n_boot} cluster-bootstrap replicates of the items."
        )
    lines = [
        f"# Influence audit, {name}: {audit.info['model']}",
        "",
        f"- run: `{res.root}`, {man.n_trials} trials, run key `{man.run_key}`",
        f"- reasoning (think mode): {audit.info['think']}; conditions: {len(c)} "
        f"({(c['variant'] == 'cue').sum()} main cues, {(c['variant'] != 'cue').sum()} controls); "
        f"pairs: {c['pair'].nunique()}; influence types: {', '.join(dict.fromkeys(c['influence']))}",
        f"- {basis}",
        "- f_c(B): share choosing side B with no cue (0), the cue toward A, the cue toward B. shift = Delta_d = "
        f"f_d(d) - f_0(d); s(d) = log-odds shift toward d ({_rule(audit, res.clip)}); Asym = s(B) - s(A); "
        "backfire: s(d) < 0. BH-FDR within benchmark x variant x test family.",
        *_clip_lines(audit),
    ]
    lines += step_lines(audit.cells)
    if audit.benchmark == "dd":
        lines.append(
            "- DailyDilemmas conditions are per value: A = the option whose primary value it is, B = the other "
            "option of the same dilemma."
        )
    return lines


def _order_section(orders: pd.DataFrame) -> list[str]:
    """Readouts by printed order (none where the source has no readouts)."""
    if not len(orders):
        return []
    confounded = bool(orders["confounded"].iloc[0])
    return [
        "## Readouts by printed order",
        "",
        f"Mean P(first-printed option), mean P(label {orders['label'].iloc[0]}) and mean P(side B) per arm and "
        "printed order (main cues). A readout that follows the position reads P(first printed) on the same side "
        f"of 1/2 in both orders (flagged from {flags.FOLLOW_MARGIN:g} away)"
        + (
            "; label and position coincide here (the same label is printed first in every trial)."
            if confounded
            else "."
        ),
        "",
        table_md(orders.drop(columns=["label", "confounded"])),
        "",
    ]


def _noise_section(noise: pd.DataFrame, source: str) -> list[str]:
    """The baseline re-run's noise floor (none where there was no re-run)."""
    lines: list[str] = []
    if len(noise):
        lines += table_section("## Noise floor (baseline re-run)", noise)
        if source == "readout" and float(noise["abs_diff"].max()) == 0.0:
            lines += [
                "A readout is deterministic, so an unsalted re-run is identical; use --rerun-salt for a floor.",
                "",
            ]
    return lines


def _rule(audit: Audit, clip: float) -> str:
    """How this source's log-odds are taken (the summary's definition line); ``clip``: the run's readout clip."""
    if audit.source != "readout":
        return "+1/2 continuity correction"
    return f"logit of the mean probability, no pseudo-count; clipped within {clip:.2g} of 0 or 1"


def _clip_lines(audit: Audit) -> list[str]:
    """One line when a readout cell's mean probability was clipped (its s is then a bound, not a measurement)."""
    c = audit.conditions
    if "clipped" not in c.columns:
        return []
    hit = c["clipped"].fillna("").astype(str) != ""
    if not hit.any():
        return []
    return [
        f"- **clipped**: {int(hit.sum())} condition(s) have a mean probability within the clip of 0 or 1 (column "
        "`clipped` names the arms); their s is a bound set by the run's resolution, not a measured shift."
    ]


def asym_md(fits: Sequence[AsymFit], headline: str) -> list[str]:
    """The regression section: both random-effect structures, the |bias|-alone share, convergence."""

    lines = [
        f"`{FORMULA}` per benchmark; the pooled fit adds benchmark offsets (`+ C(benchmark)`). REML by statsmodels "
        "MixedLM. **crossed** (the paper's text): random intercepts for model x reasoning, factor "
        "(benchmark:pair) and influence type, as variance components of one group "
        "(`groups=1, re_formula='0', vc_formula={model_reasoning, factor, influence}`). **nested** (the paper's "
        "code): a random intercept per model x reasoning group, with factor and influence intercepts within each "
        "group (`groups=model_reasoning, re_formula='1', vc_formula={factor, influence}`). "
        f"Headline structure: **{headline}** (`--asym-model`). Marginal R² = var(X β) / (var(X β) + Σ σ²_vc + σ²_ε) "
        "(Nakagawa & Schielzeth 2013; var with ddof 1); R² |bias| alone = var(β |bias|) / the same total "
        "(without the benchmark offsets); conditional R² adds Σ σ²_vc to the numerator. **beta's 95% CI** "
        "(`beta_lo`, `beta_hi`) and `p_beta`: Wald, from the GLS covariance (X' V⁻¹ X)⁻¹ at the REML optimum (OLS: "
        "its t interval), not statsmodels' `conf_int`, whose full observed Hessian widens the interval about 1.6x "
        "when a variance component is near zero. `attempts` lists each optimizer run with its REML "
        "log-likelihood (statsmodels' default, which tries bfgs, lbfgs, cg; powell; nm) and which was kept "
        "(the highest log-likelihood among the converged), `warnings` every warning of the fit.",
        "",
    ]
    table = pd.DataFrame([f.row() for f in fits])
    if len(table):
        cols = ["scope", "structure", "method", "n", "beta", "beta_lo", "beta_hi", "r2_marginal", "r2_bias"]
        cols += ["r2_conditional", "converged", "attempts", "warnings", "note"]
        lines += [md_table(table[cols], nan="–"), ""]
    return lines


# ============================================================================ imported run
def imported_report(run: Run) -> Body:
    """The report of an imported run: the native report's tables from counts, and the |Asym| fits.

    No item-level bootstrap (condition-level data has no items): the headline
    CIs come from a cluster bootstrap over (model x reasoning, factor) clusters.
    """
    res = imported_results(run)
    p_lines, p_files = paper000_report.imported_section(res.paper000)
    return [*imported_md(res), *p_lines], imported_files(res) + p_files


def imported_files(res: ImportedResults) -> Files:
    """The imported run's CSV tables (``%.6g``)."""
    tables = {
        "conditions": res.conditions,
        "effects": res.effects,
        "headline": res.panel["headline"],
        "by_influence": res.panel["by_influence"],
        "by_pair": res.panel["by_pair"],
        "by_model": res.panel["by_model"],
        "asym_regression": pd.DataFrame([f.row() for f in res.fits]),
        "asym_regression_data": res.asym_data,
        "ambiguous": res.ambiguous,
    }
    return Files({stem: Table(t, float_format="%.6g") for stem, t in tables.items()})


def imported_md(res: ImportedResults) -> list[str]:
    """The imported run's summary: where the numbers come from, the headline, the per-model and per-influence
    tables, the |Asym| fits and the ambiguous rows."""
    prov, cond, panel = res.provenance, res.conditions, res.panel
    lines = [
        "# Influence audit, imported per-condition results",
        "",
        f"- run: `{res.root}` (**imported**: {prov.source}, sha256 `{str(prov.source_sha256)[:16]}`, "
        f"imported {prov.imported_at})",
        f"- rows: {prov.rows}; imported {prov.imported_rows}; ambiguous (left out, `ambiguous.csv`): "
        f"{len(prov.ambiguous_rows)}"
        + (f" (lines {', '.join(map(str, prov.ambiguous_rows))})" if prov.ambiguous_rows else ""),
        f"- {len(cond)} conditions ({res.variance.conditions} main cues) over {cond['run'].nunique()} model x "
        f"reasoning runs; benchmarks {', '.join(dict.fromkeys(cond['benchmark']))}",
        "- Tests on counts: exact binomial for f0(B) = 1/2, pooled two-proportion z for each shift, Wald z for Asym "
        "(baseline variance counted four times); BH-FDR within benchmark x variant x test family.",
        "- **Condition-level data: no item-level bootstrap** (there are no items to resample; it would be "
        "degenerate), so per-condition CIs are not given. Headline CIs: cluster bootstrap "
        f"({N_BOOT} draws, seed {SEED}) over (model x reasoning, factor) clusters.",
        "",
        "## Headline per benchmark",
        "",
        table_md(panel["headline"][["benchmark", "metric", "value", "ci_lo", "ci_hi", "note"]]),
        "",
        *_variance_lines(res.variance),
        *table_section("## Per model and reasoning mode (main cues)", panel["by_model"]),
        *table_section("## By influence type", panel["by_influence"]),
        "## |Asym| against |baseline bias|",
        "",
        *asym_md(res.fits, "crossed"),
    ]
    if len(res.ambiguous):
        lines += table_section("## Ambiguous rows (left out)", res.ambiguous)
    return lines


def _variance_lines(v: Variance) -> list[str]:
    """How many main-cue conditions the baseline-twice variance calls significant that the correct one does not."""
    return [
        f"Wald test of Asym: {v.four} of {v.conditions} main-cue conditions significant at 0.05 with the baseline "
        f"variance counted four times (correct: `p_asym`); {v.twice} with it counted twice (`p_asym_2x`, "
        f"s(A) and s(B) treated as independent); {v.twice_only} are significant only under the latter.",
        "",
    ]
