"""Hostile run folders and hostile text (issue 37): what `probe view`, `probe show`, `probe check` and the store do
with a run folder someone else prepared.

Each finding of the issue is a case here, tried as an attacker would: a report file that carries script
(1), symbolic links out of the run folder (2), a foreign Host header (DNS rebinding, 3), terminal control codes
in a model's reply (4), a receipt whose ``file`` is a path (5), secrets that redaction missed (6); then invalid
JSON (7) and a ``trials.jsonl`` cut short or changed (8). Where the case is a page it is also opened in a real
headless Chromium (marker ``browser``; ``make test-browser``).
"""

from __future__ import annotations

import http.client
import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from probe.app.check import check_run
from probe.app.cli import main
from probe.app.redact import redact
from probe.app.view import Viewer, _json
from probe.app.viewserver import make_server
from probe.receipts import Receipt, TableReceipt
from probe.runs import NotARunError, open_run
from probe.store import RunStore
from probe.terminal import escape_controls
from tests.view_runs import chromium, index_cache, sim_run  # noqa: F401 (index_cache: autouse fixture)

SECRET = "top-secret-content-4f1c"
LEAK_JS = """
var x = new XMLHttpRequest();
x.open('GET', '/api/r/0/run', false);
x.send();
document.title = 'LEAKED ' + x.status;
"""
HOSTILE_REPLY = "yes \x1b[1A\x1b[2K fake line \x1b]0;owned\x07 \x1b]52;c;ZXZpbA==\x07 \x9b2J \r overwrite"


def strict_json(text: str) -> Any:
    """``text`` parsed as strict JSON (NaN, Infinity refused)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


# ------------------------------------------------------------------ run folders
@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sim_run(tmp_path_factory.mktemp("hostile") / "base", samples=2)


def _copy(base: Path, where: Path, name: str) -> Path:
    out = where / name
    shutil.copytree(base, out, symlinks=True)
    return out


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder outside every run, holding a secret."""
    d = tmp_path_factory.mktemp("outside")
    (d / "secret.txt").write_text(SECRET + "\n")
    (d / "summary.md").write_text(f"# {SECRET}\n")
    return d


@pytest.fixture(scope="module")
def scripted(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Finding 1: a report folder with an HTML page and the script it loads, an SVG with script, a summary link."""
    out = _copy(base, tmp_path_factory.mktemp("scripted"), "scripted")
    report = out / "report"
    (report / "leak.html").write_text('<html><head><script src="leak.js"></script></head><body>hi</body></html>')
    (report / "leak.js").write_text(LEAK_JS)
    (report / "leak.svg").write_text(
        '<svg xmlns="http://www.w3.org/2000/svg"><script href="leak.js"></script><circle r="5"/></svg>'
    )
    (report / "data.json").write_text('{"a": 1}')
    (report / "figure.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(32))
    with open(report / "summary.md", "a") as f:
        f.write("\nSee [the page](leak.html).\n")
    return out


@pytest.fixture(scope="module")
def linked(base: Path, outside: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Finding 2: report/summary.md and a report table are symbolic links to a secret outside the run."""
    out = _copy(base, tmp_path_factory.mktemp("linked"), "linked")
    (out / "report" / "summary.md").unlink()
    (out / "report" / "summary.md").symlink_to(outside / "secret.txt")
    (out / "report" / "stolen.csv").symlink_to(outside / "secret.txt")
    return out


@pytest.fixture(scope="module")
def linked_report(base: Path, outside: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Finding 2: the report folder itself is a symbolic link to a folder outside the run."""
    out = _copy(base, tmp_path_factory.mktemp("linked-report"), "linked-report")
    shutil.rmtree(out / "report")
    (out / "report").symlink_to(outside, target_is_directory=True)
    return out


@pytest.fixture(scope="module")
def server(scripted: Path, linked: Path, linked_report: Path) -> Iterator[tuple[str, int]]:
    srv = make_server(Viewer.open([scripted, linked, linked_report]), 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[:2]  # type: ignore[misc]
    srv.shutdown()
    srv.server_close()


def request(server: tuple[str, int], path: str, host: str | None = "default") -> tuple[int, dict[str, str], str]:
    """(status, headers with lower-case names, body) of GET ``path``, sent as given, with Host ``host`` (the
    server's own by default; None: no Host header)."""
    conn = http.client.HTTPConnection(*server, timeout=30)
    conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
    if host == "default":
        host = f"127.0.0.1:{server[1]}"
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read().decode("utf-8", errors="replace")
    headers = {k.lower(): v for k, v in resp.getheaders()}
    conn.close()
    return resp.status, headers, body


# ------------------------------------------------------------------ 1: report files carry no script
@pytest.mark.parametrize("name", ["leak.html", "leak.js", "leak.svg"])
def test_a_report_file_outside_the_allow_list_is_a_sandboxed_download(server: tuple[str, int], name: str) -> None:
    status, headers, _ = request(server, f"/r/0/report/{name}")
    assert status == 200
    assert headers["content-type"] == "application/octet-stream"
    assert headers["content-disposition"].startswith("attachment")
    assert "sandbox" in headers["content-security-policy"]


@pytest.mark.parametrize(
    ("name", "ctype"),
    [("summary.md", "text/plain"), ("yesno_by_item.csv", "text/plain"), ("data.json", "text/plain")],
)
def test_allowed_report_files_are_served_as_text_or_png(server: tuple[str, int], name: str, ctype: str) -> None:
    status, headers, _ = request(server, f"/r/0/report/{name}")
    assert status == 200 and headers["content-type"] == f"{ctype}; charset=utf-8"
    assert "sandbox" in headers["content-security-policy"] and "content-disposition" not in headers
    status, headers, _ = request(server, "/r/0/report/figure.png")
    assert status == 200 and headers["content-type"] == "image/png"


@pytest.mark.parametrize(
    "path", ["/", "/r/0/", "/r/0/trials", "/api/runs", "/static/view.css", "/r/0/report/summary.md", "/nowhere"]
)
def test_every_answer_forbids_framing_and_referrers(server: tuple[str, int], path: str) -> None:
    _, headers, _ = request(server, path)
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["referrer-policy"] == "no-referrer"
    assert headers["x-content-type-options"] == "nosniff"


# ------------------------------------------------------------------ 2: no file from outside the run
def test_a_symlinked_summary_or_table_is_not_shown(server: tuple[str, int]) -> None:
    for path in ("/r/1/", "/api/r/1/run", "/r/1/report/summary.md", "/r/1/report/stolen.csv", "/r/1/table/stolen.csv"):
        body = request(server, path)[2]
        assert SECRET not in body, path
    assert request(server, "/r/1/report/summary.md")[0] == 403
    assert request(server, "/r/1/table/stolen.csv")[0] == 403
    info = strict_json(request(server, "/api/r/1/run")[2])
    assert "stolen.csv" not in info["report"]["tables"] and not info["report"]["summary"]
    assert "symbolic link" in request(server, "/r/1/")[2]


def test_a_symlinked_report_folder_is_not_served(server: tuple[str, int]) -> None:
    for path in ("/r/2/", "/r/2/report/secret.txt", "/r/2/report/summary.md", "/api/r/2/run"):
        body = request(server, path)[2]
        assert SECRET not in body, path
    assert request(server, "/r/2/report/secret.txt")[0] == 403
    assert "symbolic link" in request(server, "/r/2/")[2]


def test_a_symlinked_chunk_file_is_damaged_for_the_store_check_and_viewer(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The link points at an exact copy outside the run, so its receipt's size and hash match: only lstat sees it."""
    run = _copy(base, tmp_path, "run")
    table = RunStore(run).table_path(1, "samples")
    moved = tmp_path / "elsewhere.parquet"
    shutil.move(table, moved)
    table.symlink_to(moved)
    integrity = RunStore(run).integrity()
    assert [c.chunk for c in integrity.damaged] == [1]
    assert "symbolic link" in integrity.damaged[0].reason
    lines, ok = check_run(run)
    assert not ok and any("symbolic link" in ln for ln in lines)
    with pytest.raises(Exception, match="incomplete"):
        RunStore(run).load("samples")


@pytest.mark.parametrize("name", ["manifest.json", "trials.jsonl", "results"])
def test_a_symlinked_manifest_trials_or_results_folder_is_refused(base: Path, tmp_path: Path, name: str) -> None:
    run = _copy(base, tmp_path, "run")
    moved = tmp_path / f"moved-{name}"
    shutil.move(run / name, moved)
    (run / name).symlink_to(moved, target_is_directory=moved.is_dir())
    with pytest.raises((NotARunError, Exception), match="symbolic link"):
        RunStore(run).integrity()
    with pytest.raises(Exception, match="symbolic link"):
        check_run(run)
    with pytest.raises(Exception, match="symbolic link"):
        open_run(run, allow_partial=True).integrity  # noqa: B018


# ------------------------------------------------------------------ 3: DNS rebinding
def test_a_foreign_host_header_is_misdirected(server: tuple[str, int]) -> None:
    port = server[1]
    for host in ("attacker.example", f"attacker.example:{port}", f"127.0.0.1:{port + 1}", "127.0.0.1", None):
        status, _, body = request(server, "/api/r/0/run", host=host)
        assert status == 421, host
        assert "run_key" not in body and "manifest" not in body
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}"):
        assert request(server, "/api/r/0/run", host=host)[0] == 200, host


# ------------------------------------------------------------------ 4: terminal control codes
def _plant_reply(run: Path, text: str) -> str:
    """Rewrite chunk 0 through the store's own writer (so its receipt verifies) with ``text`` as the first reply;
    the id of that reply's trial."""
    store = RunStore(run)
    state = store.integrity().chunks[0]
    frames = {n: pd.read_parquet(store.table_path(0, n)) for n in state.tables}
    frames["samples"].loc[0, "text"] = text
    store.write_chunk(0, frames)
    assert store.integrity().complete
    return str(frames["samples"].loc[0, "trial_id"])


def test_probe_show_escapes_control_characters_of_a_reply(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(base, tmp_path, "run")
    tid = _plant_reply(run, HOSTILE_REPLY)
    assert main(["show", str(run), tid]) == 0
    out = capsys.readouterr().out
    for raw in ("\x1b", "\x07", "\x9b", "\r"):
        assert raw not in out
    assert "\\x1b[1A\\x1b[2K fake line \\x1b]0;owned\\x07" in out and "\\x9b2J" in out
    assert main(["show", str(run), tid, "--json"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x9b" not in out
    assert strict_json(out)["samples"][0]["text"] == HOSTILE_REPLY  # the same value, written inert


def test_escape_controls_keeps_newline_and_tab_and_escapes_c0_del_c1() -> None:
    assert escape_controls("a\tb\nc") == "a\tb\nc"
    assert escape_controls("\x00\x1b[2K\x7f\x85\x9b\u00a0é") == "\\x00\\x1b[2K\\x7f\\x85\\x9b\u00a0é"


# ------------------------------------------------------------------ 5: a receipt's file is its own file name
def _forge_receipt(run: Path, k: int, table: str, file: str) -> None:
    """Rewrite chunk ``k``'s receipt so that ``table`` names ``file``, with a valid checksum (a forger can)."""
    store = RunStore(run)
    receipt = Receipt.parse(store.marker(k).read_text())
    target = (store.results_dir / file) if not file.startswith("/") else Path(file)
    size = target.stat().st_size if target.is_file() else 0
    tables = dict(receipt.tables)
    tables[table] = TableReceipt(file, size, tables[table].rows, tables[table].sha256)
    store.marker(k).write_text(Receipt(receipt.chunk, receipt.run_key, receipt.trials, tables).to_text())


@pytest.mark.parametrize("file", ["../manifest.json", "chunk-000001.samples.parquet", "/dev/zero"])
def test_a_receipt_naming_another_file_is_damaged(base: Path, tmp_path: Path, file: str) -> None:
    run = _copy(base, tmp_path, "run")
    _forge_receipt(run, 0, "samples", file)
    integrity = RunStore(run).integrity()
    assert [c.chunk for c in integrity.damaged] == [0]
    reason = integrity.damaged[0].reason
    assert "chunk-000000.samples.parquet" in reason and "bytes" not in reason, reason
    assert not check_run(run)[1]


# ------------------------------------------------------------------ 6: redaction
@pytest.mark.parametrize(
    "name", ["private_key", "aws_secret_access_key", "passphrase", "ssh_key", "api_keys", "pwd", "API_KEY", "hfToken"]
)
def test_fields_named_like_a_secret_are_redacted(name: str) -> None:
    assert redact({"engine": {name: "value-0123456789"}}, set()) == {"engine": {name: "[redacted]"}}


@pytest.mark.parametrize(
    "value",
    [
        "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789",
        "AKIA" + "IOSFODNN7EXAMPLE",
        "xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
        "sk-" + "proj-abcdefghijklmnop0123456789",
        "hf_" + "abcdefghijklmnopqrstuvwxyz012345",
        "glpat-" + "abcdefghij0123456789",
        "Bearer " + "abcdefghijklmnopqrstuvwxyz0123456789",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "https://user:hunter2@example.com/v1",
    ],
)
def test_values_shaped_like_a_secret_are_redacted(value: str) -> None:
    out = redact({"note": f"use {value} here"}, set())["note"]
    assert "[redacted]" in out and value not in out
    assert "hunter2" not in out and "eyJzdWIi" not in out


def test_redaction_keeps_what_is_no_secret() -> None:
    keep = {"run_key": "abc123", "max_tokens": 8, "prompt_tokens": 5, "model": "Qwen/Qwen3-8B", "keys": ["a", "b"],
            "tokenizer": "x", "note": "sk is short", "monkey": "banana", "path": "/home/u/runs/x",
            "eos_token_id": 2, "token_ids": [1, 2], "author": "me"}  # fmt: skip
    assert redact(keep, set()) == keep


# ------------------------------------------------------------------ 7: strict JSON
def test_json_answers_are_strict_with_nan_and_na_as_null() -> None:
    import numpy as np

    resp = _json({"a": float("nan"), "b": pd.NA, "c": np.float64("nan"), "d": [float("inf"), 1.5], "e": np.int64(3)})
    assert strict_json(resp.body.decode()) == {"a": None, "b": None, "c": None, "d": [None, 1.5], "e": 3}


def test_every_json_answer_parses_strictly(server: tuple[str, int]) -> None:
    for path in ("/api/runs", "/api/r/0/run", "/api/r/0/levels", "/api/r/0/trials?limit=500", "/api/r/1/run"):
        status, headers, body = request(server, path)
        assert status == 200 and headers["content-type"].startswith("application/json")
        strict_json(body)


# ------------------------------------------------------------------ 8: trials.jsonl cut short or changed
def test_a_trials_file_cut_at_a_line_boundary_is_seen(base: Path, tmp_path: Path) -> None:
    run = _copy(base, tmp_path, "run")
    lines = (run / "trials.jsonl").read_text().splitlines(keepends=True)
    (run / "trials.jsonl").write_text("".join(lines[:20]))
    integrity = RunStore(run).integrity()
    assert not integrity.complete
    assert "trials.jsonl holds 20 trials, the manifest says 24" in integrity.counts_line()
    lines_out, ok = check_run(run)
    assert not ok and any("trials.jsonl holds 20 trials" in ln for ln in lines_out)


def test_a_changed_trials_file_is_seen_and_an_old_manifest_still_works(base: Path, tmp_path: Path) -> None:
    run = _copy(base, tmp_path, "run")
    assert RunStore(run).manifest()["trials_sha256"]
    text = (run / "trials.jsonl").read_text()
    (run / "trials.jsonl").write_text(text.replace("pond", "pend", 1))
    integrity = RunStore(run).integrity()
    assert not integrity.complete and "trials.jsonl does not match the manifest's hash" in integrity.counts_line()
    assert not check_run(run)[1]
    old = _copy(base, tmp_path, "old")  # a run written before the manifest recorded the hash
    man = json.loads((old / "manifest.json").read_text())
    del man["trials_sha256"]
    (old / "manifest.json").write_text(json.dumps(man))
    assert RunStore(old).integrity().complete and check_run(old)[1]


# ------------------------------------------------------------------ in a real browser
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium("--host-resolver-rules=MAP rebind.test 127.0.0.1")


@pytest.mark.browser
def test_browser_runs_no_script_from_a_report(browser: Any, server: tuple[str, int]) -> None:
    from selenium.webdriver.common.by import By

    url = f"http://127.0.0.1:{server[1]}"
    browser.get(f"{url}/r/0/")
    links = [a for a in browser.find_elements(By.CSS_SELECTOR, "#summary a") if a.text == "the page"]
    assert links, "the summary's link to leak.html is on the page"
    for page in ("leak.html", "leak.svg"):
        browser.get(f"{url}/r/0/report/{page}")  # the load event has fired: a synchronous script has run by now
        assert "LEAKED" not in browser.title and "LEAKED" not in browser.page_source
    browser.get(f"{url}/r/0/")
    browser.find_element(By.LINK_TEXT, "the page").click()
    assert "LEAKED" not in browser.title


@pytest.mark.browser
def test_browser_shows_no_file_from_outside_the_run(browser: Any, server: tuple[str, int]) -> None:
    url = f"http://127.0.0.1:{server[1]}"
    for path in ("/r/1/", "/r/2/", "/r/2/report/secret.txt", "/r/1/report/summary.md", "/r/1/table/stolen.csv"):
        browser.get(url + path)
        assert SECRET not in browser.page_source, path


@pytest.mark.browser
def test_browser_under_a_rebound_name_reads_nothing(browser: Any, server: tuple[str, int]) -> None:
    browser.get(f"http://rebind.test:{server[1]}/api/r/0/run")
    source = browser.page_source
    assert "run_key" not in source and "yesno" not in source and "421" in source


# ------------------------------------------------------------------ robustness and use (items 9-13)
@pytest.mark.parametrize("port", ["70000", "-5", "http"])
def test_a_bad_port_is_one_line(port: str, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["view", str(base), "--port", port])
    assert e.value.code == 2 and "--port" in capsys.readouterr().err


def test_a_port_in_use_is_said_before_the_index_is_built(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from probe.app import view, viewserver

    def no_warm(self: Viewer, log: Any = print) -> None:
        raise AssertionError("the index was built before the port was taken")

    monkeypatch.setattr(view.Viewer, "warm", no_warm)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(viewserver.ServeError, match=r"cannot listen on 127\.0\.0\.1"):
            viewserver.serve([str(base)], int(taken.getsockname()[1]))


def test_a_run_being_written_says_so(base: Path, tmp_path: Path) -> None:
    from probe.lock import RunLock

    run = _copy(base, tmp_path, "run")
    (run / "results" / "chunk-000002.done").unlink()
    viewer = Viewer.open([run])
    page = viewer.handle("/r/0/").body.decode()
    assert "re-run its `probe run` command" in page and "Being written" not in page
    lock = RunLock(run)
    lock.acquire()
    try:
        page = viewer.handle("/r/0/").body.decode()
        assert 'id="writing"' in page and "Being written now" in page and "re-run its" not in page
        assert strict_json(viewer.handle("/api/r/0/run").body.decode())["writing"].startswith("pid ")
    finally:
        lock.release()


def test_a_bad_trials_line_names_the_file_and_line(base: Path, tmp_path: Path) -> None:
    from probe.errors import StoreError

    run = _copy(base, tmp_path, "run")
    lines = (run / "trials.jsonl").read_text().splitlines(keepends=True)
    lines[6] = lines[6][:50] + "\n"
    (run / "trials.jsonl").write_text("".join(lines))
    with pytest.raises(StoreError, match=r"trials\.jsonl, line 7: not valid JSON"):
        RunStore(run).trials()
    with pytest.raises(StoreError, match=r"trials\.jsonl, line 7: not valid JSON"):
        open_run(run).index()  # the viewer's trial index (Arrow cannot read the file; the line-by-line reader names it)
    (run / "manifest.json").write_text("{not json")
    with pytest.raises(StoreError, match=r"restore manifest\.json from a copy") as e:
        RunStore(run).manifest()
    assert "delete" not in str(e.value)


def test_a_damaged_run_warns_that_its_report_may_predate_the_damage(base: Path, tmp_path: Path) -> None:
    run = _copy(base, tmp_path, "run")
    RunStore(run).table_path(1, "samples").write_bytes(b"not parquet")
    page = Viewer.open([run]).handle("/r/0/").body.decode()
    assert 'id="report-stale"' in page
    assert 'id="report-stale"' not in Viewer.open([base]).handle("/r/0/").body.decode()


def test_pages_read_as_a_user_expects(base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from probe.app.view import _count_filter, _token_filter
    from probe.query import _natural

    assert _token_filter("<|im_end|>") == '"<|im_end|>"' and _token_filter("\n") == '"\\n"'
    assert _count_filter(1, "token") == "1 token" and _count_filter(2, "token") == "2 tokens"
    assert sorted(["10", "2", "1", "100", "Yes", "No"], key=_natural) == ["1", "2", "10", "100", "No", "Yes"]
    viewer = Viewer.open([base])
    trials = viewer.handle("/r/0/trials?limit=5").body.decode()
    assert trials.count('class="pager') == 2 and 'class="meaning">(' in trials
    assert '<div class="scroll">' in viewer.handle("/r/0/table/yesno_by_item.csv").body.decode()
    rows = strict_json(viewer.handle("/api/r/0/trials?limit=3").body.decode())["rows"]
    run = open_run(base)
    for r in rows:
        trial = run.trial(r["trial_id"])
        assert r["greedy_meaning"] == dict(zip(trial.options, trial.meaning, strict=True))[r["greedy_option"]]
    assert main(["show", str(base), rows[0]["trial_id"]]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(i for i, ln in enumerate(out) if ln.lstrip().startswith("option ") and "logprob" in ln)
    for word in ("prob", "logprob"):  # each number ends under the end of its header
        end = out[head].index(f" {word}") + 1 + len(word)
        for row in out[head + 1 : head + 3]:
            assert row[end - 1].isdigit() and row[end] == " ", (word, row)


def test_probe_show_keeps_the_prompts_trailing_newlines(base: Path) -> None:
    from probe.app.prompts import Renderer
    from probe.app.trialview import format_trial, trial_view

    run = open_run(base)
    view = trial_view(run, str(run.trials.trial_id[0]), Renderer(run.manifest))
    view["prompt"]["text"] = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # what a think-off template ends with
    assert "<think>\n\n</think>\n\n\n" in format_trial(view)  # both newlines kept, then the block's own line end


def test_a_manifest_cannot_make_the_viewer_run_code(tmp_path: Path) -> None:
    """A shared run's manifest naming trust_remote_code and a model folder with a tokenizer class in Python: the
    viewer shows the messages and never imports that code."""
    from probe.app.prompts import Renderer

    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "Evil", "auto_map": {"AutoTokenizer": ["evil.Evil", None]}})
    )
    marker = tmp_path / "ran"
    (model / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\nclass Evil: pass\n")
    manifest = {"engine": {"engine": "hf", "model_path": str(model), "settings": {"trust_remote_code": True}}}
    renderer = Renderer(manifest)
    assert renderer.tokenizer() is None and "trust_remote_code" in str(renderer._why)
    assert not marker.exists()


def test_probe_check_escapes_what_the_folder_holds(base: Path, tmp_path: Path) -> None:
    run = _copy(base, tmp_path, "run")
    (run / ".probe.lock").write_text(
        json.dumps({"pid": 1, "host": "elsewhere", "since": "now", "command": "probe run \x1b]52;c;ZXZpbA==\x07"})
    )
    lines, _ = check_run(run)
    assert not any("\x1b" in ln or "\x07" in ln for ln in lines)
    assert any("\\x1b]52;c;ZXZpbA==\\x07" in ln for ln in lines)
