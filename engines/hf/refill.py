"""Refilled decoding: a row whose trace ended is given to the next waiting trial (continuous batching).

Think mode reasons every trial before reading its slot. Decoded in fixed batches, a batch runs until its longest
trace ends, and with a 32,768-token budget one looping trace holds every row of its batch for 32,768 steps while
the others sit finished. Refilled, the cost is about ``total tokens / rows + longest trace`` steps, whatever the
mix of lengths (docs/speed.md, "Think mode").

How rows share one cache. The cache holds ``rows`` slots, left-padded: every live row writes its next key at the
same column, and the attention mask hides each row's padding and whatever a previous occupant left in its
columns. A new trial is prefilled on its own (with the others waiting to be admitted), its first token drawn from
that prefill, and its cache rows are stacked under the live ones, the narrower side padded on the left
(:func:`stacked`). Positions come from the mask (:meth:`engines.hf.weights.Model.forward`), so padding moves no RoPE
position; a padded column is masked, so it adds exactly zero to every softmax. In float32 a trial's tokens are
then those of the same trial decoded in any batch, up to the rounding of sums over a different number of columns.
In bfloat16 that rounding can change a token, so the schedule (which trial shares a step with which) is part of a
run's numerics: it depends only on the trial order and ``rows`` (:class:`Schedule`), never on timing.

Finished rows stay in the cache until a refill is worth it (:meth:`Schedule.compacts`): at least an eighth of the
rows free (or every waiting trial fitting), because stacking copies the cache once, about what one step reads.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.base import require


@dataclass
class ReasoningStats:
    """What a run's reasoning cost, for the manifest's ``engine_stats`` (a running tally, so not frozen)."""

    traces: int = 0
    """Traces reasoned."""
    tokens: int = 0
    """Reasoning tokens generated (the first token of each trace, drawn from its prefill, included)."""
    steps: int = 0
    """Decoding steps (forwards of one token per row; prefills not counted)."""
    prefills: int = 0
    """Prefill forwards (each admits one or more traces)."""
    rows: int = 0
    """Rows decoded together at most (the capacity the schedule fills)."""
    step_rows: int = 0
    """Rows summed over steps: the work the steps did."""
    finished_step_rows: int = 0
    """Of ``step_rows``, the rows whose trace had already ended (kept until a refill was worth a copy)."""
    longest: int = 0
    """Tokens of the longest trace."""
    schedule: str = ""
    """``slots``, ``refill`` or ``buckets`` (:class:`engines.hf.HFSettings` ``decode_graphs`` and
    ``reasoning_refill``)."""
    graphs: int = 0
    """``slots``: CUDA graphs recorded (one per slot count and attention span a call reached; 0 where steps ran
    unrecorded)."""
    capture_s: float = 0.0
    """``slots``: seconds spent recording them (their warm-up steps included)."""
    graphs_failed: str | None = None
    """``slots``: why recording was given up, where it was (the steps then ran unrecorded)."""

    def took(self, gen: Sequence[int]) -> None:
        """Count one finished generation of these tokens."""
        self.traces += 1
        self.tokens += len(gen)
        self.longest = max(self.longest, len(gen))

    def add(self, other: ReasoningStats) -> None:
        """Add another call's tally to this one."""
        self.traces += other.traces
        self.tokens += other.tokens
        self.steps += other.steps
        self.prefills += other.prefills
        self.rows = max(self.rows, other.rows)
        self.step_rows += other.step_rows
        self.finished_step_rows += other.finished_step_rows
        self.longest = max(self.longest, other.longest)
        self.schedule = other.schedule or self.schedule
        self.graphs += other.graphs
        self.capture_s += other.capture_s
        self.graphs_failed = other.graphs_failed or self.graphs_failed

    def record(self) -> dict[str, Any]:
        """The tally as the manifest records it, with the share of step-rows spent on finished traces and the
        steps against the ideal ``tokens / rows + longest``."""
        ideal = self.tokens / self.rows + self.longest if self.rows else 0.0
        return {
            "schedule": self.schedule,
            "traces": self.traces,
            "tokens": self.tokens,
            "steps": self.steps,
            "prefills": self.prefills,
            "rows": self.rows,
            "longest": self.longest,
            "step_rows": self.step_rows,
            "finished_share": round(self.finished_step_rows / self.step_rows, 4) if self.step_rows else 0.0,
            "steps_over_ideal": round(self.steps / ideal, 4) if ideal else 0.0,
            **(
                {"graphs": self.graphs, "capture_s": round(self.capture_s, 3), "graphs_failed": self.graphs_failed}
                if self.schedule == "slots"
                else {}
            ),
        }


@dataclass
class Schedule:
    """Which trial each cache row holds, and when rows are refilled: pure bookkeeping, no tensors.

    ``order`` is the order trials are admitted in (the request's order), ``rows`` the most rows decoded together.
    The schedule is a function of those two and of when each trace ends (its tokens), nothing else.
    """

    order: Sequence[int]
    rows: int
    waiting: deque[int] = field(init=False)
    slots: list[int] = field(default_factory=list)
    """The trial of each cache row, in row order."""
    finished: set[int] = field(default_factory=set)
    """Trials whose trace ended but whose row is still in the cache."""

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError(f"rows must be >= 1, got {self.rows}")
        self.waiting = deque(self.order)

    @property
    def live(self) -> int:
        """Rows still reasoning."""
        return len(self.slots) - len(self.finished)

    def compacts(self) -> bool:
        """Whether to drop the finished rows now (and admit waiting trials into them).

        While trials wait: once the free rows (finished, or never filled) reach an eighth of ``rows`` or hold
        every waiting trial. With none waiting: once the finished rows are an eighth of the cache, so the batch
        shrinks as traces end (as the sampler's rows do). Never when nothing is finished and nothing fits.
        """
        if self.waiting:
            free = self.rows - self.live
            return (bool(self.finished) or not self.slots) and free >= min(max(1, self.rows // 8), len(self.waiting))
        return bool(self.finished) and 8 * len(self.finished) >= len(self.slots)

    def compact(self) -> tuple[list[int], list[int]]:
        """Drop the finished rows and admit waiting trials into the free rows.

        Returns the cache rows to keep (indices into the current rows, in order) and the trials admitted (their
        rows follow the kept ones).
        """
        keep = [r for r, i in enumerate(self.slots) if i not in self.finished]
        self.slots = [self.slots[r] for r in keep]
        self.finished = set()
        admit = [self.waiting.popleft() for _ in range(min(self.rows - len(self.slots), len(self.waiting)))]
        self.slots += admit
        return keep, admit

    def end(self, trial: int) -> None:
        """The trace of ``trial`` ended (its row stays until the next :meth:`compact`)."""
        self.finished.add(trial)


def stacked(parts: Sequence[tuple[Any, Any, Any]], reserve: int, config: Any) -> tuple[Any, Any]:
    """One cache of the rows ``rows`` of each ``(cache, mask, rows)`` part, stacked in order, as
    :func:`engines.hf.sampling.reserve_cache` layers with room for ``reserve`` more tokens, and its mask.

    Parts narrower than the widest are padded on the left (zero keys and values, mask 0); then the columns that
    no kept row uses (mask 0 in every row, on the left) are cut. ``rows`` None keeps every row of that part.
    Only plain attention layers (``keys`` / ``values`` of shape ``(rows, heads, columns, dim)``) can be stacked:
    :func:`unstackable` says where that does not hold.
    """
    torch = require("torch", "hf")
    transformers = require("transformers", "hf")
    from engines.hf.sampling import reserved_layer_class

    masks = []
    picks = []
    for _, mask, rows in parts:
        idx = None if rows is None else torch.tensor(rows, dtype=torch.long, device=mask.device)
        picks.append(idx)
        masks.append(mask if idx is None else mask.index_select(0, idx))
    width = max(m.shape[1] for m in masks)
    mask = torch.cat([torch.nn.functional.pad(m, (width - m.shape[1], 0)) for m in masks])
    used = mask.any(0).nonzero()
    start = int(used[0]) if len(used) else 0
    mask = mask[:, start:]
    layer_cls = reserved_layer_class()
    out = transformers.DynamicCache(config=config)
    n_layers = len(parts[0][0].layers)
    for i in range(n_layers):
        keys, values = [], []
        for (cache, m, _), idx in zip(parts, picks, strict=True):
            k, v = cache.layers[i].keys, cache.layers[i].values
            if idx is not None:
                k, v = k.index_select(0, idx.to(k.device)), v.index_select(0, idx.to(v.device))
            pad = width - m.shape[1]
            keys.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
            values.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
        k = keys[0] if len(keys) == 1 else torch.cat(keys)
        v = values[0] if len(values) == 1 else torch.cat(values)
        out.layers[i] = layer_cls(k[:, :, start:], v[:, :, start:], reserve)
    return out, mask


def unstackable(config: Any) -> str | None:
    """Why the cache of a model with ``config`` cannot be stacked by :func:`stacked` (None where it can): every
    layer must be plain full attention (a recurrent state or a sliding window keeps no per-column keys to pad)."""
    transformers = require("transformers", "hf")

    kinds = {type(layer).__name__ for layer in transformers.DynamicCache(config=config).layers}
    if kinds != {"DynamicLayer"}:
        return f"it has cache layers that are not full attention ({', '.join(sorted(kinds - {'DynamicLayer'}))})"
    return None
