"""Token rows and the token tree: pure functions of token ids, shared by the readout, reasoning and sampling parts.

Owns: cutting token rows into batches (:func:`token_rows`, :func:`fill`, on the batching rules every engine shares:
:func:`engines.batching.cut_runs`, :func:`~engines.batching.length_batches`, :func:`~engines.batching.balanced`,
imported here under their old names), shared prefixes (:func:`shared_prefix_lengths`, :func:`prefix_groups`) and the
packed token tree (:class:`TokenTree`, :func:`pack_tree`, :func:`tree_mask`, :func:`tree_paths`). No state, no
model. May import: :mod:`engines.base` (``require``: torch, lazily, as numpy is), :mod:`engines.batching`; nothing
else of the project.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engines.base import require
from engines.batching import cut_runs


def shared_prefix_lengths(seqs: Sequence[Sequence[int]]) -> list[int]:
    """How many leading tokens each sequence shares with the one before it (0 for the first).

    Vectorized with numpy: no Python loop walks the tokens.
    """
    import numpy as np

    if not seqs:
        return []
    lengths = np.array([len(s) for s in seqs])
    grid = np.full((len(seqs), int(lengths.max()) + 1), -1, dtype=np.int64)  # -1 ends every row
    for r, s in enumerate(seqs):
        grid[r, : len(s)] = s
    diff = grid[1:] != grid[:-1]
    first = np.where(diff.any(axis=1), diff.argmax(axis=1), lengths[1:])  # identical rows share everything
    return [0, *first.tolist()]


@dataclass(frozen=True)
class TokenTree:
    """Token sequences packed into one row with every shared prefix once.

    The nodes are the distinct prefixes of the sequences in depth-first order
    (a parent before its children). Sorting the distinct sequences makes that
    order simple: each sequence adds the tokens after the prefix it shares with
    the sequence before it. Run with the mask of :func:`tree_mask` and position
    ids ``depth``, one forward computes every node exactly as it would be
    computed at the end of its own sequence.
    """

    tokens: tuple[int, ...]
    depth: tuple[int, ...]
    """Position of each node in its sequences (its RoPE position id)."""
    owner: tuple[int, ...]
    """For each node, the (sorted, distinct) sequence that added it."""
    shared: tuple[int, ...]
    """For each sorted distinct sequence, the tokens it shares with the one before it."""
    ends: tuple[int, ...]
    """For each input sequence, the node of its last token."""
    first: tuple[int, ...]
    """For each sorted distinct sequence, its first index in the input."""


def pack_tree(seqs: Sequence[Sequence[int]]) -> TokenTree:
    """Pack non-empty token sequences into a :class:`TokenTree` (duplicates share all their nodes)."""
    keys = [tuple(s) for s in seqs]
    distinct = sorted(set(keys))
    if not distinct or not all(distinct):
        raise ValueError("pack_tree needs at least one sequence and no empty ones")
    shared = shared_prefix_lengths(distinct)
    tokens: list[int] = []
    depth: list[int] = []
    owner: list[int] = []
    last: dict[tuple[int, ...], int] = {}
    for k, (s, n) in enumerate(zip(distinct, shared, strict=True)):
        # n < len(s): a sorted distinct sequence is never a prefix of the one before it
        tokens.extend(s[n:])
        depth.extend(range(n, len(s)))
        owner.extend([k] * (len(s) - n))
        last[s] = len(tokens) - 1
    first: dict[tuple[int, ...], int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    return TokenTree(
        tuple(tokens),
        tuple(depth),
        tuple(owner),
        tuple(shared),
        tuple(last[k] for k in keys),
        tuple(first[s] for s in distinct),
    )


def tree_mask(tree: TokenTree, device: Any = None) -> Any:
    """Boolean (nodes x nodes) mask: True where node i may attend to node j (j is i or one of its ancestors).

    Node j of sorted sequence a at depth dj is an ancestor of node i of
    sequence b >= a at depth di >= dj iff the two sequences agree on their
    first dj + 1 tokens, and two sorted sequences agree on as many tokens as
    the smallest ``shared`` between them: ``agree[a, b] = min(shared[a+1..b])``.
    """
    torch = require("torch", "hf")
    owner = torch.tensor(tree.owner, device=device)
    depth = torch.tensor(tree.depth, dtype=torch.int32, device=device)
    m = len(tree.shared)
    seq = torch.arange(m, device=device)
    shared = torch.tensor(tree.shared, dtype=torch.int32, device=device)
    later = seq[None, :] > seq[:, None]
    agree = torch.cummin(torch.where(later, shared[None, :], torch.iinfo(torch.int32).max), dim=1).values
    oi, oj = owner[:, None], owner[None, :]
    di, dj = depth[:, None], depth[None, :]
    return ((oi == oj) & (dj <= di)) | ((oj < oi) & (dj < agree[oj, oi]))


def tree_paths(tree: TokenTree) -> list[list[int]]:
    """For each input sequence of a packed tree, the nodes of its tokens in order (root first).

    A sorted distinct sequence shares its first ``shared[k]`` nodes with the
    one before it and adds the rest, which are consecutive in node order.
    """
    paths: list[list[int]] = []
    start = 0
    for k, n in enumerate(tree.shared):
        prev = paths[k - 1][:n] if k else []
        added = 0
        while start + added < len(tree.owner) and tree.owner[start + added] == k:
            added += 1
        paths.append(prev + list(range(start, start + added)))
        start += added
    by_end = {p[-1]: p for p in paths}
    return [by_end[e] for e in tree.ends]


def fill(parts: Sequence[Sequence[int]], most: int) -> list[list[Sequence[int]]]:
    """Consecutive parts grouped so that each group holds at most ``most`` items (a larger part alone)."""

    def full(group: list[Sequence[int]], part: Sequence[int]) -> int:
        return len(group) if sum(len(p) for p in group) + len(part) > most else 0

    return cut_runs(parts, full)


def prefix_groups(seqs: Sequence[Sequence[int]]) -> list[tuple[int, list[int]]]:
    """Split sequences (sorted, so that shared prefixes are adjacent) into groups that run one shared prefix.

    Returns ``(prefix length, member indices)`` per group. A sequence joins the
    current group when that saves tokens: not running its own copy of the
    shared prefix (``p`` tokens) must save more than the group loses when its
    prefix shrinks to ``p`` (``old - p`` more suffix tokens per member). Every
    member keeps at least its last token as suffix, whose logits are the slot.
    """
    shared = shared_prefix_lengths(seqs)
    groups: list[tuple[int, list[int]]] = []
    for i, s in enumerate(seqs):
        if groups:
            old, members = groups[-1]
            p = min(old, shared[i], len(s) - 1)
            if p > (old - p) * len(members):
                groups[-1] = (p, [*members, i])
                continue
        groups.append((len(s) - 1, [i]))
    return groups


def token_rows(
    lengths: Sequence[int], shared: Sequence[int], extra: Sequence[int], max_tokens: int, max_items: int
) -> list[list[int]]:
    """Cut a sorted run of items into consecutive rows of at most ``max_items`` items and about ``max_tokens`` tokens.

    Item i costs ``lengths[i] + extra[i]`` tokens, less the ``shared[i]`` it
    shares with the item before it in the same row. When a row is full, the cut
    goes where the least is shared (between two stories rather than inside
    one), so that a shared prefix is rarely run twice. An item that alone
    exceeds ``max_tokens`` gets a row of its own.
    """

    def cost(i: int, first: bool) -> int:
        return lengths[i] + extra[i] - (0 if first else shared[i])

    def cut(row: list[int], i: int) -> int:
        size = sum(cost(k, n == 0) for n, k in enumerate(row))
        if len(row) < max_items and size + cost(i, False) <= max_tokens:
            return 0
        # cut before the item of the row that shares least with its predecessor, if it shares less than i
        j = min(range(1, len(row)), key=lambda n: (shared[row[n]], -n), default=0)
        return j if j and shared[row[j]] < shared[i] else len(row)

    return cut_runs(range(len(lengths)), cut)
