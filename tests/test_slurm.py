"""The cluster path on a real one-node Slurm (``make test-slurm``; not part of ``make test``).

A module fixture starts munged, slurmctld and slurmd on this machine
(``scripts/slurm/localcluster.sh``, everything in a temporary folder) and
stops them by their pid files; every test skips, saying why, where no
controller can be started. The workflow is the one ``docs/cluster.md``
documents, on the tiny model and a CPU partition: submit the array and the
merge from a folder outside the repository, interrupt one task mid-run,
resubmit, and compare the merged run with an unsharded ``probe run``. Then
each fault of issue 20: a changed option and a changed N are refused before
any work, the default (GPU) resources on a CPU cluster are explained, each
job gets its own resources, a by-hand submission works without ``logs/``
from any folder, and a requeued task appends to its log.

No test sleeps for a fixed time: each one polls job states (``scontrol``,
as there is no accounting) or files until an explicit state is reached,
with deadlines far beyond what the steps take. Readouts are one trial per
forward pass (``--batch-size 1``), so the merged tables must equal the
unsharded run's exactly, when both use the same number of torch threads
(``env.sh`` gives a task ``OMP_NUM_THREADS`` = its CPUs; a different count
changes the order of float sums, by about 1e-6).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from probe.store import RunStore
from tests.conftest import readout_tables

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parent.parent
SLURM = ROOT / "scripts" / "slurm"
LOCAL = SLURM / "localcluster.sh"
ITEMS = "mine_cart_bridge,freight_yard_switch,flooded_mine_door,overloaded_raft"
# 4 dilemmas x 3 forms x 2 verbs x 2 orders = 48 trials: 24 one-trial chunks per shard, so a task is caught mid-run
RUN_ARGS = ("--items", ITEMS, "--batch-size", "1", "--chunk-size", "1")
PER_SHARD = 24
# a CPU partition: what each job asks for (the local node has no GPUs and few cores)
CPU = {"PROBE_ARRAY_RESOURCES": "--cpus-per-task=1 --mem=600M", "PROBE_MERGE_RESOURCES": "--cpus-per-task=1 --mem=400M"}
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
DEADLINE = 300.0  # seconds for any one wait; the steps take seconds


@dataclass(frozen=True)
class Cluster:
    env: dict[str, str]
    folder: Path

    def run(self, *cmd: str, cwd: Path | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(cmd), capture_output=True, text=True, env=self.env | extra, cwd=cwd or ROOT, timeout=120
        )

    def submit(self, cwd: Path, *args: str, **extra: str) -> tuple[str, str]:
        """submit.sh from ``cwd``; the array and merge job ids it printed."""
        p = self.run(str(SLURM / "submit.sh"), *args, cwd=cwd, **extra)
        assert p.returncode == 0, p.stderr
        m = re.search(r"array job (\d+) .*merge job (\d+)", p.stdout)
        assert m, p.stdout
        return m.group(1), m.group(2)

    def job(self, job: str) -> dict[str, str]:
        """``scontrol show job`` as a mapping (JobState, ExitCode, MinMemoryNode, ...)."""
        p = self.run("scontrol", "-o", "show", "job", job)
        assert p.returncode == 0, p.stderr
        return dict(re.findall(r"(\w[\w/:]*)=(\S*)", p.stdout.splitlines()[0]))

    def state(self, job: str) -> str:
        return self.job(job)["JobState"]

    def wait(self, *jobs: str) -> dict[str, str]:
        """Poll until every job is in a final state; their states."""
        return {j: wait_until(lambda j=j: s if (s := self.state(j)) in TERMINAL else None, f"job {j}") for j in jobs}


def wait_until(probe: Callable[[], str | None], what: str, deadline: float = DEADLINE) -> str:
    """Poll ``probe`` until it returns a value; fail naming ``what`` after ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while (value := probe()) is None:
        if time.monotonic() > end:
            pytest.fail(f"{what}: not reached after {deadline:.0f} s")
        time.sleep(0.02)
    return value


def cannot_start() -> str | None:
    """Why no controller can be started here (None: it can be tried)."""
    missing = [t for t in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol") if shutil.which(t) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; `make test-slurm` installs it as root)"
    if os.geteuid() != 0:
        return "starting slurmd needs root (it runs jobs as their user)"
    return None


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    why = cannot_start()
    if why:
        pytest.skip(why)
    folder = Path(tempfile.mkdtemp(prefix="probe-slurm-"))  # under /tmp: munged must reach its socket's folder
    up = subprocess.run(["bash", str(LOCAL), "up", str(folder)], capture_output=True, text=True, timeout=180)
    try:
        if up.returncode != 0:
            pytest.skip(f"no Slurm controller could be started here: {(up.stderr or up.stdout).strip()[-600:]}")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "PROBE_SLURM"))}
        yield Cluster(env | {"SLURM_CONF": str(folder / "slurm.conf")}, folder)
    finally:
        subprocess.run(["bash", str(LOCAL), "down", str(folder)], capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


def done_markers(shard: Path) -> int:
    return len(list((shard / "results").glob("chunk-*.done"))) if (shard / "results").is_dir() else 0


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` with its size and modification time (to show nothing was written)."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()
    }


@dataclass(frozen=True)
class Submission:
    """One submission of the cluster script that has run to its end."""

    array: str
    """The array job's id (its tasks are ``<array>_<task>``)."""
    merge: str
    """The id of the merge job that waits for the array."""
    states: dict[str, str]
    """Every job's final state, by job id."""


@dataclass(frozen=True)
class Workflow:
    """What the documented workflow left behind: two submissions of one sharded run, the first interrupted."""

    submit_dir: Path
    """The folder the jobs were submitted from (it had no ``logs/`` before)."""
    run_dir: Path
    """The run's ``--out`` folder, with its shard folders."""
    first: Submission
    """The first submission, whose task 1 was stopped and cancelled."""
    interrupted_at: int
    """The chunks shard 1 had committed when it was stopped and cancelled."""
    second: Submission
    """The resubmission, from the same folder."""


@pytest.fixture(scope="module")
def workflow(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Workflow:
    """The documented workflow: submit, interrupt task 1 mid-run, resubmit (from a folder with no logs/)."""
    submit_dir = tmp_path_factory.mktemp("submit")
    args = ("yesno", "runs/c", "2", "tiny", *RUN_ARGS)
    array, merge = cluster.submit(submit_dir, *args, **CPU)
    shard1 = submit_dir / "runs/c/tiny/shard-1-of-2"
    wait_until(lambda: "yes" if done_markers(shard1) >= 1 else None, "task 1's first committed chunk")
    holder = json.loads((shard1 / ".probe.lock").read_text())  # the writer's pid (probe.lock)
    os.kill(int(holder["pid"]), signal.SIGSTOP)  # freeze it between two chunks, then cancel it as a user would
    interrupted_at = done_markers(shard1)
    assert cluster.run("scancel", f"{array}_1").returncode == 0
    first = Submission(array, merge, cluster.wait(f"{array}_0", f"{array}_1", merge))
    array, merge = cluster.submit(submit_dir, *args, **CPU)
    second = Submission(array, merge, cluster.wait(f"{array}_0", f"{array}_1", merge))
    return Workflow(submit_dir, submit_dir / "runs/c/tiny", first, interrupted_at, second)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same run, unsharded, by a plain ``probe run``."""
    out = tmp_path_factory.mktemp("reference") / "run"
    p = subprocess.run(
        [str(ROOT / ".venv/bin/probe"), "run", "yesno", "--model", "tiny", "--out", str(out), "--quiet", *RUN_ARGS],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"OMP_NUM_THREADS": "1"},  # as a one-CPU task (env.sh): torch's thread count orders float sums
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return out


def log(w: Workflow, job: str, task: int | None = None) -> str:
    name = f"probe-{job}_{task}.out" if task is not None else f"probe-merge-{job}.out"
    return (w.submit_dir / "logs" / name).read_text()


def test_an_interrupted_task_resumes_on_resubmission_and_the_merge_equals_one_run(workflow, reference):
    w = workflow
    array, merge = w.first.array, w.first.merge
    assert w.first.states == {f"{array}_0": "COMPLETED", f"{array}_1": "CANCELLED", merge: "CANCELLED"}
    assert 1 <= w.interrupted_at < PER_SHARD  # the task was stopped between two chunks
    assert not (w.submit_dir / "logs" / f"probe-merge-{merge}.out").exists()  # the merge never ran
    array2, merge2 = w.second.array, w.second.merge
    assert set(w.second.states.values()) == {"COMPLETED"}, w.second.states
    assert "is complete; nothing to do" in log(w, array2, 0)
    resumed = re.search(r"resuming, (\d+)/24 trials already done", log(w, array2, 1))
    assert resumed and int(resumed.group(1)) >= w.interrupted_at, log(w, array2, 1)
    assert "merged 2 shards into runs/c/tiny (48 trials)" in log(w, merge2)
    assert (w.run_dir / "report" / "summary.md").is_file()
    ref_opts, ref_per = readout_tables(reference)
    opts, per = readout_tables(w.run_dir)
    assert len(per) == 2 * PER_SHARD and per["trial_id"].is_unique
    pd.testing.assert_frame_equal(opts, ref_opts, check_exact=True)
    pd.testing.assert_frame_equal(per, ref_per, check_exact=True)
    assert RunStore(w.run_dir).manifest()["run_key"] == RunStore(reference).manifest()["run_key"]


def test_submit_from_another_folder_creates_logs_and_gives_each_job_its_resources(cluster, workflow):
    w = workflow
    assert (w.submit_dir / "logs").is_dir() and w.submit_dir != ROOT  # submitted from outside the repository
    array, merge = w.second.array, w.second.merge
    task = cluster.job(f"{array}_0")
    merge_job = cluster.job(merge)
    assert (task["MinMemoryNode"], task["NumCPUs"]) == ("600M", "1")
    assert merge_job["MinMemoryNode"] == "400M"
    assert "gres" not in merge_job.get("TresPerNode", "")


def test_a_changed_option_is_refused_before_any_work_and_a_requeued_task_appends_its_log(cluster, workflow):
    w = workflow
    before = snapshot(w.run_dir)
    array, merge = cluster.submit(
        w.submit_dir, "yesno", "runs/c", "2", "tiny", *RUN_ARGS, "--system", "Be brief.", **CPU
    )
    states = cluster.wait(f"{array}_0", f"{array}_1", merge)
    assert states == {f"{array}_0": "FAILED", f"{array}_1": "FAILED", merge: "CANCELLED"}
    for t in (0, 1):
        text = log(w, array, t)
        assert "system_prompt: stored None, requested 'Be brief.'" in text
        assert "nothing was run" in text and f"shard {t}/2 ->" not in text  # refused before probe run started
    assert snapshot(w.run_dir) == before  # the old run and its report are untouched

    # a requeued task keeps the log of its first run (--open-mode=append)
    assert cluster.run("scontrol", "requeue", f"{array}_0").returncode == 0
    assert (
        cluster.run("scontrol", "update", f"jobid={array}_0", "StartTime=now").returncode == 0
    )  # skip the requeue delay
    wait_until(lambda: "yes" if cluster.job(f"{array}_0").get("Restarts") == "1" else None, "the requeue")
    assert cluster.wait(f"{array}_0") == {f"{array}_0": "FAILED"}
    assert log(w, array, 0).count("system_prompt: stored None") == 2


def test_a_changed_n_is_refused_by_every_task(cluster, workflow):
    w = workflow
    array, merge = cluster.submit(w.submit_dir, "yesno", "runs/c", "3", "tiny", *RUN_ARGS, **CPU)
    states = cluster.wait(*(f"{array}_{t}" for t in range(3)), merge)
    assert set(states.values()) == {"FAILED", "CANCELLED"} and states[merge] == "CANCELLED", states
    for t in range(3):
        text = log(w, array, t)
        assert "split into a different number of shards (shard-0-of-2, shard-1-of-2)" in text
        assert "asks for N=3" in text
    assert not list(w.run_dir.glob("shard-*-of-3"))


def test_a_request_no_node_can_meet_is_refused_at_submission_and_explained(cluster, tmp_path):
    p = cluster.run(str(SLURM / "submit.sh"), "yesno", "runs/c", "1", "tiny", cwd=tmp_path)
    assert p.returncode == 1
    assert "Invalid generic resource" in p.stderr  # Slurm's own message, then what to do
    assert "sbatch refused the array job" in p.stderr and 'PROBE_ARRAY_RESOURCES="--cpus-per-task=4' in p.stderr
    # more CPUs than any node has: refused at submission (sbatch --test-only), not left pending forever
    p = cluster.run(
        str(SLURM / "submit.sh"),
        "yesno",
        "runs/c",
        "1",
        "tiny",
        cwd=tmp_path,
        PROBE_ARRAY_RESOURCES="--cpus-per-task=64",
    )
    assert p.returncode == 1 and "Requested node configuration is not available" in p.stderr, p.stderr
    assert "It asked for: --cpus-per-task=64" in p.stderr
    assert cluster.run("squeue", "-h", "-n", "probe", "-t", "PENDING").stdout.strip() == ""  # nothing was queued


def test_a_by_hand_submission_works_from_any_folder_without_logs(cluster, tmp_path):
    items = ("--items", "mine_cart_bridge", "--forms", "acceptable")
    p = cluster.run(
        "sbatch", "--parsable", "--array=0-0", "--mem=600M",
        str(SLURM / "array.sbatch"), "yesno", "out", "1", "tiny", *items,
        cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    job = p.stdout.strip().split(";")[0]
    assert cluster.wait(f"{job}_0") == {f"{job}_0": "COMPLETED"}, (tmp_path / f"slurm-{job}_0.out").read_text()
    assert "wrote out/tiny/shard-0-of-1" in (tmp_path / f"slurm-{job}_0.out").read_text()  # Slurm's default log
    assert not (tmp_path / "logs").exists()
