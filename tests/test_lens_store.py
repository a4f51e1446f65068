"""``--layers`` in the run store: the ``readout_layers`` table in the same atomic chunks, byte-identical after a
SIGKILL and a resume, merged across shards, read back by the notebook API, and its own run key."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from probe.store import RunStore
from tests.test_store import ROOT, probe_cmd, run_cli

ITEMS = "pond_child,dam_spillway"


def layered_args(out: Path, *extra: str) -> list[str]:
    """A tiny yes/no run with every layer read, in chunks of 4, no report."""
    run = ["run", "yesno", "--model", "tiny", "--out", str(out), "--items", ITEMS, "--layers", "all"]
    return [*run, "--chunk-size", "4", "--quiet", "--no-report", *extra]


@pytest.fixture(scope="module")
def layered_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("layers") / "run"
    run_cli(*layered_args(out))
    return out


def test_a_layered_run_stores_every_layer_of_every_read_trial(layered_run: Path):
    import probe

    run = probe.open_run(layered_run)
    layers, options = run.layers, run.options
    assert sorted(layers["layer"].unique()) == [0, 1, 2]  # tiny: 2 blocks
    assert len(layers) == 3 * len(options)
    last = layers[layers["layer"] == 2].reset_index(drop=True)
    for col in ("trial_id", "option", "option_index", "meaning", "logprob", "prob"):
        assert last[col].tolist() == options[col].tolist()  # the last layer is the final readout, exactly
    assert last["layer_greedy"].tolist() == options["greedy"].tolist()
    man = json.loads((layered_run / "manifest.json").read_text())
    assert man["identity"]["layers"] == "all"
    for chunk in (layered_run / "results").glob("*.done"):  # every chunk commits the table with the others
        assert (chunk.parent / chunk.name.replace(".done", ".readout_layers.parquet")).is_file()


@pytest.mark.slow  # 6 s; test_lens.py checks that the layer set enters the run key, and only when set
def test_without_layers_the_same_folder_is_a_different_run(layered_run: Path):
    args = [a for a in layered_args(layered_run) if a not in ("--layers", "all")]
    p = run_cli(*args, check=False)
    assert p.returncode == 2 and "different run" in p.stderr and "layers" in p.stderr


def test_sigkill_then_resume_gives_byte_identical_layer_tables(layered_run: Path, tmp_path: Path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        probe_cmd(*layered_args(out)), env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 300
    while time.time() < deadline:  # kill once a chunk is committed, mid-run
        if (out / "results").is_dir() and len(list((out / "results").glob("*.done"))) >= 1:
            break
        if proc.poll() is not None:
            pytest.fail("the run finished before it could be killed; make the workload bigger")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_done, n_chunks = len(RunStore(out).done_chunks()), len(list((layered_run / "results").glob("*.done")))
    assert 1 <= n_done < n_chunks
    assert "resuming" in run_cli(*layered_args(out)).stdout
    names = sorted(p.name for p in (layered_run / "results").glob("*.readout_layers.parquet"))
    assert names == sorted(p.name for p in (out / "results").glob("*.readout_layers.parquet"))
    for name in names:
        assert (out / "results" / name).read_bytes() == (layered_run / "results" / name).read_bytes()
    pd.testing.assert_frame_equal(RunStore(out).load("readout_layers"), RunStore(layered_run).load("readout_layers"))


@pytest.mark.slow  # 13 s; merge concatenates every table its shards committed (probe.shards)
def test_shards_merge_the_layer_tables(layered_run: Path, tmp_path: Path):
    out = tmp_path / "sharded"
    for i in range(2):
        run_cli(*layered_args(out, "--shard", f"{i}/2"))
    run_cli("merge", str(out), "--no-report")
    merged, ref = RunStore(out).load("readout_layers"), RunStore(layered_run).load("readout_layers")
    key = ["trial_id", "layer", "option"]
    both = merged.merge(ref, on=key, suffixes=("", "_ref"))
    assert len(both) == len(ref) == len(merged)
    assert (both["prob"] - both["prob_ref"]).abs().max() < 1e-5  # batches differ across shards
