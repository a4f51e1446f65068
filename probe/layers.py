"""Which layers a layer-wise readout reads (``--layers``): the spec's text, parsed once, resolved on a model.

Layer numbering follows the hidden states Transformers returns (``output_hidden_states``): layer 0 is the
residual stream entering the first block (the embeddings, as the model scales them), layer l (1 <= l <= L, L the
model's blocks) is the residual stream after block l counted from 1, and layer L is the one the model's final
readout reads. So ``--layers 0`` reads the embeddings through the final norm and head, and the last layer of
``all`` equals the final readout (:mod:`engines.hf.lens`).

A spec is one of

- ``all``: 0, 1, ..., L;
- a list ``0,6,12``: those layers (each between 0 and L; sorted, each once);
- ``every:K``: 0, K, 2K, ... and L (the profile always ends at the final readout);
- ``last:K``: the last K layers, L-K+1 .. L.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("all", "list", "every", "last")

_FIX = "write all, a list of layers (0,6,12), every:K or last:K (K >= 1)"


@dataclass(frozen=True)
class LayerSpec:
    """A parsed ``--layers`` value: its kind, and the list (``list``) or the step K (``every``, ``last``)."""

    kind: str
    layers: tuple[int, ...] = ()
    """The layers of a ``list`` spec, sorted, each once."""
    k: int = 0
    """K of ``every:K`` and ``last:K``."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"layer spec kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def text(self) -> str:
        """The spec as ``--layers`` takes it, in its canonical form (what the run key records)."""
        if self.kind == "all":
            return "all"
        if self.kind == "list":
            return ",".join(str(n) for n in self.layers)
        return f"{self.kind}:{self.k}"

    def resolve(self, n_blocks: int) -> tuple[int, ...]:
        """The layers read on a model of ``n_blocks`` blocks (layers 0..n_blocks), ascending."""
        if n_blocks < 1:
            raise ValueError(f"a model needs at least one block for a layer-wise readout, got {n_blocks}")
        if self.kind == "all":
            return tuple(range(n_blocks + 1))
        if self.kind == "every":
            return tuple(sorted({*range(0, n_blocks + 1, self.k), n_blocks}))
        if self.kind == "last":
            return tuple(range(max(0, n_blocks - self.k + 1), n_blocks + 1))
        bad = [n for n in self.layers if n > n_blocks]
        if bad:
            raise ValueError(
                f"--layers {self.text}: layer {bad[0]} is past this model's last layer {n_blocks} "
                f"(layers run 0, the embeddings, to {n_blocks}, the final readout); use layers up to {n_blocks}, "
                f"or all, every:K, last:K"
            )
        return self.layers


def parse_layers(text: str) -> LayerSpec:
    """The :class:`LayerSpec` of a ``--layers`` value; an error names the bad value and how to write one."""
    raw = text.strip().lower()
    if raw == "all":
        return LayerSpec("all")
    if m := re.fullmatch(r"(every|last):(.*)", raw):
        kind, k = m.group(1), m.group(2).strip()
        if not re.fullmatch(r"\d+", k) or int(k) < 1:
            raise ValueError(f"--layers {text!r}: {kind}:K needs a whole number K >= 1, got {k!r}; {_FIX}")
        return LayerSpec(kind, k=int(k))
    parts = [p.strip() for p in raw.split(",")]
    bad = next((p for p in parts if not re.fullmatch(r"\d+", p)), None)
    if bad is not None:
        what = "an empty entry" if bad == "" else repr(bad)
        raise ValueError(f"--layers {text!r}: {what} is not a layer number (0 or more); {_FIX}")
    return LayerSpec("list", tuple(sorted({int(p) for p in parts})))
