"""The run store: atomic chunks, resume after SIGKILL, shards and merge, clear refusals."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from probe.errors import StoreError
from probe.shards import Shard
from probe.store import RunStore, chunk_bounds
from tests.conftest import readout_tables

ROOT = Path(__file__).resolve().parent.parent
ITEMS = "mine_cart_bridge,pond_child,dam_spillway"


def reference_args(out: Path) -> list[str]:
    """The CLI arguments of the reference run (tiny yes/no, 3 items, 2 salts, chunks of 8) into ``out``."""
    run = ["run", "yesno", "--model", "tiny", "--out", str(out), "--items", ITEMS]
    return [*run, "--salts", "2", "--chunk-size", "8", "--quiet"]


def probe_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "probe", *args]


def run_cli(*args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``probe ARGS``: in this process, or in a fresh one where ``env`` adds variables (e.g. PYTHONHASHSEED).

    In process, ``main`` runs as ``python -m probe`` would (the same parser, the same exit statuses, ``--help``'s
    SystemExit caught), without a new interpreter importing torch, Transformers and the analysis stack again: about
    4 s of CPU a call, which over the suite's few dozen runs was a tenth of ``make test``. The tests that need a
    process of their own (SIGKILL mid-run, the hash seed, the ``-m probe`` entry point) start one. Fails with stderr.
    """
    p = inprocess_cli(*args) if env is None else subprocess_cli(*args, env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"probe {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def subprocess_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m probe ARGS`` in a fresh process, ``env`` added to this one's environment."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(probe_cmd(*args), capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def inprocess_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``probe.app.cli.main(ARGS)`` in this process, its stdout and stderr captured, as a finished process."""
    from probe.app.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as e:  # argparse: --help (0) and usage errors (2)
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return subprocess.CompletedProcess(probe_cmd(*args), rc, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "run"
    run_cli(*reference_args(out))
    return out


def test_run_writes_manifest_trials_results_and_report(reference_run: Path):
    man = json.loads((reference_run / "manifest.json").read_text())
    assert man["experiment"] == "yesno" and man["n_trials"] == 3 * 3 * 2 * 2 * 2
    assert man["engine"]["model_class"] == "Qwen3MoeForCausalLM"
    assert man["packages"]["torch"] and man["packages"]["transformers"]
    assert man["identity"]["model_fingerprint"]
    opts, per = readout_tables(reference_run)
    assert len(per) == man["n_trials"] and per["trial_id"].is_unique
    assert len(opts) == 2 * man["n_trials"]
    assert opts.groupby("trial_id")["prob"].sum().sub(1).abs().max() < 1e-9
    assert (reference_run / "report" / "summary.md").exists()
    table = pd.read_csv(reference_run / "report" / "yesno_by_item.csv", index_col=0)
    assert {"z", "lexical", "order", "apparent"} <= set(table.columns)
    assert "salt" in (reference_run / "report" / "summary.md").read_text().lower()


def test_sigkill_then_resume_gives_identical_results(reference_run: Path, tmp_path: Path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [*reference_args(out), "--no-report"]
    proc = subprocess.Popen(probe_cmd(*args), env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    results_dir = out / "results"
    while time.time() < deadline:  # kill as soon as at least one chunk is committed, mid-run
        if results_dir.is_dir() and len(list(results_dir.glob("*.done"))) >= 2:
            break
        if proc.poll() is not None:
            pytest.fail("the run finished before it could be killed; make the workload bigger")
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_chunks = len(chunk_bounds(36, 8))
    done_before = len(RunStore(out).done_chunks())
    assert 1 <= done_before < n_chunks
    p = run_cli(*args)
    assert "resuming" in p.stdout
    assert f"took over a stale lock left by pid {proc.pid}" in p.stdout  # the killed run's lock, named
    opts, per = readout_tables(out)
    ref_opts, ref_per = readout_tables(reference_run)
    assert per["trial_id"].is_unique and len(per) == len(ref_per)
    pd.testing.assert_frame_equal(opts, ref_opts)  # bit-identical, not merely close
    pd.testing.assert_frame_equal(per, ref_per)
    p = run_cli(*args)  # a third run has nothing left to do
    assert "already done" in p.stdout


def test_a_different_spec_in_the_same_folder_is_refused(reference_run: Path):
    p = run_cli(
        "run", "yesno", "--model", "tiny", "--out", str(reference_run), "--items", ITEMS, "--quiet", check=False
    )
    assert p.returncode == 2
    assert "different run" in p.stderr and "spec" in p.stderr and "start fresh" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_shards_merge_to_the_unsharded_run(reference_run: Path, tmp_path: Path):
    out = tmp_path / "sharded"
    base = reference_args(out)
    for i in range(3):
        run_cli(*base, "--shard", f"{i}/3")
    assert sorted(p.name for p in out.iterdir()) == ["shard-0-of-3", "shard-1-of-3", "shard-2-of-3"]
    run_cli("merge", str(out))
    opts, per = readout_tables(out)
    ref_opts, ref_per = readout_tables(reference_run)
    cols = ["trial_id", "option", "prob"]
    merged = opts[cols].merge(ref_opts[cols], on=["trial_id", "option"], suffixes=("", "_ref"))
    assert len(merged) == len(ref_opts)
    assert (merged["prob"] - merged["prob_ref"]).abs().max() < 1e-5  # batches differ across shards
    assert sorted(per["trial_id"]) == sorted(ref_per["trial_id"])
    assert (out / "report" / "summary.md").exists()


def test_merge_refuses_missing_shards(tmp_path: Path):
    out = tmp_path / "partial"
    run_cli("run", "yesno", "--model", "tiny", "--out", str(out), "--items", "pond_child", "--shard", "1/2", "--quiet")
    p = run_cli("merge", str(out), check=False)
    assert p.returncode == 2 and "missing [0]" in p.stderr


@pytest.mark.parametrize("text", ["3/3", "-1/2", "1", "a/b", "0/0"])
def test_bad_shard_is_rejected(text: str):
    with pytest.raises(ValueError, match="shard"):
        Shard.parse(text)


def test_shards_partition_the_trials():
    trials = list(range(37))
    parts = [Shard(i, 5).select(trials) for i in range(5)]  # type: ignore[arg-type]
    assert [t for part in parts for t in part] == trials


def test_cli_errors_are_one_clear_line(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- id: x\n  title: t\n")
    cases = [
        (
            ["run", "yesno", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "o1"), "--quiet"],
            "does not exist",
        ),
        (["run", "yesno", "--dilemmas", str(bad), "--out", str(tmp_path / "o2"), "--quiet"], "bad.yaml"),
        (["run", "yesno", "--shard", "4/4", "--out", str(tmp_path / "o3"), "--quiet"], "shard"),
        (["readout", "--prompt", "hi", "--options", "Yes,"], "non-empty"),
        (["analyze", str(tmp_path)], "not a run folder"),
    ]
    for args, needle in cases:
        p = run_cli(*args, check=False)
        assert p.returncode == 2, (args, p.stderr)
        assert needle in p.stderr, (args, p.stderr)
        assert "Traceback" not in p.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o3").exists()


def test_help_on_every_verb():
    for verb in ("run", "readout", "merge", "analyze", "check", "tiny"):
        p = run_cli(verb, "--help")
        assert "usage: probe " + verb in p.stdout


def test_readout_json_has_ids_and_probabilities():
    p = run_cli(
        "readout", "--model", "tiny", "--prompt", "Is it fine? Answer with Yes or No.", "--options", "Yes,No", "--json"
    )
    doc = json.loads(p.stdout)
    assert doc["model_path"] and doc["prompt_token_ids"]
    assert [o["option"] for o in doc["options"]] == ["Yes", "No"]
    assert all(o["token_ids"] and o["logprob"] <= 0 for o in doc["options"])
    assert abs(sum(o["prob"] for o in doc["options"]) - 1) < 1e-9 and 0 < doc["coverage"] <= 1


def test_readout_json_is_strict_where_an_option_has_no_mass(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """An option the model gives probability 0 (logprob -inf) is written as null: strict JSON, never -Infinity."""
    import math

    from engines.hf.engine import HFEngine
    from probe.app.cli import main
    from probe.types import OptionScore, Readout

    def readout(self, trials, progress=None):
        scores = (OptionScore("Yes", (1,), 0.0, 1.0), OptionScore("No", (2,), -math.inf, 0.0))
        return [Readout(trials[0].trial_id, scores, 1.0, "Yes", (), 3, 3, prompt_ids=(1, 2, 3))]

    monkeypatch.setattr(HFEngine, "readout", readout)
    monkeypatch.setattr(HFEngine, "load", lambda self: self)
    monkeypatch.setattr(HFEngine, "describe", lambda self: {"model_path": "tiny"})
    assert main(["readout", "--model", "tiny", "--prompt", "Yes or No?", "--options", "Yes,No", "--json"]) == 0

    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    doc = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert [o["logprob"] for o in doc["options"]] == [0.0, None]


def test_atomic_write_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from probe import files

    target = tmp_path / "x.json"
    files.atomic_write_text(target, "old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", boom)
    with pytest.raises(OSError):
        files.atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_parquet_bytes_parse_from_a_copy_arrow_owns():
    """read_parquet_bytes gives pd.read_parquet's frame, and Arrow is never handed the Python bytes object.

    The abort it prevents (docs/store.md) is a race at interpreter exit, a few percent of short processes: too rare
    to catch in a test that must not flake, so the test checks the frame and that no reference to ``data`` remains.
    """
    import io

    from probe.files import parquet_bytes, read_parquet_bytes

    frame = pd.DataFrame({"trial_id": ["a", "b"], "p": [0.25, float("nan")], "n": [1, 2], "ok": [True, False]})
    data = parquet_bytes(frame)
    refs = sys.getrefcount(data)
    got = read_parquet_bytes(data)
    pd.testing.assert_frame_equal(got, pd.read_parquet(io.BytesIO(data)), check_exact=True)
    pd.testing.assert_frame_equal(got, frame, check_exact=True)
    assert sys.getrefcount(data) == refs, "a reference to the bytes outlived the parse"


def test_store_open_refuses_a_non_run_folder(tmp_path: Path):
    (tmp_path / "stuff.txt").write_text("x")
    with pytest.raises(StoreError, match="not empty"):
        RunStore.open(tmp_path, {"run_key": "k"}, [])


def test_sampled_only_run_is_analyzed_from_counts(tmp_path: Path):
    out = tmp_path / "sampled"
    run_cli(
        "run",
        "yesno",
        "--model",
        "tiny",
        "--out",
        str(out),
        "--items",
        "pond_child",
        "--samples",
        "6",
        "--no-readout",
        "--quiet",
    )
    s = RunStore(out).load("samples")
    assert len(s) == 12 * 6 and not s.duplicated(["trial_id", "draw"]).any()
    assert set(s["status"]) <= {"ok", "refusal", "invalid"}
    from probe.runs import open_run

    opts, per = open_run(out).sample_counts()
    # frequencies among parsed answers, checked against a direct count
    ok = s[s.status == "ok"]
    assert per["n_ok"].sum() == len(ok) and (per[["n_ok", "n_refusal", "n_invalid"]].sum(axis=1) == 6).all()
    for tid, grp in ok.groupby("trial_id"):
        got = opts[opts.trial_id == tid].set_index("option")["prob"]
        for option, share in (grp["option"].value_counts() / len(grp)).items():
            assert got[option] == pytest.approx(share)
    assert "samples" in (out / "report" / "summary.md").read_text()


def test_nothing_to_collect_is_an_error(tmp_path: Path):
    p = run_cli("run", "yesno", "--out", str(tmp_path / "x"), "--no-readout", "--quiet", check=False)
    assert p.returncode == 2 and "nothing to collect" in p.stderr
