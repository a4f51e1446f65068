"""Files written whole or not at all, and their hashes: the run store's and every report's way to write.

Every file is written to a temporary name in its folder, flushed to disk and
renamed into place (atomic on POSIX), so a reader never sees half a file and
a kill leaves the old file or the new one.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from probe.errors import StoreError


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def parquet_bytes(frame: Any) -> bytes:
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return buf.getvalue()


def atomic_write_parquet(path: Path, frame: Any) -> None:
    atomic_write_bytes(path, parquet_bytes(frame))


def read_parquet_bytes(data: bytes) -> Any:
    """The DataFrame in the parquet file ``data``, parsed from a copy in Arrow's own memory.

    Parsed from a Python object instead (``io.BytesIO``, or ``bytes`` behind
    ``pa.BufferReader``), an Arrow worker thread may drop the last reference
    to it after the read has returned; when that happens while the
    interpreter exits, the thread cannot take the GIL and the process aborts
    (``terminate called without an active exception``, exit 134) with its
    work done. Measured on this project's pyarrow 26: 10 of 150 short
    processes reading four chunks through ``BytesIO`` aborted; none through
    this copy (docs/store.md).
    """
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    buf = pa.allocate_buffer(len(data))
    np.frombuffer(buf, dtype=np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
    return pd.read_parquet(pa.BufferReader(buf))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_yaml(path: Path, what: str, error: Callable[[str], Exception], fix: str) -> Any:
    """The parsed YAML at ``path``; a missing file or invalid YAML raises ``error`` naming ``what``, the path and ``fix``."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist; {fix}") from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a folder, not a file; {fix}") from None
    return parse_yaml(text, f"{what} {path}", error, fix)


def parse_yaml(data: str | bytes, name: str, error: Callable[[str], Exception], fix: str) -> Any:
    """``data`` parsed as YAML; invalid YAML raises ``error`` naming the file (``name``) and ``fix``.

    For a caller that keeps the bytes it parsed (e.g. to hash them); others use :func:`read_yaml`.
    """
    import yaml

    try:
        return yaml.safe_load(data)
    except yaml.YAMLError as e:  # one line: the problem and where (PyYAML's own text spans several)
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"{name} is not valid YAML ({problem}{where}); {fix}") from None


def build_once(dest: Path, is_complete: Callable[[Path], bool], build: Callable[[Path], None]) -> Path:
    """``dest``, built by ``build(dest)`` unless complete: once across processes, under a file lock.

    A cheap check on the hot path; builders are serialised by a lock beside
    ``dest``, and the one that gets it first clears crash leftovers (temporary
    ``.<name>.tmp-*`` siblings and an incomplete ``dest``) before building.
    """
    if is_complete(dest):
        return dest
    import shutil

    from filelock import FileLock  # a hard dependency of huggingface_hub

    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest.parent / f".{dest.name}.lock")):
        if not is_complete(dest):
            for tmp in dest.parent.glob(f".{dest.name}.tmp-*"):
                shutil.rmtree(tmp, ignore_errors=True)
            if dest.exists():
                shutil.rmtree(dest)
            build(dest)
    return dest


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


# ------------------------------------------------------------------ a run folder's files, read safely
class LinkError(StoreError):
    """A file or folder of a run folder is a symbolic link (refused: it could show a file from outside the run)."""


def link_problem(path: Path) -> str | None:
    """Why ``path`` may not be read as a run folder's file: a symbolic link, or not a regular file (a device or a
    pipe reads forever). None: a regular file, or nothing there (the caller says what is missing)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"{path.name} is a symbolic link (refused: a run folder's files must be the files themselves)"
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        return f"{path.name} is not a regular file"
    return None


def inside(root: Path, *parts: str) -> Path:
    """``root/parts``, checked: no part is ``..``, absolute or empty, and no file or folder below ``root`` on the
    way is a symbolic link (lstat), so the path lies inside ``root`` whatever the folder holds. :class:`LinkError`
    naming the link and the fix otherwise (a missing file is left to the caller)."""
    cur = Path(root)
    for part in parts:
        if part in ("", ".", "..") or "/" in part or "\x00" in part:
            raise LinkError(f"refused {part!r} under {root}: not a plain file name")
        cur = cur / part
        why = link_problem(cur)
        if why:
            raise LinkError(
                f"{cur}: {why}. A run folder read from elsewhere may point outside itself; replace the link "
                "with a copy of what it points to if you trust it"
            )
    return cur


def canonical_json(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


CHAT_TEMPLATE_FILES: tuple[str, ...] = ("chat_template.jinja", "chat_template.json")
"""Where a Transformers folder may keep its chat template, beside the ``chat_template`` key of tokenizer_config.json."""


def copy_without_chat_template(src: str | Path, dest: str | Path) -> Path:
    """Copy the model folder ``src`` to ``dest`` (created, must not exist) with its chat template removed: the
    state of a base checkpoint, which ``--frame auto`` reads in the plain frame. Weights are hard-linked where the
    file system allows it (copied otherwise); every other file is copied, tokenizer_config.json without its
    ``chat_template`` key."""
    src, dest = Path(src), Path(dest)
    dest.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if not f.is_file() or f.name in CHAT_TEMPLATE_FILES:
            continue
        out = dest / f.name
        if f.name == "tokenizer_config.json":
            cfg = json.loads(f.read_text())
            cfg.pop("chat_template", None)
            out.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        elif f.suffix in (".safetensors", ".bin"):
            try:
                os.link(f, out)
            except OSError:
                shutil.copy2(f, out)
        else:
            shutil.copy2(f, out)
    return dest
