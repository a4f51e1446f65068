"""Where the readout forms: the battery's and the yes/no battery's quantities at every layer a run read
(``--layers``, the logit lens at the answer slot; docs/methods.md, "Layer-wise readouts").

Nothing here decomposes anything itself. At each layer the run's option probabilities are replaced by the layer's
(:func:`layer_options`), and the pure functions that compute the final-layer report compute the same quantities
from them (:func:`story_values`): the I-3 verb flip's story stance z, order and lexical projections
(:func:`analysis.battery.yesno.cell_table`, :func:`analysis.battery.yesno.decompose`), the label pairs' logic and
label projections (:func:`analysis.battery.binary.projections`) and the I-1 stance theta
(:func:`analysis.battery.stance.theta`). Each is averaged over stories with the percentile bootstrap interval
the final-layer figures carry (:func:`analysis.battery.yesno.story_mean_ci`), so the last layer's row is the
final report's figure. :func:`formed_from` gives the first layer from which a quantity stays within 10% of its
final value.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from probe.errors import NotComputed

QUANTITIES: Mapping[str, str] = {
    "z": "I-3 story stance z (Yes/No verb flip)",
    "order": "I-3 order projection (toward the first-printed option)",
    "lexical": "I-3 lexical projection (toward the word yes)",
    "logic": "I-3 logic projection (label pairs: toward the affirmative verdict)",
    "label": "I-3 label projection (counterbalanced label pairs)",
    "theta": "I-1 stance theta (graded)",
}
"""The quantities a profile can hold, in display order, and what each is."""
WITHIN = 0.10
"""A quantity has formed from the first layer after which it stays within this share of its final value."""
FLOOR = 0.02
"""A quantity whose final value is within this of 0 has nothing to form (its formation layer is not defined):
10% of a value near 0 is round-off, and the layer it picks would be noise."""


@dataclass(frozen=True)
class LayerProfile:
    """Each quantity at each layer read: ``table`` (layer, quantity, mean, lo, hi, n) and the layer from which
    each has formed (:func:`formed_from`; None where its final value is 0 or it never settles)."""

    table: pd.DataFrame
    formed: Mapping[str, int | None]
    n_blocks: int
    """The last layer read (the final readout's)."""


def layer_options(options: pd.DataFrame, layers: pd.DataFrame, layer: int) -> pd.DataFrame:
    """The analyses' options frame (``trial_id``, ``option``, ``meaning``, ``prob``, ...) with each option's
    ``prob`` (and ``logprob``) replaced by its value at ``layer`` from the run's ``readout_layers`` table."""
    at = layers[layers["layer"] == layer][["trial_id", "option", "prob", "logprob"]]
    if at.empty:
        raise NotComputed(f"layer {layer} is not in the run's readout_layers table")
    out = options.drop(columns=["prob", "logprob"], errors="ignore").merge(
        at, on=["trial_id", "option"], how="left", validate="one_to_one"
    )
    return out[[*options.columns, *(["logprob"] if "logprob" not in options else [])]]


def story_values(options: pd.DataFrame, per_trial: pd.DataFrame, source: str, label_pairs: set[str]) -> pd.DataFrame:
    """Per story: each quantity of :data:`QUANTITIES` the run's trials allow, from ``options``' probabilities.

    ``per_trial``: the trials with their factors (a yes/no run's, or the battery's ``instrument`` column with
    its binary and graded trials); ``label_pairs``: the counterbalanced label pairs (label identified).
    """
    from analysis.battery import binary, stance, yesno

    parts: list[pd.DataFrame | pd.Series] = []
    if "instrument" in per_trial:
        b = per_trial[per_trial["instrument"] == "binary"]
        yn = b[b["labels"] == "Yes/No"].assign(cbr_verb=lambda d: d["verb"]) if len(b) else b
        pairs = b[(b["labels"] != "Yes/No") & (b["replicate"] == 0)] if len(b) else b
        graded = per_trial[per_trial["instrument"] == "graded"]
    else:
        yn, pairs, graded = yesno.with_cbr_verb(per_trial, options), per_trial.iloc[0:0], per_trial.iloc[0:0]
    if len(yn):
        with contextlib.suppress(NotComputed):
            cells = yesno.cell_table(yn, yesno.p_cbr(options))
            parts.append(yesno.decompose(cells)[["z", "order", "lexical"]])
    if len(pairs):
        with contextlib.suppress(NotComputed):
            proj = binary.projections(binary.cell_events(pairs, options), label_pairs)
            if len(proj):
                parts.append(proj.groupby(level="item_id")[["logic", "label"]].mean())
    if len(graded):
        opts = options[options["trial_id"].isin(graded["trial_id"])]
        th = stance.theta(stance.per_form(stance.graded_trials(opts, graded, source)))  # type: ignore[arg-type]
        if len(th):
            parts.append(th.rename("theta"))
    if not parts:
        raise NotComputed("no quantity of the layer profile can be computed from this run's instruments")
    out = pd.concat(parts, axis=1)
    out.index = out.index.astype(str)
    return out[[q for q in QUANTITIES if q in out and out[q].notna().any()]]


def formed_from(values: pd.Series, within: float = WITHIN, floor: float = FLOOR) -> int | None:
    """The first layer (``values``: layer -> value, the last the final one) from which the quantity stays
    within ``within`` of its final value, |v - v_final| <= within |v_final|; None where the final value is NaN
    or within ``floor`` of 0 (there is nothing to form)."""
    v = values.sort_index()
    final = float(v.iloc[-1])
    if not math.isfinite(final) or abs(final) <= floor:
        return None
    ok = (v - final).abs() <= within * abs(final)
    formed = None
    for layer, good in zip(v.index[::-1], ok.to_numpy()[::-1], strict=True):
        if not good:
            break
        formed = int(layer)
    return formed


def layer_profile(
    options: pd.DataFrame,
    per_trial: pd.DataFrame,
    layers: pd.DataFrame,
    source: str,
    label_pairs: set[str],
    *,
    n_boot: int,
    seed: int,
) -> LayerProfile:
    """Every quantity at every layer of ``layers`` (the run's ``readout_layers`` table), averaged over stories
    with its bootstrap interval, and the layer from which each has formed."""
    from analysis.battery.yesno import story_mean_ci

    if layers.empty:
        raise NotComputed("the run has no layer-wise readouts (run it with --layers)")
    rows = []
    for layer in sorted(int(x) for x in layers["layer"].unique()):
        values = story_values(layer_options(options, layers, layer), per_trial, source, label_pairs)
        ci = story_mean_ci(values, n_boot=n_boot, seed=seed)
        for q, row in ci.iterrows():
            rows.append({"layer": layer, "quantity": q, **row.to_dict()})
    table = pd.DataFrame(rows)
    table["n"] = table["n"].astype(int)
    wide = table.pivot(index="layer", columns="quantity", values="mean")
    formed = {q: formed_from(wide[q]) for q in QUANTITIES if q in wide}
    return LayerProfile(table, formed, int(wide.index.max()))


def profile_lines(profile: LayerProfile) -> list[str]:
    """The section's Markdown: a table of each quantity per layer with its interval, then where each formed."""
    from analysis.common.tables import md_table

    t = profile.table
    cells = t.assign(
        cell=[f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" for m, lo, hi in zip(t["mean"], t["lo"], t["hi"], strict=True)]
    )
    wide = cells.pivot(index="layer", columns="quantity", values="cell")
    wide = wide[[q for q in QUANTITIES if q in wide]]
    lines = [
        "The answer-slot readout at each layer read (`--layers`): the model's final norm and head applied to the "
        "residual stream after each block (the logit lens; layer 0 is the embeddings, the last layer the final "
        "readout). Each quantity is computed from the layer's option probabilities by the same functions as at "
        "the final layer, averaged over stories with its 95% bootstrap interval. Early layers are read in the "
        "final layer's vocabulary basis: a lower bound on what is decodable there, not the model's belief "
        "(docs/methods.md).",
        "",
        md_table(wide, "{}", index=True, iterrows=True),
        "",
        f"Formed by (the first layer from which it stays within {WITHIN:.0%} of its final value):",
        "",
    ]
    for q, layer in profile.formed.items():
        where = (
            f"layer {layer} of {profile.n_blocks}"
            if layer is not None
            else f"not defined (final value within {FLOOR} of 0)"
        )
        lines.append(f"- {QUANTITIES[q]}: {where}")
    return [*lines, ""]


def profile_figure(profile: LayerProfile) -> object:
    """Layer on x, one line per quantity with its interval as a band."""
    from analysis.common.figures import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for q in QUANTITIES:
        d = profile.table[profile.table["quantity"] == q].sort_values("layer")
        if d.empty:
            continue
        (line,) = ax.plot(d["layer"], d["mean"], marker="o", ms=3, label=q)
        ax.fill_between(d["layer"], d["lo"], d["hi"], color=line.get_color(), alpha=0.15, lw=0)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("layer (0: embeddings; last: the final readout)")
    ax.set_ylabel("story-averaged value")
    ax.set_title("Where the readout forms (logit lens at the answer slot)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def profiles_side_by_side(
    profiles: Mapping[str, LayerProfile], quantities: Sequence[str] = tuple(QUANTITIES)
) -> pd.DataFrame:
    """Runs' profiles side by side (``probe compare``): one row per layer, one column per (run, quantity)."""
    cols = {}
    for name, p in profiles.items():
        wide = p.table.pivot(index="layer", columns="quantity", values="mean")
        for q in quantities:
            if q in wide:
                cols[(name, q)] = wide[q]
    out = pd.DataFrame(cols)
    out.columns = pd.MultiIndex.from_tuples(out.columns, names=["run", "quantity"])
    return out.sort_index()
