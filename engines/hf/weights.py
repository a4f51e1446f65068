"""The model part of the Transformers engine: the loaded weights and every forward through them.

Owns: loading and placing the weights (:func:`load_weights`, a :class:`Weights` record shared by the engines made
from one load), and :class:`Model`, what one engine's settings make of them: the cache keyword, the head's dtype
(:func:`float32_head`), each phase's experts implementation (:func:`experts_by_phase`), the attention kernel
(:func:`math_attention`), left padding, and the forwards (last position, token tree) with their log-probs (a
readout's normalized in float64, :func:`readout_log_probs`). May import: :mod:`engines.hf.settings`,
:mod:`engines.hf.tokens`, :mod:`engines.base`, :mod:`engines.local` (the manifest's folder record),
:mod:`engines.hf.placement`, :mod:`probe`; torch and transformers lazily.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.base import require
from engines.hf.placement import TorchCuda, check_offload, nvidia_driver, place
from engines.hf.settings import HFSettings
from engines.hf.tokens import TokenTree, tree_mask
from engines.local import folder_info
from probe.errors import ModelError
from probe.models import resolve_model

READOUT_SOFTMAX = "float64"
"""The dtype a readout's log-softmax computes in (:func:`readout_log_probs`); recorded in the run key
(:meth:`engines.hf.HFEngine.identity`)."""
READOUT_ROWS = 64
"""Rows per float64 log-softmax in :func:`readout_log_probs`, which bounds its float64 copy of the logits."""


def readout_log_probs(logits: Any, rows: int = READOUT_ROWS) -> Any:
    """The float64 log-softmax over the vocabulary of each row of ``logits`` (rows x vocabulary): what a readout
    reads (the trie's conditionals and the top other tokens), ``rows`` rows at a time.

    Not float32, because of the trie's subtraction: an option that is a prefix of longer options ("9" of "90"..
    "99") gets ``log1p(-cont)``, ``cont`` its continuations' summed probability, and an error ``e`` in the
    continuations' log-probs moves that term by ``e * cont / (1 - cont)``. float32's normalizer over a 49,152-token
    vocabulary is off by about 1e-5, so smol's "9" of 0-100 (cont 0.90) read 1.1e-4 nats off a float64 reference
    (docs/gpu.md). The logits are float32 (or the model's dtype); only their normalization is done in float64.
    Draws keep float32 log-probs (:meth:`Model.forward`), so no seeded draw moves.
    """
    torch = require("torch", "hf")
    out = torch.empty(logits.shape, dtype=torch.float64, device=logits.device)
    for lo in range(0, logits.shape[0], rows):
        out[lo : lo + rows] = torch.log_softmax(logits[lo : lo + rows].double(), dim=-1)
    return out


def math_attention(device_type: str, dtype: Any, capability: str | None = None) -> bool:
    """Whether attention must run through PyTorch's math kernel: bfloat16 or float16 on a CPU whose kernel set is
    not AVX-512 (``capability``: ``torch.backends.cpu.get_cpu_capability()``, which ``ATEN_CPU_CAPABILITY`` sets).

    torch 2.13's CPU flash-attention kernel packs half-precision operands with ``pack_vnni2``, which exists only
    in its AVX-512 build: on an AVX2 CPU (or under ``ATEN_CPU_CAPABILITY=default`` / ``avx2``) every such
    attention over 64 or more tokens fails ("pack_vnni2 is only supported when avx512 is supported"), so a
    bfloat16 run on the CPU would stop at its first long prompt. The math kernel computes the same attention.
    """
    torch = require("torch", "hf")
    if device_type != "cpu" or dtype not in (torch.bfloat16, torch.float16):
        return False
    cap = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    return not str(cap).upper().startswith("AVX512")


def model_experts(model: Any) -> str | None:
    """The experts implementation ``model`` computes with now; None for a model without switchable experts
    (no mixture-of-experts layer, or a Transformers without ``set_experts_implementation``)."""
    get = getattr(model, "get_experts_implementation", None)
    return get().get("") if get is not None and has_switchable_experts(model) else None


def has_switchable_experts(model: Any) -> bool:
    """Whether a layer of ``model`` dispatches its experts by the config's implementation: its class was made by
    Transformers' ``use_experts_implementation`` (whose forward is defined in ``integrations/moe.py``). The
    model class's own flag (``_can_set_experts_implementation``) is read from its source file, so a dense
    variant of a mixture-of-experts architecture (Nemotron-H without MoE layers) claims it too."""
    for m in model.modules():
        code = getattr(type(m).forward, "__code__", None)
        if code is not None and Path(code.co_filename).parts[-2:] == ("integrations", "moe.py"):
            return True
    return False


@dataclass(frozen=True)
class Experts:
    """The experts implementation of each phase of a mixture-of-experts model (:func:`experts_by_phase`)."""

    prefill: str
    decode: str

    def of(self, tokens_per_row: int) -> str:
        """The implementation of a forward over ``tokens_per_row`` new tokens per row: one is a decoding step."""
        return self.decode if tokens_per_row == 1 else self.prefill


def experts_by_phase(loaded: str | None, device_type: str, prefill: str, decode: str) -> Experts | None:
    """Each phase's experts implementation for a model loaded with ``loaded`` (None: no experts, None back) on
    ``device_type``, from the settings ``prefill`` and ``decode`` (auto or an implementation).

    auto prefill keeps the loaded one. auto decode is Transformers' own rule in ``generate()``
    (``_optimize_model_for_decode``): batched_mm where prefill is grouped_mm off the CPU (grouped_mm's launches
    dominate a step of a few tokens per expert on a GPU; on a CPU grouped_mm is faster), else as prefill.
    """
    if loaded is None:
        return None
    p = loaded if prefill == "auto" else prefill
    if decode != "auto":
        return Experts(p, decode)
    return Experts(p, "batched_mm" if p == "grouped_mm" and device_type != "cpu" else p)


@dataclass(frozen=True)
class Weights:
    """What loading decided, once per model: the weights and tokenizer, where they came from and where they live.

    Every engine derived from a loaded one (:meth:`engines.hf.HFEngine.variant`) shares this record and derives the
    rest from its own settings (:meth:`Model.load`), so nothing loading decided is copied by hand or lost.
    """

    model: Any
    tokenizer: Any
    path: str | None = None
    """The model folder it was loaded from (None: a model handed in)."""
    placement: str = "given"
    """How it was placed (:func:`engines.hf.placement.place`); given: placed by the caller that handed it in."""
    experts: str | None = None
    """The experts implementation it loaded with (:func:`model_experts`; None: no switchable experts). Kept here
    because engines sharing the model switch it per phase (:meth:`Model.call`)."""


def load_weights(s: HFSettings) -> Weights:
    """Tokenizer and model of ``s.model``, placed (``s.device``, :func:`engines.hf.placement.place`) and in the
    settings' dtype."""
    torch = require("torch", "hf")
    transformers = require("transformers", "hf")

    ref = resolve_model(s.model)
    cuda = TorchCuda.of(torch)
    # nvidia-smi is asked only where torch sees no GPU: to tell "no GPU here" from "a GPU torch cannot use"
    where = place(s.device, cuda, nvidia_driver() if not cuda.available and s.device != "cpu" else None)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        s.dtype, torch.bfloat16 if where.cuda else torch.float32
    )
    kw: dict[str, Any] = {"revision": s.revision, "trust_remote_code": s.trust_remote_code}
    transformers.logging.disable_progress_bar()  # probe shows its own progress; keep logs clean
    try:
        tok = transformers.AutoTokenizer.from_pretrained(ref.path, **kw)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            ref.path, dtype=dtype, device_map=where.device_map, **kw
        )
    except (OSError, ValueError) as e:
        raise ModelError(
            f"cannot load model {s.model!r} ({ref.path}): {str(e).splitlines()[0]}. "
            "Pass a built-in name (tiny, tiny-hybrid, smol), a local model folder, a .gguf file, or a Hugging Face id "
            "that is in the local cache or downloadable from here."
        ) from e
    if where.cuda:
        sizes = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
        check_offload(getattr(model, "hf_device_map", None), sizes, allowed=s.offload)
    model.eval()
    return Weights(model, tok, ref.path, where.describe(), model_experts(model))


def float32_head(model: Any, head_dtype: str) -> str:
    """The dtype ``model``'s final projection computes in for an engine whose setting is ``head_dtype``: float32
    where the weights are, or where the setting asks for it (the head then patched to compute in float32), else the
    model's.

    A bfloat16 ``lm_head`` rounds every logit to 8 bits of mantissa before the float32 softmax: on SmolLM2
    that alone moved option log-probabilities by up to 0.09 nats (docs/gpu.md). The head's forward is replaced
    (once per loaded model) by one that, while the engine reading asks for float32 (:func:`use_head`), casts
    the hidden state up and multiplies by a float32 copy of the weights on the head's own device (an
    accelerate hook around it still moves its input there first), and otherwise runs the original. It runs
    only at the positions the engine reads (``logits_to_keep``).
    """
    torch = require("torch", "hf")
    head = model.get_output_embeddings()
    if head is None or getattr(head, "weight", None) is None:
        return "model"
    if head.weight.dtype == torch.float32:
        return "float32"
    if head_dtype != "float32":
        return "model"
    if getattr(head, "_probe_float32", None) is not None:
        return "float32"  # already patched by another engine on the same weights
    attr = "_old_forward" if hasattr(head, "_old_forward") else "forward"  # keep a split model's hook
    original = getattr(head, attr)
    weight = head.weight.detach().float()
    bias = head.bias.detach().float() if getattr(head, "bias", None) is not None else None

    def forward(hidden: Any) -> Any:
        if not head._probe_float32:
            return original(hidden)
        return torch.nn.functional.linear(hidden.to(weight.device, torch.float32), weight, bias)

    setattr(head, attr, forward)
    head._probe_float32 = True
    return "float32"


def use_head(model: Any, head: str) -> None:
    """Before a forward: the shared head of ``model`` computes in ``head``, the reading engine's head dtype."""
    out = model.get_output_embeddings()
    if out is not None and getattr(out, "_probe_float32", None) is not None:
        out._probe_float32 = head == "float32"


class Model:
    """The loaded weights as one engine's settings compute with them, and every forward through them.

    Built on a :class:`Weights` record (or on the settings alone, loading at first use: :meth:`load`), it derives
    what the settings make of the weights in one place, so an engine made on shared weights
    (:meth:`engines.hf.HFEngine.variant`) computes as a freshly loaded one with its settings would: the cache
    keyword, the pad token, the head's dtype, each phase's experts implementation. ``on_tokenizer`` is called with
    the tokenizer once it has its pad token, before the head and the experts are derived (the engine checks its
    chat template there).
    """

    def __init__(
        self, settings: HFSettings, weights: Weights | None = None, *, on_tokenizer: Callable[[Any], None]
    ) -> None:
        self.settings = settings
        self._weights = weights
        self._on_tokenizer = on_tokenizer
        self._module: Any = None  # set with the rest of what the weights decide, by load()
        self._tokenizer: Any = None
        self.cache_kw = "past_key_values"
        """The keyword the model's forward takes its cache by (``cache`` or ``past_key_values``)."""
        self.head = "model"
        """The dtype the final projection computes in (:func:`float32_head`)."""
        self.experts: Experts | None = None
        """Each phase's experts implementation (:func:`experts_by_phase`); None: no switchable experts."""
        self._math: bool | None = None  # attention through the math kernel (:func:`math_attention`), once known
        self._split: bool | None = None  # the weights live on more than one device (:meth:`is_split`)

    def load(self) -> Model:
        """Load tokenizer and model (idempotent), then derive what the settings make of them."""
        if self._weights is None:
            self._weights = load_weights(self.settings)
        if self._module is None:
            w = self._weights
            self._module, self._tokenizer = w.model, w.tokenizer
            params = inspect.signature(self._module.forward).parameters
            self.cache_kw = "cache" if "cache" in params else "past_key_values"
            if w.tokenizer.pad_token_id is None:
                w.tokenizer.pad_token = w.tokenizer.eos_token
            self._on_tokenizer(w.tokenizer)
            self.head = float32_head(self._module, self.settings.head_dtype)
            s = self.settings
            if w.experts is not None:  # a mixture-of-experts model: each phase's implementation
                self.experts = experts_by_phase(w.experts, self.device.type, s.experts_prefill, s.experts_decode)
        return self

    @property
    def weights(self) -> Weights:
        """What loading decided (loaded on first use)."""
        self.load()
        assert self._weights is not None
        return self._weights

    @property
    def module(self) -> Any:
        """The Transformers model (loaded on first use)."""
        if self._module is None:
            self.load()
        return self._module

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (loaded on first use)."""
        if self._module is None:
            self.load()
        return self._tokenizer

    @property
    def config(self) -> Any:
        return self.module.config

    @property
    def device(self) -> Any:
        """Where the inputs go: the device of the input embeddings."""
        return self.module.get_input_embeddings().weight.device

    def describe(self) -> dict[str, Any]:
        """What the manifest records of the model: where it came from, its class, dtype, head dtype and placement."""
        m = self.module
        path = str(self.weights.path or getattr(m, "name_or_path", ""))
        info: dict[str, Any] = {
            "model_path": path,
            "model_class": type(m).__name__,
            "dtype": str(next(m.parameters()).dtype).replace("torch.", ""),
            "head_dtype": self.head,
            "device": str(self.device),
            "placement": self.weights.placement,
            "devices": sorted({str(p.device) for p in m.parameters()}),
            "commit_hash": getattr(m.config, "_commit_hash", None),
            "n_parameters": sum(p.numel() for p in m.parameters()),
        }
        info.update(folder_info(path))
        return info

    def pad_left(self, seqs: Sequence[Sequence[int]]) -> tuple[Any, Any]:
        """Ids and attention mask of ``seqs`` left-padded to the longest, on the model's device."""
        torch = require("torch", "hf")
        width = max(len(s) for s in seqs)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[r, width - len(s) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def call(self, **inputs: Any) -> Any:
        """One forward of the model: the head in this engine's dtype (:func:`use_head`), the experts of a
        mixture-of-experts model in the implementation of the forward's phase (:class:`Experts`; switched only when
        the model computes with another), and attention through PyTorch's math kernel where its CPU flash kernel
        cannot run (:func:`math_attention`)."""
        use_head(self.module, self.head)
        if self.experts is not None:
            want = self.experts.of(inputs["input_ids"].shape[1])
            if self.module.get_experts_implementation().get("") != want:
                self.module.set_experts_implementation(want)
        if self._math is None:
            self._math = math_attention(self.device.type, next(self.module.parameters()).dtype)
        if not self._math:
            return self.module(**inputs)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            return self.module(**inputs)

    def forward(self, ids: Any, mask: Any, cache: Any, *, float64: bool = False) -> tuple[Any, Any]:
        """Last-position float32 log-probs (float64 with ``float64``: a readout's, :func:`readout_log_probs`) and
        the updated cache.

        ``mask`` covers the cache and ``ids``; positions count only unmasked
        tokens, so left padding (and the padding of a cached prefix) moves no
        RoPE position.
        """
        torch = require("torch", "hf")
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        out = self.call(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_kw: cache},
        )
        new_cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        if float64:
            return readout_log_probs(out.logits[:, -1, :]), new_cache
        return torch.log_softmax(out.logits[:, -1, :].float(), dim=-1), new_cache

    def forward_tree(self, tree: TokenTree, keep: Sequence[int], *, use_cache: bool = False) -> Any:
        """float32 log-probs at the nodes ``keep`` of a packed token tree, in one forward pass (:meth:`tree_logits`).

        With ``use_cache`` it returns ``(log-probs, cache)``: the cache holds every node's keys and values (one
        row, in node order), which :func:`engines.hf.sampling.gather_tree_cache` turns into one row per prompt.
        """
        torch = require("torch", "hf")
        logits, cache = self.tree_logits(tree, keep, use_cache=use_cache)
        lp = torch.log_softmax(logits, dim=-1)
        if not use_cache:
            return lp
        return lp, cache

    def tree_logits(self, tree: TokenTree, keep: Sequence[int], *, use_cache: bool = False) -> tuple[Any, Any]:
        """float32 logits at the nodes ``keep`` of a packed token tree, in one forward pass, and with ``use_cache``
        its cache (else None)."""
        torch = require("torch", "hf")
        dev = self.device
        # an additive float mask: eager attention adds it to the scores, and SDPA takes it without converting
        dtype = next(self.module.parameters()).dtype
        allowed = tree_mask(tree, dev)[None, None]
        mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill_(~allowed, torch.finfo(dtype).min)
        out = self.call(
            input_ids=torch.tensor([tree.tokens], device=dev),
            attention_mask=mask,
            position_ids=torch.tensor([tree.depth], device=dev),
            use_cache=use_cache,
            logits_to_keep=torch.tensor(keep, device=self.hidden_device()),
        )
        if not use_cache:
            return out.logits[0].float(), None
        return out.logits[0].float(), getattr(out, "cache", None) or getattr(out, "past_key_values", None)

    def hidden_device(self) -> Any:
        """The device of the last hidden state, which ``logits_to_keep`` indexes before the head.

        The embeddings' device on a model in one place; on a split model the CPU, because a CPU index can index a
        tensor on any device (a CUDA index cannot index another device's tensor) and the final norm's device is
        not known in general.
        """
        return "cpu" if self.is_split() else self.device

    def is_split(self) -> bool:
        """Whether the weights live on more than one device (worked out at the first forward that asks)."""
        if self._split is None:
            self._split = len({p.device for p in self.module.parameters()}) > 1
        return self._split

    def tree_where_possible(self, setting: str, fallback: str, others: tuple[str, str]) -> str:
        """``settings.<setting>`` with auto resolved: tree where the model allows it, else ``fallback``.

        Asking for tree on a model that cannot take it is an error naming the reason and the other paths.
        """
        want = getattr(self.settings, setting)
        if want not in ("auto", "tree"):
            return str(want)
        why = self.tree_unsupported()
        if why and want == "tree":
            raise ValueError(
                f"{setting}='tree' cannot run on model {self.settings.model!r}: {why}; "
                f"use {setting}='{others[0]}' or '{others[1]}' (or auto, which picks one)"
            )
        return "tree" if not why else fallback

    def tree_unsupported(self) -> str | None:
        """Why one tree-masked forward would not compute what separate forwards compute (None if it would).

        The tree mask replaces causal attention over the past, so every layer
        that carries state must be plain full attention: a recurrent (Mamba)
        state or a sliding window would see the packed siblings.
        """
        transformers = require("transformers", "hf")
        config = self.module.config
        impl = getattr(config, "_attn_implementation", None)
        if impl not in ("sdpa", "eager"):
            return f"its attention implementation {impl!r} takes no custom attention mask"
        kinds = {type(layer).__name__ for layer in transformers.DynamicCache(config=config).layers}
        if not kinds <= {"DynamicLayer", "DummyLayer"}:
            return f"it has layers that are not full attention ({', '.join(sorted(kinds - {'DynamicLayer', 'DummyLayer'}))})"
        return None
