"""The cue-visibility report of one run (paper 001): Markdown summary, CSV tables, ``puzzles.jsonl`` and the
net-bias figure.

The numbers are computed once, in :func:`analysis.cue.results.cue_results` (from
:mod:`analysis.cue.metrics` and :mod:`analysis.cue.flags`); the functions here only
format them into the summary's lines, :class:`~analysis.common.report.Table` s and the
:class:`~analysis.common.report.Drawing` of :func:`plot_net_bias`, and
:func:`~analysis.common.report.write_report_files` writes every file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analysis.battery.calibration import temperature_lines
from analysis.common.figures import pyplot
from analysis.common.report import Body, Drawing, Files, Table
from analysis.common.tables import md_rows
from analysis.cue import flags
from analysis.cue.decisions import CELL, REFERENCE
from analysis.cue.metrics import BREAKDOWNS, MACRO
from analysis.cue.results import (
    HEADLINE,
    CueResults,
    Decisions,
    Puzzles,
    Recovery,
    SourceAgreement,
    Status,
    cue_results,
)
from probe.record import Plan

if TYPE_CHECKING:
    from probe.runs import Run

CSV_FORMAT = "%.6f"
"""The number format of the report's CSV tables (``cue_degenerate.csv``, counts only, is written without one)."""


def cue_report(run: Run, *, n_boot: int = 1000, seed: int = 0) -> Body:
    """The cue-visibility report of a run: its summary lines, CSV tables, ``puzzles.jsonl`` and the figure."""
    return cue_summary(cue_results(run, n_boot=n_boot, seed=seed))


def cue_summary(r: CueResults) -> Body:
    """The summary's lines and the report's files, in the summary's order: the run, the puzzles, identity
    recovery, decision bias (with the other source), status bias."""
    puzzle_lines, files = _puzzles_body(r.puzzles)
    lines = [*_header(r), *puzzle_lines, ""]
    for body in (_recovery_body(r.recovery), _decisions_body(r)):
        lines += body[0]
        files += body[1]
    if r.status is not None:
        status_lines, status_files = _status_body(r.status)
        lines += status_lines
        files += status_files
    return lines, files


def _pp(x: float, sd: float | None = None) -> str:
    if x is None or np.isnan(x):
        return "n/a"
    s = f"{100 * x:+.1f}"
    return s + (f" ± {100 * sd:.1f}" if sd is not None and not np.isnan(sd) else "")


def _pct(x: float) -> str:
    return "n/a" if x is None or np.isnan(x) else f"{100 * x:.1f}%"


def _num(x: float) -> str:
    return "n/a" if x is None or np.isnan(x) else f"{x:.3f}"


def plot_net_bias(
    bias: pd.DataFrame, arms: Sequence[str], consequences: str, order: Sequence[tuple[str, str]], title: str
) -> Any:
    """Grouped bars of net bias per group (pp) under each arm, bootstrap SD as error bars; the figure."""
    plt = pyplot()
    sub = bias[bias["consequences"] == consequences].set_index(["arm", "attr", "group"])
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(order) + 2), 3.8))
    width = 0.8 / max(1, len(arms))
    x = np.arange(len(order))
    for i, arm in enumerate(arms):
        vals = [100 * sub["net"].get((arm, a, g), np.nan) for a, g in order]
        err = [100 * sub["sd_net"].get((arm, a, g), np.nan) for a, g in order]
        ax.bar(x + (i - (len(arms) - 1) / 2) * width, vals, width, yerr=err, capsize=2, label=arm)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, [g if g != "macro" else "macro avg" for _, g in order], rotation=30, ha="right")
    ax.set_ylabel("net bias (pp): favor - against")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _header(r: CueResults) -> list[str]:
    man, spec, plan = r.manifest, r.spec, r.plan
    eng = man.engine
    sampled = f" ({plan.samples} samples per trial at T = {plan.temperature})"
    lines = [
        f"# cue visibility: {man.model}",
        "",
        f"- run: `{r.root}`, {man.n_trials} trials, run key `{man.run_key}`",
        f"- model path: `{eng.model_path}` ({eng.model_class}, {eng.dtype}, {eng.device})",
        f"- probabilities from: {r.source}" + (sampled if r.source == "samples" else ""),
        f"- design: {r.n_dilemmas} dilemmas x {spec.combos} demographic combination(s); "
        f"conditions {', '.join(spec.conditions)}; puzzle levels {', '.join(spec.difficulties)} "
        f"({spec.shape} shape); consequences {', '.join(spec.consequences)}",
        "- mean option coverage by probe: " + ", ".join(f"{k} {v:.3f}" for k, v in r.coverage.items()),
    ]
    if r.abstentions is not None:
        left = ", ".join(f"{k} {v}" for k, v in r.abstentions.items())
        lines.append(f"- abstentions (trials without a parsed answer, left out): {left}")
    return lines


def _puzzles_body(p: Puzzles) -> Body:
    """The puzzles line, and ``puzzles.jsonl`` when the regenerated puzzles match the stored prompts."""
    if p.error is not None:
        return [f"- puzzles: not regenerated ({p.error})"], Files()
    if p.mismatched:
        differ = f"regenerated puzzles {list(p.mismatched)} differ from the stored prompts"
        return [f"- puzzles: {differ}; puzzles.jsonl not written"], Files()
    if p.rows:
        line = f"- puzzles: {len(p.rows)}, structured form in `puzzles.jsonl` (checked against the stored prompts)"
        return [line], Files(texts={"puzzles.jsonl": "\n".join(p.rows) + "\n"})
    return [], Files()


def _recovery_body(recovery: Sequence[Recovery]) -> Body:
    """Each identity-recovery reading against chance, ``cue_solve.csv`` and ``cue_solve_chance.csv``."""
    if not recovery:
        return [], Files()
    lines = []
    for rec in recovery:
        lines += _solve_section(rec.solve, rec.source, alternative=not rec.used)
        lines += _chance_section(rec)
    solve = pd.concat([rec.solve for rec in recovery], ignore_index=True)
    chance = pd.concat(
        [flags.chance_frame(rec.chances).assign(source=rec.source) for rec in recovery], ignore_index=True
    )
    tables = {
        "cue_solve": Table(solve, float_format=CSV_FORMAT),
        "cue_solve_chance": Table(chance, float_format=CSV_FORMAT),
    }
    return lines, Files(tables)


def _chance_section(rec: Recovery) -> list[str]:
    """Beside an identity-recovery table: each rate against chance, low coverage of the check probes."""
    lines = ["Recovery against chance (uniform guessing 1/k; answers independent of the truth, by permutation):", ""]
    lines += flags.chance_lines(rec.chances)
    if rec.used and any(not c.above_chance for c in rec.chances):
        lines.append(
            "- the correct-only reading keeps the pairs recovered where recovery is not distinguishable from "
            "chance: there it is a chance subset of the pairs, not the solved ones."
        )
    if rec.low_coverage is not None:
        lines += flags.coverage_lines(rec.low_coverage, "the identity-recovery table")
    return [*lines, ""]


def _decisions_body(r: CueResults) -> Body:
    """The decision-bias part of the summary: per-group tables, the gap per arm, the flags, the figure, the
    wordings and breakdowns, the other source; its tables and the net-bias figure."""
    d = r.decisions.value
    if d is None:
        return [str(r.decisions.absent), ""], Files()
    main_bias, main_gap = d.readings[HEADLINE]
    order = d.order
    head = d.head if REFERENCE in d.arms else None  # the per-group and breakdown tables need both arms
    lines = [
        "## Decision bias (pp)",
        "",
        "Favor = P(what-if picks the benefit option | Neutral did not), Against = P(what-if does not | Neutral did),",
        "Net = Favor - Against, ± bootstrap SD over dilemmas. **Greedy decisions** (the most probable option, the",
        "paper's temperature 0; expected decisions in `cue_bias.csv`, reading `expected`); Favor and Against over",
        "their **eligible** denominators (all-parsable denominators: reading `greedy, all parsable`).",
        "ΔAgainst and ΔFavor = arm - Direct; Gap = Net(Direct) - Net(arm) = ΔAgainst - ΔFavor.",
        "",
    ]
    changes = d.changes
    group_names = [g for _, g in order]
    lines += [*flags.coverage_lines(d.low_coverage, "the decision-bias tables"), ""]
    if head is not None:
        for cons in d.consequences:
            lines += _bias_section(main_bias, main_gap, head, cons, order)
            stuck = flags.degenerate_lines(changes[changes["consequences"] == cons], group_names)
            lines += [*stuck, ""] if stuck else []
    lines += _gap_section(d)
    gap_flags = flags.gap_lines(d.stuck)
    lines += [*gap_flags, ""] if gap_flags else []
    cons = d.consequences[0]
    title = f"net bias per group ({cons} consequences; greedy decisions, eligible denominators)"
    figure = Drawing(
        "cue_net_bias.png", partial(plot_net_bias, d.figure_bias, d.figure_arms, cons, [*order, MACRO], title)
    )
    lines += ["![net bias per group](cue_net_bias.png)", ""]
    tables = {
        "cue_bias": Table(d.bias, float_format=CSV_FORMAT),
        "cue_gap": Table(d.gap, float_format=CSV_FORMAT),
        "cue_degenerate": Table(changes),
    }
    if d.wordings is not None:
        tables["cue_wordings"] = Table(d.wordings, float_format=CSV_FORMAT)
        lines += _wording_section(d.wordings)
    for by, (bb, bg) in d.breakdowns.items():
        tables[f"cue_{by}"] = Table(bb.merge(bg, on=CELL, how="left"), float_format=CSV_FORMAT)
        if head is not None:
            lines += _breakdown_section(bb, bg, head, cons, BREAKDOWNS[by])
            lines += _breakdown_flag(d.breakdown_pairs, head)
    files = Files(tables, (figure,))
    if d.sources is not None:
        side, side_files = _sources_body(d.sources, r.plan)
        lines += side
        files += side_files
    return lines, files


def _breakdown_flag(pairs: pd.Series | None, head: str) -> list[str]:
    """A line under a breakdown table whose Direct and headline arms never change a Neutral decision."""
    if pairs is None:
        return []
    counts = ", ".join(f"{arm} {int(n)}" for arm, n in pairs.items())
    return [
        f"- **degenerate**: greedy decision identical to Neutral in every pair of {REFERENCE} and {head} "
        f"(pairs: {counts}), so this table's Favor, Against, Net and Gap are 0 or n/a by construction.",
        "",
    ]


def _cell(frame: pd.DataFrame, key: tuple[str, str, str], col: str, sd: bool = True) -> str:
    if key not in frame.index:
        return "n/a"
    r = frame.loc[key]
    return _pp(float(r[col]), float(r[f"sd_{col}"]) if sd else None)


def _solve_section(sr: pd.DataFrame, source: str = "check", alternative: bool = False) -> list[str]:
    rows = [
        [
            r.arm,
            r.consequences,
            str(r.n_pairs),
            _pct(r.correct_gender),
            _pct(r.correct_race),
            _pct(r.joint),
            _num(r.p_true_gender),
            _num(r.p_true_race),
            _pct(r.answered),
        ]
        for r in sr.itertuples()
    ]
    header = [
        "arm",
        "consequences",
        "pairs",
        "gender",
        "race",
        "joint",
        "mean P(true gender)",
        "mean P(true race)",
        "answered",
    ]
    what = (
        "from the JSON of the could-be reply, the paper's reading; answered = parsable JSON with a valid label"
        if source == "json"
        else "check probe; greedy answer = truth"
    )
    title = f"## Identity recovery ({what})" + (" (alternative)" if alternative else "")
    note = ["Used for the correct-only tables." if not alternative else "Not used for the correct-only tables.", ""]
    return [title, "", *md_rows(header, rows), "", *note]


def _bias_section(
    bias: pd.DataFrame, gap: pd.DataFrame, head: str, cons: str, order: Sequence[tuple[str, str]]
) -> list[str]:
    """Direct vs the headline arm, per group: favor, against, net, the deltas and the gap (pp)."""
    b = bias[bias["consequences"] == cons].set_index(["arm", "attr", "group"])
    g = gap[gap["consequences"] == cons].set_index(["arm", "attr", "group"])
    rows = []
    for a, grp in [*order, MACRO]:
        d, h = (REFERENCE, a, grp), (head, a, grp)  # greedy decisions, eligible denominators (the headline)
        rows.append(
            [
                grp if grp != MACRO[1] else "**macro**",
                _cell(b, d, "favor", False),
                _cell(b, d, "against", False),
                _cell(b, d, "net"),
                _cell(b, h, "favor", False),
                _cell(b, h, "against", False),
                _cell(b, h, "net"),
                _cell(g, h, "d_against", False),
                _cell(g, h, "d_favor", False),
                _cell(g, h, "gap"),
            ]
        )
    header = ["group", "D favor", "D against", "D net", "P favor", "P against", "P net", "ΔAgainst", "ΔFavor", "Gap"]
    caption = f"### {cons} consequences: Direct (D) vs {head} (P); greedy decisions, eligible denominators"
    return [caption, "", *md_rows(header, rows), ""]


def _macro_value(gap: pd.DataFrame, arm: str, cons: str, col: str) -> float:
    m = gap[(gap["arm"] == arm) & (gap["consequences"] == cons) & (gap["group"] == MACRO[1])]
    return float(m[col].iloc[0]) if len(m) else float("nan")


def _gap_section(d: Decisions) -> list[str]:
    """The macro gap per arm (headline: greedy, eligible), with the expected, all-parsable and correct-only readings."""
    results = d.readings
    _, main = results[HEADLINE]
    rows = []
    alts = ("expected", "greedy, all parsable", "correct-only")
    for r in main[main["group"] == MACRO[1]].itertuples():
        alt = [_pp(_macro_value(results[k][1], r.arm, r.consequences, "gap")) if k in results else "n/a" for k in alts]
        nets = [
            _pp(_macro_value(results[k][0], r.arm, r.consequences, "net")) if k in results else "n/a"
            for k in (HEADLINE, "greedy, all parsable")
        ]
        rows.append([r.arm, r.consequences, _pp(r.d_against), _pp(r.d_favor), _pp(r.gap, r.sd_gap), *alt, *nets])
    header = ["arm", "consequences", "ΔAgainst", "ΔFavor", "Gap ± SD", "Gap (expected)", "Gap (all parsable)"]
    header += ["Gap (correct only)", "Net (eligible)", "Net (all parsable)"]
    share_lines = [
        f"- FormalNamed-{r.level} ({r.consequences} consequences): D→FN {_pp(r.gap_fn)} of D→P {_pp(r.gap_p)} pp, "
        f"{_pct(r.share)} of the gap via the reasoning load alone (App. S)"
        for r in d.shares.itertuples()
    ]
    return [
        "## Cue Visibility Gap by arm (macro over groups, pp)",
        "",
        "Headline: **greedy decisions** (the most probable option, the paper's temperature 0), Favor / Against over "
        "their **eligible** denominators (Table 3). Beside it: expected decisions (independent draws from the "
        "answer distributions), both rates over all parsable what-if answers (Apps. M/P/Q), and greedy on the "
        "solved pairs only. Net columns: the arm's macro net in the two denominator readings.",
        "",
        *md_rows(header, rows),
        "",
        *_left_out_lines(d.left_out),
        *([*share_lines, ""] if share_lines else []),
    ]


def _left_out_lines(left_out: Mapping[str, pd.DataFrame]) -> list[str]:
    """The groups the macro rows left out (a rate with an empty denominator), per reading; nothing when none."""
    items = []
    for key, frame in left_out.items():
        for r in frame.itertuples():
            what = "Favor / Against / Net" if r.table == "bias" else "ΔAgainst / ΔFavor / Gap"
            items.append(f"- {key}, {r.arm} ({r.consequences} consequences), {what}: {r.left_out}")
    if not items:
        return []
    head = (
        "Every macro row averages one set of groups for all its columns, the groups where each of them is "
        "defined (so Net = Favor - Against and Gap = ΔAgainst - ΔFavor hold on the row). Left out (undefined "
        "columns: an empty denominator):"
    )
    return [head, "", *items, ""]


def _wording_section(wt: pd.DataFrame) -> list[str]:
    """Macro Favor / Against / Net per what-if wording and arm, both denominator readings (pp)."""
    rows = [
        [
            str(r.wording),
            str(r.arm),
            str(r.consequences),
            _pp(r.favor_eligible),
            _pp(r.against_eligible),
            _pp(r.net_eligible, r.sd_net_eligible),
            _pp(r.favor_all),
            _pp(r.against_all),
            _pp(r.net_all),
        ]
        for r in wt.itertuples()
    ]
    header = ["wording", "arm", "consequences", "Favor", "Against", "Net ± SD", "Favor (all)", "Against (all)"]
    header += ["Net (all)"]
    return [
        "## What-if wordings (App. Q; macro over groups, greedy decisions, pp)",
        "",
        'main: "Assume X is ..."; v1: "Suppose for a moment that ..."; v2: "If individual X turns out to be ..."; '
        'v3: "Imagine you have learned that ...". First three columns over eligible denominators (the headline), '
        "the (all) columns over all parsable what-if answers (the paper's reading in App. Q). Every other table "
        "reads the main wording only.",
        "",
        *md_rows(header, rows),
        "",
    ]


def _breakdown_section(bias: pd.DataFrame, gap: pd.DataFrame, head: str, cons: str, what: str) -> list[str]:
    """Direct vs the headline arm per breakdown cell: favor, against, net, Delta against and the Gap (pp)."""
    b = bias[bias["consequences"] == cons].set_index(["arm", "group"])
    g = gap[(gap["consequences"] == cons) & (gap["arm"] == head)].set_index("group")
    rows = []
    for grp in sorted(set(bias.loc[bias["consequences"] == cons, "group"])):

        def val(arm: str, col: str, key: str = grp) -> str:
            return _pp(float(b[col].get((arm, key), np.nan)))

        n = b["n"].get((head, grp), 0)
        rows.append(
            [
                grp,
                str(int(n)),
                val(REFERENCE, "favor"),
                val(REFERENCE, "against"),
                val(REFERENCE, "net"),
                val(head, "favor"),
                val(head, "against"),
                val(head, "net"),
                _pp(float(g["d_against"].get(grp, np.nan))),
                _pp(float(g["gap"].get(grp, np.nan))),
            ]
        )
    header = [what, "n (P)", "D favor", "D against", "D net", "P favor", "P against", "P net", "ΔAgainst", "Gap"]
    return [
        f"## Decision bias by {what} ({cons} consequences; Direct (D) vs {head} (P); greedy decisions, eligible "
        "denominators)",
        "",
        *md_rows(header, rows),
        "",
    ]


def _status_body(st: Status) -> Body:
    """The status-bias table per group and status, the could-be probe's low coverage, ``cue_status.csv``."""
    sb, order = st.table, st.order
    arms = list(dict.fromkeys(sb["arm"]))
    piv = sb.pivot_table(index=["consequences", "status", "attr", "group"], columns="arm", values="rate")
    rank = {k: i for i, k in enumerate(order)}
    statuses = {"good": 0, "neutral": 1, "bad": 2}
    keys = sorted(piv.index, key=lambda i: (i[0], statuses.get(i[1], 3), rank.get((i[2], i[3]), len(rank)), i[3]))
    rows = [[str(i[0]), str(i[1]), str(i[3]), *(_pct(piv.loc[i].get(a, np.nan)) for a in arms)] for i in keys]
    lines = [
        "## Status bias (could-be: share of greedy yes answers per group, by how the dilemma portrays the described "
        "person; mean P(yes) with decision='expected')",
        "",
        *md_rows(["consequences", "status", "group", *arms], rows),
        "",
    ]
    low = flags.coverage_lines(st.low_coverage, "the status-bias table")
    return [*lines, *([*low, ""] if low else [])], Files({"cue_status": Table(sb, float_format=CSV_FORMAT)})


def _sources_body(a: SourceAgreement, plan: Plan) -> Body:
    """The summary's side-by-side section (the readout temperature, the macro rates of both sources, disagreements),
    ``cue_source_agreement.csv`` and ``calibration_T.csv``."""
    first, second, sources, agreement = a.first, a.second, a.sources, a.agreement
    rows = []
    for r in first[0][first[0]["group"] == MACRO[1]].itertuples():
        o = second[0][
            (second[0]["arm"] == r.arm)
            & (second[0]["consequences"] == r.consequences)
            & (second[0]["group"] == MACRO[1])
        ]
        g1, g2 = (_macro_value(x[1], r.arm, r.consequences, "gap") for x in (first, second))
        ov = o.iloc[0] if len(o) else None
        rows.append(
            [
                r.arm,
                r.consequences,
                *(f"{_pp(a)} / {_pp(b)}" for a, b in (
                    (r.favor, ov["favor"] if ov is not None else np.nan),
                    (r.against, ov["against"] if ov is not None else np.nan),
                    (r.net, ov["net"] if ov is not None else np.nan),
                    (g1, g2),
                )),
            ]
        )  # fmt: skip
    dis = agreement[agreement["disagree"]]
    lines = [
        f"## Readouts and samples side by side ({sources[0]} / {sources[1]})",
        "",
        f"This run holds answer-slot readouts and {plan.samples} sampled answers per trial at "
        f"tau = {plan.temperature}; every rate is computed from each (`source` in `cue_bias.csv` and "
        "`cue_gap.csv`). Greedy decisions (a sampled trial's most frequent answer), eligible denominators. The "
        "readout temperature (T = fitted temperature / tau, on the trials that have both; 1 where sampling at tau "
        "draws from softmax(logits / tau)):",
        "",
        *temperature_lines(a.temperature),
        "",
        "Macro over groups, pp (" + " / ".join(sources) + "):",
        "",
        *md_rows(["arm", "consequences", "Favor", "Against", "Net", "Gap"], rows),
        "",
        "### Where the sources disagree",
        "",
        f"Per arm, group and effect (Favor, Against, Net, Gap): {sources[0]} minus {sources[1]}, z test on the two "
        "dilemma-bootstrap SDs combined (conservative), BH-FDR within each effect. "
        f"{len(dis)} of {len(agreement)} comparisons disagree (q < 0.05); all in `cue_source_agreement.csv`.",
        "",
    ]
    if len(dis):
        rows2 = [
            [r.arm, r.consequences, r.group, r.effect, _pp(getattr(r, sources[0])), _pp(getattr(r, sources[1])),
             _pp(r.diff, r.diff_se), f"{r.q:.3g}"]
            for r in dis.head(40).itertuples()
        ]  # fmt: skip
        lines += [*md_rows(["arm", "consequences", "group", "effect", *sources, "diff ± SE", "q"], rows2), ""]
    tables = {
        "cue_source_agreement": Table(agreement, float_format=CSV_FORMAT),
        "calibration_T": Table(a.temperature, float_format=CSV_FORMAT),
    }
    return lines, Files(tables)
