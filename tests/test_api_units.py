"""The API engine's parts, without a server: specs, settings, retries, limiter, prices, journal, mapping."""

from __future__ import annotations

import email.utils
import json
import random
import threading
import time
from typing import Any

import pytest

from engines.api.engine import call_seed
from engines.api.journal import AppendLog, CallRecord, Journal
from engines.api.pricing import Price, PriceTable, PriceTableError, Usage, estimate_prompt_tokens
from engines.api.providers import (
    ApiRequestError,
    ProviderRefusal,
    TransportError,
    classify,
    openai_body,
    parse_openai,
    temperature_param,
)
from engines.api.retry import AdaptiveLimiter, RetryPolicy, parse_retry_after
from engines.api.settings import ApiSettings, parse_model_spec
from probe.types import Message

# ------------------------------------------------------------------ specs


def test_model_specs() -> None:
    assert parse_model_spec("openai:gpt-5.5") == parse_model_spec("openai:gpt-5.5")
    s = parse_model_spec("openai:gpt-5.5")
    assert (s.provider, s.model, s.base_url) == ("openai", "gpt-5.5", None)
    s = parse_model_spec("anthropic:claude-sonnet-4-6")
    assert (s.provider, s.model) == ("anthropic", "claude-sonnet-4-6")
    s = parse_model_spec("openai-compatible:org/model@rev@http://127.0.0.1:8000/v1/")
    assert (s.model, s.base_url, s.host) == ("org/model@rev", "http://127.0.0.1:8000/v1", "127.0.0.1")
    s = parse_model_spec("openai-compatible:google/gemini-2.5-flash@https://openrouter.ai/api/v1")
    assert s.host == "openrouter.ai"
    with pytest.raises(ValueError, match="must start with one of"):
        parse_model_spec("azure:gpt")
    with pytest.raises(ValueError, match="<name>@<base_url>"):
        parse_model_spec("openai-compatible:tiny")
    with pytest.raises(ValueError, match="names no model"):
        parse_model_spec("openai:")


def test_settings_validate_and_name_the_flag() -> None:
    with pytest.raises(ValueError, match="--thinking-budget must be >= 1024"):
        ApiSettings("anthropic", model="claude", thinking_budget=100)
    with pytest.raises(ValueError, match="--thinking-budget is Anthropic"):
        ApiSettings("openai", model="gpt", thinking_budget=2048)
    with pytest.raises(ValueError, match="--reasoning-effort instead of --think"):
        ApiSettings("openai", model="gpt", think=True)
    with pytest.raises(ValueError, match="--max-cost"):
        ApiSettings("openai", model="gpt", max_cost=-1)
    with pytest.raises(ValueError, match="needs a base URL"):
        ApiSettings("openai-compatible", model="tiny")
    with pytest.raises(ValueError, match="--reasoning-effort must be one of"):
        ApiSettings("openai", model="gpt", reasoning_effort="extreme")
    # the token limit adds the reasoning allowance only when the model reasons
    assert ApiSettings("openai", model="gpt", max_new_tokens=32).max_tokens == 32
    assert (
        ApiSettings("openai", model="gpt", max_new_tokens=32, reasoning_effort="low", think_budget=900).max_tokens
        == 932
    )
    assert ApiSettings("anthropic", model="c", max_new_tokens=32, thinking_budget=2048).max_tokens == 2080


def test_key_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from engines.api.transport import Transport

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(ValueError, match="set the environment variable OPENAI_API_KEY"):
        Transport(ApiSettings("openai", model="gpt-5.5")).api_key()
    with pytest.raises(ValueError, match="OPENROUTER_API_KEY"):
        Transport(ApiSettings("openai-compatible", model="m", base_url="https://openrouter.ai/api/v1")).api_key()
    with pytest.raises(ValueError, match="MY_KEY"):
        Transport(ApiSettings("openai-compatible", model="m", base_url="http://x:1/v1", api_key_env="MY_KEY")).api_key()
    # a self-hosted server needs none
    assert Transport(ApiSettings("openai-compatible", model="m", base_url="http://127.0.0.1:1/v1")).api_key() == "EMPTY"
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    assert Transport(ApiSettings("anthropic", model="c")).api_key() == "sk-test"


def test_call_seeds_differ_per_draw_and_repeat_per_call() -> None:
    seeds = [call_seed(0, "t1", d) for d in range(50)]
    assert len(set(seeds)) == 50 and all(0 <= s < 2**31 for s in seeds)
    assert call_seed(0, "t1", 3) == call_seed(0, "t1", 3) != call_seed(1, "t1", 3)


# ---------------------------------------------------------------- retries


def test_retry_delay_is_exponential_with_jitter_and_honours_retry_after() -> None:
    pol = RetryPolicy(max_retries=5, base_delay=1.0, max_delay=8.0)
    rng = random.Random(0)
    for attempt, nominal in enumerate([1, 2, 4, 8, 8, 8]):
        waits = [pol.delay(attempt, None, rng) for _ in range(200)]
        assert nominal * 0.5 <= min(waits) and max(waits) <= nominal
        # jittered, not constant. Deterministic (random.Random(0)); at a fresh seed, 200 uniform waits on
        # [0.5, 1] x nominal span under 0.3 x nominal with probability below 200 * 0.6**199 (~1e-42)
        assert max(waits) - min(waits) > nominal * 0.3
    waits = [pol.delay(0, 5.0, rng) for _ in range(200)]
    assert min(waits) >= 5.0 and max(waits) <= 5.5  # at least what the server asked, plus <= 10%
    assert pol.delay(0, 10_000.0, rng) <= pol.max_retry_after * 1.1


def test_parse_retry_after() -> None:
    assert parse_retry_after({"Retry-After": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    now = time.time()
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert 28 <= parse_retry_after({"Retry-After": date}, now=now) <= 31  # type: ignore[operator]
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None and parse_retry_after(None) is None


def test_limiter_aimd_with_cooldown_and_cap() -> None:
    clock = [0.0]
    lim = AdaptiveLimiter(cap=8, initial=4, cooldown=2.0, clock=lambda: clock[0])
    for _ in range(4):
        assert lim.acquire()
    assert lim.in_flight == 4
    lim.release("throttled")
    assert lim.limit == 2
    lim.release("throttled")  # the same overload (within the cooldown): no second cut
    assert lim.limit == 2 and lim.n_cuts == 1
    clock[0] = 3.0
    lim.release("throttled")
    assert lim.limit == 1 and lim.n_cuts == 2
    lim.release("ok")  # the fourth slot; 1 success at limit 1 -> +1
    assert lim.limit == 2
    for _ in range(40):  # grows by one per `limit` successes, never past the cap
        lim.acquire()
        lim.release("ok")
    assert lim.limit == 8 and lim.peak == 8
    assert lim.in_flight == 0


def test_limiter_blocks_at_the_limit_and_during_a_pause() -> None:
    lim = AdaptiveLimiter(cap=1, initial=1)
    assert lim.acquire()
    got: list[float] = []
    t0 = time.monotonic()

    def waiter() -> None:
        lim.acquire()
        got.append(time.monotonic() - t0)

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.2)
    assert not got  # blocked at the limit
    lim.pause(0.3)
    lim.release("ok")
    th.join(120)  # a generous bound: only a hung limiter takes this long, however busy the machine
    # sleeps and pauses last at least as long as asked, so a loaded machine only makes this larger
    assert got and got[0] >= 0.45  # 0.2 s at the limit + the 0.3 s pause
    stop = threading.Event()
    stop.set()
    assert lim.acquire(stop) is False


# ------------------------------------------------------------------ prices


def test_cost_hand_worked() -> None:
    price = Price(input=2.0, output=10.0, cached_input=0.2, cache_write=2.5)
    u = Usage(input_tokens=1000, output_tokens=500, reasoning_tokens=300, cached_tokens=200, cache_write_tokens=100)
    # 700 uncached x 2 + 200 cached x 0.2 + 100 written x 2.5 + 500 out x 10 = 6690 per million
    assert price.cost(u) == pytest.approx(0.00669)
    assert price.cost(u, batch=True) == pytest.approx(0.003345)
    assert Price(input=1.0, output=1.0).cost(Usage(input_tokens=10, cached_tokens=10)) == pytest.approx(1e-5)
    assert (Usage(1, 2, 3, 4, 5) + Usage(1, 1, 1, 1, 1)) == Usage(2, 3, 4, 5, 6)


def test_price_table_lookup_and_errors(tmp_path) -> None:
    shipped = PriceTable.load()
    assert shipped.lookup("openai", "gpt-5.5") is not None
    assert shipped.lookup("openai-compatible", "anything", "127.0.0.1").cost(Usage(1000, 1000)) == 0.0  # type: ignore[union-attr]
    assert shipped.lookup("openai-compatible", "anything", "example.org") is None
    f = tmp_path / "p.yaml"
    f.write_text('prices:\n  "openai:gpt-*": {input: 1, output: 2}\n  "openai:gpt-5*": {input: 3, output: 4}\n')
    t = PriceTable.load(f)
    assert t.lookup("openai", "gpt-5.5").key == "openai:gpt-5*"  # type: ignore[union-attr]  # longest pattern
    assert t.lookup("openai", "gpt-4o").key == "openai:gpt-*"  # type: ignore[union-attr]
    f.write_text('prices:\n  "openai:x": {input: 1}\n')
    with pytest.raises(ValueError, match="'openai:x' needs at least input and output"):
        PriceTable.load(f)
    f.write_text('prices:\n  "openai:x": {input: 1, output: 1, cahced: 1}\n')
    with pytest.raises(ValueError, match="unknown fields"):
        PriceTable.load(f)
    with pytest.raises(PriceTableError, match="does not exist; pass --prices"):
        PriceTable.load(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("prices: [\n")
    with pytest.raises(PriceTableError, match="is not valid YAML"):
        PriceTable.load(tmp_path / "bad.yaml")
    assert estimate_prompt_tokens(["abcd" * 10]) == 10 + 4 + 3


# ----------------------------------------------------------------- journal


def _rec(tid: str, draw: int, text: str = "Yes", cost: float | None = 0.5) -> CallRecord:
    return CallRecord(tid, draw, 1.0, "ok", "Yes", text, usage=Usage(10, 2), cost=cost, retries={"timeout": 1})


def test_journal_persists_resumes_and_keeps_replicates_apart(tmp_path) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path)
    assert j.add(_rec("t", 0, "Yes")) and j.add(_rec("t", 1, "No"))
    assert not j.add(_rec("t", 1, "again"))  # a duplicate is kept on disk but does not replace the first
    j.close()
    j2 = Journal(path)
    assert len(j2) == 2 and j2.duplicates == 1
    assert j2.get(("t", 1, 1.0)).text == "No"  # type: ignore[union-attr]
    assert ("t", 1, 0.5) not in j2  # another temperature is another draw
    assert j2.total_cost == pytest.approx(1.5)  # the duplicate was paid too
    assert j2.get(("t", 0, 1.0)) == _rec("t", 0, "Yes")  # round trip


def test_journal_cuts_a_torn_last_line(tmp_path) -> None:
    path = tmp_path / "j.jsonl"
    j = Journal(path)
    j.add(_rec("t", 0))
    j.close()
    with open(path, "ab") as f:
        f.write(b'{"trial_id": "t", "draw": 1, "temp')  # killed mid-write
    j = Journal(path)
    assert len(j) == 1 and j.torn_bytes > 0
    j.add(_rec("t", 1))
    j.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(x)["trial_id"] == "t" for x in lines)
    log = AppendLog(tmp_path / "only-torn.jsonl")
    log.close()
    (tmp_path / "only-torn.jsonl").write_bytes(b'{"a": 1')
    assert AppendLog(tmp_path / "only-torn.jsonl").torn_bytes == 7
    assert (tmp_path / "only-torn.jsonl").read_bytes() == b""


# ---------------------------------------------------------- OpenAI mapping


def _body(**kw):
    base: dict[str, Any] = dict(
        provider="openai-compatible",
        model="m",
        messages=(Message("user", "Q?"),),
        system=None,
        max_tokens=32,
        temperature=1.0,
        seed=7,
        reasoning_effort=None,
        think=False,
        extra={},
    )
    return openai_body(**{**base, **kw})


def test_openai_request_bodies() -> None:
    b = _body()
    assert b == {
        "model": "m",
        "messages": [{"role": "user", "content": "Q?"}],
        "max_tokens": 32,
        "temperature": 1.0,
        "seed": 7,
    }
    b = _body(provider="openai", temperature=1.0, reasoning_effort="low")
    assert "temperature" not in b and "seed" not in b and b["max_completion_tokens"] == 32
    assert b["reasoning_effort"] == "low"
    assert _body(provider="openai", temperature=0.5)["temperature"] == 0.5
    b = _body(system="Be brief.", think=True, extra={"top_k": 20})
    assert b["messages"][0] == {"role": "system", "content": "Be brief."}
    assert b["chat_template_kwargs"] == {"enable_thinking": True} and b["top_k"] == 20
    own = _body(messages=(Message("system", "Mine."), Message("user", "Q?")), system="Default.")
    assert [m["content"] for m in own["messages"]] == ["Mine.", "Q?"]  # the trial's own system prompt wins
    assert temperature_param("anthropic", 1.0, True) is None
    with pytest.raises(ApiRequestError, match=r"temperature 1\.0"):
        temperature_param("anthropic", 0.5, True)


OPENAI_REPLY = {  # the shape of a Chat Completions response (OpenAI API reference)
    "id": "chatcmpl-123",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "gpt-5.5-2026-04-23",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Answer: No", "refusal": None, "annotations": []},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {
        "prompt_tokens": 1200,
        "completion_tokens": 340,
        "total_tokens": 1540,
        "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 320, "audio_tokens": 0},
    },
    "service_tier": "default",
}


def test_parse_openai_shapes() -> None:
    r = parse_openai(OPENAI_REPLY)
    assert (r.text, r.finish, r.refused, r.served_model) == ("Answer: No", "stop", False, "gpt-5.5-2026-04-23")
    assert r.usage == Usage(input_tokens=1200, output_tokens=340, reasoning_tokens=320, cached_tokens=1024)
    refusal = json.loads(json.dumps(OPENAI_REPLY))
    refusal["choices"][0]["message"].update(content=None, refusal="I can't help with that.")
    r = parse_openai(refusal)
    assert r.refused and r.text == "I can't help with that."
    filtered = json.loads(json.dumps(OPENAI_REPLY))
    filtered["choices"][0].update(finish_reason="content_filter")
    assert parse_openai(filtered).refused
    vllm = {  # vLLM / transformers serve: reasoning in a side field, usage without details
        "id": "x",
        "model": "tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Yes", "reasoning_content": "hmm"}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42},
    }
    r = parse_openai(vllm)
    assert (r.text, r.reasoning, r.usage.input_tokens, r.usage.cached_tokens) == ("Yes", "hmm", 40, 0)
    for bad, kind in (
        ("<html>bad gateway</html>", "malformed"),
        ({"id": None, "choices": None}, "malformed"),
        ({"choices": []}, "malformed"),
        ({"error": {"message": "upstream overloaded"}}, "server"),
    ):
        with pytest.raises(TransportError) as e:
            parse_openai(bad)
        assert e.value.kind == kind


def test_classify_sdk_errors() -> None:
    openai = pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx2")
    req = httpx.Request("POST", "http://x/v1/chat/completions")

    def status(code: int, body=None, headers=None):
        resp = httpx.Response(code, headers=headers or {}, request=req)
        cls = {429: openai.RateLimitError, 400: openai.BadRequestError, 401: openai.AuthenticationError}.get(
            code, openai.APIStatusError
        )
        return cls(f"error {code}", response=resp, body=body)

    e = classify(status(429, headers={"retry-after": "3"}), "OPENAI_API_KEY")
    assert isinstance(e, TransportError) and e.kind == "rate_limit" and e.retry_after == 3.0
    for code in (500, 502, 503, 529, 408):
        e = classify(status(code), None)
        assert isinstance(e, TransportError) and e.kind == "server", code
    e = classify(status(401), "OPENAI_API_KEY")
    assert isinstance(e, ApiRequestError) and "$OPENAI_API_KEY" in str(e)
    assert isinstance(classify(status(404), None), ApiRequestError)
    e = classify(status(400, body={"error": {"code": "content_policy_violation", "message": "no"}}), None)
    assert isinstance(e, ProviderRefusal) and e.code == "content_policy_violation"
    assert isinstance(classify(status(400, body={"error": {"code": "invalid_value"}}), None), ApiRequestError)
    assert classify(openai.APITimeoutError(request=req), None).kind == "timeout"  # type: ignore[union-attr]
    assert classify(openai.APIConnectionError(request=req), None).kind == "connection"  # type: ignore[union-attr]
    assert classify(json.JSONDecodeError("x", "{", 0), None).kind == "malformed"  # type: ignore[union-attr]
    with pytest.raises(KeyError):  # anything else is a bug, not a transport failure: it propagates
        classify(KeyError("boom"), None)
