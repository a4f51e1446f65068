"""Step 4 of the device check: a random Qwen3-MoE, timed warm, against peers on the same model object and floors
measured in the same run.

Every timing here follows a warm-up call at the timed shapes (the first calls pick kernels and allocate: on the
H200 a cold decode step read 59 ms against 7.4 ms warm) and is repeated :data:`REPEATS` times; a figure is the
median with the fastest and slowest repeat beside it. The peers run on the same model object, and each is checked
to agree with probe before it is timed:

* an lm-evaluation-harness-style scorer (:class:`LmEvalStyleScorer`): one sequence per (prompt, option), batches
  of 64, right-padded, a full-vocabulary log-softmax at every position, the option's token log-probs summed;
* ``model.generate(do_sample=True, num_return_sequences=n)``, the bench's peer (:func:`generate_draws`).

The floors beside each figure:

* **compute**: 2 x active linear weights x tokens fed (:func:`scripts.bench.flops.linear_flops_per_token`)
  against a matmul rate measured here (bfloat16 on a GPU, float32 on the CPU): no method can read faster;
* **weight read** of a decode step (:func:`decode_bytes`): the attention weights, the KV cache, the head and the
  experts the batch routes to (the expected number of distinct experts among ``rows x top-k`` uniform picks),
  against a copy bandwidth measured here.

Targets (issue 44; printed with pass/fail, on a CPU for the record only): a decode step within 2.5x of its
weight-read floor at batch 512 and 3x at batch 16; refilled reasoning within 1.3x of (tokens / rows + longest)
steps; readouts at least 3x the scorer on forced binary; draws at least 5x ``generate()``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

REPEATS = 3
"""Timed repeats of every figure (after one warm-up call at the same shapes)."""
PREFILL_EXPERTS = ("grouped_mm", "eager")
"""The experts implementations prefill is timed in (batched_mm copies every token's experts' weights: it asked
for 218 GiB at 16 x 291 tokens on the H200, so it is not a prefill candidate)."""
DECODE_EXPERTS = ("grouped_mm", "batched_mm")
"""The experts implementations a decoding step is timed in (eager loops over the experts in Python)."""

TARGETS = {"decode_512": 2.5, "decode_16": 3.0, "reasoning": 1.3, "readouts": 3.0, "draws": 5.0}
"""Issue 44's targets: floor multiples (decode), a step ratio (reasoning), speed-ups over peers."""


def timed(run: Callable[[], Any], sync: Callable[[], None], repeats: int = REPEATS) -> tuple[Any, dict[str, Any]]:
    """``run()`` once to warm up, then ``repeats`` timed calls: the last result and the median, fastest and
    slowest seconds."""
    run()
    sync()
    seconds = []
    out = None
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        out = run()
        sync()
        seconds.append(time.perf_counter() - t0)
    return out, {
        "repeats": repeats,
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "max_s": max(seconds),
    }


def rate(units: float, t: dict[str, Any]) -> dict[str, Any]:
    """Units per second at the median, with the range over repeats."""
    return {"per_s": units / t["median_s"], "per_s_range": [units / t["max_s"], units / t["min_s"]]}


def matmul_rate(device: Any, dtype: Any, sync: Callable[[], None]) -> float:
    """FLOP/s of a square matmul in ``dtype`` on ``device`` (8192 on a GPU, 1024 on a CPU), warm, median of 5."""
    import torch

    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    _, t = timed(lambda: a @ b, sync, repeats=5)
    return 2 * n**3 / t["median_s"]


def copy_bandwidth(device: Any, sync: Callable[[], None]) -> float:
    """Bytes/s moved by a device-to-device copy (read + write counted), warm, median of 5: 1 GiB on a GPU,
    64 MiB on a CPU."""
    import torch

    n = 2**30 if device.type == "cuda" else 2**26
    src = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    _, t = timed(lambda: dst.copy_(src), sync, repeats=5)
    return 2 * n / t["median_s"]


def distinct_experts(experts: int, top_k: int, rows: int) -> float:
    """Expected distinct experts per layer when ``rows`` tokens each pick ``top_k`` of ``experts`` uniformly."""
    return experts * (1 - (1 - top_k / experts) ** rows)


def decode_bytes(config: Any, rows: int, context: int, element: int) -> dict[str, float]:
    """Bytes one decode step of ``rows`` rows at ``context`` cached tokens must read, by part."""
    h, heads, kv, hd = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    layers = config.num_hidden_layers
    attention = layers * (h * heads * hd * 2 + h * kv * hd * 2) * element
    experts = layers * distinct_experts(config.num_experts, config.num_experts_per_tok, rows)
    expert_bytes = experts * 3 * h * config.moe_intermediate_size * element + layers * h * config.num_experts * element
    cache = rows * context * layers * 2 * kv * hd * element
    head = config.vocab_size * h * element
    return {"attention": attention, "experts": expert_bytes, "kv_cache": cache, "head": head}


class LmEvalStyleScorer:
    """Scores as lm-evaluation-harness's Hugging Face backend does: one sequence per (prompt, option), sorted
    longest first, ``batch`` sequences a forward, right-padded, a log-softmax over the whole vocabulary at every
    position, and the option's token log-probs summed (so P(tokens), which equals probe's P(option is the whole
    answer) where no option is a prefix of another, as on forced binaries)."""

    def __init__(self, engine: Any, batch: int = 64) -> None:
        self.engine = engine
        self.batch = batch

    def run(self, trials: Sequence[Any]) -> list[list[float]]:
        import torch

        e = self.engine
        seqs = []
        for k, t in enumerate(trials):
            prompt = e.render(t)
            for j, option in enumerate(e.option_ids(t)):
                seqs.append((k, j, len(prompt), list(prompt) + list(option)))
        seqs.sort(key=lambda s: -len(s[3]))
        out = [[0.0] * len(t.options) for t in trials]
        pad = e.tokenizer.pad_token_id
        with torch.inference_mode():
            for lo in range(0, len(seqs), self.batch):
                chunk = seqs[lo : lo + self.batch]
                width = max(len(s[3]) for s in chunk)
                ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for r, (_, _, _, s) in enumerate(chunk):
                    ids[r, : len(s)] = torch.tensor(s)
                    mask[r, : len(s)] = 1
                logits = e.model(input_ids=ids.to(e.device), attention_mask=mask.to(e.device)).logits
                lp = torch.log_softmax(logits, dim=-1)
                for r, (k, j, n, s) in enumerate(chunk):
                    pos = torch.arange(n - 1, len(s) - 1, device=lp.device)
                    tok = torch.tensor(s[n:], device=lp.device)
                    out[k][j] = float(lp[r, pos, tok].float().sum())
        return out


def generate_draws(engine: Any, trials: Sequence[Any], n: int, max_new: int, seed: int = 0) -> int:
    """The bench's ``generate()`` peer (:class:`scripts.bench.sampling.GenerateSampler`: ``do_sample=True,
    num_return_sequences=n``, raw sampling at temperature 1) on ``trials`` in one batch; the tokens it generated."""
    from scripts.bench.sampling import GenerateSampler

    return sum(count for _, count, _ in GenerateSampler(engine, len(trials), seed).run(trials, n, max_new))


def target(name: str, value: float, bound: float, *, below: bool, cpu: bool, what: str) -> dict[str, Any]:
    """One target row: the measured value against its bound, pass/fail (on a CPU: for the record)."""
    ok = value <= bound if below else value >= bound
    return {
        "check": "target",
        "target": name,
        "what": what,
        "value": value,
        "bound": bound,
        "passed": bool(ok),
        "counts": not cpu,
    }


def mixed_request(engine: Any, trials: Sequence[Any], budget: int, short: int) -> Any:
    """A greedy think request whose first trace runs to ``budget`` and every other ends within its first ``short``
    tokens: the issue's worst case for a bucket schedule (one looping trace holds its batch).

    The traces are generated once with no end; then each other trace's end set gets the first token it emits at
    or after a position below ``short`` that trace 0 never emits, so on the second pass trace 0 never ends early
    and the others do (up to rounding outside float32, which the figures then show).
    """
    base = replace(engine.think_request(trials), budget=budget)
    never = replace(base, end_id=-1, stops=frozenset())
    traces = engine.variant(reasoning_refill=False)._reason(never)
    avoid = set(traces[0])
    ends = []
    for j, trace in enumerate(traces[1:], 1):
        at = (5 * j) % short  # spread the ends over the first `short` tokens, then take any of them
        found = [t for t in (*trace[at:short], *trace[:at]) if t not in avoid]
        if found:
            ends.append(found[0])
    if not ends:
        raise RuntimeError("every trace emits only trace 0's tokens: no end set separates them")
    return replace(base, end_id=ends[0], stops=frozenset(ends[1:]))


def decode_figures(t: dict[str, Any], rows: int, floor_s: float, scale: float) -> dict[str, Any]:
    """A timed decode step's figures (``t`` from :func:`timed`): per step, at 48 layers (``scale`` = 48 / layers),
    tokens per second, and against the weight-read floor ``floor_s``."""
    return {
        **t,
        "ms": 1e3 * t["median_s"],
        "ms_48_layers": 1e3 * t["median_s"] * scale,
        "tokens_per_s": rows / t["median_s"],
        "weight_read_floor_ms": 1e3 * floor_s,
        "over_floor": t["median_s"] / floor_s,
    }


def same_tokens_share(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> float:
    """The share of ``a``'s tokens that ``b`` has at the same place (row by row, position by position)."""
    same = sum(x == y for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=False))
    return same / max(1, sum(len(r) for r in a))


def experts_choice(phase: str, chosen: str, seconds: dict[str, float]) -> dict[str, Any]:
    """The record of whether the engine's auto choice for ``phase`` is the fastest of the implementations timed
    (``seconds``: median per implementation): the evidence the defaults of ``--hf-experts-*`` rest on."""
    fastest = min(seconds, key=seconds.__getitem__)
    return {
        "check": "moe",
        "what": f"experts choice, {phase}",
        "auto": chosen,
        "fastest": fastest,
        "auto_over_fastest": seconds[chosen] / seconds[fastest],
        "median_s": seconds,
    }


def generate_step(
    model: Any,
    ids: Any,
    mask: Any,
    pad: int,
    sync: Callable[[], None],
    *,
    static: bool,
    short: int,
    long: int,
    cache_kw: str = "past_key_values",
) -> dict[str, Any]:
    """Transformers' own greedy decode step on ``model`` at this batch, warm: ``generate()`` of ``long`` new tokens
    minus ``short`` new tokens, over ``long - short`` (the prefill cancels).

    ``static``: a static KV cache of one length for every call (``StaticCache``), which ``generate()`` on a GPU
    compiles (``torch.compile``, CUDA graphs: Transformers' answer to a launch-bound decode); else the dynamic cache,
    compilation off. Each length's first call is its warm-up (:func:`timed`), so compiling is not timed; its cost is
    ``warm_up_s``. The long call's tokens are returned for the agreement check. ``cache_kw``: the name the
    model's forward takes its cache by (``past_key_values``, ``cache`` from Transformers 5.25).
    """
    import transformers

    room = ids.shape[1] + long

    def gen(n: int) -> Any:
        kw: dict[str, Any] = {"disable_compile": True}
        if static:
            kw = {cache_kw: transformers.StaticCache(config=model.config, max_cache_len=room)}
        return model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
            pad_token_id=pad, **kw,
        )  # fmt: skip

    t0 = time.perf_counter()
    gen(short)
    sync()
    warm_up = time.perf_counter() - t0
    _, t_short = timed(lambda: gen(short), sync)
    tokens, t_long = timed(lambda: gen(long), sync)
    return {
        "ms_per_step": 1e3 * (t_long["median_s"] - t_short["median_s"]) / (long - short),
        "short": t_short,
        "long": t_long,
        "warm_up_s": warm_up,
        "tokens": tokens[:, ids.shape[1] :].tolist(),
    }


def slot_step(engine: Any, prompt: Sequence[int], rows: int, room: int) -> tuple[Callable[[], Any], Any]:
    """The engine's slot decoding step (:class:`engines.hf.graphs.SlotDecoder`, ``--hf-decode-graphs on``) at ``rows``
    rows of ``prompt``, each slot with ``room`` columns after it: recorded in a CUDA graph on one GPU (the
    engine's own :meth:`~engines.hf.reasoning.Reasoner.capture_mode`), unrecorded on a CPU. Returns the step (each call
    rewrites the same column from the same inputs, so repeats time the same work) and the decoder (its
    ``graphs``, ``capture_s`` and ``failed`` are the record)."""
    import torch

    from engines.hf.graphs import span_of

    capacity = len(prompt) + room
    dec = engine.reasoner.slot_decoder(rows, capacity)
    with torch.inference_mode():
        ids, mask = engine.lm.pad_left([prompt])
        lp, cache = engine.lm.forward(ids, mask, None)
        first = int(lp.argmax(-1))
        for slot in range(rows):
            dec.admit(slot, cache, 0, len(prompt), first)
    span = span_of(len(prompt) + 1, capacity)

    def step() -> Any:
        with torch.inference_mode():
            return dec.step(span)

    return step, dec
