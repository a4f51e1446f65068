"""The cue-visibility paper's cross-model tables (paper 001: Tables 5, 24-28, 37, 39-42), from a panel's runs.

Every table is a pure function of the per-run tables that
:func:`analysis.cue.compare.run_tables` computes on the panel's matched
dilemmas (greedy decisions and eligible denominators unless ``probe compare
--decision expected``), at **every** arm the runs have, not only the headline
(hardest) Puzzled level; the Markdown sections pick the paper's columns.

* :func:`solve_by_level` (Table 5): per run and arm, the joint (gender and race
  both right) recovery accuracy over (item, individual) pairs, per attribute,
  and the share answered (the paper's P).
* :func:`status_by_model` (Tables 24-28): per run, arm, dilemma status and
  group, the could-be "yes" rate (the rate at which a group's individual is
  taken to be the described person); :func:`status_average` the mean over runs.
* :func:`gap_by_level` (Table 39): per run and arm, the macro net under Direct
  and the arm, the deltas and the Gap = net(Direct) - net(arm).
* :func:`wordings_by_model` (Table 40): per run, what-if wording and arm, macro
  Favor, Against and Net in both denominators (the paper reads them over all
  parsable answers, ``*_all``).
* :func:`topic_by_model` and :func:`topic_macro` (Table 41): per topic and arm,
  Favor and Against per run, then their mean over runs, Net = mean Favor - mean
  Against, and Delta against = mean Against(arm) - mean Against(Direct).
* :func:`formal_named_by_model` (Table 42): per run and level, the macro net
  under Direct, Puzzled and FormalNamed, D->P and D->FN (the macro Gaps) and
  the share D->FN / D->P.
* :func:`shape_table` (Table 37): per model with runs of several puzzle
  solution shapes (``--shape canonical|sol1|sol2|random``), the headline arm's
  macro net per shape on the same dilemmas, and ``rand``, the mean of sol1 and
  sol2 (both shapes answer the same items, so this is their pooled macro net
  up to the pooling weights).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd

from probe.panel import PanelError, PanelRun


class CueRun(Protocol):
    """One run's tables on the matched dilemmas, as :class:`analysis.cue.compare.CueRun` holds them."""

    @property
    def run(self) -> PanelRun: ...
    @property
    def bias(self) -> pd.DataFrame: ...
    @property
    def gap(self) -> pd.DataFrame: ...
    @property
    def solve(self) -> pd.DataFrame | None: ...
    @property
    def status(self) -> pd.DataFrame | None: ...
    @property
    def topic(self) -> pd.DataFrame | None: ...
    @property
    def wordings(self) -> pd.DataFrame | None: ...


MACRO = "macro"
DIRECT = "direct"
ARM_ORDER = ("direct", "puzzled-easy", "puzzled-intermediate", "puzzled-hard", "named")
FN_LEVELS = ("easy", "intermediate", "hard")


def arm_key(arm: str) -> tuple[int, str]:
    """Sort key of an arm: Direct, the Puzzled levels easy to hard, Named, then the FormalNamed levels."""
    if arm in ARM_ORDER:
        return ARM_ORDER.index(arm), arm
    level = arm.removeprefix("formal_named-")
    return len(ARM_ORDER) + (FN_LEVELS.index(level) if level in FN_LEVELS else len(FN_LEVELS)), arm


def _macro_rows(frame: pd.DataFrame, cons: str) -> pd.DataFrame:
    return frame[(frame["consequences"] == cons) & (frame["group"] == MACRO)].set_index("arm")


def gap_by_level(runs: Sequence[CueRun], cons: str) -> pd.DataFrame:
    """Table 39: per run and non-Direct arm, the macro nets, deltas and the Gap (with its bootstrap SD)."""
    rows = []
    for r in runs:
        bias, gap = _macro_rows(r.bias, cons), _macro_rows(r.gap, cons)
        if DIRECT not in bias.index:
            continue
        for arm in sorted(gap.index, key=arm_key):
            rows.append(
                {
                    "name": r.run.name,
                    "arm": arm,
                    "direct_net": float(bias.loc[DIRECT, "net"]),
                    "arm_net": float(bias.loc[arm, "net"]) if arm in bias.index else np.nan,
                    "d_against": float(gap.loc[arm, "d_against"]),
                    "d_favor": float(gap.loc[arm, "d_favor"]),
                    "gap": float(gap.loc[arm, "gap"]),
                    "sd_gap": float(gap.loc[arm, "sd_gap"]),
                }
            )
    cols = ["name", "arm", "direct_net", "arm_net", "d_against", "d_favor", "gap", "sd_gap"]
    return pd.DataFrame(rows, columns=cols)


def solve_by_level(runs: Sequence[CueRun]) -> pd.DataFrame | None:
    """Table 5: each run's identity-recovery table (:func:`analysis.cue.identity.solve_rates`) with its name;
    None when no run has identity checks."""
    parts = [r.solve.assign(name=r.run.name) for r in runs if r.solve is not None]
    if not parts:
        return None
    out = pd.concat([p.iloc[sorted(range(len(p)), key=lambda i: arm_key(str(p["arm"].iloc[i])))] for p in parts])
    return out[["name", *[c for c in out.columns if c != "name"]]].reset_index(drop=True)


def status_by_model(runs: Sequence[CueRun], cons: str) -> pd.DataFrame | None:
    """Tables 24-28: per run, arm, status and group, the could-be yes rate; None when no run has it."""
    parts = [r.status[r.status["consequences"] == cons].assign(name=r.run.name) for r in runs if r.status is not None]
    if not parts:
        return None
    out = pd.concat(parts, ignore_index=True)
    return out[["name", "arm", "consequences", "status", "attr", "group", "rate", "sd_rate", "n"]]


def status_average(status: pd.DataFrame) -> pd.DataFrame:
    """The paper's Average rows of Tables 24-28: per (arm, status, attr, group) the mean rate over runs."""
    keys = ["arm", "consequences", "status", "attr", "group"]
    g = status.groupby(keys, sort=False)["rate"]
    return g.mean().to_frame("rate").join(g.count().rename("runs")).reset_index()


def wordings_by_model(runs: Sequence[CueRun], cons: str) -> pd.DataFrame | None:
    """Table 40: per run, wording and arm, macro Favor / Against / Net (eligible and all parsable); None when no
    run has paraphrased wordings."""
    parts = [
        r.wordings[r.wordings["consequences"] == cons].assign(name=r.run.name) for r in runs if r.wordings is not None
    ]
    if not parts:
        return None
    out = pd.concat(parts, ignore_index=True)
    return out[["name", *[c for c in out.columns if c != "name"]]]


def topic_by_model(runs: Sequence[CueRun], cons: str) -> pd.DataFrame | None:
    """Per run, arm and topic: Favor, Against, Net and n (the per-model terms of Table 41); None without topics."""
    parts = [
        r.topic[r.topic["consequences"] == cons].assign(name=r.run.name).rename(columns={"group": "topic"})
        for r in runs
        if r.topic is not None
    ]
    if not parts:
        return None
    out = pd.concat(parts, ignore_index=True)
    return out[["name", "arm", "consequences", "topic", "favor", "against", "net", "n"]]


def topic_macro(by_model: pd.DataFrame) -> pd.DataFrame:
    """Table 41: per (arm, topic), the mean over runs of Favor and of Against (each over the runs where it is
    defined), Net = mean Favor - mean Against, and Delta against = mean Against(arm) - mean Against(Direct)."""
    g = by_model.groupby(["arm", "consequences", "topic"], sort=False)
    out = g[["favor", "against"]].mean()
    out["net"] = out["favor"] - out["against"]
    out["runs_favor"], out["runs_against"] = g["favor"].count(), g["against"].count()
    out = out.reset_index()
    direct = out[out["arm"] == DIRECT].set_index(["consequences", "topic"])["against"]
    ref = pd.Series([direct.get((c, t), np.nan) for c, t in zip(out["consequences"], out["topic"], strict=True)])
    out["d_against"] = (out["against"] - ref.to_numpy()).where(out["arm"] != DIRECT)
    return out.iloc[sorted(range(len(out)), key=lambda i: arm_key(str(out["arm"].iloc[i])))].reset_index(drop=True)


def formal_named_by_model(runs: Sequence[CueRun], cons: str) -> pd.DataFrame | None:
    """Table 42: per run and level with both a Puzzled and a FormalNamed arm: the macro nets, D->P and D->FN
    (the macro Gaps) and ``share = D->FN / D->P``; None when no run has FormalNamed."""
    rows = []
    for r in runs:
        bias, gap = _macro_rows(r.bias, cons), _macro_rows(r.gap, cons)
        for level in FN_LEVELS:
            p, fn = f"puzzled-{level}", f"formal_named-{level}"
            if p not in gap.index or fn not in gap.index:
                continue
            d_p, d_fn = float(gap.loc[p, "gap"]), float(gap.loc[fn, "gap"])
            rows.append(
                {
                    "name": r.run.name,
                    "level": level,
                    "direct_net": float(bias.loc[DIRECT, "net"]),
                    "puzzled_net": float(bias.loc[p, "net"]),
                    "fn_net": float(bias.loc[fn, "net"]),
                    "d_to_p": d_p,
                    "d_to_fn": d_fn,
                    "share": d_fn / d_p if d_p else np.nan,
                }
            )
    return pd.DataFrame(rows) if rows else None


SHAPE_COLUMNS = {"canonical": "orig", "sol1": "sol1", "sol2": "sol2", "random": "random"}


def shape_table(runs: Sequence[CueRun], shapes: Mapping[str, str], arm: str, cons: str) -> pd.DataFrame | None:
    """Table 37: per model with runs of two or more solution shapes (``shapes``: run name -> its ``--shape``),
    the macro net of ``arm`` per shape (``orig`` = canonical) and ``rand`` = mean(sol1, sol2); None when no model
    has two shapes (a panel of one shape has no such table). In a panel that mixes shapes, a model with two runs
    of one shape is an error (which one would the column show?)."""
    if len(set(shapes.values())) < 2:
        return None
    by_model: dict[str, dict[str, CueRun]] = {}
    for r in runs:
        mine = by_model.setdefault(r.run.model, {})
        shape = shapes[r.run.name]
        if shape in mine:
            raise PanelError(
                f"model {r.run.model!r} has two runs with --shape {shape} ({mine[shape].run.name}, {r.run.name}); "
                "compare one run per shape for the shape table"
            )
        mine[shape] = r
    rows = []
    for model, per in by_model.items():
        if len(per) < 2:
            continue
        row: dict[str, object] = {"model": model}
        for shape, col in SHAPE_COLUMNS.items():
            b = _macro_rows(per[shape].bias, cons) if shape in per else None
            row[col] = float(b.loc[arm, "net"]) if b is not None and arm in b.index else np.nan
            row[f"sd_{col}"] = float(b.loc[arm, "sd_net"]) if b is not None and arm in b.index else np.nan
        row["rand"] = (row["sol1"] + row["sol2"]) / 2 if "sol1" in per and "sol2" in per else np.nan  # type: ignore[operator]
        rows.append(row)
    return pd.DataFrame(rows) if rows else None


@dataclass(frozen=True)
class PaperTables:
    """The paper's cross-model tables of one panel (None: the runs lack what the table needs)."""

    gap_by_level: pd.DataFrame
    solve_by_level: pd.DataFrame | None
    status: pd.DataFrame | None
    status_average: pd.DataFrame | None
    wordings: pd.DataFrame | None
    topic_by_model: pd.DataFrame | None
    topic_macro: pd.DataFrame | None
    formal_named: pd.DataFrame | None
    shapes: pd.DataFrame | None

    def csv_tables(self) -> dict[str, pd.DataFrame | None]:
        """The tables by CSV stem (``cue_<name>.csv``)."""
        return {
            "cue_gap_by_level": self.gap_by_level,
            "cue_solve_by_level": self.solve_by_level,
            "cue_status_by_model": self.status,
            "cue_status_average": self.status_average,
            "cue_wordings_by_model": self.wordings,
            "cue_topic_by_model": self.topic_by_model,
            "cue_topic_macro": self.topic_macro,
            "cue_formal_named": self.formal_named,
            "cue_shapes": self.shapes,
        }


def paper_tables(runs: Sequence[CueRun], shapes: Mapping[str, str], arm: str, cons: str) -> PaperTables:
    """Every cross-model table of the paper on ``runs`` (headline ``arm``, consequences ``cons``)."""
    status = status_by_model(runs, cons)
    topics = topic_by_model(runs, cons)
    return PaperTables(
        gap_by_level=gap_by_level(runs, cons),
        solve_by_level=solve_by_level(runs),
        status=status,
        status_average=status_average(status) if status is not None else None,
        wordings=wordings_by_model(runs, cons),
        topic_by_model=topics,
        topic_macro=topic_macro(topics) if topics is not None else None,
        formal_named=formal_named_by_model(runs, cons),
        shapes=shape_table(runs, shapes, arm, cons),
    )
