"""Read a run directory into tidy data frames (one place, used by every analysis)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from probe import views
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
    return views.trial_meta(_trials(store))


def option_meaning(store: RunStore | Sequence[Trial]) -> pd.DataFrame:
    """One row per (trial, option): the printed position and what the option means."""
    return views.option_meaning(_trials(store))


def readouts(store: RunStore) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(long options table joined with meanings, per-trial table joined with factors)."""
    return views.readout_frames(store.load("readout_options"), store.load("readout_trials"), store.trials(), store.root)


def sample_counts(store: RunStore) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Sampled behaviour as (long options table of frequencies, per-trial status counts)."""
    s = store.load("samples")
    if s.empty:
        raise StoreError(f"{store.root} has no samples; run with --samples N")
    return views.count_samples(s, store.trials())


count_samples = views.count_samples


def choice_probs(store: RunStore) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """The option probabilities an analysis should use, and where they came from."""
    opts = store.load("readout_options")
    per = store.load("readout_trials") if not opts.empty else opts
    samples = store.load("samples") if opts.empty else opts.iloc[0:0]
    return views.choice_probs(opts, per, samples, store.trials(), store.root)
