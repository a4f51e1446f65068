"""The readout part of the Transformers engine: answer-slot distributions through the token trie.

Owns: :class:`Reader` (the readout path, batching, the three paths, trie expansion, the top other tokens and their
texts) and :class:`KeptTrees` (the tree path's caches kept for the draws that follow). May import:
:mod:`engines.hf.settings`, :mod:`engines.hf.tokens`, :mod:`engines.hf.weights` (the :class:`Model` it is handed),
:mod:`engines.base`, :mod:`engines.local`, :mod:`engines.trie`, :mod:`probe.types`; torch lazily. Not the
reasoning or sampling parts: think mode's traces come in with the prepared trials.

Each shared token once: a battery asks the same story under many forms, so most prompt tokens are shared. Three
readout paths compute the same values (in float32 within 3.2e-5 nats on smol's 30 layers, 5e-6 on the tiny
models; in bfloat16 they differ by up to 0.25 nats on smol, docs/gpu.md) and differ only in how much they share:

- ``tree`` (attention-only models): a batch's prompts *and* option prefixes are packed as one token tree
  (:func:`engines.hf.tokens.pack_tree`), each distinct prefix once, and run in one forward pass with a tree-shaped
  attention mask (:func:`engines.hf.tokens.tree_mask`: a token sees its ancestors and itself) and position ids
  equal to the depth, so every token is computed exactly as at the end of its own sequence. No KV cache, no
  padding, no Python loop per token.
- ``branch`` (any model, Mamba hybrids included): trials that share a prefix run it once
  (:func:`engines.hf.tokens.prefix_groups`); its cache is gathered into one row per trial
  (``Cache.reorder_cache``, the beam-search primitive that attention and Mamba caches implement), the suffixes of
  equal length run together (no padding between prefix and suffix, which a recurrent state would see), and the
  trie is expanded one token per step on that cache.
- ``plain``: every prompt whole, then the trie one token per step (the reference the others are tested against).

The positions a readout reads are normalized in float64 (:func:`engines.hf.weights.readout_log_probs`).

With ``--layers`` each forward of a path runs under the lens's hooks (:class:`engines.hf.lens.Lens`), which keep
the residual stream at the rows that forward reads, and the conditionals are gathered at every layer read from
the same rows and scored by the same trie (:class:`LayerConditionals`), so every path reads the same layers.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from engines.base import ProgressFn, require
from engines.batching import length_batches
from engines.hf.lens import Lens, Taps, last_rows, tree_rows
from engines.hf.settings import HFSettings
from engines.hf.tokens import pack_tree, prefix_groups, shared_prefix_lengths, token_rows, tree_paths
from engines.hf.weights import Model, readout_log_probs
from engines.local import Prepared, layer_readout, slot_readout
from engines.trie import Prefix, Trie, build_trie, option_logprobs
from probe.types import LayerReadout, Readout, Trial


class KeptTrees:
    """The tree readout's KV caches of the prompts the next ``sample()`` draws from, handed from the reader to the
    sampler (:meth:`engines.hf.HFEngine.sample_next`; speed only: the draws start from them instead of computing
    the prompts again)."""

    def __init__(self) -> None:
        self.expected: set[tuple[int, ...]] = set()
        """The prompts the next ``sample()`` will draw from."""
        self.kept: dict[tuple[int, ...], tuple[Any, list[int], Any]] = {}
        """prompt -> (its tree's cache, its path of nodes in the tree, its float32 log-probs at the slot)."""

    def expect(self, prompts: set[tuple[int, ...]]) -> None:
        """The next readout keeps the trees of these prompts."""
        self.expected = prompts

    def reading(self, *, tree: bool) -> None:
        """A readout begins: what an earlier one kept is dropped, and off the tree path nothing is kept."""
        self.kept = {}
        if not tree:
            self.expected = set()

    def take(self) -> dict[tuple[int, ...], tuple[Any, list[int], Any]]:
        """What the last readout kept, handed over once (a sample begins: nothing stays expected)."""
        kept, self.kept, self.expected = self.kept, {}, set()
        return kept


def ask_index(asks: Sequence[tuple[int, int, Prefix]], tries: Sequence[Trie]) -> tuple[list[int], list[int]]:
    """The (row, token) pairs a gather of the conditionals reads: each ask's row, once per child of its node."""
    rows = [r for r, b, node in asks for _ in tries[b][node]]
    toks = [t for _, b, node in asks for t in tries[b][node]]
    return rows, toks


def spread(
    vals: Sequence[float], asks: Sequence[tuple[int, int, Prefix]], tries: Sequence[Trie]
) -> list[dict[Prefix, dict[int, float]]]:
    """``cond[b][node][t]`` from the values gathered at :func:`ask_index`'s pairs, in its order."""
    cond: list[dict[Prefix, dict[int, float]]] = [{} for _ in tries]
    i = 0
    for _, b, node in asks:
        kids = tries[b][node]
        cond[b][node] = dict(zip(kids, vals[i : i + len(kids)], strict=True))
        i += len(kids)
    return cond


def conditionals(
    lp: Any, asks: Sequence[tuple[int, int, Prefix]], tries: Sequence[Trie]
) -> list[dict[Prefix, dict[int, float]]]:
    """``cond[b][node][t] = lp[row, t]`` for each ask (row, trial b, trie node) and child t, in one gather."""
    torch = require("torch", "hf")
    rows, toks = ask_index(asks, tries)
    return spread(lp[torch.tensor(rows, device=lp.device), torch.tensor(toks, device=lp.device)].tolist(), asks, tries)


class LayerConditionals:
    """The trie's conditionals at every layer read, per trial of one batch, gathered as the forwards' taps come in
    (:meth:`add`), scored as the final readout scores them (:meth:`readouts`)."""

    def __init__(self, layers: Sequence[int], n_trials: int) -> None:
        self.cond: dict[int, list[dict[Prefix, dict[int, float]]]] = {
            layer: [{} for _ in range(n_trials)] for layer in layers
        }

    def add(
        self,
        taps: Taps | None,
        final: Any,
        asks: Sequence[tuple[int, int, Prefix]],
        tries: Sequence[Trie],
        owners: Sequence[int] | None = None,
    ) -> None:
        """The conditionals at each layer from one forward's ``taps`` (``final``: its own log-probs), for ``asks``
        (row, trial of ``tries``, node) as :func:`conditionals` takes them; ``owners[b]``: the batch's trial that
        trial b of ``tries`` is (default: itself)."""
        if taps is None:
            return
        rows, toks = ask_index(asks, tries)
        for layer, vals in taps.gathered(final, rows, toks):
            for b, found in enumerate(spread(vals, asks, tries)):
                self.cond[layer][owners[b] if owners is not None else b].update(found)

    def readouts(self, trial: Trial, prep: Prepared, trie: Trie, b: int) -> tuple[LayerReadout, ...]:
        """Trial ``b``'s readout at each layer: the trie's option log-probs, normalized, coverage and greedy
        option, as :func:`engines.local.assembled_readout` computes them at the final layer."""
        return tuple(
            layer_readout(layer, trial, option_logprobs(prep.options, trie, cond[b]))
            for layer, cond in self.cond.items()
        )


class Reader:
    """Answer-slot readouts of prepared trials on the :class:`Model` it is handed, by the readout path its
    settings resolve to (:meth:`path`)."""

    def __init__(self, settings: HFSettings, lm: Model, trees: KeptTrees) -> None:
        self.settings = settings
        self.lm = lm
        self._trees = trees
        self._path: str | None = None  # the resolved readout path, once asked
        self._token_texts: dict[int, str] = {}
        self._lens: Lens | None = None  # the logit lens of --layers, made at the first readout
        self._layers: LayerConditionals | None = None  # the batch being read's conditionals per layer

    def lens(self) -> Lens | None:
        """The logit lens of ``settings.layers`` on this model (None without ``--layers``)."""
        s = self.settings
        if s.layer_spec is not None and self._lens is None:
            self._lens = Lens(s.layer_spec, self.lm.module, self.lm.head, s.model)
        return self._lens

    @contextmanager
    def _tapped(self, pick: Any) -> Iterator[Taps | None]:
        """The lens's hooks around one forward, keeping the rows ``pick`` chooses (nothing without ``--layers``)."""
        lens = self.lens()
        if lens is None:
            yield None
            return
        with lens.capture(pick) as taps:
            yield taps

    def path(self) -> str:
        """The readout path this engine takes on this model (``settings.readout_path`` with auto resolved).

        auto = tree where the model allows it; otherwise branch on a CPU and
        plain on an accelerator. The branch path runs one forward per distinct
        suffix length, and on a GPU, where a small forward costs its kernel
        launches rather than its FLOPs, that measured slower than plain
        (docs/speed.md); on a CPU the tokens it saves are the time it saves.
        """
        if self._path is None:
            fallback = "branch" if self.lm.device.type == "cpu" else "plain"
            self._path = self.lm.tree_where_possible("readout_path", fallback, ("branch", "plain"))
        return self._path

    def readout(
        self,
        trials: Sequence[Trial],
        groups: Iterable[tuple[Sequence[int], Sequence[Prepared]]],
        progress: ProgressFn | None = None,
    ) -> list[Readout]:
        """The answer-slot distribution of each trial, in input order, from ``groups``: (trial indices, those trials
        prepared), as they become ready (in think mode, as their traces end), each read ``batch_size`` trials at a
        time, so progress is reported as it goes."""
        torch = require("torch", "hf")
        path = self.path()
        self._trees.reading(tree=path == "tree")
        read = {"tree": self._tree, "branch": self._branch, "plain": self._plain}[path]
        results: list[Readout | None] = [None] * len(trials)
        with torch.inference_mode():
            for group, prepared in groups:
                for batch in self._batches([trials[i] for i in group], prepared, path):
                    rows = [group[j] for j in batch]
                    lens = self.lens()
                    self._layers = LayerConditionals(lens.layers, len(batch)) if lens is not None else None
                    outs = read([trials[i] for i in rows], [prepared[j] for j in batch])
                    for i, r in zip(rows, outs, strict=True):
                        results[i] = r
                    if progress:
                        progress(len(batch))
        return [r for r in results if r is not None]

    def _batches(self, trials: Sequence[Trial], prepared: Sequence[Prepared], path: str) -> list[list[int]]:
        """Indices per forward batch: length buckets (plain), or runs of sorted prompts so shared prefixes meet.

        The sort key is the prompt ids, then the options and the trial id, so
        the batches (and so the float rounding) do not depend on input order.
        """
        s = self.settings
        if path == "plain":
            return length_batches([len(p.ids) for p in prepared], s.batch_size, s.max_batch_tokens)
        order = sorted(range(len(prepared)), key=lambda i: (prepared[i].ids, prepared[i].options, trials[i].trial_id))
        ids = [prepared[i].ids for i in order]
        if path == "tree":  # option prefixes are packed too: a trie's internal nodes, less the root
            extra = [len(build_trie(prepared[i].options)) - 1 for i in order]
            cap = s.tree_tokens
        else:
            extra, cap = [0] * len(order), s.max_batch_tokens
        rows = token_rows([len(x) for x in ids], shared_prefix_lengths(ids), extra, cap, s.batch_size)
        return [[order[j] for j in row] for row in rows]

    def _tree(self, trials: Sequence[Trial], prepared: Sequence[Prepared]) -> list[Readout]:
        """One forward over the batch's token tree: every prompt and option prefix, each shared token once."""
        torch = require("torch", "hf")
        tries = [build_trie(p.options) for p in prepared]
        seqs: list[tuple[int, ...]] = []
        asks: list[tuple[int, Prefix]] = []  # (trial, trie node) per sequence: the prompt, then the option prefix
        for b, (p, trie) in enumerate(zip(prepared, tries, strict=True)):
            for node in trie:
                seqs.append(p.ids + node)
                asks.append((b, node))
        tree = pack_tree(seqs)
        keep = sorted(set(tree.ends))
        row = {node: r for r, node in enumerate(keep)}
        wanted = [k for k, (b, node) in enumerate(asks) if node == () and prepared[b].ids in self._trees.expected]
        with self._tapped(tree_rows(keep) if self._layers is not None else None) as taps:
            logits, cache = self.lm.tree_logits(tree, keep, use_cache=bool(wanted))
        lp = readout_log_probs(logits)
        if wanted:  # a sample() of these prompts follows: keep the tree's cache for it (sample_next), and the
            # float32 log-probs its draws start from, as the draws' own prefill computes them (:meth:`engines.hf.weights.Model.forward_tree`)
            drawn = torch.log_softmax(logits, dim=-1)
            paths = tree_paths(tree)
            for k in wanted:
                self._trees.kept[prepared[asks[k][0]].ids] = (cache, paths[k], drawn[row[tree.ends[k]]])
        read = [(row[e], b, node) for e, (b, node) in zip(tree.ends, asks, strict=True)]
        cond = conditionals(lp, read, tries)
        if self._layers is not None:
            self._layers.add(taps, lp, read, tries)
        roots = lp[[row[e] for e, (_, node) in zip(tree.ends, asks, strict=True) if node == ()]]
        computed = [0] * len(prepared)  # the nodes each trial's sequences added (the first sharer pays the prefix)
        added = [0] * len(tree.shared)
        for k in tree.owner:
            added[k] += 1
        for k, n in enumerate(added):
            computed[asks[tree.first[k]][0]] += n
        return self._finish(trials, prepared, tries, cond, roots, computed)

    def _branch(self, trials: Sequence[Trial], prepared: Sequence[Prepared]) -> list[Readout]:
        """Shared prefixes once, their cache gathered per trial, suffixes of equal length together, then the trie."""
        torch = require("torch", "hf")
        tries = [build_trie(p.options) for p in prepared]
        groups = prefix_groups([p.ids for p in prepared])
        if all(n == 0 for n, _ in groups):  # one-token prompts: nothing to share
            return self._plain(trials, prepared)
        ids, mask = self.lm.pad_left([prepared[members[0]].ids[:n] for n, members in groups])
        _, cache = self.lm.forward(ids, mask, None)
        computed = [0] * len(prepared)
        by_length: dict[int, list[tuple[int, int]]] = {}
        for g, (n, members) in enumerate(groups):
            computed[members[0]] += n
            for b in members:
                by_length.setdefault(len(prepared[b].ids) - n, []).append((b, g))
        cond: list[dict[Prefix, dict[int, float]]] = [{} for _ in prepared]
        roots: list[Any] = [None] * len(prepared)
        for k, (length, pairs) in enumerate(sorted(by_length.items())):
            branch = cache if k == len(by_length) - 1 else copy.deepcopy(cache)
            idx = torch.tensor([g for _, g in pairs], device=mask.device)
            branch.reorder_cache(idx)
            sub_mask = torch.cat([mask[idx], mask.new_ones((len(pairs), length))], dim=1)
            suffix = torch.tensor([prepared[b].ids[groups[g][0] :] for b, g in pairs], device=mask.device)
            with self._tapped(last_rows) as taps:
                lp, branch = self.lm.forward(suffix, sub_mask, branch, float64=True)
            members = [b for b, _ in pairs]
            sub_tries = [tries[b] for b in members]
            if self._layers is not None:
                self._layers.add(taps, lp, [(j, j, ()) for j in range(len(members))], sub_tries, members)
            sub_cond, expanded = self._expand(lp, branch, sub_mask, sub_tries, members)
            for j, b in enumerate(members):
                cond[b], roots[b] = sub_cond[j], lp[j]
                computed[b] += length + expanded[j]
        return self._finish(trials, prepared, tries, cond, torch.stack(roots), computed)

    def _plain(self, trials: Sequence[Trial], prepared: Sequence[Prepared]) -> list[Readout]:
        """Every prompt whole (left-padded), then the trie one token per step on its cache."""
        ids, mask = self.lm.pad_left([p.ids for p in prepared])
        with self._tapped(last_rows) as taps:
            root_lp, cache = self.lm.forward(ids, mask, None, float64=True)
        tries = [build_trie(p.options) for p in prepared]
        if self._layers is not None:
            self._layers.add(taps, root_lp, [(b, b, ()) for b in range(len(tries))], tries)
        cond, expanded = self._expand(root_lp, cache, mask, tries)
        computed = [len(p.ids) + e for p, e in zip(prepared, expanded, strict=True)]
        return self._finish(trials, prepared, tries, cond, root_lp, computed)

    def _expand(
        self, root_lp: Any, cache: Any, mask: Any, tries: Sequence[Trie], owners: Sequence[int] | None = None
    ) -> tuple[list[dict[Prefix, dict[int, float]]], list[int]]:
        """Conditionals at every internal trie node, breadth-first, one token per step on the prompts' cache.

        Row r of the cache (and of ``root_lp``) is the prompt of ``tries[r]``;
        each step gathers one cache row per node to expand (all trials at once).
        Returns the conditionals and the nodes expanded per trial. With ``--layers`` each step's conditionals are
        gathered at every layer too, ``owners[b]`` the batch's trial that ``tries[b]`` is (default: itself).
        """
        torch = require("torch", "hf")
        cond = conditionals(root_lp, [(b, b, ()) for b in range(len(tries))], tries)
        expanded = [0] * len(tries)
        rows: list[tuple[int, Prefix]] = [(b, ()) for b in range(len(tries))]
        while True:
            nxt = [(r, b, (*p, t)) for r, (b, p) in enumerate(rows) for t in tries[b][p] if (*p, t) in tries[b]]
            if not nxt:
                break
            idx = torch.tensor([r for r, _, _ in nxt], device=mask.device)
            cache.reorder_cache(idx)
            mask = torch.cat([mask[idx], mask.new_ones((len(nxt), 1))], dim=1)
            step = torch.tensor([[p[-1]] for _, _, p in nxt], device=mask.device)
            with self._tapped(last_rows) as taps:
                lp, cache = self.lm.forward(step, mask, cache, float64=True)
            read = [(r, b, p) for r, (_, b, p) in enumerate(nxt)]
            for b, found in enumerate(conditionals(lp, read, tries)):
                cond[b].update(found)
            if self._layers is not None:
                self._layers.add(taps, lp, read, tries, owners)
            for _, b, _ in nxt:
                expanded[b] += 1
            rows = [(b, p) for _, b, p in nxt]
        return cond, expanded

    def _finish(
        self,
        trials: Sequence[Trial],
        prepared: Sequence[Prepared],
        tries: Sequence[Trie],
        cond: Sequence[dict[Prefix, dict[int, float]]],
        roots: Any,
        computed: Sequence[int],
    ) -> list[Readout]:
        others = self.top_other(roots, tries)
        out = [
            slot_readout(t, p, trie, c, top_other=o, computed=n)
            for t, p, trie, c, o, n in zip(trials, prepared, tries, cond, others, computed, strict=True)
        ]
        if self._layers is None:
            return out
        at = self._layers
        return [
            replace(r, layers=at.readouts(t, p, trie, b))
            for b, (r, t, p, trie) in enumerate(zip(out, trials, prepared, tries, strict=True))
        ]

    def top_other(self, roots: Any, tries: Sequence[Trie]) -> list[tuple[tuple[str, float], ...]]:
        """The most likely first tokens that start no option, per trial (one top-k over the batch)."""
        torch = require("torch", "hf")
        k = self.settings.top_other
        if not k:
            return [() for _ in tries]
        masked = roots.clone()
        rows = [b for b, trie in enumerate(tries) for _ in trie[()]]
        cols = [t for trie in tries for t in trie[()]]
        masked[torch.tensor(rows, device=roots.device), torch.tensor(cols, device=roots.device)] = -math.inf
        vals, idx = torch.topk(masked, k, dim=-1)
        return [
            tuple((self._token_text(i), math.exp(v)) for v, i in zip(vr, ir, strict=True))
            for vr, ir in zip(vals.tolist(), idx.tolist(), strict=True)
        ]

    def _token_text(self, tid: int) -> str:
        if tid not in self._token_texts:
            self._token_texts[tid] = self.lm.tokenizer.decode([tid])
        return self._token_texts[tid]
