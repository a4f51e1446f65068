"""The GPU check's steps on the tiny models: parity, sampling, the split model and the lens frame.

:func:`step_parity` compares every readout path x dtype on the device with float32 on the CPU
(float32 within :data:`FLOAT32_BOUND`); :func:`step_sampling` checks seeded draws on every sampling path and
the CUDA-graph slot steps (:func:`graphs_logprobs`, within :data:`GRAPHS_BOUND`); :func:`step_split` runs the
model split over two devices (:func:`split_map`) against the model in one place; :func:`step_lens_frame`
the layer readouts (:func:`layer_difference`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from scripts.device.trials import difference, engine, parity_trials, paths_of

FLOAT32_BOUND = 1e-5
"""Most |logprob_device - logprob_cpu| in float32 on the 2-layer tiny models (CPU vs CPU paths: under 2e-6)."""
GRAPHS_BOUND = 1e-4
"""Most |logprob| between a float32 slot step and the whole-sequence forward over the same tokens (a decode step
and a full forward sum in other orders: 7.6e-6 on tiny under ``ATEN_CPU_CAPABILITY=default``); a number frozen in a
recording feeds wrong positions or columns and moves them by far more."""


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

    from engines.hf.graphs import span_of

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
