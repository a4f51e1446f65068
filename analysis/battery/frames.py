"""What every part of the battery report reads: the run's frames (:class:`Frames`, :func:`load_frames`), and
what the battery's corpus says about them (the order of its forms, :func:`corpus_form_order`; its
counterbalanced label pairs, :func:`counterbalanced_pairs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from probe.record import Manifest
from probe.runs import Run


@dataclass(frozen=True)
class Frames:
    """What every part of the report reads: the run's frames."""

    options: pd.DataFrame
    per_trial: pd.DataFrame
    source: str
    manifest: Manifest
    judgments: pd.DataFrame
    samples: pd.DataFrame
    readout_options: pd.DataFrame
    meta: pd.DataFrame
    """One row per trial of the run (all instruments), with its factors."""
    trial_list: list[Any]
    layers: pd.DataFrame = field(default_factory=pd.DataFrame)
    """The run's ``readout_layers`` table (``--layers``); empty without."""

    def instrument(self, name: str) -> pd.DataFrame:
        if "instrument" not in self.per_trial:
            return self.per_trial.iloc[0:0]
        return self.per_trial[self.per_trial["instrument"] == name]


def load_frames(run: Run) -> Frames:
    opts, per_trial, source = run.choice_probs()
    return Frames(
        options=opts,
        per_trial=per_trial,
        source=source,
        manifest=run.manifest,
        judgments=run.load("judgments"),
        samples=run.load("samples"),
        readout_options=run.load("readout_options"),
        meta=run.trial_meta(),
        trial_list=run.trial_list,
        layers=run.load("readout_layers"),
    )


def corpus_form_order(corpus: str | None, forms: set[str]) -> list[str]:
    """The run's verb-flip forms in corpus order (the order of ``binary.forms`` in the corpus file).

    The form-parity split of Fig. 3 takes even / odd forms in this order,
    whatever order ``--forms`` named them in and under every preset (issue
    27: ``--preset full`` used to sort them alphabetically). Forms the corpus
    does not list (an edited corpus) follow, sorted.
    """
    from experiments.battery import load_corpus

    listed = [str(x) for x in load_corpus(corpus)["binary"]["forms"] if x in forms]
    return listed + sorted(forms - set(listed))


def counterbalanced_pairs(manifest: Manifest) -> set[str]:
    """The label pairs whose mapping the battery's corpus counterbalances (their label projection is identified)."""
    from experiments.battery import BatterySpec, load_corpus

    labels = load_corpus(manifest.spec_as(BatterySpec).corpus)["binary"]["labels"]
    return {k for k, v in labels.items() if v.get("counterbalance")}
