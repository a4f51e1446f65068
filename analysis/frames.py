"""Read a run directory into tidy data frames (one place, used by every analysis)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from probe.store import RunStore, StoreError, find_shards


def open_run(run: str | Path) -> RunStore:
    store = RunStore(Path(run))
    if not (store.root / "manifest.json").exists() and find_shards(store.root):
        raise StoreError(f"{store.root} holds shards but no merged run; run `probe merge {store.root}` first")
    store.manifest()
    return store


def trial_meta(store: RunStore) -> pd.DataFrame:
    """One row per trial: ids, item, replicate and one column per factor."""
    rows = []
    for t in store.trials():
        rows.append({"trial_id": t.trial_id, "item_id": t.item_id, "replicate": t.replicate, **dict(t.factors)})
    return pd.DataFrame(rows)


def option_meaning(store: RunStore) -> pd.DataFrame:
    """One row per (trial, option): the printed position and what the option means."""
    rows = []
    for t in store.trials():
        for i, (o, m) in enumerate(zip(t.options, t.meaning, strict=True)):
            rows.append({"trial_id": t.trial_id, "option": o, "position": i, "meaning": m})
    return pd.DataFrame(rows)


def readouts(store: RunStore) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(long options table joined with meanings, per-trial table joined with factors)."""
    opts = store.load("readout_options")
    per_trial = store.load("readout_trials")
    if opts.empty:
        raise StoreError(f"{store.root} has no readouts yet; run `probe run` first (or let it finish)")
    opts = opts.merge(option_meaning(store), on=["trial_id", "option"], how="left", validate="one_to_one")
    per_trial = per_trial.merge(trial_meta(store), on="trial_id", how="left", validate="one_to_one")
    return opts, per_trial
