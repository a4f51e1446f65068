"""The API engine against a real server: ``transformers serve`` on localhost serving the tiny model.

* the acceptance command (``probe run yesno --model openai-compatible:tiny@URL --samples 8``) and
  ``probe analyze`` on the sampled run;
* a fault-injecting proxy in front of the server (429 with Retry-After, 500/503, timeouts, dropped
  connections, truncated and malformed bodies): every (trial, draw) exactly once, retries counted,
  nothing double-billed;
* a run killed with SIGKILL mid-way resumes without repeating a journaled call;
* (slow) sampled frequencies calibrate against the tiny model's own logit readouts: the readout
  temperature comes out near the sampling temperature (1.0 and 0.5).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from scipy.stats import binom

from tests.api_serve import Server
from tests.fault_proxy import FaultProxy

ROOT = Path(__file__).resolve().parent.parent
ITEM = "mine_cart_bridge"


def _cli(*args: str) -> int:
    from probe.app.cli import main

    return main(list(args))


def _unanimous_chance(readouts) -> float:
    """P(every trial's 8 draws name one option) if each draw is an independent draw from the readout."""
    chance = 1.0
    for r in readouts:
        p = [math.exp(sc.logprob) for sc in r.scores]
        chance *= sum(q**8 for q in p) + (1 - r.coverage) ** 8
    return chance


def test_yesno_through_the_api_engine_and_analyze(server: Server, tmp_path: Path, tiny_engine, capsys) -> None:
    out = tmp_path / "run"
    model = f"openai-compatible:tiny@{server.url}"
    base = ["run", "yesno", "--model", model, "--samples", "8", "--items", ITEM, "--out", str(out), "--quiet"]
    # --concurrency 1: transformers serve seeds torch's one global generator when a request arrives and
    # generates on a single thread, so overlapping requests reseed each other's draws (measured: 7 of 16
    # seeded draws differed from the sequential ones at concurrency 4). One call at a time, every draw is
    # the one its per-(trial, draw) seed names, and this test sees the same 96 answers on every run.
    base += ["--concurrency", "1"]
    with pytest.raises(SystemExit) as done:  # the dry run ends the process, status 0, before any call
        _cli(*base, "--dry-run")
    assert done.value.code == 0
    assert "96 calls to openai-compatible:tiny" in capsys.readouterr().err
    assert _cli(*base) == 0
    assert _cli("analyze", str(out)) == 0
    summary = (out / "report" / "summary.md").read_text()
    assert "probabilities from: samples (8 samples per trial at T = 1.0)" in summary
    assert ITEM in summary

    from probe.runs import open_run
    from probe.store import RunStore

    store = RunStore(out)
    _, per_trial, source = open_run(out).choice_probs()
    assert source == "samples" and len(per_trial) == 12
    samples = store.load("samples")
    assert len(samples) == 96 and not samples.duplicated(["trial_id", "draw"]).any()
    # The draws are fixed by their seeds (95 of 96 parse, on every run). Should a build change them, the
    # floor is the 1e-6 quantile of Binomial(96, p) with p the lowest readout coverage of these trials: a
    # conservative model of the parse rate (the parser also takes spellings the readout counts as off the
    # options). With the head-32 tiny model p = 0.598 and the floor is 34 of 96. False-failure rate <= 1e-6.
    trials = {t.trial_id: t for t in store.trials()}
    readouts = tiny_engine.readout(list(trials.values()))
    floor = binom.ppf(1e-6, len(samples), min(r.coverage for r in readouts))
    n_ok = int((samples["status"] == "ok").sum())
    print(f"parsed {n_ok} of {len(samples)}; floor {floor:.0f}")
    assert n_ok >= floor, (n_ok, floor)
    assert samples["option"].dropna().isin(["Yes", "No"]).all()
    # replicates are real draws: were they independent draws from the readout, all 12 trials would be
    # unanimous with this probability (6e-39 with the head-32 tiny), so the assertion's false-failure rate is below 1e-6
    assert _unanimous_chance(readouts) < 1e-6
    assert samples.groupby("trial_id")["option"].nunique().max() == 2
    # the server renders the very prompt the Transformers engine reads the slot after
    want = {tid: len(tiny_engine.render(t)) for tid, t in trials.items()}
    assert (samples["prompt_tokens"] == samples["trial_id"].map(want)).all()
    stats = store.manifest()["engine_stats"]
    assert stats["calls"] == 96 and stats["retries"] == {} and stats["duplicates"] == 0
    assert stats["usage"]["input_tokens"] == int(samples["prompt_tokens"].sum())
    assert stats["cost_usd"] == 0.0  # a local server costs nothing per token


def test_faults_every_draw_exactly_once_nothing_double_billed(server: Server, tmp_path: Path) -> None:
    from engines.api.engine import ApiEngine
    from engines.api.retry import RetryPolicy
    from engines.api.settings import ApiSettings
    from experiments.yesno import YesNoSpec
    from probe.app.runner import run
    from probe.record import Plan

    rates = {"429": 0.04, "500": 0.04, "503": 0.03, "timeout": 0.04, "drop": 0.04, "truncated": 0.05, "malformed": 0.05}
    # The schedule is deterministic: request k (in arrival order) gets the k-th seeded draw, so seed 1 injects
    # the same 21 faults into the same 69 requests on every run (2 of them timeouts). The client's timeout is
    # what keeps a slow answer from passing for an injected one: a forwarded call waits behind at most 3 others
    # at a server that generates one at a time (about 0.1 s each; ``slowest_forward`` is printed below),
    # so 5 s leaves a wide margin on a loaded machine, and an injected timeout holds 6 s.
    with FaultProxy(server.origin, rates, seed=1, retry_after="1", hang_seconds=6.0) as proxy:
        settings = ApiSettings(
            provider="openai-compatible", model="tiny", base_url=proxy.url + "/v1", concurrency=4, timeout=5.0
        )
        eng = ApiEngine(settings, retry_policy=RetryPolicy(max_retries=10, base_delay=0.05, max_delay=0.5))
        spec = YesNoSpec(items=(ITEM,))
        store = run(
            "yesno", spec, eng, tmp_path / "run", plan=Plan(readout=False, samples=4), chunk_size=4, progress=False
        )
    samples = store.load("samples")
    keys = set(zip(samples["trial_id"], samples["draw"], strict=True))
    assert len(samples) == 48 and keys == {(t.trial_id, d) for t in store.trials() for d in range(4)}
    stats = store.manifest()["engine_stats"]
    kinds = {"429": "rate_limit", "500": "server", "503": "server", "timeout": "timeout", "drop": "connection"}
    kinds |= {"truncated": "connection", "malformed": "malformed"}
    injected: Counter[str] = Counter()
    for fault, n in proxy.faults.items():
        injected[kinds[fault]] += n
    print(f"injected {dict(proxy.faults)}; upstream completions {proxy.upstream_ok}; engine_stats {json.dumps(stats)}")
    print(f"slowest forwarded call {proxy.slowest_forward:.2f} s (client timeout {settings.timeout} s)")
    assert proxy.upstream_errors == []
    assert sum(proxy.faults.values()) >= 10, proxy.faults  # the schedule did inject faults of many kinds
    assert len(proxy.faults) >= 5
    assert stats["retries"] == dict(injected)  # every injected failure was seen and retried, once
    assert stats["calls"] == 48 and stats["duplicates"] == 0 and stats["unrecovered"] == {}
    # usage counts each accepted response once: exactly what the proxy delivered whole ...
    assert proxy.delivered_ok == 48
    assert stats["usage"]["input_tokens"] == proxy.delivered_usage["prompt_tokens"] == samples["prompt_tokens"].sum()
    assert stats["usage"]["output_tokens"] == proxy.delivered_usage["completion_tokens"]
    # ... while the server did more work (the truncated and malformed responses were lost in transport)
    lost = proxy.faults["truncated"] + proxy.faults["malformed"]
    assert proxy.upstream_ok == 48 + lost


def test_killed_run_resumes_without_repeating_a_call(server: Server, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with FaultProxy(server.origin, {}) as proxy:
        model = f"openai-compatible:tiny@{proxy.url}/v1"
        args = ["run", "yesno", "--model", model, "--samples", "8", "--items", ITEM, "--out", str(out)]
        args += ["--quiet", "--no-report", "--concurrency", "2", "--chunk-size", "4"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-m", "probe.app.cli", *args], cwd=ROOT, env=env)
        journal = out / "results" / "api-journal.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if journal.exists() and journal.read_text().count("\n") >= 30:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run finished before it could be killed; make it longer"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        before = {(r["trial_id"], r["draw"]): r["text"] for r in map(json.loads, journal.read_text().splitlines())}
        with open(journal, "ab") as f:  # as if the kill had landed inside a write
            f.write(b'{"trial_id": "half-written')
        # let the proxy finish the calls that were in flight when the client died, so that the count
        # below belongs to the first session only (waiting on the proxy's own count, not on a timer)
        proxy.wait_idle(timeout=120)
        delivered_first = proxy.delivered_ok
        print(f"killed with {len(before)} journaled; {proxy.client_gone} requests cut off mid-send")
        assert _cli(*args) == 0
        delivered_total = proxy.delivered_ok
        assert proxy.upstream_errors == []
    from probe.store import RunStore

    samples = RunStore(out).load("samples")
    assert len(samples) == 96 and not samples.duplicated(["trial_id", "draw"]).any()
    final = dict(zip(zip(samples["trial_id"], samples["draw"], strict=True), samples["text"], strict=True))
    assert all(final[k] == text for k, text in before.items())  # journaled answers kept, not redrawn
    # the second session called only for the draws the journal lacked
    assert delivered_total - delivered_first == 96 - len(before)
    # calls delivered to the killed process but not yet journaled were lost: at most the ones in flight
    assert delivered_first - len(before) <= 2
    stats = RunStore(out).manifest()["engine_stats"]
    assert stats["calls"] == 96 and stats["duplicates"] == 0 and stats["sessions"] == 2


# --------------------------------------------------------------- calibration
PROMPTS = (
    "How acceptable is lying to protect a friend? On a scale from 0 to 9, answer with a number only.",
    "Rate from 0 to 9 how wrong it is to break a promise. Answer with a number only.",
    "On a scale from 0 to 9, how acceptable is it to read a partner's messages? Answer with a number only.",
    "How wrong is it to keep a lost wallet? Rate it from 0 to 9 and answer with a number only.",
    "Rate from 0 to 9 how acceptable it is to skip a queue. Answer with a number only.",
    "On a scale from 0 to 9, how wrong is it to cheat in a game? Answer with a number only.",
)


@pytest.mark.slow
@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_sampled_frequencies_recover_the_readout_temperature(server: Server, tiny_engine, tau: float) -> None:
    """Sampling at tau through the server vs the tiny model's own answer-slot logits: T comes out near tau."""
    from analysis.battery.calibration import readout_temperature
    from engines.api.engine import ApiEngine
    from engines.api.settings import ApiSettings
    from tests.conftest import make_trial

    digits = [str(i) for i in range(10)]
    trials = [make_trial(q, digits, trial_id=f"cal{i}") for i, q in enumerate(PROMPTS)]
    readouts = tiny_engine.readout(trials)
    # concurrency 1: the server seeds each call and generates one at a time, so the draws are reproducible
    eng = ApiEngine(ApiSettings(provider="openai-compatible", model="tiny", base_url=server.url, concurrency=1))
    samples = eng.load().sample(trials, 250, tau)
    counts = Counter((s.trial_id, s.option) for s in samples if s.status == "ok")
    # a draw parses about as often as the readout puts mass on the digits (see the yes/no test above): the
    # floor is Binomial(1500, lowest coverage)'s 1e-6 quantile (false-failure rate <= 1e-6). The head-32 tiny
    # model puts little mass on the digits of one prompt, so the floor is 1 (711 and 740 of 1500 parse): here
    # it only guards against no parse at all; the interval checks below carry the test.
    floor = binom.ppf(1e-6, len(samples), min(r.coverage for r in readouts))
    print(f"parsed {sum(counts.values())} of {len(samples)}; floor {floor:.0f}")
    assert sum(counts.values()) >= floor
    fit = readout_temperature(
        [[sc.logprob for sc in r.scores] for r in readouts],
        [[counts[(r.trial_id, o)] for o in digits] for r in readouts],
    )
    print(f"sampling T = {tau}: readout T = {fit.temperature:.3f} [{fit.lo:.3f}, {fit.hi:.3f}], n = {fit.n_samples}")
    assert fit.lo <= fit.temperature <= fit.hi
    # At concurrency 1 the server honours every call's seed, so these draws repeat on every run. Were they
    # fresh, a 95% interval would miss tau one run in 20; the assertion uses the 1 - 1e-6 profile-likelihood
    # interval instead (false-failure rate 1e-6, asymptotically; 1,500 draws per temperature).
    wide = readout_temperature(
        [[sc.logprob for sc in r.scores] for r in readouts],
        [[counts[(r.trial_id, o)] for o in digits] for r in readouts],
        level=1 - 1e-6,
    )
    print(f"1 - 1e-6 interval [{wide.lo:.3f}, {wide.hi:.3f}]")
    assert wide.lo <= tau <= wide.hi
    # ... and it pins T down: measured [0.849, 1.685] at tau = 1 and [0.399, 0.657] at 0.5 (ratios 2.0, 1.6).
    # Its width depends on the number of draws and the logits, hardly on which draws came, so this bound
    # has no false failures to speak of; a fit that had lost the temperature (a flat likelihood) fails it.
    assert wide.hi / wide.lo < 3
