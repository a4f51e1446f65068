"""The human anchors of a battery panel: reading the user's human CSV and comparing the runs with it.

:func:`load_humans` reads and checks the table (its columns: :data:`HUMAN_COLUMNS`; a bad cell is a
:class:`HumanTableError` naming the row and column); :func:`humans_per_item` puts its values on the stance
axis, :func:`humans_agreement` compares every run's quantities with them (:data:`HUMAN_VS`),
:func:`human_sampling_se` gives the human sampling noise and :func:`framing_shift` the framing shift
of the human sample; :class:`HumanAnchors` holds them for :mod:`analysis.battery.compare`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.battery.compare_runs import RunData
from analysis.battery.fit import N_BOOT, SEED
from analysis.common.bootstrap import finite_ci, resample_index
from probe.errors import NotComputed, ProbeError


# ------------------------------------------------------------------ human anchors
class HumanTableError(ProbeError, ValueError):
    """A malformed human-anchor CSV: the message names the file, the row and the column."""


HUMAN_COLUMNS = ("item_id", "p_cbr", "n", "rating", "rating_lo", "rating_hi", "frame")


def load_humans(path: str | Path) -> pd.DataFrame:
    """Read and check a human-anchor CSV (format in ``docs/panels.md``).

    Returns one row per (item, frame, measure) with ``item_id``, ``frame``
    (``""`` without a frame column), ``measure`` (``p_cbr`` or ``rating``),
    ``raw`` (the value as given), ``value`` (on the stance axis [-1, 1]:
    ``2 p_cbr - 1``, or ``2 (rating - lo) / (hi - lo) - 1``) and ``n`` (the
    number of respondents behind a ``p_cbr``; NaN when not given). Rows are
    numbered as data rows (the header is line 1, the first data row is row 1
    on line 2).
    """
    p = Path(path)
    raw = _read_human_csv(p)
    rows: list[dict[str, Any]] = []
    seen: dict[tuple[str, str], int] = {}
    for k, rec in enumerate(raw.to_dict("records"), start=1):
        where = f"{p}, row {k} (line {k + 1})"
        item = str(rec["item_id"]).strip()
        if not item:
            raise HumanTableError(f"{where}, column item_id: empty")
        frame = str(rec.get("frame", "")).strip()
        if "frame" in raw.columns and not frame:
            raise HumanTableError(f"{where}, column frame: empty (give every row a frame, or drop the column)")
        if (item, frame) in seen:
            raise HumanTableError(
                f"{where}: item {item!r}" + (f" frame {frame!r}" if frame else "") + f" repeats row {seen[item, frame]}"
            )
        seen[item, frame] = k
        found = False
        if "p_cbr" in raw.columns and str(rec["p_cbr"]).strip():
            v, n = _choice_rate(p, k, rec, has_n="n" in raw.columns)
            rows.append({"item_id": item, "frame": frame, "measure": "p_cbr", "raw": v, "value": 2 * v - 1, "n": n})
            found = True
        if "rating" in raw.columns and str(rec["rating"]).strip():
            v, a = _rating(p, k, rec)
            rows.append(
                {"item_id": item, "frame": frame, "measure": "rating", "raw": v, "value": 2 * a - 1, "n": np.nan}
            )
            found = True
        if not found:
            raise HumanTableError(f"{where}: neither p_cbr nor rating has a value")
    return pd.DataFrame(rows, columns=["item_id", "frame", "measure", "raw", "value", "n"])


def _read_human_csv(p: Path) -> pd.DataFrame:
    """The human table's cells as text, its columns checked: known, and the ones each measure needs."""
    try:
        raw = pd.read_csv(p, dtype=str, keep_default_na=False, skipinitialspace=True)
    except FileNotFoundError:
        raise HumanTableError(f"human table {p} does not exist") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise HumanTableError(f"human table {p} is not a readable CSV: {e}") from None
    raw.columns = [str(c).strip() for c in raw.columns]
    unknown = [c for c in raw.columns if c not in HUMAN_COLUMNS]
    if unknown:
        raise HumanTableError(f"{p}: unknown column(s) {unknown}; allowed: {', '.join(HUMAN_COLUMNS)}")
    if "item_id" not in raw.columns:
        raise HumanTableError(f"{p}: needs an `item_id` column (the dilemma ids of the runs)")
    measures = [m for m in ("p_cbr", "rating") if m in raw.columns]
    if not measures:
        raise HumanTableError(f"{p}: needs a `p_cbr` column (choice rate of the cost-benefit option) or `rating`")
    if "rating" in raw.columns and not {"rating_lo", "rating_hi"} <= set(raw.columns):
        raise HumanTableError(f"{p}: a `rating` column needs `rating_lo` and `rating_hi` (the ends of its scale)")
    if "n" in raw.columns and "p_cbr" not in raw.columns:
        raise HumanTableError(f"{p}: column `n` counts the respondents behind `p_cbr`, which is missing")
    if raw.empty:
        raise HumanTableError(f"{p}: no data rows")
    return raw


def _human_number(p: Path, row: int, col: str, text: str) -> float:
    """A finite number in a cell of the human table (untrusted input: the error names file, row and column)."""
    try:
        v = float(text)
    except ValueError:
        raise HumanTableError(f"{p}, row {row} (line {row + 1}), column {col}: not a number: {text!r}") from None
    if not np.isfinite(v):
        raise HumanTableError(f"{p}, row {row} (line {row + 1}), column {col}: must be finite, got {text!r}")
    return v


def _choice_rate(p: Path, k: int, rec: dict[str, Any], has_n: bool) -> tuple[float, float]:
    """Row ``k``'s choice rate ``p_cbr`` in [0, 1] and its respondents ``n`` (NaN when not given)."""
    where = f"{p}, row {k} (line {k + 1})"
    v = _human_number(p, k, "p_cbr", rec["p_cbr"])
    if not 0 <= v <= 1:
        raise HumanTableError(f"{where}, column p_cbr: a choice rate must lie in [0, 1], got {v:g}")
    n = float("nan")
    if has_n and str(rec["n"]).strip():
        n = _human_number(p, k, "n", rec["n"])
        if n < 1 or n != int(n):
            raise HumanTableError(f"{where}, column n: must be a whole number >= 1, got {rec['n']!r}")
    return v, n


def _rating(p: Path, k: int, rec: dict[str, Any]) -> tuple[float, float]:
    """Row ``k``'s rating and where it lies on its scale, from 0 (rating_lo) to 1 (rating_hi)."""
    where = f"{p}, row {k} (line {k + 1})"
    v = _human_number(p, k, "rating", rec["rating"])
    lo, hi = _human_number(p, k, "rating_lo", rec["rating_lo"]), _human_number(p, k, "rating_hi", rec["rating_hi"])
    if not lo < hi:
        raise HumanTableError(f"{where}, columns rating_lo/rating_hi: need lo < hi, got {lo:g} and {hi:g}")
    if not lo <= v <= hi:
        raise HumanTableError(f"{where}, column rating: {v:g} lies outside its scale [{lo:g}, {hi:g}]")
    return v, (v - lo) / (hi - lo)


def mad_ci(a: pd.Series, b: pd.Series, *, n_boot: int = N_BOOT, seed: int = SEED) -> tuple[float, float, float, int]:
    """Mean |a - b| over the items both hold, with a percentile bootstrap CI over items."""
    df = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner").dropna()
    diff = (df["a"] - df["b"]).abs().to_numpy(float)
    if len(diff) == 0:
        return float("nan"), float("nan"), float("nan"), 0
    boots = diff[resample_index(len(diff), n_boot, seed)].mean(axis=1)
    lo, hi = finite_ci(boots)
    return float(diff.mean()), lo, hi, len(diff)


# ------------------------------------------------------------------ humans
HUMAN_VS: dict[str, tuple[str, ...]] = {"rating": ("theta",), "p_cbr": ("theta", "z")}
"""Which model quantities a human measure is compared with. The paper's anchor (Fig. 1a, "r^2 of per-item
theta ... frontier-human") sets the human choice rate, as 2 P - 1, beside the model's graded theta: first row.
A choice rate is also shown against the forced-binary story stance z = mean(2 P(CBR) - 1) (both choice
rates), as a second, labelled row; a rating is compared with theta."""


def humans_per_item(h: pd.DataFrame) -> pd.DataFrame:
    """Item x measure table of the human values on the stance axis (:func:`load_humans`), averaged over frames."""
    return h.groupby(["item_id", "measure"])["value"].mean().unstack("measure")


def human_anchor(humans: pd.DataFrame | None) -> pd.Series | None:
    """The human value per item that theta is set beside: 2 p_cbr - 1 where given, else the first measure."""
    if humans is None or not len(humans):
        return None
    per_measure = humans_per_item(humans)
    return per_measure["p_cbr"] if "p_cbr" in per_measure.columns else per_measure.iloc[:, 0]


def humans_agreement(
    runs: dict[str, RunData], per_item: pd.DataFrame, *, n_boot: int = N_BOOT, seed: int = SEED
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(agreement table, values by item) of every run's quantities (:data:`HUMAN_VS`) with the human ``per_item``.

    Table: one row per (run, human measure, model quantity) with the Pearson r
    (bootstrap CI over items, :func:`analysis.battery.stance.pearson_ci`), r2,
    the mean |diff| (:func:`mad_ci`), n_items and a note (why a row is
    empty). By item: the human values (``humans_<measure>``) beside each
    run's quantity (``<run> (<quantity>)``).
    """
    from analysis.battery.stance import pearson_ci

    rows, by_item = [], per_item.add_prefix("humans_")
    for name, d in runs.items():
        for measure in per_item.columns:
            for quantity in HUMAN_VS[measure]:
                model = d.theta if quantity == "theta" else (None if d.dec is None else d.dec["z"])
                row: dict[str, Any] = {"run": name, "human": measure, "model": quantity}
                if model is None:
                    rows.append({**row, "note": f"run has no {quantity}"})
                    continue
                by_item[f"{name} ({quantity})"] = model.reindex(by_item.index)
                try:
                    r = pearson_ci(model, per_item[measure], n_boot=n_boot, seed=seed)
                    row.update(r=r.r, r_lo=r.lo, r_hi=r.hi, r2=r.r**2)
                except NotComputed as e:
                    row["note"] = str(e)
                mad, lo, hi, n = mad_ci(model, per_item[measure], n_boot=n_boot, seed=seed)
                rows.append({**row, "mean_abs_diff": mad, "mad_lo": lo, "mad_hi": hi, "n_items": n})
    table = pd.DataFrame(rows)
    for col in ("r", "r_lo", "r_hi", "r2", "mean_abs_diff", "mad_lo", "mad_hi", "n_items", "note"):
        if col not in table.columns:
            table[col] = np.nan if col != "note" else ""
    table["note"] = table["note"].fillna("")
    by_item.index.name = "item_id"
    return table, by_item


def human_sampling_se(h: pd.DataFrame) -> tuple[float, int] | None:
    """(mean binomial SE of 2 p_cbr - 1, rows with n) over the p_cbr rows that give n; None when none does."""
    if not ("p_cbr" in h["measure"].values and h["n"].notna().any()):
        return None
    pc = h[(h["measure"] == "p_cbr") & h["n"].notna()]
    p = (pc["value"] + 1) / 2
    return float((2 * np.sqrt(p * (1 - p) / pc["n"])).mean()), len(pc)


def framing_shift(h: pd.DataFrame, *, n_boot: int = N_BOOT, seed: int = SEED) -> pd.DataFrame:
    """Per measure and frame: mean over items of value(frame) - value(reference frame), with a bootstrap CI.

    The reference is the first frame in file order. Items without both frames are left out of that row.
    """
    rows = []
    for measure, m in h.groupby("measure", sort=False):
        frames = list(dict.fromkeys(m["frame"]))
        ref = frames[0]
        wide = m.pivot(index="item_id", columns="frame", values="value")
        for fr in frames[1:]:
            d = (wide[fr] - wide[ref]).dropna().to_numpy(float)
            if len(d) == 0:
                continue
            lo, hi = finite_ci(d[resample_index(len(d), n_boot, seed)].mean(axis=1))
            rows.append(
                {
                    "measure": measure,
                    "frame": fr,
                    "reference": ref,
                    "shift": float(d.mean()),
                    "lo": lo,
                    "hi": hi,
                    "n_items": len(d),
                }
            )
    return pd.DataFrame(rows, columns=["measure", "frame", "reference", "shift", "lo", "hi", "n_items"])


@dataclass(frozen=True)
class HumanAnchors:
    """The runs against the human anchors on the shared dilemmas (:func:`~analysis.battery.compare.compute_anchors`)."""

    humans: pd.DataFrame
    """The human rows of the shared dilemmas (:func:`load_humans`)."""
    per_item: pd.DataFrame
    """Item x measure: their values on the stance axis (:func:`humans_per_item`)."""
    table: pd.DataFrame
    """The agreement of every run's quantities with them (:func:`humans_agreement`)."""
    by_item: pd.DataFrame
    noise: tuple[float, int] | None
    """(mean binomial SE, rows with n) (:func:`human_sampling_se`)."""
    left_out: list[str]
    """Human items not shared by every run."""
    shift: pd.DataFrame | None
    """The framing shift of the human sample (:func:`framing_shift`); None without frames."""
