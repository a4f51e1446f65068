"""What the tests' local HTTP servers share (:mod:`tests.fake_providers`, :mod:`tests.fault_proxy`)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class QuietServer(ThreadingHTTPServer):
    """A threaded server whose handler threads are daemons, and to which a client going away is no error."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that went away (killed, or timed out on a held connection) is part of the test, not an error."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class LocalServer:
    """A :class:`QuietServer` on a free localhost port, serving from a daemon thread once started."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = QuietServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
