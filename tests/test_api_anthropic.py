"""The Anthropic mapping: messages, system prompt, thinking options, usage fields, refusal stop reason.

Response shapes are the documented ones (Messages API reference: text,
thinking and redacted-thinking blocks, cache usage fields,
``stop_reason: refusal`` with ``stop_details``). The end-to-end tests run
the official ``anthropic`` client against a local stand-in server: no key,
no internet.
"""

from __future__ import annotations

from typing import Any

import pytest

from engines.api.engine import ApiEngine
from engines.api.pricing import Usage
from engines.api.providers import ApiRequestError, TransportError, anthropic_body, parse_anthropic
from engines.api.retry import RetryPolicy
from engines.api.settings import ApiSettings
from probe.types import Message, Trial
from tests.fake_providers import FakeProvider, anthropic_message

REFUSAL: dict[str, Any] = {  # Claude 4 models stop with stop_reason "refusal" when a classifier intervenes
    "id": "msg_01Refusal",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [],
    "stop_reason": "refusal",
    "stop_details": {"type": "refusal", "category": "general_harms", "explanation": None},
    "stop_sequence": None,
    "usage": {"input_tokens": 41, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
}
THINKING = {  # extended thinking: a signed thinking block, a redacted one, then the answer; cache reads
    "id": "msg_01Thinking",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [
        {"type": "thinking", "thinking": "The cost-benefit answer is yes.", "signature": "EqQBCgIYAhIM1gbcDa9G"},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
        {"type": "text", "text": "Answer: Yes"},
    ],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 12,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 1800,
        "output_tokens": 640,
        "output_tokens_details": {"thinking_tokens": 610},
        "service_tier": "standard",
    },
}


def test_parse_recorded_shapes() -> None:
    r = parse_anthropic(anthropic_message("No"))
    assert (r.text, r.finish, r.refused, r.served_model) == ("No", "end_turn", False, "claude-sonnet-4-6")
    assert r.usage == Usage(input_tokens=20, output_tokens=3)
    r = parse_anthropic(THINKING)
    assert r.text == "Answer: Yes" and r.reasoning == "The cost-benefit answer is yes.\n\n[redacted thinking]"
    # Anthropic reports uncached input, cache reads and cache writes apart; input_tokens is their sum
    assert r.usage == Usage(
        input_tokens=1912, output_tokens=640, reasoning_tokens=610, cached_tokens=1800, cache_write_tokens=100
    )
    r = parse_anthropic(REFUSAL)
    assert r.refused and r.finish == "refusal:general_harms" and r.text == ""
    budget_spent = {**anthropic_message("", stop="max_tokens", thinking="still thinking")}
    r = parse_anthropic(budget_spent)
    assert (r.text, r.finish, r.reasoning) == ("", "max_tokens", "still thinking")
    for bad in ({"type": "error", "error": {"type": "overloaded_error"}}, {"id": None, "content": None}, "oops"):
        with pytest.raises(TransportError):
            parse_anthropic(bad)


def _ab(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(
        model="claude-sonnet-4-6",
        messages=(Message("system", "Be terse."), Message("user", "Q?")),
        system=None,
        max_tokens=32,
        temperature=1.0,
        reasoning_effort=None,
        think=False,
        thinking_budget=None,
        extra={},
    )
    return anthropic_body(**{**base, **kw})


def test_request_mapping() -> None:
    assert _ab() == {
        "model": "claude-sonnet-4-6",
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "Q?"}],
        "system": "Be terse.",
    }
    b = _ab(messages=(Message("user", "Q?"),), system="Default.", temperature=0.5)
    assert b["system"] == "Default." and b["temperature"] == 0.5
    b = _ab(think=True, reasoning_effort="high")
    assert b["thinking"] == {"type": "adaptive"} and b["output_config"] == {"effort": "high"}
    assert "temperature" not in b
    b = _ab(thinking_budget=2048, max_tokens=2080)
    assert b["thinking"] == {"type": "enabled", "budget_tokens": 2048} and b["max_tokens"] == 2080
    with pytest.raises(ApiRequestError, match=r"thinking requires temperature 1\.0"):
        _ab(think=True, temperature=0.7)
    turns = (Message("user", "Q1"), Message("assistant", "A1"), Message("user", "Q2"))
    assert [m["role"] for m in _ab(messages=turns)["messages"]] == ["user", "assistant", "user"]


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("anthropic", reason="the api extra is not installed (pip install -e '.[api]')")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        q = body["messages"][-1]["content"]
        if "forbidden" in q:
            return REFUSAL
        if body.get("thinking"):
            return THINKING
        return anthropic_message("No" if "second" in q else "Yes")

    fake = FakeProvider(answer)
    yield fake
    fake.stop()


def _trial(tid: str, text: str) -> Trial:
    return Trial(tid, "x", "i", {}, (Message("user", text),), ("Yes", "No"), ("y", "n"))


def test_official_client_against_recorded_shapes(provider: FakeProvider) -> None:
    settings = ApiSettings(
        "anthropic", model="claude-sonnet-4-6", base_url=provider.url, system_prompt="Answer briefly."
    )
    eng = ApiEngine(settings, log=lambda m: None, retry_policy=RetryPolicy(max_retries=2, base_delay=0.01)).load()
    provider.fail("/v1/messages", 529, {"retry-after": "0"})  # Anthropic's "overloaded": retried
    trials = [_trial("a", "first question"), _trial("b", "second question"), _trial("c", "a forbidden question")]
    out = eng.sample(trials, 2, 0.5)
    assert [(s.status, s.option) for s in out] == [("ok", "Yes")] * 2 + [("ok", "No")] * 2 + [("refusal", None)] * 2
    sent = provider.bodies("/v1/messages")
    assert len(sent) == 7  # six draws and one retry after the 529
    assert all(b["system"] == "Answer briefly." and b["temperature"] == 0.5 and b["max_tokens"] == 32 for b in sent)
    headers = [h for m, p, h, _ in provider.requests if p == "/v1/messages"]
    assert all("sk-ant-test" in (h.get("x-api-key", "") + h.get("authorization", "")) for h in headers)
    stats = eng.run_stats()
    assert stats["retries"] == {"server": 1} and stats["by_status"] == {"ok": 4, "refusal": 2}
    assert stats["usage"]["input_tokens"] == 4 * 20 + 2 * 41
    assert stats["cost_usd"] == pytest.approx((162 * 3.00 + 12 * 15.00) / 1e6)  # shipped sonnet-4-6 prices


def test_thinking_through_the_client(provider: FakeProvider) -> None:
    settings = ApiSettings("anthropic", model="claude-sonnet-4-6", base_url=provider.url, thinking_budget=1024)
    eng = ApiEngine(settings, log=lambda m: None).load()
    s = eng.sample([_trial("a", "first question")], 1, 1.0)[0]
    assert (s.status, s.option, s.completion_tokens) == ("ok", "Yes", 640)
    assert s.reasoning.startswith("The cost-benefit answer is yes.")
    (body,) = provider.bodies("/v1/messages")
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024} and body["max_tokens"] == 32 + 1024
    assert "temperature" not in body


def test_a_rejected_key_names_the_variable(provider: FakeProvider) -> None:
    provider.fail("/v1/messages", 401)
    eng = ApiEngine(
        ApiSettings("anthropic", model="claude-sonnet-4-6", base_url=provider.url), log=lambda m: None
    ).load()
    with pytest.raises(ApiRequestError, match=r"\$ANTHROPIC_API_KEY"):
        eng.sample([_trial("a", "first question")], 1, 1.0)
