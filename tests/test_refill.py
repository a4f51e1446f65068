"""Refilled think-mode reasoning (engines/hf/refill.py): the schedule by hand, the stacked cache against a row decoded
alone, and whole traces against the bucket schedule on the tiny models."""

from __future__ import annotations

import pytest
import torch

from engines.hf.refill import ReasoningStats, Schedule
from tests.conftest import make_trial

YES_NO = ("Yes", "No")


def _trial(text: str, k: int):
    return make_trial(text, YES_NO, trial_id=f"t{k}")  # the trial id seeds its reasoning


def test_schedule_admits_in_order_and_refills_once_an_eighth_is_free() -> None:
    plan = Schedule(range(20), rows=16)
    assert plan.compacts()  # an empty cache admits at once
    keep, admit = plan.compact()
    assert (keep, admit) == ([], list(range(16)))
    assert list(plan.waiting) == [16, 17, 18, 19]
    plan.end(3)
    assert not plan.compacts()  # 1 free row of 16: under an eighth (2), and 4 wait
    plan.end(7)
    assert plan.compacts()
    keep, admit = plan.compact()
    assert keep == [r for r in range(16) if r not in (3, 7)]
    assert admit == [16, 17]
    assert plan.slots == [i for i in range(16) if i not in (3, 7)] + [16, 17]
    for i in (0, 1, 2, 4):  # 4 free, 2 waiting: every waiting trial fits
        plan.end(i)
    assert plan.compacts()
    keep, admit = plan.compact()
    assert admit == [18, 19] and len(plan.slots) == 14 and not plan.waiting
    plan.end(5)  # none waiting: drop finished rows once they are an eighth of the cache (2 of 14)
    assert not plan.compacts()
    plan.end(6)
    assert plan.compacts()
    keep, admit = plan.compact()
    assert admit == [] and len(plan.slots) == 12 and plan.live == 12


def test_schedule_refuses_no_rows() -> None:
    with pytest.raises(ValueError, match="rows must be >= 1, got 0"):
        Schedule(range(3), rows=0)


def test_stats_record_the_share_of_finished_rows_and_the_ideal() -> None:
    s = ReasoningStats(traces=3, tokens=30, steps=24, rows=2, step_rows=40, finished_step_rows=10, longest=20)
    r = s.record()
    assert r["finished_share"] == 0.25
    assert r["steps_over_ideal"] == round(24 / (30 / 2 + 20), 4)
    total = ReasoningStats(schedule="refill")
    total.add(s)
    total.add(s)
    assert total.record()["tokens"] == 60 and total.record()["rows"] == 2 and total.record()["schedule"] == "refill"


def _engine(model: str, **settings):
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    return HFEngine(HFSettings(model=model, device="cpu", dtype="float32", think=True, **settings)).load()


def test_a_stacked_row_decodes_as_it_does_alone() -> None:
    """Rows of two prefills of different widths, stacked and trimmed, give each row the log-probs it gets alone."""
    from engines.hf.refill import stacked

    e = _engine("tiny", batch_size=4)
    prompts = [e.render(_trial(f"Question {k}: is it right to lie?" + " why" * (3 * k), k)) for k in range(4)]
    with torch.inference_mode():
        ids_a, mask_a = e.lm.pad_left(prompts[:2])
        _, cache_a = e.lm.forward(ids_a, mask_a, None)
        ids_b, mask_b = e.lm.pad_left(prompts[2:])
        _, cache_b = e.lm.forward(ids_b, mask_b, None)
        cache, mask = stacked([(cache_a, mask_a, [1]), (cache_b, mask_b, None)], 4, e.model.config)
        assert mask.shape[0] == 3 and bool(mask[:, 0].any())  # the unused left columns were cut
        step = torch.tensor([[5], [6], [7]])
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        lp, _ = e.lm.forward(step, mask, cache)
        for row, (prompt, tok) in enumerate(zip([prompts[1], prompts[2], prompts[3]], [5, 6, 7], strict=True)):
            ids, m = e.lm.pad_left([prompt])
            _, c = e.lm.forward(ids, m, None)
            alone, _ = e.lm.forward(torch.tensor([[tok]]), torch.cat([m, torch.ones_like(m[:, :1])], 1), c)
            assert float((lp[row] - alone[0]).abs().max()) < 1e-5


def _mixed_request(e, n: int):
    """Think requests on tiny, sampled at temperature 1.5, whose first trace runs to the budget (120) and every
    other ends within 24 tokens (:func:`scripts.device_moe.mixed_request`: end tokens chosen from the traces
    themselves, so on any CPU's trained tiny), seeded per trial."""
    from scripts.device_moe import mixed_request

    trials = [_trial(f"Dilemma {k}: should you tell the truth? " + "Think. " * (k % 5), k) for k in range(n)]
    return mixed_request(e, trials, 120, 24)


def test_refill_gives_every_trace_its_tokens_in_fewer_steps() -> None:
    """float32: refilled and bucketed reasoning draw the same tokens per trial (each row has its own seeded
    generator and a padded column adds exactly zero), and refill takes at most 1.3 x (tokens / rows + longest)
    steps. Deterministic: fixed prompts and seeds."""
    rows = 4
    bucketed = _engine("tiny", batch_size=rows, think_budget=120, think_temperature=1.5, reasoning_refill=False)
    refilled = bucketed.variant(reasoning_refill=True)
    request = _mixed_request(bucketed, 16)
    a = bucketed._reason(request)
    b = refilled._reason(request)
    lengths = sorted(len(g) for g in a)
    assert lengths[-1] == 120 and lengths[-2] <= 24  # one trace to the budget, the rest short
    assert a == b
    stats = refilled.run_stats()["reasoning"]
    assert stats["schedule"] == "refill" and stats["traces"] == 16 and stats["tokens"] == sum(lengths)
    ideal = sum(lengths) / rows + lengths[-1]
    assert stats["steps"] <= 1.3 * ideal
    assert bucketed.run_stats()["reasoning"]["steps"] > stats["steps"]  # buckets wait for their longest trace


def test_refilled_think_readouts_equal_bucketed_ones() -> None:
    bucketed = _engine("tiny", batch_size=3, think_budget=24, reasoning_refill=False)
    refilled = bucketed.variant(reasoning_refill=True)
    trials = [_trial(f"Is it right to lie, case {k}? Answer with Yes or No.", k) for k in range(7)]
    a, b = bucketed.readout(trials), refilled.readout(trials)
    assert [r.trial_id for r in b] == [t.trial_id for t in trials]  # input order, though slots are read as traces end
    for x, y in zip(a, b, strict=True):
        assert x.reasoning == y.reasoning and x.reasoning_tokens == y.reasoning_tokens
        assert max(abs(s.logprob - t.logprob) for s, t in zip(x.scores, y.scores, strict=True)) < 1e-5


def test_a_hybrid_reasons_in_buckets_and_the_schedule_enters_bfloat16_numerics() -> None:
    hybrid = _engine("tiny-hybrid", think_budget=6)
    assert hybrid._reasoner.refills() is False
    hybrid.readout([_trial("Is it right to lie? Answer with Yes or No.", 0)])
    assert hybrid.run_stats()["reasoning"]["schedule"] == "buckets"
    assert hybrid.numerics()["reasoning_schedule"] == "buckets"
    tiny = _engine("tiny", think_budget=6)
    assert tiny.numerics()["reasoning_schedule"] == "refill" and tiny.numerics()["reasoning_rows"] == 0
    assert "reasoning_schedule" not in tiny.variant(think=False).numerics()  # outside think mode: no key change
    assert tiny.variant(think=False).run_stats() == {}


def test_think_mode_draws_are_refilled_and_draw_what_the_sample_paths_draw() -> None:
    """float32: think-mode draws (reasoning, then the answer) refilled draw the same tokens per draw as on the
    sample paths (each draw its own seeded generator), in fewer steps than the ideal's 1.3 x. Deterministic."""
    trials = [
        _trial(f"Dilemma {k}: should you tell the truth? Answer with Yes or No." + " Think." * (k % 4), k)
        for k in range(6)
    ]
    paths = _engine("tiny", think_budget=60, max_new_tokens=12, reasoning_refill=False, sample_rows=8)
    refilled = paths.variant(reasoning_refill=True)
    a, b = paths.sample(trials, 4, 1.5), refilled.sample(trials, 4, 1.5)
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert [(s.text, s.status) for s in a] == [(s.text, s.status) for s in b]
    lengths = sorted(len(s.token_ids) for s in b)
    assert lengths[-1] >= 3 * max(
        1, lengths[0]
    )  # widely different lengths, so refilling has rows to give (11 to 55 here)
    stats = refilled.run_stats()["think_draws"]
    assert (
        stats["traces"] == 24
        and stats["rows"] == 8
        and stats["steps"] <= 1.3 * (stats["tokens"] / 8 + stats["longest"])
    )
    assert "think_draws" not in paths.run_stats()
