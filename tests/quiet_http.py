"""The request handler the tests' local HTTP servers share (:mod:`tests.fake_providers`, :mod:`tests.fault_proxy`)."""

from __future__ import annotations

from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler


class QuietHandler(BaseHTTPRequestHandler):
    """An HTTP/1.1 handler that logs nothing and answers GET and POST alike, through :meth:`serve`."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def serve(self) -> None:
        """Answer the request (GET or POST)."""
        raise NotImplementedError

    def respond(
        self,
        status: int,
        data: bytes,
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        """One whole response: ``data`` under its Content-Type and Content-Length, then ``headers``."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.serve()

    def do_GET(self) -> None:
        self.serve()
