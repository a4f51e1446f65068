"""The benchmark's pure helpers: the batch-size sweep's schedule, the FLOP model of dense decoders and of
sampling, and the parse shares of sampled replies (no model is loaded, nothing is timed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scripts.bench.flops import attention_flops, linear_flops_per_token, sampling_need, workload_need
from scripts.bench.sampling import answer_shares
from scripts.bench.sweep import best_batch, measure_swept, parse_sizes, sizes_for, sweep_line


def test_parse_sizes_sorts_dedupes_and_refuses_bad_input():
    assert parse_sizes("16,1,4,64,4") == [1, 4, 16, 64]
    for bad in ("", "0,4", "a,4"):
        with pytest.raises(ValueError, match="batch sizes"):
            parse_sizes(bad)


def test_sizes_for_collapses_sizes_above_the_peer_s_units():
    assert sizes_for([1, 4, 16, 64], 8) == [1, 4, 8]
    assert sizes_for([1, 4, 16, 64], 100) == [1, 4, 16, 64]
    assert sizes_for([1, 4, 16, 64], None) == [None]


def test_best_batch_is_the_fastest_run_and_the_smaller_size_on_a_tie():
    assert best_batch({1: [5.0, 4.0], 4: [3.0], 16: [3.5]}) == 4
    assert best_batch({4: [3.0], 16: [3.0]}) == 4
    assert best_batch({None: [2.0]}) is None


def test_measure_swept_runs_every_size_then_repeats_at_the_best_with_turns():
    times = {("a", 1): 3.0, ("a", 4): 1.0, ("b", 1): 2.0, ("b", 4): 5.0, ("c", None): 1.5}
    calls: list[tuple[str, object]] = []

    def run_one(peer, batch):
        calls.append((peer, batch))
        return {"peer": peer, "runs": [{"seconds": times[peer, batch] + 0.01 * len(calls)}]}

    sizes = {"a": [1, 4], "b": [1, 4], "c": [None]}
    out = measure_swept(["a", "b", "c"], sizes, 3, run_one)
    # the sweep (peers taking turns, reversed every step), then two repeats at each best size
    assert calls[:5] == [("a", 1), ("b", 1), ("c", None), ("b", 4), ("a", 4)]
    assert calls[5:] == [("a", 4), ("b", 1), ("c", None), ("c", None), ("b", 1), ("a", 4)]
    assert [out[p]["batch_size"] for p in "abc"] == [4, 1, None]
    assert [len(out[p]["runs"]) for p in "abc"] == [3, 3, 3]  # repeats runs at the best size, the sweep's included
    assert set(out["a"]["sweep"]) == {"1", "4"}
    assert sweep_line(out["a"]).endswith("*") and sweep_line(out["c"]) == "n/a"


LLAMA = SimpleNamespace(
    model_type="llama",
    hidden_size=8,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
    intermediate_size=16,
    num_hidden_layers=3,
    vocab_size=10,
)


def test_dense_flops_count_attention_projections_and_the_gated_mlp():
    attention = 8 * 2 * 4 + 2 * 8 * 1 * 4 + 2 * 4 * 8  # q, k and v, o
    mlp = 3 * 8 * 16
    assert linear_flops_per_token(LLAMA) == 2.0 * 3 * (attention + mlp)
    assert attention_flops(LLAMA, 5) == 4.0 * 3 * 2 * 4 * 6
    with pytest.raises(ValueError, match="FLOP model covers"):
        linear_flops_per_token(SimpleNamespace(model_type="gpt2"))


def test_sampling_need_adds_each_generated_token_once_to_the_prompt_tree():
    prompts = [[1, 2, 3], [1, 2, 4]]
    base = workload_need(LLAMA, prompts)
    assert base.unique_tokens == 4  # 1, 2 shared; 3 and 4
    none = sampling_need(LLAMA, prompts, [[1], [1]])  # one token drawn from each prompt's own distribution
    assert none.flops == base.flops and none.unique_tokens == 4
    two = sampling_need(LLAMA, prompts, [[3], []])  # two tokens fed back after prompt 0, at depths 3 and 4
    extra = 2 * (linear_flops_per_token(LLAMA) + 2.0 * 8 * 10) + attention_flops(LLAMA, 3) + attention_flops(LLAMA, 4)
    assert two.unique_tokens == 6 and two.flops == pytest.approx(base.flops + extra)


def test_answer_shares_parse_each_reply_against_its_trial_s_options():
    options = [("Yes", "No")] * 4
    shares = answer_shares(options, ["Yes", "No.", "I cannot answer that.", "Yes, because"])
    assert shares["first"] == pytest.approx(0.5) and shares["second"] == pytest.approx(0.25)
    assert shares["other"] == pytest.approx(0.25)


def test_layers_goal_is_the_slowdown_of_reading_every_layer_with_memory_beside_it(capsys):
    from scripts.bench.goals import LAYERS_SLOWDOWN, layers_goal

    plain = {"trials_per_s": 10.0, "peak_rss_mib": 900.0, "peak_growth_mib": 40.0, "batch_size": 16}
    row = layers_goal(plain, {**plain, "trials_per_s": 8.0, "peak_rss_mib": 950.0, "peak_growth_mib": 90.0})
    assert row["ratio"] == pytest.approx(1.25) and row["met"] and row["target"] == LAYERS_SLOWDOWN
    assert "growth during the run 90 vs 40 MiB" in row["why"] and "met" in capsys.readouterr().out
    assert not layers_goal(plain, {**plain, "trials_per_s": 7.0})["met"]  # 1.43x the time
