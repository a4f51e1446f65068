"""The one figure helper: matplotlib's Agg backend selected once, every PNG written atomically.

A figure is drawn by a small function of its paper's report; it asks
:func:`pyplot` for the plotting module and hands the finished figure to
:func:`save_figure`, which renders it in memory and replaces the file in one
step, so a killed report never leaves a half-written PNG behind.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from probe.files import atomic_write_bytes


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display; safe on a headless cluster node)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, *, dpi: int) -> Path:
    """Write ``fig`` as a PNG at ``path`` (temp file in the same folder, then ``os.replace``) and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    pyplot().close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path
