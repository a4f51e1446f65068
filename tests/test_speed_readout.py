"""The shared-prefix readout paths of the Transformers engine compute what the plain path computes.

``tree`` (one tree-masked forward over a batch's prompts and option prefixes)
and ``branch`` (a shared prefix once, its cache branched per trial) must give
the plain path's readouts within 1e-5 on both tiny architectures, for single-
and multi-token options, options that are prefixes of others, think mode and
batches cut at awkward places. The packing helpers are checked against brute
force. No timing is asserted anywhere.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import numpy as np
import pytest

from tests.conftest import make_trial

SCALE = [str(i) for i in range(101)]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run fastest on one thread, and OpenMP threads spin badly on shared cores; restored after."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


STORY = "You stand by a lever. A cart rolls toward five workers; pulling it turns the cart toward one."


def _battery() -> list:
    """Mixed trials: forms of one story (long shared prefix), another story, multi-token and prefix options."""
    out = []
    for i, q in enumerate(["Is it acceptable to pull it?", "Is it wrong to pull it?", "Should you pull it?"]):
        out.append(make_trial(f"{STORY}\n\n{q} Answer with Yes or No.", ["Yes", "No"], trial_id=f"yn{i}"))
        out.append(make_trial(f"{STORY}\n\n{q} Answer with No or Yes.", ["No", "Yes"], trial_id=f"ny{i}"))
    out.append(make_trial(f"{STORY}\n\nHow acceptable is it, from 0 to 100?", SCALE, trial_id="g0"))
    out.append(make_trial(f"{STORY}\n\nHow wrong is it, from 0 to 100?", SCALE[:21], trial_id="g1"))
    out.append(make_trial("A different story. Is it fine?", ["Yes, it is", "No", "Yes"], trial_id="mp"))
    out.append(make_trial("A different story. Is it fine?", ["Yes", "No"], trial_id="dup-prompt"))  # same prompt
    out.append(
        make_trial(f"{STORY}\n\nIs it acceptable to pull it? Answer with Yes or No.", ["Yes", "No"], trial_id="dup")
    )
    out.append(make_trial(f"{STORY} Pick one.", ["A", "B"], prefix="Answer:", trial_id="prefix"))
    return out


@pytest.fixture(scope="module", params=("tiny", "tiny-hybrid"))
def engine(request):
    """Each tiny architecture on the CPU in float32 (the 1e-5 comparisons need float32 everywhere)."""
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    return HFEngine(HFSettings(model=request.param, device="cpu", dtype="float32")).load()


@pytest.fixture(scope="module")
def tiny_engine():
    """The attention-only tiny model on the CPU in float32."""
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    return HFEngine(HFSettings(model="tiny", device="cpu", dtype="float32")).load()


def _engine(base, **changes):
    from engines.hf.engine import HFEngine

    return HFEngine(replace(base.settings, **changes), model=base.model, tokenizer=base.tokenizer).load()


def _flat(readouts) -> np.ndarray:
    return np.array([v for r in readouts for v in [*(s.logprob for s in r.scores), r.coverage]])


def _assert_same(got, ref, atol: float = 1e-5) -> None:
    """Readouts of two paths agree within float rounding (``atol`` on log-probabilities and coverage).

    Paths compute with other shapes, so their kernels round differently, and by how much depends on the CPU's
    instruction set. What follows from values within ``atol`` is asserted, and no more: the greedy option and the
    order of the most likely non-option tokens may differ only between entries that are themselves within
    rounding of each other (a near tie), never elsewhere.
    """
    assert [r.trial_id for r in got] == [r.trial_id for r in ref]
    np.testing.assert_allclose(_flat(got), _flat(ref), atol=atol, rtol=0)
    for a, b in zip(got, ref, strict=True):
        if a.greedy_option != b.greedy_option:  # only at a tie of the two options' log-probabilities
            assert abs(b.prob(a.greedy_option) - b.prob(b.greedy_option)) < 4 * atol, (a, b)
        assert a.prompt_ids == b.prompt_ids and a.prompt_tokens == b.prompt_tokens
        mine, theirs = dict(a.top_other), dict(b.top_other)
        for token in mine.keys() ^ theirs.keys():  # in one top list only: at the edge, tied with its last entry
            edge = min(theirs.values()) if token in mine else min(mine.values())
            assert abs(mine.get(token, theirs.get(token, 0.0)) - edge) < 1e-6, (token, a.top_other, b.top_other)
        shared = sorted(mine.keys() & theirs.keys())
        np.testing.assert_allclose([mine[t] for t in shared], [theirs[t] for t in shared], atol=1e-6)


# ------------------------------------------------------------------ packing helpers


def _random_seqs(rng: random.Random, n: int) -> list[tuple[int, ...]]:
    """Sequences with heavy sharing: a few stems, random tails, some duplicates and prefixes of others."""
    stems = [tuple(rng.randrange(5) for _ in range(rng.randrange(1, 6))) for _ in range(3)]
    seqs = [rng.choice(stems) + tuple(rng.randrange(4) for _ in range(rng.randrange(0, 5))) for _ in range(n)]
    seqs += [seqs[0], seqs[1][:1]]
    return seqs


def _brute_lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_shared_prefix_lengths_match_brute_force():
    from engines.hf.tokens import shared_prefix_lengths

    rng = random.Random(3)
    seqs = sorted(_random_seqs(rng, 40))
    want = [0] + [_brute_lcp(a, b) for a, b in itertools.pairwise(seqs)]
    assert shared_prefix_lengths(seqs) == want
    assert shared_prefix_lengths([(1, 2), (1, 2), (1, 2, 3), (4,)]) == [0, 2, 2, 0]
    assert shared_prefix_lengths([]) == []


@pytest.mark.parametrize("seed", range(5))
def test_pack_tree_has_each_prefix_once_and_the_mask_is_the_ancestor_relation(seed):
    from engines.hf.tokens import pack_tree, tree_mask

    rng = random.Random(seed)
    seqs = _random_seqs(rng, 25)
    tree = pack_tree(seqs)
    distinct = sorted(set(seqs))
    keys = [distinct[k][: d + 1] for k, d in zip(tree.owner, tree.depth, strict=True)]
    # every distinct prefix of every sequence is exactly one node, with its own last token
    assert len(keys) == len(set(keys)) == len({s[:i] for s in seqs for i in range(1, len(s) + 1)})
    assert list(tree.tokens) == [k[-1] for k in keys]
    assert all(keys.index(k[:-1]) < i for i, k in enumerate(keys) if len(k) > 1)  # parents first
    assert [keys[e] for e in tree.ends] == seqs
    assert [seqs[i] for i in tree.first] == distinct
    mask = tree_mask(tree).numpy()
    brute = np.array([[len(kj) <= len(ki) and ki[: len(kj)] == kj for kj in keys] for ki in keys])
    np.testing.assert_array_equal(mask, brute)


def test_pack_tree_hand_example():
    from engines.hf.tokens import pack_tree, tree_mask

    tree = pack_tree([(7, 1, 2), (7, 1), (7, 3)])
    # sorted distinct: (7, 1) adds 7 1; (7, 1, 2) adds 2; (7, 3) adds 3
    assert tree.tokens == (7, 1, 2, 3) and tree.depth == (0, 1, 2, 1)
    assert tree.ends == (2, 1, 3) and tree.shared == (0, 2, 1)
    assert tree_mask(tree).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]]
    with pytest.raises(ValueError, match="no empty"):
        pack_tree([(1,), ()])


def test_prefix_groups_share_only_what_saves_tokens():
    from engines.hf.tokens import prefix_groups

    story = tuple(range(100))
    seqs = sorted([(*story, 200 + i, 300) for i in range(4)] + [(1000, 1), (1000, 2)] + [(5000,)])
    groups = prefix_groups(seqs)
    assert [m for _, m in groups] == [[0, 1, 2, 3], [4, 5], [6]]
    assert [n for n, _ in groups] == [100, 1, 0]
    for n, members in groups:  # a common prefix, leaving every member at least one token
        assert all(seqs[m][:n] == seqs[members[0]][:n] and len(seqs[m]) > n for m in members)
    # a one-token shared head is not worth shrinking a 100-token shared prefix for
    long = sorted([(*story, 1), (*story, 2), (0, 5)])
    assert long[2] == (0, 5)
    assert prefix_groups(long) == [(100, [0, 1]), (1, [2])]


def test_token_rows_bound_items_and_tokens():
    from engines.hf.tokens import token_rows

    lengths, shared, extra = [10, 10, 10, 10, 50], [0, 8, 8, 0, 0], [1, 1, 1, 1, 0]
    assert token_rows(lengths, shared, extra, max_tokens=20, max_items=8) == [[0, 1, 2], [3], [4]]
    assert token_rows(lengths, shared, extra, max_tokens=1000, max_items=2) == [[0, 1], [2, 3], [4]]
    # a full row is cut where the least is shared: story B (items 1-4) stays whole
    assert token_rows([10] * 5, [0, 2, 8, 8, 8], [0] * 5, max_tokens=20, max_items=8) == [[0], [1, 2, 3, 4]]


# ------------------------------------------------------------------ engine paths


def test_auto_picks_tree_for_attention_and_branch_for_hybrids_on_cpu(engine):
    want = "tree" if engine.settings.model == "tiny" else "branch"
    assert _engine(engine, readout_path="auto").readout_path() == want
    if want == "branch":
        with pytest.raises(ValueError, match=r"not full attention.*readout_path='branch' or 'plain'"):
            _engine(engine, readout_path="tree").readout([make_trial("Q?", ["Yes", "No"])])


@pytest.mark.trained
@pytest.mark.parametrize("batch_size,tree_tokens", [(16, 4096), (3, 200)], ids=["one-batch", "small-batches"])
def test_shared_prefix_paths_equal_the_plain_path(engine, batch_size, tree_tokens):
    trials = _battery()
    ref = _engine(engine, readout_path="plain", batch_size=16).readout(trials)
    paths = ["branch"] + (["tree"] if engine.settings.model == "tiny" else [])
    for path in paths:
        got = _engine(engine, readout_path=path, batch_size=batch_size, tree_tokens=tree_tokens).readout(trials)
        _assert_same(got, ref)


@pytest.mark.trained
def test_shared_prefix_paths_equal_the_plain_path_in_think_mode(engine):
    trials = [t for t in _battery() if t.trial_id in ("yn0", "ny1", "g1", "mp", "prefix")]
    ref = _engine(engine, readout_path="plain", think=True, think_budget=6).readout(trials)
    assert all(r.reasoning_tokens > 0 for r in ref)
    for path in ["branch"] + (["tree"] if engine.settings.model == "tiny" else []):
        got = _engine(engine, readout_path=path, think=True, think_budget=6).readout(trials)
        _assert_same(got, ref)
        assert [(r.reasoning, r.hit_budget) for r in got] == [(r.reasoning, r.hit_budget) for r in ref]


def test_shared_paths_compute_fewer_tokens_and_count_them(engine):
    """``computed_tokens`` sums to what was fed to the model (tree: exactly; the first sharer pays the prefix)."""
    trials = _battery()
    fed = [0]

    def count(module, args, kwargs):
        fed[0] += int(kwargs["input_ids"].numel())

    handle = engine.model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        totals = {}
        for path in ["plain", "branch"] + (["tree"] if engine.settings.model == "tiny" else []):
            fed[0] = 0
            rs = _engine(engine, readout_path=path, batch_size=16, tree_tokens=4096).readout(trials)
            totals[path] = (sum(r.computed_tokens for r in rs), fed[0])
    finally:
        handle.remove()
    prompt = sum(len(r.prompt_ids) for r in rs)
    assert totals["branch"][0] < prompt < totals["plain"][0]
    if "tree" in totals:
        assert totals["tree"][0] == totals["tree"][1]  # no padding, no cache: every fed token is a node
        assert totals["tree"][0] < totals["branch"][0]


def test_tree_readouts_do_not_depend_on_input_order(tiny_engine):
    trials = _battery()
    e = _engine(tiny_engine, readout_path="tree", batch_size=4, tree_tokens=300)
    first = e.readout(trials)
    again = e.readout(list(reversed(trials)))[::-1]
    assert _flat(first).tolist() == _flat(again).tolist()


def test_tree_matches_brute_force_on_the_scale(tiny_engine):
    """The tree path against plain full-sequence forwards, on 0..100 (prefix options, multi-token)."""
    from tests.test_engine_hf import brute_force

    e = _engine(tiny_engine, readout_path="tree")
    r = e.readout([make_trial(f"{STORY} How acceptable is it, from 0 to 100?", SCALE)])[0]
    ref = brute_force(e, r.prompt_ids, [s.token_ids for s in r.scores])
    np.testing.assert_allclose([s.logprob for s in r.scores], ref, atol=1e-4, rtol=0)
    assert math.isclose(r.coverage, math.fsum(math.exp(v) for v in ref), abs_tol=1e-4)


def test_bad_readout_settings_fail_clearly():
    from engines.hf.settings import HFSettings

    with pytest.raises(ValueError, match="readout_path must be one of"):
        HFSettings(model="tiny", readout_path="fast")
    with pytest.raises(ValueError, match="tree_tokens must be >= 1"):
        HFSettings(model="tiny", tree_tokens=0)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("model", ["tiny", "tiny-hybrid"])
def test_shared_prefix_paths_on_cuda(model):
    """On a GPU: float32 paths equal plain within 1e-5 and the CPU within 1e-4; bfloat16 paths stay close."""
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    trials = _battery()
    cpu = HFEngine(HFSettings(model=model, device="cpu", dtype="float32", readout_path="plain")).readout(trials)
    for dtype, atol in (("float32", 1e-5), ("bfloat16", None)):
        base = HFEngine(HFSettings(model=model, device="cuda", dtype=dtype, readout_path="plain")).load()
        ref = base.readout(trials)
        for path in ["branch"] + (["tree"] if model == "tiny" else []):
            got = _engine(base, readout_path=path).readout(trials)
            if atol is not None:
                _assert_same(got, ref, atol=atol)
                np.testing.assert_allclose(_flat(got), _flat(cpu), atol=1e-4, rtol=0)
            else:  # bfloat16 rounds differently along different kernels: probabilities stay close
                diff = max(
                    abs(a.prob - b.prob)
                    for r, q in zip(got, ref, strict=True)
                    for a, b in zip(r.scores, q.scores, strict=True)
                )
                assert diff < 0.05, (path, diff)
