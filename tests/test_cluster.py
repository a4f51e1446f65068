"""Cluster batch jobs on CPU: shards merge to exactly one run, and the Slurm scripts under a fake array.

Readouts are computed one trial per forward pass (``batch_size=1``), so a
trial's values cannot depend on which shard or chunk it landed in: the merged
tables must equal the unsharded run's bit for bit, not merely within a
tolerance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from probe.shards import Shard, merge_shards
from probe.store import RunStore
from tests.conftest import readout_tables

ROOT = Path(__file__).resolve().parent.parent
SLURM = ROOT / "scripts" / "slurm"
ITEMS = ("mine_cart_bridge", "pond_child")
FORMS = ("acceptable",)
CHUNK = 3
N_TRIALS = 8  # 2 dilemmas x 1 form x 2 verbs x 2 orders


def spec():
    from experiments.yesno import YesNoSpec

    return YesNoSpec(items=ITEMS, forms=FORMS)


@pytest.fixture(scope="module")
def engine():
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    return HFEngine(HFSettings(model="tiny", batch_size=1)).load()


@pytest.fixture(scope="module")
def reference(engine, tmp_path_factory) -> Path:
    from probe.app.runner import run

    out = tmp_path_factory.mktemp("one") / "run"
    run("yesno", spec(), engine, out, chunk_size=CHUNK, progress=False, log=lambda _: None)
    return out


@pytest.mark.parametrize("n", [1, 2, 7])
def test_n_shards_merge_to_exactly_the_one_run(engine, reference, tmp_path, n):
    from probe.app.runner import run

    out = tmp_path / "sharded"
    for i in range(n):
        run("yesno", spec(), engine, out, shard=Shard(i, n), chunk_size=CHUNK, progress=False, log=lambda _: None)
    merged = merge_shards(out)
    assert merged.manifest()["run_key"] == RunStore(reference).manifest()["run_key"]
    assert merged.trial_ids() == RunStore(reference).trial_ids()  # same trials, same order
    ref_opts, ref_per = readout_tables(reference)
    opts, per = readout_tables(out)
    assert len(per) == N_TRIALS and per["trial_id"].is_unique
    pd.testing.assert_frame_equal(opts, ref_opts, check_exact=True)
    pd.testing.assert_frame_equal(per, ref_per, check_exact=True)


def test_run_records_throughput_in_the_manifest(reference):
    man = json.loads((reference / "manifest.json").read_text())
    tp = man["throughput"]
    _, per = readout_tables(reference)
    assert tp["trials"] == N_TRIALS and tp["seconds"] > 0
    assert tp["computed_tokens"] == int(per["computed_tokens"].sum()) > tp["trials"]
    assert tp["prompt_tokens"] == int(per["prompt_tokens"].sum())
    assert tp["trials_per_s"] == pytest.approx(N_TRIALS / tp["seconds"], rel=1e-2)
    assert tp["tokens_per_s"] == pytest.approx(tp["computed_tokens"] / tp["seconds"], rel=1e-2)
    assert tp["peak_gpu_memory_bytes"] is None  # no CUDA here


def test_throughput_line_and_entry():
    from probe.app.runner import throughput, throughput_line

    e = throughput(10, 4.0, {"prompt_tokens": 300, "computed_tokens": 320, "completion_tokens": 80}, 3 * 2**30)
    assert (e["trials_per_s"], e["tokens_per_s"]) == (2.5, 100.0)
    line = throughput_line(e)
    assert line == "throughput: 10 trials in 4.0 s, 2.5 trials/s, 100.0 tokens/s, peak GPU memory 3.00 GiB"
    assert (
        throughput(0, 0.0, dict.fromkeys(("prompt_tokens", "computed_tokens", "completion_tokens"), 0), None)[
            "trials_per_s"
        ]
        is None
    )


# ----------------------------------------------------------- Slurm scripts
def slurm_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        {
            "SLURM_SUBMIT_DIR": str(ROOT),
            "PROBE_SLURM_DIR": str(SLURM),
            "PROBE_BIN": f"{sys.executable} -m probe",
            "PROBE_PYTHON": sys.executable,
            "PYTHONPATH": str(ROOT),
            **extra,
        }
    )
    return env


def bash(script: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SLURM / script), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )


def test_submit_makes_one_array_task_per_model_and_shard_then_a_dependent_merge(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "sbatch.calls"
    (fake / "sbatch").write_text(
        f'#!/usr/bin/env bash\ncase "$1" in --test-only) exit 0;; esac\nprintf "%s\\n" "$*" >> {calls}\nif grep -q dependency <<<"$*"; then echo 8; else echo "7;clusterA"; fi\n'
    )
    (fake / "sbatch").chmod(0o755)

    def submit(**extra: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
        calls.unlink(missing_ok=True)
        env = slurm_env(tmp_path, PATH=f"{fake}:{os.environ['PATH']}", SBATCH_ARGS="--partition=gpu", **extra)
        args = ["yesno", "runs/c", "3", "Qwen/Qwen3-30B-A3B,vllm:/m/nemo", "--think"]
        p = subprocess.run(
            ["bash", str(SLURM / "submit.sh"), *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
        )
        return p, calls.read_text().splitlines() if calls.exists() else []

    p, (array, merge) = submit()
    assert p.returncode == 0, p.stderr
    gpu = "--gres=gpu:1 --cpus-per-task=8 --mem=64G --time=04:00:00"  # the documented defaults (resources.sh)
    assert array == (
        f"--parsable {gpu} --partition=gpu --output=logs/probe-%A_%a.out --array=0-5 "
        f"{SLURM}/array.sbatch yesno runs/c 3 Qwen/Qwen3-30B-A3B,vllm:/m/nemo --think"
    )
    assert merge == (
        "--parsable --cpus-per-task=4 --mem=16G --time=01:00:00 --partition=gpu --output=logs/probe-merge-%j.out "
        f"--dependency=afterok:7 --kill-on-invalid-dep=yes {SLURM}/merge.sbatch runs/c Qwen/Qwen3-30B-A3B,vllm:/m/nemo"
    )
    assert "array job 7 (tasks 0-5: 2 model(s) x 3 shards), merge job 8" in p.stdout
    assert (tmp_path / "logs").is_dir()  # Slurm does not create the --output folder

    # each job's resources are overridden alone (a GPU for the tasks never reaches the merge job)
    p, (array, merge) = submit(
        PROBE_ARRAY_RESOURCES="--gres=gpu:2 --mem=8G", PROBE_MERGE_RESOURCES="", PROBE_LOG_DIR="l2"
    )
    assert p.returncode == 0, p.stderr
    assert array.startswith("--parsable --gres=gpu:2 --mem=8G --partition=gpu --output=l2/probe-%A_%a.out --array")
    assert merge.startswith("--parsable --partition=gpu --output=l2/probe-merge-%j.out --dependency=afterok:7")
    assert (tmp_path / "l2").is_dir()


def test_submit_explains_a_refused_sbatch(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(
        '#!/usr/bin/env bash\necho "sbatch: error: Invalid generic resource (gres) specification" >&2\nexit 1\n'
    )
    (fake / "sbatch").chmod(0o755)
    env = slurm_env(tmp_path, PATH=f"{fake}:{os.environ['PATH']}")
    p = subprocess.run(
        ["bash", str(SLURM / "submit.sh"), "yesno", "runs/c", "2", "tiny"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert p.returncode == 1
    assert "sbatch refused the array job" in p.stderr and "--gres=gpu:1" in p.stderr
    assert 'PROBE_ARRAY_RESOURCES="--cpus-per-task=4 --mem=16G"' in p.stderr  # the CPU recipe


def test_array_task_logic_with_a_fake_probe(engine, tmp_path):
    """Task index -> (model, shard), the skip of finished shards and the merge job, with ``probe`` recorded, not run."""
    from probe.app.runner import run

    out = tmp_path / "cluster"
    for i in range(2):  # real shards of model "tiny", made in-process
        run("yesno", spec(), engine, out / "tiny", shard=Shard(i, 2), chunk_size=CHUNK, progress=False, log=print)
    last = sorted((out / "tiny" / "shard-1-of-2" / "results").glob("*.done"))[-1]
    last.unlink()  # shard 1 was preempted before its last chunk was committed
    calls = tmp_path / "probe.calls"
    fake = tmp_path / "probe"
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$*" >> {calls}\n')
    fake.chmod(0o755)
    same = ["--items", ",".join(ITEMS), "--forms", ",".join(FORMS), "--batch-size", "1", "--chunk-size", str(CHUNK)]
    args = ["yesno", str(out), "2", "tiny,vllm:/models/nemo/", *same]

    def task(t: str | None, *extra_args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
        extra = {"PROBE_BIN": str(fake)} | ({"SLURM_ARRAY_TASK_ID": t} if t is not None else {}) | extra_env
        return bash("array.sbatch", *args, *extra_args, env=slurm_env(tmp_path, **extra))

    assert "SLURM_ARRAY_TASK_ID" in task(None).stderr
    skipped = task("0")
    assert skipped.returncode == 0 and "is complete; nothing to do" in skipped.stdout
    assert not calls.exists()  # a finished shard does not even start probe (no model load)
    for t in ("1", "2", "3"):
        assert task(t).returncode == 0
    beyond = task("4")
    assert beyond.returncode == 2 and "no model 2 in 'tiny,vllm:/models/nemo/'" in beyond.stderr
    assert calls.read_text().splitlines() == [
        f"run yesno --model tiny --out {out}/tiny --shard 1/2 --quiet {' '.join(same)}",
        f"run yesno --model vllm:/models/nemo/ --out {out}/nemo --shard 0/2 --quiet {' '.join(same)}",
        f"run yesno --model vllm:/models/nemo/ --out {out}/nemo --shard 1/2 --quiet {' '.join(same)}",
    ]
    calls.unlink()

    # a changed option is refused by the complete shard and the incomplete one alike, before probe starts
    for t in ("0", "1"):
        changed = task(t, "--system", "Be brief.")
        assert changed.returncode == 2, changed.stdout
        assert "system_prompt: stored None, requested 'Be brief.'" in changed.stderr
        assert "refused" in changed.stderr and "nothing was run" in changed.stderr
    # a status check that cannot run is a failure, not "incomplete"
    broken = task("0", PROBE_PYTHON=str(tmp_path / "no-python"))
    assert broken.returncode == 2 and "the shard status check failed (exit 127" in broken.stderr
    assert not calls.exists()

    merged = bash("merge.sbatch", str(out), "tiny,vllm:/models/nemo/", env=slurm_env(tmp_path, PROBE_BIN=str(fake)))
    assert merged.returncode == 0, merged.stderr
    assert calls.read_text().splitlines() == [f"merge {out}/tiny", f"merge {out}/nemo"]


def test_a_changed_n_is_refused_by_the_task_and_by_the_merge(engine, tmp_path):
    from probe.app.runner import run
    from probe.errors import StoreError

    out = tmp_path / "cluster"
    for i in range(2):
        run("yesno", spec(), engine, out / "tiny", shard=Shard(i, 2), chunk_size=CHUNK, progress=False, log=print)
    args = ["yesno", str(out), "3", "tiny", "--items", ",".join(ITEMS), "--forms", ",".join(FORMS)]
    fake = tmp_path / "probe"
    fake.write_text("#!/usr/bin/env bash\nexit 99\n")
    fake.chmod(0o755)
    p = bash("array.sbatch", *args, env=slurm_env(tmp_path, SLURM_ARRAY_TASK_ID="0", PROBE_BIN=str(fake)))
    assert p.returncode == 2
    assert "split into a different number of shards (shard-0-of-2, shard-1-of-2)" in p.stderr
    assert "asks for N=3" in p.stderr
    assert not (out / "tiny" / "shard-0-of-3").exists()
    run("yesno", spec(), engine, out / "tiny", shard=Shard(0, 3), chunk_size=CHUNK, progress=False, log=print)
    with pytest.raises(StoreError, match=r"shards of 2 different splits \(N = 2, 3: shard-0-of-2, shard-0-of-3"):
        merge_shards(out / "tiny")


def test_a_failed_task_says_env_sh_made_the_hub_offline(tmp_path):
    fake = tmp_path / "probe"
    fake.write_text("#!/usr/bin/env bash\necho 'cannot load model' >&2\nexit 2\n")
    fake.chmod(0o755)
    env = slurm_env(tmp_path, SLURM_ARRAY_TASK_ID="0", PROBE_BIN=str(fake))
    env.pop("HF_HUB_OFFLINE", None)
    p = bash("array.sbatch", "yesno", str(tmp_path / "o"), "1", "someorg/missing", env=env)
    assert p.returncode == 2
    assert "env.sh set HF_HUB_OFFLINE=1" in p.stderr and "hf download" in p.stderr
    env["HF_HUB_OFFLINE"] = "1"  # the user's own choice: no hint about env.sh
    p = bash("array.sbatch", "yesno", str(tmp_path / "o"), "1", "someorg/missing", env=env)
    assert p.returncode == 2 and "env.sh set" not in p.stderr


def test_logs_are_not_tracked_by_git():
    p = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "logs/probe-7_0.out"], timeout=30)
    assert p.returncode == 0, "logs/ (the Slurm job logs) should be in .gitignore"


@pytest.mark.slow
def test_array_tasks_resume_only_unfinished_shards_then_merge(reference, tmp_path):
    """End to end: the task bodies run the real probe on the tiny model (6 processes: slow on 2 cores)."""
    out = tmp_path / "cluster"
    args = ["yesno", str(out), "2", "tiny,/nonexistent/model", "--items", ",".join(ITEMS), "--forms", ",".join(FORMS)]
    args += ["--batch-size", "1"]
    args += ["--chunk-size", str(CHUNK)]

    missing = bash("array.sbatch", *args, env=slurm_env(tmp_path))
    assert missing.returncode != 0 and "SLURM_ARRAY_TASK_ID" in missing.stderr

    for task in (0, 1):  # model 0 (tiny), shards 0 and 1
        p = bash("array.sbatch", *args, env=slurm_env(tmp_path, SLURM_ARRAY_TASK_ID=str(task)))
        assert p.returncode == 0, p.stderr[-2000:]
        assert f"tiny shard {task}/2 -> {out}/tiny/shard-{task}-of-2" in p.stdout
    wrong = bash("array.sbatch", *args, env=slurm_env(tmp_path, SLURM_ARRAY_TASK_ID="2"))  # model 1, shard 0
    assert wrong.returncode == 2 and "does not exist" in wrong.stderr
    assert "/nonexistent/model shard 0/2 -> " + f"{out}/model/shard-0-of-2" in wrong.stdout
    beyond = bash("array.sbatch", *args, env=slurm_env(tmp_path, SLURM_ARRAY_TASK_ID="4"))
    assert beyond.returncode == 2 and "no model 2" in beyond.stderr

    # resubmitting: a finished shard exits without running probe; an interrupted one resumes
    done = bash("array.sbatch", *args, env=slurm_env(tmp_path, SLURM_ARRAY_TASK_ID="0"))
    assert done.returncode == 0 and "is complete; nothing to do" in done.stdout
    shard1 = out / "tiny" / "shard-1-of-2"
    last = sorted((shard1 / "results").glob("*.done"))[-1]
    last.unlink()  # as if the task had been preempted before its last chunk was committed
    again = bash("array.sbatch", *args, env=slurm_env(tmp_path, SLURM_ARRAY_TASK_ID="1"))
    assert again.returncode == 0 and "resuming" in again.stdout

    merged = bash("merge.sbatch", str(out), "tiny", env=slurm_env(tmp_path))
    assert merged.returncode == 0, merged.stderr[-2000:]
    assert (out / "tiny" / "report" / "summary.md").exists()
    ref_opts, ref_per = readout_tables(reference)
    opts, per = readout_tables(out / "tiny")
    pd.testing.assert_frame_equal(opts, ref_opts, check_exact=True)
    pd.testing.assert_frame_equal(per, ref_per, check_exact=True)


def test_model_slugs():
    env = slurm_env(Path("."))
    for model, slug in [
        ("Qwen/Qwen3-30B-A3B", "Qwen3-30B-A3B"),
        ("vllm:/models/nemotron nano/", "nemotron_nano"),
        ("tiny", "tiny"),
    ]:
        p = subprocess.run(
            ["bash", "-c", f'. {SLURM}/env.sh && probe_slug "$0"', model], capture_output=True, text=True, env=env
        )
        assert p.stdout.strip() == slug, (model, p.stdout, p.stderr)


def test_rates_time_readouts_draws_and_replies_apart():
    import contextlib

    from probe.app.runner import _Rates, throughput, throughput_line

    class Bar:
        postfix = ""

        def set_postfix_str(self, s, refresh=False):
            self.postfix = s

    rates, bar, clock = _Rates(), Bar(), iter([0.0, 2.0, 10.0, 14.0])
    with contextlib.ExitStack() as stack:
        stack.enter_context(pytest.MonkeyPatch.context()).setattr(
            "probe.app.runner.time.perf_counter", lambda: next(clock)
        )
        with rates.timing("readouts", 10, bar):
            pass
        with rates.timing("replies", 8, bar):
            pass
    entry = rates.entry()
    assert entry["readouts"] == 10 and entry["readout_seconds"] == 2.0 and entry["readouts_per_s"] == 5.0
    assert entry["replies"] == 8 and entry["reply_seconds"] == 4.0 and entry["replies_per_s"] == 2.0
    assert entry["draws"] == 0 and entry["draws_per_s"] is None
    assert bar.postfix == "5.0 readouts/s, 2.0 replies/s"
    e = throughput(18, 6.0, dict.fromkeys(("prompt_tokens", "computed_tokens", "completion_tokens"), 0), None) | entry
    assert throughput_line(e).endswith("(10 readouts at 5.0 readouts/s; 8 replies at 2.0 replies/s)")
