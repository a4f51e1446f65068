"""The pieces of fast, seeded sampling for the Transformers engine (:meth:`engines.hf.HFEngine.sample`).

Each piece is small and separately tested:

* :class:`ReservedLayer`: an attention KV cache layer with room reserved for
  the reply, so a decoding step writes one column instead of copying the
  whole cache (Transformers' ``DynamicLayer`` concatenates, which on a CPU
  cost a quarter of each decoding step).
* :func:`gather_tree_cache`: the KV cache of a packed token tree (every shared
  prompt prefix computed once, :func:`engines.hf.pack_tree`) turned into one
  left-padded row per prompt, each row repeated once per draw.
* :class:`RowSampler`: one generator per (trial, draw), seeded from
  (seed, trial id, draw), and inverse-CDF sampling over the raw distribution
  for all rows at once. A draw depends on its own seed and logits only, never
  on what else is in the batch.

No torch at import time: the engine imports this module lazily.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engines.base import require


def reserved_layer_class() -> type:
    """:class:`ReservedLayer`, defined on first use (it subclasses Transformers' ``DynamicLayer``)."""
    global _RESERVED
    if _RESERVED is None:
        _RESERVED = _define_reserved()
    return _RESERVED


_RESERVED: type | None = None


def _define_reserved() -> type:
    torch = require("torch", "hf")
    cache_utils = require("transformers.cache_utils", "hf")

    class ReservedLayer(cache_utils.DynamicLayer):  # type: ignore[misc, name-defined]
        """A ``DynamicLayer`` whose keys and values live in buffers with room for ``reserve`` more tokens.

        ``keys`` / ``values`` are views of the filled columns, so everything
        that reads a ``DynamicLayer`` reads this one the same way. Writing past
        the reserve falls back to growing the buffers (never wrong, only slower).
        """

        def __init__(self, keys: Any, values: Any, reserve: int) -> None:
            super().__init__()
            rows, heads, length, dim = keys.shape
            self._k = keys.new_empty((rows, heads, length + reserve, dim))
            self._v = values.new_empty((rows, heads, length + reserve, values.shape[-1]))
            self._k[:, :, :length] = keys
            self._v[:, :, :length] = values
            self._len = length
            self.device = keys.device
            self.is_initialized = True
            self._views()

        def _views(self) -> None:
            self.keys = self._k[:, :, : self._len]
            self.values = self._v[:, :, : self._len]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            n = key_states.shape[-2]
            if self._len + n > self._k.shape[-2]:  # past the reserve: grow (amortized doubling)
                grow = max(n, self._k.shape[-2])
                self._k = torch.cat([self._k, self._k.new_empty((*self._k.shape[:2], grow, self._k.shape[-1]))], 2)
                self._v = torch.cat([self._v, self._v.new_empty((*self._v.shape[:2], grow, self._v.shape[-1]))], 2)
            self._k[:, :, self._len : self._len + n] = key_states
            self._v[:, :, self._len : self._len + n] = value_states
            self._len += n
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self._len

        def reorder_cache(self, beam_idx: Any) -> None:
            self._k = self._k.index_select(0, beam_idx.to(self._k.device))
            self._v = self._v.index_select(0, beam_idx.to(self._v.device))
            self._views()

        def batch_select_indices(self, indices: Any) -> None:
            self.reorder_cache(indices)

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._views()

        def crop(self, tokens_to_remove: int) -> None:
            raise NotImplementedError("a ReservedLayer is never cropped (probe's sampler does not need it)")

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
    caches: Sequence[Any], paths: Sequence[Sequence[Sequence[int]]], repeats: int, reserve: int, config: Any
) -> tuple[Any, Any]:
    """One left-padded cache row per path, each repeated ``repeats`` times, from the caches of packed token trees.

    ``caches[t]`` holds the keys and values of tree t (batch size 1, one
    column per node); ``paths[t]`` lists, per prompt of that tree, its nodes
    root first. Rows come out tree by tree, prompt by prompt. Returns a new
    ``DynamicCache`` of :class:`ReservedLayer` layers with room for
    ``reserve`` more tokens, and the matching ``(rows, width)`` attention mask
    (0 on the left padding, whose columns hold some node's keys, hidden by
    the mask).
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
    index = index.repeat_interleave(repeats, dim=0).to(dev)
    mask = mask.repeat_interleave(repeats, dim=0).to(dev)
    flat = index.reshape(-1)
    out = transformers.DynamicCache(config=config)
    for i in range(len(caches[0].layers)):
        keys = [c.layers[i].keys[0] for c in caches]  # (heads, nodes, dim) per tree
        values = [c.layers[i].values[0] for c in caches]
        k = (keys[0] if len(keys) == 1 else torch.cat(keys, 1)).index_select(1, flat)
        v = (values[0] if len(values) == 1 else torch.cat(values, 1)).index_select(1, flat)
        heads = k.shape[0]
        k = k.reshape(heads, len(index), width, -1).transpose(0, 1)
        v = v.reshape(heads, len(index), width, -1).transpose(0, 1)
        out.layers[i] = layer_cls(k, v, reserve)
    return out, mask


class RowSampler:
    """Seeded raw sampling for a batch of rows, each row with its own generator.

    ``seeds[r]`` seeds row r's generator, which draws one uniform per step;
    the token is the first whose cumulative weight (summed in float64)
    reaches ``u`` times the total, i.e. inverse-CDF sampling from
    ``softmax(logprobs / temperature)`` with no top-k, top-p or other
    processor. At temperature 0 the row takes the argmax (no draw). Rows can
    be dropped (:meth:`keep`) without changing what the others draw.
    """

    def __init__(self, seeds: Sequence[int], temperature: float) -> None:
        torch = require("torch", "hf")
        self.temperature = temperature
        # CPU generators whatever the model's device: the same seed gives the same uniforms on every machine
        self._gens = [torch.Generator(device="cpu").manual_seed(int(s)) for s in seeds] if temperature > 0 else []

    def draw(self, logprobs: Any) -> Any:
        """One token id per row (a 1-D long tensor) from float32 log-probabilities ``(rows, vocab)``."""
        torch = require("torch", "hf")
        if self.temperature == 0:
            return logprobs.argmax(-1)
        u = torch.cat([torch.rand(1, dtype=torch.float64, generator=g) for g in self._gens]).to(logprobs.device)
        scaled = logprobs if self.temperature == 1 else logprobs / self.temperature
        weights = (scaled - scaled.amax(-1, keepdim=True)).exp_()  # unnormalized: the total is cdf[:, -1]
        cdf = weights.double().cumsum_(-1)
        target = (u * cdf[:, -1]).unsqueeze(-1)
        return torch.searchsorted(cdf, target).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only these rows (in this order)."""
        if self._gens:
            self._gens = [self._gens[r] for r in rows]
