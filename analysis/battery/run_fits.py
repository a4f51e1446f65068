"""Every (s, m) fit of one run, as the battery report and ``probe compare`` both show it (the one fit loop).

:func:`fit_run` fits each channel (:mod:`analysis.battery.channel_fit`) and each label family
(:mod:`analysis.battery.joint_fit`) and gathers the stories each channel's fit left out, into a
:class:`RunFits`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pandas as pd

from analysis.battery.channel_fit import Unfitted, fit_each_channel
from analysis.battery.fit import N_BOOT, SEED, dropped_items
from analysis.battery.joint_fit import fit_joints
from analysis.battery.yesno import Dropped
from probe.errors import NotComputed


# ------------------------------------------------------------ one run's fits
@dataclass(frozen=True)
class RunFits:
    """The (s, m) fits of one run: per channel (:func:`~analysis.battery.channel_fit.fit_each_channel`) and per label family (:func:`~analysis.battery.joint_fit.fit_joints`)."""

    fits: pd.DataFrame | None
    """One row per fitted channel, indexed by channel; None when no channel could be fitted."""
    unfitted: tuple[Unfitted, ...]
    """The channels that could not be fitted, each with the reason."""
    joint: pd.DataFrame | None
    """The joint fit, one row per (family, channel); None when the run has no label family."""
    dropped: tuple[Dropped, ...]
    """The stories each channel's fit left out (a cell with no usable answer), fitted channels first."""


def fit_run(theta: pd.Series, binary: pd.DataFrame, *, n_boot: int = N_BOOT, seed: int = SEED) -> RunFits:
    """Every fit of a run, as the battery report and ``probe compare`` both show it (the one fit loop)."""
    fits, unfitted = fit_each_channel(theta, binary, n_boot=n_boot, seed=seed)
    dropped: list[Dropped] = []
    for ch in [*(fits["channel"] if len(fits) else []), *(u.channel for u in unfitted)]:
        with contextlib.suppress(NotComputed):
            dropped += dropped_items(binary, str(ch))
    joint = fit_joints(theta, binary, n_boot=n_boot, seed=seed)
    return RunFits(
        fits=fits.set_index("channel") if len(fits) else None,
        unfitted=unfitted,
        joint=joint if len(joint) else None,
        dropped=tuple(dropped),
    )
