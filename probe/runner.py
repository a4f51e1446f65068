"""Experiment -> trials -> engine -> run store, resumably."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from engines.hf import HFEngine, HFSettings
from experiments import get_experiment
from probe.store import RunStore, Shard, chunk_bounds, run_key
from probe.types import Readout

# Settings that change values (the rest, like batch size and device, only change speed).
_IDENTITY_SETTINGS = ("model", "think", "think_budget", "system_prompt", "revision", "trust_remote_code", "seed")
_PACKAGES = ("probe", "torch", "transformers", "tokenizers", "accelerate", "numpy", "pandas", "pyarrow")


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def project_commit() -> str | None:
    """The git commit of the project checkout (with ``-dirty`` if modified), if there is one."""
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def readout_tables(readouts: Sequence[Readout]) -> dict[str, pd.DataFrame]:
    """The long per-option table and the per-trial table of a list of readouts."""
    opts = [
        {
            "trial_id": r.trial_id,
            "option": s.option,
            "option_index": i,
            "n_tokens": len(s.token_ids),
            "logprob": s.logprob,
            "prob": s.prob,
        }
        for r in readouts
        for i, s in enumerate(r.scores)
    ]
    trials = [
        {
            "trial_id": r.trial_id,
            "coverage": r.coverage,
            "greedy_option": r.greedy_option,
            "prompt_tokens": r.prompt_tokens,
            "computed_tokens": r.computed_tokens,
            "reasoning_tokens": r.reasoning_tokens,
            "hit_budget": r.hit_budget,
            "reasoning": r.reasoning,
            "top_other": json.dumps(r.top_other, ensure_ascii=False),
        }
        for r in readouts
    ]
    return {"readout_options": pd.DataFrame(opts), "readout_trials": pd.DataFrame(trials)}


def run(
    experiment: str,
    spec: Any,
    settings: HFSettings,
    out: Path,
    *,
    shard: Shard | None = None,
    chunk_size: int = 256,
    engine: HFEngine | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> RunStore:
    """Run (or resume) ``experiment`` on the Transformers engine into ``out``."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    exp = get_experiment(experiment)
    engine = engine or HFEngine(settings)
    engine.load()
    trials = exp.expand(spec, count_tokens=engine.count_tokens)
    if shard is not None:
        trials = shard.select(trials)
        out = Path(out) / shard.folder
    desc = engine.describe()
    identity = {
        "experiment": experiment,
        "spec": spec.to_dict(),
        "engine": "hf",
        "dtype": desc["dtype"],
        "model_fingerprint": desc.get("fingerprint") or desc.get("commit_hash"),
        **{k: getattr(settings, k) for k in _IDENTITY_SETTINGS},
    }  # the shard is not part of the identity: all shards of one run share its key
    manifest = {
        "run_key": run_key(identity),
        "identity": identity,
        "experiment": experiment,
        "spec": spec.to_dict(),
        "engine": desc,
        "packages": package_versions(),
        "project_commit": project_commit(),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "shard": asdict(shard) if shard else None,
        "n_trials": len(trials),
        "chunk_size": chunk_size,
    }
    store = RunStore.open(Path(out), manifest, trials)
    bounds = chunk_bounds(len(trials), chunk_size)
    done = store.done_chunks()
    todo = [k for k in range(len(bounds)) if k not in done]
    n_done = sum(hi - lo for k, (lo, hi) in enumerate(bounds) if k in done)
    if not todo:
        log(f"{store.root}: all {len(trials)} trials already done")
        return store
    if n_done:
        log(f"{store.root}: resuming, {n_done}/{len(trials)} trials already done")
    from tqdm.auto import tqdm

    with tqdm(
        total=len(trials), initial=n_done, desc=f"{experiment} readout", unit="trial", disable=not progress
    ) as bar:
        for k in todo:
            lo, hi = bounds[k]
            readouts = engine.readout(trials[lo:hi], progress=bar.update)
            store.write_chunk(k, readout_tables(readouts))
    return store
