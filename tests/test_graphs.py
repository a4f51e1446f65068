"""Slot decoding (engines/hf/graphs.py): the span buckets by hand, slots against the refilled stack on the tiny model,
and every step recorded and replayed (torch.fx, a CUDA graph's frozen-number semantics) on a CPU."""

from __future__ import annotations

import math

import pytest
import torch

from engines.hf.graphs import SPAN_QUANTUM, SlotDecoder, span_of
from tests.test_refill import _engine, _mixed_request, _trial


def test_spans_by_hand() -> None:
    assert [span_of(c, 10**6) for c in (1, 128, 129, 256, 1000, 1024, 1025)] == [128, 128, 256, 256, 1024, 1024, 1152]
    assert span_of(1153, 10**6) == 1408  # 1152 * 9 / 8 = 1296, rounded up to a multiple of 128
    assert span_of(250, 260) == 256
    assert span_of(259, 260) == 260  # capped at the capacity
    for bad in (0, 261):
        with pytest.raises(ValueError, match=rf"columns must be in 1..capacity \(260\), got {bad}"):
            span_of(bad, 260)


def test_spans_read_at_most_an_eighth_more_and_are_few() -> None:
    """Every span, brute force over a 32,768-token budget: at least the columns, at most 9/8 of them plus one
    quantum, and 38 distinct spans (so 38 graphs) at most."""
    capacity = 32768 + 600
    spans = [span_of(c, capacity) for c in range(1, capacity + 1)]
    assert all(c <= s <= min(capacity, math.ceil(c * 9 / 8) + SPAN_QUANTUM) for c, s in enumerate(spans, 1))
    assert spans == sorted(spans)
    assert len(set(spans)) <= 40


def _patched_fx(monkeypatch) -> None:
    """Record every slot step with torch.fx (the CPU stand-in for CUDA graph capture)."""
    from engines.hf.reasoning import Reasoner

    monkeypatch.setattr(Reasoner, "capture_mode", lambda self: "fx")


@pytest.fixture(scope="module")
def mixed():
    """Think requests on tiny (float32, temperature 1.5, 16 trials, one to the budget of 120), with the refilled
    stack's traces and tally: the reference the slots are held to."""
    rows = 4
    refilled = _engine("tiny", batch_size=rows, think_budget=120, think_temperature=1.5)
    request = _mixed_request(refilled, 16)
    traces = refilled._reason(request)
    assert sorted(len(g) for g in traces)[-1] == 120
    return refilled, request, traces, refilled.run_stats()["reasoning"]


@pytest.mark.parametrize("recorded", [False, True], ids=["unrecorded", "fx-recorded"])
def test_slots_reason_the_refilled_tokens(monkeypatch, mixed, recorded: bool) -> None:
    """float32, sampled at temperature 1.5 with one trace to the budget: slots draw each trial the tokens of the
    refilled stack in the same number of steps; recorded, each span's step is recorded once and replayed after
    (tokens and lengths change between replays, so a number frozen at recording would change the tokens).
    Deterministic: fixed prompts and seeds."""
    refilled, request, expected, ra = mixed
    slots = refilled.variant(decode_graphs="on")
    if recorded:
        _patched_fx(monkeypatch)
    assert slots._reason(request) == expected
    rb = slots.run_stats()["reasoning"]
    assert rb["schedule"] == "slots" and rb["tokens"] == ra["tokens"] and rb["steps"] == ra["steps"]
    # the last traces move to the front and fewer slots compute: about the stack's step-rows (204 here), not
    # every slot's at every step (4 x 119)
    assert rb["step_rows"] <= 1.1 * ra["step_rows"] < ra["rows"] * rb["steps"]
    assert (rb["graphs"] >= 1 if recorded else rb["graphs"] == 0) and rb["graphs_failed"] is None
    assert slots.numerics()["reasoning_schedule"] == "slots"


def _request(e, n: int, budget: int):
    """Greedy think requests of ``n`` prompts of different lengths with no end token: every trace runs to
    ``budget``."""
    from engines.local import ThinkRequest

    prompts = tuple(e.render(_trial(f"Dilemma {k}: is it right to lie?" + " Think." * (3 * k), k)) for k in range(n))
    return ThinkRequest(prompts, tuple(range(n)), budget, end_id=-1, stops=frozenset())


def test_recorded_spans_grow_with_the_traces(monkeypatch) -> None:
    """Greedy traces over several spans: one recording per span reached, replayed at every later step of that
    span, and the tokens of the refilled stack."""
    _patched_fx(monkeypatch)
    refilled = _engine("tiny", batch_size=2, think_budget=260)
    slots = refilled.variant(decode_graphs="on")
    request = _request(refilled, 3, 260)
    a, b = refilled._reason(request), slots._reason(request)
    assert a == b and all(len(g) == 260 for g in b)
    capacity = max(map(len, request.prompts)) + 260
    first = min(map(len, request.prompts)) + 1
    reached = {span_of(c, capacity) for c in range(first, capacity)}
    assert len(reached) >= 3 and slots.run_stats()["reasoning"]["graphs"] == len(reached)


def test_a_frozen_number_is_caught_by_the_recording(monkeypatch) -> None:
    """The control: a step that reads the positions (and write columns) as Python numbers, frozen when recorded,
    replays them at every later step, and the recorded slots then draw other tokens than the refilled stack. So
    the recorded tests above can fail; unrecorded, the same step draws the right tokens."""
    refilled = _engine("tiny", batch_size=3, think_budget=40)
    slots = refilled.variant(decode_graphs="on")
    request = _request(refilled, 3, 40)
    expected = refilled._reason(request)
    monkeypatch.setattr(SlotDecoder, "_run", _run_from_host_numbers)
    assert slots._reason(request) == expected
    _patched_fx(monkeypatch)
    assert slots._reason(request) != expected


_REAL_RUN = SlotDecoder._run


def _run_from_host_numbers(dec: SlotDecoder, span: int) -> None:
    """:meth:`SlotDecoder._run` with the lengths (positions and write columns) read as host numbers (``tolist``)
    into a tensor made anew: the mistake a recording freezes."""
    lengths = dec.lengths
    dec.lengths = dec._at.lengths = torch.tensor(lengths.tolist(), device=lengths.device)
    try:
        _REAL_RUN(dec, span)
    finally:
        dec.lengths = dec._at.lengths = lengths


def test_think_draws_and_readouts_through_slots(monkeypatch) -> None:
    """float32: think mode's draws (reasoning, then the answer) and readouts through recorded slots are those of
    the refilled stack, draw for draw. Deterministic: fixed prompts and seeds."""
    _patched_fx(monkeypatch)
    trials = [
        _trial(f"Dilemma {k}: should you tell the truth? Answer with Yes or No." + " Think." * (k % 4), k)
        for k in range(5)
    ]
    refilled = _engine("tiny", think_budget=40, max_new_tokens=8, sample_rows=6, batch_size=3)
    slots = refilled.variant(decode_graphs="on")
    a, b = refilled.sample(trials, 3, 1.5), slots.sample(trials, 3, 1.5)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert slots.run_stats()["think_draws"]["schedule"] == "slots"
    x, y = refilled.readout(trials), slots.readout(trials)
    for r, q in zip(x, y, strict=True):
        assert r.reasoning_tokens == q.reasoning_tokens
        assert max(abs(s.logprob - t.logprob) for s, t in zip(r.scores, q.scores, strict=True)) < 1e-5


def test_the_setting_and_what_it_changes_in_the_run_key() -> None:
    from engines.hf.settings import HFSettings

    with pytest.raises(ValueError, match=r"decode_graphs must be one of \('auto', 'on', 'off'\), got 'yes'"):
        HFSettings(model="tiny", decode_graphs="yes")
    tiny = _engine("tiny", think_budget=6)
    assert tiny.numerics()["reasoning_schedule"] == "refill"  # auto: off until a GPU has measured graphs
    assert tiny.variant(decode_graphs="off").numerics() == tiny.numerics()
    assert tiny.variant(decode_graphs="on").numerics()["reasoning_schedule"] == "slots"
    assert tiny.variant(decode_graphs="on", reasoning_refill=False).numerics()["reasoning_schedule"] == "buckets"
    hybrid = _engine("tiny-hybrid", think_budget=6, decode_graphs="on")  # a Mamba state has no columns to slot
    assert hybrid.numerics()["reasoning_schedule"] == "buckets"
    assert tiny.variant(decode_graphs="on")._reasoner.capture_mode() is None  # a CPU records nothing


def test_bfloat16_slots_reason() -> None:
    """bfloat16 on the CPU: slots run (the step's mask in the model's dtype) and most greedy tokens are the
    stack's (rounding may differ over the extra masked columns, so the schedule enters the run key)."""
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    settings = HFSettings(model="tiny", device="cpu", dtype="bfloat16", think=True, batch_size=3, think_budget=40)
    refilled = HFEngine(settings).load()
    slots = refilled.variant(decode_graphs="on")
    assert str(next(slots.model.parameters()).dtype) == "torch.bfloat16"
    request = _request(refilled, 3, 40)
    a, b = refilled._reason(request), slots._reason(request)
    assert all(len(g) == 40 for g in b)
    same = sum(x == y for ga, gb in zip(a, b, strict=True) for x, y in zip(ga, gb, strict=True))
    assert same / 120 > 0.5


def test_shrink_moves_the_live_slots_to_the_front_in_place() -> None:
    """By hand on tiny's prefill: slots 2 and 0 of 4 move to 0 and 1 (keys, values, tokens, lengths), the buffers
    keep their addresses (recorded graphs stay valid), and a step then computes the 2 slots it had for them."""
    e = _engine("tiny", batch_size=4)
    prompts = [e.render(_trial(f"Dilemma {k}: is it right to lie?" + " Think." * k, k)) for k in range(4)]
    with torch.inference_mode():
        ids, mask = e.lm.pad_left(prompts)
        _, cache = e.lm.forward(ids, mask, None)
        dec = SlotDecoder(e.lm.call, e.model.config, 4, 200, e.device, capture=None, cache_kw=e.lm.cache_kw)
        for k, p in enumerate(prompts):
            dec.admit(k, cache, k, len(p), 10 + k)
        full = dec.step(128)[[2, 0]].clone()
        layer = dec.cache.layers[0]
        k2, k0, address = layer._k[2].clone(), layer._k[0].clone(), layer._k.data_ptr()
        used = max(len(prompts[2]), len(prompts[0]))
        assert dec.shrink([2, 0], used) == 2 and dec.size == 2
        assert torch.equal(layer._k[0, :, :used], k2[:, :used]) and torch.equal(layer._k[1, :, :used], k0[:, :used])
        assert layer._k.data_ptr() == address
        assert dec.tokens[:2, 0].tolist() == [12, 10] and dec.lengths[:2].tolist() == [len(prompts[2]), len(prompts[0])]
        assert torch.allclose(dec.step(128)[:2], full, atol=1e-5)  # the same step for those traces, on 2 slots
        with pytest.raises(ValueError, match="cannot keep 3 slots of 2"):
            dec.shrink([0, 1, 0], used)
        with pytest.raises(ValueError, match=r"span must be in 1..capacity \(200\), got 256"):
            dec.step(256)


def test_recorded_slots_in_batched_mm_the_gpus_decode_experts(monkeypatch) -> None:
    """The experts implementation a GPU decodes in by default (batched_mm: each token's experts' weights
    gathered by index, no host numbers), recorded and replayed: the refilled stack's greedy tokens."""
    _patched_fx(monkeypatch)
    refilled = _engine("tiny", batch_size=3, think_budget=40, experts_decode="batched_mm")
    slots = refilled.variant(decode_graphs="on")
    request = _request(refilled, 4, 40)
    assert refilled._reason(request) == slots._reason(request)
    assert slots.experts is not None and slots.experts.decode == "batched_mm"
    assert slots.run_stats()["reasoning"]["graphs"] >= 1
