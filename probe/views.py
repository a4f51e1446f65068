"""The analysis views of a run: the option probabilities every analysis works on, from readouts or from samples.

:class:`probe.runs.Run` is what every analysis receives; these are the pure
functions behind its analysis methods (:meth:`~probe.runs.Run.choice_probs`,
:meth:`~probe.runs.Run.readout_frames`, :meth:`~probe.runs.Run.sample_counts`,
:meth:`~probe.runs.Run.trial_meta`), written on the stored tables
(:mod:`probe.tables`) and the run's trials, so that a test or a comparison can
call them on tables it already holds.

Their frames are long and narrow, made for ``groupby`` and ``merge``: the
option table has the stored option columns plus ``meaning`` (``option_index``
is the print position, as in :attr:`probe.runs.Run.options`); the per-trial
table has the stored per-trial columns plus ``item_id``, ``replicate`` and one
column per factor under the factor's own name (the notebook frames spread
factors as ``factor_<name>`` where a name is taken; these narrow frames have no
such clash to avoid: a factor may be called ``position`` or ``status``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import pandas as pd

from probe.errors import StoreError
from probe.tables import SAMPLE_STATUSES
from probe.types import Trial

__all__ = ["SOURCES", "count_samples", "option_meaning", "readout_frames", "trial_meta"]

SOURCES: Final[tuple[str, ...]] = ("readout", "samples")
"""Where an analysis's option probabilities come from: the readouts (exact) or the sampled frequencies."""


def trial_meta(trials: Sequence[Trial]) -> pd.DataFrame:
    """One row per trial: ids, item, replicate and one column per factor."""
    return pd.DataFrame(
        [{"trial_id": t.trial_id, "item_id": t.item_id, "replicate": t.replicate, **dict(t.factors)} for t in trials]
    )


def option_meaning(trials: Sequence[Trial]) -> pd.DataFrame:
    """One row per (trial, option): its print position (``option_index``) and what the option means."""
    return pd.DataFrame(
        [
            {"trial_id": t.trial_id, "option": o, "option_index": i, "meaning": m}
            for t in trials
            for i, (o, m) in enumerate(zip(t.options, t.meaning, strict=True))
        ]
    )


def readout_frames(
    options: pd.DataFrame, per_trial: pd.DataFrame, trials: Sequence[Trial], where: object = "the run"
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The stored readout tables joined with the options' meanings and the trials' factors: (options, per trial)."""
    if options.empty:
        raise StoreError(f"{where} has no readouts; run `probe run` first (or let it finish)")
    stored = options.drop(columns=["option_index"], errors="ignore")  # the print position, taken from the trials
    opts = stored.merge(option_meaning(trials), on=["trial_id", "option"], how="left", validate="one_to_one")
    opts = opts[[*options.columns, *(["option_index"] if "option_index" not in options else []), "meaning"]]
    per = per_trial.merge(trial_meta(trials), on="trial_id", how="left", validate="one_to_one")
    return opts, per


def count_samples(samples: pd.DataFrame, trials: Sequence[Trial]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Sampled behaviour as (long options table of frequencies, per-trial status counts).

    ``prob`` is the option's share among the *parsed* samples of the trial;
    refusals and invalid answers are counted per trial, never dropped silently.
    """
    sampled = set(samples["trial_id"])
    trials = [t for t in trials if t.trial_id in sampled]
    status = samples.groupby(["trial_id", "status"]).size().unstack(fill_value=0)
    for col in SAMPLE_STATUSES:
        if col not in status.columns:
            status[col] = 0
    status = status[list(SAMPLE_STATUSES)].rename(columns=lambda c: f"n_{c}").reset_index()
    ok = samples[samples["status"] == "ok"].groupby(["trial_id", "option"]).size().rename("count").reset_index()
    opts = option_meaning(trials).merge(ok, on=["trial_id", "option"], how="left").fillna({"count": 0})
    opts = opts.merge(status[["trial_id", "n_ok"]], on="trial_id", how="left")
    opts["prob"] = opts["count"] / opts["n_ok"].where(opts["n_ok"] > 0)
    per_trial = status.merge(trial_meta(trials), on="trial_id", how="left", validate="one_to_one")
    per_trial["coverage"] = per_trial["n_ok"] / per_trial[[f"n_{s}" for s in SAMPLE_STATUSES]].sum(axis=1)
    return opts, per_trial
