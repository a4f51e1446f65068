"""Read a run directory into tidy data frames (one place, used by every analysis)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from probe.errors import StoreError
from probe.shards import find_shards
from probe.store import RunStore
from probe.types import Trial


def _trials(source: RunStore | Sequence[Trial]) -> Sequence[Trial]:
    return source.trials() if isinstance(source, RunStore) else source


def open_run(run: str | Path | RunStore) -> RunStore:
    if isinstance(run, RunStore):
        return run
    store = RunStore(Path(run))
    if not (store.root / "manifest.json").exists() and find_shards(store.root):
        raise StoreError(f"{store.root} holds shards but no merged run; run `probe merge {store.root}` first")
    store.manifest()
    return store


def trial_meta(store: RunStore | Sequence[Trial]) -> pd.DataFrame:
    """One row per trial: ids, item, replicate and one column per factor."""
    rows = []
    for t in _trials(store):
        rows.append({"trial_id": t.trial_id, "item_id": t.item_id, "replicate": t.replicate, **dict(t.factors)})
    return pd.DataFrame(rows)


def option_meaning(store: RunStore | Sequence[Trial]) -> pd.DataFrame:
    """One row per (trial, option): the printed position and what the option means."""
    rows = []
    for t in _trials(store):
        for i, (o, m) in enumerate(zip(t.options, t.meaning, strict=True)):
            rows.append({"trial_id": t.trial_id, "option": o, "position": i, "meaning": m})
    return pd.DataFrame(rows)


def readouts(store: RunStore) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(long options table joined with meanings, per-trial table joined with factors)."""
    opts = store.load("readout_options")
    per_trial = store.load("readout_trials")
    if opts.empty:
        raise StoreError(f"{store.root} has no readouts; run `probe run` first (or let it finish)")
    opts = opts.merge(option_meaning(store), on=["trial_id", "option"], how="left", validate="one_to_one")
    per_trial = per_trial.merge(trial_meta(store), on="trial_id", how="left", validate="one_to_one")
    return opts, per_trial


def sample_counts(store: RunStore) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Sampled behaviour as (long options table of frequencies, per-trial status counts).

    ``prob`` is the option's share among the *parsed* samples of the trial;
    refusals and invalid answers are counted per trial, never dropped silently.
    """
    s = store.load("samples")
    if s.empty:
        raise StoreError(f"{store.root} has no samples; run with --samples N")
    return count_samples(s, store.trials())


def count_samples(s: pd.DataFrame, trials: Sequence[Trial]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`sample_counts` on an already loaded samples table and the run's trials."""
    sampled = set(s["trial_id"])
    trials = [t for t in trials if t.trial_id in sampled]
    meaning = option_meaning(trials)
    status = s.groupby(["trial_id", "status"]).size().unstack(fill_value=0)
    for col in ("ok", "refusal", "invalid", "error"):
        if col not in status.columns:
            status[col] = 0
    status = status[["ok", "refusal", "invalid", "error"]].rename(columns=lambda c: f"n_{c}").reset_index()
    ok = s[s["status"] == "ok"].groupby(["trial_id", "option"]).size().rename("count").reset_index()
    opts = meaning.merge(ok, on=["trial_id", "option"], how="left").fillna({"count": 0})
    opts = opts.merge(status[["trial_id", "n_ok"]], on="trial_id", how="left")
    opts["prob"] = opts["count"] / opts["n_ok"].where(opts["n_ok"] > 0)
    per_trial = status.merge(trial_meta(trials), on="trial_id", how="left", validate="one_to_one")
    per_trial["coverage"] = per_trial["n_ok"] / per_trial[["n_ok", "n_refusal", "n_invalid", "n_error"]].sum(axis=1)
    return opts, per_trial


def choice_probs(store: RunStore) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """The option probabilities an analysis should use, and where they came from.

    A run with readouts uses them (the exact distribution); a sampled-only run
    uses the sampled frequencies among parsed answers, so every analysis works
    the same on logit and sampled runs. Returns (options, per_trial, source).
    """
    if not store.load("readout_options").empty:
        return (*readouts(store), "readout")
    return (*sample_counts(store), "samples")
