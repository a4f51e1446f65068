"""``probe view RUN [RUN ...]`` on the command line: the HTTP server in front of :class:`probe.app.view.Viewer`.

A standard-library ``ThreadingHTTPServer`` bound to 127.0.0.1 that answers
every GET with :meth:`Viewer.handle` and sends each answer with its security
headers (a content-security policy, no sniffing, no framing, no referrer). A
request whose Host header names another host is refused (DNS rebinding,
:func:`host_allowed`). The ``probe view`` verb (and ``probe show``,
:mod:`probe.app.show`) are registered here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from probe.app.verbs import add_verb
from probe.app.view import Response, Viewer
from probe.errors import ProbeError
from probe.terminal import escape_controls

HOST = "127.0.0.1"


class ServeError(ProbeError, RuntimeError):
    """The server cannot start (a port in use); the message says what to change."""


# ------------------------------------------------------------------ the server
def host_allowed(host: str | None, port: int) -> bool:
    """Whether a request's Host header names this server: ``127.0.0.1:PORT``, ``localhost:PORT`` or ``[::1]:PORT``.

    Why: a web page on another site can make the browser resolve its own name to 127.0.0.1 (DNS rebinding) and
    then read this viewer's pages and API as that site's origin; its requests carry that name in Host. The port
    must be this server's own (over an SSH tunnel, forward the same port number: ``-L 8765:127.0.0.1:8765``).
    """
    if not host:
        return False
    return host.strip().lower() in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}")


def misdirected(port: int) -> Response:
    """The answer to a request for another host name (HTTP 421), naming the addresses this viewer answers on."""
    text = (
        f"421 Misdirected Request: this probe view answers only http://127.0.0.1:{port}/ or http://localhost:{port}/ "
        "(a request for another host name is refused: it could be a DNS-rebinding page reading the viewer)\n"
    )
    return Response(421, text.encode(), "text/plain; charset=utf-8")


class _Handler(BaseHTTPRequestHandler):
    viewer: Viewer
    server_version = "probe-view"
    sys_version = ""

    def do_GET(self) -> None:
        port = int(self.server.server_address[1])  # type: ignore[index]  # an (host, port) pair: bound to 127.0.0.1
        resp = self.viewer.handle(self.path) if host_allowed(self.headers.get("Host"), port) else misdirected(port)
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(resp.body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", resp.csp)
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("X-Frame-Options", "DENY")
        for k, v in resp.headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(resp.body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per error only
        if args and str(args[1] if len(args) > 1 else "").startswith(("4", "5")):
            sys.stderr.write(escape_controls(f"probe view: {self.address_string()} {format % args}") + "\n")


def make_server(viewer: Viewer, port: int = 0) -> ThreadingHTTPServer:
    """A server for ``viewer`` on 127.0.0.1 (``port`` 0: a free one)."""
    handler = type("Handler", (_Handler,), {"viewer": viewer})
    server = ThreadingHTTPServer((HOST, port), handler)
    server.daemon_threads = True
    return server


def serve(paths: Sequence[str], port: int = 0, *, log: Callable[[str], None] = print) -> int:
    viewer = Viewer.open(paths)
    try:  # listen before the (slow) trial index is built: a port in use is said at once
        server = make_server(viewer, port)
    except OverflowError:
        raise ServeError(f"--port must be 0-65535, got {port}") from None
    except OSError as e:
        raise ServeError(
            f"cannot listen on {HOST}:{port} ({e.strerror}); pick another --port, or 0 for a free one"
        ) from None
    viewer.warm(log)
    bound = int(server.server_address[1])
    log(f"probe view: http://{HOST}:{bound}/  ({len(viewer.runs)} run(s); Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log("probe view: stopped")
    finally:
        server.server_close()
    return 0


# ------------------------------------------------------------------ the command line
#: The epilog of ``probe view --help``.
EXAMPLES = """examples:
  probe view runs/battery-smol
  probe view runs/q8 runs/q8-think --port 8765
  probe view runs/compare-q8        # the runs of a comparison
  ssh -L 8765:127.0.0.1:8765 login-node 'probe view runs/x --port 8765'   # from a cluster"""


def port_number(text: str) -> int:
    """``--port``: a whole number 0-65535 (0: a free one); argparse's one-line error otherwise."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number 0-65535, got {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535 (0: a free one), got {port}")
    return port


def cmd_view(a: argparse.Namespace) -> int:
    """browse runs in the web browser: manifest, report, every trial (local server)

    Start a local web server (127.0.0.1 only) that shows each run's manifest, progress and integrity, its report
    (summary, sortable tables, figures), and a trial browser: filter by item, factor levels, option, parse status, low
    coverage or greedy-vs-sampled disagreement, and open any trial to see its exact prompt, option probabilities,
    sampled replies and verdicts. Several runs (or a `probe compare` folder) show the same trial side by side. Ctrl-C
    stops it.
    """
    return serve(a.runs, a.port)


def register(sub: Any) -> None:
    """``probe view`` (and ``probe show``, :mod:`probe.app.show`) on the CLI's subparsers."""
    v = add_verb(sub, "view", cmd_view, epilog=EXAMPLES)
    v.add_argument("runs", nargs="+", help="run folders (the --out of `probe run`) or a `probe compare` folder")
    v.add_argument(
        "--port", type=port_number, default=0, help="port on 127.0.0.1 (default: 0, a free one; the URL is printed)"
    )
    from probe.app import show

    show.register(sub)
