"""Reasoning off - on: the paired deliberation differences of one model's two runs.

:func:`deliberation_table` gives, per quantity and channel, the off and on values, their difference and a
paired bootstrap CI over the shared items (differences under :data:`NUMERICAL_ZERO` are round-off);
:class:`Deliberation` holds the table of every pair of a panel
(:func:`analysis.battery.compare.compute_deliberation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.battery.compare_agreement import g_of
from analysis.battery.compare_runs import RunData
from analysis.battery.fit import N_BOOT, SEED
from analysis.common.bootstrap import finite_ci, resample_index
from probe.errors import NotComputed
from probe.panel import PanelRun

CHANNELS = ("order", "lexical", "logic", "label")


# ------------------------------------------------------------------ deliberation
NUMERICAL_ZERO = 1e-6
"""Differences smaller than this are round-off of the fits (m and s are reported to 3 decimals)."""


def _boot_fit(th: np.ndarray, pp: np.ndarray, pm: np.ndarray, idx: np.ndarray, x0: tuple[float, float]) -> np.ndarray:
    """(s, m) refitted on every resample (rows of ``idx``); NaN rows where the fit did not converge."""
    from analysis.battery.channel_fit import refit_resamples

    boots, ok = refit_resamples(th, pp, pm, idx, x0)
    boots[~ok] = np.nan
    return boots


def deliberation_table(off: RunData, on: RunData, *, n_boot: int = N_BOOT, seed: int = SEED) -> pd.DataFrame:
    """Paired off - on differences (the paper's sign: "off minus on") with bootstrap CIs over items.

    Column ``off_minus_on``: positive when reasoning lowers the quantity
    (e.g. a smaller |m| or sigma_repro with reasoning on). One resampling of
    items serves every row.

    Rows: ``sigma_repro`` (mean over items), ``G``, per channel fitted in
    both runs ``|m|``, ``m`` and ``s`` (both runs refitted on each resample),
    and per label family the joint fit (:func:`analysis.battery.joint_fit.fit_joint`):
    ``s`` with channel ``joint:<family>``, ``abs_m`` and ``m`` with channel
    ``joint:<family>:<channel>``. Items: those with theta and sigma_repro
    (and, for a channel or family, its cells) in both runs.
    """

    if off.inc is None or on.inc is None:
        raise NotComputed("needs theta and sigma_repro (the graded instrument) in both runs")
    a = off.inc[["theta", "sigma_repro"]].dropna()
    b = on.inc[["theta", "sigma_repro"]].dropna()
    items = [i for i in a.index if i in b.index]
    if len(items) < 3:
        raise NotComputed(f"needs at least 3 items with theta in both runs, got {len(items)}")
    rows = _DiffRows()
    sa, sb = a.loc[items, "sigma_repro"].to_numpy(float), b.loc[items, "sigma_repro"].to_numpy(float)
    ta, tb = a.loc[items, "theta"].to_numpy(float), b.loc[items, "theta"].to_numpy(float)
    idx = resample_index(len(items), n_boot, seed)
    rows.add("sigma_repro", "", float(sa.mean()), float(sb.mean()), sb[idx].mean(1) - sa[idx].mean(1), len(items))
    rows.add(
        "G", "", float(g_of(ta, sa)), float(g_of(tb, sb)), g_of(tb[idx], sb[idx]) - g_of(ta[idx], sa[idx]), len(items)
    )
    if off.bt is None or on.bt is None:
        return pd.DataFrame(rows.rows)
    pairing = _Pairing(a, b, off.bt, on.bt, items, n_boot, seed)
    pairing.channel_differences(rows)
    pairing.joint_differences(rows)
    return pd.DataFrame(rows.rows)


class _DiffRows:
    """The rows of :func:`deliberation_table`: one quantity's off and on values, off - on and its bootstrap CI."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, q: str, ch: str, v_off: float, v_on: float, on_minus_off: np.ndarray, n: int) -> None:
        d_boot = -on_minus_off  # reported off - on, as the paper writes it
        lo, hi = finite_ci(d_boot)
        self.rows.append(
            {
                "quantity": q,
                "channel": ch,
                "off": v_off,
                "on": v_on,
                "off_minus_on": v_off - v_on,
                "lo": lo,
                "hi": hi,
                # a CI that only misses 0 by optimizer round-off (a planted-zero m) does not count
                "excludes_0": bool(lo > NUMERICAL_ZERO or hi < -NUMERICAL_ZERO),
                "n_items": n,
                "n_boot_ok": int(np.isfinite(d_boot).sum()),
            }
        )


@dataclass(frozen=True)
class _Pairing:
    """An off and an on run on the items both hold: theta and sigma_repro (``a`` off, ``b`` on), their binary
    trials, and the resampling of the items (``n_boot``, ``seed``) every refit shares."""

    a: pd.DataFrame
    b: pd.DataFrame
    bt_off: pd.DataFrame
    bt_on: pd.DataFrame
    items: list[Any]
    n_boot: int
    seed: int

    def channel_differences(self, rows: _DiffRows) -> None:
        """|m|, m and s of every channel fitted in both runs (on its items in both), both refitted on each resample."""
        from analysis.battery import channel_fit, fit

        for ch in CHANNELS:
            try:
                sides_a, sides_b = fit.channel_sides(self.bt_off, ch), fit.channel_sides(self.bt_on, ch)
            except NotComputed:
                continue
            common = [i for i in self.items if i in sides_a.index and i in sides_b.index]
            if len(common) < 3:
                continue
            arrays = []
            for inc, sides in ((self.a, sides_a), (self.b, sides_b)):
                th = inc.loc[common, "theta"].to_numpy(float)
                pp, pm = sides.loc[common, "p_plus"].to_numpy(float), sides.loc[common, "p_minus"].to_numpy(float)
                point = channel_fit.fit_channel(inc.loc[common, "theta"], sides.loc[common], n_boot=0)
                boots = _boot_fit(th, pp, pm, resample_index(len(common), self.n_boot, self.seed), (point.s, point.m))
                arrays.append((point, boots))
            (pa, ba), (pb, bb) = arrays
            n = len(common)
            rows.add("abs_m", ch, abs(pa.m), abs(pb.m), np.abs(bb[:, 1]) - np.abs(ba[:, 1]), n)
            rows.add("m", ch, pa.m, pb.m, bb[:, 1] - ba[:, 1], n)
            rows.add("s", ch, pa.s, pb.s, bb[:, 0] - ba[:, 0], n)

    def joint_differences(self, rows: _DiffRows) -> None:
        """s, and |m| and m per channel, of every label family's joint fit in both runs, refitted on each resample."""
        from analysis.battery import joint_fit

        for fam in joint_fit.JOINT_CHANNELS:
            try:
                ja = joint_fit.joint_cells(self.a.loc[self.items, "theta"], self.bt_off, fam)
                jb = joint_fit.joint_cells(self.b.loc[self.items, "theta"], self.bt_on, fam)
            except NotComputed:
                continue
            common = [i for i in self.items if i in ja.items and i in jb.items]
            if len(common) < 3 or ja.channels != jb.channels:
                continue
            joint = []
            for data in (ja.subset(common), jb.subset(common)):
                jfit = joint_fit.fit_joint_data(data, n_boot=0)
                jboots, ok = joint_fit.refit_joint_resamples(
                    data, resample_index(len(common), self.n_boot, self.seed), np.array([jfit.s, *jfit.m])
                )
                jboots[~ok] = np.nan
                joint.append((jfit, jboots))
            (pa_j, ba_j), (pb_j, bb_j) = joint
            n = len(common)
            rows.add("s", f"joint:{fam}", pa_j.s, pb_j.s, bb_j[:, 0] - ba_j[:, 0], n)
            for k, ch in enumerate(ja.channels, start=1):
                m_a, m_b = pa_j.m[k - 1], pb_j.m[k - 1]
                rows.add("abs_m", f"joint:{fam}:{ch}", abs(m_a), abs(m_b), np.abs(bb_j[:, k]) - np.abs(ba_j[:, k]), n)
                rows.add("m", f"joint:{fam}:{ch}", m_a, m_b, bb_j[:, k] - ba_j[:, k], n)


@dataclass(frozen=True)
class Deliberation:
    """Reasoning off - on for every (off, on) pair of one model in the panel (:func:`~analysis.battery.compare.compute_deliberation`)."""

    table: pd.DataFrame | None
    """One row per (model, quantity, channel) (:func:`deliberation_table`); None when no pair could be computed."""
    skipped: tuple[tuple[PanelRun, PanelRun, str], ...]
    """The (off, on) pairs not computed, with why."""
