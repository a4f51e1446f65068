"""The battery's figures as small functions: data in, a matplotlib figure out.

They only draw: the report names each in a :class:`analysis.common.report.Drawing`, and its writer
(:func:`analysis.common.report.write_files`) saves it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.figures import pyplot


def stance_bars(df: pd.DataFrame, value: str, err: str | None, title: str, xlabel: str) -> Any:
    """Horizontal bars of one value per item (sorted), with optional error bars."""
    plt = pyplot()
    d = df.sort_values(value)
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(d) + 1.2))
    xerr = d[err].to_numpy() if err and err in d else None
    ax.barh(range(len(d)), d[value].to_numpy(), xerr=xerr, color="#4c72b0", alpha=0.85, ecolor="#333333", capsize=2)
    ax.set_yticks(range(len(d)), [str(i) for i in d.index], fontsize=7)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlim(-1.05, 1.05)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def grouped_bars(df: pd.DataFrame, columns: Sequence[str], title: str, ylabel: str) -> Any:
    """Bars of several columns per row (e.g. order / lexical / apparent per item or per label pair)."""
    plt = pyplot()
    n, k = len(df), len(columns)
    width = 0.8 / max(k, 1)
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * n + 2), 3.6))
    x = np.arange(n)
    for i, c in enumerate(columns):
        ax.bar(x + (i - (k - 1) / 2) * width, df[c].to_numpy(dtype=float), width, label=c)
    ax.set_xticks(x, [str(i) for i in df.index], rotation=60, ha="right", fontsize=7)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def scatter_xy(
    x: np.ndarray,
    y: np.ndarray,
    title: str,
    xlabel: str,
    ylabel: str,
    diagonal: bool = True,
    curve: tuple[np.ndarray, np.ndarray] | None = None,
) -> Any:
    """Points (x, y), with the diagonal y = x and an optional curve."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.4, 4.2))
    ax.scatter(x, y, s=14, alpha=0.8)
    if diagonal:
        lo = float(np.nanmin([np.nanmin(x), np.nanmin(y)]))
        hi = float(np.nanmax([np.nanmax(x), np.nanmax(y)]))
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
    if curve is not None:
        ax.plot(curve[0], curve[1], color="#c44e52", lw=1.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def bowtie_ridge(sides: Mapping[str, pd.DataFrame], fits: pd.DataFrame) -> Any:
    """Per fitted channel: the bowtie (bias p+ - p- against the story stance z) and the ridge (bias against
    theta) with the fitted (s, m) curve over each."""
    from analysis.battery.channel_fit import predict

    plt = pyplot()
    fig, axes = plt.subplots(2, len(sides), figsize=(4 * len(sides), 7), squeeze=False)
    grid = np.linspace(-1, 1, 201)
    for j, (ch, d) in enumerate(sides.items()):
        s, m = float(fits.loc[ch, "s"]), float(fits.loc[ch, "m"])
        pp, pm = predict(grid, s, m)
        ax = axes[0][j]
        ax.scatter(d["z"], d["bias"], s=14)
        ax.plot(pp + pm - 1, pp - pm, color="#c44e52")
        ax.set(title=f"{ch}: bowtie (s={s:.2f}, m={m:+.2f})", xlabel="story stance z", ylabel="bias p+ - p-")
        ax = axes[1][j]
        ax.scatter(d["theta"], d["bias"], s=14)
        ax.plot(grid, pp - pm, color="#c44e52")
        ax.set(title=f"{ch}: ridge", xlabel="theta (I-1)", ylabel="bias p+ - p-")
    fig.tight_layout()
    return fig
