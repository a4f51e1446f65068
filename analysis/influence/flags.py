"""Flags that keep an influence report honest on a model that does not choose between the sides (paper 000).

An order-balanced audit asks every prompt with side A printed first and with
side B printed first. A model that ignores the sides and follows the printed
position (or the printed label) answers the first option in both orders, so
the two orders cancel and ``f_0(B)`` reads exactly 1/2 in every condition: a
tie that looks like a neutral baseline. Tiny shifts of such a readout are
consistent over prompts, so a z test on the bootstrap SE of a deterministic
readout calls many of them significant. Three checks, each a pure function:

* :func:`tie_readout`: in how many conditions ``f_0(B)`` (and the cued arms)
  sit within :data:`TIE_TOL` of 1/2; flagged when every condition does.
* :func:`order_readouts` and :func:`following`: per arm and printed order, the
  mean P(first-printed option) and mean P(label), and whether the baseline
  follows the position or the label (the same side of 1/2 by at least
  :data:`FOLLOW_MARGIN` in both orders). Where the design prints the same
  label first in every trial (every influence benchmark here: options are the
  design's labels in print order), position and label cannot be told apart,
  and the flag says so.
* :func:`practical_size`: beside every significance share, the mean |shift|
  and the share of effects at or above :data:`PRACTICAL_SHIFT` (the
  asymmetry: mean |Asym| and the share at or above :data:`PRACTICAL_ASYM`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

TIE_TOL = 0.01
"""|f(B) - 1/2| at or below which a condition's readout sits at the tie (1 pp)."""
FOLLOW_MARGIN = 0.1
"""|mean P(first printed) - 1/2| (or of P(label)) from which, in both printed orders alike, the readout follows it."""
PRACTICAL_SHIFT = 0.05
"""Practical threshold of a shift |Delta| (5 pp): the baseline-neutrality margin of :mod:`analysis.influence.audit`,
twice the paper's largest baseline-to-baseline drift (2.5 pp, App. N) and well under its mean shifts (12-18 pp)."""
PRACTICAL_ASYM = 0.2
"""Practical threshold of |Asym| in log-odds: logit(0.55) = 0.20, a 5 pp step from a balanced baseline."""
ORDERS = ("a_first", "b_first")
ARM_NAMES = {"base": "no cue", "A": "cue toward A", "B": "cue toward B"}


# =========================================================================== tie


@dataclass(frozen=True)
class Tie:
    """How many conditions read at the tie, per arm."""

    conditions: int
    at_tie: int
    """Conditions with |f_0(B) - 1/2| <= tol."""
    all_arms_at_tie: int
    """Conditions with every arm (f_0, f_A, f_B of B) within tol of 1/2."""
    max_dev: float
    """max |f_0(B) - 1/2| over the conditions."""
    tol: float

    @property
    def flagged(self) -> bool:
        """Every condition's baseline sits at the tie."""
        return self.conditions > 0 and self.at_tie == self.conditions


def tie_readout(cond: pd.DataFrame, tol: float = TIE_TOL) -> Tie:
    """Count the conditions of ``cond`` (columns f0_B, fA_B, fB_B) whose readout sits within ``tol`` of 1/2."""
    if not 0 <= tol < 0.5:
        raise ValueError(f"tie tolerance must be in [0, 0.5), got {tol!r}")
    missing = {"f0_B", "fA_B", "fB_B"} - set(cond.columns)
    if missing:
        raise ValueError(f"tie_readout needs the condition table's columns {sorted(missing)}")
    dev = (cond[["f0_B", "fA_B", "fB_B"]] - 0.5).abs()
    base = dev["f0_B"] <= tol
    return Tie(
        conditions=len(cond),
        at_tie=int(base.sum()),
        all_arms_at_tie=int((dev <= tol).all(axis=1).sum()),
        max_dev=float(dev["f0_B"].max()) if len(cond) else math.nan,
        tol=tol,
    )


def tie_lines(tie: Tie) -> list[str]:
    """The flag line of a readout at the tie in every condition; empty otherwise."""
    if not tie.flagged:
        return []
    return [
        f"- **tie readout**: f0(B) is within {100 * tie.tol:g} pp of 1/2 in all {tie.conditions} conditions "
        f"(max |f0(B) - 1/2| = {100 * tie.max_dev:.2f} pp; all three arms at the tie in {tie.all_arms_at_tie} of "
        f"{tie.conditions}). A balanced baseline in every condition is what an order-balanced readout gives when "
        "the choice does not depend on the sides; read the per-order readouts before calling it neutral."
    ]


# =========================================================================== per-order readouts


def order_readouts(cells: pd.DataFrame) -> pd.DataFrame:
    """Per arm (no cue, main cue toward A, toward B) and printed order: mean P(first printed), P(label), P(B).

    ``cells`` is :func:`experiments.influence.effects.trial_cells` output (``direction``,
    ``variant``, ``order``, ``n``, ``k``, ``p_first``, ``first_label``).
    ``label`` is the label printed first in most trials (the design's first
    label, e.g. ``A``); ``p_label`` the mean probability of that label (the
    other option's complement where it is printed second). Means weight each
    trial by its answers ``n`` (1 per readout). ``confounded`` is True when
    that label is printed first in every trial.
    """
    need = {"direction", "variant", "order", "n", "k", "p_first", "first_label"}
    missing = need - set(cells.columns)
    if missing:
        raise ValueError(f"order_readouts needs trial_cells() output; columns {sorted(missing)} are missing")
    keep = (cells["direction"] == "base") | (cells["direction"].isin(["A", "B"]) & (cells["variant"] == "cue"))
    df = cells[keep & (cells["n"] > 0) & cells["p_first"].notna()]
    cols = ["arm", "order", "trials", "p_first", "p_label", "p_B", "label", "confounded"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    label = str(df["first_label"].mode().iloc[0])
    confounded = bool((df["first_label"] == label).all())
    p_label = df["p_first"].where(df["first_label"] == label, 1 - df["p_first"])
    w = df["n"]
    rows = []
    for (direction, order), g in df.groupby(["direction", "order"], sort=False):
        wg = w[g.index]
        rows.append(
            {
                "arm": ARM_NAMES.get(str(direction), str(direction)),
                "order": order,
                "trials": len(g),
                "p_first": float((g["p_first"] * wg).sum() / wg.sum()),
                "p_label": float((p_label[g.index] * wg).sum() / wg.sum()),
                "p_B": float(g["k"].sum() / g["n"].sum()),
                "label": label,
                "confounded": confounded,
            }
        )
    rank = {a: i for i, a in enumerate(ARM_NAMES.values())}
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["arm", "order"], key=lambda s: s.map(rank) if s.name == "arm" else s).reset_index(drop=True)


@dataclass(frozen=True)
class Following:
    """What the no-cue readout follows, from its per-order readouts."""

    position: bool
    """Mean P(first printed) on the same side of 1/2 by >= margin in both orders."""
    label: bool
    """Mean P(label) on the same side of 1/2 by >= margin in both orders."""
    label_name: str
    confounded: bool
    p_first: tuple[float, ...]
    """Per order (ORDERS), the mean P(first printed)."""
    p_label: tuple[float, ...]
    margin: float

    @property
    def flagged(self) -> bool:
        return self.position or self.label


def _same_side(values: Sequence[float], margin: float) -> bool:
    v = np.asarray(values, dtype=float) - 0.5
    return len(v) > 1 and not np.isnan(v).any() and bool((v >= margin).all() or (v <= -margin).all())


def following(orders: pd.DataFrame, margin: float = FOLLOW_MARGIN) -> Following | None:
    """Position / label following of the no-cue arm (:func:`order_readouts` output); None without both orders."""
    if not 0 < margin < 0.5:
        raise ValueError(f"following margin must be in (0, 0.5), got {margin!r}")
    base = orders[orders["arm"] == ARM_NAMES["base"]].set_index("order")
    if not set(ORDERS) <= set(base.index):
        return None
    p_first = tuple(float(base.at[o, "p_first"]) for o in ORDERS)
    p_label = tuple(float(base.at[o, "p_label"]) for o in ORDERS)
    return Following(
        position=_same_side(p_first, margin),
        label=_same_side(p_label, margin),
        label_name=str(base["label"].iloc[0]),
        confounded=bool(base["confounded"].iloc[0]),
        p_first=p_first,
        p_label=p_label,
        margin=margin,
    )


def following_lines(f: Following | None) -> list[str]:
    """The flag line of a no-cue readout that follows the printed position or label; empty otherwise."""
    if f is None or not f.flagged:
        return []
    pf = ", ".join(f"{p:.2f} with side {o[0].upper()} printed first" for p, o in zip(f.p_first, ORDERS, strict=True))
    pl = ", ".join(f"{p:.2f}" for p in f.p_label)
    favours = []
    if f.position:
        favours.append(f"the {'first' if np.mean(f.p_first) > 0.5 else 'second'}-printed option")
    if f.label and not f.confounded:
        favours.append(f"label {f.label_name}" if np.mean(f.p_label) > 0.5 else f"the label other than {f.label_name}")
    if f.confounded:
        kind = "position/label following"
        detail = (
            f"mean P(first-printed option) = mean P(label {f.label_name}): {pf}; this design prints label "
            f"{f.label_name} first in every trial, so following the position and following the label cannot be "
            "told apart"
        )
    else:
        kind = " and ".join(k for k, on in (("position", f.position), ("label", f.label)) if on) + " following"
        detail = f"mean P(first-printed option): {pf}; mean P(label {f.label_name}): {pl}"
    return [
        f"- **{kind}**: with no cue the readout favours {' and '.join(favours)} in both printed orders ({detail}). "
        "The two orders cancel in f0(B): that is not a preference between the sides, and a cue's shift then moves "
        "a readout that is not choosing between them."
    ]


# =========================================================================== practical size


@dataclass(frozen=True)
class Practical:
    """The practical size of a set of effects, to stand beside their significance share."""

    effects: int
    mean_abs_shift: float
    """Mean |Delta| (a fraction; x100 for pp)."""
    practical: int
    """Effects with |Delta| >= threshold."""
    threshold: float

    @property
    def share(self) -> float:
        return self.practical / self.effects if self.effects else math.nan


def practical_size(delta: Sequence[float] | np.ndarray | pd.Series, threshold: float = PRACTICAL_SHIFT) -> Practical:
    """Mean |delta| and the count at or above ``threshold`` (NaN effects left out)."""
    if threshold <= 0:
        raise ValueError(f"practical threshold must be > 0, got {threshold!r}")
    v = np.abs(np.asarray(delta, dtype=float))
    v = v[~np.isnan(v)]
    return Practical(len(v), float(v.mean()) if len(v) else math.nan, int((v >= threshold - 1e-12).sum()), threshold)


def practical_note(p: Practical, unit: str = "pp") -> str:
    """``mean |shift| 0.24 pp; 0 of 70 effects (0%) >= 5 pp``, or in log-odds for the asymmetry."""
    if not p.effects:
        return "no effects"
    scale, what, fmt = (100.0, "|shift|", ".2f") if unit == "pp" else (1.0, "|Asym|", ".3f")
    share = f"{100 * p.share:.0f}%"
    thr = f"{scale * p.threshold:g} {unit}"
    return f"mean {what} {scale * p.mean_abs_shift:{fmt}} {unit}; {p.practical} of {p.effects} ({share}) >= {thr}"


def practical_lines(sig_share: float, p: Practical, source: str = "readout") -> list[str]:
    """A flag when significant effects outnumber practically sized ones (more than twice and by 10 points).

    ``source`` (``readout`` or ``samples``) says what the tests rest on, for the line's explanation.
    """
    if source not in ("readout", "samples"):
        raise ValueError(f"source must be 'readout' or 'samples', got {source!r}")
    if not p.effects or math.isnan(sig_share) or not (sig_share > 2 * p.share and sig_share - p.share >= 0.1):
        return []
    why = (
        "Tests on a deterministic readout use the bootstrap SE over prompts, which small shifts that are "
        "consistent across prompts pass easily"
        if source == "readout"
        else "Tests on many sampled answers per condition pass small shifts easily"
    )
    return [
        f"- **significant but small**: {100 * sig_share:.0f}% of effects test significant, yet "
        f"{practical_note(p)}. {why}; significance here is not steerability."
    ]
