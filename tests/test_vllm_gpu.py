"""vLLM on a GPU: engine conformance and parity with the Transformers engine on the tiny models.

Skipped cleanly without vLLM or without a CUDA device (``scripts/device_check.sh``
runs it on a GPU machine). Parity tolerance, on the option probabilities of
the same prompt ids: 1e-4 in float32, 2e-3 in bfloat16 (both engines in the
same dtype on the same GPU). Measured numbers go to ``$PROBE_DEVICE_REPORT``
(a JSON-lines file) when it is set, for the device check's summary line.
"""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm installs it into .venv-vllm)")

from tests.conftest import make_trial  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-3}
SCALE = "How acceptable is it? On a scale from 0 to 100, answer with a number only."
YESNO = "You are on a bridge. Is it morally acceptable to push the man? Answer with Yes or No."
LETTERS = "Which is more likely?\nA. Tom went home\nB. Tom fell asleep\nAnswer with A or B."


def report(**row: object) -> None:
    path = os.environ.get("PROBE_DEVICE_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def trials():
    return [
        make_trial(YESNO, ["Yes", "No"], trial_id="yesno"),
        make_trial(SCALE, [str(i) for i in range(101)], trial_id="scale"),
        make_trial(LETTERS, ["A", "B", "C"], trial_id="letters"),
        make_trial(YESNO, ["Yes", "No"], trial_id="prefix", prefix="Answer:"),
        make_trial(YESNO, ["Yes, it is", "No", "Yes"], trial_id="multiword"),
    ]


def vllm_engine(model: str, dtype: str, **kw):
    from engines.vllm.engine import VLLMEngine
    from engines.vllm.settings import VLLMSettings

    s = VLLMSettings(model=model, dtype=dtype, gpu_memory_utilization=0.3, enforce_eager=True, max_model_len=1024, **kw)
    return VLLMEngine(s).load()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", ["tiny", "tiny-hybrid"])
def test_parity_with_the_transformers_engine(model: str, dtype: str) -> None:
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    ts = trials()
    v = vllm_engine(model, dtype, mamba_cache_dtype="float32" if dtype == "float32" else "auto")
    got = v.readout(ts)
    hf = HFEngine(HFSettings(model=model, device="cuda", dtype=dtype)).load()
    ref = hf.readout(ts)
    diff = 0.0
    for a, b in zip(got, ref, strict=True):
        assert a.prompt_ids == b.prompt_ids  # the same slot after the same ids
        assert [s.token_ids for s in a.scores] == [s.token_ids for s in b.scores]
        diff = max(diff, max(abs(s.prob - t.prob) for s, t in zip(a.scores, b.scores, strict=True)))
    many = [make_trial(f"Case {i}. {YESNO}", ["Yes", "No"], trial_id=f"n{i}") for i in range(512)]
    v.readout(many[:8])  # warm
    t0 = time.perf_counter()
    v.readout(many)
    rate = len(many) / (time.perf_counter() - t0)
    report(check="parity", model=model, dtype=dtype, max_prob_diff=diff, readouts_per_s=rate, stats=v.stats)
    assert diff <= TOLERANCE[dtype], f"{model} {dtype}: max |p_vllm - p_hf| = {diff:.2e} > {TOLERANCE[dtype]}"


@pytest.mark.parametrize("model", ["tiny", "tiny-hybrid"])
def test_conformance_order_trie_think_and_samples(model: str) -> None:
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings
    from engines.render import render_ids

    v = vllm_engine(model, "float32", mamba_cache_dtype="float32")
    ts = trials()
    rs = v.readout(list(reversed(ts)))[::-1]
    assert [r.trial_id for r in rs] == [t.trial_id for t in ts]
    scale = rs[1]
    n = {s.option: len(s.token_ids) for s in scale.scores}
    assert (n["7"], n["10"], n["100"]) == (1, 2, 3) and scale.computed_tokens > scale.prompt_tokens
    assert all(math.isclose(sum(s.prob for s in r.scores), 1.0, abs_tol=1e-9) and r.coverage <= 1 + 1e-6 for r in rs)
    assert v.stats["cached_tokens"] > 0  # the trie follow-ups read the prompts from the prefix cache

    think = vllm_engine(model, "float32", mamba_cache_dtype="float32", think=True, think_budget=12)
    hf = HFEngine(HFSettings(model=model, device="cuda", dtype="float32", think=True, think_budget=12)).load()
    for r, t in zip(think.readout(ts[:2]), ts[:2], strict=True):
        base = render_ids(think.tokenizer, t, think=True)
        assert r.prompt_ids[: len(base)] == base and r.reasoning_tokens > 0
        assert think.tokenizer.decode(list(r.prompt_ids[len(base) :])).endswith("</think>\n\n")
        # the Transformers model, run whole on the same concatenated ids, gives the same option probabilities
        ref = chain_rule(hf.model, r.prompt_ids, [s.token_ids for s in r.scores])
        np.testing.assert_allclose([s.logprob for s in r.scores], ref, atol=1e-4)

    samples = v.sample(ts[:1], n=20, temperature=1.0)
    assert sum(s.status == "ok" for s in samples) >= 10  # the trained tiny model answers in format
    again = v.sample(ts[:1], n=20, temperature=1.0)
    assert [s.text for s in again] == [s.text for s in samples]  # seeded per draw


def chain_rule(model, prompt, options) -> list[float]:
    """log P(option is the whole answer) from plain full-sequence forwards (no cache, no trie)."""
    dev = next(model.parameters()).device
    out = []
    for o in options:
        with torch.inference_mode():
            full = torch.tensor([list(prompt) + list(o)], device=dev)
            lp = torch.log_softmax(model(input_ids=full).logits[0].double(), dim=-1)
        start = len(prompt) - 1
        total = sum(float(lp[start + i, t]) for i, t in enumerate(o))
        conts = {oo[len(o)] for oo in options if len(oo) > len(o) and tuple(oo[: len(o)]) == tuple(o)}
        if conts:
            total += math.log1p(-math.fsum(math.exp(float(lp[start + len(o), c])) for c in conts))
        out.append(total)
    return out
