"""The battery report (paper 003): every table and figure the run's instruments allow.

Each section takes the run's frames and returns Markdown lines and the files
it wrote; a section whose instrument is absent says what is missing instead,
so a partial run still yields the tables it can (``probe analyze`` never
fails because, say, the free-choice instrument was not run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis import plots
from analysis.binary import cell_events, lexicality_gradient, projections
from analysis.frames import choice_probs, trial_meta
from analysis.yesno import CELLS, decompose
from probe.store import RunStore, atomic_write_text


@dataclass
class Frames:
    """What every section reads."""

    options: pd.DataFrame
    per_trial: pd.DataFrame
    source: str
    manifest: dict[str, Any]
    judgments: pd.DataFrame
    samples: pd.DataFrame
    readout_options: pd.DataFrame
    meta: pd.DataFrame
    """One row per trial of the run (all instruments), with its factors."""
    results: dict[str, Any] = field(default_factory=dict)
    """Per-item series that later sections reuse (theta, z, choice stance)."""

    def instrument(self, name: str) -> pd.DataFrame:
        if "instrument" not in self.per_trial:
            return self.per_trial.iloc[0:0]
        return self.per_trial[self.per_trial["instrument"] == name]


@dataclass
class Section:
    title: str
    lines: list[str]
    files: list[Path]


def md_table(df: pd.DataFrame, fmt: str = "{:+.3f}") -> str:
    cols = [str(df.index.name or ""), *map(str, df.columns)]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for idx, row in df.iterrows():
        cells = []
        for v in row:
            if isinstance(v, float | np.floating):
                cells.append("" if np.isnan(v) else fmt.format(v))
            else:
                cells.append(str(v))
        out.append("| " + " | ".join([str(idx), *cells]) + " |")
    return "\n".join(out)


def _with_mean(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    out.loc["mean"] = df.mean(numeric_only=True)
    return out


# ------------------------------------------------------------------- sections
def verbflip_section(f: Frames, out: Path) -> Section:
    """The yes/no verb-flip family: per-story cells, z, lexical, order, apparent (Eq. 1)."""
    b = f.instrument("binary")
    b = b[(b["labels"] == "Yes/No") & (b["replicate"] == 0)] if len(b) else b
    if b.empty:
        return Section(
            "Forced binary, yes/no verb flip (I-3)", ["Not in this run (instrument binary, labels Yes/No)."], []
        )
    from analysis.yesno import p_cbr

    df = b.join(p_cbr(f.options), on="trial_id")
    cells = df.groupby(["item_id", "verb", "order"])["p_cbr"].mean().unstack(["verb", "order"])
    missing = [c for c in CELLS if c not in cells.columns]
    if missing:
        return Section("Forced binary, yes/no verb flip (I-3)", [f"Cells missing from the run: {missing}."], [])
    cells = cells[CELLS]
    cells.columns = [f"p_cbr_{v}_{o}" for v, o in CELLS]
    cells = cells.dropna()
    dec = decompose(cells)
    f.results["z"] = dec["z"]
    f.results["verbflip"] = dec
    table = _with_mean(cells.join(dec))
    table.index.name = "dilemma"
    atomic_write_text(out / "binary_verbflip.csv", table.to_csv(float_format="%.6f"))
    fig = plots.grouped_bars(
        _with_mean(dec[["order", "lexical", "apparent"]]),
        ["order", "lexical", "apparent"],
        out / "fig_bias_decomposition.png",
        "Yes/no bias decomposition per dilemma (apparent = order + lexical)",
        "bias on the [-1, 1] axis",
    )
    identity = float((dec["apparent"] - dec["order"] - dec["lexical"]).abs().max())
    n_forms = b["form"].nunique()
    short = table[["z", "lexical", "order", "apparent"]]
    lines = [
        f"{len(dec)} dilemmas x {n_forms} forms x approve/oppose x yes-first/no-first. "
        "lexical = pull toward the word yes (negative: toward no); order = pull toward the first-printed option "
        "(negative: toward the last); apparent = what one 'yes or no' question shows. "
        f"Identity apparent = order + lexical holds to {identity:.1e}.",
        "",
        md_table(short),
    ]
    return Section("Forced binary, yes/no verb flip (I-3)", lines, [out / "binary_verbflip.csv", fig])


def labelmap_section(f: Frames, out: Path) -> Section:
    """Order / logic / label projections per label pair, and the lexicality gradient."""
    from experiments.battery import load_corpus

    b = f.instrument("binary")
    b = b[(b["labels"] != "Yes/No") & (b["replicate"] == 0)] if len(b) else b
    if b.empty:
        return Section("Label map (I-3)", ["Not in this run (no label pairs beyond Yes/No)."], [])
    corpus = load_corpus(f.manifest["spec"].get("corpus"))
    labels = corpus["binary"]["labels"]
    cb = {k for k, v in labels.items() if v.get("counterbalance")}
    proj = projections(cell_events(b, f.options), cb)
    by_pair, contrast = lexicality_gradient(proj, {k: int(v.get("lexicality", -1)) for k, v in labels.items()})
    by_pair.index.name = "label pair"
    atomic_write_text(out / "binary_labelmap.csv", proj.to_csv(float_format="%.6f"))
    atomic_write_text(out / "binary_label_gradient.csv", by_pair.to_csv(float_format="%.6f"))
    fig = plots.grouped_bars(
        by_pair[["order", "logic"]].rename(columns={"logic": "label pull (verdict)"}),
        ["order", "label pull (verdict)"],
        out / "fig_label_gradient.png",
        "Label pairs ordered non-lexical -> lexical: order bias and label pull",
        "story-averaged bias",
    )
    lines = [
        "Per label pair, averaged over dilemmas: order = mean(2 P(first printed) - 1); label pull (logic) = "
        "mean(2 P(yes-mapped label) - 1); label = attachment to the printed label itself (counterbalanced "
        "pairs only). Lexicality: 0 non-lexical, 1 mark, 2 word.",
        "",
        md_table(by_pair[["lexicality", "order", "logic", "label", "z"]]),
        "",
        f"Lexicality contrast (mean |label pull| on word pairs minus non-lexical pairs): {contrast:+.3f} (descriptive).",
    ]
    return Section("Label map (I-3)", lines, [out / "binary_labelmap.csv", out / "binary_label_gradient.csv", fig])


def choice_section(f: Frames, out: Path) -> Section:
    """Free choice: P(PRO), P(ANTI), P(NONCOMMIT) per dilemma and the choice stance P(PRO) - P(ANTI)."""
    j = f.judgments
    if j.empty:
        return Section("Free choice (I-2)", ["Not in this run (instrument choice, or no judge)."], [])
    meta = f.meta[f.meta["instrument"] == "choice"].set_index("trial_id")[["item_id", "framing", "order"]]
    d = j.join(meta, on="trial_id")
    per_item = d.groupby("item_id")[["p_pro", "p_anti", "p_noncommit"]].mean()
    per_item["stance"] = per_item["p_pro"] - per_item["p_anti"]
    per_form = d.groupby(["item_id", "framing", "order"])[["p_pro", "p_anti"]].mean()
    spread = (per_form["p_pro"] - per_form["p_anti"]).groupby("item_id").std(ddof=1)
    per_item["sd_across_forms"] = spread
    f.results["choice"] = per_item["stance"]
    per_item.index.name = "dilemma"
    atomic_write_text(out / "choice_by_item.csv", per_item.to_csv(float_format="%.6f"))
    judge = ", ".join(sorted(set(j["judge"])))
    lines = [
        f"Verdicts by judge `{judge}` over {len(j)} replies ({d['framing'].nunique()} framings x 2 print orders per "
        "dilemma); stance = P(PRO) - P(ANTI); sd_across_forms is descriptive. Transcripts: the run's "
        "`generations` table.",
        "",
        md_table(_with_mean(per_item)),
    ]
    return Section("Free choice (I-2)", lines, [out / "choice_by_item.csv"])


SECTIONS: list[Callable[[Frames, Path], Section]] = [verbflip_section, labelmap_section, choice_section]


def load_frames(store: RunStore) -> Frames:
    opts, per_trial, source = choice_probs(store)
    return Frames(
        options=opts,
        per_trial=per_trial,
        source=source,
        manifest=store.manifest(),
        judgments=store.load("judgments"),
        samples=store.load("samples"),
        readout_options=store.load("readout_options"),
        meta=trial_meta(store),
    )


def battery_report(store: RunStore, out: Path) -> list[Path]:
    """Write every section's tables and figures, and ``summary.md`` with all of them."""
    out.mkdir(parents=True, exist_ok=True)
    f = load_frames(store)
    man = f.manifest
    eng = man.get("engine", {})
    head = [
        f"# Crossed-frame battery: {eng.get('settings', {}).get('model', eng.get('model', '?'))}",
        "",
        f"- run `{store.root}`: {man.get('n_trials')} trials, run key `{man.get('run_key')}`; engine "
        f"{eng.get('engine', '?')} ({eng.get('model_class', '')} {eng.get('dtype', '')} {eng.get('device', '')})",
        f"- probabilities from: {f.source}; think mode: {eng.get('settings', {}).get('think', False)}",
        "- error bars: incoherence spreads are descriptive; CIs are percentile bootstraps over items (inferential)",
        "",
    ]
    files: list[Path] = []
    body: list[str] = []
    for make in SECTIONS:
        s = make(f, out)
        body += [f"## {s.title}", "", *s.lines, ""]
        files += s.files
    atomic_write_text(out / "summary.md", "\n".join(head + body))
    return [out / "summary.md", *files]
