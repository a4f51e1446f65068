"""The cue-visibility paper's cross-model tables and figures in the ``probe compare`` report (paper 001).

The tables are computed in :mod:`analysis.cue.panel_tables` (a
:class:`~analysis.cue.panel_tables.PaperTables` on the comparison); this
module only formats them (:func:`paper_md`, the summary's section, in pp) and
draws the paper's figures from the CSV tables beside them:

* Figure 3 (``fig_cue_sign_tests.png``, from ``cue_sign_tests.csv``): per group,
  the runs that shift adversely (Gap > 0) and favorably (Gap < 0), with the
  two-sided binomial p of the sign test;
* Figure 4 (``fig_cue_net_by_group.png``, from ``cue_average_by_group.csv``):
  the mean over runs of the net bias per gender and race group under Direct and
  the headline Puzzled arm;
* Figure 5 (``fig_cue_status.png``, from ``cue_status_by_model.csv``): the
  bad-status could-be rate per group under Direct and the headline arm, the
  mean over runs as bars and each run as a point.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.figures import pyplot
from analysis.common.report import Drawing
from analysis.common.tables import md_rows
from analysis.cue.panel_tables import DIRECT, PaperTables, arm_key

STATUSES = {"bad": "Table 24", "good": "Tables 25-26", "neutral": "Tables 27-28"}


def _pp(x: object, sd: object = None) -> str:
    v = float(x)  # type: ignore[arg-type]
    if not np.isfinite(v):
        return "–"
    s = f"{100 * v:+.1f}"
    if sd is not None and np.isfinite(float(sd)):  # type: ignore[arg-type]
        s += f" ± {100 * float(sd):.1f}"  # type: ignore[arg-type]
    return s


def _pct(x: object) -> str:
    v = float(x)  # type: ignore[arg-type]
    return f"{100 * v:.1f}" if np.isfinite(v) else "–"


def _arms(frame: pd.DataFrame, col: str = "arm") -> list[str]:
    return sorted(dict.fromkeys(map(str, frame[col])), key=arm_key)


# ---------------------------------------------------------------------------- Markdown
def gap_by_level_md(t: pd.DataFrame) -> list[str]:
    """Table 39: one row per run (and the Average), one column per arm: the macro Gap in pp ± bootstrap SD."""
    arms = _arms(t)
    rows = []
    for name, sub in t.groupby("name", sort=False):
        cell = sub.set_index("arm")
        rows.append(
            [str(name), *(_pp(cell.loc[a, "gap"], cell.loc[a, "sd_gap"]) if a in cell.index else "–" for a in arms)]
        )
    mean = t.groupby("arm")["gap"].mean()
    rows.append(["Average", *(_pp(mean.get(a, np.nan)) for a in arms)])
    return md_rows(["run", *arms], rows)


def solve_md(t: pd.DataFrame) -> list[str]:
    """Table 5: per run and arm, the joint recovery accuracy (%) and P, the share of pairs answered (%)."""
    arms = _arms(t)
    rows = []
    for name, sub in t.groupby("name", sort=False):
        cell = sub.drop_duplicates("arm").set_index("arm")
        rows.append(
            [
                str(name),
                *(
                    f"{_pct(cell.loc[a, 'joint'])} (P {_pct(cell.loc[a, 'answered'])})" if a in cell.index else "–"
                    for a in arms
                ),
            ]
        )
    return md_rows(["run", *arms], rows)


def status_md(t: pd.DataFrame, avg: pd.DataFrame, status: str) -> list[str]:
    """Tables 24-28, one status: per (run, arm) and the Average per arm, the could-be rate (%) per group."""
    sub = t[t["status"] == status]
    if sub.empty:
        return []
    groups = list(dict.fromkeys(zip(sub["attr"], sub["group"], strict=True)))
    rows = []
    for arm in _arms(sub):
        part = sub[sub["arm"] == arm]
        for name, one in part.groupby("name", sort=False):
            cell = one.set_index(["attr", "group"])
            rows.append([str(name), arm, *(_pct(cell["rate"].get(g, np.nan)) for g in groups)])
        a = avg[(avg["status"] == status) & (avg["arm"] == arm)].set_index(["attr", "group"])
        rows.append(["Average", arm, *(_pct(a["rate"].get(g, np.nan)) for g in groups)])
    return md_rows(["run", "arm", *(g for _, g in groups)], rows)


def wordings_md(t: pd.DataFrame) -> list[str]:
    """Table 40: per (run, wording, arm), macro Favor, Against (%) and Net (pp) over all parsable answers."""
    rows = [
        [str(r.name), str(r.wording), str(r.arm), _pct(r.favor_all), _pct(r.against_all), _pp(r.net_all)]
        for r in t.itertuples()
    ]
    return md_rows(["run", "wording", "arm", "Fav.%", "Agst.%", "Net (pp)"], rows)


def topic_md(t: pd.DataFrame) -> list[str]:
    """Table 41: per (topic, arm), the mean over runs of Favor and Against (%), Net and Delta against (pp)."""
    rows = [
        [str(r.topic), str(r.arm), _pct(r.favor), _pct(r.against), _pp(r.net), _pp(r.d_against), str(r.runs_against)]
        for r in t.sort_values("topic", kind="stable").itertuples()
    ]
    return md_rows(["topic", "arm", "favor %", "against %", "net (pp)", "Δagainst (pp)", "runs"], rows)


def formal_named_md(t: pd.DataFrame) -> list[str]:
    """Table 42: per (run, level), the macro nets, D->P, D->FN (pp) and the % of the gap via FN."""
    rows = [
        [
            str(r.name),
            str(r.level),
            *(_pp(v) for v in (r.direct_net, r.puzzled_net, r.fn_net, r.d_to_p, r.d_to_fn)),
            _pct(r.share),
        ]
        for r in t.itertuples()
    ]
    return md_rows(["run", "level", "Direct", "Puzzled", "FormalNamed", "D→P", "D→FN", "% gap via FN"], rows)


def shapes_md(t: pd.DataFrame) -> list[str]:
    """Table 37: per model, the headline arm's macro net (pp) per solution shape and rand = mean(sol1, sol2)."""
    cols = ["orig", "sol1", "sol2", "rand", "random"]
    rows = [[str(r["model"]), *(_pp(r[c]) for c in cols)] for _, r in t.iterrows()]
    return md_rows(["model", "orig (canonical)", "sol1", "sol2", "rand", "random"], rows)


def paper_md(p: PaperTables, arm: str, cons: str) -> list[str]:
    """The summary's section of the paper's cross-model tables (each also a CSV, named in its heading)."""
    lines = [
        "## The paper's cross-model tables",
        "",
        f"Every arm the runs share, {cons} consequences, on the matched dilemmas; the decision rule and "
        "denominators of the rankings above unless a table says otherwise.",
        "",
        "### Table 39: the Gap at each arm (pp ± bootstrap SD; `cue_gap_by_level.csv`)",
        "",
        *gap_by_level_md(p.gap_by_level),
        "",
    ]
    if p.solve_by_level is not None:
        lines += ["### Table 5: identity recovery, joint % per arm (`cue_solve_by_level.csv`)", ""]
        lines += [*solve_md(p.solve_by_level), ""]
    if p.status is not None and p.status_average is not None:
        for status, label in STATUSES.items():
            body = status_md(p.status, p.status_average, status)
            if body:
                lines += [f"### {label}: {status}-status could-be rate % (`cue_status_by_model.csv`)", "", *body, ""]
    if p.wordings is not None:
        lines += ["### Table 40: what-if wordings, over all parsable answers (`cue_wordings_by_model.csv`)", ""]
        lines += [*wordings_md(p.wordings), ""]
    if p.topic_macro is not None:
        lines += ["### Table 41: direction by topic, mean over runs (`cue_topic_macro.csv`)", ""]
        lines += [*topic_md(p.topic_macro), ""]
    if p.formal_named is not None:
        lines += ["### Table 42: Direct, Puzzled and FormalNamed, macro net (`cue_formal_named.csv`)", ""]
        lines += [*formal_named_md(p.formal_named), ""]
    if p.shapes is not None:
        lines += [f"### Table 37: {arm} macro net per solution shape, same dilemmas (`cue_shapes.csv`)", ""]
        lines += [*shapes_md(p.shapes), ""]
    return lines


# ---------------------------------------------------------------------------- figures
def plot_sign_tests(sign_tests: pd.DataFrame, arm: str, prefix: str = "") -> Any:
    """Figure 3 from ``cue_sign_tests.csv``: per group, the runs with a positive (adverse) and a negative Gap."""
    plt = pyplot()
    st = sign_tests[(sign_tests["value"] == "gap") & (sign_tests["group"] != "macro")].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(6, 0.35 * len(st) + 1.6))
    y = np.arange(len(st))
    ax.barh(y, st["positive"], color="tab:red", label="adverse (Gap > 0)")
    ax.barh(y, -st["negative"], color="tab:green", label="favorable (Gap < 0)")
    for i, r in st.iterrows():
        ax.annotate(f"p = {r['p_value']:.3f}", (float(r["positive"]) + 0.1, float(i)), fontsize=7, va="center")
    ax.set_yticks(y, [f"{a}: {g}" for a, g in zip(st["attr"], st["group"], strict=True)], fontsize=7)
    ax.axvline(0, color="0.3", lw=0.8)
    ax.set_xlabel("runs (favorable left, adverse right)")
    ax.set_title(f"{prefix}sign tests of the Gap (Direct vs {arm}) across runs", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_net_by_group(average_by_group: pd.DataFrame, arm: str, prefix: str = "") -> Any:
    """Figure 4 from ``cue_average_by_group.csv``: the mean over runs of net bias per group, Direct and ``arm``."""
    plt = pyplot()
    t = average_by_group.reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(0.7 * len(t) + 2.5, 3.4))
    x = np.arange(len(t))
    ax.bar(x - 0.2, 100 * t["direct_net"], 0.4, label="Direct")
    ax.bar(x + 0.2, 100 * t["puzzled_net"], 0.4, label=arm)
    ax.set_xticks(x, list(t["group"]), rotation=30, fontsize=7)
    ax.axhline(0, color="0.3", lw=0.8)
    ax.set_ylabel("mean net bias over runs (pp)")
    ax.set_title(f"{prefix}net bias per group, Direct vs {arm}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_status(status: pd.DataFrame, arms: Sequence[str], prefix: str = "") -> Any:
    """Figure 5 from ``cue_status_by_model.csv``: the bad-status could-be rate per group under ``arms``, the mean
    over runs as bars, each run as a point."""
    plt = pyplot()
    bad = status[(status["status"] == "bad") & status["arm"].isin(arms)]
    groups = list(dict.fromkeys(bad["group"]))
    fig, ax = plt.subplots(figsize=(0.8 * len(groups) + 2.5, 3.4))
    x = np.arange(len(groups))
    width = 0.8 / len(arms)
    for k, arm in enumerate(arms):
        part = bad[bad["arm"] == arm]
        off = x - 0.4 + width * (k + 0.5)
        mean = part.groupby("group")["rate"].mean().reindex(groups)
        ax.bar(off, 100 * mean.to_numpy(), width, label=arm, alpha=0.7)
        for i, g in enumerate(groups):
            pts = part[part["group"] == g]["rate"]
            ax.scatter([off[i]] * len(pts), 100 * pts, s=8, color="black", zorder=3)
    ax.set_xticks(x, groups, rotation=30, fontsize=7)
    ax.set_ylabel("could-be yes rate, bad status (%)")
    ax.set_title(f"{prefix}bad-status bias per group (bars: mean over runs; points: runs)", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def paper_drawings(
    p: PaperTables, sign_tests: pd.DataFrame, average_by_group: pd.DataFrame, arm: str, tag: str = ""
) -> list[Drawing]:
    """Figures 3, 4 and 5 (Figure 5 where the runs have bad-status could-be answers); ``tag`` suffixes names."""
    sfx, pre = (f"_{tag}", f"{tag}: ") if tag else ("", "")
    out = [
        Drawing(f"fig_cue_sign_tests{sfx}.png", partial(plot_sign_tests, sign_tests, arm, pre)),
        Drawing(f"fig_cue_net_by_group{sfx}.png", partial(plot_net_by_group, average_by_group, arm, pre)),
    ]
    if p.status is not None and (p.status["status"] == "bad").any():
        out.append(Drawing(f"fig_cue_status{sfx}.png", partial(plot_status, p.status, [DIRECT, arm], pre)))
    return out
