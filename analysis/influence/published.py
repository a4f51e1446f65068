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
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

BENCHMARKS = {"trolley": "triage", "bbq": "bbq", "dailydilemmas": "dd"}
INFLUENCES = {"survey_preference": "survey", "few_shot_3": "few_shot"}
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


def convert(src: str | Path, dst: str | Path) -> pd.DataFrame:
    """Read the published CSV ``src`` and write it in the schema to ``dst``; returns what was written."""
    out = choices_frame(pd.read_csv(src))
    out.to_csv(dst, index=False)
    return out
