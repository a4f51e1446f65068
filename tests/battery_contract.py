"""Test helper: trials that follow the battery's trial contract, for synthetic items, and in-memory frames.

The real instrument lives in ``experiments/battery.py``; this helper builds
the same factors and meanings for any number of made-up items without a
dilemma file, so the parameter-recovery studies can use many items quickly.
``frames_*`` produce the tables :mod:`probe.views` would read back from a
run directory, without writing one.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product

import pandas as pd

from experiments.battery import binary_factors
from probe import views
from probe.tables import readout_tables
from probe.types import Message, Readout, Sample, Trial, make_trial_id

SCALES = {"0-10": (0, 10), "0-100": (0, 100), "bipolar-5": (-5, 5), "bipolar-50": (-50, 50)}
ANCHORS = ("ascending", "descending")
POLES = ("action", "complement")
PAIRS = {
    "Yes/No": ("yesno", False),
    "A/B": ("arbitrary", True),
    "1/2": ("arbitrary", True),
    "Ja/Nein": ("foreign", True),
}


def _trial(item: str, factors: dict[str, str], options: Sequence[str], meaning: Sequence[str], rep: int) -> Trial:
    salt = f"salt{rep:02d}" if rep else ""
    text = f"{salt}\n\nitem {item}: {factors}" if salt else f"item {item}: {factors}"
    return Trial(
        trial_id=make_trial_id("battery", item, factors, salt, rep),
        experiment="battery",
        item_id=item,
        factors=factors,
        messages=(Message("user", text),),
        options=tuple(options),
        meaning=tuple(meaning),
        salt=salt,
        replicate=rep,
    )


def stance(v: int, lo: int, hi: int, anchor: str, pole_is_cbr: bool) -> float:
    a = (v - lo) / (hi - lo)
    if anchor == "descending":
        a = 1.0 - a
    return 2 * a - 1 if pole_is_cbr else 1 - 2 * a


def graded(
    items: Sequence[str],
    scales: Sequence[str] = ("0-10", "0-100"),
    wordings: Sequence[str] = ("acceptable", "right", "should"),
    salts: int = 1,
) -> list[Trial]:
    out = []
    for item, scale, wording, anchor, pole in product(items, scales, wordings, ANCHORS, POLES):
        lo, hi = SCALES[scale]
        f = {"instrument": "graded", "scale": scale, "wording": wording, "anchor": anchor, "pole": pole}
        opts = [str(v) for v in range(lo, hi + 1)]
        # the CBR pole is the action for every synthetic item
        mean = [repr(round(stance(v, lo, hi, anchor, pole == "action"), 12) + 0.0) for v in range(lo, hi + 1)]
        out += [_trial(item, f, opts, mean, r) for r in range(salts)]
    return out


def binary(
    items: Sequence[str],
    forms: Sequence[str] = ("acceptable", "should", "right"),
    pairs: Sequence[str] = ("Yes/No",),
    salts: int = 1,
) -> list[Trial]:
    out = []
    for item, pair in product(items, pairs):
        family, counterbalance = PAIRS[pair]
        pos, neg = pair.split("/")
        mappings = ("canonical", "swapped") if counterbalance else ("canonical",)
        for form, verb, order, mapping in product(forms, ("approve", "oppose"), ("yes_first", "no_first"), mappings):
            yes, no = (pos, neg) if mapping == "canonical" else (neg, pos)
            printed = (yes, no) if order == "yes_first" else (no, yes)
            means = ["cbr" if (o == yes) == (verb == "approve") else "anti" for o in printed]
            f = binary_factors(form, verb, order, pair, family, mapping) | {"yes_label": yes}
            out += [_trial(item, f, printed, means, r) for r in range(salts)]
    return out


def choice(items: Sequence[str], framings: Sequence[str] = ("choose", "what_would")) -> list[Trial]:
    out = []
    for item in items:
        cbr, anti = f"take the cost-benefit course in {item}", f"keep to the rule in {item}"
        for framing in framings:
            for order in ("cbr_first", "anti_first"):
                printed, means = (
                    ((cbr, anti), ("cbr", "anti")) if order == "cbr_first" else ((anti, cbr), ("anti", "cbr"))
                )
                out.append(
                    _trial(item, {"instrument": "choice", "framing": framing, "order": order}, printed, means, 0)
                )
    return out


def frames_readout(trials: Sequence[Trial], readouts: Sequence[Readout]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What :meth:`probe.runs.Run.readout_frames` returns for a run of these trials."""
    tables = readout_tables(readouts)
    return views.readout_frames(tables["readout_options"], tables["readout_trials"], trials)


def frames_samples(trials: Sequence[Trial], samples: Sequence[Sample]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The parsed shares of :meth:`probe.runs.Run.sample_counts` for a sampled run of these trials (only the columns
    an analysis reads: ``count``, ``n_ok``, ``prob``)."""
    meta, meaning = views.trial_meta(trials), views.option_meaning(trials)
    s = pd.DataFrame([{"trial_id": x.trial_id, "option": x.option, "status": x.status} for x in samples])
    n_ok = s[s["status"] == "ok"].groupby("trial_id").size().rename("n_ok")
    ok = s[s["status"] == "ok"].groupby(["trial_id", "option"]).size().rename("count").reset_index()
    opts = meaning.merge(ok, on=["trial_id", "option"], how="left").fillna({"count": 0})
    opts = opts.join(n_ok, on="trial_id").fillna({"n_ok": 0})
    opts["prob"] = opts["count"] / opts["n_ok"].where(opts["n_ok"] > 0)
    per = meta.join(n_ok, on="trial_id").fillna({"n_ok": 0})
    return opts, per
