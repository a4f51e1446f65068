"""Start ``transformers serve`` on localhost serving the tiny model (for the API engine's tests).

``transformers serve`` takes its sampling defaults from the model's
``generation_config.json``; the tiny model's says ``do_sample: false``, and
the server does not turn sampling on when a request sends a temperature.
So the server gets a folder that links the tiny model's files and carries
its own generation config (sampling on, no top-k or top-p truncation). The
folder is named ``tiny`` and the server runs inside its parent with
``tiny`` as its pinned model, so requests name the model ``tiny``:
``openai-compatible:tiny@http://127.0.0.1:PORT/v1``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

SAMPLING_CONFIG = {"do_sample": True, "top_k": 0, "top_p": 1.0, "temperature": 1.0}


@dataclass
class Server:
    url: str
    """Base URL of the OpenAI-compatible API (ends in /v1)."""
    proc: subprocess.Popen
    log: Path
    model_dir: Path

    @property
    def origin(self) -> str:
        return self.url.rsplit("/v1", 1)[0]

    def stop(self) -> None:
        stop_process(self.proc, grace=3)


def stop_process(proc: subprocess.Popen, *, sig: int = signal.SIGTERM, grace: float, kill_wait: float = 15) -> None:
    """Stop a server started by a test: send ``sig``, wait ``grace`` s for it to exit, else kill it and reap it."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=kill_wait)


PORTS_PER_WORKER = 400
"""Under pytest-xdist, worker gwK hands out the ports 20000 + 400 K onwards (below Linux's ephemeral range)."""
_next_port: int | None = None
"""This worker's next port to try (a process is one worker)."""


def free_port() -> int:
    """A port on 127.0.0.1 that is free now, for a server a test is about to start.

    In one process the OS picks it (``bind`` to port 0). Under pytest-xdist each worker takes the ports of its own
    block, in turn, skipping any that is busy: a server takes seconds to bind the port it was given, and in that
    time the OS could hand the same port to another worker (two servers on one port: one of them fails to start).
    Within a worker, servers start one after another.
    """
    global _next_port
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not (worker.startswith("gw") and worker[2:].isdigit()):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    first = 20000 + PORTS_PER_WORKER * int(worker[2:])
    for _ in range(PORTS_PER_WORKER):
        port = first if _next_port is None else _next_port
        _next_port = first + (port + 1 - first) % PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # busy: another program's, or a stopped server's still closing
                continue
            return port
    raise RuntimeError(f"no free port in {first}-{first + PORTS_PER_WORKER - 1} for pytest worker {worker}")


def serving_folder(model_path: Path, root: Path) -> Path:
    """``root/tiny``: links to the model's files, with a sampling generation config."""
    folder = root / "tiny"
    folder.mkdir(parents=True, exist_ok=True)
    for f in Path(model_path).iterdir():
        if f.name != "generation_config.json" and not (folder / f.name).exists():
            (folder / f.name).symlink_to(f.resolve())
    gen = json.loads((Path(model_path) / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**gen, **SAMPLING_CONFIG}, indent=2))
    return folder


def start_server(root: Path, *, timeout: float = 180.0) -> Server:
    """Start the server and wait until it serves the model; fail with its log if it cannot."""
    from probe.app.serve import serve_command, transformers_exe
    from probe.tiny import ensure_tiny

    try:
        exe = transformers_exe()
    except ValueError as e:  # probe serve's own check, as a failure to start
        raise RuntimeError(str(e)) from e
    folder = serving_folder(ensure_tiny("tiny"), root)
    port = free_port()
    log = root / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    cmd = [*serve_command(exe, "tiny", "127.0.0.1", port, "cpu"), "--log-level", "warning"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=folder.parent, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(f"http://127.0.0.1:{port}/v1", proc, log, folder)
    try:
        wait_until_serving(server.url, "tiny", proc, log, what="transformers serve", timeout=timeout, poll=0.2)
    except RuntimeError:
        server.stop()
        raise
    return server


def wait_until_serving(
    url: str, name: str, proc: subprocess.Popen, log: Path, *, what: str, timeout: float, poll: float
) -> None:
    """Return once ``url``/models lists the model ``name``; else raise with the tail of the server's ``log``.

    A server that exits, or does not list the model within ``timeout`` s, is a
    RuntimeError that says which (``what`` names the server in the message).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as r:
                if any(m.get("id") == name for m in json.load(r).get("data", [])):
                    return
        except OSError:
            pass
        time.sleep(poll)
    raise RuntimeError(f"{what} did not come up within {timeout:.0f} s:\n{log.read_text()[-3000:]}")
