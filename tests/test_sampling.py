"""Fast sampling (engines/hf/sampling.py and HFEngine.sample): the same draws whatever the batch and path.

What must not change when sampling gets faster: raw draws from the model's
distribution, one generator per (trial, draw), stored generated ids, and
parses. Every path (tree, shared, plain) and every batch size draws from the
same seeds. What is guaranteed on every machine:

* the same path at the same shapes draws bit-identical tokens (asserted exactly);
* across paths and batch sizes the log-probabilities agree within float rounding
  (1e-5, asserted by the grouped-attention and reserved-cache tests), so a draw can
  move only where its uniform falls within rounding of a CDF step. Which draws do
  depends on the CPU's float kernels (AVX-512, AVX2, default), so the cross-path
  tests accept a differing draw only where it is such a near tie: recomputed on a
  one-row plain forward, the draw's own uniform lies within 1e-4 of the total
  mass from the step between the two tokens (:func:`_assert_same_up_to_near_ties`).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tests.conftest import make_trial

YESNO = "Is it acceptable to break a promise to save a life? Answer Yes or No."
LETTERS = "Which is better, A or B? Answer with A or B."


def _engine(base, **kw):
    from engines.hf.engine import HFEngine

    settings = base.settings.__class__(model=base.settings.model, **kw)
    return HFEngine(settings, model=base.model, tokenizer=base.tokenizer).load()


def _trials():
    users = [YESNO, LETTERS, YESNO.replace("promise", "rule"), "Pick one: A or B?", YESNO + " Be brief."]
    opts = [["Yes", "No"], ["A", "B"], ["Yes", "No"], ["A", "B"], ["Yes", "No"]]
    return [make_trial(u, o, trial_id=f"t{i}") for i, (u, o) in enumerate(zip(users, opts, strict=True))]


# ------------------------------------------------------------------ RowSampler


def test_row_sampler_matches_the_distribution_and_its_seeds():
    """Inverse-CDF draws over a 5-token vocabulary against the exact probabilities (chi-square)."""
    import torch

    from engines.hf.sampling import RowSampler

    p = np.array([0.5, 0.25, 0.15, 0.1, 0.0])
    lp = torch.log(torch.tensor(p, dtype=torch.float32)).expand(20000, -1).clone()
    drawn = RowSampler(range(20000), 1.0).draw(lp).numpy()
    counts = np.bincount(drawn, minlength=5)
    assert counts[4] == 0  # a token of probability 0 is never drawn
    res = stats.chisquare(counts[:4], p[:4] * 20000)
    # Seeds 0..19999 are fixed, so this is deterministic (p printed); for fresh seeds the p-value of a correct
    # sampler is uniform, so the bar p > 1e-6 has false-failure rate 1e-6. A 1-point error in P(token 0) gives
    # chi-square ~ 8 per 1e4 draws, p ~ 0.05 at this n: the test catches gross errors (wrong CDF, off-by-one).
    print(f"\nRowSampler 20000 draws {counts.tolist()}, p = {res.pvalue:.3g}")
    assert res.pvalue > 1e-6
    # temperature: T = 0.5 squares and renormalizes the probabilities
    hot = RowSampler(range(20000), 0.5).draw(lp).numpy()
    q = p[:4] ** 2 / (p[:4] ** 2).sum()
    assert stats.chisquare(np.bincount(hot, minlength=5)[:4], q * 20000).pvalue > 1e-6


def test_row_sampler_rows_are_independent_and_greedy_is_argmax():
    import torch

    from engines.hf.sampling import RowSampler

    lp = torch.log_softmax(torch.randn(6, 50, generator=torch.Generator().manual_seed(1)), -1)
    seeds = [11, 12, 13, 14, 15, 16]
    whole = RowSampler(seeds, 1.0)
    part = RowSampler([seeds[1], seeds[4]], 1.0)
    for _ in range(5):  # five steps: each row's draws depend on its own seed only, whoever else is drawn
        a, b = whole.draw(lp), part.draw(lp[[1, 4]])
        assert a[[1, 4]].tolist() == b.tolist()
    dropped = RowSampler(seeds, 1.0)
    dropped.draw(lp)
    dropped.keep([4])
    kept = RowSampler([seeds[4]], 1.0)
    kept.draw(lp[[4]])
    assert dropped.draw(lp[[4]]).tolist() == kept.draw(lp[[4]]).tolist()
    assert RowSampler(seeds, 0.0).draw(lp).tolist() == lp.argmax(-1).tolist()


# ------------------------------------------------------------------ caches


def test_tree_paths_spell_every_sequence():
    from engines.hf.tokens import pack_tree, tree_paths

    seqs = [(1, 2, 3, 4), (1, 2, 5), (1, 2, 3, 4), (7,), (1, 2, 3, 9, 9), (1, 2)]
    tree = pack_tree(seqs)
    paths = tree_paths(tree)
    for s, path in zip(seqs, paths, strict=True):
        assert tuple(tree.tokens[i] for i in path) == s
        assert [tree.depth[i] for i in path] == list(range(len(s)))
    assert paths[0] == paths[2]  # duplicates share their nodes


def test_reserved_cache_decodes_like_the_dynamic_cache(engine):
    """Greedy decoding on a reserved cache gives the dynamic cache's log-probs (within 1e-5) at every step."""
    import torch

    from engines.hf.sampling import reserve_cache

    ids, mask = engine.lm.pad_left([engine.render(t) for t in _trials()[:3]])
    with torch.inference_mode():
        lp_a, a = engine.lm.forward(ids, mask, None)
        lp_b, b = engine.lm.forward(ids, mask, None)
        b = reserve_cache(b, 3)  # 3 of room: the 4th and 5th steps grow the buffers
        for _ in range(5):
            nxt = lp_a.argmax(-1)[:, None]
            assert torch.equal(nxt, lp_b.argmax(-1)[:, None])
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            lp_a, a = engine.lm.forward(nxt, mask, a)
            lp_b, b = engine.lm.forward(nxt, mask, b)
            assert (lp_a - lp_b).abs().max().item() < 1e-5


def test_grouped_attention_matches_a_cache_row_per_draw(engine):
    """Draws of one prompt sharing its keys (SharedPromptLayer + grouped attention) give the log-probs of one
    cache row per draw, within 1e-5, at every step: through padding, rows leaving (one prompt entirely), and
    steps past the reserve."""
    import torch

    from engines.hf.sampling import group_cache, reserve_cache, shared_prompt_layer_class

    n = 3
    ids, mask = engine.lm.pad_left([engine.render(t) for t in _trials()[:3]])  # three prompts, left-padded
    with torch.inference_mode():
        lp, per_row = engine.lm.forward(ids, mask, None)
        _, grouped = engine.lm.forward(ids, mask, None)
        idx = torch.arange(3).repeat_interleave(n)
        per_row.reorder_cache(idx)
        per_row = reserve_cache(per_row, 2)
        grouped = group_cache(grouped, mask, n, 2)
        assert grouped is not None and any(isinstance(x, shared_prompt_layer_class()) for x in grouped.layers)
        lp_a, lp_b, mask = lp[idx], lp[idx], mask[idx]
        for step in range(6):  # 2 of room: steps 3 to 6 grow the buffers
            nxt = torch.multinomial(lp_a.exp(), 1, generator=torch.Generator().manual_seed(step))
            if step == 3:  # drop draw 1 of prompt 0 and every draw of prompt 1
                keep = torch.tensor([0, 2, 6, 7, 8])
                per_row.reorder_cache(keep)
                grouped.reorder_cache(keep)
                nxt, mask = nxt[keep], mask[keep]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            lp_a, per_row = engine.lm.forward(nxt, mask, per_row)
            with engine._sampler.grouped_attention(grouped):
                lp_b, grouped = engine.lm.forward(nxt, mask, grouped)
            assert (lp_a - lp_b).abs().max().item() < 1e-5, step
    assert engine.model.config._attn_implementation == "sdpa"  # restored after every step


def test_balanced_batches():
    from engines.batching import balanced

    assert [balanced(c, 128) for c in (1, 100, 128, 129, 132, 256, 257)] == [1, 100, 128, 65, 66, 128, 86]
    assert balanced(0, 16) == 16 and balanced(5, 1) == 1


# ------------------------------------------------------------------ the engine


def _draws(samples):
    return [(s.trial_id, s.replicate, s.token_ids, s.text) for s in samples]


#: A differing draw must sit this close to a CDF step (as a share of the total mass). Rounding moves the log-
#: probabilities by about 1e-6 between paths (the grouped-attention and reserved-cache tests bound them by 1e-5), so
#: a step moves by about that share; a uniform further than 1e-4 from every step cannot change its token, and a
#: wrong path (another distribution, a shifted generator) diverges at steps far from any tie.
NEAR_TIE = 1e-4


def _near_tie(engine, trial, draw: int, prefix: tuple[int, ...], a: int, b: int) -> float:
    """How far (share of the total mass) draw ``draw``'s uniform at this step lies from the CDF step between the
    tokens ``a`` and ``b`` two paths drew after ``prefix``: the step's distribution recomputed on one row, plain."""
    import torch

    from engines.base import draw_seed

    gen = torch.Generator(device="cpu").manual_seed(draw_seed(engine.settings.seed, trial.trial_id, draw))
    u = torch.rand(len(prefix) + 1, dtype=torch.float64, generator=gen)[-1]
    ids = torch.tensor([[*engine.render(trial), *prefix]])
    with torch.inference_mode():
        lp, _ = engine.lm.forward(ids, torch.ones_like(ids), None)
    cdf = (lp[0] - lp[0].max()).exp().double().cumsum(-1)
    target = u * cdf[-1]
    lo, hi = sorted((a, b))
    return float((cdf[lo:hi] - target).abs().min() / cdf[-1])


def _assert_same_up_to_near_ties(engine, trials, ref, got, what) -> int:
    """``got`` draws what ``ref`` draws, token by token, except after a near tie (see the module docstring).
    Returns how many draws moved at a near tie (printed by the callers: 0 on most machines)."""
    by_id = {t.trial_id: t for t in trials}
    assert [(d[0], d[1]) for d in got] == [(d[0], d[1]) for d in ref], what
    moved = 0
    for (tid, draw, want, _), (_, _, ids, _) in zip(ref, got, strict=True):
        if ids == want:
            continue
        pos = next((i for i, (x, y) in enumerate(zip(want, ids, strict=False)) if x != y), None)
        assert pos is not None, (what, tid, draw, "one draw is a prefix of the other", want, ids)
        gap = _near_tie(engine, by_id[tid], draw, tuple(want[:pos]), want[pos], ids[pos])
        assert gap < NEAR_TIE, (what, tid, draw, pos, gap)
        moved += 1
    return moved


@pytest.mark.trained
def test_same_draws_on_every_path_and_batch_size(tiny_engine):
    """tree, shared and plain, at 1, 3 and 16 rows per batch, alone or with other trials: the same draws (bit for
    bit at the same path and shapes; elsewhere up to near ties, see the module docstring)."""
    trials = _trials()
    ref = _draws(_engine(tiny_engine, sample_path="plain", sample_rows=16).sample(trials, 4, 1.0))
    assert _draws(_engine(tiny_engine, sample_path="plain", sample_rows=16).sample(trials, 4, 1.0)) == ref
    moved = 0
    for path in ("tree", "shared", "plain"):
        for rows in (1, 3, 16):
            for group in (True, False):  # draws of a prompt sharing its keys (grouped attention), or a row each
                e = _engine(tiny_engine, sample_path=path, sample_rows=rows, group_draws=group)
                moved += _assert_same_up_to_near_ties(
                    tiny_engine, trials, ref, _draws(e.sample(trials, 4, 1.0)), (path, rows, group)
                )
    # small trees: several trees (each its own forward) gathered into one decoding batch
    small = _draws(_engine(tiny_engine, sample_path="tree", tree_tokens=50).sample(trials, 4, 1.0))
    moved += _assert_same_up_to_near_ties(tiny_engine, trials, ref, small, "tree_tokens=50")
    alone = _draws(_engine(tiny_engine, sample_path="tree").sample([trials[2]], 4, 1.0))
    # with or without other trials in the batch
    moved += _assert_same_up_to_near_ties(tiny_engine, trials, [d for d in ref if d[0] == "t2"], alone, "alone")
    print(f"\nsampling paths: {moved} of {19 * len(ref) + len(alone)} compared draws moved at a near tie")
    assert len({d[3] for d in ref}) > 4  # the draws differ: they are draws


@pytest.mark.trained
def test_hybrid_paths_draw_the_same(engine):
    """The Mamba hybrid (no tree path) copies its cache per draw: the same draws as one prefill per draw (up to
    near ties across shapes)."""
    if engine.settings.model != "tiny-hybrid":
        pytest.skip("the hybrid only")
    trials = _trials()[:3]
    with pytest.raises(ValueError, match="sample_path='tree' cannot run"):
        _engine(engine, sample_path="tree").sample(trials, 2, 1.0)
    assert _engine(engine).sample_path() == "shared"
    shared = _draws(_engine(engine, sample_path="shared", sample_rows=5).sample(trials, 3, 1.0))
    assert _draws(_engine(engine, sample_path="shared", sample_rows=5).sample(trials, 3, 1.0)) == shared
    plain = _draws(_engine(engine, sample_path="plain", sample_rows=2).sample(trials, 3, 1.0))
    rows = _draws(_engine(engine, sample_path="shared", sample_rows=5, group_draws=False).sample(trials, 3, 1.0))
    _assert_same_up_to_near_ties(engine, trials, shared, plain, "plain")
    _assert_same_up_to_near_ties(engine, trials, shared, rows, "rows")


def test_answer_stop_cuts_draws_without_changing_a_parse(smol_engine):
    """A forced-answer draw stops once its answer is over: its ids are the start of the full draw, and it
    parses as the full draw does (the full reply cut at its answer end). On SmolLM2, which often goes on
    after "No." (the trained tiny model stops by itself)."""
    from experiments.battery import BatterySpec, expand
    from probe.parse import answer_end, parse_answer

    trials = [t for t in expand(BatterySpec()) if t.factors.get("instrument") == "binary"][:3]
    e = _engine(smol_engine, max_new_tokens=16)
    full = e.sample(trials, 4, 1.0)
    cut = e.sample(trials, 4, 1.0, stop_at_answer=True)
    shorter = 0
    for f, c in zip(full, cut, strict=True):
        assert f.token_ids[: len(c.token_ids)] == c.token_ids
        opts = next(t.options for t in trials if t.trial_id == f.trial_id)
        end = answer_end(f.text, opts)
        whole = parse_answer(f.text if end is None else f.text[:end], opts, think=False)
        assert (c.option, c.status) == (whole.option, whole.status)
        shorter += len(c.token_ids) < len(f.token_ids)
    print(f"\nanswer stop: {shorter} of {len(cut)} draws cut short")
    assert shorter > 0  # the seeds are fixed: this count is the same on every run


def test_think_mode_ignores_answer_stop(tiny_engine):
    e = _engine(tiny_engine, think=True, think_budget=8, max_new_tokens=4)
    trials = _trials()[:2]
    assert _draws(e.sample(trials, 2, 1.0, stop_at_answer=True)) == _draws(e.sample(trials, 2, 1.0))


def test_sample_settings_fail_clearly():
    from engines.hf.settings import HFSettings

    with pytest.raises(ValueError, match="sample_path"):
        HFSettings(model="tiny", sample_path="fast")
    with pytest.raises(ValueError, match="sample_rows"):
        HFSettings(model="tiny", sample_rows=0)
    with pytest.raises(ValueError, match="sample_cache_tokens"):
        HFSettings(model="tiny", sample_cache_tokens=0)


def test_sampling_flags_reach_the_settings():
    """probe run's own parser: the sampling flags land in HFSettings (group_draws is on unless switched off)."""
    from engines import make_engine
    from probe.app.cli import build_parser

    def settings(*flags):
        a = build_parser().parse_args(["run", "yesno", "--model", "tiny", "--out", "unused", *flags])
        return make_engine(a).settings

    default = settings()
    assert (default.group_draws, default.sample_rows, default.sample_cache_tokens) == (True, 1024, 131072)
    chosen = settings("--hf-no-group-draws", "--hf-sample-rows", "64", "--hf-sample-cache-tokens", "999")
    assert (chosen.group_draws, chosen.sample_rows, chosen.sample_cache_tokens) == (False, 64, 999)


def test_decoding_batches_respect_rows_and_cache_tokens(tiny_engine):
    """Batches hold at most sample_rows draws and sample_cache_tokens cache tokens (a grouped prompt once), and a
    call's draws are cut into as few batches as that allows, evenly."""
    from engines.hf.draws import Draw

    trials = _trials()
    prompts = [tiny_engine.render(t) for t in trials]
    rows = [Draw(k, d, prompts[k], k * 10 + d, None) for k in range(len(trials)) for d in range(4)]
    longest, budget = max(map(len, prompts)), 8

    def sizes(**kw):
        e = _engine(tiny_engine, **kw)
        return sorted((len(b) for b, *_ in e._sampler.prefills(rows, 4, e.sample_path(), budget)), reverse=True)

    assert sizes() == [20]  # 5 trials x 4 draws, one batch
    assert sizes(sample_rows=12) == [12, 8]  # 3 trials a batch at most: two batches
    assert sizes(sample_rows=8) == [8, 8, 4]
    # grouped: a trial holds longest + 4 x budget cache tokens; room for two trials a batch
    assert sizes(sample_cache_tokens=2 * (longest + 4 * budget)) == [8, 8, 4]
    # a row per draw: a trial holds 4 x (longest + budget); room for one
    assert sizes(sample_cache_tokens=4 * (longest + budget), group_draws=False) == [4] * 5


def test_temperature_zero_is_greedy_on_every_path(tiny_engine):
    trials = _trials()[:3]
    texts = {
        path: [s.text for s in _engine(tiny_engine, sample_path=path).sample(trials, 2, 0.0)]
        for path in ("tree", "shared", "plain")
    }
    assert texts["tree"] == texts["shared"] == texts["plain"]
    assert texts["tree"][0] == texts["tree"][1]


def test_draws_reuse_the_readout_prefill(tiny_engine):
    """sample_next: the readout keeps its trees' caches, and the draws that follow start from them: the same
    readouts, and the same draws as a sample() that computes its prompts itself."""
    trials = _trials()
    e = _engine(tiny_engine)
    plain_readouts = e.readout(trials)
    alone = _draws(e.sample(trials[:3], 4, 1.0))
    e.sample_next(trials[:3])
    readouts = e.readout(trials)
    assert set(e._trees.kept) == {e.render(t) for t in trials[:3]}  # only the prompts to be sampled
    for a, b in zip(plain_readouts, readouts, strict=True):
        assert a == b  # the same forward, only its cache kept
    reused = _draws(e.sample(trials[:3], 4, 1.0))
    assert not e._trees.kept and not e._trees.expected  # consumed
    assert reused == alone
    # a readout that does not hold every prompt of the sample: the sample computes them itself
    e.sample_next(trials[:3])
    e.readout(trials[:2])
    assert _draws(e.sample(trials[:3], 4, 1.0)) == alone
