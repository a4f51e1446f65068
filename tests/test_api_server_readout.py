"""Readouts through a server (:mod:`engines.server`) against a local fake of vLLM's ``/v1/completions``.

The fake (:mod:`tests.fake_completions`) computes from the same deterministic logit table as the in-process
vLLM engine's fake ``LLM``, so:

* every exact mode (``logprob_token_ids``, ``prompt_logprobs``) gives the brute-force readout, and the whole
  record (options, coverage, top non-option tokens, greedy option, think-mode reasoning) equals the in-process
  vLLM engine's on the same table;
* ``top_logprobs`` bounds what lies outside the top-k, never zero, and its coverage is a lower bound;
* a server that returns no, constant or zero log probabilities, or counts another prompt length, is refused
  with one line and exit status 2; a sampling-only server still samples (``--samples N``);
* a readout run stopped mid-way resumes from its journal without sending an answered request again.

The real vLLM server is in ``tests/test_vllm_serve_readout.py`` (``make test-vllm``).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from engines.server.engine import ServerEngine
from engines.server.replies import public_url
from engines.server.settings import ServerSettings
from tests.conftest import make_trial
from tests.fake_completions import Behaviour, FakeCompletions
from tests.test_vllm_engine import CASE_IDS, CASES, FakeLLM, brute_force, make_engine, tok  # noqa: F401

PROMPT = "Is water wet? Answer with Yes or No."


@pytest.fixture
def fake(tok):  # noqa: F811
    with FakeCompletions(FakeLLM(len(tok))) as server:
        yield server


def server_engine(url: str, tok, **kw) -> ServerEngine:  # noqa: F811
    from engines.api.retry import RetryPolicy

    s = ServerSettings(provider="openai-compatible", model="tiny", base_url=url, concurrency=4, **kw)
    return ServerEngine(s, tokenizer=tok, retry_policy=RetryPolicy(max_retries=0)).load()


def cli(capsys, *args: str) -> tuple[int, str, str]:
    from probe.app.cli import main

    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------ exact modes
@pytest.mark.parametrize("mode", ["token_ids", "prompt_logprobs"])
@pytest.mark.parametrize("user,options,prefix", CASES, ids=CASE_IDS)
def test_exact_modes_give_the_brute_force_readout(fake, tok, mode, user, options, prefix):  # noqa: F811
    e = server_engine(fake.v1, tok, readout_mode=mode)
    assert e.mode == mode and e.capabilities["exact"] and e.capabilities["version"] == "0.0-fake"
    trial = make_trial(user, options, prefix=prefix)
    r = e.readout([trial])[0]
    ref = brute_force(fake.llm, r.prompt_ids, [s.token_ids for s in r.scores])
    np.testing.assert_allclose([s.logprob for s in r.scores], ref, rtol=0, atol=1e-12)
    assert math.isclose(math.fsum(s.prob for s in r.scores), 1.0)


@pytest.mark.parametrize("mode", ["token_ids", "prompt_logprobs"])
@pytest.mark.parametrize("think", [False, True])
def test_the_whole_record_equals_the_in_process_vllm_engines(fake, tok, mode, think):  # noqa: F811
    """Same table, same rendering: options, coverage, top non-option tokens, greedy option and reasoning agree."""
    end = tok.convert_tokens_to_ids("</think>")
    close = (5, end) if think else None
    fake.behaviour.close_at = close
    local, _ = make_engine(tok, think=think, think_budget=12, close_at=close)
    e = server_engine(fake.v1, tok, readout_mode=mode, think=think, think_budget=12)
    trials = [make_trial(u, o, prefix=p, trial_id=f"t{i}") for i, (u, o, p) in enumerate(CASES)]
    want, got = local.readout(trials), e.readout(trials)
    for a, b in zip(got, want, strict=True):
        assert a.prompt_ids == b.prompt_ids and a.prompt_tokens == b.prompt_tokens
        assert [s.option for s in a.scores] == [s.option for s in b.scores]
        np.testing.assert_allclose([s.logprob for s in a.scores], [s.logprob for s in b.scores], rtol=0, atol=1e-12)
        assert abs(a.coverage - b.coverage) < 1e-12 and a.greedy_option == b.greedy_option
        assert [t for t, _ in a.top_other] == [t for t, _ in b.top_other]
        np.testing.assert_allclose([p for _, p in a.top_other], [p for _, p in b.top_other], rtol=0, atol=1e-12)
        assert (a.reasoning, a.reasoning_tokens, a.hit_budget) == (b.reasoning, b.reasoning_tokens, b.hit_budget)
    if think:
        assert all(r.reasoning_tokens == 6 and not r.hit_budget for r in got)  # closed by the scripted </think>


def test_top_logprobs_bounds_what_lies_outside_the_top_k(fake, tok):  # noqa: F811
    """Scale 0-100 with a top-3 cap: options outside the top-k get a finite bound, coverage is a lower bound."""
    user, options, _ = CASES[CASE_IDS.index("scale0-100")]
    trial = make_trial(user, options)
    exact = server_engine(fake.v1, tok, readout_mode="token_ids").readout([trial])[0]
    e = server_engine(fake.v1, tok, readout_mode="top_logprobs", top_logprobs=3)
    r = e.readout([trial])[0]
    assert e.capabilities["exact"] is False and e.readout_stats["bounded_options"] > 0
    assert all(math.isfinite(s.logprob) for s in r.scores)  # never zero probability
    assert r.coverage <= exact.coverage + 1e-12
    true = {s.option: s.logprob for s in exact.scores}
    leaves = [o for o in options if not any(p != o and p.startswith(o) for p in options)]
    for s in r.scores:
        if s.option in leaves:  # a leaf's missing conditional at its node's floor: an upper bound
            assert s.logprob >= true[s.option] - 1e-12, s.option
    # with a cap as large as the vocabulary, top_logprobs is exact too
    wide = server_engine(fake.v1, tok, readout_mode="top_logprobs", top_logprobs=len(tok)).readout([trial])[0]
    np.testing.assert_allclose([s.logprob for s in wide.scores], list(true.values()), rtol=0, atol=1e-12)


def test_top_logprobs_says_when_options_are_bounded(fake, tok):  # noqa: F811
    logs: list[str] = []
    e = server_engine(fake.v1, tok, readout_mode="top_logprobs", top_logprobs=3)
    e._log = logs.append
    user, options, _ = CASES[CASE_IDS.index("scale0-100")]
    e.readout([make_trial(user, options)])
    assert len(logs) == 1 and "outside the top-3 log probabilities" in logs[0] and "lower bound" in logs[0]


def test_auto_takes_the_first_mode_the_server_offers(tok):  # noqa: F811
    llm = FakeLLM(len(tok))
    for behaviour, mode in (
        (Behaviour(), "token_ids"),
        (Behaviour(token_ids=False), "prompt_logprobs"),
        (Behaviour(token_ids=False, prompt_logprobs=False), "top_logprobs"),
    ):
        with FakeCompletions(llm, behaviour) as server:
            e = server_engine(server.v1, tok)
            assert e.mode == mode, behaviour
            d = e.describe()
            assert d["server"]["mode"] == mode and d["tokenizer"]["source"] == "local copy"
            assert e.identity()["readout_mode"] == mode


# ----------------------------------------------------------------- refusals
REFUSALS = [
    (Behaviour(logprobs="none"), "does not return any log probabilities"),
    (Behaviour(token_prompts=False), "does not return any log probabilities"),
    (Behaviour(logprobs="constant"), "the same log probability for every token"),
    (Behaviour(logprobs="zero"), "returned 0.0 for every log probability"),
    (Behaviour(count_offset=1), "counted 28 prompt tokens for the canary prompt, but probe sent 27 token ids"),
]


@pytest.mark.parametrize("behaviour,message", REFUSALS, ids=["none", "text-only", "constant", "zero", "count"])
def test_a_server_without_real_log_probabilities_is_refused_in_one_line(tok, capsys, behaviour, message):  # noqa: F811
    with FakeCompletions(FakeLLM(len(tok)), behaviour) as server:
        args = ["--model", f"openai-compatible:tiny@{server.v1}", "--api-retries", "0"]
        rc, out, err = cli(capsys, "readout", *args, "--prompt", PROMPT, "--options", "Yes,No")
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("probe readout: error: ") and message in err, err


def test_a_wrong_prompt_count_on_any_request_stops_the_readout(fake, tok):  # noqa: F811
    from engines.server.replies import ServerRefused

    e = server_engine(fake.v1, tok)
    fake.behaviour.count_offset = 2  # after the canary: a server that changed under the run
    with pytest.raises(ServerRefused, match=r"counted \d+ prompt tokens for a readout request .* probe sent"):
        e.readout([make_trial(PROMPT, ["Yes", "No"])])


def test_a_sampling_only_server_still_samples(tok):  # noqa: F811
    """--samples N without --no-readout on a server with no log probabilities: the API engine, as before."""
    import argparse

    from engines import make_engine as build
    from engines.api.engine import ApiEngine
    from engines.server.replies import NoLogprobs
    from probe.errors import ModelError

    with FakeCompletions(FakeLLM(len(tok)), Behaviour(token_prompts=False)) as server:
        a = argparse.Namespace(model=f"openai-compatible:tiny@{server.v1}", no_readout=False, samples=2)
        e = build(a)
        assert type(e) is ApiEngine and not hasattr(e, "readout")
        with pytest.raises(NoLogprobs):
            build(argparse.Namespace(model=a.model, no_readout=False, samples=0))
        assert type(build(argparse.Namespace(model=a.model, no_readout=True, samples=2))) is ApiEngine
        assert not server.answered  # no canary for a sample-only run
    # a hosted model without a local tokenizer: sampling only, as before, with --samples; else refused in one line
    hosted = "openai-compatible:org/no-such-model@http://127.0.0.1:9/v1"
    assert type(build(argparse.Namespace(model=hosted, no_readout=False, samples=2))) is ApiEngine
    with pytest.raises(ModelError, match=r"cannot load a local tokenizer .* pass --tokenizer"):
        build(argparse.Namespace(model=hosted, no_readout=False, samples=0))


# --------------------------------------------------------------- the journal
def test_a_stopped_readout_run_resumes_without_resending(tok, tmp_path):  # noqa: F811
    """The server goes away after 10 readout answers; the re-run sends only what was not answered, and every
    readout request is answered exactly once over both sessions (counted by the server, keyed as the journal)."""
    from engines.server.journal import JOURNAL
    from engines.server.replies import body_key
    from experiments.yesno import YesNoSpec
    from probe.app.runner import run
    from probe.record import Plan
    from probe.store import RunStore

    spec = YesNoSpec(items=("mine_cart_bridge",))  # 12 trials: a token-id and a top-k request each
    out = tmp_path / "run"
    with FakeCompletions(FakeLLM(len(tok))) as server:
        server.behaviour.fail_after = 3 + 10  # the canary's three requests, then 10 readout requests
        with pytest.raises(Exception, match="500"):
            run("yesno", spec, server_engine(server.v1, tok), out, plan=Plan(), chunk_size=4, progress=False)
        journal = out / "results" / JOURNAL
        assert len(journal.read_text().splitlines()) == 10  # chunk 0 (8 requests) committed, 2 of chunk 1
        server.behaviour.fail_after = None
        e = server_engine(server.v1, tok)
        store = run("yesno", spec, e, out, plan=Plan(), chunk_size=4, progress=False)
        keys = [json.loads(x)["key"] for x in journal.read_text().splitlines()]
        answered = {body_key(b): server.answered[k] for k, b in server.bodies.items()}
        assert len(keys) == len(set(keys)) == 24 and all(answered[k] == 1 for k in keys)
        assert (e.readout_stats["requests"], e.readout_stats["resumed"]) == (14, 2)
        assert store.manifest()["engine_stats"]["readout"]["requests"] == 14
    with FakeCompletions(FakeLLM(len(tok))) as clean:
        ref = run("yesno", spec, server_engine(clean.v1, tok), tmp_path / "ref", plan=Plan(), progress=False)
    cols = ["trial_id", "option"]
    a = store.load("readout_options").sort_values(cols).reset_index(drop=True)
    b = RunStore(ref.root).load("readout_options").sort_values(cols).reset_index(drop=True)
    assert a.equals(b)


# ----------------------------------------------------------------- manifest
def test_the_manifest_keeps_the_url_without_credentials(tok):  # noqa: F811
    assert public_url("http://user:secret@host:8000/v1?key=abc#x") == "http://host:8000/v1"
    with FakeCompletions(FakeLLM(len(tok))) as server:
        url = server.v1.replace("http://", "http://user:secret@")
        e = server_engine(url, tok)
        text = json.dumps(e.describe()) + json.dumps(e.identity()) + json.dumps(e.run_stats())
    assert "secret" not in text and e.describe()["server"]["url"] == server.v1


def test_readout_json_has_the_local_engines_fields(fake, tok, capsys):  # noqa: F811
    args = ["--prompt", PROMPT, "--options", "Yes,No", "--json"]
    rc, out, _ = cli(capsys, "readout", "--model", f"openai-compatible:tiny@{fake.v1}", *args)
    assert rc == 0
    rc, local, _ = cli(capsys, "readout", "--model", "tiny", *args)
    assert rc == 0
    doc, ref = json.loads(out), json.loads(local)
    assert list(doc) == list(ref)
    assert doc["prompt_token_ids"] == ref["prompt_token_ids"]  # rendered here, as the local engine renders it
    assert [o["token_ids"] for o in doc["options"]] == [o["token_ids"] for o in ref["options"]]


def test_samples_go_through_the_readouts_own_prompt(fake, tok):  # noqa: F811
    """A draw is a /v1/completions request on the rendered ids, raw sampling, the draw's own seed."""
    e = server_engine(fake.v1, tok, max_new_tokens=4)
    trial = make_trial(PROMPT, ["Yes", "No"])
    samples = e.sample([trial], n=3, temperature=1.0)
    assert [s.replicate for s in samples] == [0, 1, 2]
    bodies = [b for b in fake.bodies.values() if b.get("seed") is not None]
    assert len(bodies) == 3 and len({b["seed"] for b in bodies}) == 3
    ids = e.readout([trial])[0].prompt_ids
    for b in bodies:
        assert b["prompt"] == list(ids) and (b["top_p"], b["top_k"], b["min_p"]) == (1.0, 0, 0.0)
        assert b["temperature"] == 1.0 and b["max_tokens"] == 4


def test_the_server_engine_is_chosen_by_the_verb(fake, tok):  # noqa: F811
    import argparse

    from engines import make_engine as build

    model = f"openai-compatible:tiny@{fake.v1}"
    assert build(argparse.Namespace(model=model, no_readout=False, samples=0)).name == "server"
    assert build(argparse.Namespace(model=model, no_readout=True, samples=2)).name == "api"
    assert build(argparse.Namespace(model=model)).name == "api"  # a verb that only samples (a judge, a coder)


def test_probe_serve_engine_vllm_command(tmp_path):
    """vLLM's server pinned to the name, float32 for a small model, raw logprobs, the model's sampling defaults off."""
    from probe.app.serve import vllm_command, vllm_dtype

    small = tmp_path / "m"
    small.mkdir()
    (small / "model.safetensors").write_bytes(b"\0" * 1024)
    assert vllm_dtype("auto", small) == "float32" and vllm_dtype("bfloat16", small) == "bfloat16"
    cmd = vllm_command("py", small, "m", "127.0.0.1", 8000, dtype="float32", max_logprobs=128, max_model_len=512)
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert flags["--served-model-name"] == "m" and flags["--dtype"] == "float32"
    assert flags["--max-logprobs"] == "128" and flags["--logprobs-mode"] == "raw_logprobs"
    assert flags["--generation-config"] == "vllm" and flags["--max-model-len"] == "512"


def test_probe_serve_engine_vllm_needs_vllm(capsys):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    rc, _, err = cli(capsys, "serve", "tiny", "--engine", "vllm")
    assert rc == 2 and "vLLM is not installed" in err and err.count("\n") == 1


def test_sampled_reasoning_goes_to_the_server_with_each_trials_seed(fake, tok):  # noqa: F811
    """--think-sampling reaches the server's think requests as the local engines use it: the settings, and a seed
    per trial (engines.base.reasoning_seed); greedy think requests carry none of it."""
    from engines.base import reasoning_seed

    trials = [make_trial(PROMPT, ["Yes", "No"], trial_id=f"t{i}") for i in range(3)]
    e = server_engine(fake.v1, tok, think=True, think_budget=6, think_temperature=0.6, think_top_p=0.95, think_top_k=20)
    e.readout(trials)
    think = [b for b in fake.bodies.values() if b["max_tokens"] == 6]
    assert {b["seed"] for b in think} == {reasoning_seed(0, t.trial_id) for t in trials}
    assert all((b["temperature"], b["top_p"], b["top_k"]) == (0.6, 0.95, 20) for b in think)
    assert e.identity()["think_sampling"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    greedy = server_engine(fake.v1, tok, think=True, think_budget=7)
    greedy.readout(trials)
    plain = [b for b in fake.bodies.values() if b["max_tokens"] == 7]
    assert plain and all(b["temperature"] == 0.0 and "seed" not in b for b in plain)
    assert "think_sampling" not in greedy.identity()


# ----------------------------------------------------------------- the plain frame
def test_the_plain_frame_reads_as_the_in_process_vllm_engine(fake, tok):  # noqa: F811
    """``--frame plain`` through a server: the ids rendered here in the plain frame, and the whole record equal to the
    in-process vLLM engine's in the plain frame on the same table (and to brute force)."""
    from engines.render import render_ids

    local, _ = make_engine(tok, frame="plain")
    e = server_engine(fake.v1, tok, readout_mode="token_ids", frame="plain")
    assert e.frame == local.frame == "plain" and e.identity()["frame"] == "plain"
    trials = [make_trial(u, o, prefix=p, trial_id=f"t{i}") for i, (u, o, p) in enumerate(CASES)]
    want, got = local.readout(trials), e.readout(trials)
    for t, a, b in zip(trials, got, want, strict=True):
        assert a.prompt_ids == b.prompt_ids == render_ids(tok, t, think=False, frame="plain")
        assert tok.decode(list(a.prompt_ids)).endswith(
            "\n\nAnswer:" + (" " + t.assistant_prefix if t.assistant_prefix else "")
        )
        np.testing.assert_allclose([s.logprob for s in a.scores], [s.logprob for s in b.scores], rtol=0, atol=1e-12)
        ref = brute_force(fake.llm, a.prompt_ids, [s.token_ids for s in a.scores])
        np.testing.assert_allclose([s.logprob for s in a.scores], ref, rtol=0, atol=1e-12)


def test_plain_frame_draws_through_a_server_are_cut_at_the_frames_stops(fake, tok):  # noqa: F811
    """Each draw's text is the plain cut (:func:`engines.render.plain_cut`) of what the server generated to its cap
    (regenerated here from the same seeded body: the fake's draws are deterministic)."""
    from engines.render import plain_cut

    e = server_engine(fake.v1, tok, max_new_tokens=16, frame="plain")
    trial = make_trial(PROMPT, ["Yes", "No"])
    samples = e.sample([trial], n=12, temperature=1.5)
    bodies = sorted((b for b in fake.bodies.values() if b.get("seed") is not None), key=lambda b: b["seed"])
    by_seed = {b["seed"]: b for b in bodies}
    stops = e._stop_ids()
    from engines.base import draw_seed

    for s in samples:
        body = by_seed[draw_seed(0, trial.trial_id, s.replicate)]
        gen = fake._reply(tuple(body["prompt"]), body)["choices"][0]["token_ids"]
        cut = plain_cut(
            lambda ids: tok.decode(list(ids), skip_special_tokens=False), [t for t in gen if t not in stops]
        )
        assert s.text == tok.decode(list(cut.ids), skip_special_tokens=False)
