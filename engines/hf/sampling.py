"""The pieces of fast, seeded sampling for the Transformers engine (:meth:`engines.hf.HFEngine.sample`).

Each piece is small and separately tested:

* :class:`ReservedLayer`: an attention KV cache layer with room reserved for
  the reply, so a decoding step writes one column instead of copying the
  whole cache (Transformers' ``DynamicLayer`` concatenates, which on a CPU
  cost a quarter of each decoding step).
* :func:`gather_tree_cache`: the KV cache of a packed token tree (every shared
  prompt prefix computed once, :func:`engines.hf.tokens.pack_tree`) turned into one
  left-padded row per prompt, each row repeated once per draw.
* :class:`RowSampler`: one generator per (trial, draw), seeded from
  (seed, trial id, draw), and inverse-CDF sampling over the raw distribution
  for all rows at once. A draw depends on its own seed and logits only, never
  on what else is in the batch.

No torch at import time: the engine imports this module lazily.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from typing import Any

from engines.base import require


@functools.cache
def _buffered_layer_class() -> type:
    """:class:`BufferedLayer`, defined on first use (it subclasses Transformers' ``DynamicLayer``)."""
    torch = require("torch", "hf")
    cache_utils = require("transformers.cache_utils", "hf")

    class BufferedLayer(cache_utils.DynamicLayer):  # type: ignore[misc, name-defined]
        """A ``DynamicLayer`` whose keys and values live in buffers ``_k`` / ``_v`` with room after the given ones.

        ``keys`` / ``values`` are views of the filled columns (the subclass's
        ``_views`` says which), so everything that reads a ``DynamicLayer``
        reads this one the same way. ``zeros``: the room is zero-filled (for
        columns that attention reads, masked, before they are written),
        else left uninitialized.
        """

        def __init__(self, keys: Any, values: Any, columns: int, *, zeros: bool) -> None:
            super().__init__()
            rows, heads, length, dim = keys.shape
            self._zeros = zeros
            self._k = self._room(keys, (rows, heads, columns, dim))
            self._v = self._room(values, (rows, heads, columns, values.shape[-1]))
            self._k[:, :, :length] = keys
            self._v[:, :, :length] = values
            self.device = keys.device
            self.is_initialized = True

        def _room(self, like: Any, shape: tuple[int, ...]) -> Any:
            return like.new_zeros(shape) if self._zeros else like.new_empty(shape)

        def _views(self) -> None:
            raise NotImplementedError

        def _grow(self, columns: int) -> None:
            """``columns`` more columns of room, past the reserve (never wrong, only slower)."""
            self._k = torch.cat([self._k, self._room(self._k, (*self._k.shape[:2], columns, self._k.shape[-1]))], 2)
            self._v = torch.cat([self._v, self._room(self._v, (*self._v.shape[:2], columns, self._v.shape[-1]))], 2)

        def _keep_rows(self, rows: Any) -> None:
            self._k = self._k.index_select(0, rows.to(self._k.device))
            self._v = self._v.index_select(0, rows.to(self._v.device))
            self._views()

        def batch_select_indices(self, indices: Any) -> None:
            self.reorder_cache(indices)

        def crop(self, tokens_to_remove: int) -> None:
            raise NotImplementedError(f"a {type(self).__name__} is never cropped (probe's sampler does not need it)")

    return BufferedLayer


@functools.cache
def reserved_layer_class() -> type:
    """:class:`ReservedLayer`, defined on first use (it subclasses Transformers' ``DynamicLayer``)."""

    class ReservedLayer(_buffered_layer_class()):  # type: ignore[misc]
        """A ``DynamicLayer`` whose keys and values live in buffers with room for ``reserve`` more tokens.

        ``keys`` / ``values`` are views of the filled columns, so everything
        that reads a ``DynamicLayer`` reads this one the same way. Writing past
        the reserve falls back to growing the buffers (never wrong, only slower).
        """

        _k: Any
        _v: Any

        def __init__(self, keys: Any, values: Any, reserve: int) -> None:
            super().__init__(keys, values, keys.shape[-2] + reserve, zeros=False)
            self._len = keys.shape[-2]
            self._views()

        def _views(self) -> None:
            self.keys = self._k[:, :, : self._len]
            self.values = self._v[:, :, : self._len]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            n = key_states.shape[-2]
            if self._len + n > self._k.shape[-2]:  # past the reserve: grow (amortized doubling)
                self._grow(max(n, self._k.shape[-2]))
            self._k[:, :, self._len : self._len + n] = key_states
            self._v[:, :, self._len : self._len + n] = value_states
            self._len += n
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self._len

        def reorder_cache(self, beam_idx: Any) -> None:
            self._keep_rows(beam_idx)

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._views()

    return ReservedLayer


def reserve_cache(cache: Any, reserve: int) -> Any:
    """Give every plain attention layer of ``cache`` room for ``reserve`` more tokens (other layers are untouched).

    Recurrent (Mamba) layers keep a fixed-size state and need nothing.
    """
    cache_utils = require("transformers.cache_utils", "hf")
    layer_cls = reserved_layer_class()
    for i, layer in enumerate(cache.layers):
        if type(layer) is cache_utils.DynamicLayer and layer.is_initialized and layer.get_seq_length() > 0:
            cache.layers[i] = layer_cls(layer.keys, layer.values, reserve)
    return cache


def gather_tree_cache(
    caches: Sequence[Any],
    paths: Sequence[Sequence[Sequence[int]]],
    repeats: int,
    reserve: int,
    config: Any,
    *,
    grouped: bool = False,
) -> tuple[Any, Any]:
    """One left-padded cache row per path, each repeated ``repeats`` times, from the caches of packed token trees.

    ``caches[t]`` holds the keys and values of tree t (batch size 1, one
    column per node); ``paths[t]`` lists, per prompt of that tree, its nodes
    root first. Rows come out tree by tree, prompt by prompt. Returns a new
    ``DynamicCache`` of :class:`ReservedLayer` layers with room for
    ``reserve`` more tokens, and the matching ``(rows, width)`` attention mask
    (0 on the left padding, whose columns hold some node's keys, hidden by
    the mask). ``grouped``: the layers are :class:`SharedPromptLayer` s
    holding each path once for its ``repeats`` draws (the mask still has one
    row per draw, for the positions).
    """
    torch = require("torch", "hf")
    transformers = require("transformers", "hf")
    layer_cls = reserved_layer_class()
    dev = caches[0].layers[0].keys.device
    offsets = [0]
    for c in caches[:-1]:
        offsets.append(offsets[-1] + c.layers[0].keys.shape[-2])
    flat_paths = [[off + i for i in p] for off, ps in zip(offsets, paths, strict=True) for p in ps]
    width = max(len(p) for p in flat_paths)
    index = torch.zeros((len(flat_paths), width), dtype=torch.long)
    mask = torch.zeros((len(flat_paths), width), dtype=torch.long)
    for r, p in enumerate(flat_paths):
        index[r, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[r, width - len(p) :] = 1
    groups = Groups(mask.to(dev), repeats, len(caches[0].layers)) if grouped else None
    index = index if grouped else index.repeat_interleave(repeats, dim=0)
    mask = mask.repeat_interleave(repeats, dim=0).to(dev)
    flat = OnDevice(index.reshape(-1))  # a split model's layers live on several devices: one copy per device
    out = transformers.DynamicCache(config=config)
    shared_cls = shared_prompt_layer_class() if grouped else None
    for i in range(len(caches[0].layers)):
        keys = [c.layers[i].keys[0] for c in caches]  # (heads, nodes, dim) per tree
        values = [c.layers[i].values[0] for c in caches]
        k = keys[0] if len(keys) == 1 else torch.cat(keys, 1)
        v = values[0] if len(values) == 1 else torch.cat(values, 1)
        k, v = k.index_select(1, flat.on(k.device)), v.index_select(1, flat.on(v.device))
        heads = k.shape[0]
        k = k.reshape(heads, len(index), width, -1).transpose(0, 1)
        v = v.reshape(heads, len(index), width, -1).transpose(0, 1)
        out.layers[i] = shared_cls(k, v, groups, reserve, i) if shared_cls else layer_cls(k, v, reserve)
    return out, mask


class OnDevice:
    """One tensor (an index, a mask) and its copies on each device it has been asked for, each made once.

    The layers of a model split over devices keep their caches where they compute, and torch refuses to index
    a tensor with an index that lives on another device; every layer asks for its own device's copy.
    """

    def __init__(self, tensor: Any) -> None:
        self._copies = {tensor.device: tensor}

    def on(self, device: Any) -> Any:
        if device not in self._copies:
            self._copies[device] = next(iter(self._copies.values())).to(device)
        return self._copies[device]


def truncated(scaled: Any, top_k: int, top_p: float) -> Any:
    """``scaled`` logits ``(rows, vocab)`` with every token outside the top-k and outside the top-p nucleus set to
    -inf (Transformers' order: temperature, then top-k, then top-p; the most likely token always stays)."""
    torch = require("torch", "hf")
    out = scaled
    if top_k and top_k < out.shape[-1]:
        kth = torch.topk(out, top_k, dim=-1).values[:, -1:]
        out = out.masked_fill(out < kth, -math.inf)
    if top_p < 1:
        ordered, order = torch.sort(out, dim=-1, descending=True)
        probs = torch.softmax(ordered.float(), dim=-1)
        drop = (probs.cumsum(-1) - probs) >= top_p  # the mass before a token already reaches top_p
        drop[:, 0] = False
        out = out.scatter(-1, order, ordered.masked_fill(drop, -math.inf))
    return out


class RowSampler:
    """Seeded raw sampling for a batch of rows, each row with its own generator.

    ``seeds[r]`` seeds row r's generator, which draws one uniform per step;
    the token is the first whose cumulative weight (summed in float64)
    reaches ``u`` times the total, i.e. inverse-CDF sampling from
    ``softmax(logprobs / temperature)`` with no top-k, top-p or other
    processor. At temperature 0 the row takes the argmax (no draw). Rows can
    be dropped (:meth:`keep`) without changing what the others draw.
    """

    def __init__(self, seeds: Sequence[int], temperature: float, *, top_p: float = 1.0, top_k: int = 0) -> None:
        torch = require("torch", "hf")
        self.temperature = temperature
        self.top_p, self.top_k = top_p, top_k
        # CPU generators whatever the model's device: the same seed gives the same uniforms on every machine
        self._gens = [torch.Generator(device="cpu").manual_seed(int(s)) for s in seeds] if temperature > 0 else []

    def draw(self, logprobs: Any) -> Any:
        """One token id per row (a 1-D long tensor) from float32 log-probabilities ``(rows, vocab)``."""
        torch = require("torch", "hf")
        if self.temperature == 0:
            return logprobs.argmax(-1)
        u = torch.cat([torch.rand(1, dtype=torch.float64, generator=g) for g in self._gens]).to(logprobs.device)
        scaled = logprobs if self.temperature == 1 else logprobs / self.temperature
        if self.top_k or self.top_p < 1:
            scaled = truncated(scaled, self.top_k, self.top_p)
        weights = (scaled - scaled.amax(-1, keepdim=True)).exp_()  # unnormalized: the total is cdf[:, -1]
        cdf = weights.double().cumsum_(-1)
        target = (u * cdf[:, -1]).unsqueeze(-1)
        return torch.searchsorted(cdf, target).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only these rows (in this order)."""
        if self._gens:
            self._gens = [self._gens[r] for r in rows]

    def extend(self, other: RowSampler) -> None:
        """Add ``other``'s rows after these (a refill admitting trials: :mod:`engines.hf.refill`); each row keeps its
        own generator, so what a row draws does not depend on which rows it shares a step with."""
        self._gens = self._gens + other._gens


# ----------------------------------------------------------------------------------------------------------------------
# Grouped attention: the draws of one prompt read its cached keys once per step.
#
# A decoding batch holds n draws of each prompt. With one cache row per draw, every step reads each prompt's keys and
# values n times, and on a CPU that read (memory-bound) was a third of a 128-row step. A SharedPromptLayer keeps each
# prompt's keys once, followed by its draws' reply columns, and the attention below asks the n draws' queries of a prompt
# together: one (n * heads-per-kv-head) x (prompt + replies) attention per prompt and key head, with a mask that shows
# each draw the prompt (not its padding) and its own reply. The softmax runs over exactly the keys a per-draw cache row
# holds, so the result is the same attention up to float rounding.

GROUPED_ATTENTION = "probe_grouped"
"""The attention implementation name the engine sets on the model while it decodes grouped draws."""

_pending = threading.local()


class Groups:
    """What the layers of one grouped cache share: which prompt and draw slot each live row is, and the step masks."""

    def __init__(self, prompt_mask: Any, n: int, n_layers: int) -> None:
        torch = require("torch", "hf")
        self.prompt_mask = prompt_mask.bool()  # (prompts, width): False on the left padding
        self.n = n
        self.n_layers = n_layers
        rows = torch.arange(prompt_mask.shape[0] * n, device=prompt_mask.device)
        self.group, self.slot = rows // n, rows % n
        self.full = True
        """Every draw of every prompt still live, in (prompt, slot) order: rows map to columns by a reshape."""
        self._masks: dict[tuple[int, Any, Any], Any] = {}
        self._rows: dict[Any, tuple[Any, Any]] = {}
        self._applying: Any = None
        self._left = 0
        self._keep: Any = None

    def select(self, idx: Any) -> Any:
        """Keep the live rows ``idx`` (called by every layer with the same index); the prompts still drawn, or None."""
        torch = require("torch", "hf")
        if self._applying is None:
            idx = idx.to(self.group.device)
            group, slot = self.group[idx], self.slot[idx]
            used = torch.unique(group)  # sorted
            self._keep = None
            if len(used) < self.prompt_mask.shape[0]:
                self._keep = used
                self.prompt_mask = self.prompt_mask[used]
                group = torch.searchsorted(used, group)
            self.group, self.slot = group, slot
            self._rows = {}
            order = torch.arange(len(group), device=group.device)
            self.full = len(group) == self.prompt_mask.shape[0] * self.n and bool(
                (group * self.n + slot == order).all()
            )
            self._masks.clear()
            self._applying, self._left = idx, self.n_layers
        self._left -= 1
        keep = self._keep
        if self._left == 0:
            self._applying = None
        return keep

    def rows_on(self, device: Any) -> tuple[Any, Any]:
        """``(group, slot)`` of the live rows on ``device`` (a split model's layers index their caches there)."""
        if device not in self._rows:
            self._rows[device] = (self.group.to(device), self.slot.to(device))
        return self._rows[device]

    def mask(self, steps: int, dtype: Any, heads_per_kv: int, device: Any) -> Any:
        """The additive mask ``(prompts, 1, n * heads_per_kv, width + steps * n)`` of the grouped queries, on
        ``device`` (built once per step on the first layer's device, copied once to each other device)."""
        key = (steps, dtype, device)
        if key not in self._masks:
            first = next((m for (st, dt, _), m in self._masks.items() if st == steps and dt == dtype), None)
            if first is not None:
                self._masks[key] = first.to(device)
                return self._masks[key]
            torch = require("torch", "hf")
            n, dev = self.n, self.prompt_mask.device
            q_slot = torch.arange(n * heads_per_kv, device=dev) // heads_per_kv
            own = (torch.arange(steps * n, device=dev) % n)[None, :] == q_slot[:, None]  # reply column of my draw
            prompts, width = self.prompt_mask.shape
            seen = torch.cat(
                [self.prompt_mask[:, None, :].expand(prompts, n * heads_per_kv, width), own.expand(prompts, -1, -1)], -1
            )
            add = torch.zeros(seen.shape, dtype=dtype, device=dev).masked_fill_(~seen, torch.finfo(dtype).min)
            self._masks = {key: add[:, None].to(device)}
        return self._masks[key]


@functools.cache
def shared_prompt_layer_class() -> type:
    """:class:`SharedPromptLayer`, defined on first use (it subclasses Transformers' ``DynamicLayer``)."""

    class SharedPromptLayer(_buffered_layer_class()):  # type: ignore[misc]
        """One attention layer's cache of ``n`` draws per prompt: each prompt's keys once, then its draws' replies.

        Columns ``[0, width)`` hold the prompt (left-padded), and step t of
        draw slot s is column ``width + t * n + s``, so the filled columns are
        always a prefix and ``keys`` / ``values`` are views of it, one row per
        prompt. Rows are live draws; :meth:`reorder_cache` keeps some of them
        (a prompt whose draws have all ended leaves the buffers).
        """

        def __init__(self, keys: Any, values: Any, groups: Groups, reserve: int, layer_idx: int) -> None:
            width = keys.shape[-2]
            # zeros, not empty: a column not yet written is masked, but NaN garbage would survive the mask
            super().__init__(keys, values, width + groups.n * reserve, zeros=True)
            self.groups, self.width, self.steps, self.layer_idx = groups, width, 0, layer_idx
            self._views()

        def _views(self) -> None:
            end = self.width + self.steps * self.groups.n
            self.keys = self._k[:, :, :end]
            self.values = self._v[:, :, :end]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if key_states.shape[-2] != 1:
                raise RuntimeError("a SharedPromptLayer decodes one token per step")
            g = self.groups
            col = self.width + self.steps * g.n
            if col + g.n > self._k.shape[-2]:  # past the reserve: grow (amortized doubling)
                self._grow(max(g.n, self._k.shape[-2] - self.width))
            if g.full:  # rows are (prompt, slot) in order: one block write
                prompts, heads = self._k.shape[:2]
                self._k[:, :, col : col + g.n] = key_states[:, :, 0].reshape(prompts, g.n, heads, -1).transpose(1, 2)
                self._v[:, :, col : col + g.n] = value_states[:, :, 0].reshape(prompts, g.n, heads, -1).transpose(1, 2)
            else:
                group, slot = g.rows_on(self._k.device)
                self._k[group, :, col + slot] = key_states[:, :, 0]
                self._v[group, :, col + slot] = value_states[:, :, 0]
            self.steps += 1
            self._views()
            _pending.layer = self
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.width + self.steps  # what one draw's own cache row would hold

        def reorder_cache(self, beam_idx: Any) -> None:
            keep = self.groups.select(beam_idx)
            if keep is not None:
                self._keep_rows(keep)

        def batch_repeat_interleave(self, repeats: int) -> None:
            raise NotImplementedError("a SharedPromptLayer is never repeated (its draws are its rows already)")

    return SharedPromptLayer


def group_cache(cache: Any, prompt_mask: Any, n: int, reserve: int) -> Any:
    """Turn a cache of one row per prompt into one of ``n`` draws per prompt, grouped (see :class:`SharedPromptLayer`).

    Plain attention layers become SharedPromptLayers; every other layer (a
    recurrent state, or a placeholder) gets its rows repeated ``n`` times.
    Returns None, leaving ``cache`` as it was, when some attention layer is of
    another kind (a sliding window, say): the caller then repeats rows instead.
    """
    torch = require("torch", "hf")
    cache_utils = require("transformers.cache_utils", "hf")
    attention = [i for i, layer in enumerate(cache.layers) if isinstance(layer, cache_utils.DynamicLayer)]
    if not attention or any(type(cache.layers[i]) is not cache_utils.DynamicLayer for i in attention):
        return None
    groups = Groups(prompt_mask, n, len(attention))
    cls = shared_prompt_layer_class()
    idx = torch.arange(prompt_mask.shape[0], device=prompt_mask.device).repeat_interleave(n)
    for i, layer in enumerate(cache.layers):
        if i in attention:
            cache.layers[i] = cls(layer.keys, layer.values, groups, reserve, i)
        else:
            layer.reorder_cache(idx)
    return cache


def grouped_attention(
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None, **kwargs: Any
) -> tuple[Any, None]:
    """The attention of a layer whose cache is a :class:`SharedPromptLayer` (registered as ``GROUPED_ATTENTION``).

    ``query`` is ``(live draws, heads, 1, dim)``; ``key`` / ``value`` are the
    layer's prompt-grouped views. Returns ``(live draws, 1, heads, dim)``, as
    Transformers' attention functions do.
    """
    torch = require("torch", "hf")
    layer = getattr(_pending, "layer", None)
    _pending.layer = None
    if layer is None or layer.layer_idx != getattr(module, "layer_idx", layer.layer_idx):
        raise RuntimeError(
            f"grouped attention reached layer {getattr(module, 'layer_idx', '?')} without its SharedPromptLayer; "
            "sample with --hf-no-group-draws (HFSettings(group_draws=False)) for this model"
        )
    g = layer.groups
    rows, heads, q_len, dim = query.shape
    if q_len != 1:
        raise RuntimeError("grouped attention decodes one token per step")
    kv_heads = key.shape[1]
    per = heads // kv_heads
    prompts = key.shape[0]
    if g.full:  # rows are (prompt, slot) in order
        grouped = query.reshape(prompts, g.n, kv_heads, per, dim)
    else:  # some draws have left: their slots hold zeros, whose outputs are dropped
        group, slot = g.rows_on(query.device)
        grouped = query.new_zeros((prompts, g.n, kv_heads, per, dim))
        grouped[group, slot] = query.reshape(rows, kv_heads, per, dim)
    grouped = grouped.transpose(1, 2).reshape(prompts, kv_heads, g.n * per, dim)
    mask = g.mask(layer.steps, query.dtype, per, query.device)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scaling)
    out = out.reshape(prompts, kv_heads, g.n, per, value.shape[-1]).transpose(1, 2)
    out = out.reshape(rows, kv_heads, per, -1) if g.full else out[g.rows_on(out.device)]
    return out.reshape(rows, 1, heads, value.shape[-1]), None


def register_grouped_attention() -> None:
    """Make ``GROUPED_ATTENTION`` a known Transformers attention implementation (idempotent)."""
    modeling_utils = require("transformers.modeling_utils", "hf")
    modeling_utils.AttentionInterface.register(GROUPED_ATTENTION, grouped_attention)
