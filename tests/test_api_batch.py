"""Batch interfaces (OpenAI Batch, Anthropic Message Batches): ids logged before polling, resumed after a crash.

The official clients talk to a local stand-in server (tests/fake_providers.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engines.api.batch import load_batches
from engines.api.engine import ApiEngine
from engines.api.journal import BATCHES, AppendLog
from engines.api.providers import ApiRequestError
from engines.api.retry import RetryPolicy
from engines.api.settings import ApiSettings
from probe.app.runner import run_folder
from probe.store import RunStore
from probe.types import Message, Trial
from tests.fake_providers import FakeProvider, anthropic_message, chat_completion


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    q = body["messages"][-1]["content"]
    text = "Yes" if "even" in q else "No"
    return (
        anthropic_message(text)
        if "max_tokens" in body and "max_completion_tokens" not in body
        else chat_completion(text)
    )


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("openai", reason="the api extra is not installed (pip install -e '.[api]')")
    pytest.importorskip("anthropic", reason="the api extra is not installed (pip install -e '.[api]')")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    f = FakeProvider(_answer, polls_before_end=2)
    monkeypatch.setenv("OPENAI_BASE_URL", f.url + "/v1")  # the official clients read these
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f.url)
    yield f
    f.stop()


def _trials(k: int = 3) -> list[Trial]:
    return [
        Trial(
            f"t{i}",
            "x",
            "i",
            {},
            (Message("user", f"an {'even' if i % 2 == 0 else 'odd'} question {i}"),),
            ("Yes", "No"),
            ("y", "n"),
        )
        for i in range(k)
    ]


def _store(tmp_path: Path, trials: list[Trial]) -> RunStore:
    man = {"run_key": "k", "identity": {}, "plan": {"readout": False, "samples": 2, "temperature": 1.0}}
    return RunStore.open(tmp_path / "run", {**man, "chunk_size": 256}, trials)


def _engine(fake: FakeProvider, provider: str) -> ApiEngine:
    model = "gpt-5.5" if provider == "openai" else "claude-sonnet-4-6"
    settings = ApiSettings(provider, model=model, batch=True, batch_poll=0.01)
    return ApiEngine(settings, log=lambda m: None, retry_policy=RetryPolicy(max_retries=1, base_delay=0.01)).load()


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_batch_round_trip(fake: FakeProvider, tmp_path: Path, provider: str) -> None:
    trials = _trials()
    store = _store(tmp_path, trials)
    eng = _engine(fake, provider)
    eng.attach(run_folder(store))
    out = eng.sample(trials, 2, 1.0)
    assert [s.option for s in out] == ["Yes", "Yes", "No", "No", "Yes", "Yes"]
    assert fake.creates[provider] == 1
    assert not fake.bodies("/v1/messages") and not fake.bodies("/v1/chat/completions")  # nothing sent directly
    log = [json.loads(x) for x in (store.results_dir / BATCHES).read_text().splitlines()]
    assert [r["event"] for r in log] == ["intent", "created", "ended"]
    assert len(log[0]["items"]) == 6
    stats = eng.run_stats()
    assert stats["batch_calls"] == 6 and stats["calls"] == 6
    full = 6 * 12 * 5.00 + 6 * 2 * 30.00 if provider == "openai" else 6 * 20 * 3.00 + 6 * 3 * 15.00
    assert stats["cost_usd"] == pytest.approx(full / 1e6 * 0.5)  # the batch discount


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_crash_while_polling_resumes_the_same_batch(fake: FakeProvider, tmp_path: Path, provider: str) -> None:
    trials = _trials()
    store = _store(tmp_path, trials)
    poll_path = "/v1/batches/" if provider == "openai" else "/v1/messages/batches/"
    fake.fail(poll_path, 400)  # the first poll blows up: the process "dies" with the batch created
    first = _engine(fake, provider)
    first.attach(run_folder(store))
    with pytest.raises(ApiRequestError):
        first.sample(trials, 2, 1.0)
    state = load_batches(AppendLog(store.results_dir / BATCHES))
    (batch,) = state.values()
    assert batch.batch_id is not None and batch.ended is None  # the id was on disk before polling
    second = _engine(fake, provider)
    second.attach(run_folder(store))
    out = second.sample(trials, 2, 1.0)
    assert len(out) == 6 and all(s.status == "ok" for s in out)
    assert fake.creates[provider] == 1  # resumed, not paid twice


def test_openai_batch_created_but_id_never_logged_is_found_by_its_key(fake: FakeProvider, tmp_path: Path) -> None:
    trials = _trials(2)
    store = _store(tmp_path, trials)
    eng = _engine(fake, "openai")
    eng.attach(run_folder(store))
    # the process died inside the create call: the intent is logged, the batch exists, its id is not logged
    body = eng.request_body(trials[0], 0, 1.0)
    items = {f"r{i}": (t.trial_id, d, 1.0) for i, (t, d) in enumerate((t, d) for t in trials for d in range(2))}
    log = AppendLog(store.results_dir / BATCHES)
    log.append(
        {"event": "intent", "local": "deadbeef", "provider": "openai", "items": [[c, *k] for c, k in items.items()]}
    )
    lines = "".join(
        json.dumps(
            {
                "custom_id": c,
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    **body,
                    "messages": [
                        {"role": "user", "content": next(t for t in trials if t.trial_id == k[0]).messages[0].content}
                    ],
                },
            }
        )
        + "\n"
        for c, k in items.items()
    )
    client = eng.transport.client
    f = client.files.create(file=("x.jsonl", lines.encode()), purpose="batch")
    client.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"probe_local": "deadbeef"},
    )
    assert fake.creates["openai"] == 1
    out = eng.sample(trials, 2, 1.0)
    assert [s.option for s in out] == ["Yes", "Yes", "No", "No"]
    assert fake.creates["openai"] == 1  # found by its metadata, not created again


def test_multi_turn_trials_are_called_directly(fake: FakeProvider, tmp_path: Path) -> None:
    turns = (Message("user", "an even question"), Message("assistant", "Sure."), Message("user", "an even answer?"))
    trial = Trial("m", "x", "i", {}, turns, ("Yes", "No"), ("y", "n"))
    store = _store(tmp_path, [trial])
    eng = _engine(fake, "anthropic")
    eng.attach(run_folder(store))
    out = eng.sample([trial], 1, 1.0)
    assert out[0].option == "Yes" and fake.creates["anthropic"] == 0 and len(fake.bodies("/v1/messages")) == 1
