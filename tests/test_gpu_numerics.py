"""The GPU box's numerics on a CPU: the float32 head, the run's numeric floor, the think-mode trace counts, the
run key outside float32, and the device check's CPU mode end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from analysis.common.checks import floor_line, looped, reasoning_lines, reasoning_table
from engines.hf.reasoning import kv_bytes_per_token, reasoning_rows
from probe.app.floor import floor_figures, floor_sample
from tests.conftest import make_trial

ROOT = Path(__file__).resolve().parents[1]


def test_looped_counts_a_phrase_repeated_three_times() -> None:
    phrase = "so the answer must be yes because the rule says "
    assert looped("Let me think. " + phrase * 3)
    assert not looped("Let me think. " + phrase * 2)
    assert not looped(" ".join(f"w{i}" for i in range(200)))


def test_reasoning_table_and_warning_by_hand() -> None:
    per = pd.DataFrame(
        {
            "trial_id": ["a", "b", "c", "d"],
            "reasoning_tokens": [10, 4, 4, 3],
            "hit_budget": [False, True, True, False],
            "reasoning": ["x", "go on " * 30, "y", "z"],
        }
    )
    meta = pd.DataFrame({"trial_id": ["a", "b", "c", "d"], "instrument": ["graded", "graded", "binary", "binary"]})
    t = reasoning_table(per, meta)
    assert t.loc["graded"].tolist() == [2, 1, 1, 7.0, 10]
    assert t.loc["binary"].tolist() == [2, 1, 0, 3.5, 4]
    lines = reasoning_lines(t, 4)
    assert "binary 1 of 2 hit the budget, 0 looped" in lines[0] and "graded 1 of 2 hit the budget, 1 looped" in lines[0]
    assert "warning: in binary, graded more than 10%" in lines[1]
    assert reasoning_table(per.assign(reasoning_tokens=0), meta).empty  # no think mode: no section


def test_floor_figures_by_hand() -> None:
    from probe.types import OptionScore, Readout

    def readout(tid: str, lps: list[float], greedy: str) -> Readout:
        import math

        scores = tuple(OptionScore(o, (i,), lp, math.exp(lp)) for i, (o, lp) in enumerate(zip("AB", lps, strict=True)))
        return Readout(tid, scores, 1.0, greedy, (), 1, 1)

    ref = {"t1": ([-0.5, -1.0], [0.6, 0.4], "A"), "t2": ([-0.1, -2.0], [0.9, 0.1], "A")}
    got = floor_figures(ref, [readout("t1", [-0.5, -1.25], "A"), readout("t2", [-0.1, -2.0], "B")])
    assert got["trials"] == 2 and got["greedy_flips"] == 1
    assert got["max_logprob_diff"] == pytest.approx(0.25)
    line = floor_line({**got, "how": "re-read alone", "dtype": "bfloat16"})
    assert line is not None and "at most 0.25 nats" in line and "1 greedy option(s) flipped" in line
    assert floor_line(None) is None


def test_floor_sample_is_stable_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    trials = [make_trial("q", ["Yes", "No"], trial_id=f"t{i}") for i in range(100)]
    monkeypatch.delenv("PROBE_FLOOR_TRIALS")
    a = floor_sample(trials)
    monkeypatch.setenv("PROBE_FLOOR_TRIALS", "0")
    assert floor_sample(trials) == []
    monkeypatch.setenv("PROBE_FLOOR_TRIALS", "x")
    with pytest.raises(ValueError, match="PROBE_FLOOR_TRIALS must be a whole number"):
        floor_sample(trials)
    assert len(a) == 32 and [t.trial_id for t in a] == [t.trial_id for t in floor_sample(list(reversed(trials)), 32)]


def test_reasoning_rows_from_free_memory() -> None:
    per = 48 * 2 * 4 * 128 * 2  # Qwen3-30B-A3B in bfloat16: 98,304 bytes a token
    assert reasoning_rows(100 * 2**30, per, 1000 + 32768, least=16) == 16  # 50 GiB holds 16.2 traces of 33k tokens
    assert reasoning_rows(100 * 2**30, per, 300 + 2048, least=16) == 232
    assert reasoning_rows(10**15, per, 100, least=16) == 1024
    assert reasoning_rows(0, per, 100, least=16) == 16


def test_kv_bytes_per_token_of_the_tiny_model() -> None:
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    m = HFEngine(HFSettings(model="tiny")).model
    c = m.config
    assert kv_bytes_per_token(m) == c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 4


def test_float32_head_cuts_bf16_error_and_enters_the_run_key() -> None:
    """bf16 readouts with the head in float32 are closer to float32 than with the head in bfloat16; outside
    float32 the settings that batch trials enter the run key (so a resume never mixes them)."""
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    trials = [
        make_trial(f"Is case {i} fine? Answer with Yes or No.", ["Yes", "No"], trial_id=f"t{i}") for i in range(6)
    ]
    ref = HFEngine(HFSettings(model="tiny")).readout(trials)
    bf = HFEngine(HFSettings(model="tiny", dtype="bfloat16"))
    head32 = bf.readout(trials)
    head_model = bf.variant(head_dtype="model").readout(trials)

    def worst(a: list, b: list) -> float:
        return max(
            abs(x.logprob - y.logprob)
            for r, s in zip(a, b, strict=True)
            for x, y in zip(r.scores, s.scores, strict=True)
        )

    assert worst(head32, ref) < worst(head_model, ref)
    assert bf.describe()["head_dtype"] == "float32"
    ident = bf.identity()
    assert ident["numerics"]["batch_size"] == 16 and ident["numerics"]["head_dtype"] == "float32"
    assert bf.variant(batch_size=4).identity() != ident
    assert "numerics" not in HFEngine(HFSettings(model="tiny")).identity()  # float32 keys are unchanged


def test_think_run_counts_traces_that_hit_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The acceptance run: `probe run yesno --model tiny --think --think-budget 4` says how many traces hit it."""
    from probe.app.cli import main

    monkeypatch.delenv("PROBE_FLOOR_TRIALS")  # the default sample of 32 (the suite uses 4)
    out = tmp_path / "r"
    assert (
        main(["run", "yesno", "--model", "tiny", "--think", "--think-budget", "4", "--out", str(out), "--quiet"]) == 0
    )
    summary = (out / "report" / "summary.md").read_text()
    assert "think-mode reasoning (budget 4 tokens" in summary and "hit the budget" in summary
    assert "numeric floor (float32)" in summary
    man = json.loads((out / "manifest.json").read_text())
    assert man["numeric_floor"]["trials"] == 32 and man["numeric_floor"]["max_logprob_diff"] < 1e-4


def test_device_check_cpu_mode_end_to_end(tmp_path: Path) -> None:
    """scripts/device_check.sh --cpu: the GPU check's steps on the CPU at tiny shapes, so it cannot rot."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "scripts/device_check.sh", "--cpu"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    summary = report["summary"]
    assert summary["problems"] == []
    ran = ["moe-readouts", "moe-decode", "moe-draws", "moe-reasoning", "parity", "sampling", "lens-frame"]
    assert [v.split()[0] for v in summary["verified"]] == ran
    assert [n for n, s in summary["steps"].items() if s["status"] == "ran"] == ran
    assert summary["steps"]["split"] == {
        "status": "skipped",
        "why": "needs a GPU (a model split over cuda:0 and the CPU)",
    }
    assert summary["steps"]["graphs"]["status"] == "not run"  # not a default step
    assert any(s.startswith("split: needs a GPU") for s in summary["not_verified"])
    rows = report["rows"]
    checks = {r["check"] for r in rows}
    assert {"parity", "paths", "heads", "sampling", "think", "moe", "target", "lens-frame"} <= checks
    lens = [r for r in rows if r["check"] == "lens-frame" and r["dtype"] == "float32"]
    assert {r["what"] for r in lens} == {"layers all", "plain frame"} and all(r["within"] for r in lens)
    assert all(r["last_is_final"] for r in rows if r["check"] == "lens-frame" and r["what"] == "layers all")
    # the two heads of a bfloat16 engine read differently: a variant derives its head (issue 44)
    heads = {
        (r["model"], r["head"]): r["max_logprob_diff"]
        for r in rows
        if r["check"] == "parity" and r["dtype"] == "bfloat16" and r["path"] == "plain"
    }
    assert heads[("tiny", "float32")] != heads[("tiny", "model")]
    # the moe steps: every timing warm, repeated, as a median with its spread; peers' ratios and the floors beside them
    moe = {r["what"]: r for r in rows if r["check"] == "moe"}
    for what in (
        "readout forced binary tree",
        "lm-eval-style scorer forced binary",
        "decode step batch 16, experts grouped_mm",
        "decode step batch 16, experts batched_mm",
        "prefill 4 x 72 tokens, experts eager",
        "draws",
        "generate() draws",
    ):
        assert moe[what]["repeats"] >= 3 and moe[what]["min_s"] <= moe[what]["median_s"] <= moe[what]["max_s"], what
    assert moe["scorer agreement (forced binary)"]["max_logprob_diff"] < 1e-4
    assert moe["readouts vs scorer forced binary"]["ratio"] > 0 and moe["draws vs generate()"]["ratio"] > 0
    assert moe["readout forced binary tree"]["compute_floor_s"] > 0
    assert moe["decode step batch 16, experts grouped_mm"]["weight_read_floor_ms"] > 0
    choices = [r for what, r in moe.items() if what.startswith("experts choice")]
    assert len(choices) == 3 and all(r["auto"] == "grouped_mm" and r["auto_over_fastest"] >= 1 for r in choices)
    assert moe["reasoning refill"]["steps"] < moe["reasoning buckets"]["steps"]
    # slots (--hf-decode-graphs on), unrecorded on a CPU: timed as the eager steps are, the refilled tokens
    assert moe["decode step batch 16, slots, unrecorded"]["repeats"] == 8
    assert moe["decode step batch 16, slots, unrecorded"]["over_floor"] > 0
    assert moe["reasoning slots"]["steps"] == moe["reasoning refill"]["steps"]
    assert moe["reasoning slots vs refill"]["same_tokens_share"] == 1.0
    slots = [r for r in rows if r["check"] == "graphs"]
    assert [(r["model"], r["graphs"]) for r in slots] == [("tiny", 0)]  # the hybrid reasons in buckets
    assert slots[0]["max_logprob_diff"] <= slots[0]["bound"] == 1e-4
    targets = {r["target"] for r in rows if r["check"] == "target"}
    assert {"reasoning", "readouts", "draws", "decode_16", "decode_64"} == targets


def test_device_check_dry_run_fits_a_lease(tmp_path: Path) -> None:
    """--dry-run prints each step's estimate and a total within the 240 s a lease leaves room to rerun in."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "scripts/device_check.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    total = [line for line in done.stdout.splitlines() if "estimated in all" in line]
    assert len(total) == 1 and int(total[0].split()[0]) <= 240, done.stdout
    from scripts.device.steps import STEPS

    assert all(s.name in done.stdout for s in STEPS if s.default)


def test_a_killed_device_check_keeps_its_finished_steps(tmp_path: Path) -> None:
    """The check writes its JSON after every step: killed (SIGKILL) while its second step runs, the first step's rows
    and state are in the JSON, and the second is marked as stopped. The first step here is the graphs step
    (Transformers' static-cache decode against its dynamic one, uncompiled on a CPU), so its figures are checked
    too: the same greedy float32 tokens."""
    cmd = [sys.executable, "-m", "scripts.device_check", "--cpu", "--steps", "graphs,parity", "--out", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = tmp_path / "device_check.json"
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:  # a deadlock bound, not a timing assumption
            state = json.loads(path.read_text())["summary"]["steps"] if path.exists() else {}
            if state.get("graphs", {}).get("status") == "ran":
                break
            assert proc.poll() is None, "the check ended before its first step was recorded"
            time.sleep(0.05)
        # the parity step loads three engines and reads 39 trials in ten configurations: seconds, not 50 ms
        assert proc.poll() is None, "the check finished its second step before it could be killed"
        proc.kill()
    finally:
        proc.kill()
        proc.wait()
    report = json.loads(path.read_text())
    steps = report["summary"]["steps"]
    assert steps["graphs"]["status"] == "ran" and steps["parity"]["status"] == "running"
    assert "parity: started; the check stopped before it ended" in report["summary"]["not_verified"]
    graphs = {r["what"]: r for r in report["rows"] if r["check"] == "graphs"}
    assert not any(r["check"] == "parity" for r in report["rows"])
    for cache in ("dynamic", "static"):
        assert graphs[f"generate() decode step batch 4, {cache} cache"]["long"]["repeats"] >= 3
    assert graphs["static over dynamic cache"]["same_tokens_share"] == 1.0


# ------------------------------------------------------------------ sampled reasoning (--think-sampling)
def test_truncation_against_brute_force() -> None:
    """top-k then top-p on scaled logits equals a per-row computation in numpy."""
    import numpy as np
    import torch

    from engines.hf.sampling import truncated

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 40)).astype(np.float32)
    for k, p in ((0, 0.9), (7, 1.0), (7, 0.5), (1, 0.3), (0, 0.999999)):
        got = truncated(torch.from_numpy(logits), k, p).numpy()
        for row, out in zip(logits, got, strict=True):
            keep = np.ones(len(row), bool)
            if k:
                keep &= row >= np.sort(row)[::-1][k - 1]
            if p < 1:
                order = np.argsort(-row, kind="stable")
                masked = np.where(keep, row, -np.inf)[order]
                probs = np.exp(masked - masked.max())
                probs /= probs.sum()
                before = np.cumsum(probs) - probs
                nucleus = np.zeros(len(row), bool)
                nucleus[order] = before < p
                keep &= nucleus
            assert np.array_equal(np.isfinite(out), keep), (k, p)
            assert np.array_equal(out[keep], row[keep])


def test_sampled_reasoning_is_seeded_per_trial_and_recorded() -> None:
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    trials = [
        make_trial(f"Case {i}: is it fine? Answer with Yes or No.", ["Yes", "No"], trial_id=f"t{i}") for i in range(4)
    ]
    greedy = HFEngine(HFSettings(model="tiny", think=True, think_budget=12))
    card = greedy.variant(think_temperature=0.6, think_top_p=0.95, think_top_k=20)
    batched = [r.reasoning for r in card.readout(trials)]
    alone = [card.variant(batch_size=1).readout([t])[0].reasoning for t in trials]
    assert batched == alone  # each trial's generator is its own: the batch does not change the reasoning
    assert batched == [r.reasoning for r in card.readout(trials)]  # and the seed fixes it
    assert batched != [r.reasoning for r in greedy.readout(trials)]
    assert card.identity()["think_sampling"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert "think_sampling" not in greedy.identity()  # greedy run keys are unchanged


def test_think_sampling_preset_and_overrides() -> None:
    import argparse

    from engines import add_engine_arguments, make_engine

    p = argparse.ArgumentParser()
    add_engine_arguments(p)
    e = make_engine(p.parse_args(["--think", "--think-sampling", "qwen3", "--think-top-k", "10"]))
    assert (e.settings.think_temperature, e.settings.think_top_p, e.settings.think_top_k) == (0.6, 0.95, 10)
    e = make_engine(p.parse_args(["--think"]))
    assert (e.settings.think_temperature, e.settings.think_top_p, e.settings.think_top_k) == (0.0, 1.0, 0)
    with pytest.raises(ValueError, match="think_top_p must be in"):
        make_engine(p.parse_args(["--think-top-p", "0"]))


def test_no_floor_for_engines_that_cannot_read_alone() -> None:
    """The synthetic subject and the API engine have no batches to measure: no floor, and no error."""
    from probe.app.floor import measure_floor

    class Bare:  # an engine with neither settings nor reading_alone
        name = "bare"

    assert measure_floor(Bare(), [make_trial("q", ["Yes", "No"])], dict) is None
