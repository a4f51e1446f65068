"""Decoding in steps of fixed shape (slots), captured in CUDA graphs on a GPU.

Why. On the H200 a decoding step of a random Qwen3-MoE at Qwen3-30B-A3B's widths took 7.4 ms at 16 rows and 9.8 ms
at 512, 7-9x the time to read its weights (issue 44): the step is bound by kernel launches, not by the GPU. A CUDA
graph records a step's kernels once and replays them with one launch.

What a graph needs. A replay runs the recorded kernels on the recorded memory: every shape, every address and every
number Python computed while recording is frozen. So here a step reads everything that changes from tensors at fixed
addresses, and nothing else:

* **Slots.** The cache has ``rows`` slots of ``capacity`` columns, one trace per slot, written from column 0: the
  trace's prompt (its keys and values copied from its prefill), then one column per step at the slot's own length
  (``lengths``, a tensor), which is also its next token's position. No left padding and no restacking: a finished
  trace's slot goes to the next waiting trace by copying that trace's prefill into it (:class:`SlotDecoder.admit`).
* **Spans.** A step's attention reads the first ``span`` columns of every slot, a 4-D additive mask hiding each
  slot's columns past its length; ``span`` is the smallest bucket holding the longest slot (:func:`span_of`: at most
  an eighth and 128 columns more than needed), and each span gets its own graph, recorded the first time it is needed.
* **Sizes.** Once no trace waits and at most half the computed slots are live, the live ones move to the front
  and a step computes only the smallest power of two of slots holding them (:meth:`SlotDecoder.shrink`): the
  free slots would otherwise read a whole span of keys each step, as long as the last trace runs. Each (size,
  span) gets its own graph.
* **Fixed output.** A step writes its float32 log-probs into one buffer (:attr:`SlotDecoder.out`).

The same step runs unrecorded on a CPU and wherever capture is off, so the tests of the CPU run the code a GPU
records; capture adds only :meth:`SlotDecoder._capture`, proven by the device check (``scripts/device_check.py``).

Numerics. Which traces share a step is the refilled schedule's (:class:`engines.hf.refill.Schedule`). In float32 a
trace's tokens are those of the refilled and bucketed paths, up to the rounding of sums over a different number of
columns (a masked column adds exactly zero). Outside float32 that rounding can change a token, so the schedule name
(``slots``) enters the run key (:meth:`engines.hf.HFEngine.numerics`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from engines.base import require

log = logging.getLogger(__name__)

SPAN_QUANTUM = 128
"""The smallest attention span, and the step between spans up to 8 of them."""


def span_of(columns: int, capacity: int, quantum: int = SPAN_QUANTUM) -> int:
    """The attention span of a step whose longest slot fills ``columns`` columns (the column it writes included):
    the smallest bucket >= ``columns``, capped at ``capacity``.

    Buckets are ``quantum``, 2 ``quantum``, ... up to 8 ``quantum``, then each an eighth more than the last, rounded
    up to ``quantum``: a step reads at most an eighth (and one quantum) more columns than it needs, and a budget of
    32,768 tokens has 38 spans, so 38 graphs at most.
    """
    if not 1 <= columns <= capacity:
        raise ValueError(f"columns must be in 1..capacity ({capacity}), got {columns}")
    span = quantum
    while span < columns:
        span = max(span + quantum, -(-(span * 9) // (8 * quantum)) * quantum)
    return min(span, capacity)


class _At:
    """What every layer of one slot cache reads at a step: the column each slot writes (a tensor, fixed address),
    and how many slots compute and how many columns attention reads (numbers, fixed per graph)."""

    def __init__(self, lengths: Any) -> None:
        torch = require("torch", "hf")
        self.lengths = lengths
        self.rows = torch.arange(lengths.shape[0], device=lengths.device)
        self.size = lengths.shape[0]
        self.span = 1
        self._on: dict[Any, tuple[Any, Any]] = {}

    def on(self, device: Any) -> tuple[Any, Any]:
        """``(slots, lengths)`` of the first :attr:`size` slots on ``device``: a split model's layers write where
        they live (the lengths copied each step, before the layers run: :meth:`SlotDecoder._run`)."""
        if device == self.lengths.device:
            rows, lengths = self.rows, self.lengths
        else:
            if device not in self._on:
                self._on[device] = (self.rows.to(device), self.lengths.to(device))
            rows, lengths = self._on[device]
        return rows[: self.size], lengths[: self.size]

    def sync(self) -> None:
        """Copy the lengths to the other devices' copies (a step's first work)."""
        for _, lengths in self._on.values():
            lengths.copy_(self.lengths)


@functools.cache
def _slot_layer_class() -> type:
    """:class:`SlotLayer`, defined on first use (it subclasses Transformers' ``DynamicLayer``)."""
    cache_utils = require("transformers.cache_utils", "hf")

    class SlotLayer(cache_utils.DynamicLayer):  # type: ignore[misc, name-defined]
        """An attention layer's keys and values in slots of fixed capacity: a step writes each computed slot's new
        column at that slot's length and returns the first ``span`` columns of the first ``size`` slots."""

        def __init__(self, keys: Any, values: Any, at: _At) -> None:
            super().__init__()
            self._k, self._v, self._at = keys, values, at
            self.keys, self.values = keys, values
            self.device = keys.device
            self.is_initialized = True

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            rows, cols = self._at.on(self._k.device)
            self._k[rows, :, cols] = key_states[:, :, 0]
            self._v[rows, :, cols] = value_states[:, :, 0]
            size, span = self._at.size, self._at.span
            return self._k[:size, :, :span], self._v[:size, :, :span]

        def get_seq_length(self) -> int:
            return self._at.span

        def crop(self, tokens_to_remove: int) -> None:
            raise NotImplementedError("a slot cache is never cropped")

        def reorder_cache(self, beam_idx: Any) -> None:
            raise NotImplementedError("a slot cache keeps its rows in place")

    return SlotLayer


class _Replay:
    """A ``torch.fx`` recording with a CUDA graph's ``replay``."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def replay(self) -> None:
        self._module()


class SlotDecoder:
    """The fixed state of slot decoding: the cache's slots, a step's inputs (``tokens``, ``lengths``) and output
    (``out``), and one recorded graph per (size, span) where ``capture``: ``cuda`` (CUDA graphs), ``fx`` (``torch.fx``
    recordings with the same frozen-number semantics, for tests on a CPU: :meth:`_record`) or None (unrecorded).

    ``call`` runs the model (:meth:`engines.hf.weights.Model.call`), which takes the cache as ``cache_kw``; the buffers
    are made at the first :meth:`admit`, shaped after the prefill's cache (heads, head size, dtype and device of
    each layer).
    """

    def __init__(
        self,
        call: Callable[..., Any],
        config: Any,
        rows: int,
        capacity: int,
        device: Any,
        *,
        capture: str | None,
        cache_kw: str = "past_key_values",
    ) -> None:
        torch = require("torch", "hf")
        self._call, self._config, self._cache_kw = call, config, cache_kw
        self.rows, self.capacity = rows, capacity
        self.tokens = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        self._at = _At(self.lengths)
        self.cache: Any = None
        self._dtype: Any = None
        self.out: Any = None
        self.capture = capture
        self.graphs: dict[tuple[int, int], Any] = {}
        self._pool: Any = None
        self.capture_s = 0.0
        self.failed: str | None = None
        """Why capture was given up (the steps then run unrecorded), or None."""

    @property
    def size(self) -> int:
        """Slots computed by a step: all of them, until :meth:`shrink` moves the few live ones to the front."""
        return int(self._at.size)

    def _allocate(self, like: Any) -> None:
        """Slots shaped after the prefill cache ``like`` (one per attention layer, on that layer's device)."""
        torch = require("torch", "hf")
        transformers = require("transformers", "hf")
        layer_cls = _slot_layer_class()
        cache = transformers.DynamicCache(config=self._config)
        for i, layer in enumerate(like.layers):
            _, heads, _, dim = layer.keys.shape
            shape = (self.rows, heads, self.capacity, dim)
            kw = {"dtype": layer.keys.dtype, "device": layer.keys.device}
            cache.layers[i] = layer_cls(torch.zeros(shape, **kw), torch.zeros(shape, **kw), self._at)
        self.cache = cache
        self._dtype = like.layers[0].keys.dtype

    def admit(self, slot: int, prefill: Any, row: int, length: int, token: int) -> None:
        """Give ``slot`` a new trace: its prompt of ``length`` tokens is row ``row`` of the left-padded ``prefill``
        cache (its last ``length`` columns), and ``token`` (drawn from that prefill) is its next input."""
        if self.cache is None:
            self._allocate(prefill)
        if length >= self.capacity:
            raise ValueError(f"a prompt of {length} tokens does not fit a slot of {self.capacity} columns")
        for mine, theirs in zip(self.cache.layers, prefill.layers, strict=True):
            mine._k[slot, :, :length] = theirs.keys[row, :, -length:]
            mine._v[slot, :, :length] = theirs.values[row, :, -length:]
        self.lengths[slot] = length
        self.tokens[slot, 0] = token

    def set_inputs(self, tokens: list[int], lengths: list[int]) -> None:
        """The next step's input token and length of every slot (host lists of ``rows`` numbers)."""
        torch = require("torch", "hf")
        both = torch.tensor([tokens, lengths], dtype=torch.long)
        self.tokens[:, 0].copy_(both[0])
        self.lengths.copy_(both[1])

    def shrink(self, slots: list[int], used: int) -> int:
        """Move the slots ``slots`` (their first ``used`` columns, tokens and lengths) to the front, in this order,
        and from now on compute only the first ``size`` slots, the smallest power of two holding them: with no
        trace waiting, a step then reads the keys of the live traces, not of every slot. In place (the recorded
        graphs keep their addresses); returns the new size."""
        torch = require("torch", "hf")
        n = len(slots)
        if not 1 <= n <= self.size or used > self.capacity:
            raise ValueError(f"cannot keep {n} slots of {self.size} ({used} columns of {self.capacity})")
        idx = torch.tensor(slots, device=self.lengths.device)
        for layer in self.cache.layers:
            here = idx.to(layer._k.device)
            layer._k[:n, :, :used] = layer._k[:, :, :used].index_select(0, here)
            layer._v[:n, :, :used] = layer._v[:, :, :used].index_select(0, here)
        self.tokens[:n] = self.tokens.index_select(0, idx)
        self.lengths[:n] = self.lengths.index_select(0, idx)
        self._at.size = 1 << (n - 1).bit_length()
        return self.size

    def step(self, span: int) -> Any:
        """One decoding step over the first :attr:`size` slots, attention reading ``span`` columns: their
        ``(size, vocab)`` float32 log-probs in the first rows of :attr:`out` (overwritten by the next step).
        Recorded once per (size, span) where ``capture``."""
        if not 1 <= span <= self.capacity:
            raise ValueError(f"span must be in 1..capacity ({self.capacity}), got {span}")
        if not self.capture:
            self._run(span)
            return self.out
        graph = self.graphs.get((self.size, span))
        if graph is None:
            t0 = time.perf_counter()
            graph = self._capture(span) if self.capture == "cuda" else self._record(span)
            self.capture_s += time.perf_counter() - t0
            if graph is None:  # capture failed: this step ran unrecorded, and so will the rest
                return self.out
            self.graphs[self.size, span] = graph
        self._at.span = span
        graph.replay()
        return self.out

    def _run(self, span: int) -> None:
        """The step itself: every tensor it reads or writes lives at a fixed address; ``span`` is its only number."""
        torch = require("torch", "hf")
        at, size = self._at, self.size
        at.span = span
        at.sync()
        dev = self.lengths.device
        lengths = self.lengths[:size]
        allowed = torch.arange(span, device=dev)[None, :] <= lengths[:, None]
        mask = torch.zeros((size, 1, 1, span), dtype=self._dtype, device=dev)
        mask.masked_fill_(~allowed[:, None, None, :], torch.finfo(self._dtype).min)
        out = self._call(
            input_ids=self.tokens[:size],
            attention_mask=mask,
            position_ids=lengths[:, None],
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: self.cache},
        )
        lp = torch.log_softmax(out.logits[:, -1, :].float(), dim=-1)
        if self.out is None:
            self.out = lp.new_empty((self.rows, lp.shape[-1]))
        self.out[:size].copy_(lp)

    def _record(self, span: int) -> Any:
        """The step at ``span`` recorded by ``torch.fx`` instead of CUDA (``capture="fx"``, for CPU tests): like a
        CUDA graph, the recording replays its operations on the tensors it saw, and every number Python computed
        while recording is frozen in it, so a step that reads a changing value as a Python number (rather than from
        its tensors) replays wrongly here as it would on a GPU. The warm-up performs the step."""
        from torch.fx.experimental.proxy_tensor import make_fx

        self._run(span)  # the warm-up: makes ``out``, as the CUDA warm-up does
        return _Replay(make_fx(lambda: self._run(span), tracing_mode="real")())

    def _capture(self, span: int) -> Any:
        """Record the step at ``span`` (after a warm-up on a side stream, which also performs this step: a step is
        idempotent, rewriting the same column from the same inputs). None, and capture off, where recording fails."""
        torch = require("torch", "hf")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._run(span)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                self._run(span)
        except Exception as e:  # any capture failure leaves the (already performed) step unrecorded
            torch.cuda.synchronize()
            self.capture, self.failed = None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log.warning("CUDA graph capture failed (%s); decoding goes on without graphs", self.failed)
            return None
        if self._pool is None:
            self._pool = graph.pool()
        return graph
