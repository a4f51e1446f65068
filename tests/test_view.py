"""probe view and probe show (issue 29): the server in-process, over real HTTP on 127.0.0.1.

Status codes and JSON shapes, filters and paging, a 404 for an unknown trial,
a clear error for a folder that is not a run, paths outside the run folders
refused, no secret or environment variable shown, a damaged chunk shown as
damaged; report rows linked to their trials; two runs side by side; the
terminal view; and the exact prompt of a tiny-model run (the tokenizer's
decode of the rendered ids, as many tokens as the readout stored).
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probe.app.cli import main
from probe.app.prompts import Renderer, messages_text
from probe.app.redact import redact
from probe.app.view import Viewer
from probe.app.viewserver import make_server
from probe.runs import NotARunError, open_run
from probe.store import RunStore
from tests.view_runs import ITEMS, index_cache, sim_run  # noqa: F401 (index_cache: autouse fixture)

SECRET = "sk-test-abcdefghijklmnopqrstuvwxyz0123"
ENV_SECRET = "env-secret-value-0123456789"


@pytest.fixture(scope="module")
def run_a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sim run with its report, a secret planted in the manifest, and a damaged copy beside it."""
    out = sim_run(tmp_path_factory.mktemp("view") / "sim-a", samples=2)
    store = RunStore(out)
    engine = store.manifest()["engine"]
    store.update_manifest(
        {"engine": {**engine, "settings": {**engine["settings"], "api_key": SECRET}, "note": f"key {SECRET}"}}
    )
    return out


@pytest.fixture(scope="module")
def run_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sim_run(tmp_path_factory.mktemp("view") / "sim-b", "--sim-seed", "7", "--no-report", samples=2)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory, run_b: Path) -> Path:
    out = tmp_path_factory.mktemp("view") / "damaged"
    shutil.copytree(run_b, out)
    RunStore(out).table_path(2, "samples").write_bytes(b"not parquet")
    return out


@pytest.fixture(scope="module")
def server(run_a: Path, run_b: Path, damaged: Path) -> Iterator[tuple[str, int]]:
    viewer = Viewer.open([run_a, run_b, damaged])
    srv = make_server(viewer, 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[:2]  # type: ignore[misc]
    srv.shutdown()
    srv.server_close()


def get(server: tuple[str, int], path: str) -> tuple[int, str, str]:
    """(status, content type, body) of GET ``path`` sent as given (no client-side normalization)."""
    conn = http.client.HTTPConnection(*server, timeout=30)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read().decode()
    conn.close()
    return resp.status, resp.getheader("Content-Type") or "", body


def get_json(server: tuple[str, int], path: str, status: int = 200) -> Any:
    code, ctype, body = get(server, path)
    assert code == status, body
    assert ctype.startswith("application/json")
    return json.loads(body)


def test_binds_127_0_0_1_only(server: tuple[str, int]) -> None:
    assert server[0] == "127.0.0.1"


def test_pages_answer(server: tuple[str, int]) -> None:
    assert get(server, "/")[0] == 200  # several runs: the list (one run redirects to it)
    for path in ("/r/0/", "/r/0/trials", "/r/1/trials?item=pond_child", "/static/view.js", "/static/view.css"):
        status, _, body = get(server, path)
        assert status == 200, (path, body[:300])
    assert "cdn" not in get(server, "/r/0/")[2].lower()
    assert get(server, "/r/9/")[0] == 404
    assert get(server, "/nowhere")[0] == 404


def test_run_json(server: tuple[str, int], run_a: Path) -> None:
    runs = get_json(server, "/api/runs")["runs"]
    assert [r["name"] for r in runs] == ["sim-a", "sim-b", "damaged"]
    info = get_json(server, "/api/r/0/run")
    assert info["experiment"] == "yesno" and info["n_trials"] == 24 and info["integrity"]["complete"]
    assert (
        "summary" in info["report"]
        and info["report"]["tables"]
        and info["report"]["figures"] == sorted(p.name for p in (run_a / "report").glob("*.png"))
    )
    levels = get_json(server, "/api/r/0/levels")
    assert levels["levels"]["item"] == ITEMS.split(",") and levels["factors"] == ["form", "labels", "order", "verb"]


def test_trials_json_filters_and_pages(server: tuple[str, int], run_a: Path) -> None:
    run = open_run(run_a)
    page = get_json(server, "/api/r/0/trials?limit=5&offset=5")
    assert page["total"] == 24 and page["offset"] == 5 and [r["position"] for r in page["rows"]] == [5, 6, 7, 8, 9]
    assert set(page["rows"][0]) == {"trial_id", "position", "chunk", "chunk_status", "item_id", "factors",
                                    "greedy_option", "greedy_meaning", "greedy_prob", "coverage", "n_samples", "statuses"}  # fmt: skip
    one = get_json(server, "/api/r/0/trials?item=pond_child&order=no_first&verb=oppose")
    want = run.trials[
        (run.trials.item_id == "pond_child") & (run.trials.order == "no_first") & (run.trials.verb == "oppose")
    ]
    assert [r["trial_id"] for r in one["rows"]] == list(want.trial_id) and one["total"] == 3
    assert one["filter"] == [["item", "pond_child"], ["order", "no_first"], ["verb", "oppose"]]
    refused = get_json(server, "/api/r/0/trials?status=refusal&limit=500")
    assert {r["trial_id"] for r in refused["rows"]} == set(run.samples.trial_id[run.samples.status == "refusal"])


def test_unknown_filter_value_is_a_clear_400(server: tuple[str, int]) -> None:
    err = get_json(server, "/api/r/0/trials?order=sideways", 400)
    assert "unknown value 'sideways' of factor 'order'" in err["error"] and "no_first, yes_first" in err["error"]
    status, _, body = get(server, "/r/0/trials?item=atlantis")
    assert status == 400 and "unknown item &#39;atlantis&#39;" in body and 'id="filters"' in body
    assert get_json(server, "/api/r/0/trials?offset=x", 400)["error"] == "offset must be a whole number, got 'x'"


def test_trial_json_and_404(server: tuple[str, int], run_a: Path) -> None:
    run = open_run(run_a)
    tid = str(run.trials.trial_id[3])
    doc = get_json(server, f"/api/r/0/trial/{tid}")
    view = doc["trial"]
    assert view["trial_id"] == tid and view["chunk"]["status"] == "verified"
    trial = run.trial(tid)
    assert view["prompt"]["text"] == messages_text(trial, None) and not view["prompt"]["exact"]
    stored = run.options[run.options.trial_id == tid]
    assert [o["prob"] for o in view["options"]] == list(stored.prob) and [o["option"] for o in view["options"]] == list(
        trial.options
    )
    assert len(view["samples"]) == 2 and {s["status"] for s in view["samples"]} <= {"ok", "refusal", "invalid"}
    others = doc["others"]
    assert [o["run"] for o in others] == ["sim-b", "damaged"] and others[0]["trial_id"] == tid  # unsalted: same id
    err = get_json(server, "/api/r/0/trial/0123456789abcdef", 404)
    assert err["error"] == "run sim-a has no trial '0123456789abcdef'"
    status, _, body = get(server, "/r/0/trial/0123456789abcdef")
    assert status == 404 and "has no trial" in body


@pytest.mark.parametrize(
    "path",
    [
        "/r/0/report/../manifest.json",
        "/r/0/report/%2e%2e/manifest.json",
        "/r/0/report/..%2fmanifest.json",
        "/r/0/report//etc/passwd",
        "/r/0/report/%2fetc%2fpasswd",
        "/static/../view.py",
        "/static/%2e%2e%2fview.py",
        "/r/0/../../etc/passwd",
        "//etc/passwd",
        "/r/0/report/.hidden",
        "/r/0/report/..\\manifest.json",
    ],
)
def test_paths_outside_the_run_folders_are_refused(server: tuple[str, int], path: str) -> None:
    status, _, body = get(server, path)
    assert status in (403, 404), (path, status)
    assert "run_key" not in body and "root:" not in body and "import" not in body


def test_report_files_are_served_and_rows_link_to_their_trials(server: tuple[str, int], run_a: Path) -> None:
    status, _, body = get(server, "/r/0/report/summary.md")
    assert status == 200 and body == (run_a / "report" / "summary.md").read_text()
    run_page = get(server, "/r/0/")[2]
    assert 'id="summary"' in run_page and "<h1>yes/no battery: sim</h1>" in run_page
    status, _, body = get(server, "/r/0/table/yesno_by_item.csv")
    assert status == 200
    links = set(re.findall(r'href="(/r/0/trials\?[^"]+)"', body))
    assert {"/r/0/trials?item=mine_cart_bridge", "/r/0/trials?item=pond_child"} <= links
    assert "/r/0/trials?item=pond_child" in run_page  # the summary's item rows link too
    page = get_json(server, "/api/r/0/trials?item=pond_child")
    assert page["total"] == 12 and {r["item_id"] for r in page["rows"]} == {"pond_child"}


def test_no_secret_and_no_environment_variable_is_shown(
    server: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROBE_TEST_API_KEY", ENV_SECRET)
    pages = ["/r/0/", "/api/r/0/run", "/api/runs", "/r/0/trials", "/api/r/0/trials"]
    for path in pages:
        body = get(server, path)[2]
        assert SECRET not in body and ENV_SECRET not in body, path
        assert "PROBE_TEST_API_KEY" not in body and "PATH=" not in body
    manifest = get_json(server, "/api/r/0/run")["manifest"]
    assert manifest["engine"]["settings"]["api_key"] == "[redacted]"
    assert manifest["engine"]["note"] == "key [redacted]" and manifest["run_key"]  # the run key is no secret
    assert redact({"x": f"a {ENV_SECRET} b", "max_tokens": 5}, {ENV_SECRET}) == {"x": "a [redacted] b", "max_tokens": 5}


def test_a_damaged_chunk_is_shown_as_damaged(server: tuple[str, int], damaged: Path) -> None:
    info = get_json(server, "/api/r/2/run")
    assert not info["integrity"]["complete"]
    assert [d["chunk"] for d in info["integrity"]["damaged"]] == [2]
    body = get(server, "/r/2/")[2]
    assert "Damaged chunks" in body and "chunk 2 (trials 16-23)" in body and "samples.parquet" in body
    page = get_json(server, "/api/r/2/trials?chunk=damaged")
    assert page["total"] == 8 and {r["chunk_status"] for r in page["rows"]} == {"damaged"}
    tid = page["rows"][0]["trial_id"]
    status, _, trial_page = get(server, f"/r/2/trial/{tid}")
    assert status == 200 and 'id="chunk-status"' in trial_page and "damaged" in trial_page
    assert get_json(server, f"/api/r/2/trial/{tid}")["trial"]["readout"] is None


def test_a_folder_that_is_not_a_run_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(NotARunError, match="is not a run folder"):
        Viewer.open([tmp_path])
    assert main(["view", str(tmp_path / "nope")]) == 2
    assert f"probe view: error: {tmp_path / 'nope'} does not exist" in capsys.readouterr().err


def test_probe_show_prints_the_trial_view(run_a: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = open_run(run_a)
    tid = str(run.trials.trial_id[0])
    assert main(["show", str(run_a), tid]) == 0
    out = capsys.readouterr().out
    trial = run.trial(tid)
    assert trial.messages[-1].content in out
    for row in run.options[run.options.trial_id == tid].itertuples():
        assert f"{row.prob:8.4f}" in out and f"{row.logprob:10.4f}" in out
    assert main(["show", str(run_a), "--item", "pond_child", "--where", "order=yes_first", "--limit", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"6 trial(s) of {run_a} match item=pond_child and order=yes_first (the first 2")
    assert out.count("--- prompt") == 2
    assert main(["show", str(run_a), "--where", "order=sideways"]) == 2
    assert "unknown value 'sideways' of factor 'order'" in capsys.readouterr().err
    assert main(["show", str(run_a), "--where", "order"]) == 2
    assert "--where needs KEY=VALUE" in capsys.readouterr().err
    assert main(["show", str(run_a), "nope"]) == 2
    assert "has no trial 'nope'" in capsys.readouterr().err


def test_the_prompt_of_a_tiny_run_is_the_exact_rendering(tmp_path: Path) -> None:
    """On the tiny model: the shown prompt is the decode of render_ids (the chat template applied), exactly as
    long as the readout stored, and the option ids are the tokenizer's."""
    from engines.render import option_ids, render_ids

    out = tmp_path / "tiny"
    args = ["run", "yesno", "--model", "tiny", "--items", "pond_child", "--forms", "acceptable", "--salts", "2",
            "--out", str(out), "--quiet", "--no-report"]  # fmt: skip
    assert main(args) == 0
    run = open_run(out)
    renderer = Renderer(run.manifest)
    tok = renderer.tokenizer()
    assert tok is not None
    salted = 0
    for row in run.readouts.itertuples():
        trial = run.trial(row.trial_id)
        shown = renderer.render(trial, row.prompt_tokens)
        ids = render_ids(tok, trial, think=False)
        assert shown.exact and shown.text == tok.decode(list(ids), skip_special_tokens=False)
        assert shown.n_tokens == row.prompt_tokens == len(ids)
        assert trial.salt in shown.text and "<|im_start|>assistant" in shown.text
        salted += bool(trial.salt)
        assert shown.option_ids == option_ids(tok, trial)
        stored = run.options[run.options.trial_id == row.trial_id]
        assert [len(i) for i in shown.option_ids] == list(stored.n_tokens)
        assert "as stored in the readout" in shown.note
    assert salted == len(run.readouts) // 2  # replicate 0 is the unsalted context, replicate 1 carries a salt


def test_markdown_escapes_and_points_links_at_the_report() -> None:
    from probe.app import markdown

    link = lambda u: f"/r/0/report/{u}"  # noqa: E731
    html = markdown.render(
        "# T\n\n![fig](fig.png) [table](t.csv) [bad](javascript:alert(1)) <script>x</script> **b** `a<b`\n\n"
        "| dilemma | z |\n|---|---|\n| pond_child | 1 |\n| mean | 2 |\n\n- one\n- two\n\n> quoted",
        link=link,
        cell=lambda h, v: "/r/0/trials?item=pond_child" if (h, v) == ("dilemma", "pond_child") else None,
    )
    assert '<img src="/r/0/report/fig.png" alt="fig">' in html and '<a href="/r/0/report/t.csv">table</a>' in html
    assert "javascript" not in html and "<script>" not in html and "&lt;script&gt;" in html
    assert "<strong>b</strong>" in html and "<code>a&lt;b</code>" in html
    assert (
        '<a class="trials-link" href="/r/0/trials?item=pond_child">pond_child</a>' in html and "<td>mean</td>" in html
    )
    assert "<ul><li>one</li><li>two</li></ul>" in html and "<blockquote><p>quoted</p></blockquote>" in html
