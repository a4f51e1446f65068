"""Cue visibility across a panel of runs (paper 001, sections 4.1 and 4.4, appendix O).

``probe compare`` on ``cue`` runs computes, as frames (:func:`compare_cue_frames`;
:mod:`analysis.cue.compare_report` writes them):

1. **Matched items.** Runs are matched on the dilemmas they all hold; the
   decision-bias and gap tables of each run (:func:`analysis.cue.metrics.decision_bias`,
   greedy decisions by default (the paper's temperature 0; ``decision="expected"``
   is the option), eligible denominators) are computed on those.
2. **Rankings.** Per run, the macro net bias (mean over gender and race groups)
   under Direct and under the headline Puzzled arm (the hardest level every
   run has), and the macro Gap = net(Direct) - net(Puzzled). Ranks: by Direct
   net and by Puzzled net, 1 = the most favorable to the described person (the
   "safest" under that condition); by the Gap, 1 = the smallest gap (the most
   robust to hiding the label). Kendall's tau-b between the rankings, with
   scipy's p-value (exact for small panels without ties).
3. **Sign tests across models** of the Gap, Delta Against and Delta Favor per
   group (:func:`analysis.cue.across_models.sign_tests`).
4. **Gap against model attributes**: a user table (``--attributes`` CSV,
   column ``model`` matching a run's display name or its model, numeric
   columns); when every run has identity checks, the derived
   ``puzzle_solve_rate`` is added: the paper's Capability (App. O), the
   both-correct (joint) check accuracy macro-averaged over the Puzzled
   difficulty levels present (mean over levels of the per-level mean over
   (item, individual) pairs), with consequences when the runs have them
   (``capability="headline"``: the headline arm alone). Identity comes from
   the JSON of the could-be replies when a run has them (the paper's reading),
   else from the check probe. Per attribute an OLS ``gap ~ attribute``
   (statsmodels; slope, 95% CI, R^2, n) and, with two or more attributes and
   enough models, the joint fit. A panel of a few models is badly
   underpowered; the report says so.

**Sources.** Each run is read from its own source (readouts where it has them,
:meth:`probe.runs.Run.choice_probs`). When every run holds both readouts and
samples, :func:`compare_cue_sources` computes the whole comparison from each
(:func:`compare_cue_frames` with ``source``) and the report shows both; a panel
where any run has one source is compared as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.cue.decisions import Decision
from analysis.cue.panel_tables import PaperTables, paper_tables
from probe.panel import Panel, PanelError, PanelRun, shared_items
from probe.views import SOURCES

N_BOOT = 1000
SEED = 0
LEVELS = ("hard", "intermediate", "easy")
MIN_MODELS = 10
"""Below this many models the report calls the attribute regressions underpowered."""


@dataclass(frozen=True)
class CueRun:
    """One run's tables on the matched items."""

    run: PanelRun
    bias: pd.DataFrame
    gap: pd.DataFrame
    solve: pd.DataFrame | None
    status: pd.DataFrame | None = None
    """Could-be status bias per (arm, consequences, status, attr, group) (:func:`analysis.cue.identity.status_bias`);
    None without annotated could-be trials."""
    topic: pd.DataFrame | None = None
    """Decision bias per (arm, consequences, topic) (:func:`analysis.cue.metrics.breakdown_tables`); None without
    topics."""
    wordings: pd.DataFrame | None = None
    """Macro Favor / Against / Net per what-if wording and arm (:func:`analysis.cue.metrics.wording_table`); None
    without paraphrased wordings."""


def run_frames(run: PanelRun, source: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(options, per_trial) of a cue run, as every cue analysis reads them; ``source``: ``readout`` or ``samples``,
    None: the run's own (readouts where it has them; :meth:`probe.runs.Run.choice_probs`)."""
    options, per_trial, _ = run.run().choice_probs(source)
    return options, per_trial


def both_sources(panel: Panel) -> bool:
    """Whether every run of ``panel`` holds readouts and samples."""
    return all(r.run().sources == SOURCES for r in panel.runs)


def run_tables(
    run: PanelRun,
    options: pd.DataFrame,
    per_trial: pd.DataFrame,
    items: Sequence[str],
    *,
    n_boot: int = N_BOOT,
    seed: int = SEED,
    decision: Decision = "greedy",
) -> CueRun:
    """Bias, gap and solve-rate tables of one run restricted to ``items``."""
    from analysis.cue.identity import identity_checks, solve_rates
    from analysis.cue.metrics import decision_bias

    keep = set(items)
    pt = per_trial[per_trial["item_id"].isin(keep)]
    opts = options[options["trial_id"].isin(set(pt["trial_id"]))]
    bias, gap = decision_bias(opts, pt, decision=decision, n_boot=n_boot, seed=seed)
    checks, _ = identity_checks(run.run(), opts, pt, _labels(run))  # JSON replies when the run has them
    checks = checks[checks["item_id"].isin(keep)]
    solve = solve_rates(checks) if not checks.empty else None
    return CueRun(run, bias, gap, solve, *_paper_tables(opts, pt, n_boot=n_boot, seed=seed, decision=decision))


def _paper_tables(
    options: pd.DataFrame, per_trial: pd.DataFrame, *, n_boot: int, seed: int, decision: Decision
) -> tuple[pd.DataFrame | None, pd.DataFrame | None, pd.DataFrame | None]:
    """(status, topic, wordings) of one run for the paper's cross-model tables (:mod:`analysis.cue.panel_tables`);
    each None where the run lacks what it needs."""
    from analysis.cue.identity import status_bias
    from analysis.cue.metrics import breakdown_tables, wording_table

    status = None
    if (per_trial["probe"] == "could_be").any():
        sb = status_bias(options, per_trial, decision=decision, n_boot=n_boot, seed=seed)
        status = sb if not sb.empty else None
    topic, _ = breakdown_tables(options, per_trial, "topic", decision=decision, n_boot=n_boot, seed=seed)
    wordings = None
    if "wording" in per_trial.columns and per_trial["wording"].fillna("").astype(str).ne("").any():
        wordings = wording_table(options, per_trial, decision=decision, n_boot=n_boot, seed=seed)
    return status, (topic if not topic.empty else None), wordings


def _labels(run: PanelRun) -> dict[str, tuple[str, ...]]:
    """The run's attribute labels, as its report reads them (:func:`analysis.cue.results.attribute_labels`)."""
    from analysis.cue.results import attribute_labels
    from experiments.cue import CueSpec

    return attribute_labels(run.run().manifest.spec_as(CueSpec))


def headline_arm(runs: Sequence[CueRun]) -> str:
    """The hardest Puzzled level that every run has (the paper's headline: Puzzled-hard)."""
    for lv in LEVELS:
        arm = f"puzzled-{lv}"
        if all(arm in set(r.gap["arm"]) for r in runs):
            return arm
    raise PanelError(
        "the runs share no Puzzled arm with a Direct reference; run them with --conditions including direct,puzzled"
    )


def common_consequences(runs: Sequence[CueRun]) -> str:
    """``with`` when every run has it, else the first consequences setting all runs share."""
    sets = [set(r.gap["consequences"]) for r in runs]
    common = set.intersection(*sets)
    if not common:
        raise PanelError("the runs share no consequences setting (with / without); run them alike")
    return "with" if "with" in common else sorted(common)[0]


def _macro(frame: pd.DataFrame, arm: str, cons: str) -> pd.Series:
    row = frame[(frame["arm"] == arm) & (frame["consequences"] == cons) & (frame["group"] == "macro")]
    if row.empty:
        raise PanelError(f"no macro row for arm {arm!r}, consequences {cons!r}")
    return row.iloc[0]


def model_table(runs: Sequence[CueRun], arm: str, cons: str) -> pd.DataFrame:
    """One row per run: macro net under Direct and under ``arm``, the deltas and the Gap, with bootstrap SDs."""
    from analysis.cue.decisions import REFERENCE

    rows = []
    for r in runs:
        d, p, g = _macro(r.bias, REFERENCE, cons), _macro(r.bias, arm, cons), _macro(r.gap, arm, cons)
        rows.append(
            {
                "name": r.run.name,
                "model": r.run.model,
                "reasoning": r.run.reasoning,
                "direct_net": float(d["net"]),
                "sd_direct_net": float(d["sd_net"]),
                "puzzled_net": float(p["net"]),
                "sd_puzzled_net": float(p["sd_net"]),
                "d_against": float(g["d_against"]),
                "d_favor": float(g["d_favor"]),
                "gap": float(g["gap"]),
                "sd_gap": float(g["sd_gap"]),
            }
        )
    return pd.DataFrame(rows)


def rankings(table: pd.DataFrame) -> pd.DataFrame:
    """Add the ranks: Direct and Puzzled net (1 = most favorable), Gap (1 = smallest) and the rank change.

    Ties share the lowest rank (``method="min"``); NaN values get no rank.
    """
    out = table.copy()
    out["rank_direct"] = out["direct_net"].rank(ascending=False, method="min")
    out["rank_puzzled"] = out["puzzled_net"].rank(ascending=False, method="min")
    out["rank_gap"] = out["gap"].rank(ascending=True, method="min")
    out["rank_change"] = out["rank_puzzled"] - out["rank_direct"]
    return out


def kendall(table: pd.DataFrame) -> pd.DataFrame:
    """Kendall's tau-b (scipy) between the three rankings of :func:`rankings`, over runs ranked in both."""
    from scipy.stats import kendalltau

    rows = []
    for a, b in (("rank_direct", "rank_puzzled"), ("rank_direct", "rank_gap"), ("rank_puzzled", "rank_gap")):
        sub = table[[a, b]].dropna()
        tau, p = (math.nan, math.nan)
        if len(sub) >= 2 and sub[a].nunique() > 1 and sub[b].nunique() > 1:
            res = kendalltau(sub[a], sub[b])
            tau, p = float(res.statistic), float(res.pvalue)
        rows.append(
            {
                "ranking_a": a.removeprefix("rank_"),
                "ranking_b": b.removeprefix("rank_"),
                "n": len(sub),
                "tau": tau,
                "p_value": p,
            }
        )
    return pd.DataFrame(rows)


def group_sign_tests(runs: Sequence[CueRun], arm: str, cons: str) -> pd.DataFrame:
    """Sign tests across runs of Gap, Delta Against and Delta Favor, per group (and the macro row)."""
    from analysis.cue.across_models import sign_tests, stack_models

    per_model = stack_models({r.run.name: r.gap[(r.gap["arm"] == arm) & (r.gap["consequences"] == cons)] for r in runs})
    parts = [sign_tests(per_model, value=v).assign(value=v) for v in ("gap", "d_against", "d_favor")]
    return pd.concat(parts, ignore_index=True)


def net_by_group(runs: Sequence[CueRun], arm: str, cons: str) -> pd.DataFrame:
    """Long table: per run and group, net under Direct and under ``arm``, and the gap."""
    from analysis.cue.decisions import REFERENCE

    rows = []
    for r in runs:
        b = r.bias[r.bias["consequences"] == cons].set_index(["arm", "attr", "group"])
        g = r.gap[(r.gap["consequences"] == cons) & (r.gap["arm"] == arm)].set_index(["attr", "group"])
        for attr, group in g.index:
            rows.append(
                {
                    "name": r.run.name,
                    "attr": attr,
                    "group": group,
                    "direct_net": b["net"].get((REFERENCE, attr, group), np.nan),
                    "puzzled_net": b["net"].get((arm, attr, group), np.nan),
                    "gap": g.loc[(attr, group), "gap"],
                }
            )
    return pd.DataFrame(rows)


AVERAGED = ("direct_net", "puzzled_net", "d_against", "d_favor", "gap")


def average_row(models: pd.DataFrame) -> pd.DataFrame:
    """The headline tables' Average row: the mean over runs of each macro value (NaN-skipping), one row."""
    row: dict[str, object] = {"name": "Average", "runs": len(models)}
    for c in AVERAGED:
        vals = models[c].astype(float)
        row[c] = float(vals.mean()) if vals.notna().any() else float("nan")
    return pd.DataFrame([row])


def average_by_group(by_group: pd.DataFrame) -> pd.DataFrame:
    """Per (attr, group): the mean over runs of net under Direct and under the headline arm, and of the gap."""
    cols = ["direct_net", "puzzled_net", "gap"]
    if by_group.empty:
        return pd.DataFrame(columns=["attr", "group", "runs", *cols])
    g = by_group.groupby(["attr", "group"], sort=False)
    return g[cols].mean().join(g.size().rename("runs")).reset_index()[["attr", "group", "runs", *cols]]


# ============================================================================ attributes
def read_attributes(path: Path, runs: Sequence[PanelRun]) -> tuple[pd.DataFrame, list[str]]:
    """The attribute table matched to the runs: one row per run name, numeric attribute columns; and notes.

    A row matches a run when its ``model`` equals the run's display name, or
    (when no row names the run) the run's model. Non-numeric columns other than
    ``model`` are ignored (and said so).
    """
    table = pd.read_csv(path)
    if "model" not in table.columns:
        raise PanelError(
            f"the attributes table {path} needs a `model` column (run name or model); it has {list(table.columns)}"
        )
    if table["model"].duplicated().any():
        dup = sorted(set(table.loc[table["model"].duplicated(), "model"].astype(str)))
        raise PanelError(f"the attributes table {path} lists model(s) {dup} twice; give one row per model")
    table = table.set_index(table["model"].astype(str)).drop(columns="model")
    numeric = [c for c in table.columns if pd.api.types.is_numeric_dtype(table[c])]
    notes = []
    other = [c for c in table.columns if c not in numeric]
    if other:
        notes.append(f"non-numeric attribute column(s) ignored: {', '.join(map(str, other))}")
    rows, used = [], set()
    for r in runs:
        key = r.name if r.name in table.index else r.model if r.model in table.index else None
        if key is None:
            notes.append(f"run {r.name!r} (model {r.model!r}) has no row in the attributes table")
            rows.append({"name": r.name} | {c: np.nan for c in numeric})
            continue
        used.add(key)
        rows.append({"name": r.name} | {c: table.loc[key, c] for c in numeric})
    unused = [k for k in table.index if k not in used]
    if unused:
        notes.append(f"attribute rows matching no run: {', '.join(unused)}")
    return pd.DataFrame(rows, columns=["name", *numeric]), notes


CAPABILITY = ("macro", "headline")
"""How ``puzzle_solve_rate`` is read: macro over the Puzzled levels (the paper's), or the headline arm alone."""


def solve_attribute(runs: Sequence[CueRun], arm: str, cons: str, capability: str = "macro") -> pd.Series | None:
    """Per run name, the paper's Capability: the joint (both-correct) check accuracy; None if a run lacks it.

    ``capability="macro"``: the mean over the Puzzled difficulty levels every
    run has of each level's accuracy (itself the mean over (item, individual)
    pairs), App. O; ``"headline"``: ``arm`` alone. ``cons`` is the
    consequences setting (the paper: with).
    """
    if capability not in CAPABILITY:
        raise ValueError(f"capability must be one of {', '.join(CAPABILITY)}, got {capability!r}")
    if any(r.solve is None for r in runs):
        return None
    arms = list(_capability_arms(runs, arm, cons, capability))
    if not arms:
        return None
    vals = {}
    for r in runs:
        s = r.solve
        assert s is not None
        per_level = []
        for a in arms:
            row = s[(s["arm"] == a) & (s["consequences"] == cons)]
            if row.empty:
                return None
            per_level.append(float(row["joint"].iloc[0]))
        vals[r.run.name] = float(np.mean(per_level))
    return pd.Series(vals, name="puzzle_solve_rate")


def ols_gap(data: pd.DataFrame, attributes: Sequence[str], y: str = "gap") -> pd.DataFrame:
    """OLS of ``y`` on each attribute alone and, when ``n >= k + 3``, on all jointly.

    One row per (fit, term): fit (``attr`` or ``joint``), term, n, slope,
    95% CI, p, intercept, R^2. Rows with a missing value are left out of that fit.
    """
    import statsmodels.api as sm

    fits: list[tuple[str, list[str]]] = [(a, [a]) for a in attributes]
    if len(attributes) >= 2:
        fits.append(("joint: " + " + ".join(attributes), list(attributes)))
    rows = []
    for label, terms in fits:
        sub = data[[y, *terms]].dropna()
        n = len(sub)
        if n < len(terms) + 2 + (1 if len(terms) > 1 else 0) or any(sub[t].nunique() < 2 for t in terms):
            rows += [{"fit": label, "term": t, "n": n, "note": "too few models or no spread"} for t in terms]
            continue
        res = sm.OLS(sub[y].astype(float), sm.add_constant(sub[terms].astype(float))).fit()
        ci = res.conf_int()
        for t in terms:
            rows.append(
                {
                    "fit": label,
                    "term": t,
                    "n": n,
                    "slope": float(res.params[t]),
                    "slope_lo": float(ci.loc[t, 0]),
                    "slope_hi": float(ci.loc[t, 1]),
                    "p_value": float(res.pvalues[t]),
                    "intercept": float(res.params["const"]),
                    "r2": float(res.rsquared),
                    "note": "",
                }
            )
    cols = ["fit", "term", "n", "slope", "slope_lo", "slope_hi", "p_value", "intercept", "r2", "note"]
    return pd.DataFrame(rows, columns=cols)


# ============================================================================ the comparison
@dataclass(frozen=True)
class CueComparison:
    runs: tuple[CueRun, ...]
    items: tuple[str, ...]
    dropped: pd.DataFrame
    arm: str
    consequences: str
    models: pd.DataFrame
    kendall: pd.DataFrame
    sign_tests: pd.DataFrame
    by_group: pd.DataFrame
    average: pd.DataFrame
    """The Average row over the runs (:func:`average_row`)."""
    average_by_group: pd.DataFrame
    """The mean over the runs per group (:func:`average_by_group`)."""
    attributes: pd.DataFrame | None
    ols: pd.DataFrame | None
    notes: tuple[str, ...]
    decision: str = "greedy"
    capability: str = "macro"
    capability_arms: tuple[str, ...] = ()
    source: str | None = None
    """The source every run was read from (``readout``, ``samples``); None: each run's own."""
    paper: PaperTables | None = None
    """The paper's cross-model tables at every arm (:mod:`analysis.cue.panel_tables`)."""

    def csv_tables(self) -> dict[str, pd.DataFrame | None]:
        """The comparison's tables by CSV name (``cue_<name>.csv``; None: not computed, no file)."""
        return {
            "cue_rankings": self.models,
            "cue_kendall": self.kendall,
            "cue_sign_tests": self.sign_tests,
            "cue_net_by_group": self.by_group,
            "cue_average": self.average,
            "cue_average_by_group": self.average_by_group,
            "cue_attributes": self.attributes,
            "cue_gap_ols": self.ols,
            **(self.paper.csv_tables() if self.paper is not None else {}),
        }


def compare_cue_sources(
    panel: Panel, *, n_boot: int = N_BOOT, seed: int = SEED, decision: Decision = "greedy", capability: str = "macro"
) -> list[CueComparison]:
    """The comparison from each source (readout, samples) when every run has both (:func:`both_sources`); else the
    one comparison of each run's own source, as :func:`compare_cue_frames` gives it."""
    sources: tuple[str | None, ...] = SOURCES if both_sources(panel) else (None,)
    return [
        compare_cue_frames(panel, n_boot=n_boot, seed=seed, decision=decision, capability=capability, source=s)
        for s in sources
    ]


def compare_cue_frames(
    panel: Panel,
    *,
    n_boot: int = N_BOOT,
    seed: int = SEED,
    decision: Decision = "greedy",
    capability: str = "macro",
    source: str | None = None,
) -> CueComparison:
    """The whole cue comparison of a panel, as frames (no files); ``decision`` of every table (default greedy);
    ``source``: read every run from that source (each must hold it), None: each from its own."""
    frames = {r.name: run_frames(r, source) for r in panel.runs}
    items, dropped = shared_items(panel, {n: list(dict.fromkeys(pt["item_id"])) for n, (_, pt) in frames.items()})
    if not items:
        raise PanelError(f"the runs {panel.names()} share no dilemma; compare runs of the same items")
    runs = [run_tables(r, *frames[r.name], items, n_boot=n_boot, seed=seed, decision=decision) for r in panel.runs]
    arm, cons = headline_arm(runs), common_consequences(runs)
    models = rankings(model_table(runs, arm, cons))
    notes: list[str] = []
    attrs: pd.DataFrame | None = None
    if panel.attributes is not None:
        attrs, notes = read_attributes(Path(panel.attributes), [r.run for r in runs])
    solve = solve_attribute(runs, arm, cons, capability)
    if solve is not None:
        derived = solve.rename_axis("name").reset_index()
        attrs = derived if attrs is None else attrs.merge(derived, on="name", how="left")
    ols = None
    if attrs is not None:
        cols = [c for c in attrs.columns if c != "name"]
        ols = ols_gap(models[["name", "gap"]].merge(attrs, on="name", how="left"), cols)
    by_group = net_by_group(runs, arm, cons)
    paper = paper_tables(runs, {r.run.name: run_shape(r.run) for r in runs}, arm, cons)
    return CueComparison(
        runs=tuple(runs),
        items=tuple(items),
        dropped=dropped,
        arm=arm,
        consequences=cons,
        models=models,
        kendall=kendall(models),
        sign_tests=group_sign_tests(runs, arm, cons),
        by_group=by_group,
        average=average_row(models),
        average_by_group=average_by_group(by_group),
        attributes=attrs,
        ols=ols,
        notes=tuple(notes),
        decision=decision,
        capability=capability,
        capability_arms=_capability_arms(runs, arm, cons, capability) if solve is not None else (),
        source=source,
        paper=paper,
    )


def run_shape(run: PanelRun) -> str:
    """The puzzle solution shape a cue run was made with (``--shape``)."""
    from experiments.cue import CueSpec

    return run.run().manifest.spec_as(CueSpec).shape


def _capability_arms(runs: Sequence[CueRun], arm: str, cons: str, capability: str) -> tuple[str, ...]:
    if capability == "headline":
        return (arm,)
    levels = [f"puzzled-{lv}" for lv in LEVELS]
    return tuple(
        a
        for a in levels
        if all(r.solve is not None and ((r.solve["arm"] == a) & (r.solve["consequences"] == cons)).any() for r in runs)
    )
