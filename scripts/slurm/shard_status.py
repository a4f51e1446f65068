"""Exit 0 if a shard folder holds a complete shard (every chunk committed and verified), 1 otherwise.

The array task checks this before starting ``probe run``, so a resubmitted
array skips finished shards without loading the model (loading a 30B model
takes minutes; checking a folder re-hashes its tables against their receipts,
about a second per GB). A shard with a damaged chunk counts as unfinished, so
the task runs and repairs it.
"""

from __future__ import annotations

import sys
from pathlib import Path


def complete(folder: Path) -> bool:
    from probe.store import RunStore, StoreError, chunk_bounds

    if not (folder / "manifest.json").is_file():
        return False
    store = RunStore(folder)
    try:
        man = store.manifest()
    except StoreError:
        return False
    n_chunks = len(chunk_bounds(int(man["n_trials"]), int(man["chunk_size"])))
    return len(store.verified_chunks()) == n_chunks  # a damaged chunk makes the task run (and repair) it


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: shard_status.py SHARD_FOLDER", file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if complete(Path(sys.argv[1])) else 1)
