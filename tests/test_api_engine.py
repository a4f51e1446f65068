"""The API engine's behaviour with a scripted client: data vs retries, journal resume, budget, dry run, runner."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engines.api.engine import ApiEngine, call_seed
from engines.api.online import BudgetExhausted
from engines.api.providers import ApiRequestError, TransportError
from engines.api.retry import RetryPolicy
from engines.api.settings import ApiSettings
from engines.api.transport import TransportGaveUp
from probe.app.runner import run_folder
from probe.store import RunStore
from probe.types import Message, Trial

URL = "http://127.0.0.1:9/v1"
FAST = RetryPolicy(max_retries=3, base_delay=0.001, max_delay=0.005)


def reply(text: str, *, prompt: int = 10, completion: int = 2, finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "r",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
    }


class FakeClient:
    """Stands in for ``openai.OpenAI``: ``script(call_index, body)`` returns a response dict or raises."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.calls: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, *, model: str, messages: list, extra_body: dict) -> dict[str, Any]:
        body = {"model": model, "messages": messages, **extra_body}
        with self._lock:
            i = len(self.calls)
            self.calls.append(body)
        return self.script(i, body)

    def keys(self) -> Counter:
        return Counter((b["messages"][-1]["content"], b["seed"]) for b in self.calls)


def trials(k: int = 3) -> list[Trial]:
    return [
        Trial(
            f"t{i}",
            "x",
            f"item{i}",
            {},
            (Message("user", f"Question {i}? Answer Yes or No."),),
            ("Yes", "No"),
            ("y", "n"),
        )
        for i in range(k)
    ]


def engine(client: FakeClient, **kw: Any) -> ApiEngine:
    settings = ApiSettings(provider="openai-compatible", model="m", base_url=URL, **kw)
    return ApiEngine(settings, client_factory=lambda s, key: client, log=lambda m: None, retry_policy=FAST).load()


def store(tmp_path: Path, ts: list[Trial], samples: int = 2) -> RunStore:
    man = {"run_key": "k", "identity": {}, "plan": {"readout": False, "samples": samples, "temperature": 1.0}}
    return RunStore.open(tmp_path / "run", {**man, "chunk_size": 256}, ts)


def test_refusals_and_invalid_answers_are_data_never_retried() -> None:
    texts = {0: "I can't help with deciding that.", 1: "maybe, it depends", 2: "**Yes**", 3: "Answer: No"}
    client = FakeClient(lambda i, body: reply(texts[int(body["messages"][0]["content"][9]) * 2 + (i % 2)]))
    ts = trials(2)
    eng = engine(client, concurrency=1)
    out = eng.sample(ts, 2, 1.0)
    assert [s.status for s in out] == ["refusal", "invalid", "ok", "ok"]
    assert [s.option for s in out] == [None, None, "Yes", "No"]
    assert len(client.calls) == 4  # one call per draw: nothing was retried
    blocked = FakeClient(lambda i, body: reply("", finish="content_filter"))
    assert engine(blocked).sample(ts[:1], 1, 1.0)[0].status == "refusal"


def test_replicates_are_separate_calls_with_distinct_seeds() -> None:
    client = FakeClient(lambda i, body: reply("Yes"))
    out = engine(client).sample(trials(2), 5, 0.7)
    assert [(s.trial_id, s.replicate) for s in out] == [(f"t{i}", d) for i in range(2) for d in range(5)]
    seeds = {(b["messages"][0]["content"], b["seed"]) for b in client.calls}
    assert len(seeds) == 10 and all(b["temperature"] == 0.7 for b in client.calls)
    assert {b["seed"] for b in client.calls if "Question 0" in b["messages"][0]["content"]} == {
        call_seed(0, "t0", d) for d in range(5)
    }


def test_transport_failures_are_retried_and_counted() -> None:
    seen: Counter = Counter()

    def script(i: int, body: dict) -> dict:
        key = (body["messages"][0]["content"], body["seed"])
        seen[key] += 1
        if seen[key] == 1:
            raise TransportError("server", "503")
        if seen[key] == 2:
            raise TransportError("rate_limit", "429", retry_after=0.01)
        return reply("No")

    client = FakeClient(script)
    eng = engine(client)
    out = eng.sample(trials(3), 2, 1.0)
    assert all(s.status == "ok" for s in out) and len(client.calls) == 18
    stats = eng.run_stats()
    assert stats["retries"] == {"rate_limit": 6, "server": 6} and stats["calls"] == 6
    assert stats["usage"]["input_tokens"] == 60  # each accepted response counted once
    assert stats["concurrency"]["cuts"] >= 1  # the 429s cut the concurrency limit


def test_gives_up_keeps_what_arrived_and_resumes_without_repeating(tmp_path: Path) -> None:
    ts = trials(3)
    st = store(tmp_path, ts)

    def flaky(i: int, body: dict) -> dict:
        if "Question 1" in body["messages"][0]["content"]:
            raise TransportError("timeout", "timed out")
        return reply("Yes")

    first = FakeClient(flaky)
    eng = engine(first)
    eng.attach(run_folder(st))
    with pytest.raises(TransportGaveUp, match="re-run the same command to resume"):
        eng.sample(ts, 2, 1.0)
    assert eng.run_stats()["unrecovered"] == {"timeout": 1}
    healthy = FakeClient(lambda i, body: reply("No"))
    eng2 = engine(healthy)
    eng2.attach(run_folder(st))
    out = eng2.sample(ts, 2, 1.0)
    assert len(out) == 6
    assert all("Question 1" in b["messages"][0]["content"] for b in healthy.calls)  # only the missing draws
    assert len(healthy.calls) == 2
    answers = {(s.trial_id, s.option) for s in out}
    assert answers == {("t0", "Yes"), ("t1", "No"), ("t2", "Yes")}  # earlier answers kept, not redrawn
    stats = eng2.run_stats()
    assert stats["sessions"] == 2 and stats["unrecovered"]["timeout"] >= 1 and stats["duplicates"] == 0


def test_a_rejected_request_stops_the_run() -> None:
    def reject(i: int, body: dict) -> dict:
        raise ApiRequestError("the provider rejected the request (401); check $OPENAI_API_KEY")

    with pytest.raises(ApiRequestError, match="401"):
        engine(FakeClient(reject)).sample(trials(2), 2, 1.0)


def test_budget_stops_cleanly_and_resumes(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text('prices:\n  "openai-compatible:m": {input: 1000, output: 1000}\n')  # $0.012 a call
    ts = trials(5)
    st = store(tmp_path, ts, samples=4)
    client = FakeClient(lambda i, body: reply("Yes"))
    eng = engine(client, prices=str(prices), max_cost=0.1, concurrency=1)
    eng.attach(run_folder(st))
    with pytest.raises(BudgetExhausted, match="raise it and re-run"):
        eng.sample(ts, 4, 1.0)
    spent = eng.spent()
    assert 0 < spent <= 0.1 and len(client.calls) == round(spent / 0.012)
    eng2 = engine(client, prices=str(prices), max_cost=1.0)
    eng2.attach(run_folder(st))
    eng2.sample(ts, 4, 1.0)
    assert len(client.calls) == 20  # every draw paid exactly once across the two sessions
    assert eng2.run_stats()["cost_usd"] == pytest.approx(0.24)


def test_max_cost_needs_a_price(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text('prices:\n  "openai:other": {input: 1, output: 1}\n')
    with pytest.raises(ValueError, match="--max-cost needs a price for openai-compatible:m"):
        engine(FakeClient(lambda i, b: reply("Yes")), prices=str(prices), max_cost=1.0)


def test_dry_run_prints_calls_and_cost_and_sends_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    ts = trials(4)
    st = store(tmp_path, ts, samples=3)
    lines: list[str] = []

    def no_client(s: ApiSettings, key: str | None) -> Any:
        raise AssertionError("a dry run must not open a client")

    eng = ApiEngine(
        ApiSettings("openai", model="gpt-5.5", dry_run=True, max_new_tokens=10),
        client_factory=no_client,
        log=lines.append,
    )
    eng.load()
    with pytest.raises(SystemExit) as e:
        eng.attach(run_folder(st))
    assert e.value.code == 0
    text = "\n".join(lines)
    assert "12 calls to openai:gpt-5.5" in text
    prompt = sum(len(t.messages[0].content) // 4 + (len(t.messages[0].content) % 4 > 0) + 7 for t in ts) * 3
    bound = (prompt * 5.00 + 12 * 10 * 30.00) / 1e6  # shipped prices of gpt-5.5: $5 in, $30 out per million
    assert f"~{prompt} prompt" in text and f"at most ${bound:.4f}" in text


def test_a_second_process_on_the_same_run_is_refused(tmp_path: Path) -> None:
    from filelock import FileLock

    ts = trials(1)
    st = store(tmp_path, ts)
    eng = engine(FakeClient(lambda i, b: reply("Yes")))
    eng.attach(run_folder(st))
    other = FileLock(str(st.results_dir / "api.lock"))
    other.acquire()
    try:
        with pytest.raises(ValueError, match="another probe process is running"):
            eng.sample(ts, 1, 1.0)
    finally:
        other.release()
    assert len(eng.sample(ts, 1, 1.0)) == 1


def test_runner_samples_only_and_records_stats(tmp_path: Path) -> None:
    from experiments.yesno import YesNoSpec
    from probe.app.runner import run
    from probe.record import Plan

    client = FakeClient(lambda i, body: reply("Yes" if i % 3 else "No"))
    eng = engine(client)
    spec = YesNoSpec(items=("mine_cart_bridge",))
    st = run("yesno", spec, eng, tmp_path / "run", plan=Plan(readout=True, samples=3), chunk_size=5, progress=False)
    man = st.manifest()
    assert man["plan"]["readout"] is False  # a sampling-only engine: --samples N means sample only
    samples = st.load("samples")
    assert len(samples) == 12 * 3 and not samples.duplicated(["trial_id", "draw"]).any()
    assert man["engine_stats"]["calls"] == 36 and man["engine_stats"]["by_status"] == {"ok": 36}
    assert len(client.calls) == 36
    again = run("yesno", spec, engine(client), tmp_path / "run", plan=Plan(readout=False, samples=3), progress=False)
    assert len(client.calls) == 36 and again.manifest()["engine_stats"]["calls"] == 36
