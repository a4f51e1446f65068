"""Engine conformance on both tiny architectures, against independent brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.conftest import cell_pvalues, first_token_draws, make_trial, readout_cells

YESNO = "You are on a bridge. Is it morally acceptable to push the man? Answer with Yes or No."
SCALE = "How acceptable is it? On a scale from 0 to 100, answer with a number only."
SCALE_OPTIONS = [str(i) for i in range(101)]
LETTERS = (
    "Tom found a key near the river.\nWhich is more likely?\nA. Tom went home\nB. Tom fell asleep\nAnswer with A or B."
)


def brute_force(engine, prompt_ids, options_ids) -> list[float]:
    """log P(option is the whole answer) from plain full-sequence forward passes.

    No cache, no padding, no trie: every sequence prompt + tokens is run whole
    (sequences of equal length share one forward, which needs no padding).
    P(o) is the chain rule over o's tokens, and an option that is a prefix of
    longer options loses the mass P(o + c) of each continuation token c.
    """
    model = engine.model
    wanted = {tuple(o) for o in options_ids}
    for o in options_ids:
        wanted |= {(*o, oo[len(o)]) for oo in options_ids if len(oo) > len(o) and tuple(oo[: len(o)]) == tuple(o)}
    seq_lp: dict[tuple[int, ...], float] = {}
    for length in sorted({len(w) for w in wanted}):
        group = sorted(w for w in wanted if len(w) == length)
        full = torch.tensor([list(prompt_ids) + list(w) for w in group])
        with torch.inference_mode():
            lp = torch.log_softmax(model(input_ids=full).logits.double(), dim=-1)
        start = len(prompt_ids) - 1
        for r, w in enumerate(group):
            seq_lp[w] = float(sum(lp[r, start + i, t] for i, t in enumerate(w)))
    out = []
    for o in options_ids:
        conts = {oo[len(o)] for oo in options_ids if len(oo) > len(o) and tuple(oo[: len(o)]) == tuple(o)}
        p_end = math.exp(seq_lp[tuple(o)]) - math.fsum(math.exp(seq_lp[(*o, c)]) for c in conts)
        out.append(math.log(p_end))
    return out


@pytest.mark.parametrize(
    "user,options",
    [(YESNO, ["Yes", "No"]), (LETTERS, ["A", "B", "C"]), (SCALE, SCALE_OPTIONS), (YESNO, ["Yes, it is", "No", "Yes"])],
    ids=["yesno", "letters", "scale0-100", "multiword-prefix"],
)
def test_logprobs_match_brute_force(engine, user, options):
    trial = make_trial(user, options)
    r = engine.readout([trial])[0]
    ref = brute_force(engine, r.prompt_ids, [s.token_ids for s in r.scores])
    got = [s.logprob for s in r.scores]
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    assert math.isclose(sum(s.prob for s in r.scores), 1.0, abs_tol=1e-9)
    assert r.coverage == pytest.approx(sum(math.exp(v) for v in ref), abs=1e-4)
    assert r.greedy_option == options[int(np.argmax(ref))]


def test_scale_digits_are_multi_token(engine):
    r = engine.readout([make_trial(SCALE, SCALE_OPTIONS)])[0]
    n = {s.option: len(s.token_ids) for s in r.scores}
    assert (n["7"], n["10"], n["100"]) == (1, 2, 3)
    assert r.computed_tokens > r.prompt_tokens  # the trie was expanded on the cache
    assert r.coverage <= 1.0 + 1e-9


def test_readout_log_probs_are_a_float64_log_softmax_row_chunk_by_row_chunk():
    from engines.hf.weights import readout_log_probs

    logits = (torch.randn(130, 3001, generator=torch.Generator().manual_seed(0)) * 8).float()
    got = readout_log_probs(logits, rows=64)  # chunks of 64, 64 and 2 rows
    assert got.dtype == torch.float64 and got.shape == logits.shape
    torch.testing.assert_close(got, torch.log_softmax(logits.double(), dim=-1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("path", ["tree", "branch", "plain"])
def test_readouts_read_float64_log_probs_and_draws_float32(engine, path, monkeypatch):
    """Every conditional a readout reads and its top other tokens come from a float64 log-softmax
    (:func:`engines.hf.readout_log_probs`: an option that prefixes longer ones multiplies the normalizer's rounding
    by cont / (1 - cont), 1.1e-4 nats on smol in float32); draws, the tree readout's kept prefill's included,
    sample from float32 log-probs as before, so no seeded draw moves. The run key records it."""
    from engines.hf import readout
    from engines.hf.sampling import RowSampler

    if path == "tree" and engine.lm.tree_unsupported():
        pytest.skip("the tree path needs full attention")
    seen: list[tuple[str, torch.dtype]] = []
    conditionals, top_other, draw = readout.conditionals, readout.Reader.top_other, RowSampler.draw

    def read(lp, asks, tries):
        seen.append(("conditionals", lp.dtype))
        return conditionals(lp, asks, tries)

    def others(self, roots, tries):
        seen.append(("top_other", roots.dtype))
        return top_other(self, roots, tries)

    def drawn(self, lp):
        seen.append(("draw", lp.dtype))
        return draw(self, lp)

    monkeypatch.setattr(readout, "conditionals", read)
    monkeypatch.setattr(readout.Reader, "top_other", others)
    monkeypatch.setattr(RowSampler, "draw", drawn)
    e = engine.variant(readout_path=path)
    trials = [make_trial(SCALE, SCALE_OPTIONS[:21], trial_id="s"), make_trial(YESNO, ["Yes", "No"], trial_id="y")]
    e.sample_next(trials)  # the tree path keeps its prefill (and float32 log-probs) for these draws
    e.readout(trials)
    e.sample(trials, 2, 1.0, max_new_tokens=3)
    assert {k for k, _ in seen} == {"conditionals", "top_other", "draw"}
    assert [(k, d) for k, d in seen if d != (torch.float32 if k == "draw" else torch.float64)] == []
    assert e.identity()["readout_softmax"] == "float64"


def _mixed_trials():
    stories = ["Short one.", "A much longer story " * 12, "Medium length story here " * 4]
    out = []
    for i in range(18):
        s = stories[i % 3]
        if i % 2:
            out.append(make_trial(f"{s} {SCALE}", SCALE_OPTIONS[:21], trial_id=f"t{i}"))
        else:
            out.append(make_trial(f"{s} {YESNO}", ["Yes", "No"], trial_id=f"t{i}"))
    return out


def test_batch_size_and_padding_invariance(engine):
    from engines.hf.engine import HFEngine

    trials = _mixed_trials()
    ref = None
    for bs in (1, 3, 16):
        e = HFEngine(
            engine.settings.__class__(**{**engine.settings.__dict__, "batch_size": bs}),
            model=engine.model,
            tokenizer=engine.tokenizer,
        ).load()
        got = np.array([[s.logprob for s in r.scores] + [r.coverage] for r in e.readout(trials)], dtype=object)
        flat = np.concatenate([np.asarray(g, dtype=float) for g in got])
        if ref is None:
            ref = flat
        else:
            np.testing.assert_allclose(flat, ref, atol=1e-5, rtol=0)
    # alone (no padding) vs in a batch with much longer prompts (heavy left padding)
    alone = engine.readout([trials[0]])[0]
    padded = engine.readout([trials[1], trials[0], trials[3]])[1]
    np.testing.assert_allclose([s.logprob for s in alone.scores], [s.logprob for s in padded.scores], atol=1e-5)


def test_results_come_back_in_input_order(engine):
    trials = _mixed_trials()
    rs = engine.readout(trials)
    assert [r.trial_id for r in rs] == [t.trial_id for t in trials]


def test_think_mode_matches_brute_force_on_concatenated_ids(engine):
    from engines.hf.engine import HFEngine

    e = HFEngine(
        engine.settings.__class__(**{**engine.settings.__dict__, "think": True, "think_budget": 12}),
        model=engine.model,
        tokenizer=engine.tokenizer,
    ).load()
    trials = [make_trial(YESNO, ["Yes", "No"], trial_id="a"), make_trial(SCALE, SCALE_OPTIONS[:12], trial_id="b")]
    for r, t in zip(e.readout(trials), trials, strict=True):
        base = e.render(t, think=True)
        assert r.prompt_ids[: len(base)] == base  # reasoning appended as ids, prompt never re-tokenized
        assert r.reasoning_tokens > 0
        tail = e.tokenizer.decode(list(r.prompt_ids[len(base) :]))
        assert tail.endswith("</think>\n\n")
        if r.hit_budget:
            assert r.reasoning_tokens == 12
        ref = brute_force(e, r.prompt_ids, [s.token_ids for s in r.scores])
        np.testing.assert_allclose([s.logprob for s in r.scores], ref, atol=1e-4)


def test_assistant_prefix_scores_options_with_a_space(tiny_engine):
    r = tiny_engine.readout([make_trial(YESNO, ["Yes", "No"], prefix="Answer:")])[0]
    yes_ids = r.scores[0].token_ids
    assert tiny_engine.tokenizer.decode(list(yes_ids)) == " Yes"
    assert tiny_engine.tokenizer.decode(list(r.prompt_ids)).endswith("Answer:")


def test_option_errors_are_clear(tiny_engine):
    from engines.render import OptionError
    from probe.types import Message, Trial

    with pytest.raises(ValueError, match="option list is empty"):
        Trial("x", "e", "i", {}, (Message("user", "q"),), (), ())
    with pytest.raises(OptionError, match="empty option"):
        tiny_engine.readout([make_trial(YESNO, ["Yes", ""])])


@pytest.mark.trained
def test_sampled_frequencies_match_readout(tiny_engine):
    """First-token frequencies at T=1 against the readout (exact binomial test of each cell)."""
    trial = make_trial(YESNO, ["Yes", "No"])
    n = 3000
    e, r, samples = first_token_draws(tiny_engine, trial, n)
    assert [s.replicate for s in samples] == list(range(n))
    # Counted by the drawn token id, not by the parsed answer: the parser also takes "yes" for "Yes", and the
    # tiny model puts some mass on such tokens, which the readout counts as non-option mass.
    first = [s.token_ids[0] for s in r.scores]
    drawn = [s.token_ids[0] if s.token_ids else -1 for s in samples]
    counts = np.array([sum(d == t for d in drawn) for t in first] + [0])
    counts[2] = n - counts[:2].sum()
    p = readout_cells(r)
    # Each cell (Yes, No, any other first token) against its readout probability, by an exact binomial test: valid
    # at any expected count, where a chi-square needs every expected count >= 50 and the trained weights decide
    # whether the non-option cell reaches it (on AVX-512 weights it expected 22). Per-(trial, draw) seeds make these
    # 3,000 draws the same on every run on one machine; were they fresh, each p-value of a correct sampler would be
    # at least uniform, so min p * 3 (Bonferroni over the cells) > 1e-6 has false-failure rate <= 1e-6. A sampler
    # whose P(Yes) is 5 points off fails it (binomial p ~ 1e-8 at n = 3,000 near P = 0.5).
    pvalues = cell_pvalues(counts, p)
    print(
        f"\nsampling vs readout tiny (Transformers): counts {counts.tolist()}, expected {np.round(p * n, 1).tolist()}, "
        f"p = {[f'{v:.3g}' for v in pvalues]}"
    )
    assert min(pvalues) * len(pvalues) > 1e-6, (counts, p * n, pvalues)
    again = e.sample([trial], n=50, temperature=1.0)
    assert [s.text for s in again] == [s.text for s in samples[:50]]  # per-draw seeding: reproducible


def test_sample_statuses_and_usage(tiny_engine):
    trial = make_trial(LETTERS, ["A", "B"])
    samples = tiny_engine.sample([trial, trial], n=10, temperature=0.7)
    assert len(samples) == 20
    assert all(s.status in ("ok", "invalid", "refusal") for s in samples)
    # How often the trained model answers in format is its build contract's business (tests/test_tiny.py), not a
    # count tuned to one machine's weights; every status here must be one a parse can give, with its usage.
    assert all((s.option is not None) == (s.status == "ok") for s in samples)
    assert all(s.completion_tokens >= 1 and s.prompt_tokens > 0 for s in samples)
    greedy = tiny_engine.sample([trial], n=2, temperature=0.0)
    assert greedy[0].text == greedy[1].text


def test_bad_settings_fail_clearly():
    from engines.hf.settings import HFSettings

    with pytest.raises(ValueError, match="dtype"):
        HFSettings(model="tiny", dtype="float8")
    with pytest.raises(ValueError, match="batch_size"):
        HFSettings(model="tiny", batch_size=0)


def test_missing_model_is_a_clear_error(tmp_path):
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings
    from probe.errors import ModelError

    with pytest.raises(ModelError, match="does not exist"):
        HFEngine(HFSettings(model=str(tmp_path / "nope"))).load()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"config\.json"):
        HFEngine(HFSettings(model=str(tmp_path / "empty"))).load()


def test_salted_readouts_are_deterministic_and_differ_from_unsalted(engine):
    from experiments.yesno import YesNoSpec, expand
    from probe.salts import SaltSpec

    spec = YesNoSpec(items=("mine_cart_bridge",), forms=("acceptable",), salts=SaltSpec(count=3, n_tokens=8))
    trials = expand(spec, count_tokens=engine.count_tokens)
    assert [t.replicate for t in trials[:3]] == [0, 1, 2]
    assert trials[0].salt == "" and trials[1].salt != trials[2].salt
    assert all(engine.count_tokens(t.salt) == 8 for t in trials if t.replicate)
    first = engine.readout(trials)
    again = engine.readout(list(reversed(trials)))[::-1]
    assert [[s.logprob for s in r.scores] for r in first] == [[s.logprob for s in r.scores] for r in again]
    unsalted = {
        t.factors["order"] + t.factors["verb"]: r for t, r in zip(trials, first, strict=True) if not t.replicate
    }
    for t, r in zip(trials, first, strict=True):
        if t.replicate:
            base = unsalted[t.factors["order"] + t.factors["verb"]]
            assert r.prompt_tokens >= base.prompt_tokens + 8  # the salt's 8 tokens (plus its separator)
            assert abs(r.scores[0].logprob - base.scores[0].logprob) > 1e-6


def test_an_option_the_tokenizer_cannot_write_is_refused(tiny_engine):
    """A tokenizer that loses characters (as sentencepiece does with <unk>) must not score a different string."""
    from engines.hf.engine import HFEngine
    from engines.render import OptionError

    class Lossy:
        def __init__(self, tok):
            self._tok = tok

        def __getattr__(self, name):
            return getattr(self._tok, name)

        def decode(self, ids, **kw):
            return self._tok.decode(ids, **kw).replace("é", "")

    e = HFEngine(tiny_engine.settings, model=tiny_engine.model, tokenizer=Lossy(tiny_engine.tokenizer)).load()
    with pytest.raises(OptionError, match="does not survive the tokenizer"):
        e.readout([make_trial(YESNO, ["Yes", "Né"])])
