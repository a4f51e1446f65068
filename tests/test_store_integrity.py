"""A run store that cannot lie (issue 21): receipts, repair, one writer, a full disk, the API journal.

Every case damages a real run of the tiny model (2 dilemmas, 24 trials in 3
chunks of 8), shows what the user sees, repairs it with the same `probe run`
and checks the tables against the undamaged run.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from probe.app.cli import main
from probe.errors import StoreError
from probe.lock import Holder, LockError, RunLock
from probe.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
ITEMS = "pond_child,dam_spillway"
N_TRIALS, N_CHUNKS = 24, 3


def run_args(out: Path, *extra: str) -> list[str]:
    return ["run", "yesno", "--model", "tiny", "--out", str(out), "--items", ITEMS, "--chunk-size", "8", "--quiet",
            "--no-report", *extra]  # fmt: skip


def tables(run: Path) -> dict[str, pd.DataFrame]:
    s = RunStore(run)
    return {
        "readout_options": s.load("readout_options").sort_values(["trial_id", "option_index"]).reset_index(drop=True),
        "readout_trials": s.load("readout_trials").sort_values("trial_id").reset_index(drop=True),
    }


def assert_same_tables(run: Path, reference: Path) -> None:
    got, want = tables(run), tables(reference)
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name], check_exact=True)  # bit-identical, not merely close


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "run"
    assert main(run_args(out)) == 0
    man = RunStore(out).manifest()
    assert man["n_trials"] == N_TRIALS and len(RunStore(out).integrity().chunks) == N_CHUNKS
    return out


@pytest.fixture
def copy(reference: Path, tmp_path: Path) -> Path:
    """A copy of the undamaged run (the lock file of its writer left empty, as a clean exit leaves it)."""
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    return out


# ------------------------------------------------------------- damaged files
def _delete(run: Path) -> None:
    (run / "results" / "chunk-000001.readout_trials.parquet").unlink()


def _truncate(run: Path) -> None:
    os.truncate(run / "results" / "chunk-000001.readout_options.parquet", 100)


def _flip_byte(run: Path) -> None:  # same size, different content: only the hash sees it
    path = run / "results" / "chunk-000001.readout_options.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _garble_marker(run: Path) -> None:
    path = run / "results" / "chunk-000001.done"
    path.write_bytes(path.read_bytes()[:40] + b"\x00\xff garbage")


def _edit_marker(run: Path) -> None:  # valid JSON, but its checksum no longer matches
    path = run / "results" / "chunk-000001.done"
    doc = json.loads(path.read_text())
    doc["tables"]["readout_trials"]["rows"] = 7
    path.write_text(json.dumps(doc))


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "deleted table file": (_delete, "chunk-000001.readout_trials.parquet is missing"),
    "truncated table file": (_truncate, "chunk-000001.readout_options.parquet is 100 bytes, its receipt says"),
    "changed table file": (
        _flip_byte,
        "chunk-000001.readout_options.parquet does not match its receipt's content hash",
    ),
    "garbled .done marker": (_garble_marker, "its .done marker is damaged: not valid JSON"),
    "edited .done marker": (_edit_marker, "its .done marker is damaged: its own checksum does not match"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_chunk_is_refused_reported_and_recomputed(
    case: str, copy: Path, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damage, why = DAMAGE[case]
    damage(copy)
    rc, out, _ = cli(capsys, "check", str(copy))
    assert rc == 1
    assert "chunks: 3 expected, 3 done, 2 verified, 1 damaged, 0 missing; trials: 16 of 24 verified" in out
    assert f"chunk 1 (trials 8-15): damaged, {why}" in out
    assert "recomputes chunk(s) 1 only" in out
    with pytest.raises(StoreError, match="expects 24 trials, 16 are in verified chunks"):
        RunStore(copy).load("readout_trials")  # every load verifies: no silent 16-trial table
    rc, out, _ = cli(capsys, *run_args(copy))
    assert rc == 0
    assert f"{copy}: chunk 1 (trials 8-15): damaged, {why}" in out and "recomputing it" in out
    assert "resuming, 16/24 trials already done" in out
    assert_same_tables(copy, reference)
    rc, out, _ = cli(capsys, "check", str(copy))
    assert rc == 0 and "3 verified, 0 damaged, 0 missing; trials: 24 of 24 verified" in out


def test_a_damaged_sampled_chunk_is_drawn_again_identically(tmp_path: Path, capsys) -> None:
    """Sampled answers (Transformers engine, seeded per trial and draw) are recomputed to the same draws."""
    out = tmp_path / "sampled"
    args = run_args(out, "--samples", "2", "--no-readout", "--max-new-tokens", "4")
    assert main(args) == 0
    want = RunStore(out).load("samples")
    os.truncate(out / "results" / "chunk-000002.samples.parquet", 64)
    rc, text, _ = cli(capsys, *args)
    assert rc == 0 and "chunk 2 (trials 16-23): damaged, chunk-000002.samples.parquet is 64 bytes" in text
    pd.testing.assert_frame_equal(RunStore(out).load("samples"), want, check_exact=True)


def test_analysis_refuses_an_incomplete_store_unless_partial_is_asked(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _delete(copy)
    (copy / "results" / "chunk-000002.done").unlink()  # as if killed before its last chunk
    rc, _, err = cli(capsys, "analyze", str(copy))
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "the manifest expects 24 trials, 8 are in verified chunks" in err
    assert "chunk 1 (trials 8-15): damaged" in err and "chunk 2 (trials 16-23): missing" in err
    assert "re-running `probe run` with the same arguments" in err and "--allow-partial" in err
    rc, _, _ = cli(capsys, "analyze", "--allow-partial", str(copy))
    assert rc == 0
    summary = (copy / "report" / "summary.md").read_text()
    assert summary.startswith("> **Partial report** (`probe analyze --allow-partial`): 8 of 24 trials, from 1 of 3")
    assert "chunk 2 (trials 16-23): missing" in summary.splitlines()[0]
    assert len(RunStore(copy, allow_partial=True).load("readout_trials")) == 8


def test_a_marker_from_the_old_format_is_trusted_when_its_tables_parse(copy: Path) -> None:
    """Runs written before receipts (marker = a JSON list of table names) stay readable, and a broken one is caught."""
    for k in range(N_CHUNKS):
        (copy / "results" / f"chunk-{k:06d}.done").write_text('["readout_options","readout_trials"]\n')
    assert RunStore(copy).integrity().complete
    _truncate(copy)
    (bad,) = RunStore(copy).integrity().damaged
    assert bad.chunk == 1 and "is not readable Parquet" in bad.reason


# --------------------------------------------------------------- one writer
def _lock_holder_process(folder: Path) -> subprocess.Popen[str]:
    """A process that takes the run folder's lock (with probe's own code), says so, and waits to be killed."""
    code = (
        "import sys, time\nfrom probe.lock import RunLock\n"
        f"RunLock({str(folder)!r}).acquire()\nprint('locked', flush=True)\nsys.stdin.read()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_lock_is_exclusive_names_its_holder_and_is_released(tmp_path: Path) -> None:
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    assert first.acquire() is None
    assert first.peek()
    holder = first.holder()
    assert holder is not None and holder.pid == os.getpid() and holder.host == socket.gethostname()
    with pytest.raises(LockError) as e:
        second.acquire()  # flock locks belong to the open file, so a second open in one process conflicts too
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in str(e.value) and "--wait-for-lock" in str(e.value)
    first.release()
    assert not first.peek() and first.holder() is None  # a clean release leaves no name behind
    assert second.acquire() is None
    second.release()


def test_stale_lock_of_a_killed_process_is_taken_over(copy: Path, reference: Path, capsys) -> None:
    proc = _lock_holder_process(copy)
    rc, _, err = cli(capsys, *run_args(copy))
    assert rc == 2 and f"another probe process is writing {copy}: pid {proc.pid} on host" in err
    proc.kill()
    proc.wait()
    holder = RunLock(copy).holder()
    assert holder is not None and holder.pid == proc.pid and holder.alive() is False  # the file still names it
    assert not RunLock(copy).peek()  # ... but the kernel dropped the lock with the process
    rc, out, _ = cli(capsys, *run_args(copy))
    assert rc == 0
    assert f"{copy}: took over a stale lock left by pid {proc.pid} on host {socket.gethostname()}" in out
    assert "already done" in out
    assert_same_tables(copy, reference)


def test_two_concurrent_runs_on_one_folder(
    reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The first run is held inside its second chunk; a second `probe run` exits 2 naming it, computing nothing."""
    from engines.hf.engine import HFEngine

    out = tmp_path / "run"
    inside, release = threading.Event(), threading.Event()
    real = HFEngine.readout
    calls = []

    def gated(self, trials, progress=None):
        calls.append(len(trials))
        if len(calls) == 2:
            inside.set()
            assert release.wait(timeout=600)
        return real(self, trials, progress)

    monkeypatch.setattr(HFEngine, "readout", gated)
    result: list[int] = []
    first = threading.Thread(target=lambda: result.append(main(run_args(out))))
    first.start()
    try:
        assert inside.wait(timeout=600), "the first run never reached its second chunk"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        second = subprocess.run(
            [sys.executable, "-m", "probe", *run_args(out)],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
    finally:
        release.set()
        first.join(timeout=600)
    assert second.returncode == 2, second.stderr
    err = second.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"another probe process is writing {out}: pid {os.getpid()} on host {socket.gethostname()}" in err
    # the first run computed every chunk once (then read its numeric floor's sample, one trial a call); the second none
    floor = int(os.environ.get("PROBE_FLOOR_TRIALS", "32"))
    assert result == [0] and calls == [8, 8, 8] + [1] * min(floor, 24)
    capsys.readouterr()
    assert_same_tables(out, reference)


def test_second_run_can_wait_for_the_first(tmp_path: Path, reference: Path) -> None:
    """--wait-for-lock queues behind the holder: it says whom it waits for, then runs once the lock is free."""
    out = tmp_path / "run"
    lock = RunLock(out)
    lock.acquire()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "probe", *run_args(out, "--wait-for-lock")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # explicit synchronization: the waiter announces itself, then blocks
        assert f"{out}: waiting for the writer that holds it: pid {os.getpid()}" in line
        assert proc.poll() is None
    finally:
        lock.release()
    rest, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "took over" not in rest  # a released lock is not stale
    assert_same_tables(out, reference)


def test_holder_alive_knows_only_its_own_host() -> None:
    me = Holder.me()
    assert me.alive() is True
    assert Holder(me.pid, "elsewhere.example", me.since, "").alive() is None


# ---------------------------------------------------------------- full disk
def test_disk_full_mid_chunk_commits_nothing_of_it(
    reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The write of chunk 1's second table fails with ENOSPC: its first table is removed, no marker is written."""
    from probe import store

    out = tmp_path / "run"
    real = store.atomic_write_bytes

    def filling(path: Path, data: bytes) -> None:
        if path.name == "chunk-000001.readout_trials.parquet":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(store, "atomic_write_bytes", filling)
    rc, _, err = cli(capsys, *run_args(out))
    assert rc == 2
    assert (
        f"no space left for chunk 1 in {out / 'results'}: it needs " in err
        and " bytes on disk), the file system has " in err
    )
    assert "Nothing of chunk 1 was committed" in err and "re-run the same command" in err
    assert sorted(p.name for p in (out / "results").iterdir() if p.name.startswith("chunk-000001")) == []
    assert not [p for p in (out / "results").iterdir() if p.suffix == ".tmp"]
    assert [c.status for c in RunStore(out).integrity().chunks] == ["verified", "missing", "missing"]
    monkeypatch.setattr(store, "atomic_write_bytes", real)  # space freed
    rc, out_text, _ = cli(capsys, *run_args(out))
    assert rc == 0 and "resuming, 8/24 trials already done" in out_text
    assert_same_tables(out, reference)


def _mount_tmpfs(folder: Path, size: int) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    try:
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    except OSError:
        return False
    return p.returncode == 0


def test_a_real_full_disk_stops_at_a_chunk_boundary(reference: Path, tmp_path: Path, capsys) -> None:
    """On a tmpfs too small for the run: the error names the folder and the space; after growing it the run resumes."""
    page = 4096
    pages = lambda n: -(-n // page)  # noqa: E731
    chunk = sum(pages(p.stat().st_size) for p in (reference / "results").iterdir() if p.name.startswith("chunk-000000"))
    fixed = pages((reference / "trials.jsonl").stat().st_size) + 2 * pages((reference / "manifest.json").stat().st_size)
    size = (fixed + 1 + chunk + chunk // 2) * page  # room for the trials, the manifest, the lock and 1.5 chunks
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, size):
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN); the ENOSPC test above still runs")
    try:
        out = disk / "run"
        rc, _, err = cli(capsys, *run_args(out))
        assert rc == 2 and f"in {out / 'results'}: it needs " in err and "free. Nothing of chunk" in err
        states = [c.status for c in RunStore(out).integrity().chunks]
        k = states.index("missing")
        assert k >= 1 and states == ["verified"] * k + ["missing"] * (N_CHUNKS - k)
        assert not list((out / "results").glob(f"chunk-{k:06d}.*"))
        subprocess.run(["mount", "-o", f"remount,size={16 * size}", str(disk)], check=True)
        rc, out_text, _ = cli(capsys, *run_args(out))
        assert rc == 0 and f"resuming, {8 * k}/24 trials already done" in out_text
        assert_same_tables(out, reference)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# ------------------------------------------------------------ the API journal
def test_damaged_journal_lines_are_quarantined_and_nothing_is_bought_twice(server, tmp_path: Path, capsys) -> None:
    """API engine against `transformers serve`: two damaged journal lines and a lost samples table.

    The damaged lines (one garbled, one edited) belong to a committed chunk, so their responses are not
    lost; the lost table's chunk is rebuilt from the journal. The proxy counts every call the server answers.
    """
    from tests.fault_proxy import FaultProxy

    out = tmp_path / "api"
    with FaultProxy(server.origin, {}) as proxy:
        args = ["run", "yesno", "--model", f"openai-compatible:tiny@{proxy.url}/v1", "--samples", "2"]
        args += ["--items", "mine_cart_bridge", "--out", str(out), "--chunk-size", "4", "--quiet", "--no-report"]
        rc, _, _ = cli(capsys, *args)
        assert rc == 0 and proxy.delivered_ok == 24  # 12 trials x 2 draws, one call each
        store = RunStore(out)
        before = store.load("samples").sort_values(["trial_id", "draw"]).reset_index(drop=True)
        first_chunk = set(store.trial_ids()[:4])
        journal = out / "results" / "api-journal.jsonl"
        lines = journal.read_bytes().splitlines(keepends=True)
        mine = [i for i, raw in enumerate(lines) if json.loads(raw)["trial_id"] in first_chunk]
        garbled, edited = mine[0], mine[1]
        lines[garbled] = lines[garbled][:30] + b"\x00\x00 torn by a bad disk\n"
        lines[edited] = lines[edited].replace(b'"draw":', b'"draw": ', 1).replace(b'"status":"', b'"status":"x', 1)
        journal.write_bytes(b"".join(lines))
        (out / "results" / "chunk-000001.samples.parquet").unlink()

        rc, text, _ = cli(capsys, "check", str(out))
        assert rc == 1 and "api journal: 22 responses, 2 damaged line(s)" in text
        assert f"line {garbled + 1}: not valid JSON" in text and "the next `probe run` quarantines it" in text
        assert "chunk 1 (trials 4-7): damaged, chunk-000001.samples.parquet is missing" in text

        rc, text, err = cli(capsys, *args)
        assert rc == 0
        assert (
            f"api: quarantined 2 damaged line(s) of {journal} into {out / 'results' / 'api-journal.quarantine'}" in err
        )
        assert f"line {garbled + 1}: not valid JSON" in err
        assert f"line {edited + 1}: its checksum does not match its content" in err and "kept the other 22" in err
        assert "chunk 1 (trials 4-7): damaged, chunk-000001.samples.parquet is missing; recomputing it (paid API " \
               "responses are replayed from the journal, not bought again)" in text  # fmt: skip
        assert proxy.delivered_ok == 24  # not one call paid twice
    after = RunStore(out).load("samples").sort_values(["trial_id", "draw"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(after, before, check_exact=True)
    assert (out / "results" / "api-journal.quarantine").read_bytes() == lines[garbled] + lines[edited]
    assert len(journal.read_bytes().splitlines()) == 22
    stats = RunStore(out).manifest()["engine_stats"]
    assert stats["duplicates"] == 0 and stats["quarantined_journal_lines"] == 2
    rc, text, _ = cli(capsys, "check", str(out))
    assert rc == 0 and "api journal: 22 responses, 0 damaged line(s), 2 quarantined earlier" in text


def test_append_log_quarantines_damaged_lines_and_keeps_old_unchecksummed_ones(tmp_path: Path) -> None:
    from engines.api.journal import AppendLog, quarantine_path

    path = tmp_path / "log.jsonl"
    log = AppendLog(path)
    log.append({"n": 1})
    log.append({"n": 2})
    log.close()
    good = path.read_bytes().splitlines(keepends=True)
    assert all(b'"line_sha256":' in line for line in good)
    legacy = b'{"n": 0}\n'  # written before lines had checksums: taken as it is
    edited = good[1].replace(b'"n":2', b'"n":3')
    path.write_bytes(legacy + good[0] + b"{not json\n" + edited)
    log = AppendLog(path)
    assert [(d.line, d.reason.split(" (")[0]) for d in log.quarantined] == [
        (3, "not valid JSON"),
        (4, "its checksum does not match its content"),
    ]
    assert [r["n"] for r in log.read()] == [0, 1] and log.corrupt_lines == 0
    assert quarantine_path(path).read_bytes() == b"{not json\n" + edited
    assert path.read_bytes() == legacy + good[0]
    log.close()


def test_a_full_disk_under_the_journal_names_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engines.api import journal as api_journal

    log = api_journal.AppendLog(tmp_path / "j.jsonl")

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(api_journal.os, "write", full)
    with pytest.raises(StoreError, match=f"no space left in {tmp_path} to journal a record of"):
        log.append({"n": 1})
    monkeypatch.undo()
    log.close()
