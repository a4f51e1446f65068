"""An engine derived from a loaded one (variant, reading_alone, without_reasoning) is the same engine with other
settings: it reads exactly what a freshly loaded engine with those settings reads, in bfloat16, where the head's
dtype shows (issue: every variant used to compute the head in bfloat16 even with head_dtype float32)."""

from __future__ import annotations

import pytest

from tests.conftest import make_trial

TRIALS = [
    make_trial(f"Case {k}: is it acceptable to push the man? Answer with Yes or No.", ("Yes", "No"), trial_id=f"v{k}")
    for k in range(3)
] + [
    make_trial("How acceptable is it? On a scale from 0 to 10, answer with a number only.", [str(i) for i in range(11)])
]


def _fresh(**settings):
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    return HFEngine(HFSettings(model="tiny", device="cpu", dtype="bfloat16", **settings)).load()


def _logprobs(readouts):
    return [[s.logprob for s in r.scores] for r in readouts]


@pytest.fixture(scope="module")
def parent():
    return _fresh(head_dtype="float32")


def test_reading_alone_reads_what_a_fresh_plain_batch_one_engine_reads(parent) -> None:
    alone = parent.reading_alone()
    assert alone.numerics()["head_dtype"] == "float32"
    assert _logprobs(alone.readout(TRIALS)) == _logprobs(_fresh(batch_size=1, readout_path="plain").readout(TRIALS))


@pytest.mark.parametrize("path", ["tree", "branch", "plain"])
def test_a_variant_reads_what_its_parent_reads_on_the_same_path_and_batch(parent, path: str) -> None:
    same = parent.variant(readout_path=path)
    fresh = _fresh(readout_path=path)
    assert same.numerics() == fresh.numerics()
    assert same.describe()["placement"] == parent.describe()["placement"]
    assert _logprobs(same.readout(TRIALS)) == _logprobs(fresh.readout(TRIALS))


def test_the_head_dtype_is_derived_per_variant_and_shows_in_bfloat16(parent) -> None:
    model_head = parent.variant(head_dtype="model")
    assert model_head.numerics()["head_dtype"] == "model"
    assert parent.variant(batch_size=2).numerics()["head_dtype"] == "float32"
    a = _logprobs(parent.variant(readout_path="plain").readout(TRIALS))
    b = _logprobs(model_head.variant(readout_path="plain").readout(TRIALS))
    assert a != b  # the bfloat16 head rounds the logits: the two heads must not read the same
    # and sharing the weights changed nothing for the parent: it still reads with its float32 head
    assert _logprobs(parent.variant(readout_path="plain").readout(TRIALS)) == a


def test_without_reasoning_is_the_engine_outside_think_mode() -> None:
    thinking = _fresh(think=True, think_budget=4)
    bare = thinking.without_reasoning()
    assert bare.settings.think is False and bare.numerics()["head_dtype"] == "float32"
    assert _logprobs(bare.readout(TRIALS)) == _logprobs(_fresh().readout(TRIALS))


def test_half_precision_attention_on_a_cpu_without_avx512_takes_the_math_kernel() -> None:
    """torch's CPU flash attention fails in bfloat16 over 64+ tokens outside its AVX-512 build (engines/hf/weights.py,
    math_attention): there the engine asks for the math kernel; elsewhere nothing changes."""
    import torch

    from engines.hf.weights import math_attention

    assert math_attention("cpu", torch.bfloat16, "DEFAULT") and math_attention("cpu", torch.float16, "AVX2")
    assert not math_attention("cpu", torch.bfloat16, "AVX512")
    assert not math_attention("cpu", torch.float32, "DEFAULT") and not math_attention("cuda", torch.bfloat16, "AVX2")
