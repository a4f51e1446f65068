"""Decomposition of the forced yes/no verdict (paper 003, Eq. 1).

For each story and printed order ``o`` (yes-first ``yf`` / no-first ``nf``)::

    bias_o   = P(CBR | approve, o) - P(CBR | oppose, o)
    lexical  = (bias_yf + bias_nf) / 2      # pull toward the word "yes" (negative: toward "no")
    order    = (bias_yf - bias_nf) / 2      # pull toward the first-printed option
    apparent = bias_yf = lexical + order    # what the standard "yes or no" question shows
    z        = mean over the four cells of 2 P(CBR) - 1   # the story's I-3 stance

The verb is taken **relative to the cost-benefit pole**: "approve" means that
answering *yes* endorses the CBR pole. For the usual item (the CBR pole is the
action) that is the question's own verb; for an item whose CBR pole is the
complement, "Is it acceptable to <action>?" is an *oppose* question in this
sense. With that reading, lexical = mean(2 P(yes) - 1) for every item, so the
components keep their meaning (and sign) across the whole item set.

A trial with no usable answer (every sampled draw refused or unparsable) has
no P(CBR): it is left out of its cell, as the paper excludes refusals. A story
with a cell left empty that way has no z or decomposition; it is dropped and
named (:func:`empty_cells`), as the paper drops them ("Haiku think lacks two
stories"). A cell the *design* lacks (no trial at all) is still an error.

All functions are pure and take tidy frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

CELLS = [("approve", "yes_first"), ("approve", "no_first"), ("oppose", "yes_first"), ("oppose", "no_first")]


def p_cbr(options: pd.DataFrame) -> pd.Series:
    """P(CBR) per trial: the normalized probability of the options that mean ``cbr``.

    NaN for a trial whose probabilities are all NaN: a sampled trial in which
    every draw was refused or unparsable has no answer, not P(CBR) = 0 (the
    sum of an empty group would be 0 and bias z toward the anti pole).
    """
    trial = options["trial_id"]
    cbr = options["prob"].where(options["meaning"] == "cbr", 0.0)
    usable = options["prob"].notna().groupby(trial).any()
    return cbr.groupby(trial).sum().where(usable).rename("p_cbr")


@dataclass(frozen=True)
class Dropped:
    """A story left out of an analysis, and why (listed in the report)."""

    item_id: str
    analysis: str
    """Which table lost it (e.g. ``yes/no verb flip``, ``(s, m) fit: order``)."""
    reason: str


def empty_cells(values: pd.DataFrame, cells: Sequence[str], analysis: str) -> tuple[Dropped, ...]:
    """The stories with a design cell whose every trial has no P(CBR) (NaN), one :class:`Dropped` per story.

    ``values`` has ``item_id``, the ``cells`` columns and ``p_cbr`` (one row
    per trial). The reason names each empty cell and its trial count.
    """
    cols = list(cells)
    g = values.groupby(["item_id", *cols], sort=True)["p_cbr"]
    usable = g.count()
    size = g.size()
    empty = usable[usable == 0].index
    out: dict[str, list[str]] = {}
    for key in empty:
        item, *levels = key if isinstance(key, tuple) else (key,)
        cell = ", ".join(f"{c}={v}" for c, v in zip(cols, levels, strict=True))
        out.setdefault(str(item), []).append(f"{cell} ({size[key]} trials)")
    return tuple(
        Dropped(item, analysis, "no usable answer (every draw refused or unparsable) in " + "; ".join(where))
        for item, where in out.items()
    )


def with_cbr_verb(per_trial: pd.DataFrame, options: pd.DataFrame) -> pd.DataFrame:
    """Add ``cbr_verb``: ``approve`` where answering yes endorses the CBR pole, else ``oppose``.

    Derived from the stored option meanings, not re-derived from the item: the
    first-printed option is *yes* under ``yes_first``, so its meaning (flipped
    under ``no_first``) is what *yes* means in that trial.
    """
    first = options[options["position"] == 0].set_index("trial_id")["meaning"]
    df = per_trial.copy()
    first_meaning = df["trial_id"].map(first)
    if first_meaning.isna().any():
        raise ValueError(f"{int(first_meaning.isna().sum())} trials have no printed options in the results")
    yes_is_cbr = (first_meaning == "cbr") == (df["order"] == "yes_first")
    df["cbr_verb"] = yes_is_cbr.map({True: "approve", False: "oppose"})
    return df


def cell_table(per_trial: pd.DataFrame, pcbr: pd.Series, replicate: int = 0) -> pd.DataFrame:
    """Mean P(CBR) per (item, CBR-relative verb, order), averaged over wording forms, for one salt replicate.

    ``per_trial`` needs the ``cbr_verb`` column of :func:`with_cbr_verb`.
    Trials without a P(CBR) (no usable answer) are left out of their cell;
    an item with a cell left empty that way is dropped (:func:`dropped_stories`
    names it). A cell the design lacks for an item is an error naming the items.
    """
    df = _cell_frame(per_trial, pcbr, replicate)
    g = df.groupby(["item_id", "cbr_verb", "order"], sort=False)["p_cbr"]
    cells = g.mean().unstack(["cbr_verb", "order"])
    present = g.size().unstack(["cbr_verb", "order"])
    missing = [c for c in CELLS if c not in cells.columns]
    if missing:
        raise ValueError(f"yes/no cells missing from the run: {missing}; the battery needs all four verb x order cells")
    cells, present = cells[CELLS], present[CELLS]
    holes = present.index[present.isna().any(axis=1)].tolist()
    if holes:
        raise ValueError(f"yes/no cells missing for items {holes}; every item needs all four verb x order cells")
    cells = cells.dropna()
    cells.columns = [f"p_cbr_{v}_{o}" for v, o in CELLS]
    return cells


def _cell_frame(per_trial: pd.DataFrame, pcbr: pd.Series, replicate: int) -> pd.DataFrame:
    return per_trial[per_trial["replicate"] == replicate].join(pcbr, on="trial_id")


def dropped_stories(per_trial: pd.DataFrame, pcbr: pd.Series, replicate: int = 0) -> tuple[Dropped, ...]:
    """The stories :func:`cell_table` drops: a verb x order cell with no usable answer."""
    return empty_cells(_cell_frame(per_trial, pcbr, replicate), ["cbr_verb", "order"], "yes/no verb flip")


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
    """Within-form SD of P(CBR) across replicates (the unsalted one included), per (item, form, verb, order).

    Every replicate, salted or not, is one draw of a meaningless context around
    the same question, so all of them enter the noise floor.
    """
    df = per_trial.join(pcbr, on="trial_id")
    return df.groupby(["item_id", "form", "verb", "order"])["p_cbr"].std(ddof=1).rename("salt_sd")


def story_mean_ci(values: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Per column of ``values`` (one row per story): the story-averaged value and its percentile bootstrap CI.

    Stories are resampled with replacement (``n_boot`` resamples from
    ``numpy.random.default_rng(seed)``); a column's NaN stories are left out
    of that column. Columns: ``mean``, ``lo``, ``hi``, ``n`` (the paper's
    "bootstrap 95% CIs" on the story-averaged biases, Figs. 2, 5, 6).
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    alpha = (1 - level) / 2
    rows = {}
    for col in values.columns:
        x = values[col].dropna().to_numpy(float)
        if len(x) == 0:
            rows[col] = {"mean": np.nan, "lo": np.nan, "hi": np.nan, "n": 0}
            continue
        idx = np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))
        lo, hi = np.quantile(x[idx].mean(axis=1), [alpha, 1 - alpha])
        rows[col] = {"mean": float(x.mean()), "lo": float(lo), "hi": float(hi), "n": len(x)}
    return pd.DataFrame.from_dict(rows, orient="index")
