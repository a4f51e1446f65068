"""The Transformers engine: exact answer-slot readouts and raw samples.

Design notes (why it is shaped like this):

* **Token ids, not strings.** The chat template renders the whole prompt to
  text once, it is tokenized once, and everything after (option tokens,
  reasoning, closing tags) is appended as ids. Nothing is ever cut out of a
  string that was tokenized whole, because BPE merges across a cut change the
  ids the model saw. Renders and option encodings are cached per distinct
  input, because a battery asks the same options thousands of times.
* **Options through a trie.** Options become token sequences in a trie
  (:mod:`engines.trie`); the model is asked for the next-token distribution
  after the prompt and after every proper option prefix (the trie's internal
  nodes), and nothing else: logits are computed only at those positions.
* **Each shared token once.** A battery asks the same story under many forms,
  so most prompt tokens are shared. Three readout paths compute the same
  values (in float32 within 3.2e-5 nats on smol's 30 layers, 5e-6 on the tiny models; in bfloat16 they
  differ by up to 0.25 nats on smol, docs/gpu.md) and differ only in how much they share:

  - ``tree`` (attention-only models): a batch's prompts *and* option prefixes
    are packed as one token tree (:func:`pack_tree`), each distinct prefix
    once, and run in one forward pass with a tree-shaped attention mask
    (:func:`tree_mask`: a token sees its ancestors and itself) and position
    ids equal to the depth, so every token is computed exactly as at the end
    of its own sequence. No KV cache, no padding, no Python loop per token.
  - ``branch`` (any model, Mamba hybrids included): trials that share a
    prefix run it once (:func:`prefix_groups`); its cache is gathered into one
    row per trial (``Cache.reorder_cache``, the beam-search primitive that
    attention and Mamba caches implement), the suffixes of equal length run
    together (no padding between prefix and suffix, which a recurrent state
    would see), and the trie is expanded one token per step on that cache.
  - ``plain``: every prompt whole, then the trie one token per step (the
    reference the others are tested against).
* **Batch- and padding-invariant.** Prompts are left-padded with explicit
  position ids (so RoPE positions do not depend on the padding), and rows
  are grouped so that shared prefixes are adjacent.
* **Raw logits, the readout's log-softmax in float64.** No temperature, no top-k, no processors. The
  positions a readout reads are normalized in float64 (:func:`readout_log_probs`): an option that is a prefix of
  longer ones ends with ``1 - (its continuations' mass)``, which multiplies a float32 log-softmax's rounding by
  ``mass / (1 - mass)`` (1.1e-4 nats on smol's "9" of 0-100). Draws sample from float32 log-probs, as before.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from engines.base import Draws, EngineSettings, ProgressFn, check_reasoning, require
from engines.flags import NO_FLAG, add_flags, flag, settings_from_flags
from engines.graphs import SlotDecoder, span_of
from engines.local import DrawRow, LocalEngine, Prepared, ThinkRequest, folder_info, slot_readout
from engines.placement import TorchCuda, check_device_arg, check_offload, nvidia_driver, place
from engines.refill import ReasoningStats, Schedule, stacked, unstackable
from engines.render import checked_option_ids, encode_option, option_texts, rendered_system_prompt, stop_ids
from engines.sampling import (
    GROUPED_ATTENTION,
    RowSampler,
    gather_tree_cache,
    group_cache,
    register_grouped_attention,
    reserve_cache,
)
from engines.trie import Prefix, Trie, build_trie
from probe.errors import ModelError
from probe.models import resolve_model
from probe.parse import answer_scan, split_reasoning
from probe.types import Readout, Sample, Trial

T = TypeVar("T")

DTYPES = ("auto", "float32", "bfloat16", "float16")
READOUT_PATHS = ("auto", "tree", "branch", "plain")
SAMPLE_PATHS = ("auto", "tree", "shared", "plain")
HEAD_DTYPES = ("float32", "model")
EXPERTS = ("auto", "eager", "grouped_mm", "batched_mm")
"""Implementations of a mixture-of-experts layer in Transformers (``set_experts_implementation``)."""
DECODE_GRAPHS = ("auto", "on", "off")


@dataclass(frozen=True)
class HFSettings(EngineSettings):
    """Settings of the Transformers engine (all recorded in the run manifest).

    Each field is its flag (:mod:`engines.flags`): the loading ones (``--dtype``, ``--device``, ``--batch-size``,
    ``--revision``, ``--trust-remote-code``) are shared with every local engine and the judge
    (:func:`engines.add_loading_arguments`); the speed-only ones are ``--hf-*`` (:func:`add_arguments`).
    """

    dtype: str = field(default="auto", metadata=flag(choices=DTYPES))
    """Weights dtype: auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16.

    Whatever the weights, draws sample from a float32 softmax and readouts normalize in float64 (docs/gpu.md)."""
    device: str = "auto"
    """Where the model runs: auto (one GPU if torch sees one, else the CPU), cpu, cuda, cuda:N, or split (one model
    over every visible GPU).

    auto is an error where a GPU is there but torch cannot use it; :mod:`engines.placement`."""
    offload: bool = False
    """Accept weights that do not fit the GPU being placed on the CPU or disk (default: refuse, naming the memory;
    far slower)."""
    head_dtype: str = field(default="float32", metadata=flag(name="hf-head-dtype", choices=HEAD_DTYPES))
    """Dtype of the final projection at the positions read: float32 (default; the logits are not rounded to
    bfloat16 before the softmax) or model (as the model computes it).

    float32 casts the hidden state and the head's (``lm_head``) weights up, keeping a float32 copy of the head's
    weights, vocabulary x hidden x 4 bytes; model uses the weights' dtype."""
    batch_size: int = 16
    """Most trials per forward pass."""
    max_batch_tokens: int = field(default=32768, metadata=NO_FLAG)
    """Most padded prompt tokens per forward pass (bounds activation memory)."""
    top_other: int = field(default=5, metadata=NO_FLAG)
    """How many of the most likely non-option tokens to report."""
    revision: str | None = None
    """Model revision (hub branch, tag or commit)."""
    trust_remote_code: bool = False
    """Allow model code from the hub."""
    readout_path: str = field(default="auto", metadata=flag(name="hf-readout-path", choices=READOUT_PATHS))
    """How shared prompt tokens are computed: tree, branch, plain or auto.

    Speed only in float32: the paths agree within 3.2e-5 nats on smol; in bfloat16 they round differently, so
    outside float32 the path enters the run key (docs/gpu.md). tree: one tree-masked forward per batch
    (attention-only models); branch: the shared prefix once, then its cache branched per trial (any model);
    plain: every prompt whole; auto: tree where possible, else branch on a CPU and plain on a GPU."""
    tree_tokens: int = field(default=1024, metadata=flag(name="hf-tree-tokens"))
    """Most tokens in one packed prompt tree.

    Its attention mask is tree_tokens x tree_tokens; one longer prompt gets a tree of its own."""
    sample_path: str = field(default="auto", metadata=flag(name="hf-sample-path", choices=SAMPLE_PATHS))
    """How draws share their prompt (docs/speed.md): tree, shared, plain or auto.

    Speed only: every path draws the same tokens from the same seeds, up to float rounding. tree: the batch's
    prompts packed as one token tree, its cache copied to every draw (attention-only models); shared: each prompt
    once, its cache copied to every draw (any model); plain: every draw prefills its prompt (the reference);
    auto: tree where possible, else shared."""
    sample_rows: int = field(default=1024, metadata=flag(name="hf-sample-rows"))
    """Most draws decoded together.

    On 2 CPU cores one batch of 544 draws was 10% faster than two of 272, 512 rows 29% faster than 128, and 128
    about twice as fast per draw as 16 (docs/speed.md). The batch's KV cache is also bounded by
    ``sample_cache_tokens``."""
    sample_cache_tokens: int = field(default=131072, metadata=flag(name="hf-sample-cache-tokens"))
    """Most KV-cache tokens of one decoding batch, reply room included; bounds memory.

    Grouped draws hold their prompt once. Memory: tokens x layers x 2 x kv-heads x head-dim x bytes, about 6 GB at
    the default on SmolLM2-135M in float32 and 13 GB on Qwen3-30B-A3B in bfloat16."""
    group_draws: bool = field(
        default=True,
        metadata=flag(
            name="hf-no-group-draws",
            negate=True,
            help="give every draw its own cache row instead of one per prompt (grouped attention; docs/speed.md)",
        ),
    )
    """Draws of one prompt keep its keys once and attend to them together (speed only: the same attention up to
    float rounding; tree and shared paths, n > 1, sdpa or eager attention). False: one cache row per draw."""

    reasoning_refill: bool = field(
        default=True,
        metadata=flag(
            name="hf-no-refill",
            negate=True,
            help="reason in fixed length buckets, each decoded until its longest trace ends, instead of giving a "
            "finished row to the next trial (docs/speed.md, 'Think mode')",
        ),
    )
    """Think mode: a row whose trace ended is given to the next waiting trial (:mod:`engines.refill`), so
    reasoning costs about total tokens / rows + the longest trace in steps; the same for think mode's draws
    (reasoning, then the answer). False: fixed length buckets, each to its longest trace, and draws on the
    sample paths. Speed only in float32; outside it the schedule enters the run key (docs/gpu.md)."""
    experts_prefill: str = field(default="auto", metadata=flag(name="hf-experts-prefill", choices=EXPERTS))
    """Mixture-of-experts models: how the experts compute a forward over many tokens per row (prompts, trees).

    auto: as the model loaded (Transformers' default, grouped_mm); batched_mm copies each token's experts'
    weights, so it cannot prefill at scale (it asked for 218 GiB at 16 x 291 tokens on Qwen3-30B-A3B's widths).
    Speed only in float32; outside it the choice enters the run key (docs/gpu.md)."""
    experts_decode: str = field(default="auto", metadata=flag(name="hf-experts-decode", choices=EXPERTS))
    """Mixture-of-experts models: how the experts compute a decoding step (one token per row).

    auto: batched_mm on a GPU where prefill uses grouped_mm, else as prefill (Transformers' generate() rule,
    :func:`experts_by_phase`). Speed only in float32; outside it the choice enters the run key."""
    reasoning_rows: int = field(default=0, metadata=flag(name="hf-reasoning-rows"))
    """Think mode: most traces reasoned together; 0 (auto): ``batch_size`` on a CPU, on a GPU as many as half its
    free memory holds KV cache for.

    A bfloat16 think-mode run's tokens depend on which traces share a step, so set it to make such a run
    reproducible across machines with other free memory."""
    decode_graphs: str = field(default="auto", metadata=flag(name="hf-decode-graphs", choices=DECODE_GRAPHS))
    """Think mode's refilled decoding in steps of fixed shape (slots, :mod:`engines.graphs`), each recorded in a
    CUDA graph on a GPU, so a step costs one launch instead of one per kernel.

    on: slots, recorded on one GPU (on a CPU or a split model the same steps run unrecorded); off: the refilled
    stack (:mod:`engines.refill`); auto: off until a device check has measured graphs on a GPU (docs/gpu.md).
    Attention-only models (a Mamba hybrid reasons in buckets). Speed only in float32; outside it the schedule
    (``slots``) enters the run key."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.readout_path not in READOUT_PATHS:
            raise ValueError(f"readout_path must be one of {READOUT_PATHS}, got {self.readout_path!r}")
        if self.sample_path not in SAMPLE_PATHS:
            raise ValueError(f"sample_path must be one of {SAMPLE_PATHS}, got {self.sample_path!r}")
        for name in (
            "batch_size",
            "max_batch_tokens",
            "think_budget",
            "max_new_tokens",
            "tree_tokens",
            "sample_rows",
            "sample_cache_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.top_other < 0:
            raise ValueError(f"top_other must be >= 0, got {self.top_other}")
        if self.reasoning_rows < 0:
            raise ValueError(f"reasoning_rows must be >= 0 (0: auto), got {self.reasoning_rows}")
        check_device_arg(self.device)
        check_reasoning(self)
        if self.head_dtype not in HEAD_DTYPES:
            raise ValueError(f"head_dtype must be one of {HEAD_DTYPES}, got {self.head_dtype!r}")
        for name in ("experts_prefill", "experts_decode"):
            if getattr(self, name) not in EXPERTS:
                raise ValueError(f"{name} must be one of {EXPERTS}, got {getattr(self, name)!r}")
        if self.decode_graphs not in DECODE_GRAPHS:
            raise ValueError(f"decode_graphs must be one of {DECODE_GRAPHS}, got {self.decode_graphs!r}")


@dataclass(frozen=True)
class _Draw(DrawRow):
    """One draw to make (:class:`engines.local.DrawRow`), with its (answer stop) options."""

    options: tuple[str, ...] | None
    """The options, when the draw stops once its answer is over; None: it runs to a stop token or the budget."""
    prefix: str = ""
    """The assistant prefix the parser puts back in front of the reply (outside think mode)."""


OWN_FLAGS = (
    "readout_path",
    "tree_tokens",
    "sample_path",
    "sample_rows",
    "sample_cache_tokens",
    "group_draws",
    "reasoning_refill",
    "reasoning_rows",
    "decode_graphs",
    "experts_prefill",
    "experts_decode",
    "head_dtype",
    "offload",
)
"""The fields of the Transformers engine's own flags, in their order in ``--help``."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The Transformers engine's own flags (speed only; the values do not change), from :class:`HFSettings`."""
    add_flags(p.add_argument_group("Transformers engine"), HFSettings, OWN_FLAGS)


def from_args(model: str, a: argparse.Namespace) -> HFEngine:
    """The engine the parsed flags ask for."""
    return HFEngine(settings_from_flags(HFSettings, a, model=model))


GROUP_FROM = 2
"""Group the draws of a prompt from this many on. A lone reply gains nothing: 64 free-choice replies of up to 200 tokens
took 64.8 s grouped and 65.3 s with a row each on 2 CPU cores (the same tokens)."""


def balanced(count: int, most: int) -> int:
    """The batch size that cuts ``count`` items into as few batches of at most ``most`` as possible, evenly.

    132 items at most 128 a batch: 66 (two batches of 66, not 128 and a 4-row tail that costs as many
    decoding steps as the full batch).
    """
    if count <= 0:
        return max(1, most)
    batches = -(-count // most)
    return -(-count // batches)


def cut_runs(items: Iterable[T], cut: Callable[[list[T], T], int]) -> list[list[T]]:
    """``items`` cut into consecutive runs, greedily.

    Before each item joins the current run, ``cut(run, item)`` says how many of
    the run's first items close as a run of their own (0: none, the item joins
    the run; ``len(run)``: the item starts a new one).
    """
    runs: list[list[T]] = []
    cur: list[T] = []
    for item in items:
        at = cut(cur, item) if cur else 0
        if at:
            runs.append(cur[:at])
            cur = cur[at:]
        cur.append(item)
    if cur:
        runs.append(cur)
    return runs


REASONING_ROWS = 1024
"""Most traces reasoned together on a GPU (vLLM's default number of sequences is of this order)."""


def reasoning_rows(free_bytes: int, per_token: int, tokens: int, least: int, most: int = REASONING_ROWS) -> int:
    """Traces to decode together: as many as half of ``free_bytes`` holds KV cache for at ``tokens`` tokens each
    (``per_token`` bytes a token), at least ``least`` and at most ``most``."""
    fits = (free_bytes // 2) // max(1, per_token * max(1, tokens))
    return int(min(most, max(least, fits)))


def kv_bytes_per_token(model: Any) -> int:
    """KV-cache bytes of one token: layers x 2 x key heads x head width x element size (an upper bound for
    hybrids, whose Mamba layers keep no per-token cache)."""
    c = getattr(model.config, "get_text_config", lambda: model.config)()
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    size = next(model.parameters()).element_size()
    return int(c.num_hidden_layers * 2 * heads * dim * size)


def length_batches(lengths: Sequence[int], batch_size: int, max_tokens: int) -> list[list[int]]:
    """Group indices into batches of similar length (longest first), bounded in rows and padded tokens."""

    def full(batch: list[int], i: int) -> int:
        width = lengths[batch[0]]  # longest first: the first row sets the width
        return len(batch) if len(batch) >= batch_size or width * (len(batch) + 1) > max_tokens else 0

    return cut_runs(sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)), full)


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


def _fill(parts: Sequence[Sequence[int]], most: int) -> list[list[Sequence[int]]]:
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


READOUT_SOFTMAX = "float64"
"""The dtype a readout's log-softmax computes in (:func:`readout_log_probs`); recorded in the run key
(:meth:`HFEngine.identity`)."""
READOUT_ROWS = 64
"""Rows per float64 log-softmax in :func:`readout_log_probs`, which bounds its float64 copy of the logits."""


def readout_log_probs(logits: Any, rows: int = READOUT_ROWS) -> Any:
    """The float64 log-softmax over the vocabulary of each row of ``logits`` (rows x vocabulary): what a readout
    reads (the trie's conditionals and the top other tokens), ``rows`` rows at a time.

    Not float32, because of the trie's subtraction: an option that is a prefix of longer options ("9" of "90"..
    "99") gets ``log1p(-cont)``, ``cont`` its continuations' summed probability, and an error ``e`` in the
    continuations' log-probs moves that term by ``e * cont / (1 - cont)``. float32's normalizer over a 49,152-token
    vocabulary is off by about 1e-5, so smol's "9" of 0-100 (cont 0.90) read 1.1e-4 nats off a float64 reference
    (docs/gpu.md). The logits are float32 (or the model's dtype); only their normalization is done in float64.
    Draws keep float32 log-probs (:meth:`HFEngine._forward`), so no seeded draw moves.
    """
    torch = require("torch", "hf")
    out = torch.empty(logits.shape, dtype=torch.float64, device=logits.device)
    for lo in range(0, logits.shape[0], rows):
        out[lo : lo + rows] = torch.log_softmax(logits[lo : lo + rows].double(), dim=-1)
    return out


def math_attention(device_type: str, dtype: Any, capability: str | None = None) -> bool:
    """Whether attention must run through PyTorch's math kernel: bfloat16 or float16 on a CPU whose kernel set is
    not AVX-512 (``capability``: ``torch.backends.cpu.get_cpu_capability()``, which ``ATEN_CPU_CAPABILITY`` sets).

    torch 2.13's CPU flash-attention kernel packs half-precision operands with ``pack_vnni2``, which exists only
    in its AVX-512 build: on an AVX2 CPU (or under ``ATEN_CPU_CAPABILITY=default`` / ``avx2``) every such
    attention over 64 or more tokens fails ("pack_vnni2 is only supported when avx512 is supported"), so a
    bfloat16 run on the CPU would stop at its first long prompt. The math kernel computes the same attention.
    """
    torch = require("torch", "hf")
    if device_type != "cpu" or dtype not in (torch.bfloat16, torch.float16):
        return False
    cap = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    return not str(cap).upper().startswith("AVX512")


def model_experts(model: Any) -> str | None:
    """The experts implementation ``model`` computes with now; None for a model without switchable experts
    (no mixture-of-experts layer, or a Transformers without ``set_experts_implementation``)."""
    get = getattr(model, "get_experts_implementation", None)
    return get().get("") if get is not None and has_switchable_experts(model) else None


def has_switchable_experts(model: Any) -> bool:
    """Whether a layer of ``model`` dispatches its experts by the config's implementation: its class was made by
    Transformers' ``use_experts_implementation`` (whose forward is defined in ``integrations/moe.py``). The
    model class's own flag (``_can_set_experts_implementation``) is read from its source file, so a dense
    variant of a mixture-of-experts architecture (Nemotron-H without MoE layers) claims it too."""
    for m in model.modules():
        code = getattr(type(m).forward, "__code__", None)
        if code is not None and Path(code.co_filename).parts[-2:] == ("integrations", "moe.py"):
            return True
    return False


@dataclass(frozen=True)
class Experts:
    """The experts implementation of each phase of a mixture-of-experts model (:func:`experts_by_phase`)."""

    prefill: str
    decode: str

    def of(self, tokens_per_row: int) -> str:
        """The implementation of a forward over ``tokens_per_row`` new tokens per row: one is a decoding step."""
        return self.decode if tokens_per_row == 1 else self.prefill


def experts_by_phase(loaded: str | None, device_type: str, prefill: str, decode: str) -> Experts | None:
    """Each phase's experts implementation for a model loaded with ``loaded`` (None: no experts, None back) on
    ``device_type``, from the settings ``prefill`` and ``decode`` (auto or an implementation).

    auto prefill keeps the loaded one. auto decode is Transformers' own rule in ``generate()``
    (``_optimize_model_for_decode``): batched_mm where prefill is grouped_mm off the CPU (grouped_mm's launches
    dominate a step of a few tokens per expert on a GPU; on a CPU grouped_mm is faster), else as prefill.
    """
    if loaded is None:
        return None
    p = loaded if prefill == "auto" else prefill
    if decode != "auto":
        return Experts(p, decode)
    return Experts(p, "batched_mm" if p == "grouped_mm" and device_type != "cpu" else p)


@dataclass(frozen=True)
class Weights:
    """What loading decided, once per model: the weights and tokenizer, where they came from and where they live.

    Every engine derived from a loaded one (:meth:`HFEngine.variant`) shares this record and derives the rest from
    its own settings (:meth:`HFEngine._setup`), so nothing loading decided is copied by hand or lost.
    """

    model: Any
    tokenizer: Any
    path: str | None = None
    """The model folder it was loaded from (None: a model handed in)."""
    placement: str = "given"
    """How it was placed (:func:`engines.placement.place`); given: placed by the caller that handed it in."""
    experts: str | None = None
    """The experts implementation it loaded with (:func:`model_experts`; None: no switchable experts). Kept here
    because engines sharing the model switch it per phase (:meth:`HFEngine._call`)."""


class HFEngine(LocalEngine):
    """Answer-slot readouts and samples from a Transformers causal LM."""

    name = "hf"
    settings: HFSettings

    def __init__(
        self, settings: HFSettings, *, model: Any = None, tokenizer: Any = None, weights: Weights | None = None
    ) -> None:
        self.settings = settings
        if weights is None and model is not None and tokenizer is not None:
            # a model handed in (tests, the bench) was placed by its caller
            weights = Weights(model, tokenizer, experts=model_experts(model))
        self._weights = weights
        self._model: Any = None  # set with the rest of what the weights decide, by load() (:meth:`_setup`)
        self._tok: Any = None
        self._cache_kw = "past_key_values"
        self._renders: dict[tuple[Any, ...], tuple[int, ...]] = {}
        self._encodings: dict[str, tuple[int, ...] | str] = {}
        self._token_texts: dict[int, str] = {}
        self._resolved_path: str | None = None
        self._expect: set[tuple[int, ...]] = set()  # prompts the next sample() will draw from (sample_next)
        self._kept: dict[tuple[int, ...], tuple[Any, list[int], Any]] = {}  # prompt -> (tree cache, path, log-probs)
        self._head = "model"  # the dtype the final projection computes in (:meth:`_float32_head`)
        self._split: bool | None = None  # the weights live on more than one device (:meth:`_is_split`)
        self._reasoning = ReasoningStats()
        self._math: bool | None = None  # attention through the math kernel (:func:`math_attention`), once known
        self._experts: Experts | None = None  # each phase's experts implementation (:func:`experts_by_phase`)
        self._drawing = ReasoningStats()  # think mode's refilled draws (:meth:`_draw_refilled`)

    # ---------------------------------------------------------------- loading
    def load(self) -> HFEngine:
        """Load tokenizer and model (idempotent), then derive what this engine's settings make of them
        (:meth:`_setup`); an engine built on loaded :class:`Weights` (:meth:`variant`) only derives."""
        if self._weights is None:
            self._weights = self._load_weights()
        if self._model is None:
            self._setup(self._weights)
        return self

    def _load_weights(self) -> Weights:
        """Tokenizer and model from ``settings.model``, placed and in the settings' dtype."""
        torch = require("torch", "hf")
        transformers = require("transformers", "hf")

        ref = resolve_model(self.settings.model)
        s = self.settings
        cuda = TorchCuda.of(torch)
        # nvidia-smi is asked only where torch sees no GPU: to tell "no GPU here" from "a GPU torch cannot use"
        where = place(s.device, cuda, nvidia_driver() if not cuda.available and s.device != "cpu" else None)
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
            s.dtype, torch.bfloat16 if where.cuda else torch.float32
        )
        kw: dict[str, Any] = {"revision": s.revision, "trust_remote_code": s.trust_remote_code}
        transformers.logging.disable_progress_bar()  # probe shows its own progress; keep logs clean
        try:
            tok = transformers.AutoTokenizer.from_pretrained(ref.path, **kw)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                ref.path, dtype=dtype, device_map=where.device_map, **kw
            )
        except (OSError, ValueError) as e:
            raise ModelError(
                f"cannot load model {s.model!r} ({ref.path}): {str(e).splitlines()[0]}. "
                "Pass a built-in name (tiny, tiny-hybrid, smol), a local model folder, a .gguf file, or a Hugging Face id "
                "that is in the local cache or downloadable from here."
            ) from e
        if where.cuda:
            sizes = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
            check_offload(getattr(model, "hf_device_map", None), sizes, allowed=s.offload)
        model.eval()
        return Weights(model, tok, ref.path, where.describe(), model_experts(model))

    def _setup(self, weights: Weights) -> None:
        """Everything an engine derives from loaded weights and its own settings, in one place, so an engine made
        by :meth:`variant` (or :meth:`reading_alone`, :meth:`without_reasoning`) computes as a freshly loaded one
        with its settings would: the cache keyword, the pad token, the chat template check, the head's dtype."""
        import inspect

        self._model, self._tok = weights.model, weights.tokenizer
        params = inspect.signature(self._model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        tok = self._tok
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        self._check_chat_template()
        self._float32_head()
        s = self.settings
        if weights.experts is not None:  # a mixture-of-experts model: each phase's implementation
            self._experts = experts_by_phase(weights.experts, self.device.type, s.experts_prefill, s.experts_decode)

    def _float32_head(self) -> None:
        """Compute the final projection in float32 (``settings.head_dtype``), where the weights are not float32.

        A bfloat16 ``lm_head`` rounds every logit to 8 bits of mantissa before the float32 softmax: on SmolLM2
        that alone moved option log-probabilities by up to 0.09 nats (docs/gpu.md). The head's forward is replaced
        (once per loaded model) by one that, while the engine reading asks for float32 (:meth:`_use_head`), casts
        the hidden state up and multiplies by a float32 copy of the weights on the head's own device (an
        accelerate hook around it still moves its input there first), and otherwise runs the original. It runs
        only at the positions the engine reads (``logits_to_keep``).
        """
        torch = require("torch", "hf")
        head = self._model.get_output_embeddings()
        self._head = "model"
        if head is None or getattr(head, "weight", None) is None:
            return
        if head.weight.dtype == torch.float32:
            self._head = "float32"
            return
        if self.settings.head_dtype != "float32":
            return
        self._head = "float32"
        if getattr(head, "_probe_float32", None) is not None:
            return  # already patched by another engine on the same weights
        attr = "_old_forward" if hasattr(head, "_old_forward") else "forward"  # keep a split model's hook
        original = getattr(head, attr)
        weight = head.weight.detach().float()
        bias = head.bias.detach().float() if getattr(head, "bias", None) is not None else None

        def forward(hidden: Any) -> Any:
            if not head._probe_float32:
                return original(hidden)
            return torch.nn.functional.linear(hidden.to(weight.device, torch.float32), weight, bias)

        setattr(head, attr, forward)
        head._probe_float32 = True

    def _use_head(self) -> None:
        """Before a forward: the shared head computes in this engine's head dtype."""
        head = self.model.get_output_embeddings()
        if head is not None and getattr(head, "_probe_float32", None) is not None:
            head._probe_float32 = self._head == "float32"

    @property
    def model(self) -> Any:
        if self._model is None:
            self.load()
        return self._model

    @property
    def experts(self) -> Experts | None:
        """Each phase's experts implementation this engine computes with (None: the model has no switchable
        experts): its settings' auto resolved on its device (:func:`experts_by_phase`)."""
        return self.load()._experts

    @property
    def device(self) -> Any:
        return self.model.get_input_embeddings().weight.device

    def describe(self) -> dict[str, Any]:
        """Model, revision, dtype and settings for the manifest."""
        m = self.model
        assert self._weights is not None
        path = str(self._weights.path or getattr(m, "name_or_path", ""))
        info: dict[str, Any] = {
            "engine": self.name,
            "settings": asdict(self.settings),
            "model_path": path,
            "model_class": type(m).__name__,
            "dtype": str(next(m.parameters()).dtype).replace("torch.", ""),
            "head_dtype": self._head,
            "device": str(self.device),
            "placement": self._weights.placement,
            "devices": sorted({str(p.device) for p in m.parameters()}),
            "commit_hash": getattr(m.config, "_commit_hash", None),
            "n_parameters": sum(p.numel() for p in m.parameters()),
        }
        info.update(folder_info(path))
        info["system_prompt"] = rendered_system_prompt(self.tokenizer, self.settings.system_prompt)
        return info

    def variant(self, **settings: Any) -> HFEngine:
        """An engine on the same loaded weights with other settings (no second load): what loading decided (the
        weights, their placement) is shared, and what the settings decide (the head's dtype among them) is derived
        again by the one :meth:`_setup`, so a variant reads what a fresh engine with its settings reads."""
        return HFEngine(replace(self.settings, **settings), weights=self.load()._weights).load()

    def reading_alone(self) -> HFEngine:
        """The reference reader of the numeric floor (:mod:`probe.app.floor`): one trial per forward, plain path."""
        return self.variant(batch_size=1, readout_path="plain")

    def without_reasoning(self) -> HFEngine:
        """The same engine outside think mode (the floor of a think-mode run is measured on its bare slots)."""
        return self.variant(think=False)

    def run_stats(self) -> dict[str, Any]:
        """What this engine's think mode decoded so far (:class:`engines.refill.ReasoningStats`), for the
        manifest's ``engine_stats``: ``reasoning`` (the traces before a slot is read) and ``think_draws`` (sampled
        answers that reason first); empty where it did neither."""
        parts = {"reasoning": self._reasoning, "think_draws": self._drawing}
        return {name: stats.record() for name, stats in parts.items() if stats.traces}

    def identity(self) -> dict[str, Any]:
        """:meth:`LocalEngine.identity`, and the dtype a readout normalizes in (``readout_softmax``,
        :func:`readout_log_probs`).

        float64 replaced float32 there, which moved the options that prefix longer ones by up to 9.3e-5 nats on
        smol's 0-100 scales (docs/gpu.md): above the 3.2e-5 within which float32's readout paths agree, the bound
        under which a value change stays out of the key. So the key changed with it, in every dtype, and a run begun on float32
        readouts is never resumed or merged with float64 ones (``probe run`` names ``readout_softmax`` as what
        differs). Draws did not change; a run that only samples gets a new key all the same.
        """
        return {**super().identity(), "readout_softmax": READOUT_SOFTMAX}

    def numerics(self) -> dict[str, Any]:
        s = self.settings
        reasoning = {"reasoning_schedule": self._schedule(), "reasoning_rows": s.reasoning_rows} if s.think else {}
        experts = {"experts": asdict(self._experts)} if self._experts is not None else {}
        return {
            **reasoning,
            **experts,
            "head_dtype": self._head,
            "readout_path": self.readout_path(),
            "batch_size": s.batch_size,
            "max_batch_tokens": s.max_batch_tokens,
            "tree_tokens": s.tree_tokens,
            "sample_path": self.sample_path(),
            "sample_rows": s.sample_rows,
            "sample_cache_tokens": s.sample_cache_tokens,
            "group_draws": s.group_draws,
        }

    # ------------------------------------------------------------- rendering
    def render(self, trial: Trial, *, think: bool | None = None) -> tuple[int, ...]:
        """The prompt token ids up to the answer slot (or to where reasoning starts); cached per distinct prompt."""
        think = self.settings.think if think is None else think
        key = (trial.messages, trial.assistant_prefix, think)
        if key not in self._renders:
            self._renders[key] = super().render(trial, think=think)
        return self._renders[key]

    def option_ids(self, trial: Trial) -> tuple[tuple[int, ...], ...]:
        """Each option as the token ids the model would emit at the slot (rules: :func:`engines.render.option_texts`)."""
        encoded = []
        for text in option_texts(trial):
            if text not in self._encodings:
                self._encodings[text] = encode_option(self.tokenizer, text)
            encoded.append(self._encodings[text])
        return checked_option_ids(trial, encoded)

    def _token_text(self, tid: int) -> str:
        if tid not in self._token_texts:
            self._token_texts[tid] = self.tokenizer.decode([tid])
        return self._token_texts[tid]

    def _stop_ids(self) -> set[int]:
        """The ids that end the model's turn: the tokenizer's eos and the loaded model's generation config's."""
        gen = getattr(self.model, "generation_config", None)
        return stop_ids(self.tokenizer, getattr(gen, "eos_token_id", None))

    # ------------------------------------------------------------ the forward
    def _pad_left(self, seqs: Sequence[Sequence[int]]) -> tuple[Any, Any]:
        torch = require("torch", "hf")
        width = max(len(s) for s in seqs)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[r, width - len(s) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _call(self, **inputs: Any) -> Any:
        """One forward of the model: the head in this engine's dtype (:meth:`_use_head`), the experts of a
        mixture-of-experts model in the implementation of the forward's phase (:class:`Experts`; switched only when
        the model computes with another), and attention through PyTorch's math kernel where its CPU flash kernel
        cannot run (:func:`math_attention`)."""
        self._use_head()
        if self._experts is not None:
            want = self._experts.of(inputs["input_ids"].shape[1])
            if self.model.get_experts_implementation().get("") != want:
                self.model.set_experts_implementation(want)
        if self._math is None:
            self._math = math_attention(self.device.type, next(self.model.parameters()).dtype)
        if not self._math:
            return self.model(**inputs)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            return self.model(**inputs)

    def _forward(self, ids: Any, mask: Any, cache: Any, *, float64: bool = False) -> tuple[Any, Any]:
        """Last-position float32 log-probs (float64 with ``float64``: a readout's, :func:`readout_log_probs`) and
        the updated cache.

        ``mask`` covers the cache and ``ids``; positions count only unmasked
        tokens, so left padding (and the padding of a cached prefix) moves no
        RoPE position.
        """
        torch = require("torch", "hf")
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        out = self._call(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        new_cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        if float64:
            return readout_log_probs(out.logits[:, -1, :]), new_cache
        return torch.log_softmax(out.logits[:, -1, :].float(), dim=-1), new_cache

    def _forward_tree(self, tree: TokenTree, keep: Sequence[int], *, use_cache: bool = False) -> Any:
        """float32 log-probs at the nodes ``keep`` of a packed token tree, in one forward pass (:meth:`_tree_logits`).

        With ``use_cache`` it returns ``(log-probs, cache)``: the cache holds every node's keys and values (one
        row, in node order), which :func:`engines.sampling.gather_tree_cache` turns into one row per prompt.
        """
        torch = require("torch", "hf")
        logits, cache = self._tree_logits(tree, keep, use_cache=use_cache)
        lp = torch.log_softmax(logits, dim=-1)
        if not use_cache:
            return lp
        return lp, cache

    def _tree_logits(self, tree: TokenTree, keep: Sequence[int], *, use_cache: bool = False) -> tuple[Any, Any]:
        """float32 logits at the nodes ``keep`` of a packed token tree, in one forward pass, and with ``use_cache``
        its cache (else None)."""
        torch = require("torch", "hf")
        dev = self.device
        # an additive float mask: eager attention adds it to the scores, and SDPA takes it without converting
        dtype = next(self.model.parameters()).dtype
        allowed = tree_mask(tree, dev)[None, None]
        mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill_(~allowed, torch.finfo(dtype).min)
        out = self._call(
            input_ids=torch.tensor([tree.tokens], device=dev),
            attention_mask=mask,
            position_ids=torch.tensor([tree.depth], device=dev),
            use_cache=use_cache,
            logits_to_keep=torch.tensor(keep, device=self._hidden_device()),
        )
        if not use_cache:
            return out.logits[0].float(), None
        return out.logits[0].float(), getattr(out, "cache", None) or getattr(out, "past_key_values", None)

    def _hidden_device(self) -> Any:
        """The device of the last hidden state, which ``logits_to_keep`` indexes before the head.

        The embeddings' device on a model in one place; on a split model the CPU, because a CPU index can index a
        tensor on any device (a CUDA index cannot index another device's tensor) and the final norm's device is
        not known in general.
        """
        return "cpu" if self._is_split() else self.device

    def _is_split(self) -> bool:
        """Whether the weights live on more than one device (worked out at the first forward that asks)."""
        if self._split is None:
            self._split = len({p.device for p in self.model.parameters()}) > 1
        return self._split

    def readout_path(self) -> str:
        """The readout path this engine takes on this model (``settings.readout_path`` with auto resolved).

        auto = tree where the model allows it; otherwise branch on a CPU and
        plain on an accelerator. The branch path runs one forward per distinct
        suffix length, and on a GPU, where a small forward costs its kernel
        launches rather than its FLOPs, that measured slower than plain
        (docs/speed.md); on a CPU the tokens it saves are the time it saves.
        """
        if self._resolved_path is None:
            fallback = "branch" if self.device.type == "cpu" else "plain"
            self._resolved_path = self._tree_where_possible("readout_path", fallback, ("branch", "plain"))
        return self._resolved_path

    def _tree_where_possible(self, setting: str, fallback: str, others: tuple[str, str]) -> str:
        """``settings.<setting>`` with auto resolved: tree where the model allows it, else ``fallback``.

        Asking for tree on a model that cannot take it is an error naming the reason and the other paths.
        """
        want = getattr(self.settings, setting)
        if want not in ("auto", "tree"):
            return str(want)
        why = self._tree_unsupported()
        if why and want == "tree":
            raise ValueError(
                f"{setting}='tree' cannot run on model {self.settings.model!r}: {why}; "
                f"use {setting}='{others[0]}' or '{others[1]}' (or auto, which picks one)"
            )
        return "tree" if not why else fallback

    def _tree_unsupported(self) -> str | None:
        """Why one tree-masked forward would not compute what separate forwards compute (None if it would).

        The tree mask replaces causal attention over the past, so every layer
        that carries state must be plain full attention: a recurrent (Mamba)
        state or a sliding window would see the packed siblings.
        """
        transformers = require("transformers", "hf")
        config = self.model.config
        impl = getattr(config, "_attn_implementation", None)
        if impl not in ("sdpa", "eager"):
            return f"its attention implementation {impl!r} takes no custom attention mask"
        kinds = {type(layer).__name__ for layer in transformers.DynamicCache(config=config).layers}
        if not kinds <= {"DynamicLayer", "DummyLayer"}:
            return f"it has layers that are not full attention ({', '.join(sorted(kinds - {'DynamicLayer', 'DummyLayer'}))})"
        return None

    # -------------------------------------------------------------- readouts
    def sample_next(self, trials: Sequence[Trial]) -> None:
        """Say that ``sample()`` on these trials comes right after the next ``readout()`` (the runner does so).

        On the tree path, outside think mode, that readout then keeps the KV
        cache of the trees holding these prompts, and the sample draws from it
        instead of computing the prompts again (speed only; the next readout
        or sample call drops it).
        """
        self._expect = {self.render(t) for t in trials} if not self.settings.think else set()

    def readout(self, trials: Sequence[Trial], progress: ProgressFn | None = None) -> list[Readout]:
        """The answer-slot distribution of each trial, in input order.

        In think mode the reasoning of every trial is generated together
        (refilled: :meth:`_reasoned`), and the slots are read ``batch_size``
        trials at a time as their traces end, so progress is reported as it goes.
        """
        if not trials:
            return []
        torch = require("torch", "hf")
        s = self.settings
        for t in trials:  # fail on a bad option before spending any compute
            self.option_ids(t)
        path = self.readout_path()
        self._kept = {}
        if path != "tree":
            self._expect = set()
        read = {"tree": self._readout_tree, "branch": self._readout_branch, "plain": self._readout_plain}[path]
        results: list[Readout | None] = [None] * len(trials)

        def read_slots(group: Sequence[int], prepared: Sequence[Prepared]) -> None:
            for batch in self._batches([trials[i] for i in group], prepared, path):
                rows = [group[j] for j in batch]
                outs = read([trials[i] for i in rows], [prepared[j] for j in batch])
                for i, r in zip(rows, outs, strict=True):
                    results[i] = r
                if progress:
                    progress(len(batch))

        with torch.inference_mode():
            if not s.think:
                read_slots(range(len(trials)), self.prepare(trials))
            else:  # slots are read batch_size traces at a time, as traces end
                request = self.think_request(trials)
                reasoned = self._reasoned(request)
                while ready := list(itertools.islice(reasoned, s.batch_size)):
                    group = [i for i, _ in ready]
                    read_slots(group, self.with_reasoning(request, [trials[i] for i in group], [g for _, g in ready]))
        return [r for r in results if r is not None]

    def _batches(self, trials: Sequence[Trial], prepared: Sequence[Prepared], path: str) -> list[list[int]]:
        """Indices per forward batch: length buckets (plain), or runs of sorted prompts so shared prefixes meet.

        The sort key is the prompt ids, then the options and the trial id, so
        the batches (and so the float rounding) do not depend on input order.
        """
        s = self.settings
        if path == "plain":
            return length_batches([len(p.ids) for p in prepared], s.batch_size, s.max_batch_tokens)
        order = sorted(range(len(prepared)), key=lambda i: (prepared[i].ids, prepared[i].options, trials[i].trial_id))
        ids = [prepared[i].ids for i in order]
        if path == "tree":  # option prefixes are packed too: a trie's internal nodes, less the root
            extra = [len(build_trie(prepared[i].options)) - 1 for i in order]
            cap = s.tree_tokens
        else:
            extra, cap = [0] * len(order), s.max_batch_tokens
        rows = token_rows([len(x) for x in ids], shared_prefix_lengths(ids), extra, cap, s.batch_size)
        return [[order[j] for j in row] for row in rows]

    def _readout_tree(self, trials: Sequence[Trial], prepared: Sequence[Prepared]) -> list[Readout]:
        """One forward over the batch's token tree: every prompt and option prefix, each shared token once."""
        torch = require("torch", "hf")
        tries = [build_trie(p.options) for p in prepared]
        seqs: list[tuple[int, ...]] = []
        asks: list[tuple[int, Prefix]] = []  # (trial, trie node) per sequence: the prompt, then the option prefix
        for b, (p, trie) in enumerate(zip(prepared, tries, strict=True)):
            for node in trie:
                seqs.append(p.ids + node)
                asks.append((b, node))
        tree = pack_tree(seqs)
        keep = sorted(set(tree.ends))
        row = {node: r for r, node in enumerate(keep)}
        wanted = [k for k, (b, node) in enumerate(asks) if node == () and prepared[b].ids in self._expect]
        logits, cache = self._tree_logits(tree, keep, use_cache=bool(wanted))
        lp = readout_log_probs(logits)
        if wanted:  # a sample() of these prompts follows: keep the tree's cache for it (sample_next), and the
            # float32 log-probs its draws start from, as the draws' own prefill computes them (:meth:`_forward_tree`)
            drawn = torch.log_softmax(logits, dim=-1)
            paths = tree_paths(tree)
            for k in wanted:
                self._kept[prepared[asks[k][0]].ids] = (cache, paths[k], drawn[row[tree.ends[k]]])
        cond = self._conditionals(lp, [(row[e], b, node) for e, (b, node) in zip(tree.ends, asks, strict=True)], tries)
        roots = lp[[row[e] for e, (_, node) in zip(tree.ends, asks, strict=True) if node == ()]]
        computed = [0] * len(prepared)  # the nodes each trial's sequences added (the first sharer pays the prefix)
        added = [0] * len(tree.shared)
        for k in tree.owner:
            added[k] += 1
        for k, n in enumerate(added):
            computed[asks[tree.first[k]][0]] += n
        return self._finish(trials, prepared, tries, cond, roots, computed)

    def _readout_branch(self, trials: Sequence[Trial], prepared: Sequence[Prepared]) -> list[Readout]:
        """Shared prefixes once, their cache gathered per trial, suffixes of equal length together, then the trie."""
        torch = require("torch", "hf")
        tries = [build_trie(p.options) for p in prepared]
        groups = prefix_groups([p.ids for p in prepared])
        if all(n == 0 for n, _ in groups):  # one-token prompts: nothing to share
            return self._readout_plain(trials, prepared)
        ids, mask = self._pad_left([prepared[members[0]].ids[:n] for n, members in groups])
        _, cache = self._forward(ids, mask, None)
        computed = [0] * len(prepared)
        by_length: dict[int, list[tuple[int, int]]] = {}
        for g, (n, members) in enumerate(groups):
            computed[members[0]] += n
            for b in members:
                by_length.setdefault(len(prepared[b].ids) - n, []).append((b, g))
        cond: list[dict[Prefix, dict[int, float]]] = [{} for _ in prepared]
        roots: list[Any] = [None] * len(prepared)
        for k, (length, pairs) in enumerate(sorted(by_length.items())):
            branch = cache if k == len(by_length) - 1 else copy.deepcopy(cache)
            idx = torch.tensor([g for _, g in pairs], device=mask.device)
            branch.reorder_cache(idx)
            sub_mask = torch.cat([mask[idx], mask.new_ones((len(pairs), length))], dim=1)
            suffix = torch.tensor([prepared[b].ids[groups[g][0] :] for b, g in pairs], device=mask.device)
            lp, branch = self._forward(suffix, sub_mask, branch, float64=True)
            members = [b for b, _ in pairs]
            sub_cond, expanded = self._expand(lp, branch, sub_mask, [tries[b] for b in members])
            for j, b in enumerate(members):
                cond[b], roots[b] = sub_cond[j], lp[j]
                computed[b] += length + expanded[j]
        return self._finish(trials, prepared, tries, cond, torch.stack(roots), computed)

    def _readout_plain(self, trials: Sequence[Trial], prepared: Sequence[Prepared]) -> list[Readout]:
        """Every prompt whole (left-padded), then the trie one token per step on its cache."""
        ids, mask = self._pad_left([p.ids for p in prepared])
        root_lp, cache = self._forward(ids, mask, None, float64=True)
        tries = [build_trie(p.options) for p in prepared]
        cond, expanded = self._expand(root_lp, cache, mask, tries)
        computed = [len(p.ids) + e for p, e in zip(prepared, expanded, strict=True)]
        return self._finish(trials, prepared, tries, cond, root_lp, computed)

    def _expand(
        self, root_lp: Any, cache: Any, mask: Any, tries: Sequence[Trie]
    ) -> tuple[list[dict[Prefix, dict[int, float]]], list[int]]:
        """Conditionals at every internal trie node, breadth-first, one token per step on the prompts' cache.

        Row r of the cache (and of ``root_lp``) is the prompt of ``tries[r]``;
        each step gathers one cache row per node to expand (all trials at once).
        Returns the conditionals and the nodes expanded per trial.
        """
        torch = require("torch", "hf")
        cond = self._conditionals(root_lp, [(b, b, ()) for b in range(len(tries))], tries)
        expanded = [0] * len(tries)
        rows: list[tuple[int, Prefix]] = [(b, ()) for b in range(len(tries))]
        while True:
            nxt = [(r, b, (*p, t)) for r, (b, p) in enumerate(rows) for t in tries[b][p] if (*p, t) in tries[b]]
            if not nxt:
                break
            idx = torch.tensor([r for r, _, _ in nxt], device=mask.device)
            cache.reorder_cache(idx)
            mask = torch.cat([mask[idx], mask.new_ones((len(nxt), 1))], dim=1)
            step = torch.tensor([[p[-1]] for _, _, p in nxt], device=mask.device)
            lp, cache = self._forward(step, mask, cache, float64=True)
            for b, found in enumerate(self._conditionals(lp, [(r, b, p) for r, (_, b, p) in enumerate(nxt)], tries)):
                cond[b].update(found)
            for _, b, _ in nxt:
                expanded[b] += 1
            rows = [(b, p) for _, b, p in nxt]
        return cond, expanded

    @staticmethod
    def _conditionals(
        lp: Any, asks: Sequence[tuple[int, int, Prefix]], tries: Sequence[Trie]
    ) -> list[dict[Prefix, dict[int, float]]]:
        """``cond[b][node][t] = lp[row, t]`` for each ask (row, trial b, trie node) and child t, in one gather."""
        torch = require("torch", "hf")
        rows = [r for r, b, node in asks for _ in tries[b][node]]
        toks = [t for _, b, node in asks for t in tries[b][node]]
        vals = lp[torch.tensor(rows, device=lp.device), torch.tensor(toks, device=lp.device)].tolist()
        cond: list[dict[Prefix, dict[int, float]]] = [{} for _ in tries]
        i = 0
        for _, b, node in asks:
            kids = tries[b][node]
            cond[b][node] = dict(zip(kids, vals[i : i + len(kids)], strict=True))
            i += len(kids)
        return cond

    def _finish(
        self,
        trials: Sequence[Trial],
        prepared: Sequence[Prepared],
        tries: Sequence[Trie],
        cond: Sequence[dict[Prefix, dict[int, float]]],
        roots: Any,
        computed: Sequence[int],
    ) -> list[Readout]:
        others = self._top_other(roots, tries)
        return [
            slot_readout(t, p, trie, c, top_other=o, computed=n)
            for t, p, trie, c, o, n in zip(trials, prepared, tries, cond, others, computed, strict=True)
        ]

    def _top_other(self, roots: Any, tries: Sequence[Trie]) -> list[tuple[tuple[str, float], ...]]:
        """The most likely first tokens that start no option, per trial (one top-k over the batch)."""
        torch = require("torch", "hf")
        k = self.settings.top_other
        if not k:
            return [() for _ in tries]
        masked = roots.clone()
        rows = [b for b, trie in enumerate(tries) for _ in trie[()]]
        cols = [t for trie in tries for t in trie[()]]
        masked[torch.tensor(rows, device=roots.device), torch.tensor(cols, device=roots.device)] = -math.inf
        vals, idx = torch.topk(masked, k, dim=-1)
        return [
            tuple((self._token_text(i), math.exp(v)) for v, i in zip(vr, ir, strict=True))
            for vr, ir in zip(vals.tolist(), idx.tolist(), strict=True)
        ]

    # -------------------------------------------------------------- sampling
    def _reason(self, request: ThinkRequest) -> list[list[int]]:
        """The reasoning of think mode, each trial's trace in request order (:meth:`_reasoned`)."""
        out: list[list[int]] = [[] for _ in request.prompts]
        for i, gen in self._reasoned(request):
            out[i] = gen
        return out

    def _reasoned(self, request: ThinkRequest) -> Iterator[tuple[int, list[int]]]:
        """``(trial, trace)`` for each trial of ``request`` as its trace ends: greedy, or (``think_temperature`` >
        0) sampled with top-p / top-k, each trial from its own seeded generator.

        Refilled (:mod:`engines.refill`) where the model's cache can be stacked, else in fixed length buckets;
        the run's tally goes to :meth:`run_stats`.
        """
        torch = require("torch", "hf")
        if not request.prompts:
            return
        longest = max(len(p) for p in request.prompts)
        rows = self.settings.reasoning_rows or self._reasoning_rows(longest + request.budget)
        stats = ReasoningStats(rows=rows, schedule=self._schedule())
        decode = self._reason_buckets if stats.schedule == "buckets" else self._reason_refill
        try:
            with torch.inference_mode():
                for i, gen in decode(request, rows, stats):
                    stats.took(gen)
                    yield i, gen
        finally:
            self._reasoning.add(stats)

    def _refills(self) -> bool:
        """Whether think mode refills finished rows: asked for (``reasoning_refill``) and the model's cache made of
        plain attention layers (:func:`engines.refill.unstackable`; a Mamba hybrid reasons in buckets)."""
        if not self.settings.reasoning_refill:
            return False
        return unstackable(self.model.config) is None

    def _schedule(self) -> str:
        """How think mode decodes: ``slots`` (refilled, in steps of fixed shape: ``decode_graphs`` on,
        :meth:`_decode_slots`), ``refill`` (:meth:`_decode_refilled`) or ``buckets`` (:meth:`_reason_buckets`)."""
        if not self._refills():
            return "buckets"
        return "slots" if self.settings.decode_graphs == "on" else "refill"

    def _refilled_decoder(self) -> Callable[..., Iterator[tuple[int, list[int]]]]:
        """The refilled decoding of this engine's schedule: :meth:`_decode_slots` or :meth:`_decode_refilled`."""
        return self._decode_slots if self._schedule() == "slots" else self._decode_refilled

    def _slot_decoder(self, rows: int, capacity: int) -> SlotDecoder:
        """Slots for ``rows`` traces of ``capacity`` columns, stepping this engine's model (:meth:`_call`), recorded
        as :meth:`_capture_mode` says."""
        return SlotDecoder(
            self._call,
            self.model.config,
            rows,
            capacity,
            self.device,
            capture=self._capture_mode(),
            cache_kw=self._cache_kw,
        )

    def _capture_mode(self) -> str | None:
        """How slot steps are recorded (:class:`engines.graphs.SlotDecoder`): ``cuda`` on one GPU, else None (a
        CPU's or a split model's steps run unrecorded; tests ask for ``fx`` by patching this)."""
        return "cuda" if self.device.type == "cuda" and not self._is_split() else None

    def _sampler(self, request: ThinkRequest, trials: Sequence[int]) -> RowSampler:
        s = self.settings
        seeds = [request.seeds[i] for i in trials]
        return RowSampler(seeds, s.think_temperature, top_p=s.think_top_p, top_k=s.think_top_k)

    def _reason_buckets(
        self, request: ThinkRequest, rows: int, stats: ReasoningStats
    ) -> Iterator[tuple[int, list[int]]]:
        """Whole length buckets of ``rows`` traces, each decoded until its longest trace ends; every row of a
        bucket stays in it to the end, so a row's logits never depend on when its neighbours stopped."""
        torch = require("torch", "hf")
        s = self.settings
        prompts, max_new, stops = request.prompts, request.budget, request.ends
        longest = max(len(p) for p in prompts)
        limit = s.max_batch_tokens if rows <= s.batch_size else max(s.max_batch_tokens, rows * longest)
        for batch in length_batches([len(p) for p in prompts], rows, limit):
            out: list[list[int]] = [[] for _ in batch]
            ids, mask = self._pad_left([prompts[i] for i in batch])
            lp, cache = self._forward(ids, mask, None)
            stats.prefills += 1
            done = [False] * len(batch)
            sampler = self._sampler(request, batch)
            for step in range(max_new):
                nxt = sampler.draw(lp)
                toks = nxt.tolist()
                for r in range(len(batch)):
                    if not done[r]:
                        out[r].append(toks[r])
                        done[r] = toks[r] in stops
                if all(done) or step == max_new - 1:
                    break
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                lp, cache = self._forward(nxt[:, None], mask, cache)
                stats.steps += 1
                stats.step_rows += len(batch)
                stats.finished_step_rows += sum(done)
            yield from zip(batch, out, strict=True)

    def _reason_refill(
        self, request: ThinkRequest, rows: int, stats: ReasoningStats
    ) -> Iterator[tuple[int, list[int]]]:
        """Up to ``rows`` traces at once, a finished row given to the next waiting trial
        (:meth:`_decode_refilled`)."""
        yield from self._refilled_decoder()(
            request.prompts, lambda run: self._sampler(request, run), request.budget, request.ends, rows, stats
        )

    def _decode_refilled(
        self,
        prompts: Sequence[tuple[int, ...]],
        sampler_of: Callable[[Sequence[int]], RowSampler],
        budget: int,
        ends: set[int] | frozenset[int],
        rows: int,
        stats: ReasoningStats,
    ) -> Iterator[tuple[int, list[int]]]:
        """``(index, tokens)`` for each of ``prompts`` as its generation ends (at one of ``ends``, kept, or at
        ``budget`` tokens), up to ``rows`` at once, a finished row given to the next waiting prompt
        (:mod:`engines.refill`): think mode's reasoning, and its draws.

        Prompts are admitted in order; an admitted group is prefilled on its own (each distinct prompt once, in runs
        of at most ``max_batch_tokens`` padded tokens), its first tokens drawn from that prefill by
        ``sampler_of(indices)`` (one seeded generator per row), and its cache stacked under the rows that go on
        (:func:`engines.refill.stacked`).
        """
        torch = require("torch", "hf")
        plan = Schedule(range(len(prompts)), rows)
        gens: dict[int, list[int]] = {}
        cache: Any = None
        mask: Any = None
        nxt: Any = None
        sampler = sampler_of([])

        def took(i: int, token: int) -> bool:
            """Append ``token`` to generation ``i``; whether it ended."""
            gens[i].append(token)
            return token in ends or len(gens[i]) >= budget

        while plan.live or plan.waiting:
            if plan.compacts():
                keep, admit = plan.compact()
                parts: list[tuple[Any, Any, Any]] = [(cache, mask, keep)] if keep else []
                firsts = [nxt[torch.tensor(keep, device=nxt.device)]] if keep else []
                sampler.keep(keep)
                for run in self._admission_runs(prompts, admit):
                    distinct = list(dict.fromkeys(prompts[i] for i in run))  # the n draws of a prompt: once
                    ids, m = self._pad_left(distinct)
                    lp, c = self._forward(ids, m, None)
                    stats.prefills += 1
                    if len(distinct) < len(run):
                        where = {p: k for k, p in enumerate(distinct)}
                        idx = torch.tensor([where[prompts[i]] for i in run], device=m.device)
                        c.reorder_cache(idx)
                        lp, m = lp[idx.to(lp.device)], m[idx]
                    new = sampler_of(run)
                    first = new.draw(lp)
                    sampler.extend(new)
                    parts.append((c, m, None))
                    firsts.append(first)
                    for i, t in zip(run, first.tolist(), strict=True):
                        gens[i] = []
                        if took(i, t):
                            plan.end(i)
                            yield i, gens.pop(i)
                cache, mask = stacked(parts, budget, self.model.config)
                nxt = torch.cat(firsts)
                if not plan.live:
                    continue
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            lp, cache = self._forward(nxt[:, None], mask, cache)
            stats.steps += 1
            stats.step_rows += len(plan.slots)
            stats.finished_step_rows += len(plan.finished)
            nxt = sampler.draw(lp)
            for i, t in zip(plan.slots, nxt.tolist(), strict=True):
                if i not in plan.finished and took(i, t):
                    plan.end(i)
                    yield i, gens.pop(i)

    def _admission_runs(self, prompts: Sequence[tuple[int, ...]], admit: list[int]) -> list[list[int]]:
        """The prefill runs of the admitted prompts ``admit``, in order: each cut before the prompt whose padded
        tokens would pass ``max_batch_tokens``."""
        most = self.settings.max_batch_tokens

        def fits(run: list[int], i: int) -> int:
            width = max(len(prompts[j]) for j in (*run, i))
            return len(run) if (len(run) + 1) * width > most else 0

        return cut_runs(admit, fits)

    def _decode_slots(
        self,
        prompts: Sequence[tuple[int, ...]],
        sampler_of: Callable[[Sequence[int]], RowSampler],
        budget: int,
        ends: set[int] | frozenset[int],
        rows: int,
        stats: ReasoningStats,
    ) -> Iterator[tuple[int, list[int]]]:
        """What :meth:`_decode_refilled` yields, in the same schedule, decoded in ``rows`` slots of fixed shape
        (:mod:`engines.graphs`), each step recorded in a CUDA graph where :meth:`_capture_mode` says so.

        A trace keeps its slot from admission to its end (or until the last traces move to the front:
        :meth:`engines.graphs.SlotDecoder.shrink`); admitted traces are prefilled as in :meth:`_decode_refilled` and
        copied into the free slots (lowest first); a step computes every slot of the current size (a free one on
        whatever it last held), and only the live slots draw, each from its own generator.
        """
        torch = require("torch", "hf")
        plan = Schedule(range(len(prompts)), rows)
        capacity = max(len(p) for p in prompts) + budget
        dec = self._slot_decoder(rows, capacity)
        gens: dict[int, list[int]] = {}
        slot_of: dict[int, int] = {}  # trial -> its slot, while it reasons
        live: list[int] = []  # the reasoning trials, in the order of the sampler's rows
        tokens, lengths = [0] * rows, [0] * rows
        sampler = sampler_of([])

        def took(i: int, token: int) -> bool:
            gens[i].append(token)
            return token in ends or len(gens[i]) >= budget

        def ended(i: int) -> tuple[int, list[int]]:
            plan.end(i)
            del slot_of[i]
            return i, gens.pop(i)

        try:
            while plan.live or plan.waiting:
                if plan.compacts():
                    _, admit = plan.compact()
                    free = iter(sorted(set(range(rows)) - set(slot_of.values())))
                    for run in self._admission_runs(prompts, admit):
                        distinct = list(dict.fromkeys(prompts[i] for i in run))
                        where = {p: k for k, p in enumerate(distinct)}
                        ids, m = self._pad_left(distinct)
                        lp, c = self._forward(ids, m, None)
                        stats.prefills += 1
                        idx = torch.tensor([where[prompts[i]] for i in run], device=lp.device)
                        new = sampler_of(run)
                        first = new.draw(lp[idx]).tolist()
                        going = []
                        for k, (i, t) in enumerate(zip(run, first, strict=True)):
                            gens[i] = []
                            if took(i, t):
                                plan.end(i)
                                yield i, gens.pop(i)
                                continue
                            slot = next(free)
                            dec.admit(slot, c, where[prompts[i]], len(prompts[i]), t)
                            slot_of[i] = slot
                            tokens[slot], lengths[slot] = t, len(prompts[i])
                            going.append(k)
                        new.keep(going)
                        sampler.extend(new)
                        live += [run[k] for k in going]
                    if not live:
                        continue
                dec.set_inputs(tokens, lengths)
                span = span_of(max(lengths[slot_of[i]] for i in live) + 1, capacity)
                lp = dec.step(span)
                stats.steps += 1
                stats.step_rows += dec.size
                stats.finished_step_rows += dec.size - len(live)
                order = torch.tensor([slot_of[i] for i in live], device=lp.device)
                drawn = sampler.draw(lp[order]).tolist()
                going = []
                for k, (i, t) in enumerate(zip(live, drawn, strict=True)):
                    slot = slot_of[i]
                    tokens[slot], lengths[slot] = t, lengths[slot] + 1
                    if took(i, t):
                        yield ended(i)
                    else:
                        going.append(k)
                if len(going) < len(live):
                    sampler.keep(going)
                    live = [live[k] for k in going]
                    if live and not plan.waiting and len(live) <= dec.size // 2:  # the last traces: fewer slots
                        moved = [slot_of[i] for i in live]
                        dec.shrink(moved, max(lengths[m] for m in moved))
                        tokens[: len(moved)] = [tokens[m] for m in moved]
                        lengths[: len(moved)] = [lengths[m] for m in moved]
                        slot_of.update({i: k for k, i in enumerate(live)})
        finally:
            stats.graphs += len(dec.graphs)
            stats.capture_s += dec.capture_s
            stats.graphs_failed = dec.failed or stats.graphs_failed

    def _reasoning_rows(self, tokens: int) -> int:
        """How many traces to reason at once: ``batch_size`` on a CPU; on a GPU as many as half its free memory
        holds KV cache for (:func:`reasoning_rows`), because a decoding step costs about the same for 16 rows as
        for hundreds there."""
        torch = require("torch", "hf")
        dev = self.device
        if dev.type != "cuda":
            return self.settings.batch_size
        free, _ = torch.cuda.mem_get_info(dev)
        return reasoning_rows(free, kv_bytes_per_token(self.model), tokens, self.settings.batch_size)

    @property
    def reply_rows(self) -> int:
        """How many free-text reply rows the runner should hand over at once (``settings.sample_rows``; the engine
        cuts them into batches that also respect ``sample_cache_tokens``)."""
        return self.settings.sample_rows

    def sample_path(self) -> str:
        """The sampling path this engine takes (``settings.sample_path`` with auto resolved: tree where the model
        allows it, else shared)."""
        return self._tree_where_possible("sample_path", "shared", ("shared", "plain"))

    def _sample(self, trials: Sequence[Trial], draws: Draws, progress: ProgressFn | None) -> list[Sample]:
        """``n`` raw samples per trial at ``temperature`` (no top-k/top-p), parsed; trial-major order.

        ``Sample.replicate`` is the draw index 0..n-1; draw d of a trial is
        drawn from its own generator seeded by (seed, trial id, d), so it does
        not depend on the batch, the path or the other trials. In think mode
        the model reasons and answers freely, so an assistant prefix is not
        forced. ``stop_at_answer`` (forced-answer trials): replies are parsed
        up to their answer end (:func:`probe.parse.answer_end`), and outside
        think mode a draw stops there (:func:`probe.parse.answer_scan`), which
        changes no parse; free-text replies get their whole budget.
        """
        draws.check()
        n, temperature = draws.n, draws.temperature
        torch = require("torch", "hf")
        budget = self._reply_budget(draws)
        stops = self._stop_ids()
        answer_stop = draws.stop_at_answer and not self.settings.think
        rows = [
            _Draw(
                r.trial,
                r.draw,
                r.prompt,
                r.seed,
                tuple(trials[r.trial].options) if answer_stop else None,
                trials[r.trial].assistant_prefix,
            )
            for r in self._seeded_rows(trials, n)
        ]
        gens: list[list[int]] = [[] for _ in rows]
        path = self.sample_path()
        kept, self._kept, self._expect = self._kept, {}, set()
        if path == "tree" and all(r.prompt in kept for r in rows):
            path = "kept"  # the readout just computed these prompts (sample_next): draw from its caches
        with torch.inference_mode():
            if self.settings.think and self._refills():  # reasoning, then the answer: lengths differ most
                gens = self._draw_refilled(rows, budget, stops, temperature, progress)
            else:
                for batch, lp, cache, mask in self._sample_prefills(rows, n, path, budget, kept):
                    with self._grouped_attention(cache):
                        drawn = self._draw_rows([rows[r] for r in batch], lp, cache, mask, budget, stops, temperature)
                    for r, gen in zip(batch, drawn, strict=True):
                        gens[r] = gen
                    if progress:
                        progress(len(batch))
        return [
            self._parsed_reply(
                trials[row.trial],
                row,
                gen,
                stops,
                truncated=len(gen) >= budget and gen[-1] not in stops,  # ran out of tokens, not ended by the model
                stop_at_answer=draws.stop_at_answer,
            )
            for row, gen in zip(rows, gens, strict=True)
        ]

    def _draw_refilled(
        self, rows: Sequence[_Draw], budget: int, stops: set[int], temperature: float, progress: ProgressFn | None
    ) -> list[list[int]]:
        """Think mode's draws, refilled (:meth:`_decode_refilled`): up to ``sample_rows`` draws at once (and as
        many as ``sample_cache_tokens`` holds at prompt + budget each), a finished draw's row given to the next;
        each draw from its own generator, so it draws what it draws in a length batch. The tally goes to
        :meth:`run_stats` (``think_draws``)."""
        s = self.settings
        longest = max((len(r.prompt) for r in rows), default=0)
        capacity = max(1, min(s.sample_rows, s.sample_cache_tokens // (longest + budget)))
        stats = ReasoningStats(rows=capacity, schedule=self._schedule())
        gens: list[list[int]] = [[] for _ in rows]
        prompts = [r.prompt for r in rows]
        try:
            for i, gen in self._refilled_decoder()(
                prompts,
                lambda run: RowSampler([rows[j].seed for j in run], temperature),
                budget,
                stops,
                capacity,
                stats,
            ):
                stats.took(gen)
                gens[i] = gen
                if progress:
                    progress(1)
        finally:
            self._drawing.add(stats)
        return gens

    def _sample_prefills(
        self, rows: Sequence[_Draw], n: int, path: str, budget: int, kept: dict[tuple[int, ...], Any] | None = None
    ) -> Any:
        """Yield ``(row indices, last log-probs, cache, mask)`` per decoding batch, the prompts already computed.

        tree: a batch's distinct prompts are packed as one token tree (each
        shared prefix once) and its cache is gathered into one row per draw.
        shared: each distinct prompt once (left-padded), its cache row repeated
        per draw. plain: every draw's prompt on its own row.
        """
        torch = require("torch", "hf")
        s = self.settings
        if not rows:
            return
        if path == "plain":
            longest = max(len(r.prompt) for r in rows)
            most = balanced(len(rows), max(1, min(s.sample_rows, s.sample_cache_tokens // (longest + budget))))
            for batch in length_batches([len(r.prompt) for r in rows], most, s.max_batch_tokens):
                ids, mask = self._pad_left([rows[i].prompt for i in batch])
                lp, cache = self._forward(ids, mask, None)
                yield batch, lp, reserve_cache(cache, budget), mask
            return
        # rows are trial-major, n per trial: row k * n + d is draw d of trial k
        prompts = [rows[k * n].prompt for k in range(len(rows) // n)]
        share = self._groups_draws(n)
        longest = max(len(p) for p in prompts)
        held = longest + n * budget if share else n * (longest + budget)  # cache tokens of one trial's draws
        per = balanced(len(prompts), max(1, min(s.sample_rows // n, s.sample_cache_tokens // held)))
        if path == "shared":
            for chunk in length_batches([len(p) for p in prompts], per, s.max_batch_tokens):
                ids, mask = self._pad_left([prompts[k] for k in chunk])
                lp, cache = self._forward(ids, mask, None)
                idx = torch.arange(len(chunk), device=mask.device).repeat_interleave(n)
                grouped = group_cache(cache, mask, n, budget) if share else None
                if grouped is None:
                    cache.reorder_cache(idx)
                    grouped = reserve_cache(cache, budget)
                # lp lives where the head is, mask where the embeddings are: on a split model, two devices
                yield [k * n + d for k in chunk for d in range(n)], lp[idx.to(lp.device)], grouped, mask[idx]
            return
        if path == "kept":  # the readout's trees (sample_next): prompts of one tree together, per batch
            assert kept is not None
            tree_of: dict[int, int] = {}
            for k in range(len(prompts)):
                tree_of.setdefault(id(kept[prompts[k]][0]), len(tree_of))
            order = sorted(range(len(prompts)), key=lambda k: (tree_of[id(kept[prompts[k]][0])], k))
            for lo in range(0, len(order), per):
                chunk = order[lo : lo + per]
                caches: list[Any] = []
                paths: list[list[list[int]]] = []
                for k in chunk:
                    cache, node_path, _ = kept[prompts[k]]
                    if not caches or caches[-1] is not cache:
                        caches.append(cache)
                        paths.append([])
                    paths[-1].append(node_path)
                merged, mask = gather_tree_cache(caches, paths, n, budget, self.model.config, grouped=share)
                lps = torch.stack([kept[prompts[k]][2] for k in chunk]).repeat_interleave(n, dim=0)
                yield [k * n + d for k in chunk for d in range(n)], lps, merged, mask
            return
        order = sorted(range(len(prompts)), key=lambda k: (prompts[k], k))  # shared prefixes adjacent
        sorted_ids = [prompts[k] for k in order]
        trees = token_rows(
            [len(p) for p in sorted_ids], shared_prefix_lengths(sorted_ids), [0] * len(order), s.tree_tokens, per
        )
        for group in _fill(trees, per):  # several trees per decoding batch, up to per trials
            chunk = [order[j] for tree_rows in group for j in tree_rows]
            lps, caches, paths = [], [], []
            for tree_rows in group:
                tree = pack_tree([sorted_ids[j] for j in tree_rows])
                ends = sorted(set(tree.ends))
                lp, cache = self._forward_tree(tree, ends, use_cache=True)
                at = {node: r for r, node in enumerate(ends)}
                lps.append(lp[[at[e] for e in tree.ends]])
                caches.append(cache)
                paths.append(tree_paths(tree))
            merged, mask = gather_tree_cache(caches, paths, n, budget, self.model.config, grouped=share)
            yield [k * n + d for k in chunk for d in range(n)], torch.cat(lps).repeat_interleave(n, dim=0), merged, mask

    def _groups_draws(self, n: int) -> bool:
        """Whether the n draws of a prompt share its cache rows (:func:`engines.sampling.group_cache`)."""
        impl = getattr(self.model.config, "_attn_implementation", None)
        return self.settings.group_draws and n >= GROUP_FROM and impl in ("sdpa", "eager")

    @contextlib.contextmanager
    def _grouped_attention(self, cache: Any) -> Iterator[None]:
        """While decoding a grouped cache, the model's attention layers run :func:`engines.sampling.grouped_attention`."""
        from engines.sampling import shared_prompt_layer_class

        config = self.model.config
        if not any(isinstance(layer, shared_prompt_layer_class()) for layer in cache.layers):
            yield
            return
        register_grouped_attention()
        before = config._attn_implementation
        config._attn_implementation = GROUPED_ATTENTION
        try:
            yield
        finally:
            config._attn_implementation = before

    def _draw_rows(
        self,
        rows: Sequence[_Draw],
        lp: Any,
        cache: Any,
        mask: Any,
        budget: int,
        stops: set[int],
        temperature: float,
    ) -> list[list[int]]:
        """Decode every row until it stops (a stop token, its answer over, or ``budget`` tokens).

        Finished rows are dropped from the cache once they are an eighth of
        it, so the batch shrinks as draws end; a dropped row changes nothing
        for the others (their generators and cache rows are their own).
        """
        torch = require("torch", "hf")
        sampler = RowSampler([r.seed for r in rows], temperature)
        gens: list[list[int]] = [[] for _ in rows]
        live = list(range(len(rows)))  # the row of each cache row
        done = [False] * len(rows)
        watch = [r.options is not None for r in rows]
        for step in range(budget):
            nxt = sampler.draw(lp)
            toks = nxt.tolist()
            for j, i in enumerate(live):
                if done[i]:
                    continue
                gens[i].append(toks[j])
                if toks[j] in stops or step == budget - 1:
                    done[i] = True
                elif watch[i]:
                    opts = rows[i].options
                    assert opts is not None
                    text = rows[i].prefix + self.tokenizer.decode(gens[i], skip_special_tokens=False)
                    end, still = answer_scan(split_reasoning(text, think=False)[1], opts)  # answer stops: no think
                    done[i] = end is not None
                    watch[i] = still
            keep = [j for j, i in enumerate(live) if not done[i]]
            if not keep:
                break
            if 8 * (len(live) - len(keep)) >= len(live):
                idx = torch.tensor(keep, device=mask.device)
                cache.reorder_cache(idx)
                mask, nxt = mask[idx], nxt[idx.to(nxt.device)]  # nxt is on the head's device
                sampler.keep(keep)
                live = [live[j] for j in keep]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            lp, cache = self._forward(nxt[:, None], mask, cache)
        return gens
