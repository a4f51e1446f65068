"""``probe serve MODEL``: ``transformers serve`` on a model folder prepared so that it samples for real.

Two things stop ``transformers serve`` from serving a model the way the API
engine asks for it, and both fail quietly or far away:

* it takes its sampling defaults from the model's ``generation_config.json``
  and does not turn sampling on because a request sends a temperature, so a
  model whose config says ``do_sample: false`` (or says nothing) returns the
  greedy reply for every draw;
* started with a model, it is *pinned* to that name and answers any request
  naming another model with a 400.

So the server gets a folder ``<root>/<name>`` that links the model's files and
carries its own generation config (``do_sample`` on, no top-k or top-p
truncation: the raw softmax at the request's temperature, as the hf engine
samples), and runs inside ``<root>`` with ``<name>`` as its model. A request
then names the model ``<name>``: ``--model openai-compatible:<name>@http://HOST:PORT/v1``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from probe.app.verbs import add_verb
from probe.models import resolve_model
from probe.models.gguf import SAMPLING


def served_name(spec: str) -> str:
    """The name requests use: the built-in name, or the folder / file name without its suffix."""
    name = Path(spec.rstrip("/")).name
    if name.lower().endswith(".gguf"):
        name = name[: -len(".gguf")]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    if not name:
        raise ValueError(f"cannot name a served model after {spec!r}; pass --name NAME")
    return name


def serving_folder(model_path: Path, root: Path, name: str) -> Path:
    """``root/name``: links to the model's files, with a generation config that samples from the raw softmax."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    for f in Path(model_path).iterdir():
        link = folder / f.name
        if f.name == "generation_config.json" or not f.is_file():
            continue
        if link.is_symlink() and link.resolve() != f.resolve():
            link.unlink()  # the model was rebuilt elsewhere since: point at the current files
        if not link.exists():
            link.symlink_to(f.resolve())
    gen_path = Path(model_path) / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    (folder / "generation_config.json").write_text(json.dumps({**gen, **SAMPLING}, indent=2) + "\n")
    return folder


def serve_command(exe: Path, name: str, host: str, port: int, device: str) -> list[str]:
    return [str(exe), "serve", name, "--host", host, "--port", str(port), "--device", device, "--reasoning", "off"]


def transformers_exe() -> Path:
    exe = Path(sys.executable).with_name("transformers")
    if not exe.exists():
        raise ValueError(f"{exe} not found; install transformers into this environment (pip install -e '.[dev]')")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise ValueError(f"transformers serve needs fastapi and uvicorn ({e}); pip install -e '.[dev]'") from None
    return exe


def cmd_serve(a: argparse.Namespace) -> int:
    """serve a local model with transformers serve, sampling on (for the API engine)

    Prepare a serving folder for MODEL (its files linked, a generation config with sampling on and no top-k/top-p) and
    run `transformers serve` on it, pinned to NAME. Requests then name the model NAME: --model
    openai-compatible:NAME@http://HOST:PORT/v1. Ctrl-C stops the server.
    """
    from probe.tiny import cache_root

    ref = resolve_model(a.model)
    if not ref.local:
        raise ValueError(f"probe serve needs a local model (tiny, smol, a folder or a .gguf file), got {a.model!r}")
    name = a.name or served_name(a.model)
    root = Path(a.root) if a.root else cache_root() / "serve"
    folder = serving_folder(Path(ref.path), root, name)
    cmd = serve_command(transformers_exe(), name, a.host, a.port, a.device)
    url = f"http://{a.host}:{a.port}/v1"
    print(f"serving {a.model} ({folder} -> {ref.path}) as {name!r} at {url}, sampling on (do_sample, no top-k/top-p)")
    print(f"use: probe run EXPERIMENT --model openai-compatible:{name}@{url} --samples N --out runs/NAME")
    sys.stdout.flush()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("HF_HUB_OFFLINE", "1")  # the folder is local: never look the name up on a hub
    # Become the server (exec, not a child process), so that a signal to `probe serve` (Ctrl-C, kill, a test's
    # terminate) reaches the server itself and never leaves it running on its own.
    os.chdir(root)
    os.execve(cmd[0], cmd, env)
    return 0  # pragma: no cover - execve does not return


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = add_verb(sub, "serve", cmd_serve)
    s.add_argument("model", help="tiny, tiny-hybrid, smol, a local model folder or a .gguf file")
    s.add_argument("--name", default=None, help="the model name requests use (default: from MODEL, e.g. smol)")
    s.add_argument("--host", default="127.0.0.1", help="listen address (default: 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000, help="listen port (default: 8000)")
    s.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    s.add_argument("--root", default=None, help="where serving folders live (default: $PROBE_CACHE/serve)")
