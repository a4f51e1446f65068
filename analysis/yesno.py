"""Decomposition of the forced yes/no verdict (paper 003, Eq. 1).

For each story and printed order ``o`` (yes-first ``yf`` / no-first ``nf``)::

    bias_o   = P(CBR | approve, o) - P(CBR | oppose, o)
    lexical  = (bias_yf + bias_nf) / 2      # pull toward the word "yes" (negative: toward "no")
    order    = (bias_yf - bias_nf) / 2      # pull toward the first-printed option
    apparent = bias_yf = lexical + order    # what the standard "yes or no" question shows
    z        = mean over the four cells of 2 P(CBR) - 1   # the story's I-3 stance

All functions are pure and take tidy frames.
"""

from __future__ import annotations

import pandas as pd

CELLS = [("approve", "yes_first"), ("approve", "no_first"), ("oppose", "yes_first"), ("oppose", "no_first")]


def p_cbr(options: pd.DataFrame) -> pd.Series:
    """P(CBR) per trial: the normalized probability of the options that mean ``cbr``."""
    cbr = options["prob"].where(options["meaning"] == "cbr", 0.0)
    return cbr.groupby(options["trial_id"]).sum().rename("p_cbr")


def cell_table(per_trial: pd.DataFrame, pcbr: pd.Series, replicate: int = 0) -> pd.DataFrame:
    """Mean P(CBR) per (item, verb, order), averaged over wording forms, for one salt replicate."""
    df = per_trial[per_trial["replicate"] == replicate].join(pcbr, on="trial_id")
    cells = df.groupby(["item_id", "verb", "order"], sort=False)["p_cbr"].mean().unstack(["verb", "order"])
    missing = [c for c in CELLS if c not in cells.columns]
    if missing:
        raise ValueError(f"yes/no cells missing from the run: {missing}; the battery needs all four verb x order cells")
    cells = cells[CELLS]
    cells.columns = [f"p_cbr_{v}_{o}" for v, o in CELLS]
    return cells


def decompose(cells: pd.DataFrame) -> pd.DataFrame:
    """Per-item stance z and the lexical / order / apparent components (see the module docstring)."""
    bias_yf = cells["p_cbr_approve_yes_first"] - cells["p_cbr_oppose_yes_first"]
    bias_nf = cells["p_cbr_approve_no_first"] - cells["p_cbr_oppose_no_first"]
    out = pd.DataFrame(index=cells.index)
    out["z"] = (2 * cells - 1).mean(axis=1)
    out["bias_yes_first"] = bias_yf
    out["bias_no_first"] = bias_nf
    out["lexical"] = (bias_yf + bias_nf) / 2
    out["order"] = (bias_yf - bias_nf) / 2
    out["apparent"] = bias_yf
    return out


def salt_noise(per_trial: pd.DataFrame, pcbr: pd.Series) -> pd.Series:
    """Within-form SD of P(CBR) across salted replicates, per (item, form, verb, order)."""
    df = per_trial.join(pcbr, on="trial_id")
    return df.groupby(["item_id", "form", "verb", "order"])["p_cbr"].std(ddof=1).rename("salt_sd")
