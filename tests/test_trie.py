"""engines.trie: whole-option probabilities through a token trie, checked by hand and by enumeration."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from engines.trie import build_trie, normalize, option_logprobs

# Options "1", "10", "100", "2" as token ids (token 0 = "0", 1 = "1", 2 = "2").
DIGITS = [[1], [1, 0], [1, 0, 0], [2]]

# Made-up conditionals p(t | prefix) at each internal node (need not sum to 1 over listed tokens).
P_ROOT = {1: 0.5, 2: 0.3}  # the other 0.2 goes to tokens that start no option
P_AFTER_1 = {0: 0.4}
P_AFTER_10 = {0: 0.25}


def _cond(table: dict[tuple[int, ...], dict[int, float]]) -> dict[tuple[int, ...], dict[int, float]]:
    return {p: {t: math.log(v) for t, v in d.items()} for p, d in table.items()}


DIGIT_COND = _cond({(): P_ROOT, (1,): P_AFTER_1, (1, 0): P_AFTER_10})


def test_build_trie_internal_nodes_and_children() -> None:
    trie = build_trie(DIGITS)
    assert trie == {(): (1, 2), (1,): (0,), (1, 0): (0,)}
    # leaves are not internal nodes
    assert (1, 0, 0) not in trie and (2,) not in trie


def test_build_trie_children_sorted_and_shared_prefixes() -> None:
    trie = build_trie([[5, 3], [5, 1], [2], [5, 3, 9]])
    assert trie == {(): (2, 5), (5,): (1, 3), (5, 3): (9,)}


@pytest.mark.parametrize("options", [[[]], [[1], []], [(), (2,)]])
def test_build_trie_rejects_empty_option(options) -> None:
    with pytest.raises(ValueError, match="zero tokens"):
        build_trie(options)


def test_hand_worked_digit_options() -> None:
    lps = option_logprobs(DIGITS, build_trie(DIGITS), DIGIT_COND)
    expected = [
        0.5 * (1 - 0.4),  # "1" and stop
        0.5 * 0.4 * (1 - 0.25),  # "10" and stop
        0.5 * 0.4 * 0.25,  # "100" (leaf: plain chain rule)
        0.3,  # "2" (leaf)
    ]
    assert [math.exp(lp) for lp in lps] == pytest.approx(expected, rel=1e-12)


def test_closed_trie_sums_to_root_mass_of_first_tokens() -> None:
    # every internal node below the root is itself an option, so nothing leaks below the root:
    # the options share exactly the root mass of their first tokens.
    lps = option_logprobs(DIGITS, build_trie(DIGITS), DIGIT_COND)
    assert math.fsum(math.exp(lp) for lp in lps) == pytest.approx(P_ROOT[1] + P_ROOT[2], rel=1e-12)


def test_open_internal_node_leaks_mass() -> None:
    # "1" and "100" only: "10" is an internal node but not an option; "10x" (x != 0) matches nothing.
    opts = [[1], [1, 0, 0]]
    lps = option_logprobs(opts, build_trie(opts), DIGIT_COND)
    got = [math.exp(lp) for lp in lps]
    assert got == pytest.approx([0.5 * 0.6, 0.5 * 0.4 * 0.25], rel=1e-12)
    leak = 0.5 * 0.4 * 0.75
    assert math.fsum(got) + leak == pytest.approx(0.5, rel=1e-12)


def test_option_order_is_kept_and_duplicates_allowed() -> None:
    opts = [[2], [1, 0, 0], [1]]
    lps = option_logprobs(opts, build_trie(opts), DIGIT_COND)
    assert [math.exp(lp) for lp in lps] == pytest.approx([0.3, 0.05, 0.5 * 0.6], rel=1e-12)


def test_all_continuation_mass_gives_minus_inf() -> None:
    # the model always continues "1" into "10", so "1" as a whole answer has probability 0
    cond = _cond({(): {1: 0.9}, (1,): {0: 1.0}})
    lps = option_logprobs([[1], [1, 0]], build_trie([[1], [1, 0]]), cond)
    assert lps[0] == -math.inf
    assert math.exp(lps[1]) == pytest.approx(0.9)


def test_tiny_remainder_is_not_lost() -> None:
    # 1 - p(0|1) = 1e-12: log1p keeps it where naive 1 - exp(...) loses digits
    cond = {(): {1: 0.0}, (1,): {0: math.log1p(-1e-12)}}
    (lp, _) = option_logprobs([[1], [1, 0]], build_trie([[1], [1, 0]]), cond)
    assert lp == pytest.approx(math.log(1e-12), rel=1e-6)


def _random_dist(rng: random.Random, vocab: int) -> list[float]:
    w = [rng.random() + 1e-3 for _ in range(vocab)]
    s = sum(w)
    return [x / s for x in w]


def _assign(seq: tuple[int, ...], trie: dict, options: set[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The option a full reply counts as: walk down the trie while the next token stays in it."""
    node: tuple[int, ...] = ()
    while node in trie and len(node) < len(seq) and seq[len(node)] in trie[node]:
        node = seq[: len(node) + 1]
    return node if node in options else None


@pytest.mark.parametrize("seed", range(25))
def test_partition_by_brute_force_enumeration(seed: int) -> None:
    """For random tries and random full next-token distributions, enumerate all replies of the
    maximal depth and check each option's probability, and that options + unmatched mass == 1."""
    rng = random.Random(seed)
    vocab = 3
    n_opts = rng.randint(1, 5)
    options: list[tuple[int, ...]] = []
    while len(options) < n_opts:
        cand = tuple(rng.randrange(vocab) for _ in range(rng.randint(1, 4)))
        if cand not in options:
            options.append(cand)
    depth = max(len(o) for o in options)
    # a full distribution over the vocabulary after *every* prefix, not just trie nodes
    dist = {p: _random_dist(rng, vocab) for n in range(depth) for p in itertools.product(range(vocab), repeat=n)}
    trie = build_trie(options)
    cond = {p: {t: math.log(dist[p][t]) for t in range(vocab)} for p in trie}
    got = [math.exp(lp) for lp in option_logprobs(options, trie, cond)]

    mass = {o: 0.0 for o in options}
    unmatched = 0.0
    for seq in itertools.product(range(vocab), repeat=depth):
        pr = math.prod(dist[seq[:i]][seq[i]] for i in range(depth))
        hit = _assign(seq, trie, set(options))
        if hit is None:
            unmatched += pr
        else:
            mass[hit] += pr
    assert got == pytest.approx([mass[o] for o in options], rel=1e-9, abs=1e-15)
    assert math.fsum(got) + unmatched == pytest.approx(1.0, rel=1e-12)


def test_normalize_coverage_and_sum() -> None:
    ps = [0.3, 0.1, 0.05]
    probs, coverage = normalize([math.log(p) for p in ps])
    assert coverage == pytest.approx(0.45, rel=1e-12)
    assert probs == pytest.approx([0.3 / 0.45, 0.1 / 0.45, 0.05 / 0.45], rel=1e-12)
    assert math.fsum(probs) == pytest.approx(1.0, rel=1e-15)


def test_normalize_very_small_logprobs_do_not_underflow_probs() -> None:
    probs, coverage = normalize([-1000.0, -1000.0 + math.log(3.0)])
    assert probs == pytest.approx([0.25, 0.75], rel=1e-12)
    assert coverage == 0.0  # exp(-1000) underflows, the ratio must not


def test_normalize_some_minus_inf() -> None:
    probs, coverage = normalize([math.log(0.2), -math.inf])
    assert probs == [1.0, 0.0]
    assert coverage == pytest.approx(0.2)


def test_normalize_all_minus_inf_is_uniform_with_zero_coverage() -> None:
    probs, coverage = normalize([-math.inf] * 4)
    assert probs == [0.25] * 4
    assert coverage == 0.0
