"""Paper 000's published per-condition counts in ``probe import``'s schema.

The authors of "Direction-Flipped Influence Audits Reveal Hidden Structure in
Moral Choices of LLMs" publish one row per (benchmark, model, factor, influence)
with the six counts (GitHub PredictablyWeird/Choices, branch arxiv-version-2,
``pipeline/data/pvalues_by_condition.csv``, MIT). Its columns differ from
:mod:`analysis.influence.imported`'s schema in names only: ``nudge_type`` for
``influence``, ``level_A`` / ``level_B`` for ``level_a`` / ``level_b``,
``trolley`` for ``triage``, and the reasoning mode is a suffix of the model
name (``-reasoning`` / ``-non-reasoning``; no suffix: reasoning off).
:func:`choices_frame` renames, nothing else; the counts pass unchanged.

The per-benchmark summaries the paper's numbers are computed from
(``experiments/asymmetry-regression/data/{trolley,bbq,dailydilemmas}_summary.csv``
on the same branch) give frequencies, not counts: ``f_0_B``, ``f_A_B``,
``f_B_B`` and ``n_comparisons``, with the reasoning mode in
``reasoning_condition`` (``off`` / ``none``: off; ``low`` / ``before``, the
latter Llama's step-by-step prompt: on). :func:`summary_frame` turns them into
counts the way the authors' own pipeline does for DailyDilemmas
(``pipeline/produce_paper_artifacts.py``, ``_reconstruct_dd_pvalues``): each arm
holds ``n_comparisons x k`` answers and ``c = round(f x n)``, with k = 8 on the
triage task (100 size pairs x 8), 2 on BBQ (125 questions x both orders: the
arms of the published counts hold 250) and 3 on DailyDilemmas (the authors'
assumption). Where invalid answers were discarded the true arm is smaller; the
paper's DailyDilemmas numbers rest on the same assumption. (The authors'
pipeline takes k = 8 on BBQ for its neutrality tests, which makes BBQ's
binomial and Wilson rows of Table 21 stricter than the data; docs/papers.md.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

BENCHMARKS = {"trolley": "triage", "bbq": "bbq", "dailydilemmas": "dd"}
INFLUENCES = {
    "survey_preference": "survey",
    "few_shot_3": "few_shot",
    "few_shot_value": "few_shot",
    "virtue": "virtue_appeal",
}
KINDS = {"role_play": "system", "few_shot": "turns"}
"""Where a cue sits (the paper's F.1): role-play replaces the system prompt, few-shot is prior turns, the rest
are sentences."""
COLUMNS = ("benchmark", "model", "factor", "nudge_type", "level_A", "level_B")
COUNTS = ("c_0_A", "c_0_B", "c_A_A", "c_A_B", "c_B_A", "c_B_B")


def model_mode(name: str) -> tuple[str, bool]:
    """``gpt-5-2-reasoning`` -> (``gpt-5-2``, True); ``gpt-5-2-non-reasoning`` -> (``gpt-5-2``, False);
    no suffix -> (name, False)."""
    if name.endswith("-non-reasoning"):
        return name[: -len("-non-reasoning")], False
    if name.endswith("-reasoning"):
        return name[: -len("-reasoning")], True
    return name, False


def choices_frame(raw: pd.DataFrame) -> pd.DataFrame:
    """The published table ``raw`` as rows of ``probe import``'s schema (counts)."""
    missing = [c for c in (*COLUMNS, *COUNTS) if c not in raw.columns]
    if missing:
        raise ValueError(f"not the published per-condition table: columns {missing} missing (have {list(raw.columns)})")
    bad = sorted(set(raw["benchmark"]) - set(BENCHMARKS))
    if bad:
        raise ValueError(f"unknown benchmark(s) {bad}; known: {sorted(BENCHMARKS)}")
    modes = [model_mode(str(m)) for m in raw["model"]]
    influence = raw["nudge_type"].map(lambda x: INFLUENCES.get(str(x), str(x)))
    out = pd.DataFrame(
        {
            "model": [m for m, _ in modes],
            "reasoning": ["on" if r else "off" for _, r in modes],
            "benchmark": raw["benchmark"].map(BENCHMARKS),
            "factor": raw["factor"].astype(str),
            "level_a": raw["level_A"].astype(str),
            "level_b": raw["level_B"].astype(str),
            "influence": influence,
            "kind": influence.map(lambda x: KINDS.get(x, "sentence")),
        }
    )
    for c in COUNTS:
        out[c] = raw[c].astype(int)
    return out


PER_COMPARISON = {"triage": 8, "bbq": 2, "dd": 3}
"""Answers per comparison and arm that the paper's pipeline assumes (``n_comparisons x k``)."""
REASONING = {"off": False, "none": False, "low": True, "before": True}
PAPER_MODELS = (
    "deepseek-v3-2-non-reasoning",
    "deepseek-v3-2-reasoning",
    "gpt-5-2-non-reasoning",
    "gpt-5-2-reasoning",
    "grok-41-fast-non-reasoning",
    "grok-41-fast-reasoning",
    "llama-33-70b",
    "qwen3-235b-a22b-2507",
    "qwen3-235b-a22b-2507-reasoning",
)
"""The nine model configurations the paper reports (its pipeline's ``PAPER_MODELS``); the summaries hold more."""
PAPER_FACTORS = {"triage": ("age_group", "gender", "handedness", "nationality", "wealth")}
PAPER_DROPPED = {"dd": ("dishonesty",)}
"""DailyDilemmas' value the paper leaves out (saturated at 0%, G.1)."""


def paper_rows(raw: pd.DataFrame, benchmark: str) -> pd.DataFrame:
    """The rows of a published summary the paper reports: its nine model configurations, the triage task's five
    factors, DailyDilemmas without dishonesty."""
    keep = raw["model"].isin(PAPER_MODELS)
    if benchmark in PAPER_FACTORS:
        keep &= raw["factor"].isin(PAPER_FACTORS[benchmark])
    if benchmark in PAPER_DROPPED:
        keep &= ~raw["factor"].isin(PAPER_DROPPED[benchmark])
    return raw[keep]


def summary_frame(raw: pd.DataFrame, benchmark: str, paper: bool = True) -> pd.DataFrame:
    """A published per-benchmark summary (frequencies) as rows of ``probe import``'s schema (counts, see the module
    docstring); ``paper``: only the rows the paper reports (:func:`paper_rows`)."""
    if benchmark not in PER_COMPARISON:
        raise ValueError(f"benchmark {benchmark!r}: give one of {sorted(PER_COMPARISON)}")
    need = [
        "model",
        "reasoning_condition",
        "factor",
        "level_A",
        "level_B",
        "nudge_type",
        "n_comparisons",
        "f_0_B",
        "f_A_B",
        "f_B_B",
    ]
    missing = [c for c in need if c not in raw.columns]
    if missing:
        raise ValueError(f"not a published summary: columns {missing} missing (have {list(raw.columns)})")
    bad = sorted(set(raw["reasoning_condition"].astype(str)) - set(REASONING))
    if bad:
        raise ValueError(f"unknown reasoning_condition(s) {bad}; known: {sorted(REASONING)}")
    src = paper_rows(raw, benchmark) if paper else raw
    n = src["n_comparisons"].astype(int) * PER_COMPARISON[benchmark]
    influence = src["nudge_type"].map(lambda x: INFLUENCES.get(str(x), str(x)))
    out = pd.DataFrame(
        {
            "model": src["model"].map(lambda m: model_mode(str(m))[0]),
            "reasoning": src["reasoning_condition"].map(lambda r: "on" if REASONING[str(r)] else "off"),
            "benchmark": benchmark,
            "factor": src["factor"].astype(str),
            "level_a": src["level_A"].astype(str),
            "level_b": src["level_B"].astype(str),
            "influence": influence,
            "kind": influence.map(lambda x: KINDS.get(x, "sentence")),
        }
    )
    for arm, col in (("0", "f_0_B"), ("A", "f_A_B"), ("B", "f_B_B")):
        k = (src[col].astype(float) * n).round().astype(int)
        out[f"c_{arm}_A"], out[f"c_{arm}_B"] = n - k, k
    return out[[*out.columns[:8], *COUNTS]].reset_index(drop=True)


def convert(
    src: str | Path, dst: str | Path, benchmark: str | None = None, paper: bool = True, models: str | None = None
) -> pd.DataFrame:
    """Read the published CSV ``src`` (``.csv`` or ``.csv.gz``) and write it in the schema to ``dst``: a summary
    of ``benchmark`` (:func:`summary_frame`), or with no benchmark the table of counts (:func:`choices_frame`);
    ``models``: comma-separated schema model names to keep (e.g. ``gpt-5-2`` for Tables 12 and 13). Returns what
    was written."""
    raw = pd.read_csv(src)
    out = summary_frame(raw, benchmark, paper) if benchmark else choices_frame(raw)
    if models:
        keep = [m.strip() for m in models.split(",") if m.strip()]
        unknown = sorted(set(keep) - set(out["model"]))
        if unknown:
            raise ValueError(f"--models {unknown} not in {src}; its models: {sorted(set(out['model']))}")
        out = out[out["model"].isin(keep)]
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(dst, index=False)
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m analysis.influence.published``."""
    ap = argparse.ArgumentParser(
        prog="python -m analysis.influence.published",
        description="paper 000's published per-condition results in probe import's schema",
    )
    ap.add_argument("src", help="a published summary (give --benchmark) or the table of counts (pvalues_by_condition)")
    ap.add_argument("--out", required=True, help="the schema CSV to write (then: probe import OUT --out RUN)")
    ap.add_argument("--benchmark", choices=sorted(PER_COMPARISON), help="the summary's benchmark")
    ap.add_argument("--all-rows", action="store_true", help="keep the models and factors the paper does not report")
    ap.add_argument("--models", default=None, help="comma-separated models to keep (e.g. gpt-5-2)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """``python -m analysis.influence.published SRC --out DST [--benchmark triage|bbq|dd] [--all-rows] [--models M]``."""
    a = build_parser().parse_args(argv)
    out = convert(a.src, a.out, a.benchmark, paper=not a.all_rows, models=a.models)
    print(f"wrote {len(out)} conditions of {a.src} to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
