"""Forced-binary projections beyond yes/no (paper 003, "Identification: lexical versus logical", Figs. 5-6).

With labels other than the English yes/no words, each cell (verb x printed
order x the label-to-verdict mapping) gives P(CBR), and from it three events
whose balanced means are the *projections* (Fig. 5a's sign key):

* **order**: ``mean(2 P(first-printed option) - 1)``; negative = toward the
  last-printed option;
* **logic**: ``mean(2 P(affirmative verdict) - 1)``, the attachment to the
  verdict *yes* whatever label carries it (for the yes/no words this is the
  lexical channel);
* **label**: ``mean(2 P(the pair's nominal yes label) - 1)`` over both
  mappings, the attachment to the printed label itself. Identified only where
  the mapping is counterbalanced; NaN elsewhere, where it is confounded with
  logic;

and the stance ``z = mean(2 P(CBR) - 1)``. In a balanced design these are the
main-effect contrasts of the crossing, so each is estimated free of the others.

**The lexicality gradient (Fig. 6)** orders the pairs a priori (non-lexical,
quasi-lexical mark, word) and shows per pair the order bias and the **label
pull**. Reading taken: Fig. 6's "label pull (b > 0 = emits the yes-mapped
label)" is the label projection, the pull toward the pair's nominal yes label
with the mapping counterbalanced, not the logic projection: the paper gives
Sonnet an A/B label pull of -0.15 (Fig. 6) while its A/B logic is about 0
(Fig. 5), and its 13-pair design is "label x order", the label being the
mapping. A pair whose mapping cannot be swapped (``story``: the labels are
the courses themselves) has no label projection; its label pull is the
logic projection, the pull toward the label that carries *yes*, and the
table says so (``pull_from``). The summary contrast is ``mean |label pull|``
over word pairs minus over non-lexical pairs, the |.| taken on the
story-averaged pull of each pair; a pair whose pull is its logic projection
(``story``) is left out of it by default (issue 27: it is not a label pull),
and reported beside it.

**Complete stories only.** A story enters a pair's projections only if every
design cell of that pair (verb x printed order x mapping, as the pair is
asked in the run) has a usable answer. Averaging whatever cells survive
would leak the story's stance into order, logic and label: with P(CBR) = 0.9
in every cell and one cell refused, all three read -0.114 instead of 0.
:func:`incomplete_stories` names the stories left out and their empty cells,
as the verb-flip table and the (s, m) fit do.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.battery.yesno import Dropped, p_cbr

DESIGN = ("verb", "order", "mapping")
"""The columns whose combinations are the design cells of one label pair."""


def cell_events(per_trial: pd.DataFrame, options: pd.DataFrame) -> pd.DataFrame:
    """Per binary trial: P(CBR), P(first printed), P(affirmative verdict), P(canonical first label).

    ``per_trial`` needs the factors ``verb`` (CBR-relative), ``order``,
    ``labels``, ``yes_label`` and ``mapping``; ``options`` the long table with
    ``position``, ``option``, ``meaning``, ``prob``.
    """
    pc = p_cbr(options)
    first = options[options["option_index"] == 0].set_index("trial_id")
    df = per_trial.join(pc, on="trial_id")
    p_first = df["trial_id"].map(first["prob"])
    first_is_yes = df["trial_id"].map(first["option"]) == df["yes_label"]
    p_yes = np.where(first_is_yes, p_first, 1 - p_first)
    canonical_yes = df["mapping"].eq("canonical")
    out = df[["trial_id", "item_id", "replicate", "labels", "verb", "order", "mapping"]].copy()
    out["p_cbr"] = df["p_cbr"]
    out["p_first"] = p_first
    out["p_yes"] = p_yes
    out["p_label1"] = np.where(canonical_yes, p_yes, 1 - p_yes)
    return out


def _cell_means(events: pd.DataFrame) -> pd.DataFrame:
    """Per (item, pair, verb, order, mapping): the mean of ``2 p - 1`` over the cell's forms (NaN: no usable answer)."""
    e = events.copy()
    for col in ("p_cbr", "p_first", "p_yes", "p_label1"):
        e[col] = 2 * e[col] - 1
    # average the forms within each design cell first, so that every cell weighs the same
    return e.groupby(["item_id", "labels", *DESIGN])[["p_cbr", "p_first", "p_yes", "p_label1"]].mean()


def _incomplete(cells: pd.DataFrame) -> dict[tuple[str, str], list[tuple[str, ...]]]:
    """(item, pair) -> the design cells of the pair (as asked for any story) that have no usable answer for it."""
    out: dict[tuple[str, str], list[tuple[str, ...]]] = {}
    usable = cells["p_cbr"].notna()
    for pair, sub in usable.groupby(level="labels", sort=True):
        design = sorted({k[2:] for k in sub.index})
        have = {(k[0], k[2:]) for k, ok in sub.items() if ok}
        for item in sorted({k[0] for k in sub.index}):
            missing = [c for c in design if (item, c) not in have]
            if missing:
                out[(str(item), str(pair))] = missing
    return out


def incomplete_stories(events: pd.DataFrame) -> tuple[Dropped, ...]:
    """The (story, label pair)s :func:`projections` leaves out, one :class:`Dropped` each, naming the empty cells.

    A cell is empty when none of its trials has a usable answer (every draw
    refused or unparsable), or when the story was not asked it at all.
    """
    cells = _cell_means(events)
    size = events.groupby(["item_id", "labels", *DESIGN]).size()
    out = []
    for (item, pair), missing in _incomplete(cells).items():
        where = "; ".join(
            ", ".join(f"{c}={v}" for c, v in zip(DESIGN, cell, strict=True))
            + f" ({int(size.get((item, pair, *cell), 0))} trials)"
            for cell in missing
        )
        out.append(
            Dropped(item, f"label map: {pair}", f"no usable answer (every draw refused or unparsable) in {where}")
        )
    return tuple(out)


def projections(events: pd.DataFrame, counterbalanced: set[str]) -> pd.DataFrame:
    """Per (item, label pair) with every design cell usable: z, order, logic and label projections.

    Stories with an empty cell are left out (module docstring, "Complete
    stories only"; :func:`incomplete_stories` names them), so each projection
    stays the balanced main-effect contrast of the crossing.
    """
    cells = _cell_means(events)
    holes = _incomplete(cells)
    if holes:
        key = list(zip(cells.index.get_level_values("item_id"), cells.index.get_level_values("labels"), strict=True))
        cells = cells[[(str(i), str(p)) not in holes for i, p in key]]
    g = cells.groupby(["item_id", "labels"])
    out = pd.DataFrame(
        {
            "z": g["p_cbr"].mean(),
            "order": g["p_first"].mean(),
            "logic": g["p_yes"].mean(),
            "label": g["p_label1"].mean(),
            "n_cells": g.size(),
        }
    )
    mask = ~out.index.get_level_values("labels").isin(counterbalanced)
    out.loc[mask, "label"] = np.nan
    return out


def label_pull(proj: pd.DataFrame) -> pd.DataFrame:
    """Per (item, label pair): ``label_pull`` (the label projection; logic where the mapping is not crossed) and ``pull_from``."""
    out = proj.copy()
    crossed = out["label"].notna()
    out["label_pull"] = out["label"].where(crossed, out["logic"])
    out["pull_from"] = np.where(crossed, "label", "logic (mapping not crossed)")
    return out


def lexicality_gradient(
    proj: pd.DataFrame, lexicality: dict[str, int], *, include_uncrossed: bool = False
) -> tuple[pd.DataFrame, float]:
    """Per label pair (ordered by lexicality): mean order, logic, label and label pull over items; and the contrast.

    The contrast is ``mean |label pull|`` over word pairs (lexicality >= 2)
    minus ``mean |label pull|`` over non-lexical pairs (lexicality 0), the
    |.| taken on the story-averaged pull of each pair (module docstring).
    Pairs whose mapping is not crossed (``story``: the pull is the logic
    projection) are left out of it unless ``include_uncrossed`` (the paper's
    Fig. 6 lists ``story`` among the word pairs; the report gives both).
    """
    lp = label_pull(proj)
    by_pair = lp.groupby("labels")[["order", "logic", "label", "label_pull", "z"]].mean()
    by_pair["pull_from"] = lp.groupby("labels")["pull_from"].first()
    by_pair["n_items"] = lp.groupby("labels").size()
    by_pair["lexicality"] = [lexicality.get(p, -1) for p in by_pair.index]
    by_pair = by_pair.sort_values(["lexicality"], kind="stable")
    used = by_pair if include_uncrossed else by_pair[by_pair["pull_from"] == "label"]
    words = used[used["lexicality"] >= 2]["label_pull"].abs()
    nonlex = used[used["lexicality"] == 0]["label_pull"].abs()
    contrast = float(words.mean() - nonlex.mean()) if len(words) and len(nonlex) else float("nan")
    return by_pair, contrast
