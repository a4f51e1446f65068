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

from analysis.common.bootstrap import check_bootstrap, quantile_ci, resample_index
from analysis.common.records import Record
from probe.errors import NotComputed

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
    first = options[options["option_index"] == 0].set_index("trial_id")["meaning"]
    df = per_trial.copy()
    first_meaning = df["trial_id"].map(first)
    if first_meaning.isna().any():
        raise NotComputed(f"{int(first_meaning.isna().sum())} trials have no printed options in the results")
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
        raise NotComputed(f"yes/no cells missing from the run: {missing}; the battery needs all four verb x order cells")
    cells, present = cells[CELLS], present[CELLS]
    holes = present.index[present.isna().any(axis=1)].tolist()
    if holes:
        raise NotComputed(f"yes/no cells missing for items {holes}; every item needs all four verb x order cells")
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
    check_bootstrap(level, n_boot, min_boot=1)
    rows = {}
    for col in values.columns:
        x = values[col].dropna().to_numpy(float)
        if len(x) == 0:
            rows[col] = {"mean": np.nan, "lo": np.nan, "hi": np.nan, "n": 0}
            continue
        lo, hi = quantile_ci(x[resample_index(len(x), n_boot, seed)].mean(axis=1), level)
        rows[col] = {"mean": float(x.mean()), "lo": float(lo), "hi": float(hi), "n": len(x)}
    return pd.DataFrame.from_dict(rows, orient="index")


# ------------------------------------------------ I-3 incoherence across forms
def trial_variance(options: pd.DataFrame) -> pd.Series:
    """The sampling variance of each trial's P(CBR): 0 for a readout, ``p (1 - p) / (n - 1)`` for n parsed draws.

    A readout is the distribution itself (nothing sampled); a sampled trial's
    frequency of CBR among ``n_ok`` parsed draws has the unbiased variance of
    its Bernoulli draws over n (NaN with fewer than two draws).
    """
    pc = p_cbr(options)
    if "n_ok" not in options.columns:
        return pd.Series(0.0, index=pc.index, name="var_p")
    n = options.groupby("trial_id")["n_ok"].first().reindex(pc.index).astype(float)
    return (pc * (1 - pc) / (n - 1).where(n > 1)).rename("var_p")


def form_decomposition(
    per_trial: pd.DataFrame, pcbr: pd.Series, var_p: pd.Series | None = None, forms: Sequence[str] | None = None
) -> pd.DataFrame:
    """Per (item, form): z, lexical, order, apparent of that form alone, and their sampling variance ``var_samp``.

    The value is the unsalted replicate's (as theta's per-form value); each
    cell's sampling variance is the variance over its replicates (ddof 1)
    when the run has several, else the trial's own ``var_p`` (0 for a
    readout). z, lexical and order are each a sum of the four cells with
    weights +-1/4 (z on the 2 P - 1 axis), so all three have ``var_samp =
    sum of the cell variances / 4``; apparent (= bias_yf) has the two
    yes-first cells' variances. ``per_trial`` needs ``form``, ``cbr_verb``,
    ``order``, ``replicate``. Forms missing a usable cell are left out.
    ``forms`` restricts to these forms.
    """
    df = per_trial.join(pcbr, on="trial_id")
    if forms is not None:
        df = df[df["form"].isin(list(forms))]
    keys = ["item_id", "form", "cbr_verb", "order"]
    base = df[df["replicate"] == 0].groupby(keys)["p_cbr"].mean()
    rep_var = df.groupby(keys)["p_cbr"].var(ddof=1)
    n_rep = df.groupby(keys)["p_cbr"].count()
    own = (
        df[df["replicate"] == 0].join(var_p.rename("var_p"), on="trial_id").groupby(keys)["var_p"].mean()
        if var_p is not None
        else pd.Series(0.0, index=base.index)
    )
    var_cell = rep_var.where(n_rep > 1, own.reindex(rep_var.index))
    cells = base.unstack(["cbr_verb", "order"]).reindex(columns=pd.MultiIndex.from_tuples(CELLS)).dropna()
    var = var_cell.unstack(["cbr_verb", "order"]).reindex(columns=pd.MultiIndex.from_tuples(CELLS))
    var = var.reindex(cells.index)
    cells.columns = [f"p_cbr_{v}_{o}" for v, o in CELLS]
    out = decompose(cells)
    out["var_samp"] = var.sum(axis=1, min_count=4) / 4
    out["var_samp_apparent"] = var[[("approve", "yes_first"), ("oppose", "yes_first")]].sum(axis=1, min_count=2)
    return out


def i3_incoherence(forms: pd.DataFrame, quantities: Sequence[str] = ("z", "lexical", "order")) -> pd.DataFrame:
    """Per item, for each I-3 quantity: ``sigma_<q> = sqrt(max(0, Var_forms(q_f) - mean Var_samp))`` (Fig. 3's bars).

    The same Gauge R&R correction as I-1's sigma_repro (:func:`analysis.battery.stance.incoherence`)
    on the per-form values of :func:`form_decomposition`; ``n_forms`` counts
    them. Forms without a sampling variance are left out of its mean.
    """
    rows = {}
    for item, df in forms.groupby(level="item_id", sort=True):
        noise = float(df["var_samp"].mean()) if df["var_samp"].notna().any() else 0.0
        row: dict[str, float] = {"n_forms": float(len(df))}
        for q in quantities:
            v = float(np.var(df[q].to_numpy(float), ddof=1)) if len(df) > 1 else float("nan")
            row[f"sigma_{q}"] = float(np.sqrt(max(0.0, v - noise))) if np.isfinite(v) else float("nan")
        rows[item] = row
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "item_id"
    return out


def parity_split(per_trial: pd.DataFrame, pcbr: pd.Series, forms: Sequence[str]) -> pd.DataFrame:
    """Per item: lexical, order and z on the even- and odd-numbered forms (the two form-parity subsets of Fig. 3).

    ``forms`` in their design order (the corpus order); form k goes to the
    ``even`` subset when k is even. Columns ``<q>_even``, ``<q>_odd``; an item
    whose subset lacks a usable cell has NaN there.
    """
    if len(forms) < 2:
        raise NotComputed(f"the form-parity split needs at least two forms, got {list(forms)}")
    out = []
    for parity, subset in (("even", forms[0::2]), ("odd", forms[1::2])):
        df = per_trial[per_trial["form"].isin(list(subset))]
        cells = cell_table(df, pcbr)
        out.append(decompose(cells)[["z", "lexical", "order"]].add_suffix(f"_{parity}"))
    return pd.concat(out, axis=1)


# ---------------------------------------------------- I-3 resampling diagnostics
@dataclass(frozen=True)
class Resampling(Record):
    """How much repetition of one form shows, against the spread across forms (paper 003, Methods / SI S3).

    Readings taken: a *cell* is one trial (item x form x verb x printed
    order) with its sampled draws; *logically equivalent forms* are the
    forms of one (item, verb, order).
    """

    unanimous: float
    """Share of cells with >= 2 parsed draws whose draws all agree."""
    n_cells: int
    between_within: float
    """Mean over (item, verb, order) of Var_forms(P(CBR)) (ddof 1) / mean replicate variance of one draw."""
    between_within_orders: float
    """The same with print order inside the form: Var over (form, order) within (item, verb)."""
    opposite_majority: float
    """Share of items with two equivalent forms whose majority verdicts (P(CBR) > or < 1/2) are opposite."""
    n_items: int


def resampling_diagnostics(per_trial: pd.DataFrame, options: pd.DataFrame) -> Resampling:
    """Unanimity, the between/within variance ratio and the opposite-majority share of a sampled run.

    ``per_trial`` needs ``item_id``, ``form``, ``cbr_verb``, ``order``,
    ``replicate``; ``options`` the sampled frequencies with ``n_ok``
    (:func:`probe.views.count_samples`). The within-form variance is the
    unbiased variance of one draw, ``n p (1 - p) / (n - 1)``, averaged over
    cells with >= 2 parsed draws.
    """
    if "n_ok" not in options.columns:
        raise NotComputed("resampling diagnostics need sampled answers (options with n_ok); this run has readouts")
    pc = p_cbr(options)
    n = options.groupby("trial_id")["n_ok"].first()
    df = per_trial[per_trial["replicate"] == 0].join(pc, on="trial_id").join(n.rename("n"), on="trial_id")
    df = df.dropna(subset=["p_cbr"])
    multi = df[df["n"] >= 2]
    if multi.empty:
        raise NotComputed("resampling diagnostics need trials with at least two parsed draws (--samples 2 or more)")
    unanimous = float(((multi["p_cbr"] == 0) | (multi["p_cbr"] == 1)).mean())
    within = float((multi["n"] * multi["p_cbr"] * (1 - multi["p_cbr"]) / (multi["n"] - 1)).mean())
    between = float(df.groupby(["item_id", "cbr_verb", "order"])["p_cbr"].var(ddof=1).mean())
    between_orders = float(df.groupby(["item_id", "cbr_verb"])["p_cbr"].var(ddof=1).mean())
    majority = np.sign(df["p_cbr"] - 0.5)
    opposite = (
        df.assign(m=majority)
        .groupby(["item_id", "cbr_verb", "order"])["m"]
        .agg(lambda m: bool((m > 0).any() and (m < 0).any()))
        .groupby(level="item_id")
        .any()
    )
    return Resampling(
        unanimous=unanimous,
        n_cells=len(multi),
        between_within=between / within if within > 0 else float("inf"),
        between_within_orders=between_orders / within if within > 0 else float("inf"),
        opposite_majority=float(opposite.mean()),
        n_items=int(opposite.size),
    )
