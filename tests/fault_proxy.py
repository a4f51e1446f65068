"""A fault-injecting HTTP proxy for testing the API engine against a real server.

It sits in front of an OpenAI-compatible server and, by a deterministic
schedule (a seeded draw per request), answers some requests itself with a
failure instead of (or after) forwarding them:

* ``429``: rate limited, with ``Retry-After`` (not forwarded);
* ``500`` / ``503``: server errors (not forwarded);
* ``timeout``: holds the connection past the client's timeout, then drops it (not forwarded);
* ``drop``: closes the connection without a response (not forwarded);
* ``truncated``: forwards, then sends only half of the upstream body under the
  full Content-Length and closes (the server did the work: a lost paid call);
* ``malformed``: forwards, then sends a well-framed 200 whose JSON is cut in
  half (also a lost paid call).

It counts what it did, including every upstream completion and its usage,
so a test can check that the client's totals count each accepted response
exactly once while the upstream did strictly more work.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlparse

from tests.quiet_http import LocalServer, QuietHandler

FAULTS = ("429", "500", "503", "timeout", "drop", "truncated", "malformed")
FORWARDED_FAULTS = frozenset({"truncated", "malformed"})


class FaultProxy(LocalServer):
    """Forward to ``upstream`` (``http://host:port``), injecting faults at the given rates."""

    def __init__(
        self,
        upstream: str,
        rates: Mapping[str, float],
        *,
        seed: int = 0,
        retry_after: str = "1",
        hang_seconds: float = 3.0,
        only_path: str = "/v1/chat/completions",
    ) -> None:
        bad = set(rates) - set(FAULTS)
        if bad or sum(rates.values()) >= 1:
            raise ValueError(f"rates must be over {FAULTS} and sum below 1, got {dict(rates)}")
        u = urlparse(upstream)
        self.upstream_host, self.upstream_port = u.hostname or "127.0.0.1", u.port or 80
        self.rates = dict(rates)
        self.retry_after = retry_after
        self.hang_seconds = hang_seconds
        self.only_path = only_path
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.requests = 0
        self.faults: Counter[str] = Counter()
        self.upstream_ok = 0
        """Completions the upstream produced (forwarded with a 200), including those the client never got."""
        self.upstream_usage: Counter[str] = Counter()
        self.delivered_ok = 0
        """Complete 200 responses handed to the client."""
        self.delivered_usage: Counter[str] = Counter()
        self.upstream_errors: list[str] = []
        self.client_gone = 0
        """Requests whose body never arrived whole (the client was killed while sending): not forwarded."""
        self.in_flight = 0
        """Requests the proxy is handling now (a killed client's calls may still be on their way upstream)."""
        self.slowest_forward = 0.0
        """The longest upstream round trip, in seconds: the margin under the client's timeout."""
        self._idle = threading.Condition(self._lock)
        """Failures talking to the upstream (answered 502): not part of the schedule, so tests expect none."""
        super().__init__(self._handler())

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Block until no request is in flight, so counts read afterwards are final; fail after ``timeout`` s."""
        with self._idle:
            if not self._idle.wait_for(lambda: self.in_flight == 0, timeout=timeout):
                raise TimeoutError(f"{self.in_flight} requests still in flight after {timeout:.0f} s")

    def _draw(self) -> str:
        with self._lock:
            self.requests += 1
            x = self._rng.random()
        acc = 0.0
        for kind in FAULTS:
            acc += self.rates.get(kind, 0.0)
            if x < acc:
                return kind
        return "ok"

    def _forward(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> tuple[int, list, bytes]:
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=120)
        try:
            fwd = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection", "accept-encoding")}
            conn.request(method, path, body=body, headers=fwd)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def _count(self, counter: Counter[str], data: bytes) -> None:
        try:
            usage = json.loads(data).get("usage") or {}
        except (ValueError, AttributeError):
            return
        for k in ("prompt_tokens", "completion_tokens"):
            counter[k] += int(usage.get(k) or 0)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(QuietHandler):
            def _kill(self) -> None:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)

            def serve(self) -> None:
                with proxy._lock:
                    proxy.in_flight += 1
                try:
                    self._relay_one()
                finally:
                    with proxy._idle:
                        proxy.in_flight -= 1
                        proxy._idle.notify_all()

            def _relay_one(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size)
                if len(body) < size:
                    # the client died mid-request (a killed run): forwarding the stub under the full
                    # Content-Length would leave the server waiting for bytes that never come
                    with proxy._lock:
                        proxy.client_gone += 1
                    return self._kill()
                kind = proxy._draw() if self.path.startswith(proxy.only_path) else "ok"
                if kind != "ok":
                    with proxy._lock:
                        proxy.faults[kind] += 1
                if kind == "429":
                    err = b'{"error":{"message":"rate limited by the fault proxy","type":"rate_limit"}}'
                    return self.respond(429, err, {"Retry-After": proxy.retry_after})
                if kind in ("500", "503"):
                    return self.respond(int(kind), b'{"error":{"message":"injected server error"}}')
                if kind == "timeout":
                    time.sleep(proxy.hang_seconds)
                    return self._kill()
                if kind == "drop":
                    return self._kill()
                started = time.monotonic()
                try:
                    status, headers, data = proxy._forward(self.command, self.path, dict(self.headers), body)
                except OSError as e:
                    with proxy._lock:
                        proxy.upstream_errors.append(repr(e))
                    return self.respond(502, b'{"error":{"message":"upstream failed"}}')
                if status == 200 and self.path.startswith(proxy.only_path):
                    with proxy._lock:
                        proxy.slowest_forward = max(proxy.slowest_forward, time.monotonic() - started)
                        proxy.upstream_ok += 1
                        proxy._count(proxy.upstream_usage, data)
                if kind == "truncated":
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    return self._kill()
                if kind == "malformed":
                    return self.respond(200, data[: len(data) // 2])
                if status == 200 and self.path.startswith(proxy.only_path):
                    with proxy._lock:
                        proxy.delivered_ok += 1
                        proxy._count(proxy.delivered_usage, data)
                keep = {
                    k: v for k, v in headers if k.lower() not in ("content-length", "transfer-encoding", "connection")
                }
                self.send_response(status)
                for k, v in keep.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
