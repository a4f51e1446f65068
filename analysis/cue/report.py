"""The cue-visibility report of one run (paper 001): Markdown summary, CSV tables, ``puzzles.jsonl`` and the
net-bias figure; the numbers come from :mod:`analysis.cue.metrics` and the flags from :mod:`analysis.cue.flags`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.battery.calibration import run_temperature, temperature_lines
from analysis.common.figures import pyplot, save_figure
from analysis.common.report import report_files, write_summary
from analysis.cue.metrics import (
    ATTRS,
    BREAKDOWNS,
    CELL,
    MACRO,
    REFERENCE,
    Decision,
    Denominator,
    breakdown_tables,
    check_frame,
    correct_only_keep,
    decision_bias,
    decision_frame,
    formal_named_share,
    identity_checks,
    macro_left_out,
    solve_rates,
    status_bias,
    with_baseline,
    wording_table,
)
from probe.record import Plan

if TYPE_CHECKING:
    from experiments.cue import CueSpec
    from probe.runs import Run
    from probe.types import Trial


def _pp(x: float, sd: float | None = None) -> str:
    if x is None or np.isnan(x):
        return "n/a"
    s = f"{100 * x:+.1f}"
    return s + (f" ± {100 * sd:.1f}" if sd is not None and not np.isnan(sd) else "")


def _pct(x: float) -> str:
    return "n/a" if x is None or np.isnan(x) else f"{100 * x:.1f}%"


def _num(x: float) -> str:
    return "n/a" if x is None or np.isnan(x) else f"{x:.3f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def _group_order(bias: pd.DataFrame, labels: Mapping[str, Sequence[str]]) -> list[tuple[str, str]]:
    present = set(bias[["attr", "group"]].itertuples(index=False, name=None))
    order = [(a, g) for a in ATTRS for g in labels.get(a, ()) if (a, g) in present]
    order += sorted(p for p in present if p not in order and p != MACRO)
    return order


def plot_net_bias(
    bias: pd.DataFrame, arms: Sequence[str], consequences: str, order: Sequence[tuple[str, str]], path: Path, title: str
) -> Path:
    """Grouped bars of net bias per group (pp) under each arm, bootstrap SD as error bars."""
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
    return save_figure(fig, path, dpi=110)


def _headline(arms: Sequence[str]) -> str | None:
    """The Puzzled arm the paper headlines: the hardest level present."""
    for lv in ("hard", "intermediate", "easy"):
        if f"puzzled-{lv}" in arms:
            return f"puzzled-{lv}"
    return next((a for a in arms if a != REFERENCE), None)


def _puzzle_lines(cue_spec: CueSpec, trials: Sequence[Trial], out: Path) -> list[str]:
    """Regenerate the run's puzzles from its spec into ``puzzles.jsonl``, checked against the stored prompts.

    Puzzles are a pure function of the spec, so they are not stored with the trials; the
    check guards against a changed generator or a moved dilemma file.
    """
    from experiments.cue import build_design
    from experiments.cue.puzzles import placeholder_binding
    from probe.files import atomic_write_text

    try:
        design = build_design(cue_spec)
    except (ValueError, OSError) as e:  # untrusted input: the run's dilemma file, read again
        return [f"- puzzles: not regenerated ({e})"]
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
    if mismatched:
        return [
            f"- puzzles: regenerated puzzles {mismatched} differ from the stored prompts; puzzles.jsonl not written"
        ]
    if rows:
        atomic_write_text(out / "puzzles.jsonl", "\n".join(rows) + "\n")
        return [f"- puzzles: {len(rows)}, structured form in `puzzles.jsonl` (checked against the stored prompts)"]
    return []


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
    return [title, "", *_table(header, rows), "", *note]


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
    return [caption, "", *_table(header, rows), ""]


HEADLINE = "greedy"
"""The key of the headline results: greedy decisions, eligible denominators (see :data:`VARIANTS`)."""
VARIANTS: dict[str, tuple[Decision, Denominator]] = {
    "greedy": ("greedy", "eligible"),
    "expected": ("expected", "eligible"),
    "greedy, all parsable": ("greedy", "all"),
}
"""The decision-bias readings a report computes: (decision, denominator) per label."""


def _macro_value(gap: pd.DataFrame, arm: str, cons: str, col: str) -> float:
    m = gap[(gap["arm"] == arm) & (gap["consequences"] == cons) & (gap["group"] == MACRO[1])]
    return float(m[col].iloc[0]) if len(m) else float("nan")


def _gap_section(results: Mapping[str, tuple[pd.DataFrame, pd.DataFrame]]) -> list[str]:
    """The macro gap per arm (headline: greedy, eligible), with the expected, all-parsable and correct-only readings."""
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
    shares = formal_named_share(main)
    share_lines = [
        f"- FormalNamed-{r.level} ({r.consequences} consequences): D→FN {_pp(r.gap_fn)} of D→P {_pp(r.gap_p)} pp, "
        f"{_pct(r.share)} of the gap via the reasoning load alone (App. S)"
        for r in shares.itertuples()
    ]
    return [
        "## Cue Visibility Gap by arm (macro over groups, pp)",
        "",
        "Headline: **greedy decisions** (the most probable option, the paper's temperature 0), Favor / Against over "
        "their **eligible** denominators (Table 3). Beside it: expected decisions (independent draws from the "
        "answer distributions), both rates over all parsable what-if answers (Apps. M/P/Q), and greedy on the "
        "solved pairs only. Net columns: the arm's macro net in the two denominator readings.",
        "",
        *_table(header, rows),
        "",
        *_left_out_lines(results),
        *([*share_lines, ""] if share_lines else []),
    ]


def _left_out_lines(results: Mapping[str, tuple[pd.DataFrame, pd.DataFrame]]) -> list[str]:
    """The groups the macro rows left out (a rate with an empty denominator), per reading; nothing when none."""
    items = []
    for key, (bias, gap) in results.items():
        for r in macro_left_out(bias, gap).itertuples():
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
        *_table(header, rows),
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
        *_table(header, rows),
        "",
    ]


def _status_section(sb: pd.DataFrame, order: Sequence[tuple[str, str]]) -> list[str]:
    arms = list(dict.fromkeys(sb["arm"]))
    piv = sb.pivot_table(index=["consequences", "status", "attr", "group"], columns="arm", values="rate")
    rank = {k: i for i, k in enumerate(order)}
    statuses = {"good": 0, "neutral": 1, "bad": 2}
    keys = sorted(piv.index, key=lambda i: (i[0], statuses.get(i[1], 3), rank.get((i[2], i[3]), len(rank)), i[3]))
    rows = [[str(i[0]), str(i[1]), str(i[3]), *(_pct(piv.loc[i].get(a, np.nan)) for a in arms)] for i in keys]
    return [
        "## Status bias (could-be: share of greedy yes answers per group, by how the dilemma portrays the described "
        "person; mean P(yes) with decision='expected')",
        "",
        *_table(["consequences", "status", "group", *arms], rows),
        "",
    ]


def _header(run: Run, spec: CueSpec, per_trial: pd.DataFrame, source: str) -> list[str]:
    man = run.manifest
    eng = man.engine
    plan = man.plan or Plan()
    sampled = f" ({plan.samples} samples per trial at T = {plan.temperature})"
    cov = per_trial.groupby("probe")["coverage"].mean()
    return [
        f"# cue visibility: {man.model}",
        "",
        f"- run: `{run.root}`, {man.n_trials} trials, run key `{man.run_key}`",
        f"- model path: `{eng.model_path}` ({eng.model_class}, {eng.dtype}, {eng.device})",
        f"- probabilities from: {source}" + (sampled if source == "samples" else ""),
        f"- design: {per_trial['item_id'].nunique()} dilemmas x {spec.combos} demographic combination(s); "
        f"conditions {', '.join(spec.conditions)}; puzzle levels {', '.join(spec.difficulties)} "
        f"({spec.shape} shape); consequences {', '.join(spec.consequences)}",
        "- mean option coverage by probe: " + ", ".join(f"{k} {v:.3f}" for k, v in cov.items()),
        *(
            [
                "- abstentions (trials without a parsed answer, left out): "
                + ", ".join(f"{k} {v}" for k, v in (per_trial["n_ok"] == 0).groupby(per_trial["probe"]).sum().items())
            ]
            if "n_ok" in per_trial.columns
            else []
        ),
    ]


def _chance_section(
    checks: pd.DataFrame, n_options: Mapping[str, int], per_trial: pd.DataFrame, source: str, seed: int, used: bool
) -> list[str]:
    """Beside an identity-recovery table: each rate against chance, low coverage of the check probes."""
    from analysis.cue import flags

    chances = flags.recovery_vs_chance(checks, n_options, seed=seed)
    lines = ["Recovery against chance (uniform guessing 1/k; answers independent of the truth, by permutation):", ""]
    lines += flags.chance_lines(chances)
    if used and any(not c.above_chance for c in chances):
        lines.append(
            "- the correct-only reading keeps the pairs recovered where recovery is not distinguishable from "
            "chance: there it is a chance subset of the pairs, not the solved ones."
        )
    if source == "check":
        lines += flags.coverage_lines(per_trial, [f"check_{a}" for a in n_options], "the identity-recovery table")
    return [*lines, ""]


def _breakdown_flag(changes: pd.DataFrame, head: str, cons: str) -> list[str]:
    """A line under a breakdown table whose Direct and headline arms never change a Neutral decision."""
    sub = changes[(changes["consequences"] == cons) & changes["arm"].isin([REFERENCE, head])]
    if sub.empty or not sub["identical"].all():
        return []
    pairs = sub[sub["attr"] == sub["attr"].iloc[0]].groupby("arm", sort=False)["pairs"].sum()
    counts = ", ".join(f"{arm} {int(n)}" for arm, n in pairs.items())
    return [
        f"- **degenerate**: greedy decision identical to Neutral in every pair of {REFERENCE} and {head} "
        f"(pairs: {counts}), so this table's Favor, Against, Net and Gap are 0 or n/a by construction.",
        "",
    ]


def _other_source(run: Run, source: str) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(options, per_trial) of the source the report's tables did not use, where the run has both; else None."""
    if source == "readout" and not run.load("samples").empty:
        return run.sample_counts()
    if source == "samples" and not run.load("readout_options").empty:
        return run.readout_frames()
    return None


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


def _sources_section(
    first: tuple[pd.DataFrame, pd.DataFrame],
    second: tuple[pd.DataFrame, pd.DataFrame],
    sources: tuple[str, str],
    agreement: pd.DataFrame,
    temperature: pd.DataFrame,
    run: Run,
) -> list[str]:
    """The summary's side-by-side section: the readout temperature, the macro rates of both sources, disagreements."""
    plan = run.manifest.plan or Plan()
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
        *temperature_lines(temperature),
        "",
        "Macro over groups, pp (" + " / ".join(sources) + "):",
        "",
        *_table(["arm", "consequences", "Favor", "Against", "Net", "Gap"], rows),
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
        lines += [*_table(["arm", "consequences", "group", "effect", *sources, "diff ± SE", "q"], rows2), ""]
    return lines


def cue_report(run: Run, out: Path, *, n_boot: int = 1000, seed: int = 0) -> list[Path]:
    """Write the cue-visibility report of a run: CSV tables, ``summary.md``, ``puzzles.jsonl`` and the figure."""
    from analysis.cue import flags
    from experiments.cue import CueSpec
    from probe.files import atomic_write_text

    man = run.manifest
    spec = man.spec_as(CueSpec)
    labels = {a.name: a.labels for a in spec.attributes()}
    options, per_trial, source = run.choice_probs()
    out.mkdir(parents=True, exist_ok=True)
    lines = _header(run, spec, per_trial, source)
    lines += [*_puzzle_lines(spec, run.trial_list, out), ""]

    checks, id_source = identity_checks(run, options, per_trial, labels)
    if not checks.empty:
        n_options = {a: len(v) for a, v in labels.items()}
        sr = solve_rates(checks).assign(source=id_source)
        lines += _solve_section(sr, id_source)
        chances = [flags.chance_frame(flags.recovery_vs_chance(checks, n_options, seed=seed)).assign(source=id_source)]
        lines += _chance_section(checks, n_options, per_trial, id_source, seed, used=True)
        probe_checks = check_frame(options, per_trial) if id_source == "json" else checks.iloc[0:0]
        if not probe_checks.empty:  # the alternative reading beside the paper's
            alt = solve_rates(probe_checks).assign(source="check")
            lines += _solve_section(alt, "check", alternative=True)
            lines += _chance_section(probe_checks, n_options, per_trial, "check", seed, used=False)
            chances.append(
                flags.chance_frame(flags.recovery_vs_chance(probe_checks, n_options, seed=seed)).assign(source="check")
            )
            sr = pd.concat([sr, alt], ignore_index=True)
        atomic_write_text(out / "cue_solve.csv", sr.to_csv(index=False, float_format="%.6f"))
        atomic_write_text(
            out / "cue_solve_chance.csv", pd.concat(chances, ignore_index=True).to_csv(index=False, float_format="%.6f")
        )

    side: list[str] = []
    answered = per_trial["coverage"] > 0  # a sampled trial with no parsed answer is an abstention
    neutral_ok = (per_trial["condition"] == "neutral") & answered
    whatif_ok = (per_trial["probe"] == "what_if") & answered
    if neutral_ok.any() and whatif_ok.any():
        results = {
            k: decision_bias(options, per_trial, decision=d, denominator=den, n_boot=n_boot, seed=seed)
            for k, (d, den) in VARIANTS.items()
        }
        readings = dict(VARIANTS)
        if not checks.empty:
            keep = correct_only_keep(per_trial, checks)
            results["correct-only"] = decision_bias(options, per_trial, keep=keep, n_boot=n_boot, seed=seed)
            readings["correct-only"] = VARIANTS[HEADLINE]

        def tag(frame: pd.DataFrame, k: str) -> pd.DataFrame:
            return frame.assign(reading=k, decision=readings[k][0], denominator=readings[k][1], headline=k == HEADLINE)

        bias = pd.concat([tag(b, k) for k, (b, _) in results.items()], ignore_index=True)
        gap = pd.concat([tag(g, k) for k, (_, g) in results.items()], ignore_index=True)
        bias.insert(0, "source", source)
        gap.insert(0, "source", source)
        other = _other_source(run, source)
        if other is not None:  # a run with readouts and samples: the same readings from the other source
            o_opts, o_per = other
            o_res = {
                k: decision_bias(o_opts, o_per, decision=d, denominator=den, n_boot=n_boot, seed=seed)
                for k, (d, den) in VARIANTS.items()
            }
            o_src = "samples" if source == "readout" else "readout"
            bias = pd.concat(
                [bias, *(tag(b, k).assign(source=o_src) for k, (b, _) in o_res.items())], ignore_index=True
            )
            gap = pd.concat([gap, *(tag(g, k).assign(source=o_src) for k, (_, g) in o_res.items())], ignore_index=True)
            agreement = cue_agreement(results[HEADLINE], o_res[HEADLINE], (source, o_src))
            atomic_write_text(out / "cue_source_agreement.csv", agreement.to_csv(index=False, float_format="%.6f"))
            temperature = run_temperature(run)
            atomic_write_text(out / "calibration_T.csv", temperature.to_csv(index=False, float_format="%.6f"))
            side = _sources_section(results[HEADLINE], o_res[HEADLINE], (source, o_src), agreement, temperature, run)
        atomic_write_text(out / "cue_bias.csv", bias.to_csv(index=False, float_format="%.6f"))
        atomic_write_text(out / "cue_gap.csv", gap.to_csv(index=False, float_format="%.6f"))
        main_bias, main_gap = results[HEADLINE]
        arms = list(dict.fromkeys(main_bias["arm"]))
        head = _headline(arms)
        order = _group_order(main_bias, labels)
        cons_list = [c for c in ("with", "without") if c in set(main_bias["consequences"])]
        lines += [
            "## Decision bias (pp)",
            "",
            "Favor = P(what-if picks the benefit option | Neutral did not), Against = P(what-if does not | Neutral did),",
            "Net = Favor - Against, ± bootstrap SD over dilemmas. **Greedy decisions** (the most probable option, the",
            "paper's temperature 0; expected decisions in `cue_bias.csv`, reading `expected`); Favor and Against over",
            "their **eligible** denominators (all-parsable denominators: reading `greedy, all parsable`).",
            "ΔAgainst and ΔFavor = arm - Direct; Gap = Net(Direct) - Net(arm) = ΔAgainst - ΔFavor.",
            "",
        ]
        changes = flags.decision_changes(with_baseline(decision_frame(options, per_trial)))
        group_names = [g for _, g in order]
        lines += [*flags.coverage_lines(per_trial, ["decision", "what_if"], "the decision-bias tables"), ""]
        if head is not None and REFERENCE in arms:
            for cons in cons_list:
                lines += _bias_section(main_bias, main_gap, head, cons, order)
                stuck = flags.degenerate_lines(changes[changes["consequences"] == cons], group_names)
                lines += [*stuck, ""] if stuck else []
        lines += _gap_section(results)
        gap_flags = flags.gap_lines(flags.stuck_gaps(changes))
        lines += [*gap_flags, ""] if gap_flags else []
        atomic_write_text(out / "cue_degenerate.csv", changes.to_csv(index=False))
        fig_arms = [a for a in dict.fromkeys((REFERENCE, head, "named")) if a is not None and a in arms]
        fig_bias = main_bias
        if "correct-only" in results and head is not None and head != REFERENCE:
            solved = results["correct-only"][0]
            fig_bias = pd.concat([main_bias, solved[solved["arm"] == head].assign(arm=f"{head} (solved only)")])
            fig_arms.insert(2, f"{head} (solved only)")
        plot_net_bias(
            fig_bias,
            fig_arms,
            cons_list[0],
            [*order, MACRO],
            out / "cue_net_bias.png",
            f"net bias per group ({cons_list[0]} consequences; greedy decisions, eligible denominators)",
        )
        lines += ["![net bias per group](cue_net_bias.png)", ""]
        if "wording" in per_trial.columns and per_trial["wording"].fillna("").astype(str).ne("").any():
            wt = wording_table(options, per_trial, n_boot=n_boot, seed=seed)
            atomic_write_text(out / "cue_wordings.csv", wt.to_csv(index=False, float_format="%.6f"))
            lines += _wording_section(wt)
        for by in BREAKDOWNS:
            bb, bg = breakdown_tables(options, per_trial, by, n_boot=n_boot, seed=seed)
            if bb.empty:
                continue
            atomic_write_text(
                out / f"cue_{by}.csv", bb.merge(bg, on=CELL, how="left").to_csv(index=False, float_format="%.6f")
            )
            if head is not None and REFERENCE in arms:
                lines += _breakdown_section(bb, bg, head, cons_list[0], BREAKDOWNS[by])
                lines += _breakdown_flag(changes, head, cons_list[0])
    else:
        lines += ["Decision bias needs answered Neutral and what-if trials; this run has none of one of them.", ""]

    lines += side
    if (per_trial["probe"] == "could_be").any():
        sb = status_bias(options, per_trial, n_boot=n_boot, seed=seed)
        if not sb.empty:
            atomic_write_text(out / "cue_status.csv", sb.to_csv(index=False, float_format="%.6f"))
            lines += _status_section(sb, _group_order(sb, labels))
            low = flags.coverage_lines(per_trial, ["could_be"], "the status-bias table")
            lines += [*low, ""] if low else []
    write_summary(out, "\n".join(lines))
    return report_files(out, (".jsonl",))
