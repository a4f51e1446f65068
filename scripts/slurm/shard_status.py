"""Is a shard folder's run the one requested, and is it complete? Exit 0 skip, 3 run, 2 refused.

The array task checks this before starting ``probe run``, so a resubmitted
array skips finished shards without loading the model (loading a 30B model
takes minutes; checking a folder takes milliseconds). Skipping is only safe
for the same run: every part of the run key that the command line determines
is compared with the folder's manifest (:mod:`probe.app.request`), so a changed
option or a changed N is refused by every task before any work instead of
being answered with the old results.

    shard_status.py OUT/<slug>/shard-i-of-n EXPERIMENT MODEL [probe run args...]

Exit 0: complete and the same run (nothing to do). Exit 3: not started, or
the same run and incomplete (``probe run`` resumes it). Exit 2: refused,
with the reason and the fix on stderr. Any other status (a traceback's 1, a
missing interpreter's 127) is a failed check, never "incomplete".
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

COMPLETE, TODO, REFUSED = 0, 3, 2
_SHARD = re.compile(r"^shard-(\d+)-of-(\d+)$")


class Refused(Exception):
    """The folder holds something this submission must not skip over or mix with."""


def complete(folder: Path) -> bool:
    from probe.errors import StoreError
    from probe.store import RunStore

    if not (folder / "manifest.json").is_file():
        return False
    store = RunStore(folder)
    try:
        return len(store.verified_chunks()) == len(store.bounds())  # a damaged chunk makes the task run (repair) it
    except StoreError:  # an unreadable manifest: not complete
        return False


def other_splits(folder: Path, count: int) -> list[str]:
    """Shard folders next to ``folder`` that split the run into a different number of shards."""
    return sorted(
        p.name for p in folder.parent.glob("shard-*-of-*") if (m := _SHARD.match(p.name)) and int(m.group(2)) != count
    )


def status(folder: Path, experiment: str, model: str, run_args: list[str]) -> int:
    """COMPLETE or TODO for ``folder``; :class:`Refused` when it holds another run or sits beside another split."""
    from probe.app.request import identity_differences, parse_run_args, requested_identity
    from probe.errors import StoreError
    from probe.store import RunStore

    m = _SHARD.match(folder.name)
    if not m:
        raise Refused(f"{folder} is not a shard-i-of-n folder")
    index, count = int(m.group(1)), int(m.group(2))
    others = other_splits(folder, count)
    if others:
        raise Refused(
            f"{folder.parent} already holds a run split into a different number of shards ({', '.join(others)}); "
            f"this submission asks for N={count}, and shards of two splits cannot be merged. Resubmit with the N "
            f"of those folders to finish that run, or use a new OUT (or delete {folder.parent} to start over)"
        )
    if not (folder / "manifest.json").is_file():
        return TODO
    try:
        stored = RunStore(folder).manifest().identity
    except StoreError as e:
        raise Refused(str(e)) from None
    args = parse_run_args(experiment, model, folder.parent, [*run_args, "--shard", f"{index}/{count}"])
    diffs = identity_differences(stored, requested_identity(args))
    if diffs:
        raise Refused(
            f"{folder} holds a different run than this submission asks for ({'; '.join(diffs)}); nothing was run. "
            "Resubmit with the options it was made with, or use a new OUT for the changed run "
            f"(or delete {folder.parent} to start over)"
        )
    return COMPLETE if complete(folder) else TODO


if __name__ == "__main__":
    if len(sys.argv) < 4:
        print("usage: shard_status.py SHARD_FOLDER EXPERIMENT MODEL [probe run args...]", file=sys.stderr)
        sys.exit(REFUSED)
    try:
        sys.exit(status(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]))
    except (Refused, ValueError) as e:  # ValueError: run arguments that probe run would refuse too
        print(f"shard_status.py: refused: {e}", file=sys.stderr)
        sys.exit(REFUSED)
