"""The reasoning part of the Transformers engine: think mode's traces, and the refilled decoding its draws share.

Owns: :class:`Reasoner`, which reasons in fixed length buckets or refilled (a finished row given to the next
waiting trace, :mod:`engines.hf.refill`), the latter on a stacked cache (:meth:`Reasoner.decode_refilled`) or in
slots of fixed shape recorded as CUDA graphs (:meth:`Reasoner.decode_slots`, :mod:`engines.hf.graphs`); how many
traces go together (:func:`reasoning_rows`); and the tally of what it decoded (``stats``). May import:
:mod:`engines.hf.settings`, :mod:`engines.hf.tokens`, :mod:`engines.hf.weights` (the :class:`Model` it is handed),
:mod:`engines.base`, :mod:`engines.hf.graphs`, :mod:`engines.local`, :mod:`engines.hf.refill`, :mod:`engines.hf.sampling`
(the row samplers); torch lazily. Not the readout or sampling parts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.base import require
from engines.batching import cut_runs, length_batches
from engines.hf.graphs import SlotDecoder, span_of
from engines.hf.refill import ReasoningStats, Schedule, stacked, unstackable
from engines.hf.sampling import RowSampler
from engines.hf.settings import HFSettings
from engines.hf.weights import Model
from engines.local import ThinkRequest

REASONING_ROWS = 1024
"""Most traces reasoned together on a GPU (vLLM's default number of sequences is of this order)."""


def reasoning_rows(free_bytes: int, per_token: int, tokens: int, least: int, most: int = REASONING_ROWS) -> int:
    """Traces to decode together: as many as half of ``free_bytes`` holds KV cache for at ``tokens`` tokens each
    (``per_token`` bytes a token), at least ``least`` and at most ``most``."""
    fits = (free_bytes // 2) // max(1, per_token * max(1, tokens))
    return int(min(most, max(least, fits)))


def kv_bytes_per_token(model: Any) -> int:
    """KV-cache bytes of one token: layers x 2 x key heads x head width x element size (an upper bound for
    hybrids, whose Mamba layers keep no per-token cache)."""
    c = getattr(model.config, "get_text_config", lambda: model.config)()
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    size = next(model.parameters()).element_size()
    return int(c.num_hidden_layers * 2 * heads * dim * size)


Decoded = Iterator[tuple[int, list[int]]]
"""``(index, tokens)`` of each generation as it ends."""


@dataclass(frozen=True)
class Generation:
    """What a refilled decoding generates (:meth:`Reasoner.decode_refilled`, :meth:`Reasoner.decode_slots`: one
    schedule, two ways to decode it): each of ``prompts`` continued until one of ``ends`` (kept) or ``budget``
    tokens, up to ``rows`` at once, each admitted run's rows drawn by ``sampler_of(indices)`` (one seeded generator
    per row)."""

    prompts: Sequence[tuple[int, ...]]
    sampler_of: Callable[[Sequence[int]], RowSampler]
    budget: int
    ends: set[int] | frozenset[int]
    rows: int


@dataclass
class _Traces:
    """The generations of a refilled decoding in progress, by index: each ends at one of ``ends`` (kept) or at
    ``budget`` tokens."""

    ends: set[int] | frozenset[int]
    budget: int
    gens: dict[int, list[int]] = field(default_factory=dict)

    def took(self, i: int, token: int) -> bool:
        """Append ``token`` to generation ``i`` (begun here if new); whether it ended."""
        gen = self.gens.setdefault(i, [])
        gen.append(token)
        return token in self.ends or len(gen) >= self.budget


class _Slots:
    """Which trace holds which of the slots of a :class:`engines.hf.graphs.SlotDecoder`, and each slot's last token and
    length (the inputs of the next step)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.slot_of: dict[int, int] = {}  # trial -> its slot, while it reasons
        self.live: list[int] = []  # the reasoning trials, in the order of the sampler's rows
        self.tokens, self.lengths = [0] * rows, [0] * rows

    def free(self) -> Iterator[int]:
        """The free slots, lowest first."""
        return iter(sorted(set(range(self.rows)) - set(self.slot_of.values())))

    def hold(self, i: int, slot: int, token: int, length: int) -> None:
        """Trace ``i`` is admitted to ``slot``, its prompt ``length`` tokens, its first token ``token``."""
        self.slot_of[i] = slot
        self.tokens[slot], self.lengths[slot] = token, length

    def step(self, i: int, token: int) -> None:
        """Trace ``i`` drew ``token``: its slot's next input."""
        slot = self.slot_of[i]
        self.tokens[slot], self.lengths[slot] = token, self.lengths[slot] + 1

    def keep(self, going: list[int], dec: SlotDecoder, waiting: bool) -> None:
        """Only the live traces at ``going`` go on; when none waits and they fill at most half the slots, they move
        to the front and the decoder shrinks (:meth:`engines.hf.graphs.SlotDecoder.shrink`)."""
        self.live = [self.live[k] for k in going]
        if self.live and not waiting and len(self.live) <= dec.size // 2:  # the last traces: fewer slots
            moved = [self.slot_of[i] for i in self.live]
            dec.shrink(moved, max(self.lengths[m] for m in moved))
            self.tokens[: len(moved)] = [self.tokens[m] for m in moved]
            self.lengths[: len(moved)] = [self.lengths[m] for m in moved]
            self.slot_of.update({i: k for k, i in enumerate(self.live)})


class Reasoner:
    """Think mode's reasoning on the :class:`Model` it is handed, as its settings ask (greedy or sampled, in
    buckets, refilled or in slots), and the refilled decoding that think mode's draws share
    (:meth:`decoder`)."""

    def __init__(self, settings: HFSettings, lm: Model) -> None:
        self.settings = settings
        self.lm = lm
        self.stats = ReasoningStats()
        """What this engine's reasoning decoded so far (the traces before a slot is read)."""

    def reason(self, request: ThinkRequest) -> list[list[int]]:
        """The reasoning of think mode, each trial's trace in request order (:meth:`reasoned`)."""
        out: list[list[int]] = [[] for _ in request.prompts]
        for i, gen in self.reasoned(request):
            out[i] = gen
        return out

    def reasoned(self, request: ThinkRequest) -> Decoded:
        """``(trial, trace)`` for each trial of ``request`` as its trace ends: greedy, or (``think_temperature`` >
        0) sampled with top-p / top-k, each trial from its own seeded generator.

        Refilled (:mod:`engines.hf.refill`) where the model's cache can be stacked, else in fixed length buckets;
        the run's tally goes to ``stats``.
        """
        torch = require("torch", "hf")
        if not request.prompts:
            return
        longest = max(len(p) for p in request.prompts)
        rows = self.settings.reasoning_rows or self._rows(longest + request.budget)
        stats = ReasoningStats(rows=rows, schedule=self.schedule())
        decode = self._buckets if stats.schedule == "buckets" else self._refill
        try:
            with torch.inference_mode():
                for i, gen in decode(request, rows, stats):
                    stats.took(gen)
                    yield i, gen
        finally:
            self.stats.add(stats)

    def refills(self) -> bool:
        """Whether think mode refills finished rows: asked for (``reasoning_refill``) and the model's cache made of
        plain attention layers (:func:`engines.hf.refill.unstackable`; a Mamba hybrid reasons in buckets)."""
        if not self.settings.reasoning_refill:
            return False
        return unstackable(self.lm.config) is None

    def schedule(self) -> str:
        """How think mode decodes: ``slots`` (refilled, in steps of fixed shape: ``decode_graphs`` on,
        :meth:`decode_slots`), ``refill`` (:meth:`decode_refilled`) or ``buckets`` (:meth:`_buckets`)."""
        if not self.refills():
            return "buckets"
        return "slots" if self.settings.decode_graphs == "on" else "refill"

    def decoder(self) -> Callable[[Generation, ReasoningStats], Decoded]:
        """The refilled decoding of this engine's schedule: :meth:`decode_slots` or :meth:`decode_refilled`."""
        return self.decode_slots if self.schedule() == "slots" else self.decode_refilled

    def slot_decoder(self, rows: int, capacity: int) -> SlotDecoder:
        """Slots for ``rows`` traces of ``capacity`` columns, stepping the model (:meth:`Model.call`), recorded as
        :meth:`capture_mode` says."""
        lm = self.lm
        return SlotDecoder(
            lm.call, lm.config, rows, capacity, lm.device, capture=self.capture_mode(), cache_kw=lm.cache_kw
        )

    def capture_mode(self) -> str | None:
        """How slot steps are recorded (:class:`engines.hf.graphs.SlotDecoder`): ``cuda`` on one GPU, else None (a
        CPU's or a split model's steps run unrecorded; tests ask for ``fx`` by patching this)."""
        return "cuda" if self.lm.device.type == "cuda" and not self.lm.is_split() else None

    def _sampler(self, request: ThinkRequest, trials: Sequence[int]) -> RowSampler:
        s = self.settings
        seeds = [request.seeds[i] for i in trials]
        return RowSampler(seeds, s.think_temperature, top_p=s.think_top_p, top_k=s.think_top_k)

    def _buckets(self, request: ThinkRequest, rows: int, stats: ReasoningStats) -> Decoded:
        """Whole length buckets of ``rows`` traces, each decoded until its longest trace ends; every row of a
        bucket stays in it to the end, so a row's logits never depend on when its neighbours stopped."""
        torch = require("torch", "hf")
        s = self.settings
        prompts, max_new, stops = request.prompts, request.budget, request.ends
        longest = max(len(p) for p in prompts)
        limit = s.max_batch_tokens if rows <= s.batch_size else max(s.max_batch_tokens, rows * longest)
        for batch in length_batches([len(p) for p in prompts], rows, limit):
            out: list[list[int]] = [[] for _ in batch]
            ids, mask = self.lm.pad_left([prompts[i] for i in batch])
            lp, cache = self.lm.forward(ids, mask, None)
            stats.prefills += 1
            done = [False] * len(batch)
            sampler = self._sampler(request, batch)
            for step in range(max_new):
                nxt = sampler.draw(lp)
                toks = nxt.tolist()
                for r in range(len(batch)):
                    if not done[r]:
                        out[r].append(toks[r])
                        done[r] = toks[r] in stops
                if all(done) or step == max_new - 1:
                    break
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                lp, cache = self.lm.forward(nxt[:, None], mask, cache)
                stats.steps += 1
                stats.step_rows += len(batch)
                stats.finished_step_rows += sum(done)
            yield from zip(batch, out, strict=True)

    def _refill(self, request: ThinkRequest, rows: int, stats: ReasoningStats) -> Decoded:
        """Up to ``rows`` traces at once, a finished row given to the next waiting trial (:meth:`decoder`)."""
        job = Generation(request.prompts, lambda run: self._sampler(request, run), request.budget, request.ends, rows)
        yield from self.decoder()(job, stats)

    def decode_refilled(self, job: Generation, stats: ReasoningStats) -> Decoded:
        """``(index, tokens)`` for each of the job's prompts as its generation ends, a finished row given to the
        next waiting prompt (:mod:`engines.hf.refill`): think mode's reasoning, and its draws.

        Prompts are admitted in order; an admitted group is prefilled on its own (:meth:`_prefilled`), its first
        tokens drawn from that prefill by ``job.sampler_of(indices)``, and its cache
        stacked under the rows that go on (:func:`engines.hf.refill.stacked`).
        """
        torch = require("torch", "hf")
        prompts, sampler_of, budget = job.prompts, job.sampler_of, job.budget
        plan = Schedule(range(len(prompts)), job.rows)
        traces = _Traces(job.ends, budget)
        cache: Any = None
        mask: Any = None
        nxt: Any = None
        sampler = sampler_of([])
        while plan.live or plan.waiting:
            if plan.compacts():
                keep, admit = plan.compact()
                parts: list[tuple[Any, Any, Any]] = [(cache, mask, keep)] if keep else []
                firsts = [nxt[torch.tensor(keep, device=nxt.device)]] if keep else []
                sampler.keep(keep)
                for run, lp, c, m, at in self._prefilled(prompts, admit, stats):
                    if len(set(at)) < len(run):  # the n draws of a prompt: its one row, repeated
                        idx = torch.tensor(at, device=m.device)
                        c.reorder_cache(idx)
                        lp, m = lp[idx.to(lp.device)], m[idx]
                    new = sampler_of(run)
                    first = new.draw(lp)
                    sampler.extend(new)
                    parts.append((c, m, None))
                    firsts.append(first)
                    for i, t in zip(run, first.tolist(), strict=True):
                        if traces.took(i, t):
                            plan.end(i)
                            yield i, traces.gens.pop(i)
                cache, mask = stacked(parts, budget, self.lm.config)
                nxt = torch.cat(firsts)
                if not plan.live:
                    continue
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            lp, cache = self.lm.forward(nxt[:, None], mask, cache)
            stats.steps += 1
            stats.step_rows += len(plan.slots)
            stats.finished_step_rows += len(plan.finished)
            nxt = sampler.draw(lp)
            for i, t in zip(plan.slots, nxt.tolist(), strict=True):
                if i not in plan.finished and traces.took(i, t):
                    plan.end(i)
                    yield i, traces.gens.pop(i)

    def _prefilled(
        self, prompts: Sequence[tuple[int, ...]], admit: list[int], stats: ReasoningStats
    ) -> Iterator[tuple[list[int], Any, Any, Any, list[int]]]:
        """The prefills of the admitted prompts ``admit`` of a refilled decoding, one per run of at most
        ``max_batch_tokens`` padded tokens, in order: ``(run, log-probs, cache, mask, at)``, each distinct prompt of
        the run computed once (the n draws of a prompt share it) and ``at`` the row of each member's prompt."""
        most = self.settings.max_batch_tokens

        def fits(run: list[int], i: int) -> int:
            width = max(len(prompts[j]) for j in (*run, i))
            return len(run) if (len(run) + 1) * width > most else 0

        for run in cut_runs(admit, fits):
            distinct = list(dict.fromkeys(prompts[i] for i in run))
            where = {p: k for k, p in enumerate(distinct)}
            ids, m = self.lm.pad_left(distinct)
            lp, c = self.lm.forward(ids, m, None)
            stats.prefills += 1
            yield run, lp, c, m, [where[prompts[i]] for i in run]

    def decode_slots(self, job: Generation, stats: ReasoningStats) -> Decoded:
        """What :meth:`decode_refilled` yields, in the same schedule, decoded in ``job.rows`` slots of fixed shape
        (:mod:`engines.hf.graphs`), each step recorded in a CUDA graph where :meth:`capture_mode` says so.

        A trace keeps its slot from admission to its end (or until the last traces move to the front:
        :meth:`_Slots.keep`); admitted traces are prefilled as in :meth:`decode_refilled` and copied into the free
        slots (lowest first); a step computes every slot of the current size (a free one on whatever it last
        held), and only the live slots draw, each from its own generator.
        """
        torch = require("torch", "hf")
        prompts, sampler_of, rows = job.prompts, job.sampler_of, job.rows
        plan = Schedule(range(len(prompts)), rows)
        capacity = max(len(p) for p in prompts) + job.budget
        dec = self.slot_decoder(rows, capacity)
        traces, slots = _Traces(job.ends, job.budget), _Slots(rows)
        sampler = sampler_of([])
        try:
            while plan.live or plan.waiting:
                if plan.compacts():
                    _, admit = plan.compact()
                    free = slots.free()
                    for run, lp, c, _, at in self._prefilled(prompts, admit, stats):
                        new = sampler_of(run)
                        first = new.draw(lp[torch.tensor(at, device=lp.device)]).tolist()
                        going = []
                        for k, (i, t) in enumerate(zip(run, first, strict=True)):
                            if traces.took(i, t):
                                plan.end(i)
                                yield i, traces.gens.pop(i)
                                continue
                            slot = next(free)
                            dec.admit(slot, c, at[k], len(prompts[i]), t)
                            slots.hold(i, slot, t, len(prompts[i]))
                            going.append(k)
                        new.keep(going)
                        sampler.extend(new)
                        slots.live += [run[k] for k in going]
                    if not slots.live:
                        continue
                dec.set_inputs(slots.tokens, slots.lengths)
                lp = dec.step(span_of(max(slots.lengths[slots.slot_of[i]] for i in slots.live) + 1, capacity))
                stats.steps += 1
                stats.step_rows += dec.size
                stats.finished_step_rows += dec.size - len(slots.live)
                order = torch.tensor([slots.slot_of[i] for i in slots.live], device=lp.device)
                drawn = sampler.draw(lp[order]).tolist()
                going = []
                for k, (i, t) in enumerate(zip(slots.live, drawn, strict=True)):
                    slots.step(i, t)
                    if traces.took(i, t):
                        plan.end(i)
                        del slots.slot_of[i]
                        yield i, traces.gens.pop(i)
                    else:
                        going.append(k)
                if len(going) < len(slots.live):
                    sampler.keep(going)
                    slots.keep(going, dec, bool(plan.waiting))
        finally:
            stats.graphs += len(dec.graphs)
            stats.capture_s += dec.capture_s
            stats.graphs_failed = dec.failed or stats.graphs_failed

    def _rows(self, tokens: int) -> int:
        """How many traces to reason at once: ``batch_size`` on a CPU; on a GPU as many as half its free memory
        holds KV cache for (:func:`reasoning_rows`), because a decoding step costs about the same for 16 rows as
        for hundreds there."""
        torch = require("torch", "hf")
        dev = self.lm.device
        if dev.type != "cuda":
            return self.settings.batch_size
        free, _ = torch.cuda.mem_get_info(dev)
        return reasoning_rows(free, kv_bytes_per_token(self.lm.module), tokens, self.settings.batch_size)
