"""``probe analyze`` of a follow-up run: the selection, the replies and, once coded, the crosstab and headline.

Writes ``summary.md``, the CSV tables and ``fig_followup_labels.png`` from the
estimates of :mod:`analysis.influence.followup`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.common.figures import pyplot, save_figure
from analysis.common.report import report_files, write_summary, write_tables
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
    with_codes,
)
from analysis.influence.tables import table_section
from probe.record import Plan
from probe.runs import Run


# ============================================================================= figures
def stacked_figure(shares: pd.DataFrame, counts: pd.DataFrame, path: Path) -> Path:
    """Stacked bars: label shares per cell class (n per bar in the tick label)."""
    plt = pyplot()

    colors = {"ack_affected": "tab:orange", "ack_disclaimed": "tab:blue", "not_ack": "0.6", "other": "0.85"}
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
    save_figure(fig, path, dpi=110)
    return path


# ============================================================================== report
def report(run: Run, out: Path, *, n_boot: int = N_BOOT, seed: int = SEED) -> list[Path]:
    """Write the follow-up report: selection, replies, and (when coded) the crosstab, headline and figure."""
    out.mkdir(parents=True, exist_ok=True)
    ans = answers(run)
    tables: dict[str, pd.DataFrame] = {
        "selection": selection_table(ans),
        "classes": class_counts(ans),
    }
    show = ["trial_id", "draw", "cell", "cell_key", "item_id", "source_choice", "option", "status", "text"]
    tables["answers"] = ans[[c for c in show if c in ans.columns]]
    codes = load_codes(run)
    figures: list[str] = []
    coded = None
    if codes is not None:
        coded = with_codes(ans, codes)
        counts, shares = crosstab(coded)
        tables["crosstab_counts"] = counts.reset_index()
        tables["crosstab_shares"] = shares.reset_index()
        tables["headline"] = headline(coded, n_boot=n_boot, seed=seed)
        tables["answers"] = coded[[*tables["answers"].columns, "label", "judge"]]
        if len(counts):
            figures.append(stacked_figure(shares, counts, out / "fig_followup_labels.png").name)
    write_tables(out, tables)
    write_summary(out, _summary(run, tables, coded, figures, n_boot))
    return report_files(out)


def _summary(
    run: Run,
    tables: Mapping[str, pd.DataFrame],
    coded: pd.DataFrame | None,
    figures: Sequence[str],
    n_boot: int,
) -> str:
    from experiments.followup import FollowupSpec

    man = run.manifest
    spec, plan = man.spec_as(FollowupSpec), man.plan or Plan()  # no plan: no sampled replies
    draws = f"{plan.samples} sampled replies per trial at T = {plan.temperature}"
    lines = [
        f"# Follow-up self-report probe: {man.model}",
        "",
        f"- run: `{run.root}`, {man.n_trials} follow-up trials, run key `{man.run_key}`",
        f"- source: `{spec.source}` (run key `{spec.source_run_key}`); cells: "
        f"{', '.join(spec.select)}, up to {spec.per_cell} first answers per cell "
        f"(seed {spec.seed}); significance: {spec.significance}",
        f"- replies: {draws if plan.samples else 'one greedy reply per trial'}",
        "- each trial is the source conversation, the model's own first answer kept (exact token ids where the source "
        "stored them), and the follow-up question; cell = the class of the source effect (condition x cue direction).",
        "",
        *table_section("## Cells", tables["classes"]),
        "said_yes / said_no: a crude reading of the reply (it says Yes / No); the codes below are the measurement.",
        "",
    ]
    sel = tables["selection"]
    lines += table_section("## Selection (per cell)", sel.head(40))
    if len(sel) > 40:
        lines += [f"(first 40 of {len(sel)}; all in selection.csv)", ""]
    if coded is None:
        lines += [
            "## Coding",
            "",
            "No codes yet. Code the replies with a judge, then re-run the report:",
            "",
            f"    probe code {run.root} --task followup --judge MODEL",
            f"    probe analyze {run.root}",
            "",
        ]
    else:
        judges = sorted(set(coded["judge"].dropna()))
        uncoded = int((coded["label"] == "uncoded").sum())
        head = tables["headline"]
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
            f"Judge: {', '.join(judges) or '?'}; uncoded replies: {uncoded}. Bootstrap: {n_boot} replicates.",
            "",
            *table_section("### Labels per cell class (counts)", tables["crosstab_counts"]),
            *table_section("### Labels per cell class (shares)", tables["crosstab_shares"]),
        ]
    if figures:
        lines += ["Figures: " + ", ".join(f"`{f}`" for f in figures), ""]
    return "\n".join(lines)
