"""Per-dilemma sums of a cell's terms and the cluster bootstrap over dilemmas that every cue rate's SD comes from.

:func:`cell_sums` sums the terms of each cell per dilemma (:class:`Sums`; dilemmas are the independent
units, as the baseline is per dilemma); :func:`cluster_bootstrap` redraws dilemmas with a fixed seed and
gives the SD of a statistic over the draws; :func:`ratio`, :func:`nanmean` and :func:`common_means` are the
NaN-aware pieces those statistics are made of.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.cue.decisions import CELL
from probe.bootstrap import cluster_weights

_TERMS = ["favor_num", "favor_den", "against_num", "against_den"]


# =========================================================================== cell sums and statistics


@dataclass(frozen=True)
class Sums:
    """Per-dilemma sums of ratio terms over cells: ``values[d, c, k]``, ``cells`` the cell keys, ``items`` the dilemmas."""

    values: np.ndarray
    cells: pd.DataFrame
    items: tuple[str, ...]
    terms: tuple[str, ...]
    n: np.ndarray
    """Answers per cell (all dilemmas)."""


def cell_sums(df: pd.DataFrame, keys: Sequence[str] = CELL, terms: Sequence[str] = _TERMS) -> Sums:
    """Sum ``terms`` per (dilemma, cell); cells are the distinct ``keys`` in sorted order."""
    cells = df[list(keys)].drop_duplicates().sort_values(list(keys)).reset_index(drop=True)
    items = tuple(sorted(df["item_id"].unique()))
    cell_code = pd.MultiIndex.from_frame(cells).get_indexer(pd.MultiIndex.from_frame(df[list(keys)]))
    item_code = pd.Index(items).get_indexer(df["item_id"])
    values = np.zeros((len(items), len(cells), len(terms)))
    np.add.at(values, (item_code, cell_code), df[list(terms)].to_numpy(dtype=float))
    n = np.bincount(cell_code, minlength=len(cells))
    return Sums(values, cells, items, tuple(terms), n)


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def nanmean(x: np.ndarray, axis: int) -> np.ndarray:
    """Mean over ``axis`` ignoring NaN; NaN (without a warning) where all are NaN."""
    ok = ~np.isnan(x)
    cnt = ok.sum(axis=axis)
    tot = np.where(ok, x, 0.0).sum(axis=axis)
    return np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)


def common_means(parts: Sequence[np.ndarray], members: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Per macro row (``members``: its cells), the mean of every part over the cells where *all* parts are defined.

    One set of cells per row (and per bootstrap draw) for every part, so linear identities between the parts
    (net = favor - against) hold for the means too. NaN where no cell has every part defined.
    """
    out: list[list[np.ndarray]] = [[] for _ in parts]
    for m in members:
        sel = [p[..., m] for p in parts]
        ok = np.logical_and.reduce([~np.isnan(x) for x in sel])
        for k, x in enumerate(sel):
            out[k].append(nanmean(np.where(ok, x, np.nan), -1))
    return [np.stack(o, axis=-1) for o in out]


def cluster_bootstrap(
    sums: Sums, stat: Callable[[np.ndarray], np.ndarray], n_boot: int = 1000, seed: int = 0
) -> np.ndarray:
    """SD over ``n_boot`` resamplings of the dilemmas (with replacement) of ``stat(summed values)``.

    ``stat`` maps an array ``(..., cells, terms)`` of summed terms to ``(..., m)`` statistics; it is
    called once on all draws at once. NaN draws (an empty denominator) are ignored.
    """
    if n_boot < 2:
        raise ValueError(f"n_boot must be >= 2, got {n_boot}")
    rng = np.random.default_rng(seed)
    n = len(sums.items)
    counts = cluster_weights(["all"] * n, n_boot, rng)
    totals = np.einsum("bd,dck->bck", counts, sums.values)
    draws = stat(totals)
    ok = ~np.isnan(draws)
    k = ok.sum(axis=0)
    mean = np.where(ok, draws, 0).sum(axis=0) / np.maximum(k, 1)
    var = (np.where(ok, draws - mean, 0) ** 2).sum(axis=0) / np.maximum(k - 1, 1)
    return np.where(k > 1, np.sqrt(var), np.nan)
