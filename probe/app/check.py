"""``probe check RUN``: what a run folder holds, verified chunk by chunk.

Read-only: it re-hashes every table against its chunk's receipt, checks
``trials.jsonl`` against the manifest's trial count and hash, scans the API
journal for damaged lines (a writer quarantines them; ``check`` only
reports), and says whether a writer holds the folder now. A symbolic link
anywhere it reads is refused (a run folder from elsewhere may point outside
itself).
"""

from __future__ import annotations

from pathlib import Path

from engines.api.journal import JOURNAL, CallRecord, quarantine_path, quarantined_count, scan_lines
from probe.files import link_problem
from probe.lock import LOCK_FILE, RunLock
from probe.shards import find_shards
from probe.store import RunStore
from probe.terminal import escape_controls


def check_run(root: Path) -> tuple[list[str], bool]:
    """(the report lines, whether the store is whole) for a run folder or a folder of shards; control characters
    of what the folder holds (a lock file's command, a reason quoting a file) are escaped for the terminal."""
    lines, ok = _check_run(root)
    return [escape_controls(line) for line in lines], ok


def _check_run(root: Path) -> tuple[list[str], bool]:
    root = Path(root)
    if not (root / "manifest.json").exists() and find_shards(root):
        lines, ok = [f"{root}: shards, not merged"], True
        for shard in find_shards(root):
            more, good = _check_run(shard)
            lines += ["", *more]
            ok = ok and good
        return lines, ok
    store = RunStore(root)
    man = store.manifest()
    integrity = store.integrity()
    lines = [
        f"{root}: {man.experiment}, {integrity.n_trials} trials in {len(integrity.chunks)} chunks, "
        f"run key {man.run_key}",
        integrity.counts_line(),
        *(f"  {p}" for p in integrity.problems()),
    ]
    journal_lines, journal_ok = _journal(store)
    lines += journal_lines
    lines.append(_lock_line(root))
    if not integrity.complete:
        bad = [c.chunk for c in integrity.chunks if c.status != "verified"]
        replay = " (API responses are replayed from the journal)" if journal_lines else ""
        lines.append(
            f"repair: re-run `probe run` with the same arguments; it recomputes chunk(s) {_ranges(bad)} only{replay}"
        )
    return lines, integrity.complete and journal_ok


def _journal(store: RunStore) -> tuple[list[str], bool]:
    path = store.results_dir / JOURNAL
    why = link_problem(path)
    if why:
        return [f"api journal: {why}; not read"], False
    if not path.exists():
        return [], True
    good, bad = scan_lines(path, CallRecord.from_record)
    before = quarantined_count(path)
    line = f"api journal: {len(good)} responses, {len(bad)} damaged line(s)"
    line += f", {before} quarantined earlier in {quarantine_path(path).name}" if before else ""
    return [line, *(f"  {d.describe()} (the next `probe run` quarantines it)" for d in bad)], not bad


def _lock_line(root: Path) -> str:
    why = link_problem(root / LOCK_FILE)
    if why:
        return f"writer: unknown ({why}; not read)"
    lock = RunLock(root)
    holder = lock.holder()
    if lock.peek():
        return f"writer: {holder.describe() if holder else 'a process that has not written its name yet'} holds the lock now"
    if holder is not None:
        return f"writer: none (the lock file still names {holder.describe()}, which ended without releasing it)"
    return "writer: none"


def _ranges(ks: list[int]) -> str:
    """1, 2, 3, 7 -> '1-3, 7'."""
    out: list[str] = []
    for k in ks:
        if out and out[-1].split("-")[-1] == str(k - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{k}"
        else:
            out.append(str(k))
    return ", ".join(out)
