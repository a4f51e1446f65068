"""The sampling part of the Transformers engine: seeded draws, their prompts computed once.

Owns: :class:`Sampler` (the sample path, the prefills of each path, grouped attention, decoding the draws until
they stop, think mode's refilled draws and their tally, ``stats``) and :class:`Draw`. May import:
:mod:`engines.hf.settings`, :mod:`engines.hf.tokens`, :mod:`engines.hf.weights` (the :class:`Model` it is handed),
:mod:`engines.hf.reasoning` (the refilled decoding think mode's draws share), :mod:`engines.hf.readout` (the
:class:`KeptTrees` a readout hands over), :mod:`engines.base`, :mod:`engines.local`, :mod:`engines.hf.refill`,
:mod:`engines.hf.sampling`, :mod:`probe.parse`, :mod:`probe.types`; torch lazily.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from engines.base import ProgressFn, require
from engines.batching import balanced, length_batches
from engines.hf.readout import KeptTrees
from engines.hf.reasoning import Generation, Reasoner
from engines.hf.refill import ReasoningStats
from engines.hf.sampling import (
    GROUPED_ATTENTION,
    RowSampler,
    gather_tree_cache,
    group_cache,
    register_grouped_attention,
    reserve_cache,
)
from engines.hf.settings import HFSettings
from engines.hf.tokens import fill, pack_tree, shared_prefix_lengths, token_rows, tree_paths
from engines.hf.weights import Model
from engines.local import DrawRow
from engines.render import plain_stop
from probe.parse import answer_scan, split_reasoning
from probe.types import Trial

GROUP_FROM = 2
"""Group the draws of a prompt from this many on. A lone reply gains nothing: 64 free-choice replies of up to 200 tokens
took 64.8 s grouped and 65.3 s with a row each on 2 CPU cores (the same tokens)."""

Prefills = Iterator[tuple[list[int], Any, Any, Any]]
"""``(row indices, last log-probs, cache, mask)`` per decoding batch (:meth:`Sampler.prefills`)."""


@dataclass(frozen=True)
class Draw(DrawRow):
    """One draw to make (:class:`engines.local.DrawRow`), with its (answer stop) options."""

    options: tuple[str, ...] | None
    """The options, when the draw stops once its answer is over; None: it runs to a stop token or the budget."""
    prefix: str = ""
    """The assistant prefix the parser puts back in front of the reply (outside think mode)."""
    plain: bool = False
    """The draw ends at the plain frame's stops (:func:`engines.render.plain_stop`): a base model runs on into the
    next turn."""


class Sampler:
    """Draws on the :class:`Model` it is handed, by the sample path its settings resolve to (:meth:`path`); think
    mode's draws reason first, refilled by the :class:`Reasoner` it is handed; a readout's kept trees
    (:class:`KeptTrees`) are drawn from where they hold every prompt."""

    def __init__(self, settings: HFSettings, lm: Model, reasoner: Reasoner, trees: KeptTrees) -> None:
        self.settings = settings
        self.lm = lm
        self._reasoner = reasoner
        self._trees = trees
        self.stats = ReasoningStats()
        """What think mode's refilled draws decoded so far (:meth:`_draw_refilled`)."""

    def path(self) -> str:
        """The sampling path this engine takes (``settings.sample_path`` with auto resolved: tree where the model
        allows it, else shared)."""
        return self.lm.tree_where_possible("sample_path", "shared", ("shared", "plain"))

    def rows(
        self, trials: Sequence[Trial], seeded: Sequence[DrawRow], stop_at_answer: bool, *, plain: bool = False
    ) -> list[Draw]:
        """The draws of ``seeded`` (:meth:`engines.local.LocalEngine._seeded_rows`), each with its trial's options
        where it stops once its answer is over (``stop_at_answer``, outside think mode), its assistant prefix, and
        whether it stops at the plain frame's stops (``plain``)."""
        answer_stop = stop_at_answer and not self.settings.think
        return [
            Draw(
                r.trial,
                r.draw,
                r.prompt,
                r.seed,
                tuple(trials[r.trial].options) if answer_stop else None,
                trials[r.trial].assistant_prefix,
                plain,
            )
            for r in seeded
        ]

    def generate(
        self,
        rows: Sequence[Draw],
        n: int,
        temperature: float,
        budget: int,
        stops: set[int],
        progress: ProgressFn | None,
    ) -> list[list[int]]:
        """The tokens each of ``rows`` (trial-major, ``n`` per trial) generates at ``temperature``, up to ``budget``
        tokens or one of ``stops`` (kept); outside think mode from the prompts' prefills (:meth:`prefills`: the
        trees a readout kept, where they hold every prompt), in think mode refilled (:meth:`_draw_refilled`)."""
        torch = require("torch", "hf")
        gens: list[list[int]] = [[] for _ in rows]
        path = self.path()
        kept = self._trees.take()
        if path == "tree" and all(r.prompt in kept for r in rows):
            path = "kept"  # the readout just computed these prompts (sample_next): draw from its caches
        with torch.inference_mode():
            if self.settings.think and self._reasoner.refills():  # reasoning, then the answer: lengths differ most
                gens = self._draw_refilled(rows, budget, stops, temperature, progress)
            else:
                for batch, lp, cache, mask in self.prefills(rows, n, path, budget, kept):
                    with self.grouped_attention(cache):
                        drawn = self._decode([rows[r] for r in batch], lp, cache, mask, budget, stops, temperature)
                    for r, gen in zip(batch, drawn, strict=True):
                        gens[r] = gen
                    if progress:
                        progress(len(batch))
        return gens

    def _draw_refilled(
        self, rows: Sequence[Draw], budget: int, stops: set[int], temperature: float, progress: ProgressFn | None
    ) -> list[list[int]]:
        """Think mode's draws, refilled (:meth:`Reasoner.decoder`): up to ``sample_rows`` draws at once (and as
        many as ``sample_cache_tokens`` holds at prompt + budget each), a finished draw's row given to the next;
        each draw from its own generator, so it draws what it draws in a length batch. The tally goes to
        ``stats`` (the engine's ``run_stats``: ``think_draws``)."""
        s = self.settings
        longest = max((len(r.prompt) for r in rows), default=0)
        capacity = max(1, min(s.sample_rows, s.sample_cache_tokens // (longest + budget)))
        stats = ReasoningStats(rows=capacity, schedule=self._reasoner.schedule())
        gens: list[list[int]] = [[] for _ in rows]
        prompts = [r.prompt for r in rows]
        try:
            job = Generation(
                prompts, lambda run: RowSampler([rows[j].seed for j in run], temperature), budget, stops, capacity
            )
            for i, gen in self._reasoner.decoder()(job, stats):
                stats.took(gen)
                gens[i] = gen
                if progress:
                    progress(1)
        finally:
            self.stats.add(stats)
        return gens

    def prefills(
        self, rows: Sequence[Draw], n: int, path: str, budget: int, kept: dict[tuple[int, ...], Any] | None = None
    ) -> Prefills:
        """Yield ``(row indices, last log-probs, cache, mask)`` per decoding batch, the prompts already computed.

        tree: a batch's distinct prompts are packed as one token tree (each
        shared prefix once) and its cache is gathered into one row per draw.
        shared: each distinct prompt once (left-padded), its cache row repeated
        per draw. plain: every draw's prompt on its own row. kept: the trees a
        readout kept (``kept``), gathered as tree's are.
        """
        s = self.settings
        if not rows:
            return
        if path == "plain":
            yield from self._plain_prefills(rows, budget)
            return
        # rows are trial-major, n per trial: row k * n + d is draw d of trial k
        prompts = [rows[k * n].prompt for k in range(len(rows) // n)]
        share = self.groups_draws(n)
        longest = max(len(p) for p in prompts)
        held = longest + n * budget if share else n * (longest + budget)  # cache tokens of one trial's draws
        per = balanced(len(prompts), max(1, min(s.sample_rows // n, s.sample_cache_tokens // held)))
        if path == "shared":
            yield from self._shared_prefills(prompts, n, per, budget, share)
        elif path == "kept":
            assert kept is not None
            yield from self._kept_prefills(prompts, n, per, budget, share, kept)
        else:
            yield from self._tree_prefills(prompts, n, per, budget, share)

    def _plain_prefills(self, rows: Sequence[Draw], budget: int) -> Prefills:
        """Every draw's prompt on its own row, in length batches as large as ``sample_rows`` and
        ``sample_cache_tokens`` allow, evenly."""
        s = self.settings
        longest = max(len(r.prompt) for r in rows)
        most = balanced(len(rows), max(1, min(s.sample_rows, s.sample_cache_tokens // (longest + budget))))
        for batch in length_batches([len(r.prompt) for r in rows], most, s.max_batch_tokens):
            ids, mask = self.lm.pad_left([rows[i].prompt for i in batch])
            lp, cache = self.lm.forward(ids, mask, None)
            yield batch, lp, reserve_cache(cache, budget), mask

    def _shared_prefills(
        self, prompts: Sequence[tuple[int, ...]], n: int, per: int, budget: int, share: bool
    ) -> Prefills:
        """Each prompt once (left-padded, ``per`` to a batch), its cache row grouped or repeated per draw."""
        torch = require("torch", "hf")
        for chunk in length_batches([len(p) for p in prompts], per, self.settings.max_batch_tokens):
            ids, mask = self.lm.pad_left([prompts[k] for k in chunk])
            lp, cache = self.lm.forward(ids, mask, None)
            idx = torch.arange(len(chunk), device=mask.device).repeat_interleave(n)
            grouped = group_cache(cache, mask, n, budget) if share else None
            if grouped is None:
                cache.reorder_cache(idx)
                grouped = reserve_cache(cache, budget)
            # lp lives where the head is, mask where the embeddings are: on a split model, two devices
            yield [k * n + d for k in chunk for d in range(n)], lp[idx.to(lp.device)], grouped, mask[idx]

    def _kept_prefills(
        self,
        prompts: Sequence[tuple[int, ...]],
        n: int,
        per: int,
        budget: int,
        share: bool,
        kept: dict[tuple[int, ...], Any],
    ) -> Prefills:
        """The readout's trees (sample_next): prompts of one tree together, ``per`` to a batch."""
        torch = require("torch", "hf")
        tree_of: dict[int, int] = {}
        for k in range(len(prompts)):
            tree_of.setdefault(id(kept[prompts[k]][0]), len(tree_of))
        order = sorted(range(len(prompts)), key=lambda k: (tree_of[id(kept[prompts[k]][0])], k))
        for lo in range(0, len(order), per):
            chunk = order[lo : lo + per]
            caches: list[Any] = []
            paths: list[list[list[int]]] = []
            for k in chunk:
                cache, node_path, _ = kept[prompts[k]]
                if not caches or caches[-1] is not cache:
                    caches.append(cache)
                    paths.append([])
                paths[-1].append(node_path)
            merged, mask = gather_tree_cache(caches, paths, n, budget, self.lm.config, grouped=share)
            lps = torch.stack([kept[prompts[k]][2] for k in chunk]).repeat_interleave(n, dim=0)
            yield [k * n + d for k in chunk for d in range(n)], lps, merged, mask

    def _tree_prefills(
        self, prompts: Sequence[tuple[int, ...]], n: int, per: int, budget: int, share: bool
    ) -> Prefills:
        """The prompts sorted so that shared prefixes meet, packed as token trees of at most ``tree_tokens``, several
        trees (up to ``per`` prompts) to a decoding batch, their caches gathered into a row per draw (or per prompt,
        grouped)."""
        torch = require("torch", "hf")
        order = sorted(range(len(prompts)), key=lambda k: (prompts[k], k))  # shared prefixes adjacent
        sorted_ids = [prompts[k] for k in order]
        trees = token_rows(
            [len(p) for p in sorted_ids],
            shared_prefix_lengths(sorted_ids),
            [0] * len(order),
            self.settings.tree_tokens,
            per,
        )
        for group in fill(trees, per):  # several trees per decoding batch, up to per trials
            chunk = [order[j] for tree_rows in group for j in tree_rows]
            lps, caches, paths = [], [], []
            for tree_rows in group:
                tree = pack_tree([sorted_ids[j] for j in tree_rows])
                ends = sorted(set(tree.ends))
                lp, cache = self.lm.forward_tree(tree, ends, use_cache=True)
                at = {node: r for r, node in enumerate(ends)}
                lps.append(lp[[at[e] for e in tree.ends]])
                caches.append(cache)
                paths.append(tree_paths(tree))
            merged, mask = gather_tree_cache(caches, paths, n, budget, self.lm.config, grouped=share)
            yield [k * n + d for k in chunk for d in range(n)], torch.cat(lps).repeat_interleave(n, dim=0), merged, mask

    def groups_draws(self, n: int) -> bool:
        """Whether the n draws of a prompt share its cache rows (:func:`engines.hf.sampling.group_cache`)."""
        impl = getattr(self.lm.config, "_attn_implementation", None)
        return self.settings.group_draws and n >= GROUP_FROM and impl in ("sdpa", "eager")

    @contextlib.contextmanager
    def grouped_attention(self, cache: Any) -> Iterator[None]:
        """While decoding a grouped cache, the model's attention layers run :func:`engines.hf.sampling.grouped_attention`."""
        from engines.hf.sampling import shared_prompt_layer_class

        config = self.lm.config
        if not any(isinstance(layer, shared_prompt_layer_class()) for layer in cache.layers):
            yield
            return
        register_grouped_attention()
        before = config._attn_implementation
        config._attn_implementation = GROUPED_ATTENTION
        try:
            yield
        finally:
            config._attn_implementation = before

    def _decode(
        self,
        rows: Sequence[Draw],
        lp: Any,
        cache: Any,
        mask: Any,
        budget: int,
        stops: set[int],
        temperature: float,
    ) -> list[list[int]]:
        """Decode every row until it stops (a stop token, its answer over, or ``budget`` tokens).

        Finished rows are dropped from the cache once they are an eighth of
        it, so the batch shrinks as draws end; a dropped row changes nothing
        for the others (their generators and cache rows are their own).
        """
        torch = require("torch", "hf")
        sampler = RowSampler([r.seed for r in rows], temperature)
        gens: list[list[int]] = [[] for _ in rows]
        live = list(range(len(rows)))  # the row of each cache row
        done = [False] * len(rows)
        watch = [r.options is not None for r in rows]
        for step in range(budget):
            nxt = sampler.draw(lp)
            toks = nxt.tolist()
            for j, i in enumerate(live):
                if done[i]:
                    continue
                gens[i].append(toks[j])
                if toks[j] in stops or step == budget - 1:
                    done[i] = True
                elif (
                    rows[i].plain
                    and plain_stop(self.lm.tokenizer.decode(gens[i], skip_special_tokens=False)) is not None
                ):
                    done[i] = True  # the reply is over (plain_cut keeps what came before the stop)
                elif watch[i]:
                    opts = rows[i].options
                    assert opts is not None
                    text = rows[i].prefix + self.lm.tokenizer.decode(gens[i], skip_special_tokens=False)
                    end, still = answer_scan(split_reasoning(text, think=False)[1], opts)  # answer stops: no think
                    done[i] = end is not None
                    watch[i] = still
            keep = [j for j, i in enumerate(live) if not done[i]]
            if not keep:
                break
            if 8 * (len(live) - len(keep)) >= len(live):
                idx = torch.tensor(keep, device=mask.device)
                cache.reorder_cache(idx)
                mask, nxt = mask[idx], nxt[idx.to(nxt.device)]  # nxt is on the head's device
                sampler.keep(keep)
                live = [live[j] for j in keep]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            lp, cache = self.lm.forward(nxt[:, None], mask, cache)
        return gens
