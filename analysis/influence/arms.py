"""Report tables of paper 000's extra arms: J.4's random contexts (Table 17) and the cue paraphrases.

Both are pure functions of a run's condition table (``conditions.csv``,
:func:`experiments.influence.effects.condition_table` plus FDR), so they appear
in a report only where a run holds such arms (variant ``random``; influence
names ``cue~paraphrase``) and leave every other report as it was.

**Random contexts** name no group, so "toward A" and "toward B" are only the two
slots the paper ran each context in ("the two influence directions tested per
(model, influence type, factor) cell", Table 17); the two slots carry different
random strings. What Table 17 reports is whether the choice frequencies shift
under the context: here, per condition, the shift of f(B) in each slot from the
baseline f_0(B), its test (the run's shift test: two-proportion z on counts, z on
the bootstrap SE for readouts) and how many of the two slots shift significantly
at raw p < 0.05, the paper's threshold.
"""

from __future__ import annotations

from typing import Final

import pandas as pd

from analysis.influence.audit import summary_by
from experiments.influence.contexts import STEP_FACTOR
from experiments.influence.design import PAPER_WORDING, WORDING_SEP

ALPHA: Final[float] = 0.05
"""Table 17's threshold: raw p < 0.05 (not FDR-corrected)."""
RANDOM: Final[str] = "random"
"""The variant of a random-context arm (:mod:`experiments.influence.contexts`)."""
ARM_SECTIONS: Final[tuple[tuple[str, str], ...]] = (
    ("table17_random", "Random contexts (J.4, Table 17): significant shifts of f(B) out of the two slots, p < 0.05"),
    ("controls_random", "Random contexts, per condition (name no group; slot A/B = the two runs of each context)"),
    ("by_wording", "Cue wordings (paraphrases; paper = the paper's sentence), main cues"),
)
"""The report sections of these tables (table stem, title), shown where the table exists."""


def random_contexts(cond: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """One row per random-context condition: f_0(B), f(B) in each slot, the shifts of f(B), their p-values, and
    ``sig`` = significant slots out of 2 (raw ``p < alpha``)."""
    c = cond[cond["variant"] == RANDOM]
    rows = []
    for r in c.itertuples(index=False):
        p_a, p_b = float(r.p_delta_A), float(r.p_delta_B)
        n_sig = int(p_a < alpha) + int(p_b < alpha)
        rows.append(
            {
                "pair": r.pair,
                "influence": r.influence,
                "position": r.position,
                "f0_B": r.f0_B,
                "f_slotA_B": r.fA_B,
                "f_slotB_B": r.fB_B,
                "shift_slotA_B": r.fA_B - r.f0_B,
                "shift_slotB_B": r.fB_B - r.f0_B,
                "p_slotA": p_a,
                "p_slotB": p_b,
                "sig": f"{n_sig}/2",
            }
        )
    return pd.DataFrame(rows)


def table17(cond: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """Table 17's layout for one run: rows = random context, columns = pair (factor), cells = significant shifts
    out of the two slots; ``all`` = over the pairs."""
    rc = random_contexts(cond, alpha)
    if rc.empty:
        return pd.DataFrame()
    n_sig = rc["sig"].str.split("/").str[0].astype(int)
    rc = rc.assign(n_sig=n_sig, n=2)
    rows = []
    for infl, g in rc.groupby("influence", sort=False):
        row: dict[str, object] = {"influence": infl}
        for pair, h in g.groupby("pair", sort=False):
            row[str(pair)] = f"{int(h['n_sig'].sum())}/{int(h['n'].sum())}"
        row["all"] = f"{int(g['n_sig'].sum())}/{int(g['n'].sum())}"
        rows.append(row)
    return pd.DataFrame(rows)


def has_paraphrases(cond: pd.DataFrame) -> bool:
    """Whether the run crossed cue paraphrases (an influence named ``cue~paraphrase``)."""
    return bool(cond["influence"].astype(str).str.contains(WORDING_SEP, regex=False).any())


def by_wording(cond: pd.DataFrame) -> pd.DataFrame:
    """The main cues' summary (:func:`analysis.influence.audit.summary_by`) per cue and wording (``paper`` = the
    paper's sentence): how much the effect depends on the words, cue by cue."""
    main = cond[cond["variant"] == "cue"]
    parts = main["influence"].astype(str).str.partition(WORDING_SEP)
    wording = parts[2].where(parts[2] != "", PAPER_WORDING)
    return summary_by(main.assign(cue=parts[0], wording=wording), ["cue", "wording"])


def step_lines(cells: pd.DataFrame) -> list[str]:
    """The summary-head line of a step-by-step run (its trials carry the ``prompting`` factor); none otherwise."""
    name, value = STEP_FACTOR
    if name not in cells.columns or not (cells[name] == value).any():
        return []
    return [
        "- prompting: **step-by-step** (paper 000, Table 2): every user message starts with the design's "
        "chain-of-thought instruction; read sampled answers (a readout reads the first token, before any reasoning)"
    ]
