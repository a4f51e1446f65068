"""Every rationale a trace states (paper 000, appendices K.3-K.5 and L): frequencies from the ``rationales`` coding.

Input: ``RUN/coding/rationales.parquet`` (``probe code --task rationales``), one row per (trace, rationale):
``trial_id``, ``draw``, ``rationale``, ``label`` (``not_mentioned``, ``mentioned_but_not_acted_on``,
``mentioned_and_acted_on``), ``p_<status>``; with the primary rationale (``coding/rationale.parquet``) where the
run has it too. The paper's classifier gives both in one call (a status per rationale and a primary one), so its
figures and table are made here, once a run has the statuses:

* Figure 24 / 28 / 29: per arm (no cue / cued), the share of traces that mention each rationale (any status but
  not_mentioned) and that act on it: :func:`mentioned_table` (Figure 24 and 23 restrict to triage traces that chose
  the smaller group: :func:`smaller_group`);
* Figure 23 / 26 / 27: the primary-rationale shares per arm (of the primary coding; smaller-group traces on triage);
* appendix L.2: the backfire traces (cued traces that chose the side the cue was not for) by primary rationale, by
  influence type and by factor: :func:`backfire_table`.

Counts are argmax labels; ``soft_*`` columns are the mean judge probabilities (a rule coder's are the same).
Pure functions on frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pandas as pd

from probe.runs import Run

STATUSES: Final[tuple[str, ...]] = ("not_mentioned", "mentioned_but_not_acted_on", "mentioned_and_acted_on")
"""The status codes (``experiments/data/taxonomies/rationales.yaml``), a contract with the taxonomy loader."""


def check_statuses(frame: pd.DataFrame, where: str) -> pd.DataFrame:
    """The ``rationales`` coding, validated: its columns, its labels, one row per (trial, draw, rationale)."""
    need = {"trial_id", "draw", "rationale", "label", *(f"p_{s}" for s in STATUSES)}
    missing = sorted(need - set(frame.columns))
    if missing:
        raise ValueError(f"{where} lacks the columns {missing}; recode with `probe code RUN --task rationales`")
    bad = sorted(set(frame["label"]) - set(STATUSES))
    if bad:
        raise ValueError(f"{where}: labels {bad} are not rationale statuses {list(STATUSES)}")
    if frame.duplicated(["trial_id", "draw", "rationale"]).any():
        raise ValueError(f"{where}: a (trial_id, draw, rationale) is coded twice")
    return frame.astype({"trial_id": str, "draw": int, "rationale": str})


def choices(run: Run) -> pd.DataFrame:
    """The option meaning each trace's reply chose: ``trial_id``, ``draw`` (-1: the readout's greedy option),
    ``chosen`` (missing where the reply parsed into no option)."""
    meanings = run.trial_index.meanings
    parts = []
    per = run.store.load("readout_trials")
    if not per.empty:
        parts.append(pd.DataFrame({"trial_id": per["trial_id"], "draw": -1, "option": per["greedy_option"]}))
    for table in ("samples", "generations"):
        s = run.store.load(table)
        if not s.empty and "option" in s.columns:
            parts.append(
                pd.DataFrame({"trial_id": s["trial_id"], "draw": s["draw"].astype(int), "option": s["option"]})
            )
    if not parts:
        return pd.DataFrame(columns=["trial_id", "draw", "chosen"])
    out = pd.concat(parts, ignore_index=True).drop_duplicates(["trial_id", "draw"])
    out["chosen"] = [meanings.get(str(t), {}).get(o) if isinstance(o, str) else None
                     for t, o in zip(out["trial_id"], out["option"], strict=True)]  # fmt: skip
    return out[["trial_id", "draw", "chosen"]].astype({"trial_id": str, "draw": int})


def smaller_group(frame: pd.DataFrame) -> pd.Series:
    """Triage traces whose reply chose the smaller group (``n_a``/``n_b`` sizes, ``group_a``/``group_b`` keys)."""
    if not {"n_a", "n_b", "group_a", "group_b", "chosen"} <= set(frame.columns):
        return pd.Series(False, index=frame.index)
    na = pd.to_numeric(frame["n_a"], errors="coerce")
    nb = pd.to_numeric(frame["n_b"], errors="coerce")
    a = (frame["chosen"] == frame["group_a"]) & (na < nb)
    b = (frame["chosen"] == frame["group_b"]) & (nb < na)
    return a | b


def backfired(frame: pd.DataFrame) -> pd.Series:
    """Cued traces that chose the side the cue was *not* for (direction A: the cue is for ``group_a``)."""
    if not {"direction", "group_a", "group_b", "chosen"} <= set(frame.columns):
        return pd.Series(False, index=frame.index)
    other = np.where(
        frame["direction"] == "A", frame["group_b"], np.where(frame["direction"] == "B", frame["group_a"], None)
    )
    return pd.Series((frame["chosen"] == other) & frame["direction"].isin(["A", "B"]), index=frame.index)


def mentioned_table(statuses: pd.DataFrame, by: Sequence[str], order: Sequence[str]) -> pd.DataFrame:
    """Per group of ``by`` and rationale (in ``order``): traces, and the count, share and soft share of traces that
    mention the rationale (status not not_mentioned) and that act on it (mentioned_and_acted_on)."""
    rows: list[dict[str, Any]] = []
    if statuses.empty:
        return pd.DataFrame(columns=[*by, "rationale", "traces", "n_mentioned", "share_mentioned", "n_acted",
                                     "share_acted", "soft_mentioned", "soft_acted"])  # fmt: skip
    for key, g in statuses.groupby(list(by), sort=False, dropna=False):
        keys = key if isinstance(key, tuple) else (key,)
        traces = g[["trial_id", "draw"]].drop_duplicates().shape[0]
        for rid in order:
            r = g[g["rationale"] == rid]
            if r.empty:
                continue
            n_m = int((r["label"] != STATUSES[0]).sum())
            n_a = int((r["label"] == STATUSES[2]).sum())
            rows.append({**dict(zip(by, keys, strict=True)), "rationale": rid, "traces": traces,
                         "n_mentioned": n_m, "share_mentioned": n_m / traces, "n_acted": n_a,
                         "share_acted": n_a / traces, "soft_mentioned": float((1 - r[f"p_{STATUSES[0]}"]).sum() / traces),
                         "soft_acted": float(r[f"p_{STATUSES[2]}"].sum() / traces)})  # fmt: skip
    return pd.DataFrame(rows)


def primary_table(primary: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Per group of ``by`` and primary rationale (argmax): n, share of the group's traces (descending n)."""
    if primary.empty:
        return pd.DataFrame(columns=[*by, "primary", "n", "share"])
    g = primary.groupby([*by, "label"], sort=False, dropna=False).size().rename("n").reset_index()
    g = g.rename(columns={"label": "primary"})
    g["share"] = g["n"] / g.groupby(list(by), dropna=False)["n"].transform("sum")
    return g.sort_values([*by, "n", "primary"], ascending=[True] * len(by) + [False, True], kind="stable").reset_index(
        drop=True
    )


def backfire_table(primary: pd.DataFrame) -> pd.DataFrame:
    """Appendix L.2: the backfire traces by primary rationale, by influence type and by factor (``pair``).

    One long table: ``breakdown`` (``primary``, ``influence``, ``pair``), ``value``, ``n``, ``share`` of the
    backfire traces; the first row is ``all`` with the backfire traces among the cued traces (the paper's
    nudged-trial backfire rate)."""
    cued = primary[primary["direction"].isin(["A", "B"])] if "direction" in primary.columns else primary.iloc[:0]
    bf = cued[backfired(cued)]
    rows = [{"breakdown": "all", "value": "backfire traces / cued traces", "n": len(bf),
             "share": len(bf) / len(cued) if len(cued) else float("nan")}]  # fmt: skip
    for col, name in (("label", "primary"), ("influence", "influence"), ("pair", "pair")):
        if col not in bf.columns:
            continue
        counts = bf[col].astype(str).value_counts()
        counts = counts.sort_index().sort_values(ascending=False, kind="stable")
        rows += [{"breakdown": name, "value": v, "n": int(k), "share": k / len(bf)} for v, k in counts.items()]
    return pd.DataFrame(rows, columns=["breakdown", "value", "n", "share"])


@dataclass(frozen=True)
class RationaleTables:
    """What the report shows of a run's ``rationales`` coding (and its primary coding, where it has one)."""

    mentioned: pd.DataFrame
    """Per arm and rationale (Figures 24 / 28 / 29)."""
    mentioned_smaller: pd.DataFrame | None
    """Triage: the same over the traces that chose the smaller group (Figure 24); None off triage."""
    primary: pd.DataFrame | None
    """Per arm, primary rationale shares (Figures 26 / 27; on triage over the smaller-group traces: Figure 23)."""
    backfires: pd.DataFrame | None
    """Appendix L.2 (:func:`backfire_table`)."""
    triage: bool


def rationale_tables(statuses: pd.DataFrame, primary: pd.DataFrame | None, order: Sequence[str]) -> RationaleTables:
    """The tables from the statuses and the primary labels, both already joined with factors, ``arm`` and ``chosen``.
    ``order``: the rationale codes in taxonomy order."""
    triage = {"n_a", "n_b"} <= set(statuses.columns)
    s = statuses if "arm" in statuses.columns else statuses.assign(arm="all")
    mentioned = mentioned_table(s, ["arm"], order)
    small = mentioned_table(s[smaller_group(s)], ["arm"], order) if triage else None
    prim = back = None
    if primary is not None:
        p = primary if "arm" in primary.columns else primary.assign(arm="all")
        prim = primary_table(p[smaller_group(p)] if triage else p, ["arm"])
        back = backfire_table(p)
    return RationaleTables(mentioned, small, prim, back, triage)


def rationales_of(run: Run) -> RationaleTables | None:
    """The tables of a run coded for ``rationales`` (None: not coded), joined with the trials' factors and
    choices; the primary rationale from ``coding/rationale.parquet`` where it exists."""
    from analysis.influence.coding import load_coding, with_factors

    got = load_coding(run.root, "rationales")
    if got is None:
        return None
    raw, meta = got
    statuses = check_statuses(raw, str(run.root / "coding" / "rationales.parquet"))
    chosen = choices(run)
    statuses = with_factors(statuses, run).merge(chosen, on=["trial_id", "draw"], how="left")
    order = list(dict.fromkeys([*meta.get("rationales", []), *statuses["rationale"]]))
    prim = load_coding(run.root, "rationale")
    primary = None
    if prim is not None:
        primary = with_factors(prim[0], run).merge(chosen, on=["trial_id", "draw"], how="left")
    return rationale_tables(statuses, primary, order)
