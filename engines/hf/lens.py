"""The layer-wise readout part of the Transformers engine: the logit lens at the positions a readout reads.

Owns: :class:`Lens` (where a model's blocks, final norm and head are; the layers a run reads, :mod:`probe.layers`),
:class:`Taps` (the residual stream kept at the read positions during one forward, by hooks on the blocks) and the
head as the model applies it (:func:`head_logits`). May import: :mod:`engines.hf.settings`,
:mod:`engines.hf.weights` (:func:`readout_log_probs`), :mod:`engines.base`, :mod:`probe`; torch lazily.

The readout at layer l applies the model's own final norm and head (and whatever the model's forward applies to
the head's output: a logit scale or soft-cap) to the residual stream after block l (0: entering the first block),
at each position the option trie reads, and the options are then scored as the final readout scores them
(:mod:`engines.hf.readout`). Only those positions are kept: a forward hook on each block read copies its output
at the read rows (the tree's kept nodes, or each row's last position), so a batch keeps layers x positions x
hidden values, not the every-position hidden states ``output_hidden_states`` would keep.

Transformers' last hidden state comes out of the final norm (``output_hidden_states``'s last entry is the normed
``last_hidden_state``), but a block's output does not: the hooks see every block's output before the norm, so
the norm is applied once at every layer. At the last layer the lens would recompute the model's own logits; it
reads the final readout's log-probs instead (so it equals the stored readout exactly on every path and dtype)
and checks, every forward, that the recomputed ones agree (:data:`LAST_LAYER_TOLERANCE`): a model whose head
this module does not reproduce fails there, naming the model, rather than reading wrong layers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from engines.base import require
from engines.hf.weights import READOUT_ROWS, readout_log_probs
from probe.errors import ModelError
from probe.layers import LayerSpec

BLOCK_LISTS = ("layers", "h", "blocks")
"""Names of the list of blocks in a Transformers decoder (Llama, Qwen, Nemotron-H: ``layers``; GPT-2: ``h``)."""
FINAL_NORMS = ("norm", "norm_f", "final_layernorm", "ln_f")
"""Names of the final norm in a Transformers decoder (Llama, Qwen: ``norm``; Nemotron-H: ``norm_f``)."""
LENS_ROWS = 512
"""Most residual-stream rows (layers x read rows) one norm-and-head call of the lens takes: bounds its float32
logits (rows x vocabulary: 100 MB at smol's 49,152 tokens, 310 MB at Qwen3's 151,936)."""
LAST_LAYER_TOLERANCE = {"float32": 1e-5, "model": 2**-6}
"""How far the lens recomputed at the last layer may stray from the final readout's log-probs, relative to
(1 + the largest magnitude among them), by head dtype: float32 rounds differently only in the head's
accumulation order; a bfloat16 head (2^-8 precision) may round a logit one step apart."""


def head_logits(module: Any, normed: Any) -> Any:
    """The model's logits from its final-normed hidden states ``normed`` (rows x hidden), as its causal-LM forward
    computes them after the norm: the head (in the dtype the engine set, :func:`engines.hf.weights.use_head`),
    then Cohere's ``logit_scale``, Granite's ``logits_scaling`` or Gemma 2's ``final_logit_softcapping``."""
    torch = require("torch", "hf")
    head = module.get_output_embeddings()
    logits = head(normed.to(head.weight.device))
    config = module.config
    scale = getattr(module, "logit_scale", None)
    if isinstance(scale, (int, float)):
        logits = logits * scale
    divide = getattr(config, "logits_scaling", None)
    if isinstance(divide, (int, float)) and divide != 1:
        logits = logits / divide
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits.float()


def decoder_parts(module: Any) -> tuple[Any, Any]:
    """The list of blocks and the final norm of a Transformers causal LM; an error names the model's class and
    the attribute names looked for."""
    decoder = module.get_decoder() if hasattr(module, "get_decoder") else module
    if decoder is module and hasattr(module, "model"):
        decoder = module.model
    blocks = next((getattr(decoder, n) for n in BLOCK_LISTS if hasattr(decoder, n)), None)
    norm = next((getattr(decoder, n) for n in FINAL_NORMS if hasattr(decoder, n)), None)
    if blocks is None or norm is None:
        raise ModelError(
            f"--layers cannot find the blocks and final norm of {type(module).__name__} (looked for "
            f"{'/'.join(BLOCK_LISTS)} and {'/'.join(FINAL_NORMS)} on {type(decoder).__name__}); "
            "run this model without --layers"
        )
    return blocks, norm


class Taps:
    """The residual stream at the read rows of one forward, per layer read (layer 0: entering the first block)."""

    def __init__(self, lens: Lens) -> None:
        self.lens = lens
        self.kept: dict[int, Any] = {}

    def gathered(self, final: Any, rows: Sequence[int], toks: Sequence[int]) -> Iterator[tuple[int, list[float]]]:
        """(layer, the float64 log-probs ``lp[rows[i], toks[i]]``) for each layer read, ascending: the trie's
        conditionals at that layer. The last layer's come from ``final``, the forward's own log-probs, after the
        check that the lens recomputes them (:data:`LAST_LAYER_TOLERANCE`).

        The layers below go through the norm and head together, :data:`LENS_ROWS` rows at a time (one larger
        matrix product instead of one per layer), and each row is normalized in float64 by its log-sum-exp
        (:func:`log_normalizers`), the same normalizer as :func:`engines.hf.weights.readout_log_probs`'s, without
        writing out the rows x vocabulary log-probs only a few entries of which are read.
        """
        torch = require("torch", "hf")
        last = self.lens.n_blocks
        self.lens.check_last(self.kept[last], final)
        below = [layer for layer in self.lens.layers if layer != last]
        n = len(self.kept[last])
        per = max(1, LENS_ROWS // max(n, 1))  # layers per head call
        for lo in range(0, len(below), per):
            chunk = below[lo : lo + per]
            dev = self.lens.device  # a split model's layers live on several devices
            logits = self.lens.logits(torch.cat([self.kept[layer].to(dev) for layer in chunk]))
            lse = log_normalizers(logits)
            r = torch.tensor(rows, device=logits.device)
            t = torch.tensor(toks, device=logits.device)
            for k, layer in enumerate(chunk):
                at = r + k * n
                yield layer, (logits[at, t].double() - lse[at]).tolist()
        if last in self.lens.layers:
            yield last, final[torch.tensor(rows, device=final.device), torch.tensor(toks, device=final.device)].tolist()


def log_normalizers(logits: Any, rows: int = READOUT_ROWS) -> Any:
    """The float64 log-sum-exp of each row of ``logits`` (rows x vocabulary), ``rows`` rows at a time: the
    normalizer :func:`engines.hf.weights.readout_log_probs` subtracts, so ``logits[r, t] - lse[r]`` is its log-prob
    of token t, without the rows x vocabulary float64 output a log-softmax writes.

    float64 for the reason the final readout's is (its docstring): a float32 sum over the vocabulary moves the
    normalizer by up to 1e-6 nats here, which the trie's ``log1p(-cont)`` multiplies by ``cont / (1 - cont)``. On a
    CPU it costs about as much as the head (measured on smol: a float32 log-sum-exp is 3x faster), the price of
    exact layers.
    """
    torch = require("torch", "hf")
    out = torch.empty(logits.shape[0], dtype=torch.float64, device=logits.device)
    for lo in range(0, logits.shape[0], rows):
        out[lo : lo + rows] = torch.logsumexp(logits[lo : lo + rows].double(), dim=-1)
    return out


class Lens:
    """The logit lens of one engine: the layers its spec resolves to on the model, hooks that keep the read rows
    (:meth:`capture`), and the final norm and head applied to them (:meth:`logits`)."""

    def __init__(self, spec: LayerSpec, module: Any, head_dtype: str, model_name: str) -> None:
        self.module = module
        self.blocks, self.norm = decoder_parts(module)
        self.n_blocks = len(self.blocks)
        self.layers = spec.resolve(self.n_blocks)
        self.head_dtype = head_dtype
        self.model_name = model_name

    @property
    def device(self) -> Any:
        """Where the final norm lives (where the kept rows go before it)."""
        return next(self.norm.parameters()).device

    def logits(self, hidden: Any) -> Any:
        """float32 logits of the residual-stream rows ``hidden`` (rows x hidden): the final norm on its device,
        then the head (:func:`head_logits`)."""
        return head_logits(self.module, self.norm(hidden.to(self.device)))

    def check_last(self, hidden: Any, final: Any) -> None:
        """Refuse a lens that does not recompute the final readout's log-probs ``final`` from the last block's
        output ``hidden``: a model whose head or norm this module does not reproduce."""
        lens = readout_log_probs(self.logits(hidden))
        diff = float((lens - final).abs().max())
        scale = 1.0 + float(final.abs().max())
        tol = LAST_LAYER_TOLERANCE["float32" if self.head_dtype == "float32" else "model"]
        if not diff <= tol * scale:
            raise ModelError(
                f"--layers on {self.model_name!r}: the final norm and head applied to the last block's output give "
                f"log-probs {diff:.3g} nats from the model's own (tolerance {tol * scale:.3g}), so this model's head "
                f"does more than {type(self.norm).__name__} then {type(self.module).__name__}'s head; run it without "
                "--layers"
            )

    @contextmanager
    def capture(self, pick: Callable[[Any], Any]) -> Iterator[Taps]:
        """Hooks on the blocks for one forward: each layer read (and the last, for :meth:`Taps.log_probs`'s check)
        keeps ``pick(hidden)``, the read rows of its residual stream (rows x hidden), copied."""
        taps = Taps(self)
        wanted = {*self.layers, self.n_blocks}
        handles = []

        def keep(layer: int, hidden: Any) -> None:
            taps.kept[layer] = pick(hidden).clone()

        if 0 in wanted:

            def entering(_: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
                keep(0, args[0] if args else kwargs["hidden_states"])

            handles.append(self.blocks[0].register_forward_pre_hook(entering, with_kwargs=True))
        for i, block in enumerate(self.blocks):
            if i + 1 in wanted:

                def after(_: Any, __: Any, out: Any, layer: int = i + 1) -> None:
                    keep(layer, out[0] if isinstance(out, tuple) else out)

                handles.append(block.register_forward_hook(after))
        try:
            yield taps
        finally:
            for h in handles:
                h.remove()


def last_rows(hidden: Any) -> Any:
    """Each row's last position (a forward over left-padded rows or a decoding step): rows x hidden."""
    return hidden[:, -1]


def tree_rows(keep: Sequence[int]) -> Callable[[Any], Any]:
    """The kept nodes of a packed token tree (one row of nodes): len(keep) x hidden."""
    torch = require("torch", "hf")
    idx = torch.tensor(list(keep))

    def pick(hidden: Any) -> Any:
        return hidden[0, idx.to(hidden.device)]

    return pick
