"""probe view in a real browser (issue 29): headless Chromium driven through Selenium and chromedriver.

On a run of the tiny model: open the run page, filter the trial browser to one
item with the form, open a trial, and check that the prompt shown is the
rendering the model read (the tokenizer's decode of the chat-template ids)
and that the option probabilities shown are the stored ones. Screenshots of
the run page and the trial page are written under the test's temp folder.

Skips, saying why, where Selenium, Chromium or chromedriver is missing or
Chromium cannot start (``make test-browser`` installs Debian's ``chromium``
and ``chromium-driver``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probe import trial_index
from probe.app.cli import main
from probe.app.view import Viewer
from probe.app.viewserver import make_server
from probe.runs import open_run
from probe.store import RunStore
from tests.view_runs import chromium

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("browser") / "yesno-tiny"
    args = ["run", "yesno", "--model", "tiny", "--items", "pond_child,mine_cart_bridge", "--forms", "acceptable",
            "--samples", "2", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def url(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cache = tmp_path_factory.getbasetemp() / "view-cache-browser"
    saved = trial_index.cache_dir
    trial_index.cache_dir = lambda: cache  # type: ignore[assignment]
    srv = make_server(Viewer.open([tiny_run]), 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    trial_index.cache_dir = saved  # type: ignore[assignment]


def test_filter_open_a_trial_and_see_the_stored_prompt_and_probabilities(
    browser: Any, url: str, tiny_run: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from engines.render import render_ids

    wait = WebDriverWait(browser, 30)
    browser.get(f"{url}/")
    wait.until(lambda d: d.find_elements(By.ID, "integrity"))
    assert browser.find_element(By.TAG_NAME, "h1").text == "yesno-tiny"
    assert "8 of 8 verified" in browser.find_element(By.ID, "integrity").text
    assert browser.find_elements(By.CSS_SELECTOR, "#summary table")  # the report's tables are on the page
    browser.save_screenshot(str(tmp_path / "run.png"))

    browser.get(f"{url}/r/0/trials")
    assert browser.find_element(By.ID, "count").text.startswith("8 trial(s)")
    Select(browser.find_element(By.NAME, "item")).select_by_value("pond_child")  # the page submits the form
    wait.until(lambda d: "item=pond_child" in d.current_url)
    wait.until(lambda d: d.find_element(By.ID, "count").text.startswith("4 trial(s)"))
    items = [
        r.find_elements(By.TAG_NAME, "td")[2].text for r in browser.find_elements(By.CSS_SELECTOR, "#trials tbody tr")
    ]
    assert items == ["pond_child"] * 4
    browser.save_screenshot(str(tmp_path / "trials.png"))

    link = browser.find_elements(By.CSS_SELECTOR, "#trials a.trial-link")[1]
    trial_id = link.text
    link.click()
    wait.until(lambda d: d.find_elements(By.ID, "prompt"))
    browser.save_screenshot(str(tmp_path / "trial.png"))
    assert browser.find_element(By.ID, "trial-id").text == trial_id

    run = open_run(tiny_run)
    trial = run.trial(trial_id)
    assert trial.item_id == "pond_child"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run.manifest["engine"]["model_path"], local_files_only=True)
    exact = tok.decode(list(render_ids(tok, trial, think=False)), skip_special_tokens=False)
    shown = browser.find_element(By.ID, "prompt").get_attribute("textContent")
    assert shown == exact
    assert trial.messages[-1].content in shown and "<|im_start|>assistant" in shown

    stored = RunStore(tiny_run).load("readout_options")
    stored = stored[stored.trial_id == trial_id].set_index("option")
    rows = browser.find_elements(By.CSS_SELECTOR, "#options tbody tr")
    assert [r.get_attribute("data-option") for r in rows] == list(trial.options)
    for r in rows:
        cell = r.find_element(By.CSS_SELECTOR, "td.prob")
        want = float(stored.loc[r.get_attribute("data-option"), "prob"])
        assert float(cell.get_attribute("data-prob")) == want
        assert cell.text == f"{want:.4f}"
    replies = browser.find_elements(By.CSS_SELECTOR, ".reply")
    assert len(replies) == 2
    for name in ("run.png", "trials.png", "trial.png"):
        assert (tmp_path / name).stat().st_size > 10_000
