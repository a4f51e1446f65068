"""``probe serve`` and the API engine against ``transformers serve`` serving the real model, sampling for real.

The fast tests check the serving folder and the error path without a
server; the slow one starts ``probe serve smol`` (as the README says) and
samples through the OpenAI-compatible API engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
from scipy import stats

from tests.conftest import make_trial, readout_cells

LIE = "Is it acceptable to lie to protect a friend? Answer with Yes or No."


def test_served_names_and_the_serving_folder(tmp_path):
    from probe.app.serve import served_name, serving_folder
    from probe.models.gguf import SAMPLING

    assert served_name("smol") == "smol"
    assert served_name("/models/My Model/") == "My-Model"
    assert served_name("~/w/SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"
    with pytest.raises(ValueError, match="pass --name"):
        served_name("///")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "do_sample": False, "top_k": 50}))
    folder = serving_folder(model, tmp_path / "root", "m")
    assert folder == tmp_path / "root" / "m"
    assert (folder / "config.json").resolve() == (model / "config.json").resolve()
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen == {"eos_token_id": 2, **SAMPLING}
    assert serving_folder(model, tmp_path / "root", "m") == folder  # idempotent


def test_server_message_is_what_the_client_sees():
    from engines.api.providers import ApiRequestError, classify, server_message

    class APIStatusError(Exception):  # the SDKs' class name is what classify looks at
        def __init__(self, body: object) -> None:
            super().__init__("Error code: 400")
            self.status_code, self.body, self.response = 400, body, None

    pinned = APIStatusError({"detail": "Server is pinned to 'smol'; requested 'tiny'."})
    err = classify(pinned, None)
    assert isinstance(err, ApiRequestError)
    assert "Server is pinned to 'smol'; requested 'tiny'" in str(err) and "check the model name" in str(err)
    openai_style = APIStatusError({"error": {"message": "temperature is not supported", "code": "bad_param"}})
    assert server_message(openai_style) == "temperature is not supported"
    assert "--temperature" in str(classify(openai_style, None))
    assert server_message(APIStatusError(None)) == "Error code: 400"


def test_identical_draws_at_temperature_are_flagged():
    import pandas as pd

    from analysis.common.checks import repeated_draws

    same = pd.DataFrame({"trial_id": [f"t{i // 3}" for i in range(15)], "text": ["Yes"] * 15})
    rep = repeated_draws(same)
    assert (rep.n_trials, rep.n_identical) == (5, 5) and rep.suspicious(1.0) and not rep.suspicious(0.0)
    varied = same.assign(text=["Yes", "No", "Yes"] * 5)
    assert not repeated_draws(varied).suspicious(1.0)
    assert not repeated_draws(same.iloc[:12]).suspicious(1.0)  # 4 trials: a confident model may do that


@pytest.mark.slow
def test_api_engine_samples_for_real_from_probe_serve_smol(tmp_path, smol_engine):
    """`probe serve smol` as the README says; first-token frequencies at T = 1 against the readout (about 2 min)."""
    pytest.importorskip("openai")
    from engines.api.engine import ApiEngine
    from engines.api.providers import ApiRequestError
    from engines.api.settings import ApiSettings
    from tests.api_serve import free_port, stop_process, wait_until_serving

    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "probe.app.cli", "serve", "smol", "--port", str(port), "--root", str(tmp_path / "srv")]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_until_serving(url, "smol", proc, log, what="probe serve", timeout=240.0, poll=0.5)
        trial = make_trial(LIE, ["Yes", "No"])
        e = ApiEngine(
            ApiSettings(provider="openai-compatible", model="smol", base_url=url, max_new_tokens=1, concurrency=1)
        )
        n = 300
        samples = e.load().sample([trial], n=n, temperature=1.0)
        assert len({s.text for s in samples}) > 2, "every draw alike: the server is not sampling"
        r = smol_engine.readout([trial])[0]
        counts = np.array([sum(s.option == o for s in samples) for o in ("Yes", "No")] + [0])
        counts[2] = n - counts[:2].sum()
        p = readout_cells(r)
        res = stats.chisquare(counts, p * n)
        # Each draw sends its own seed (per trial and draw), so the counts are the same every run; for fresh
        # draws a correct server's p-value is uniform (smallest expected count ~ 100): false-failure rate 1e-6.
        assert res.pvalue > 1e-6, (counts, p * n)
        wrong = ApiEngine(
            ApiSettings(provider="openai-compatible", model="tiny", base_url=url, max_new_tokens=1, concurrency=1)
        )
        with pytest.raises(ApiRequestError, match=r"Server is pinned to 'smol'; requested 'tiny'.*model name"):
            wrong.load().sample([trial], n=1, temperature=1.0)
    finally:
        stop_process(proc, grace=10)
    with pytest.raises(OSError):  # probe serve became the server: stopping it stopped the server, none is left
        urllib.request.urlopen(f"{url}/models", timeout=2)
