"""Shared set-up of the notebook-API and viewer tests (tests/test_runs.py, tests/test_view.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probe import trial_index
from probe.app.cli import main

ITEMS = "mine_cart_bridge,pond_child"
PARAMS = "refusal: 0.3\ncoverage: 0.8\nT: 3.0\n"
"""Planted: 30 % of replies refuse, 80 % of the slot mass on the options, sampled answers far from greedy."""


@pytest.fixture(autouse=True)
def index_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trial indexes go to a temp folder, not ~/.cache/probe/view (autouse in every module that imports it)."""
    cache = tmp_path_factory.getbasetemp() / "view-cache"
    monkeypatch.setattr(trial_index, "cache_dir", lambda: cache)


def sim_run(out: Path, *extra: str, samples: int = 3) -> Path:
    """A small sampled yes/no run of the planted subject (``PARAMS``) on ``ITEMS``, in 8-trial chunks."""
    params = out.parent / f"{out.name}-params.yaml"
    params.write_text(PARAMS)
    args = ["run", "yesno", "--model", "sim", "--sim-params", str(params), "--items", ITEMS, "--samples", str(samples),
            "--chunk-size", "8", "--quiet", "--out", str(out), *extra]  # fmt: skip
    assert main(args) == 0
    return out


# ------------------------------------------------------------------ headless Chromium (browser tests)
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1600",
)


def _find(*names: str) -> str | None:
    import shutil

    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def chromium(*extra: str) -> Iterator[Any]:
    """A headless Chromium driven through Selenium (a fresh profile; ``extra`` flags added), for a fixture to
    yield; skips, saying why, where Selenium, Chromium or chromedriver is missing or Chromium cannot start."""
    import shutil
    import tempfile

    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium; it is in the [dev] extra)")
    binary = _find("chromium", "chromium-browser", "google-chrome")
    driver = _find("chromedriver")
    if binary is None or driver is None:
        missing = " and ".join(n for n, p in (("chromium", binary), ("chromedriver", driver)) if p is None)
        pytest.skip(f"no {missing} on PATH (apt-get install chromium chromium-driver, or make test-browser)")
    profile = tempfile.mkdtemp(prefix="probe-chromium-")
    options = webdriver.ChromeOptions()
    for flag in (*CHROMIUM_FLAGS, *extra, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.binary_location = binary
    try:
        drv = webdriver.Chrome(options=options, service=Service(driver))
    except Exception as e:  # WebDriverException and kin: a Chromium that cannot start here
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"Chromium ({binary}) could not start: {str(e).splitlines()[0]}")
    drv.set_page_load_timeout(60)
    yield drv
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)
