"""Model names -> local folders, and a fingerprint for the run manifest.

``tiny`` and ``tiny-hybrid`` are built locally on first use (never
downloaded). ``smol`` (SmolLM2-135M-Instruct) and any ``.gguf`` file (or a
folder holding one) are converted once into the probe cache
(:mod:`probe.models.gguf`). Anything else is a local folder or a Hugging Face id,
which is left to ``from_pretrained`` (it uses the hub cache, and downloads
only where the machine has network and ``HF_HUB_OFFLINE`` is unset).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from probe.errors import ModelError
from probe.models import gguf


@dataclass(frozen=True)
class ModelRef:
    spec: str
    """What the user asked for."""
    path: str
    """What ``from_pretrained`` receives: a local folder or a hub id."""
    local: bool


def resolve_model(spec: str) -> ModelRef:
    """Resolve a model spec without loading any weights."""
    from probe import tiny  # imports torch: only when a tiny model is asked for

    if not spec or not spec.strip():
        raise ModelError("empty model name; pass --model tiny, smol, a local folder, a .gguf file or a Hugging Face id")
    if spec in tiny.TINY_NAMES:
        return ModelRef(spec, str(tiny.ensure_tiny(spec)), True)
    if spec == gguf.SMOL_NAME:
        return ModelRef(spec, str(gguf.ensure_smol()), True)
    p = Path(spec).expanduser()
    if p.exists():
        if p.is_dir() and (p / "config.json").is_file():
            return ModelRef(spec, str(p.resolve()), True)
        return ModelRef(spec, str(gguf.ensure_gguf_path(p)), True)  # a .gguf file, or a folder with one
    if spec.lower().endswith(".gguf"):
        raise ModelError(f"model file {spec!r} does not exist")
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
        if f.name == gguf.MARKER:  # a converted GGUF: its content hash, not the marker's (timing-dependent) size
            h.update(str(json.loads(f.read_text()).get("content_sha256")).encode())
        elif f.suffix in (".safetensors", ".bin", ".json", ".model") and f.is_file():
            h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]
