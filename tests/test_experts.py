"""A mixture-of-experts model computes each phase in its own experts implementation (issue 44): grouped_mm to
prefill, and on a GPU batched_mm to decode (Transformers' generate() rule), each settable; the same tokens in
float32 whichever it is, and the choice in the run key outside float32."""

from __future__ import annotations

import pytest

from engines.hf.weights import Experts, experts_by_phase
from tests.conftest import make_trial


@pytest.mark.parametrize(
    ("loaded", "device", "prefill", "decode", "want"),
    [
        ("grouped_mm", "cuda", "auto", "auto", Experts("grouped_mm", "batched_mm")),  # generate()'s switch
        ("grouped_mm", "cpu", "auto", "auto", Experts("grouped_mm", "grouped_mm")),  # faster on a CPU
        ("eager", "cuda", "auto", "auto", Experts("eager", "eager")),  # only grouped_mm is switched
        ("grouped_mm", "cuda", "eager", "auto", Experts("eager", "eager")),
        ("grouped_mm", "cuda", "auto", "grouped_mm", Experts("grouped_mm", "grouped_mm")),
        ("grouped_mm", "cpu", "auto", "batched_mm", Experts("grouped_mm", "batched_mm")),
        (None, "cuda", "grouped_mm", "batched_mm", None),  # no experts: nothing to switch
    ],
)
def test_each_phase_s_implementation(loaded, device, prefill, decode, want) -> None:
    assert experts_by_phase(loaded, device, prefill, decode) == want


def test_a_decoding_step_is_one_token_per_row() -> None:
    e = Experts("grouped_mm", "batched_mm")
    assert (e.of(1), e.of(2), e.of(300)) == ("batched_mm", "grouped_mm", "grouped_mm")


def test_bad_settings_name_the_choices() -> None:
    from engines.hf.settings import HFSettings

    with pytest.raises(ValueError, match=r"experts_decode must be one of .*'batched_mm'.*got 'bmm'"):
        HFSettings(model="tiny", experts_decode="bmm")


def _engine(**settings):
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    s = {"model": "tiny", "device": "cpu", "dtype": "float32", "think": True, "think_budget": 12, **settings}
    return HFEngine(HFSettings(**s)).load()


def _spy(engine) -> list[tuple[int, str]]:
    """(new tokens per row, experts implementation) of every forward of ``engine``'s model from now on."""
    from engines.hf.weights import model_experts

    model, seen = engine.model, []
    forward = model.forward

    def spied(*args, **kwargs):
        seen.append((kwargs["input_ids"].shape[1], model_experts(model)))
        return forward(*args, **kwargs)

    model.forward = spied
    return seen


TRIALS = [
    make_trial(f"Case {k}: is it acceptable to push the man? Answer with Yes or No.", ("Yes", "No"), trial_id=f"x{k}")
    for k in range(3)
]


def test_the_engine_decodes_in_the_decode_implementation_and_reads_the_same() -> None:
    """float32 on tiny (a Qwen3-MoE): think mode's reasoning (prefill, then decoding steps) and the slot readout;
    with batched_mm decoding every decoding step runs batched_mm and every other forward grouped_mm, and the
    readouts agree with grouped_mm throughout within 1e-5 (the same experts' sums in another order)."""
    base = _engine()
    other = base.variant(experts_decode="batched_mm")
    a = base.readout(TRIALS)
    seen = _spy(other)  # the model the two share: from here on, the variant's forwards
    b = other.readout(TRIALS)
    assert {impl for n, impl in seen if n == 1} == {"batched_mm"}
    assert {impl for n, impl in seen if n > 1} == {"grouped_mm"}
    for ra, rb in zip(a, b, strict=True):
        assert ra.reasoning == rb.reasoning
        for sa, sb in zip(ra.scores, rb.scores, strict=True):
            assert sb.logprob == pytest.approx(sa.logprob, abs=1e-5)
    assert base.numerics()["experts"] == {"prefill": "grouped_mm", "decode": "grouped_mm"}
    assert other.numerics()["experts"] == {"prefill": "grouped_mm", "decode": "batched_mm"}


def test_engines_sharing_a_model_each_compute_their_own_implementation() -> None:
    """A variant that switched the shared model does not leave the parent computing in its implementation."""
    base = _engine()
    other = base.variant(experts_prefill="eager", experts_decode="eager")
    other.readout(TRIALS[:1])
    seen = _spy(base)
    base.readout(TRIALS[:1])
    assert seen and {impl for _, impl in seen} == {"grouped_mm"}


def test_a_model_without_experts_has_no_experts_numerics() -> None:
    e = _engine(model="tiny-hybrid-dense", think=False)
    assert "experts" not in e.numerics()
