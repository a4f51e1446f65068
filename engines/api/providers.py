"""Provider mappings: a trial to the request a provider expects, its response to a :class:`Reply`.

Both directions are pure functions on plain dicts (the JSON on the wire), so
they are tested against recorded response shapes without a key or a
network, and the same functions serve direct calls and batch files (a batch
line is the same request body; a batch result is the same response body).

* ``openai`` and ``openai-compatible`` speak Chat Completions.
* ``anthropic`` speaks the Messages API.

What the parser later sees is the reply text. Provider-level refusals (an
Anthropic ``stop_reason`` of ``refusal``, an OpenAI ``finish_reason`` of
``content_filter`` or a ``refusal`` message field) are refusals whatever the
text says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.api.pricing import Usage
from engines.api.retry import RETRYABLE_STATUS, parse_retry_after
from probe.errors import ProbeError
from probe.types import Message

PROVIDERS = ("openai", "anthropic", "openai-compatible")
KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
HOST_KEY_ENV = {
    "api.openai.com": "OPENAI_API_KEY",
    "openrouter.ai": "OPENROUTER_API_KEY",
    "generativelanguage.googleapis.com": "GEMINI_API_KEY",
    "api.anthropic.com": "ANTHROPIC_API_KEY",
    "api.together.xyz": "TOGETHER_API_KEY",
    "api.deepseek.com": "DEEPSEEK_API_KEY",
    "api.mistral.ai": "MISTRAL_API_KEY",
}
"""Well-known OpenAI-compatible hosts and the variable their key usually lives in."""
REFUSAL_CODES = frozenset({"content_policy_violation", "content_filter", "invalid_prompt"})
"""Error codes with which a provider declines one prompt (a refusal: data, not a failure)."""


@dataclass(frozen=True)
class Reply:
    """A complete response, reduced to what the run keeps."""

    text: str
    reasoning: str = ""
    finish: str = ""
    refused: bool = False
    """The provider itself flagged a refusal (stop reason, content filter, refusal field)."""
    usage: Usage = field(default_factory=Usage)
    response_id: str = ""
    served_model: str = ""


class TransportError(Exception):
    """A failure worth retrying: the request may well succeed if sent again later."""

    def __init__(self, kind: str, message: str, *, retry_after: float | None = None, status: int | None = None):
        super().__init__(message)
        self.kind = kind
        """rate_limit, server, timeout, connection or malformed."""
        self.retry_after = retry_after
        self.status = status


class ApiRequestError(ProbeError, ValueError):
    """The provider rejected the request itself (bad key, unknown model, invalid parameter): stop, do not retry."""


class ProviderRefusal(Exception):
    """The provider declined this one prompt with an error (a content policy block): recorded as a refusal."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------- requests
def split_system(messages: Sequence[Message], default_system: str | None) -> tuple[str | None, list[Message]]:
    """The system text (the trial's own, else ``default_system``) and the remaining turns.

    Like the Transformers engine, ``--system`` is added only to trials that
    have no system turn of their own.
    """
    system = [m.content for m in messages if m.role == "system"]
    rest = [m for m in messages if m.role != "system"]
    return ("\n\n".join(system) if system else default_system), rest


def temperature_param(provider: str, temperature: float, thinking: bool) -> float | None:
    """The ``temperature`` to send, or None to leave the provider's default.

    OpenAI's and Anthropic's default is 1.0, and several of their reasoning
    models reject any explicit sampling parameter; so at 1.0 (and always with
    Anthropic thinking, which requires 1.0) nothing is sent. Any other value
    is sent as asked and fails loudly if the model refuses it. An
    OpenAI-compatible server's default is its model's generation config
    (often not 1.0), so the temperature is always sent there.
    """
    if provider == "openai-compatible":
        return temperature
    if provider == "anthropic" and thinking:
        if temperature != 1.0:
            raise ApiRequestError(
                f"Anthropic thinking requires temperature 1.0, got --temperature {temperature}; "
                "drop --think or sample at 1.0"
            )
        return None
    return None if temperature == 1.0 else temperature


def openai_body(
    *,
    provider: str,
    model: str,
    messages: Sequence[Message],
    system: str | None,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    reasoning_effort: str | None,
    think: bool,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The Chat Completions request body.

    ``openai`` gets ``max_completion_tokens`` (its reasoning models refuse
    ``max_tokens``); compatible servers get ``max_tokens``, which all of them
    accept. A per-(trial, draw) ``seed`` goes to compatible servers only: a
    server that honours seeds would otherwise return one cached answer for
    every replicate. ``--think`` on a compatible server is the
    ``chat_template_kwargs`` switch that vLLM and ``transformers serve`` read.
    """
    sys_text, turns = split_system(messages, system)
    msgs = ([{"role": "system", "content": sys_text}] if sys_text is not None else []) + [
        {"role": m.role, "content": m.content} for m in turns
    ]
    body: dict[str, Any] = {"model": model, "messages": msgs}
    body["max_completion_tokens" if provider == "openai" else "max_tokens"] = max_tokens
    temp = temperature_param(provider, temperature, False)
    if temp is not None:
        body["temperature"] = temp
    if provider == "openai-compatible":
        if seed is not None:
            body["seed"] = seed
        if think:
            body["chat_template_kwargs"] = {"enable_thinking": True}
    if reasoning_effort is not None:
        body["reasoning_effort"] = reasoning_effort
    body.update(extra)
    return body


def anthropic_body(
    *,
    model: str,
    messages: Sequence[Message],
    system: str | None,
    max_tokens: int,
    temperature: float,
    reasoning_effort: str | None,
    think: bool,
    thinking_budget: int | None,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The Messages API request body.

    ``--think`` asks for adaptive thinking (the model decides how much);
    ``--thinking-budget N`` asks for manual extended thinking with N tokens
    (at least 1024). Thinking tokens count inside ``max_tokens``, so the
    caller passes the answer allowance plus the reasoning allowance
    (:attr:`engines.api.ApiSettings.max_tokens`). ``--reasoning-effort``
    goes to ``output_config.effort``.
    """
    sys_text, turns = split_system(messages, system)
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": m.role, "content": m.content} for m in turns],
    }
    if sys_text is not None:
        body["system"] = sys_text
    thinking = think or thinking_budget is not None
    if thinking_budget is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": thinking_budget}
    elif think:
        body["thinking"] = {"type": "adaptive"}
    if reasoning_effort is not None:
        body["output_config"] = {"effort": reasoning_effort}
    temp = temperature_param("anthropic", temperature, thinking)
    if temp is not None:
        body["temperature"] = temp
    body.update(extra)
    return body


# --------------------------------------------------------------- responses
def _get(obj: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(p)
    return obj


def _int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def parse_openai(d: Any) -> Reply:
    """A Chat Completions response body (dict) to a Reply; a body of the wrong shape is a transport failure."""
    if not isinstance(d, Mapping):
        raise TransportError("malformed", f"expected a JSON object, got {type(d).__name__}: {str(d)[:80]!r}")
    if d.get("error") and not d.get("choices"):
        raise TransportError("server", f"the response carries an error: {str(d['error'])[:200]}")
    choices = d.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(_get(choices[0], "message"), Mapping):
        raise TransportError("malformed", f"response without choices[0].message: {json.dumps(d)[:200]}")
    msg = choices[0]["message"]
    finish = str(choices[0].get("finish_reason") or "")
    content = msg.get("content")
    if isinstance(content, list):  # some compatible servers return content parts
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
    refusal = msg.get("refusal")
    u = d.get("usage") or {}
    usage = Usage(
        input_tokens=_int(u.get("prompt_tokens")),
        output_tokens=_int(u.get("completion_tokens")),
        reasoning_tokens=_int(_get(u, "completion_tokens_details", "reasoning_tokens")),
        cached_tokens=_int(_get(u, "prompt_tokens_details", "cached_tokens")),
    )
    return Reply(
        text=str(content or (refusal or "")),
        reasoning=str(reasoning) if isinstance(reasoning, str) else json.dumps(reasoning),
        finish=finish,
        refused=bool(refusal) or finish == "content_filter",
        usage=usage,
        response_id=str(d.get("id") or ""),
        served_model=str(d.get("model") or ""),
    )


def parse_anthropic(d: Any) -> Reply:
    """A Messages API response body (dict) to a Reply."""
    if not isinstance(d, Mapping):
        raise TransportError("malformed", f"expected a JSON object, got {type(d).__name__}: {str(d)[:80]!r}")
    if d.get("type") == "error" or (d.get("error") and not d.get("content")):
        raise TransportError("server", f"the response carries an error: {str(d.get('error'))[:200]}")
    blocks = d.get("content")
    if not isinstance(blocks, list) or (d.get("stop_reason") is None and not blocks):
        raise TransportError("malformed", f"response without content blocks: {json.dumps(d)[:200]}")
    texts, thoughts = [], []
    for b in blocks:
        kind = _get(b, "type")
        if kind == "text":
            texts.append(str(b.get("text", "")))
        elif kind == "thinking":
            thoughts.append(str(b.get("thinking", "")))
        elif kind == "redacted_thinking":
            thoughts.append("[redacted thinking]")
    u = d.get("usage") or {}
    read, write = _int(u.get("cache_read_input_tokens")), _int(u.get("cache_creation_input_tokens"))
    usage = Usage(
        input_tokens=_int(u.get("input_tokens")) + read + write,
        output_tokens=_int(u.get("output_tokens")),
        reasoning_tokens=_int(_get(u, "output_tokens_details", "thinking_tokens")),
        cached_tokens=read,
        cache_write_tokens=write,
    )
    stop = str(d.get("stop_reason") or "")
    category = _get(d, "stop_details", "category")
    return Reply(
        text="".join(texts),
        reasoning="\n\n".join(thoughts),
        finish=f"{stop}:{category}" if stop == "refusal" and category else stop,
        refused=stop == "refusal",
        usage=usage,
        response_id=str(d.get("id") or ""),
        served_model=str(d.get("model") or ""),
    )


def parse_reply(provider: str, d: Any) -> Reply:
    return parse_anthropic(d) if provider == "anthropic" else parse_openai(d)


# ------------------------------------------------------------------ errors
def _mro_names(e: BaseException) -> set[str]:
    return {c.__name__ for c in type(e).__mro__}


def _error_code(e: BaseException) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, Mapping):
        err = body.get("error", body)
        if isinstance(err, Mapping):
            return str(err.get("code") or err.get("type") or "")
    return str(getattr(e, "code", "") or "")


def server_message(e: BaseException) -> str:
    """The server's own reason for rejecting a request, from the error body the SDK parsed.

    OpenAI-style servers put it in ``{"error": {"message": ...}}``, FastAPI
    servers (``transformers serve``) in ``{"detail": ...}``; the SDK's own
    string ("Error code: 400") is the fallback when the body has neither.
    """
    body = getattr(e, "body", None)
    if isinstance(body, Mapping):
        err = body.get("error", body)
        for holder in (err, body):
            if isinstance(holder, Mapping):
                for key in ("message", "detail"):
                    if holder.get(key):
                        return str(holder[key])
        if isinstance(err, str) and err:
            return err
    elif isinstance(body, str) and body.strip():
        return body.strip()
    return str(e)


def _request_hint(status: int, message: str, key_env: str | None) -> str:
    """What to change, from the status and the server's message (a pinned or unknown model: the model name)."""
    if status == 401:
        return f"the key was rejected; check ${key_env}" if key_env else "the server wants a key; set --api-key-env"
    if status == 403:
        return "this key may not use this model or endpoint"
    if status == 404 or any(w in message.lower() for w in ("model", "pinned")):
        return "check the model name in --model (openai-compatible:<name>@<url>: <name> is what the server serves)"
    return "check the request settings (--temperature, --max-new-tokens, --reasoning-effort, --think, --api-extra-body)"


def classify(e: BaseException, key_env: str | None) -> TransportError | ProviderRefusal | ApiRequestError:
    """Sort an exception from a client call into retry / refusal / stop.

    Works on both SDKs' exception classes by name (they share a hierarchy
    shape), so neither SDK has to be imported here.
    """
    if isinstance(e, (TransportError, ProviderRefusal, ApiRequestError)):
        return e
    names = _mro_names(e)
    if "APITimeoutError" in names or isinstance(e, TimeoutError):
        return TransportError("timeout", "the request timed out")
    if "APIConnectionError" in names or isinstance(e, ConnectionError):
        return TransportError("connection", f"connection failed: {e}")
    status = getattr(e, "status_code", None)
    if "APIStatusError" in names and isinstance(status, int):
        headers = getattr(getattr(e, "response", None), "headers", None)
        retry_after = parse_retry_after(dict(headers) if headers is not None else None)
        if status == 429:
            return TransportError("rate_limit", f"429 rate limited: {e}", retry_after=retry_after, status=status)
        if status in RETRYABLE_STATUS or status >= 500:
            return TransportError("server", f"{status} server error: {e}", retry_after=retry_after, status=status)
        code = _error_code(e)
        if status == 400 and code in REFUSAL_CODES:
            return ProviderRefusal(code, str(e))
        message = server_message(e)
        hint = _request_hint(status, message, key_env)
        return ApiRequestError(f"the server rejected the request ({status}): {message[:500].rstrip('.')}; {hint}")
    if isinstance(e, (ValueError, json.JSONDecodeError)) or "APIResponseValidationError" in names:
        return TransportError("malformed", f"unreadable response: {str(e)[:200]}")
    if any(n in names for n in ("RemoteProtocolError", "ReadError", "WriteError", "NetworkError", "TransportError")):
        return TransportError("connection", f"connection failed: {e}")
    raise e
