"""Model names -> local folders, and a fingerprint for the run manifest.

``tiny`` and ``tiny-hybrid`` are built locally on first use (never
downloaded). Anything else is a local folder or a Hugging Face id, which is
left to ``from_pretrained`` (it uses the hub cache, and downloads only where
the machine has network and ``HF_HUB_OFFLINE`` is unset).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path


class ModelError(ValueError):
    """A model spec that cannot be loaded; the message says why and what to do."""


@dataclass(frozen=True)
class ModelRef:
    spec: str
    """What the user asked for."""
    path: str
    """What ``from_pretrained`` receives: a local folder or a hub id."""
    local: bool


def resolve_model(spec: str) -> ModelRef:
    """Resolve a model spec without loading any weights."""
    from probe import tiny

    if not spec or not spec.strip():
        raise ModelError("empty model name; pass --model tiny, a local folder, or a Hugging Face id")
    if spec in tiny.TINY_NAMES:
        return ModelRef(spec, str(tiny.ensure_tiny(spec)), True)
    p = Path(spec).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise ModelError(f"model folder {p} has no config.json; point --model at a Hugging Face model folder")
        return ModelRef(spec, str(p.resolve()), True)
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelError(f"model path {spec!r} does not exist")
    return ModelRef(spec, spec, False)


def folder_fingerprint(path: str | Path) -> str:
    """A cheap identity of a model folder: its config plus weight file names and sizes.

    Hashing every weight byte of a 30B model would take minutes; names, sizes
    and the config catch every realistic swap. Tiny models are small enough to
    hash whole, which the tiny builder's fingerprinted folder name already does.
    """
    p = Path(path)
    h = hashlib.sha256()
    cfg = p / "config.json"
    if cfg.is_file():
        h.update(json.dumps(json.loads(cfg.read_text()), sort_keys=True).encode())
    for f in sorted(p.iterdir()):
        if f.suffix in (".safetensors", ".bin", ".json", ".model") and f.is_file():
            h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]
