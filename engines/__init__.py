"""Engines: one small contract (:mod:`engines.base`) and its backends.

The backend is chosen from the model spec's scheme, or with ``--engine``:

====================  ===========  =========================================
model spec            engine       module
====================  ===========  =========================================
``tiny``, a folder,   ``hf``       :mod:`engines.hf` (Transformers)
a Hugging Face id
``vllm:<model>``      ``vllm``     :mod:`engines.vllm`
``sim`` / ``sim:..``  ``sim``      :mod:`engines.sim` (synthetic subject)
``openai:<model>``,   ``api``      :mod:`engines.api`
``anthropic:<m>``,
``openai-compatible:<name>@<url>``
the same, with a      ``server``   :mod:`engines.server` (readouts through
readout                            the server; sampling as ``api``)
====================  ===========  =========================================

Each backend module provides ``add_arguments(parser)`` (its own CLI flags,
named so they do not collide with the shared ones) and
``from_args(model, args) -> Engine``; both derive the flags from the
settings dataclass's fields (:mod:`engines.flags`). Backend modules import their heavy
libraries lazily, so this table costs nothing to import.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from engines.base import LOADING, THINK_SAMPLING, EngineSettings, LoadingSettings
from engines.flags import add_flags

ENGINE_MODULES: dict[str, str] = {
    "hf": "engines.hf",
    "vllm": "engines.vllm",
    "sim": "engines.sim",
    "api": "engines.api",
    "server": "engines.server",
}
_SCHEMES: dict[str, str] = {
    "vllm": "vllm",
    "sim": "sim",
    "openai": "api",
    "anthropic": "api",
    "openai-compatible": "api",
}


def engine_kind(model: str, engine: str = "auto") -> str:
    """Which backend serves ``model`` (``engine`` = auto infers it from the spec's scheme)."""
    if engine != "auto":
        if engine not in ENGINE_MODULES:
            raise ValueError(f"unknown engine {engine!r}; choose from auto, {', '.join(ENGINE_MODULES)}")
        return engine
    if model == "sim":
        return "sim"
    scheme = model.split(":", 1)[0] if ":" in model and not Path(model).exists() else ""
    return _SCHEMES.get(scheme, "hf")


def engine_module(kind: str) -> ModuleType:
    try:
        return importlib.import_module(ENGINE_MODULES[kind])
    except ModuleNotFoundError as e:
        if e.name == ENGINE_MODULES[kind]:
            raise ValueError(f"the {kind!r} engine is not part of this version of probe yet") from None
        raise


def available_modules() -> list[ModuleType]:
    """The backend modules present in this checkout (for their CLI flags)."""
    out = []
    for kind in ENGINE_MODULES:
        try:
            out.append(engine_module(kind))
        except ValueError:
            continue
    return out


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """The shared engine flags, then each backend's own."""
    g = p.add_argument_group("model and engine")
    g.add_argument(
        "--model",
        default="tiny",
        help="tiny, tiny-hybrid, smol (SmolLM2-135M-Instruct), a local model folder, a .gguf file, a Hugging Face id, "
        "sim, vllm:<model>, "
        "openai:<model>, anthropic:<model> or openai-compatible:<name>@<url> (default: tiny)",
    )
    g.add_argument("--engine", default="auto", help="auto (from --model), " + ", ".join(ENGINE_MODULES))
    add_flags(g, EngineSettings, ("think", "think_budget"))
    g.add_argument(
        "--think-sampling",
        choices=sorted(THINK_SAMPLING),
        action=_ThinkPreset,
        help="how reasoning is decoded in think mode: greedy (default; the paper's) or qwen3 (sampled at Qwen3's "
        "recommended temperature 0.6, top-p 0.95, top-k 20, seeded per trial); --think-temperature, --think-top-p "
        "and --think-top-k after it override one setting",
    )
    add_flags(g, EngineSettings, ("think_temperature", "think_top_p", "think_top_k", "system_prompt", "frame"))
    add_loading_arguments(g)
    for module in available_modules():
        module.add_arguments(p)


class _ThinkPreset(argparse.Action):
    """``--think-sampling NAME`` sets the three reasoning sampling flags at once (a later flag overrides one)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        namespace.think_temperature, namespace.think_top_p, namespace.think_top_k = THINK_SAMPLING[values]
        setattr(namespace, self.dest, values)


def add_loading_arguments(g: argparse._ArgumentGroup, *, max_new_tokens: int | None = None) -> None:
    """How a local model is loaded and sampled (dtype, device, batch, seed, revision): shared by subject and judge,
    from the fields of :class:`engines.base.LoadingSettings` (the vLLM engine reads the ones it has);
    ``max_new_tokens`` changes that flag's default (a judge's replies are shorter)."""
    add_flags(
        g, LoadingSettings, LOADING, defaults={} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
    )


def wants_server_readout(model: str, args: argparse.Namespace) -> bool:
    """An ``openai-compatible:`` model read through its server: where the verb reads the slot (``probe readout``,
    or ``probe run`` without ``--no-readout``; a namespace without ``no_readout`` is a verb that only samples)."""
    return model.startswith("openai-compatible:") and not getattr(args, "no_readout", True)


def make_engine(args: argparse.Namespace) -> Any:
    """Build the engine the arguments ask for (not yet loaded; a server engine has run its canary).

    What the backend does not support of the shared settings (``--frame``, ``--think``, ``--layers``: its
    ``SUPPORTS``) is refused as its settings are made (:func:`engines.base.check_shared`), before anything is loaded
    or written; the synthetic subject, which has no settings class, checks them in its ``from_args``."""
    kind = engine_kind(args.model, getattr(args, "engine", "auto"))
    if kind == "api" and wants_server_readout(args.model, args):
        kind = "server"
    return engine_module(kind).from_args(args.model, args)
