"""The batch-size sweep: every peer at each of its batch sizes, peers taking turns, then repeats at its best.

A ratio against a peer held below its best batch size is not a result, so the
bench first runs every peer once at each batch size of the sweep (the peers
taking turns, the order reversed at every step, so a busy spell on a shared
machine does not fall on one peer only), picks each peer's fastest size, and
then runs every peer ``repeats - 1`` more times at that size (turns again).
Each peer thus has ``repeats`` runs at its best size, and the fastest counts.

Pure functions and a driver that takes the measuring function as an argument,
so the schedule is testable without a model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Batch = int | None
"""A batch size, or None for a peer that has none (one trial per call, or a scheduler of its own)."""


def parse_sizes(text: str) -> list[int]:
    """``"1,4,16,64"`` -> ``[1, 4, 16, 64]`` (sorted, distinct, each >= 1)."""
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"batch sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch sizes must be integers >= 1, got {text!r}")
    return sizes


def sizes_for(sizes: Sequence[int], units: int | None) -> Sequence[Batch]:
    """The batch sizes that differ for a peer that batches ``units`` items (sizes above it all mean "all at
    once", so they collapse to ``units``); ``[None]`` for a peer without a batch size (``units`` None)."""
    if units is None:
        return [None]
    return [*sorted({min(b, max(1, units)) for b in sizes})]


def best_batch(seconds: Mapping[Batch, Sequence[float]]) -> Batch:
    """The batch size of the fastest run (the smaller size on a tie)."""
    return min(seconds, key=lambda b: (min(seconds[b]), -1 if b is None else b))


def measure_swept(
    peers: Sequence[str],
    sizes: Mapping[str, Sequence[Batch]],
    repeats: int,
    run_one: Callable[[str, Batch], dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Sweep, then repeat at the best size; per peer the result of its best size, with every run at that size
    (``runs``), the fastest time at each size (``sweep``) and the size (``batch_size``).

    ``run_one(peer, batch)`` returns a child's result: a dict with ``runs``, a list of dicts with ``seconds``.
    """
    got: dict[str, dict[Batch, list[dict[str, Any]]]] = {p: {} for p in peers}
    step = 0

    def turn(todo: Callable[[str], Batch | str]) -> None:
        nonlocal step
        for p in peers if step % 2 == 0 else list(reversed(peers)):
            b = todo(p)
            if b != "skip":
                assert not isinstance(b, str)
                got[p].setdefault(b, []).append(run_one(p, b))
        step += 1

    for i in range(max(len(sizes[p]) for p in peers)):
        turn(lambda p, i=i: sizes[p][i] if i < len(sizes[p]) else "skip")  # type: ignore[misc]
    seconds = {p: {b: [r["seconds"] for res in rs for r in res["runs"]] for b, rs in got[p].items()} for p in peers}
    best = {p: best_batch(seconds[p]) for p in peers}
    for _ in range(1, repeats):
        turn(lambda p: best[p])
    out: dict[str, dict[str, Any]] = {}
    for p in peers:
        results = got[p][best[p]]
        merged = dict(results[-1])
        merged["runs"] = [r for res in results for r in res["runs"]]
        merged["batch_size"] = best[p]
        merged["sweep"] = {str(b): min(r["seconds"] for res in rs for r in res["runs"]) for b, rs in got[p].items()}
        out[p] = merged
    return out


def sweep_line(result: Mapping[str, Any]) -> str:
    """``1: 5.10s, 4: 3.20s*, 16: 3.90s`` (* = the size reported), or ``n/a`` for a peer without sizes."""
    sweep = result.get("sweep") or {}
    if not sweep or list(sweep) == ["None"]:
        return "n/a"
    best = str(result["batch_size"])
    return ", ".join(f"{b}: {s:.2f}s{'*' if b == best else ''}" for b, s in sweep.items())
