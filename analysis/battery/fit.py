"""The two-parameter fit (s, m) per bias channel (paper 003, "The two-parameter fit").

Each bias channel splits the forced-binary cells of an item into two balanced
sides: ``p+`` = mean P(CBR) over the cells where the channel pulls toward the
CBR option, ``p-`` = mean P(CBR) where it pulls away. Then
``b = p+ - p-`` is the channel's bias and ``(p+ + p-) / 2`` the shared mean
P(CBR), and the model

    p+ = sigmoid((theta + m) / s),   p- = sigmoid((theta - m) / s)

is fitted to both sides of all items jointly by nonlinear least squares, with
theta from the graded instrument (I-1), so the biased format never measures
the stance it is biased about. ``m`` is the framing susceptibility (the
channel's horizontal offset on the theta axis), ``s`` the decisiveness.

The sides are defined from what each CBR option *is* in a trial (trial
contract in ``docs/battery-analysis.md``):

==========  ==================  =========================================
channel     side column         p+ cells
==========  ==================  =========================================
order       ``cbr_first``       the CBR option is printed first
lexical     ``cbr_affirmative`` the CBR option is the affirmative answer
            (Yes/No family)     (approve cells; yes-pull m > 0)
logic       ``cbr_affirmative`` the same split on arbitrary labels (A/B, 1/2):
                                attachment to the verdict, not the word
label       ``cbr_canonical``   the CBR option is the pair's canonical first
                                label (A, 1), counterbalanced mapping only
==========  ==================  =========================================

With the yes/no words, order + lexical = apparent (Eq. 1) exactly.

Beside it, :func:`~analysis.battery.joint_fit.fit_joint` fits one s and one m per channel of a label
family on the cells themselves, ``P(CBR)[i, k] = sigmoid((theta_i + sum_c m_c
sgn_ck) / s)``. The per-channel fit stays the paper's estimand, but each of its
sides averages over the other channels' offsets, and a mean of shifted
sigmoids is flatter than one sigmoid: its s reads high when another channel
has an offset. The joint s does not, and its m's are adjusted for each other.

This module owns the model's settings (bounds, starts, the bootstrap's
:data:`N_BOOT`, :data:`SEED`, :data:`LEVEL`) and the cells both fits read
(:func:`binary_trials`, :func:`channel_trials`, :func:`channel_sides`). The fits
live beside it: :mod:`analysis.battery.channel_fit` (per channel),
:mod:`analysis.battery.joint_fit` (per label family), their shared solver and
quality flags :mod:`analysis.battery.fit_solve`, and one run's fit loop
:mod:`analysis.battery.run_fits`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

import pandas as pd

from analysis.battery.yesno import Dropped, empty_cells, p_cbr
from probe.errors import NotComputed

if TYPE_CHECKING:
    from typing_extensions import Unpack

SIDES: dict[str, str] = {
    "order": "cbr_first",
    "lexical": "cbr_affirmative",
    "logic": "cbr_affirmative",
    "label": "cbr_canonical",
}
"""Channel -> the boolean trial column that puts a cell on the p+ side."""
FAMILY: dict[str, str | None] = {"order": "yesno", "lexical": "yesno", "logic": "arbitrary", "label": "arbitrary"}
"""The label family each channel is measured in by default (order and lexical: the verb-flip Yes/No family)."""
IDENTIFYING_PAIRS: tuple[str, ...] = ("A/B",)
"""The label pairs the logic and label channels are measured on by default: the paper rests identification
on the fully arbitrary A/B alone ("The identification claim rests on the fully arbitrary family"); the
other arbitrary pairs (1/2, $/%, the valenced +/-) are reported per pair by :mod:`analysis.battery.binary`."""
LABELS: dict[str, tuple[str, ...] | None] = {
    "order": None,
    "lexical": None,
    "logic": IDENTIFYING_PAIRS,
    "label": IDENTIFYING_PAIRS,
}
"""Channel -> the label pairs of its default selection (None: every pair of the family)."""
CELL = ("cbr_first", "cbr_affirmative", "cbr_canonical")

S_BOUNDS = (1e-3, 10.0)
M_BOUND = 4.0
"""|m| is bounded at 4 (four times the whole theta axis; a fit there is degenerate)."""
THETA_SPREAD_MIN = 0.1
"""Range of theta over items (on its -1..1 scale) below which s and m cannot be told apart: with every item at the
same stance, p+ = sigmoid((theta + m)/s) and p- fix only (theta +/- m)/s, one ratio for two unknowns."""

N_BOOT = 2000
"""Bootstrap resamples over items of both fits (:func:`~analysis.battery.channel_fit.fit_channel`, :func:`~analysis.battery.joint_fit.fit_joint_data`), and of every CI of the
battery report and the battery comparison (one place for them)."""
SEED = 0
"""The seed of those bootstraps."""
LEVEL = 0.95
"""The level of their percentile CIs."""
TIE = 0.9
"""An item is near the tie when its story stance has |z| below this (where m is identified)."""
CLIP = 0.02
"""A fitted P within this of 0 or 1 counts as saturated (:attr:`~analysis.battery.fit_solve.FitQuality.frac_saturated`)."""


S_STARTS = (0.1, 0.3, 1.0)
M_STARTS = (-0.2, 0.0, 0.2)
"""Start values of both least-squares fits: every (s, m) of this grid (m the same for every channel of a joint fit)."""


# --------------------------------------------------------------- the cells
def binary_trials(options: pd.DataFrame, per_trial: pd.DataFrame) -> pd.DataFrame:
    """Per forced-binary trial: P(CBR) and what the CBR option is (printed first, affirmative, canonical label).

    Works on battery runs (``instrument == "binary"`` with ``family``,
    ``yes_label``, ``mapping``) and on plain yes/no runs (no instrument
    factor: family ``yesno``, ``yes_label`` = the first label of ``labels``,
    canonical mapping). ``options`` needs ``trial_id, option, position,
    meaning, prob``.
    """
    meta = per_trial
    if "instrument" in meta.columns:
        meta = meta[meta["instrument"].isna() | (meta["instrument"] == "binary")]
    meta = meta.copy()
    if meta.empty:
        raise NotComputed("no forced-binary trials in the run; run the battery's binary instrument or yesno")
    if "labels" not in meta.columns:
        raise NotComputed("binary trials lack the 'labels' factor (e.g. Yes/No); the trial contract requires it")
    first_label = meta["labels"].astype(str).str.split("/").str[0]
    meta["yes_label"] = meta["yes_label"].fillna(first_label) if "yes_label" in meta.columns else first_label
    meta["family"] = meta["family"].fillna("yesno") if "family" in meta.columns else "yesno"
    meta["mapping"] = meta["mapping"].fillna("canonical") if "mapping" in meta.columns else "canonical"
    opts = options[options["trial_id"].isin(meta["trial_id"])]
    cbr = opts[opts["meaning"] == "cbr"]
    counts = cbr.groupby("trial_id").size().reindex(meta["trial_id"], fill_value=0)
    bad = counts.index[counts != 1].tolist()
    if bad:
        raise NotComputed(
            f"binary trials need exactly one 'cbr' option; trials {bad[:5]} have {counts[bad[:5]].tolist()}"
        )
    cbr = cbr.set_index("trial_id")
    out = meta[["trial_id", "item_id", "replicate", "family", "labels", "yes_label", "mapping"]].copy()
    for col in ("form", "verb", "order"):
        out[col] = meta[col] if col in meta.columns else ""
    out["p_cbr"] = out["trial_id"].map(p_cbr(opts))
    cbr_option = out["trial_id"].map(cbr["option"])
    out["cbr_first"] = out["trial_id"].map(cbr["option_index"]).eq(0)
    out["cbr_affirmative"] = cbr_option.eq(out["yes_label"])
    out["cbr_canonical"] = out["cbr_affirmative"].eq(out["mapping"].ne("swapped"))
    return out.reset_index(drop=True)


def select_trials(
    binary: pd.DataFrame, family: str | None, pairs: Sequence[str] | None, replicate: int | None
) -> pd.DataFrame:
    """The binary trials of one label family, label pairs and replicate; None leaves that filter out.

    The per-channel and the joint fits select their trials the same way, so
    that a channel's two estimates rest on the same trials.
    """
    df = binary
    if family is not None:
        df = df[df["family"] == family]
    if pairs is not None:
        df = df[df["labels"].isin(pairs)]
    if replicate is not None:
        df = df[df["replicate"] == replicate]
    return df


class Selection(TypedDict, total=False):
    """The selection keywords of :func:`channel_trials`, which the functions built on it pass through as they are."""

    family: str | None
    labels: tuple[str, ...] | str | None
    replicate: int | None


def channel_trials(
    binary: pd.DataFrame,
    channel: str,
    *,
    family: str | None = "default",
    labels: tuple[str, ...] | str | None = "default",
    replicate: int | None = 0,
) -> pd.DataFrame:
    """The trials a channel is measured on: its label family, its label pairs and one replicate.

    ``family="default"`` takes :data:`FAMILY` and, with ``labels="default"``,
    :data:`LABELS` (A/B alone for logic and label); an explicit family with
    ``labels="default"`` takes every pair of that family. None means no
    filter. An empty selection is an error naming it.
    """
    if channel not in SIDES:
        raise ValueError(f"unknown channel {channel!r}; choose from {sorted(SIDES)}")
    fam = FAMILY[channel] if family == "default" else family
    if labels == "default":
        pairs = LABELS[channel] if family == "default" else None
    elif isinstance(labels, str):
        raise ValueError(f"labels must be 'default', None or a tuple of label pairs, got {labels!r}")
    else:
        pairs = labels
    df = select_trials(binary, fam, pairs, replicate)
    if df.empty:
        raise NotComputed(
            f"no binary trials for channel {channel!r} (family {fam!r}, label pairs {pairs}, replicate {replicate})"
        )
    return df


def side_cells(df: pd.DataFrame, channel: str) -> list[str]:
    """The design-cell columns of ``channel`` in these trials: the other channels' columns it balances over, then its side.

    A cell column that moves in lockstep with the side (the canonical label
    *is* the affirmative one when the mapping is not counterbalanced) is part
    of the channel, not a cell to balance over; the label channel refuses such
    trials.
    """
    side = SIDES[channel]
    confounded = [c for c in CELL if c != side and (df[c].eq(df[side]).all() or df[c].ne(df[side]).all())]
    if side == "cbr_canonical" and "cbr_affirmative" in confounded:
        raise NotComputed(
            "the label channel needs a counterbalanced label-to-verdict mapping (mapping canonical and swapped); "
            "in these trials the canonical label always carries the same verdict"
        )
    return [*(c for c in CELL if c != side and c not in confounded), side]


def dropped_items(binary: pd.DataFrame, channel: str, **select: Unpack[Selection]) -> tuple[Dropped, ...]:
    """The items :func:`channel_sides` drops (with the same selection keywords): a cell with no usable answer."""
    df = channel_trials(binary, channel, **select)
    return empty_cells(df, side_cells(df, channel), f"(s, m) fit: {channel}")


def channel_sides(binary: pd.DataFrame, channel: str, **select: Unpack[Selection]) -> pd.DataFrame:
    """Per item: ``p_plus``, ``p_minus`` (the two sides of ``channel``), ``bias = p_plus - p_minus`` and ``z``.

    Forms (and label pairs, salts when ``replicate`` is None) are averaged
    within each design cell first, then cells within a side, so every cell
    weighs the same. ``z = p_plus + p_minus - 1`` is the story stance
    ``mean(2 P(CBR) - 1)`` over the balanced cells. The
    :class:`Selection` keywords select the trials, with the defaults of
    :func:`channel_trials`. A cell
    column confounded with the side (the canonical label under a fixed
    mapping) belongs to the channel: with Yes/No the lexical channel is word
    and verdict together (:func:`side_cells`). Each
    item must have the same set of other-channel cells on both sides (a
    balanced 2-vs-2 or 4-vs-4 split); otherwise the bias would mix channels.
    Trials with no P(CBR) (every draw refused) are left out of their cell;
    an item with a cell left empty is dropped (:func:`dropped_items` names it).
    """
    df = channel_trials(binary, channel, **select)
    side = SIDES[channel]
    others = side_cells(df, channel)[:-1]
    grp = df.groupby(["item_id", *others, side], sort=True)["p_cbr"]
    cells = grp.mean().unstack(side)
    present = grp.size().unstack(side)
    cells.columns = present.columns = ["plus" if c else "minus" for c in cells.columns]
    if set(cells.columns) != {"plus", "minus"}:
        raise NotComputed(f"channel {channel!r} has cells on one side only; the design is incomplete")
    holes = present[["plus", "minus"]].isna().any(axis=1)
    if holes.any():
        items = sorted(set(cells.index[holes].get_level_values("item_id")))
        raise NotComputed(
            f"items {items[:5]}: the two sides of channel {channel!r} cover different cells of {others}; "
            "the split would not be balanced (is a verb, order or mapping missing?)"
        )
    # a cell whose every trial went unanswered (all draws refused): the item is dropped, see dropped_items
    empty = cells[["plus", "minus"]].isna().any(axis=1).groupby(level="item_id").any()
    cells = cells[~cells.index.get_level_values("item_id").isin(empty.index[empty])]
    g = cells.groupby(level="item_id", sort=True)
    out = pd.DataFrame({"p_plus": g["plus"].mean(), "p_minus": g["minus"].mean()})
    out["bias"] = out["p_plus"] - out["p_minus"]
    out["z"] = out["p_plus"] + out["p_minus"] - 1
    out["n_cells"] = 2 * g.size()
    return out
