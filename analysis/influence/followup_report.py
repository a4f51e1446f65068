"""``probe analyze`` of a follow-up run: the selection, the replies and, once coded, the crosstab and headline.

:func:`followup_results` computes what the report shows once, from the estimators of
:mod:`analysis.influence.followup` (a frozen :class:`FollowupResults`); :func:`followup_md` formats it into the
summary's lines and the CSV tables, :func:`stacked_figure` draws ``fig_followup_labels.png``, and
:func:`~analysis.common.report.write_report_files` writes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.figures import pyplot
from analysis.common.report import Body, Drawing, Files, Table
from analysis.influence.followup import (
    CODES,
    N_BOOT,
    SEED,
    answers,
    class_counts,
    crosstab,
    headline,
    load_codes,
    selection_table,
    table22,
    with_codes,
)
from analysis.influence.tables import table_section
from experiments.followup import FollowupSpec
from probe.record import Manifest, Plan
from probe.runs import Run


# ============================================================================= figures
def stacked_figure(shares: pd.DataFrame, counts: pd.DataFrame) -> Any:
    """Stacked bars: label shares per cell class (n per bar in the tick label)."""
    plt = pyplot()

    colors = {
        "ack_affected": "tab:orange",
        "ack_disclaimed": "tab:blue",
        "denied": "0.45",
        "partial": "tab:olive",
        "unclear": "0.85",
    }
    fig, ax = plt.subplots(figsize=(1.4 * len(shares) + 2.4, 3.6))
    x = np.arange(len(shares))
    bottom = np.zeros(len(shares))
    for code in CODES:
        vals = shares[code].fillna(0.0).to_numpy()
        ax.bar(x, vals, bottom=bottom, color=colors[code], label=code, width=0.6)
        bottom += vals
    ax.set_xticks(x, [f"{c}\n(n={int(counts.loc[c].sum())})" for c in shares.index])
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of follow-up replies")
    ax.set_title("follow-up self-report by source cell")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return fig


# ============================================================================= results
@dataclass(frozen=True)
class Coded:
    """What the judge's codes of the replies give (:mod:`analysis.influence.followup`)."""

    counts: pd.DataFrame
    """Labels per cell class (:func:`analysis.influence.followup.crosstab`): counts, cell class as the index."""
    shares: pd.DataFrame
    """The row shares of :attr:`counts`."""
    headline: pd.DataFrame
    """Every (class, code) share with its intervals (:func:`analysis.influence.followup.headline`)."""
    table22: pd.DataFrame
    """The paper's Table 22 rows of this run (:func:`analysis.influence.followup.table22`)."""
    judges: tuple[str, ...]
    uncoded: int
    """Replies the judge has not coded."""


@dataclass(frozen=True)
class FollowupResults:
    """Everything the follow-up report shows, computed once (:func:`followup_results`)."""

    root: Path
    manifest: Manifest
    spec: FollowupSpec
    plan: Plan
    """The run's plan (an empty one without sampled replies)."""
    n_boot: int
    selection: pd.DataFrame
    classes: pd.DataFrame
    answers: pd.DataFrame
    """One row per reply, the columns shown (with its label and judge once coded)."""
    coded: Coded | None
    """None: the replies are not coded yet."""


_ANSWER_COLS = ["trial_id", "draw", "cell", "cell_key", "item_id", "source_choice", "option", "status", "text"]


def followup_results(run: Run, *, n_boot: int = N_BOOT, seed: int = SEED) -> FollowupResults:
    """The selection and replies of a follow-up run and, once coded, the crosstab and headline."""
    ans = answers(run)
    selection, classes = selection_table(ans), class_counts(ans)
    shown = ans[[c for c in _ANSWER_COLS if c in ans.columns]]
    codes = load_codes(run)
    coded = None
    if codes is not None:
        joined = with_codes(ans, codes)
        counts, shares = crosstab(joined)
        coded = Coded(
            counts=counts,
            shares=shares,
            headline=headline(joined, n_boot=n_boot, seed=seed),
            table22=table22(joined, run.manifest.model, _benchmark(run)),
            judges=tuple(sorted(set(joined["judge"].dropna()))),
            uncoded=int((joined["label"] == "uncoded").sum()),
        )
        shown = joined[[*shown.columns, "label", "judge"]]
    man = run.manifest
    return FollowupResults(
        root=run.root,
        manifest=man,
        spec=man.spec_as(FollowupSpec),
        plan=man.plan or Plan(),  # no plan: no sampled replies
        n_boot=n_boot,
        selection=selection,
        classes=classes,
        answers=shown,
        coded=coded,
    )


def _benchmark(run: Run) -> str:
    """The source run's benchmark (``influence-bbq`` -> ``bbq``; ``?`` when the source is gone)."""
    from probe.store import RunStore

    for src in run.manifest.source_runs():
        try:
            exp = RunStore(src).manifest().experiment
        except (OSError, ValueError):
            continue
        return exp.split("-", 1)[1] if exp.startswith("influence-") else exp
    return "?"


# ============================================================================== report
def report(run: Run, *, n_boot: int = N_BOOT, seed: int = SEED) -> Body:
    """The follow-up report: selection, replies, and (when coded) the crosstab, headline and figure."""
    return followup_md(followup_results(run, n_boot=n_boot, seed=seed))


def followup_md(res: FollowupResults) -> Body:
    """The summary's lines and the report's files (the CSV tables, ``%.6g``; the figure once coded)."""
    tables = {"selection": res.selection, "classes": res.classes, "answers": res.answers}
    drawings: tuple[Drawing, ...] = ()
    if res.coded is not None:
        c = res.coded
        tables |= {
            "crosstab_counts": c.counts.reset_index(),
            "crosstab_shares": c.shares.reset_index(),
            "headline": c.headline,
            "table22_followup": c.table22,
        }
        if len(c.counts):
            drawings = (Drawing("fig_followup_labels.png", partial(stacked_figure, c.shares, c.counts)),)
    files = Files({stem: Table(t, float_format="%.6g") for stem, t in tables.items()}, drawings)
    return _summary(res, [d.name for d in drawings]), files


def _summary(res: FollowupResults, figures: list[str]) -> list[str]:
    """The summary: the run, the cells and the selection, then the coding (how to code, or the headline and
    the crosstab), then the ``figures``."""
    man, spec, plan = res.manifest, res.spec, res.plan
    draws = f"{plan.samples} sampled replies per trial at T = {plan.temperature}"
    lines = [
        f"# Follow-up self-report probe: {man.model}",
        "",
        f"- run: `{res.root}`, {man.n_trials} follow-up trials, run key `{man.run_key}`",
        f"- source: `{spec.source}` (run key `{spec.source_run_key}`); cells: "
        f"{', '.join(spec.select)}, up to {spec.per_cell} first answers per cell "
        f"(seed {spec.seed}); significance: {spec.significance}",
        f"- replies: {draws if plan.samples else 'one greedy reply per trial'}",
        "- each trial is the source conversation, the model's own first answer kept (exact token ids where the source "
        "stored them), and the follow-up question; cell = the class of the source effect (condition x cue direction).",
        "",
        *table_section("## Cells", res.classes),
        "said_yes / said_no: a crude reading of the reply (it says Yes / No); the codes below are the measurement.",
        "",
    ]
    sel = res.selection
    lines += table_section("## Selection (per cell)", sel.head(40))
    if len(sel) > 40:
        lines += [f"(first 40 of {len(sel)}; all in selection.csv)", ""]
    coded = res.coded
    if coded is None:
        lines += [
            "## Coding",
            "",
            "No codes yet. Code the replies with a judge, then re-run the report:",
            "",
            f"    probe code {res.root} --task followup --judge MODEL",
            f"    probe analyze {res.root}",
            "",
        ]
    else:
        head = coded.headline
        main = head[(head["cell"] == "backfire") & (head["label"] == "ack_disclaimed")]
        lines += ["## Stated vs revealed", ""]
        if len(main) and main["n"].iloc[0] > 0:
            r = main.iloc[0]
            boot = (
                f"; cluster bootstrap over {int(r['items'])} source items [{r['boot_lo']:.3f}, {r['boot_hi']:.3f}]"
                if not math.isnan(r["boot_lo"])
                else ""
            )
            lines += [
                f"Significant-backfire replies coded **ack_disclaimed** (cue named, effect denied): "
                f"{int(r['k'])}/{int(r['n'])} = {r['share']:.3f}, Wilson 95% [{r['wilson_lo']:.3f}, "
                f"{r['wilson_hi']:.3f}]{boot}; mean judge probability {r['soft']:.3f}.",
                "",
            ]
        else:
            lines += ["No coded reply comes from a significant-backfire cell.", ""]
        lines += [
            f"Judge: {', '.join(coded.judges) or '?'}; uncoded replies: {coded.uncoded}. Bootstrap: {res.n_boot} replicates.",
            "",
            *table_section("### Labels per cell class (counts)", coded.counts.reset_index()),
            *table_section("### Labels per cell class (shares)", coded.shares.reset_index()),
            "Paper 000 Table 22 (labels of the replies per class of the source condition: significant backfire, "
            "significant compliance, ...): `table22_followup.csv`, one row per class labelled with the model and "
            "benchmark, so several runs' files stack into the paper's table.",
            "",
        ]
    if figures:
        lines += ["Figures: " + ", ".join(f"`{f}`" for f in figures), ""]
    return lines
