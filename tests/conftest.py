"""Shared fixtures: the locally built tiny models, built once per machine.

The build cache defaults to ``<repo>/.cache/probe`` (git-ignored) so that
repeated test runs reuse the models; set ``PROBE_CACHE`` to put it elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("PROBE_CACHE", str(ROOT / ".cache" / "probe"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ARCHS = ("tiny", "tiny-hybrid")


@pytest.fixture(scope="session", params=ARCHS)
def engine(request: pytest.FixtureRequest):
    """A loaded Transformers engine on each tiny architecture."""
    from engines.hf import HFEngine, HFSettings

    return HFEngine(HFSettings(model=request.param, batch_size=16)).load()


@pytest.fixture(scope="session")
def tiny_engine():
    """The trained Qwen3-MoE tiny model (answers in format)."""
    from engines.hf import HFEngine, HFSettings

    return HFEngine(HFSettings(model="tiny")).load()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory):
    """``transformers serve`` on localhost serving the tiny model, started once for every API test of the session."""
    pytest.importorskip("openai", reason="the api extra is not installed (pip install -e '.[api]')")
    from tests.api_serve import start_server

    try:
        srv = start_server(tmp_path_factory.mktemp("serve"))
    except RuntimeError as e:
        pytest.fail(f"could not start transformers serve: {e}")
    yield srv
    srv.stop()


def make_trial(user: str, options, *, system: str | None = None, trial_id: str = "t", prefix: str = ""):
    from probe.types import Message, Trial

    msgs = ((Message("system", system),) if system else ()) + (Message("user", user),)
    options = tuple(options)
    return Trial(trial_id, "test", "item", {}, msgs, options, options, assistant_prefix=prefix)
