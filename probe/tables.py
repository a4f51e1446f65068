"""The tables of a run folder, declared once: what the runner writes and what every reader reads.

Each committed chunk holds some of these tables (``results/chunk-NNNNNN.<name>.parquet``,
:mod:`probe.store`). A :class:`Table` names its stored columns in the order they are
written, the columns a reader derives from the trials (``meaning``, ``greedy``, ...)
and the order of the notebook frame (:data:`probe.runs.COLUMNS` is built from here,
and docs/python.md's column table is checked against it). The writers
(:func:`readout_tables`, :func:`sample_table`) build their frames from the same
declaration, so a column added here is written, read and documented, or a test fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, get_args

from probe.receipts import ChunkState
from probe.types import SampleStatus

if TYPE_CHECKING:
    import pandas as pd

    from probe.types import Readout, Sample, Trial

SAMPLE_STATUSES: Final[tuple[str, ...]] = get_args(SampleStatus)
"""How a sampled reply parsed: ``ok`` (an option), ``refusal``, ``invalid`` (no option), ``error`` (no reply)."""
SAMPLE_TABLES: Final[tuple[str, ...]] = ("samples", "generations")
"""Sampled answers to readout trials, and free-text replies to generative trials (one schema, :data:`SAMPLES`)."""

__all__ = [
    "FILTER_KEYS",
    "FRAMES",
    "JUDGMENTS",
    "READOUT_LAYERS",
    "READOUT_OPTIONS",
    "READOUT_TRIALS",
    "RESERVED",
    "SAMPLES",
    "SAMPLE_STATUSES",
    "SAMPLE_TABLES",
    "TRIAL_COLUMNS",
    "Column",
    "Table",
    "TrialData",
    "factor_column",
    "readout_tables",
    "sample_table",
]


@dataclass(frozen=True)
class Column:
    """One column: its name, its pandas dtype in the notebook frames, and what it holds."""

    name: str
    dtype: str
    doc: str


@dataclass(frozen=True)
class Table:
    """One stored table (or, with no ``stored`` columns, a frame made only on reading): ``stored``, the columns
    written, in order (``trial_id`` first); ``derived``, the columns a reader adds from the trials (the option's
    meaning, the greedy flag, ...); ``frame``, the notebook frame's own columns in order (default: the stored ones
    after ``trial_id``, then the derived)."""

    name: str
    stored: tuple[Column, ...]
    derived: tuple[Column, ...] = ()
    frame: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """The stored column names, in the order written."""
        return tuple(c.name for c in self.stored)

    def columns(self) -> dict[str, Column]:
        """Every column of the frame, in frame order."""
        known = {c.name: c for c in (*self.stored, *self.derived)}
        order = self.frame or tuple(n for n in known if n != "trial_id")
        return {n: known[n] for n in order}

    def dtypes(self) -> dict[str, str]:
        """The frame's own columns and their pandas dtypes (one entry of :data:`probe.runs.COLUMNS`)."""
        return {n: c.dtype for n, c in self.columns().items()}

    def write(self, rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
        """The frame the runner commits: one row per mapping, exactly the stored columns, in order."""
        import pandas as pd

        names = self.names
        return pd.DataFrame([{n: r[n] for n in names} for r in rows], columns=list(names))


def columns(text: str) -> tuple[Column, ...]:
    """Columns written as a table, one a line: name, dtype, then what it holds (the rest of the line)."""
    out = []
    for line in text.strip().splitlines():
        name, dtype, doc = line.split(maxsplit=2)
        out.append(Column(name, dtype, doc))
    return tuple(out)


_TRIAL_ID = "trial_id          string    the stable id (hash of experiment, item, factors, salt, replicate)"

TRIAL_COLUMNS: Final[tuple[Column, ...]] = columns(
    f"""
    {_TRIAL_ID}
    position          int64     line of `trials.jsonl` (0-based)
    chunk             int64     the chunk holding the trial's results
    experiment        category  experiment name
    item_id           category  dilemma / item
    replicate         int64     salt replicate
    salt              string    the salt text ("" unsalted)
    assistant_prefix  string    text the reply starts with before the slot
    n_options         int64     printed options
    """
)
"""The columns every notebook frame starts with (read from the trial index, not from a chunk table)."""

READOUT_TRIALS: Final = Table(
    "readout_trials",
    columns(
        f"""
        {_TRIAL_ID}
        coverage          float64   option mass at the slot before normalizing
        greedy_option     string    the most likely option
        prompt_tokens     int64     prompt length in tokens
        computed_tokens   int64     tokens run through the model
        reasoning_tokens  int64     think mode: reasoning length
        hit_budget        bool      think mode: reasoning cut at the budget
        reasoning         string    think mode: the reasoning trace
        top_other         object    list of `[token, prob]`: most likely non-option first tokens
        """
    ),
    derived=columns("greedy_meaning string what it stands for (e.g. `cbr`)"),
    frame=(
        "coverage",
        "greedy_option",
        "greedy_meaning",
        "prompt_tokens",
        "computed_tokens",
        "reasoning_tokens",
        "hit_budget",
        "reasoning",
        "top_other",
    ),
)
"""One row per read trial. ``top_other`` is stored as JSON text and read back as a list."""

READOUT_OPTIONS: Final = Table(
    "readout_options",
    columns(
        f"""
        {_TRIAL_ID}
        option            string    the printed option
        option_index      int64     print position
        n_tokens          int64     tokens of the option at the slot
        logprob           float64   log P(option is the whole answer), raw model
        prob              float64   normalized over the options
        """
    ),
    derived=columns(
        """
        meaning           string    what the option stands for
        greedy            bool      the greedy option
        """
    ),
    frame=("option", "option_index", "meaning", "n_tokens", "logprob", "prob", "greedy"),
)
"""One row per (read trial, option), in print order."""

READOUT_LAYERS: Final = Table(
    "readout_layers",
    columns(
        f"""
        {_TRIAL_ID}
        layer             int64     the layer read: 0 the embeddings, l after block l (`--layers`)
        option            string    the printed option
        option_index      int64     print position
        logprob           float64   log P(option is the whole answer) through the final norm and head at this layer
        prob              float64   normalized over the options at this layer
        layer_coverage    float64   option mass at this layer before normalizing
        layer_greedy      bool      the most likely option at this layer
        """
    ),
    derived=columns("meaning string what the option stands for"),
    frame=("layer", "option", "option_index", "meaning", "logprob", "prob", "layer_coverage", "layer_greedy"),
)
"""One row per (read trial, layer, option) of a run with ``--layers`` (the logit lens, docs/methods.md); a run
without it has no such table. The last layer's rows equal the trial's ``readout_options`` rows."""

SAMPLES: Final = Table(
    "samples",
    columns(
        f"""
        {_TRIAL_ID}
        draw              int64     draw index
        option            string    parsed option (missing: none parsed)
        status            category  `ok`, `refusal`, `invalid`, `error`
        text              string    the reply
        reasoning         string    its reasoning (think mode)
        prompt_tokens     int64     prompt tokens
        completion_tokens int64     reply tokens
        token_ids         object    list of generated ids (local engines)
        truncated         bool      the reply hit the token cap
        """
    ),
    derived=columns(
        """
        source            category  `samples` or `generations`
        meaning           string    what the parsed option stands for
        """
    ),
    frame=(
        "source",
        "draw",
        "option",
        "meaning",
        "status",
        "text",
        "reasoning",
        "prompt_tokens",
        "completion_tokens",
        "truncated",
        "token_ids",
    ),
)
"""One row per sampled reply. The same schema holds the ``samples`` table (draws of readout trials) and the
``generations`` table (free-text replies of generative trials)."""

JUDGMENTS: Final = Table(
    "judgments",
    columns(
        f"""
        {_TRIAL_ID}
        draw              int64     the judged draw
        verdict           string    PRO, ANTI or NONCOMMIT
        p_pro             float64   the judge's probability of PRO
        p_anti            float64   of ANTI
        p_noncommit       float64   of NONCOMMIT
        judge             string    the judge
        """
    ),
)
"""The run's judge on each free-text reply (:mod:`experiments.judge`)."""

CODES: Final = Table(
    "codes",
    (),
    derived=columns(
        """
        task              category  `verdict` or a coding task
        draw              int64     the coded draw (-1: a readout's reasoning)
        label             string    the verdict or code
        p_label           float64   its probability
        probs             object    dict code -> probability
        judge             string    the judge
        status            string    `ok`, or `unparsed`
        """
    ),
)
"""Read only: the run's verdicts (``judgments``) and every ``probe code`` table, in one shape."""

FRAMES: Final[dict[str, Table]] = {
    "readouts": READOUT_TRIALS,
    "options": READOUT_OPTIONS,
    "samples": SAMPLES,
    "codes": CODES,
    "layers": READOUT_LAYERS,
}
"""The notebook frame each table is read into (:class:`probe.runs.Run`)."""


FILTER_KEYS: Final[frozenset[str]] = frozenset({"item", "option", "status", "coverage_below", "disagree", "chunk"})
"""The keys of a trial filter that are not factors (:class:`probe.query.TrialFilter`)."""
RESERVED: Final[frozenset[str]] = frozenset(
    {c.name for t in FRAMES.values() for c in t.columns().values()} | {c.name for c in TRIAL_COLUMNS} | FILTER_KEYS
)
"""Names a factor column may not take (a factor named like one is spread as ``factor_<name>``)."""


def factor_column(name: str) -> str:
    """The column of factor ``name``: its own name, or ``factor_<name>`` where that is a fixed column or a filter
    key (the cue experiment has a factor ``status``, and the samples a column ``status``)."""
    return f"factor_{name}" if name in RESERVED else name


@dataclass(frozen=True)
class TrialData:
    """Everything the run holds for one trial."""

    trial: Trial
    position: int
    chunk: ChunkState
    """Its chunk's state: when not verified, the result frames are empty and ``chunk.reason`` says why."""
    readout: Mapping[str, Any] | None
    """The readout row (coverage, greedy_option, prompt_tokens, reasoning, top_other, ...), None without one."""
    options: pd.DataFrame
    """option, option_index, meaning, n_tokens, logprob, prob, greedy; in print order."""
    samples: pd.DataFrame
    """source, draw, option, status, text, reasoning, prompt_tokens, completion_tokens, truncated, token_ids."""
    codes: pd.DataFrame
    """task, draw, label, p_label, probs, judge, status."""


# ------------------------------------------------------------------ writers
def readout_tables(readouts: Sequence[Readout]) -> dict[str, pd.DataFrame]:
    """The long per-option table and the per-trial table of a list of readouts, and with ``--layers`` the
    per-(trial, layer, option) table."""
    opts = READOUT_OPTIONS.write(
        {
            "trial_id": r.trial_id,
            "option": s.option,
            "option_index": i,
            "n_tokens": len(s.token_ids),
            "logprob": s.logprob,
            "prob": s.prob,
        }
        for r in readouts
        for i, s in enumerate(r.scores)
    )
    trials = READOUT_TRIALS.write(
        {
            "trial_id": r.trial_id,
            "coverage": r.coverage,
            "greedy_option": r.greedy_option,
            "prompt_tokens": r.prompt_tokens,
            "computed_tokens": r.computed_tokens,
            "reasoning_tokens": r.reasoning_tokens,
            "hit_budget": r.hit_budget,
            "reasoning": r.reasoning,
            "top_other": json.dumps(r.top_other, ensure_ascii=False),
        }
        for r in readouts
    )
    out = {READOUT_OPTIONS.name: opts, READOUT_TRIALS.name: trials}
    if any(r.layers for r in readouts):  # --layers: a table of its own, so a run without it is written as before
        out[READOUT_LAYERS.name] = READOUT_LAYERS.write(
            {
                "trial_id": r.trial_id,
                "layer": lay.layer,
                "option": s.option,
                "option_index": i,
                "logprob": lay.logprobs[i],
                "prob": lay.probs[i],
                "layer_coverage": lay.coverage,
                "layer_greedy": s.option == lay.greedy_option,
            }
            for r in readouts
            for lay in r.layers
            for i, s in enumerate(r.scores)
        )
    return out


def sample_table(samples: Sequence[Sample]) -> pd.DataFrame:
    """One row per (trial, draw); ``token_ids`` are the generated ids (empty where the engine does not know them)."""
    return SAMPLES.write(
        {
            "trial_id": s.trial_id,
            "draw": s.replicate,
            "option": s.option,
            "status": s.status,
            "text": s.text,
            "reasoning": s.reasoning,
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
            "token_ids": list(s.token_ids),
            "truncated": s.truncated,
        }
        for s in samples
    )
