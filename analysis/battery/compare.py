"""The panel comparison of the crossed-frame battery (paper 003) and the plain yes/no battery: the contexts.

``probe compare`` matches the runs of a panel (``docs/panels.md``) on the
items they all hold and recomputes every per-run quantity on those shared
items (so G, the decomposition and (s, m) describe the same item set in every
column). This module composes that computation into a frozen :class:`Context`
(:func:`panel_context`, :func:`yesno_context`): the per-run table of stance,
incoherence, G and the decomposition (:func:`models_table`), the planted r^2
of sim runs (:func:`planted_r2`), the layer profiles (:func:`layer_profiles`)
and the panel-level parts that read the context (:func:`compute_deliberation`,
:func:`compute_anchors`). The estimators live beside it, as pure functions on
frames: one run loaded and recomputed on the shared items
(:mod:`analysis.battery.compare_runs`), the agreement of the item ordering
(:mod:`analysis.battery.compare_agreement`), the paired deliberation
differences (:mod:`analysis.battery.compare_deliberation`), the human anchors
(:mod:`analysis.battery.compare_humans`) and the logit-vs-sampled matching
(:mod:`analysis.battery.compare_logit`). :mod:`analysis.battery.compare_report`
only formats the context (Markdown, CSV, figures); its module docstring lists
the sections.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from analysis.battery.compare_agreement import (
    ThetaAgreement,
    ZAgreement,
    compute_z_agreement,
    g_of,
    theta_agreement,
    theta_table,
)
from analysis.battery.compare_deliberation import Deliberation, deliberation_table
from analysis.battery.compare_humans import (
    HumanAnchors,
    framing_shift,
    human_sampling_se,
    humans_agreement,
    humans_per_item,
    load_humans,
)
from analysis.battery.compare_logit import LogitSampled, compute_logit_sampled
from analysis.battery.compare_runs import RunData, YesNoCells, compute_run, load_run, yesno_cells
from analysis.battery.fit import N_BOOT, SEED
from analysis.common.bootstrap import finite_ci, resample_index
from analysis.common.results import Part, attempt
from probe.errors import NotComputed
from probe.panel import Panel, shared_items

N_OUTLIERS = 5


@dataclass(frozen=True)
class Context:
    """What the comparison's sections read, all computed before them (:func:`panel_context`, :func:`yesno_context`):
    the panel, its runs (with what :func:`~analysis.battery.compare_runs.compute_run` computed), the shared items and the dropped ones, the humans,
    and every part of the comparison. The sections only format it."""

    panel: Panel
    runs: dict[str, RunData]
    shared: list[str]
    dropped: pd.DataFrame
    n_boot: int = N_BOOT
    seed: int = SEED
    humans: pd.DataFrame | None = None
    agreement: Part[ThetaAgreement] = field(default_factory=Part)
    """Theta agreement of a battery panel (:func:`~analysis.battery.compare_agreement.theta_agreement`; absent in a yes/no panel)."""
    yesno: Part[YesNoCells] = field(default_factory=Part)
    """The cells and decomposition of a yes/no panel (:func:`~analysis.battery.compare_runs.yesno_cells`; absent in a battery panel)."""
    models: pd.DataFrame | None = None
    """The battery panel's per-run table (:func:`models_table`)."""
    human_values: pd.DataFrame | None = None
    """Item x measure: every human item's values on the stance axis (:func:`~analysis.battery.compare_humans.humans_per_item`); None without humans."""
    deliberation: Part[Deliberation] = field(default_factory=Part)
    """Reasoning off - on per paired model of a battery panel (:func:`compute_deliberation`)."""
    anchors: Part[HumanAnchors] = field(default_factory=Part)
    """The runs against the human anchors of a battery panel (:func:`compute_anchors`)."""
    logit_sampled: Part[LogitSampled] = field(default_factory=Part)
    """Readout runs against their sampled-only twins (:func:`~analysis.battery.compare_logit.compute_logit_sampled`)."""
    planted: pd.DataFrame | None = None
    """r^2 of the planted thetas of the sim runs (:func:`planted_r2`)."""
    z_agreement: Part[ZAgreement] = field(default_factory=Part)
    """The agreement of the story stance z of a yes/no panel (:func:`~analysis.battery.compare_agreement.compute_z_agreement`)."""
    layers: Mapping[str, Any] = field(default_factory=dict)
    """Run -> its layer profile on the shared items (:func:`layer_profiles`); only the runs made with
    ``--layers``, empty when none was."""

    def theta_table(self) -> pd.DataFrame:
        return theta_table(self.runs, self.shared)

    @property
    def consensus(self) -> pd.Series | None:
        """The consensus theta per item, when the agreement was computed."""
        return None if self.agreement.value is None else self.agreement.value.consensus["consensus"]


def models_table(c: Context) -> pd.DataFrame:
    """Per run on the shared items: stance, incoherence, G (with a bootstrap CI over items), decomposition, logic_AB.

    One row per run (index ``run``): model, reasoning, source; from the graded
    instrument n_items, mean_theta, sd_theta, mean_sigma_repro, the pooled
    incoherence (:func:`analysis.battery.stance.pooled_incoherence`: sigma_repro,
    sigma_dir, sigma_scale, sigma_repeat, sigma_tot) and G with G_lo, G_hi
    (``c.n_boot`` resamples, seed ``c.seed``); z, order, lexical, apparent:
    the yes/no decomposition, mean over items; logic_AB: the logical pull
    with the A/B labels.
    """
    from analysis.battery import stance

    rows = {}
    for name, d in c.runs.items():
        row: dict[str, Any] = {
            "model": d.run.model,
            "reasoning": "on" if d.run.reasoning else "off",
            "source": d.source,
        }
        if d.inc is not None:
            inc = d.inc.dropna(subset=["theta", "sigma_repro"])
            th, sg = inc["theta"].to_numpy(float), inc["sigma_repro"].to_numpy(float)
            row.update(n_items=len(inc), mean_theta=float(th.mean()), sd_theta=float(th.std(ddof=1)))
            row["mean_sigma_repro"] = float(sg.mean())
            with contextlib.suppress(NotComputed):
                pooled = stance.pooled_incoherence(d.inc)
                row |= pooled.pick("sigma_repro", "sigma_dir", "sigma_scale", "sigma_repeat", "sigma_tot")
            if len(inc) >= 2:
                idx = resample_index(len(inc), c.n_boot, c.seed)
                row["G"] = float(g_of(th, sg))
                row["G_lo"], row["G_hi"] = finite_ci(g_of(th[idx], sg[idx]))
        if d.dec is not None:
            for k in ("z", "order", "lexical", "apparent"):
                row[f"{k}"] = float(d.dec[k].mean())
        if d.logic is not None and "A/B" in d.logic.index:
            row["logic_AB"] = float(d.logic["A/B"])
        rows[name] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "run"
    return table


def planted_r2(c: Context) -> pd.DataFrame | None:
    """r^2 between the planted thetas of the sim runs on the consensus items; None without two sim runs or a consensus."""
    from engines.sim import SimParams

    sims = {n: d for n, d in c.runs.items() if d.opened.manifest.engine.kind == "sim"}
    if len(sims) < 2 or c.consensus is None:
        return None
    items = list(c.consensus.index)
    planted = pd.DataFrame(
        {n: [SimParams(**d.opened.manifest.engine.params).item_theta(str(i)) for i in items] for n, d in sims.items()},
        index=items,
    )
    r2 = planted.corr() ** 2
    r2.index.name = "run"
    return r2


def compute_deliberation(c: Context) -> Part[Deliberation]:
    """:func:`~analysis.battery.compare_deliberation.deliberation_table` of each reasoning pair of the panel (:meth:`probe.panel.Panel.reasoning_pairs`)."""
    pairs = c.panel.reasoning_pairs()
    if not pairs:
        return Part(
            absent="No model has both a reasoning-off and a reasoning-on run in this panel (give `model:` and "
            "`reasoning:` in a panel file to pair runs)."
        )
    tables, skipped = [], []
    for off, on in pairs:
        try:
            t = deliberation_table(c.runs[off.name], c.runs[on.name], n_boot=c.n_boot, seed=c.seed)
        except NotComputed as e:
            skipped.append((off, on, str(e)))
            continue
        tables.append(t.assign(model=off.model, off_run=off.name, on_run=on.name))
    table = None
    if tables:
        table = pd.concat(tables, ignore_index=True)
        cols = ["model", "off_run", "on_run", "quantity", "channel", "off", "on", "off_minus_on", "lo", "hi"]
        cols.append("excludes_0")
        table = table[[*cols, "n_items", "n_boot_ok"]]
    return Part(Deliberation(table, tuple(skipped)))


def compute_anchors(c: Context) -> Part[HumanAnchors]:
    """The human table of the panel on the shared dilemmas, against every run; absent without one."""
    if c.panel.humans is None:
        return Part(absent="No human table in this panel (`--humans CSV` or `humans:` in the panel file).")
    assert c.humans is not None
    h = c.humans[c.humans["item_id"].isin(c.shared)]
    if h.empty:
        return Part(absent="None of the human items is among the shared dilemmas; check the item ids.")
    per_item = humans_per_item(h)
    table, by_item = humans_agreement(c.runs, per_item, n_boot=c.n_boot, seed=c.seed)
    left_out = sorted(set(c.humans["item_id"]) - set(c.shared))
    shift = framing_shift(h, n_boot=c.n_boot, seed=c.seed) if set(h["frame"]) - {""} else None
    return Part(HumanAnchors(h, per_item, table, by_item, human_sampling_se(h), left_out, shift))


# ------------------------------------------------------------------ contexts
def panel_context(panel: Panel, *, n_boot: int, seed: int) -> Context:
    """The runs of a battery panel, loaded, matched on their shared dilemmas and computed there (:func:`~analysis.battery.compare_runs.compute_run`),
    with every part of the comparison.

    With a human table in the panel, its values are read (:func:`~analysis.battery.compare_humans.load_humans`) and its items outside the
    shared dilemmas added to the dropped table (run ``humans``).
    """
    runs = {r.name: load_run(r) for r in panel.runs}
    shared, dropped = shared_items(panel, {n: d.items for n, d in runs.items()})
    if not shared:
        raise ValueError(f"the runs share no dilemma; item counts: { {n: len(d.items) for n, d in runs.items()} }")
    runs = {name: compute_run(d, shared, n_boot=n_boot, seed=seed) for name, d in runs.items()}
    humans = None
    if panel.humans is not None:
        humans = load_humans(panel.humans)
        extra = sorted(set(humans["item_id"]) - set(shared))
        if extra:
            more = pd.DataFrame(
                {"run": "humans", "item_id": extra, "reason": "human item not in every run (or unknown id)"}
            )
            dropped = pd.concat([dropped, more], ignore_index=True)
    agreement: Part[ThetaAgreement]
    try:
        agreement = Part(theta_agreement(panel, runs, theta_table(runs, shared).dropna(), humans))
    except NotComputed as e:  # the agreement part says why
        agreement = Part(error=e)
    c = Context(panel, runs, shared, dropped, n_boot, seed, humans, agreement)
    return replace(
        c,
        models=models_table(c),
        human_values=humans_per_item(humans) if humans is not None and len(humans) else None,
        deliberation=attempt(compute_deliberation, c),
        anchors=attempt(compute_anchors, c),
        logit_sampled=attempt(compute_logit_sampled, list(runs.values())),
        planted=planted_r2(c),
        layers=layer_profiles(runs, shared, n_boot=n_boot, seed=seed),
    )


def layer_profiles(runs: Mapping[str, RunData], shared: Sequence[str], *, n_boot: int, seed: int) -> dict[str, Any]:
    """Each readout run's layer profile (:func:`analysis.battery.layers.layer_profile`) on the shared items, for
    the runs made with ``--layers``; a run whose profile cannot be computed is left out."""
    from analysis.battery.frames import counterbalanced_pairs
    from analysis.battery.layers import layer_profile

    out = {}
    for name, d in runs.items():
        layers = d.opened.load("readout_layers") if d.source == "readout" else pd.DataFrame()
        if layers.empty:
            continue
        per = d.per_trial[d.per_trial["item_id"].isin(shared)]
        pairs = counterbalanced_pairs(d.opened.manifest) if "instrument" in per else set()
        with contextlib.suppress(NotComputed):
            out[name] = layer_profile(d.options, per, layers, d.source, pairs, n_boot=n_boot, seed=seed)
    return out


def yesno_context(panel: Panel, *, n_boot: int, seed: int) -> Context:
    """The runs of a yes/no panel, loaded, matched on their shared dilemmas, with their cells and decomposition there,
    the agreement of z and the readout runs against their sampled twins.

    Each run's ``dec`` is its decomposition on the shared dilemmas; when the cells cannot be computed for every run,
    no run has one and the cells part says why.
    """
    runs = {r.name: load_run(r) for r in panel.runs}
    shared, dropped = shared_items(panel, {n: d.items for n, d in runs.items()})
    if not shared:
        raise ValueError("the runs share no dilemma")
    cells: Part[YesNoCells]
    try:
        cells = Part(yesno_cells(runs, shared))
    except NotComputed as e:  # the cells part says why
        cells = Part(error=e)
    else:
        decomposition = ["z", "lexical", "order", "apparent"]
        long = cells.get().long
        runs = {n: replace(d, dec=long[long["run"] == n].set_index("item_id")[decomposition]) for n, d in runs.items()}
    return Context(
        panel,
        runs,
        shared,
        dropped,
        n_boot=n_boot,
        seed=seed,
        yesno=cells,
        logit_sampled=attempt(compute_logit_sampled, list(runs.values())),
        z_agreement=attempt(compute_z_agreement, runs),
        layers=layer_profiles(runs, shared, n_boot=n_boot, seed=seed),
    )
