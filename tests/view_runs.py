"""Shared set-up of the notebook-API and viewer tests (tests/test_runs.py, tests/test_view.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from probe import runs as runs_mod
from probe.app.cli import main

ITEMS = "mine_cart_bridge,pond_child"
PARAMS = "refusal: 0.3\ncoverage: 0.8\nT: 3.0\n"
"""Planted: 30 % of replies refuse, 80 % of the slot mass on the options, sampled answers far from greedy."""


@pytest.fixture(autouse=True)
def index_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trial indexes go to a temp folder, not ~/.cache/probe/view (autouse in every module that imports it)."""
    cache = tmp_path_factory.getbasetemp() / "view-cache"
    monkeypatch.setattr(runs_mod, "_cache_dir", lambda: cache)


def sim_run(out: Path, *extra: str, samples: int = 3) -> Path:
    """A small sampled yes/no run of the planted subject (``PARAMS``) on ``ITEMS``, in 8-trial chunks."""
    params = out.parent / f"{out.name}-params.yaml"
    params.write_text(PARAMS)
    args = ["run", "yesno", "--model", "sim", "--sim-params", str(params), "--items", ITEMS, "--samples", str(samples),
            "--chunk-size", "8", "--quiet", "--out", str(out), *extra]  # fmt: skip
    assert main(args) == 0
    return out
