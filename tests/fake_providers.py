"""A local stand-in for the Anthropic Messages API and the OpenAI / Anthropic batch interfaces.

The official clients talk to it over real HTTP (``base_url`` pointed here),
so the tests exercise the SDK calls the engine makes and the response
shapes the providers document, with no key and no internet. Replies come
from a user function (request body -> response body); a queue of scripted
failures (status, headers) can be put in front of any path.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.quiet_http import LocalServer, QuietHandler

Answer = Callable[[dict[str, Any]], dict[str, Any]]


def anthropic_message(
    text: str, *, stop: str = "end_turn", thinking: str | None = None, **usage: int
) -> dict[str, Any]:
    """A Messages API response body, in the documented shape."""
    content: list[dict[str, Any]] = []
    if thinking is not None:
        content.append({"type": "thinking", "thinking": thinking, "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrk"})
    if text:
        content.append({"type": "text", "text": text})
    u = {"input_tokens": 20, "output_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    u |= usage
    return {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-6",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {**u, "service_tier": "standard"},
    }


def chat_completion(text: str, prompt: int = 12, completion: int = 2) -> dict[str, Any]:
    return {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion",
        "created": 1_741_570_283,
        "model": "gpt-5.5-2026-04-23",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None, "annotations": []},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        },
    }


class FakeProvider(LocalServer):
    """Serves ``/v1/messages``, Anthropic and OpenAI batches, and OpenAI files, on localhost."""

    def __init__(self, answer: Answer, *, polls_before_end: int = 1) -> None:
        self.answer = answer
        self.polls_before_end = polls_before_end
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.failures: dict[str, list[tuple[int, dict[str, str]]]] = {}
        """path prefix -> scripted (status, headers) answered before the real reply, first in first out."""
        self.creates: Counter[str] = Counter()
        self.batches: dict[str, dict[str, Any]] = {}
        self.files: dict[str, str] = {}
        self._lock = threading.Lock()
        super().__init__(self._handler())
        self.start()

    def fail(self, path: str, status: int, headers: dict[str, str] | None = None) -> None:
        self.failures.setdefault(path, []).append((status, headers or {}))

    def bodies(self, path: str) -> list[Any]:
        return [b for m, p, _, b in self.requests if p == path and m == "POST"]

    # --------------------------------------------------------------- routes
    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        now = int(time.time())
        if method == "POST" and path == "/v1/messages":
            return 200, self.answer(body)
        if method == "POST" and path == "/v1/messages/batches":
            bid = f"msgbatch_{len(self.batches):04d}"
            self.creates["anthropic"] += 1
            self.batches[bid] = {"kind": "anthropic", "requests": body["requests"], "polls": 0}
            return 200, self._anthropic_batch(bid, "in_progress")
        if method == "GET" and path.startswith("/v1/messages/batches/"):
            rest = path[len("/v1/messages/batches/") :]
            if rest.endswith("/results"):
                b = self.batches[rest[: -len("/results")]]
                lines = [
                    {"custom_id": r["custom_id"], "result": {"type": "succeeded", "message": self.answer(r["params"])}}
                    for r in b["requests"]
                ]
                return 200, "".join(json.dumps(x) + "\n" for x in lines)
            b = self.batches[rest]
            b["polls"] += 1
            return 200, self._anthropic_batch(rest, "ended" if b["polls"] > self.polls_before_end else "in_progress")
        if method == "POST" and path == "/v1/files":
            fid = f"file-{len(self.files):04d}"
            self.files[fid] = body
            return 200, {
                "id": fid,
                "object": "file",
                "bytes": len(body),
                "created_at": now,
                "filename": "batch.jsonl",
                "purpose": "batch",
                "status": "processed",
            }
        if method == "POST" and path == "/v1/batches":
            bid = f"batch_{len(self.batches):04d}"
            self.creates["openai"] += 1
            lines = [json.loads(x) for x in self.files[body["input_file_id"]].splitlines() if x.strip()]
            self.batches[bid] = {"kind": "openai", "lines": lines, "polls": 0, "meta": body.get("metadata") or {}}
            return 200, self._openai_batch(bid, "validating")
        if method == "GET" and path.startswith("/v1/batches/"):
            bid = path[len("/v1/batches/") :]
            b = self.batches[bid]
            b["polls"] += 1
            return 200, self._openai_batch(bid, "completed" if b["polls"] > self.polls_before_end else "in_progress")
        if method == "GET" and path.startswith("/v1/batches"):
            data = [self._openai_batch(bid, "in_progress") for bid, b in self.batches.items() if b["kind"] == "openai"]
            return 200, {"object": "list", "data": data[::-1], "has_more": False}
        if method == "GET" and path.startswith("/v1/files/") and path.endswith("/content"):
            bid = path[len("/v1/files/") : -len("/content")].replace("out-", "")
            out = [
                {
                    "id": f"batch_req_{i}",
                    "custom_id": x["custom_id"],
                    "response": {"status_code": 200, "request_id": f"req_{i}", "body": self.answer(x["body"])},
                    "error": None,
                }
                for i, x in enumerate(self.batches[bid]["lines"])
            ]
            return 200, "".join(json.dumps(x) + "\n" for x in out)
        return 404, {"type": "error", "error": {"type": "not_found_error", "message": f"no route {method} {path}"}}

    def _anthropic_batch(self, bid: str, status: str) -> dict[str, Any]:
        n = len(self.batches[bid]["requests"])
        ended = status == "ended"
        return {
            "id": bid,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": {
                "processing": 0 if ended else n,
                "succeeded": n if ended else 0,
                "errored": 0,
                "canceled": 0,
                "expired": 0,
            },
            "created_at": "2026-11-30T10:00:00Z",
            "expires_at": "2026-12-01T10:00:00Z",
            "ended_at": "2026-11-30T10:05:00Z" if ended else None,
            "archived_at": None,
            "cancel_initiated_at": None,
            "results_url": f"{self.url}/v1/messages/batches/{bid}/results" if ended else None,
        }

    def _openai_batch(self, bid: str, status: str) -> dict[str, Any]:
        b = self.batches[bid]
        n = len(b["lines"])
        done = status == "completed"
        return {
            "id": bid,
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "errors": None,
            "input_file_id": "file-0000",
            "completion_window": "24h",
            "status": status,
            "output_file_id": f"out-{bid}" if done else None,
            "error_file_id": None,
            "created_at": 1_741_570_283,
            "request_counts": {"total": n, "completed": n if done else 0, "failed": 0},
            "metadata": b["meta"],
        }

    # ---------------------------------------------------------------- HTTP
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(QuietHandler):
            def serve(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.split("?", 1)[0]
                body: Any = None
                if raw:
                    if "multipart/form-data" in (self.headers.get("Content-Type") or ""):
                        text = raw.decode("utf-8", "replace")
                        body = "".join(x + "\n" for x in text.splitlines() if x.startswith('{"custom_id"'))
                    else:
                        body = json.loads(raw)
                with fake._lock:
                    fake.requests.append((self.command, path, {k.lower(): v for k, v in self.headers.items()}, body))
                    queued = next((q for p, q in fake.failures.items() if path.startswith(p) and q), None)
                    failure = queued.pop(0) if queued else None
                    if failure is None:
                        status, payload = fake._route(self.command, path, body)
                if failure is not None:
                    status, headers = failure
                    err = {"type": "error", "error": {"type": "overloaded_error", "message": "injected"}}
                    return self._reply(status, err, headers)
                self._reply(status, payload, {})

            def _reply(self, status: int, payload: Any, headers: dict[str, str]) -> None:
                if isinstance(payload, str):  # a file's content
                    return self.respond(status, payload.encode(), headers, "application/binary")
                self.respond(status, json.dumps(payload).encode(), headers)

        return Handler
