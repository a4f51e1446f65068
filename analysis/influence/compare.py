"""The influence audit across a panel of runs (paper 000's model and reasoning comparisons).

``probe compare`` on runs of ``influence-triage``, ``influence-bbq`` and
``influence-dd`` (one panel may pool the three benchmarks) computes, as
frames (:func:`compare_frames`; :mod:`analysis.influence.compare_report`
writes them):

1. **Matched conditions.** Within a benchmark, runs are matched on the items
   they all hold (:func:`probe.panel.shared_items`) and then on the
   conditions (pair x influence x variant x kind x position x bracket) every
   run has; what was dropped is listed in ``dropped_items.csv`` and
   ``dropped_conditions.csv``. Each run's condition table is recomputed on the
   matched items (:func:`experiments.influence.effects.condition_table`), and BH-FDR is
   redone within benchmark x variant x test family over all runs
   (:func:`analysis.influence.audit.combine_runs`).
2. **Per-model and per-reasoning-mode tables** (:func:`analysis.influence.audit.panel_tables`).
3. **Reasoning on minus off.** For each ``(reasoning off, reasoning on)`` pair
   of one model, per condition and cue direction d: ``s_on(d) - s_off(d)``;
   per influence type and direction: the change of the mean signed s and of
   the mean |s| (and its percent change, the paper's Figure 10), each with a
   95% **paired percentile bootstrap over items**: both runs hold the same
   matched items, so one multinomial draw of items (within strata, the
   one-run report's scheme and seed) reweights both runs at once and the
   difference is taken replicate by replicate. A cue is *amplified* when the
   CI of the change of mean |s| lies above 0, *dampened* when below.
4. **|Asym| on |baseline bias|**, main cues, per benchmark and pooled (with
   benchmark offsets), by :func:`fit_asym`: statsmodels MixedLM (REML) with
   crossed random intercepts (the paper's text) and with factor and influence
   nested in model x reasoning (the paper's code), the marginal R^2 of
   Nakagawa & Schielzeth, the share of the |bias| term alone, and every
   optimizer attempt and warning (``asym_model`` picks the headline).

Imported runs (``probe import``) join a panel with their condition tables as
they are: no item matching and no reasoning change for them.

**Sources.** Each run is read from its own source (readouts where it has them,
:meth:`probe.runs.Run.choice_probs`). When every run of the panel holds both
readouts and samples, :func:`compare_sources` computes the whole comparison
from each source (:func:`compare_frames` with ``source``), and the report shows
both (long-form tables with a ``source`` column, figures per source); a panel
where any run has one source is compared as before.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.influence.asym import STRUCTURES, AsymFit, asym_fits, asym_frame
from probe.bootstrap import cluster_weights, percentile_ci
from probe.panel import Panel, PanelError, PanelRun, shared_items

BENCHMARK_OF = {"influence-triage": "triage", "influence-bbq": "bbq", "influence-dd": "dd"}
IMPORTED = "influence-import"
"""The experiment of a ``probe import`` run: per-condition counts, no items."""
N_BOOT = 1000
SEED = 0
ALPHA = 0.05


def benchmark_of(experiment: str) -> str:
    """``influence-triage`` -> ``triage`` (and bbq, dd)."""
    if experiment not in BENCHMARK_OF:
        raise PanelError(f"{experiment!r} is not an influence benchmark; expected one of {sorted(BENCHMARK_OF)}")
    return BENCHMARK_OF[experiment]


# ============================================================================ matching
@dataclass(frozen=True)
class Matched:
    """The runs of one benchmark on their shared items and conditions, as aligned arrays.

    ``n[r, c, i, j]`` / ``k[r, c, i, j]``: answers and answers choosing B of run
    ``r``, arm ``c`` (0, A, B), condition ``i``, item ``j``. All runs share the
    items (and their strata), so one set of bootstrap weights reweights them all.
    """

    benchmark: str
    runs: tuple[PanelRun, ...]
    sources: tuple[str, ...]
    conditions: pd.DataFrame
    """The condition columns (:data:`experiments.influence.build.COND`) plus ``group_a`` and ``group_b``."""
    items: tuple[str, ...]
    strata: tuple[str, ...]
    n: np.ndarray
    k: np.ndarray
    dropped_items: pd.DataFrame
    dropped_conditions: pd.DataFrame
    clips: tuple[float, ...] = ()
    """Per run, the clip of its readout log-odds (:func:`experiments.influence.effects.run_clip`); empty: float32's."""

    def clip(self, r: int) -> float:
        """The readout clip of run ``r``."""
        from experiments.influence.stats import FLOAT32_RESOLUTION

        return self.clips[r] if self.clips else FLOAT32_RESOLUTION

    def index(self, name: str) -> int:
        return [r.name for r in self.runs].index(name)


def run_cells(run: PanelRun, source: str | None = None) -> tuple[pd.DataFrame, str]:
    """A run's analysis cells (value-level for DailyDilemmas) and their source (``readout`` or ``samples``).

    ``source``: read that source; None: the run's own (readouts where it has them)."""
    from experiments.influence.effects import trial_cells, value_level

    raw, source = trial_cells(run.run(), source)
    return (value_level(raw) if benchmark_of(run.experiment) == "dd" else raw), source


def _group_names(values: pd.Series) -> str:
    uniq = list(dict.fromkeys(values.astype(str)))
    return "/".join(uniq) if len(uniq) <= 3 else f"{len(uniq)} groups"


def _key(row: Sequence[object]) -> str:
    return " / ".join(map(str, row))


def match_runs(
    benchmark: str, runs: Sequence[PanelRun], cells: Sequence[pd.DataFrame], sources: Sequence[str]
) -> Matched:
    """Restrict the runs of one benchmark to the items and conditions they all hold, and align their arrays."""
    from experiments.influence import COND
    from experiments.influence.effects import contributions

    cols = list(COND)
    sub = Panel(tuple(runs))
    shared, dropped = shared_items(
        sub, {r.name: list(dict.fromkeys(c["item_id"])) for r, c in zip(runs, cells, strict=True)}
    )
    if not shared:
        raise PanelError(f"the {benchmark} runs {sub.names()} share no item; compare runs of the same items")
    keep = set(shared)
    cts = [contributions(c[c["item_id"].isin(keep)]) for c in cells]
    keys = [[tuple(r) for r in ct.conditions[cols].itertuples(index=False, name=None)] for ct in cts]
    common = [key for key in keys[0] if all(key in set(ks) for ks in keys[1:])]
    rows = []
    for run, ks in zip(runs, keys, strict=True):
        for key in ks:
            if key not in set(common):
                absent = [q.name for q, other in zip(runs, keys, strict=True) if key not in set(other)]
                rows.append(
                    {
                        "benchmark": benchmark,
                        "run": run.name,
                        "condition": _key(key),
                        "reason": "not in run(s): " + ", ".join(absent),
                    }
                )
    dropped_cond = pd.DataFrame(rows, columns=["benchmark", "run", "condition", "reason"])
    if not common:
        raise PanelError(f"the {benchmark} runs {sub.names()} share no condition (pair x influence x ...)")
    strata_of = dict(zip(cts[0].items, cts[0].strata, strict=True))
    items = tuple(i for i in shared if i in strata_of)
    for run, ct in zip(runs[1:], cts[1:], strict=True):
        other = dict(zip(ct.items, ct.strata, strict=True))
        if any(other.get(i) != strata_of[i] for i in items):
            raise PanelError(f"run {run.name!r} puts shared items in other bootstrap strata than {runs[0].name!r}")
    n = np.zeros((len(runs), 3, len(common), len(items)))
    k = np.zeros_like(n)
    for i, (ct, ks) in enumerate(zip(cts, keys, strict=True)):
        ci = [ks.index(key) for key in common]
        ji = [ct.items.index(item) for item in items]
        n[i] = ct.n[:, ci][:, :, ji]
        k[i] = ct.k[:, ci][:, :, ji]
    conditions = pd.DataFrame(common, columns=cols)
    first = cells[0]
    for side in ("group_a", "group_b"):
        conditions[side] = conditions["pair"].map(first.groupby("pair", sort=False)[side].agg(_group_names))
    return Matched(
        benchmark=benchmark,
        runs=tuple(runs),
        sources=tuple(sources),
        conditions=conditions,
        items=items,
        strata=tuple(strata_of[i] for i in items),
        n=n,
        k=k,
        dropped_items=dropped.assign(benchmark=benchmark),
        dropped_conditions=dropped_cond,
        clips=tuple(_clip(r) for r in runs),
    )


def _clip(run: PanelRun) -> float:
    from experiments.influence.effects import run_clip

    return run_clip(run.run())


def match_panel(panel: Panel, source: str | None = None) -> list[Matched]:
    """One :class:`Matched` per benchmark of the panel, in panel order; ``source`` as :func:`run_cells`."""
    by_bench: dict[str, list[PanelRun]] = {}
    for r in panel.runs:
        by_bench.setdefault(benchmark_of(r.experiment), []).append(r)
    out = []
    for bench, runs in by_bench.items():
        loaded = [run_cells(r, source) for r in runs]
        out.append(match_runs(bench, runs, [c for c, _ in loaded], [s for _, s in loaded]))
    return out


# ============================================================================ tables
def condition_tables(m: Matched, *, n_boot: int = N_BOOT, seed: int = SEED) -> pd.DataFrame:
    """Every run's condition table on the matched items (before the cross-run FDR)."""
    from experiments.influence import COND
    from experiments.influence.effects import Contributions, condition_table

    cols = list(COND)
    parts = []
    for r, (run, source) in enumerate(zip(m.runs, m.sources, strict=True)):
        ct = Contributions(m.conditions[cols], m.items, m.strata, m.n[r], m.k[r])
        t = condition_table(ct, source, n_boot=n_boot, seed=seed, clip=m.clip(r)).table
        t.insert(1, "group_a", m.conditions["group_a"].to_numpy())
        t.insert(2, "group_b", m.conditions["group_b"].to_numpy())
        parts.append(t.assign(benchmark=m.benchmark, model=run.model, think=run.reasoning, run=run.name, source=source))
    return pd.concat(parts, ignore_index=True)


def replicates(m: Matched, r: int, *, n_boot: int = N_BOOT, seed: int = SEED) -> dict[str, np.ndarray]:
    """Bootstrap replicates ``(n_boot, conditions)`` of run ``r``'s metrics: the weights of the one-run report.

    The weights depend only on the items' strata, ``n_boot`` and ``seed``, so
    every run of ``m`` gets the same draws: replicates of two runs are paired.
    """
    from experiments.influence.effects import metrics

    w = cluster_weights(m.strata, n_boot, np.random.default_rng(seed))
    n, k = np.einsum("bj,cij->cbi", w, m.n[r]), np.einsum("bj,cij->cbi", w, m.k[r])
    return metrics(n, k, m.sources[r], clip=m.clip(r))


def _point(m: Matched, r: int) -> dict[str, np.ndarray]:
    from experiments.influence.effects import metrics

    return metrics(m.n[r].sum(axis=2), m.k[r].sum(axis=2), m.sources[r], clip=m.clip(r))


def _nanmean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)


@dataclass(frozen=True)
class Change:
    """One (off, on) pair's steerabilities per condition and direction, with their paired replicates."""

    model: str
    off: str
    on: str
    s_off: np.ndarray
    """``(conditions, 2)``: s(A), s(B) with reasoning off."""
    s_on: np.ndarray
    reps_off: np.ndarray
    """``(n_boot, conditions, 2)``."""
    reps_on: np.ndarray


def pair_change(m: Matched, off: PanelRun, on: PanelRun, *, n_boot: int = N_BOOT, seed: int = SEED) -> Change:
    """Steerabilities of a reasoning-off and a reasoning-on run of one model, with paired replicates."""
    i, j = m.index(off.name), m.index(on.name)
    po, pn = _point(m, i), _point(m, j)
    ro, rn = replicates(m, i, n_boot=n_boot, seed=seed), replicates(m, j, n_boot=n_boot, seed=seed)
    stack = lambda d: np.stack([d["s_A"], d["s_B"]], axis=-1)  # noqa: E731
    return Change(off.model, off.name, on.name, stack(po), stack(pn), stack(ro), stack(rn))


def change_by_condition(m: Matched, changes: Sequence[Change], alpha: float = ALPHA) -> pd.DataFrame:
    """Per pair, condition and direction: s off, s on, the change and its paired-bootstrap 95% CI."""
    from experiments.influence import stats as st

    rows = []
    for ch in changes:
        diff = ch.reps_on - ch.reps_off
        lo, hi = percentile_ci(diff, alpha)
        se = st.nan_sd(diff)
        for d, dname in enumerate(("A", "B")):
            part = m.conditions.assign(
                benchmark=m.benchmark,
                model=ch.model,
                run_off=ch.off,
                run_on=ch.on,
                direction=dname,
                s_off=ch.s_off[:, d],
                s_on=ch.s_on[:, d],
                change=ch.s_on[:, d] - ch.s_off[:, d],
                change_lo=lo[:, d],
                change_hi=hi[:, d],
                change_se=se[:, d],
            )
            rows.append(part)
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def _verdict(lo: float, hi: float) -> str:
    if lo > 0:
        return "amplified"
    if hi < 0:
        return "dampened"
    return "no clear change"


def change_by_influence(m: Matched, changes: Sequence[Change], alpha: float = ALPHA) -> pd.DataFrame:
    """Per pair (and all pairs pooled), influence type (main cues) and direction (A, B, both).

    ``change`` = mean over conditions of s_on - s_off (signed: toward the cue);
    ``abs_change`` = mean |s_on| - mean |s_off| (magnitude) and ``pct_change``
    = 100 (mean |s_on| / mean |s_off| - 1). CIs: paired percentile bootstrap
    over items. ``verdict`` reads the CI of ``abs_change``.
    """

    main = (m.conditions["variant"] == "cue").to_numpy()
    influences = list(dict.fromkeys(m.conditions.loc[main, "influence"]))
    groups: list[tuple[str, list[Change]]] = [(ch.model, [ch]) for ch in changes]
    if len(changes) > 1:
        groups.append(("all pairs", list(changes)))
    rows = []
    for model, chs in groups:
        for infl in influences:
            mask = main & (m.conditions["influence"] == infl).to_numpy()
            for dname, dims in (("A", [0]), ("B", [1]), ("both", [0, 1])):

                def take(x: np.ndarray, sel: np.ndarray = mask, dd: list[int] = dims) -> np.ndarray:
                    return x[..., sel, :][..., dd].reshape(*x.shape[:-2], -1)

                s_off = np.concatenate([take(c.s_off) for c in chs])
                s_on = np.concatenate([take(c.s_on) for c in chs])
                r_off = np.concatenate([take(c.reps_off) for c in chs], axis=-1)
                r_on = np.concatenate([take(c.reps_on) for c in chs], axis=-1)
                signed = _nanmean(r_on - r_off)
                a_off, a_on = _nanmean(np.abs(r_off)), _nanmean(np.abs(r_on))
                with np.errstate(invalid="ignore", divide="ignore"):
                    pct_reps = 100 * (a_on / a_off - 1)
                    pct = 100 * (float(_nanmean(np.abs(s_on))) / float(_nanmean(np.abs(s_off))) - 1)
                lo, hi = percentile_ci(signed, alpha)
                alo, ahi = percentile_ci(a_on - a_off, alpha)
                plo, phi = percentile_ci(pct_reps, alpha)
                rows.append(
                    {
                        "benchmark": m.benchmark,
                        "model": model,
                        "influence": infl,
                        "direction": dname,
                        "conditions": int(mask.sum()) * len(chs),
                        "s_off": float(_nanmean(s_off)),
                        "s_on": float(_nanmean(s_on)),
                        "change": float(_nanmean(s_on - s_off)),
                        "change_lo": float(lo),
                        "change_hi": float(hi),
                        "abs_s_off": float(_nanmean(np.abs(s_off))),
                        "abs_s_on": float(_nanmean(np.abs(s_on))),
                        "abs_change": float(_nanmean(np.abs(s_on)) - _nanmean(np.abs(s_off))),
                        "abs_change_lo": float(alo),
                        "abs_change_hi": float(ahi),
                        "pct_change": pct,
                        "pct_change_lo": float(plo),
                        "pct_change_hi": float(phi),
                        "verdict": _verdict(float(alo), float(ahi)),
                    }
                )
    return pd.DataFrame(rows)


# ============================================================================ the whole comparison
@dataclass(frozen=True)
class InfluenceComparison:
    """Everything the cross-run influence report shows."""

    matched: tuple[Matched, ...]
    conditions: pd.DataFrame
    tables: Mapping[str, pd.DataFrame]
    change_conditions: pd.DataFrame
    change: pd.DataFrame
    asym_data: pd.DataFrame
    fits: tuple[AsymFit, ...]
    imported: tuple[str, ...] = ()
    """Names of the imported runs (condition-level data: no item matching, no item bootstrap)."""
    asym_model: str = "crossed"
    """The headline random-effect structure of the |Asym| fits."""
    source: str | None = None
    """The source every run was read from (``readout``, ``samples``); None: each run's own."""

    def csv_tables(self) -> dict[str, pd.DataFrame]:
        """The comparison's tables by CSV name."""
        return {
            "conditions": self.conditions,
            **self.tables,
            "reasoning_change": self.change,
            "reasoning_change_conditions": self.change_conditions,
            "asym_regression": pd.DataFrame([f.row() for f in self.fits]),
            "asym_regression_data": self.asym_data,
            "dropped_conditions": _concat([m.dropped_conditions for m in self.matched]),
        }

    @property
    def dropped_items(self) -> pd.DataFrame:
        """The items each matched benchmark left out, and why."""
        return _concat([m.dropped_items for m in self.matched])


def _concat(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The frames one after the other; an empty frame for none (a panel of imported runs only has no matching)."""
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _split_imported(panel: Panel) -> tuple[Panel | None, list[PanelRun]]:
    """(the panel of native runs, or None; the imported runs), in panel order."""
    imported = [r for r in panel.runs if r.experiment == IMPORTED]
    native = tuple(r for r in panel.runs if r.experiment != IMPORTED)
    return (Panel(native) if native else None), imported


def both_sources(panel: Panel) -> bool:
    """Whether every run of ``panel`` holds readouts and samples (an imported run holds counts only)."""
    from probe.views import SOURCES

    return all(r.experiment != IMPORTED and r.run().sources == SOURCES for r in panel.runs)


def compare_sources(
    panel: Panel, *, n_boot: int = N_BOOT, seed: int = SEED, asym_model: str = "crossed"
) -> list[InfluenceComparison]:
    """The comparison from each source (readout, samples) when every run has both (:func:`both_sources`); else
    the one comparison of each run's own source, as :func:`compare_frames` gives it."""
    from probe.views import SOURCES

    if not both_sources(panel):
        return [compare_frames(panel, n_boot=n_boot, seed=seed, asym_model=asym_model)]
    return [compare_frames(panel, n_boot=n_boot, seed=seed, asym_model=asym_model, source=s) for s in SOURCES]


def compare_frames(
    panel: Panel,
    *,
    n_boot: int = N_BOOT,
    seed: int = SEED,
    asym_model: str = "crossed",
    source: str | None = None,
) -> InfluenceComparison:
    """The whole comparison of an influence panel, as frames (no files).

    ``source``: read every run from that source (``readout`` or ``samples``; each run must hold it); None: each
    run from its own (:meth:`probe.runs.Run.choice_probs`).

    Imported runs (``probe import``) bring their condition tables as they are:
    they have no items, so they are not matched on items and take no part in
    the reasoning on/off comparison (a paired bootstrap over items); they
    enter the cross-run FDR, the per-model tables and the |Asym| fits.
    ``asym_model`` orders the fits (that structure first, the headline).
    """
    from analysis.influence import audit as inf
    from analysis.influence import paper000_tables
    from analysis.influence.imported import imported_conditions

    if asym_model not in STRUCTURES:
        raise PanelError(f"--asym-model must be one of {', '.join(STRUCTURES)}, got {asym_model!r}")
    native, imported = _split_imported(panel)
    if source is not None and imported:
        raise PanelError(
            f"imported runs {[r.name for r in imported]} hold counts only; compare them by their own source"
        )
    matched = match_panel(native, source) if native is not None else []
    tables_in = [condition_tables(m, n_boot=n_boot, seed=seed) for m in matched]
    tables_in += [imported_conditions(r.run(), label=r.name) for r in imported]
    cond = inf.combine_runs(tables_in)
    tables = dict(inf.panel_tables(cond))
    main = cond[cond["variant"] == "cue"]
    tables["by_run"] = inf.summary_by(main, ["benchmark", "run", "model", "think"])
    cells = {r.name: (r.model, r.reasoning, run_cells(r, source)[0]) for r in (native.runs if native else ())}
    tables.update(paper000_tables.compare_tables(cond, cells))
    by_cond, by_infl = [], []
    for m in matched:
        names = {r.name for r in m.runs}
        pairs = [(a, b) for a, b in panel.reasoning_pairs() if a.name in names and b.name in names]
        changes = [pair_change(m, a, b, n_boot=n_boot, seed=seed) for a, b in pairs]
        if changes:
            by_cond.append(change_by_condition(m, changes))
            by_infl.append(change_by_influence(m, changes))
    order = (asym_model, *(s for s in STRUCTURES if s != asym_model))
    return InfluenceComparison(
        matched=tuple(matched),
        conditions=cond,
        tables=tables,
        change_conditions=pd.concat(by_cond, ignore_index=True) if by_cond else pd.DataFrame(),
        change=pd.concat(by_infl, ignore_index=True) if by_infl else pd.DataFrame(),
        asym_data=asym_frame(cond),
        fits=tuple(asym_fits(cond, order)),
        imported=tuple(r.name for r in imported),
        asym_model=asym_model,
        source=source,
    )
