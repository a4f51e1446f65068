"""The vLLM engine's data parallelism: ``size`` engine replicas in spawned processes (vLLM's offline recipe), each
given a contiguous block of every call's trials (:func:`engines.batching.split_even`), results concatenated in
block order.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from engines.batching import split_even
from engines.vllm.requests import VLLMReadoutError
from engines.vllm.settings import VLLMSettings
from probe.types import Trial


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dp_env(rank: int, size: int, port: int) -> dict[str, str]:
    """vLLM's offline data-parallel environment for one replica (all replicas on this node)."""
    return {
        "VLLM_DP_RANK": str(rank),
        "VLLM_DP_RANK_LOCAL": str(rank),
        "VLLM_DP_SIZE": str(size),
        "VLLM_DP_MASTER_IP": "127.0.0.1",
        "VLLM_DP_MASTER_PORT": str(port),
    }


def _dp_worker(settings: VLLMSettings, path: str, env: dict[str, str], conn: Any, factory: Any) -> None:
    """One data-parallel replica: builds its engine (``factory(settings, model_path=path)``, picklable by name), then
    answers (verb, args) messages until ``stop``."""
    os.environ.update(env)
    try:
        engine = factory(settings, model_path=path)
        engine.load()
        d = engine.describe()
        conn.send(("ready", {k: d[k] for k in ("dtype", "logprob_request", "head_dtype")}))
    except Exception as e:  # reported to the parent, which raises it
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            break
        try:
            verb, args = msg[0], msg[1:]
            if not args[0]:  # an idle replica still steps with the others (vLLM's offline DP recipe)
                engine.placeholder()
                conn.send(("ok", []))
            elif verb == "readout":
                conn.send(("ok", engine.readout(args[0])))
            elif verb == "sample":
                trials, n, temperature, cap, answer = args
                conn.send(("ok", engine.sample(trials, n, temperature, max_new_tokens=cap, stop_at_answer=answer)))
            else:
                conn.send(("error", f"unknown verb {verb!r}"))
        except Exception as e:  # reported to the parent, which raises it
            conn.send(("error", f"{type(e).__name__}: {e}"))
    conn.close()


class DPPool:
    """``size`` engine replicas in spawned processes, each given a contiguous block of every call's trials.

    vLLM's ``LLM`` refuses ``data_parallel_size > 1`` in one process; its
    offline recipe is one process per replica with ``VLLM_DP_*`` set, which is
    what this does (GPUs are assigned by vLLM from the local rank). Results
    are concatenated in block order, so they come back in input order.
    """

    def __init__(self, settings: VLLMSettings, size: int, path: str, factory: Any) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        port = _free_port()
        self.size = size
        self._conns = []
        self._procs = []
        for rank in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_dp_worker, args=(settings, path, dp_env(rank, size, port), child, factory), daemon=False
            )
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)
        infos = [self._receive(r) for r in range(size)]
        self.info: dict[str, str] = infos[0]
        """The replicas' resolved dtype and logprob request path (for the manifest)."""

    def _receive(self, rank: int) -> Any:
        status, payload = self._conns[rank].recv()
        if status == "error":
            self.close()
            raise VLLMReadoutError(f"data-parallel replica {rank}: {payload}")
        return payload

    def call(self, verb: str, trials: list[Trial], *args: Any) -> list[Any]:
        blocks = split_even(len(trials), self.size)
        for conn, (lo, hi) in zip(self._conns, blocks, strict=True):
            conn.send((verb, trials[lo:hi], *args))
        out: list[Any] = []
        for rank in range(self.size):
            out += self._receive(rank)
        return out

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        for proc in self._procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.terminate()
        self._conns, self._procs = [], []
