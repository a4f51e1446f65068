"""The seeds the tests rely on are really honoured: the same command in two fresh processes gives the same bytes.

Most tests that depend on random draws are made deterministic by a seed (the synthetic subject's, the
Transformers engine's per-(trial, draw) seeds, numpy generators in the bootstraps). That holds only if
nothing else leaks into the draws: Python's per-process string hashing (set and dict-of-set order), the
wall clock, or a global generator. So each run here happens in its own process under a different
``PYTHONHASHSEED``, and every table and report file must come out identical.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.test_store import run_cli

ROOT = Path(__file__).resolve().parent.parent
ITEM = "mine_cart_bridge"


def _probe(args: list[str], hash_seed: int) -> None:
    run_cli(*args, env={"PYTHONHASHSEED": str(hash_seed)})


def _tables(run: Path) -> dict[str, pd.DataFrame]:
    """Every result table of a run, rows in a stable order, with the columns that time the run dropped."""
    timed = {"seconds", "latency_s", "wall_s", "started", "finished"}
    out = {}
    for f in sorted((run / "results").glob("*.parquet")):
        frame = pd.read_parquet(f)
        frame = frame.drop(columns=[c for c in frame.columns if c in timed])
        out[f.name] = frame.reset_index(drop=True)
    assert out, f"no result tables under {run}"
    return out


def _reports(run: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted((run / "report").glob("*.csv"))}


def _same_runs(a: Path, b: Path) -> None:
    ta, tb = _tables(a), _tables(b)
    assert ta.keys() == tb.keys()
    for name in ta:
        pd.testing.assert_frame_equal(ta[name], tb[name], check_exact=True, obj=name)
    ra, rb = _reports(a), _reports(b)
    assert ra and ra.keys() == rb.keys()
    differ = [n for n in ra if ra[n] != rb[n]]
    assert not differ, f"report tables differ between processes: {differ}"


DETERMINISM_ITEMS = (
    "mine_cart_bridge",
    "transplant_traveler",
    "pond_child",
    "hospital_budget",
    "deathbed_promise",
    "water_additive",
    "freight_yard_switch",
    "uncle_juice",
)
"""8 of the 22 dilemmas: every section of the report is computed on them (fits, label map, calibration, validity),
in 16 s a run instead of 37."""


def test_sim_battery_draws_and_bootstraps_repeat_across_processes(tmp_path: Path) -> None:
    """The synthetic subject's readouts, its sampled draws and the report's bootstraps are fixed by their seeds."""
    runs = []
    items = ["--items", ",".join(DETERMINISM_ITEMS)]
    for hash_seed in (0, 4242):
        out = tmp_path / f"sim-{hash_seed}"
        _probe(["run", "battery", "--model", "sim", "--samples", "3", *items, "--out", str(out), "--quiet"], hash_seed)
        runs.append(out)
    _same_runs(*runs)


SAMPLE_SNIPPET = """
import json, sys
from engines.hf import HFEngine, HFSettings
from experiments.yesno import YesNoSpec, expand
trials = expand(YesNoSpec(items=(sys.argv[1],)))
samples = HFEngine(HFSettings(model="tiny")).load().sample(trials, n=4, temperature=1.0)
print(json.dumps([[s.trial_id, s.replicate, s.text] for s in samples]))
"""


def test_transformers_sampling_repeats_across_processes(tiny_engine) -> None:
    """The tiny model's sampled answers are fixed by the per-(trial, draw) seeds, not by the process.

    One set of draws comes from this test process (whatever its hash seed), one from a fresh process
    with another; the engine settings are the same, so every text must be the same.
    """
    import json

    from experiments.yesno import YesNoSpec, expand

    trials = expand(YesNoSpec(items=(ITEM,)))
    here = [[s.trial_id, s.replicate, s.text] for s in tiny_engine.sample(trials, n=4, temperature=1.0)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "777"}
    done = subprocess.run(
        [sys.executable, "-c", SAMPLE_SNIPPET, ITEM], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    there = json.loads(done.stdout.strip().splitlines()[-1])
    assert there == here
    assert len({text for _, _, text in here}) > 1  # real draws, not one answer repeated


@pytest.mark.parametrize("hash_seed", [3])
def test_report_is_a_pure_function_of_the_stored_run(tmp_path: Path, hash_seed: int) -> None:
    """Re-analysing a stored run in another process rewrites the same report tables."""
    out = tmp_path / "sim"
    _probe(["run", "yesno", "--model", "sim", "--samples", "2", "--out", str(out), "--quiet"], 0)
    before = _reports(out)
    _probe(["analyze", str(out)], hash_seed)
    assert before and _reports(out) == before
