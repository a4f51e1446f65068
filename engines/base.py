"""The engine contract: lists in, lists out, same order.

A logit engine implements ``readout``; every engine provides ``sample``
(a backend subclasses :class:`Engine`, inherits ``sample`` and implements
``_sample``). Nothing else is required beyond ``load``, ``describe`` and ``identity`` (for
the run manifest). Engines import their heavy libraries lazily so that a
CPU-only or API-only install works.

Optional, each a small runtime-checkable protocol the runner asks with
``isinstance`` (as it asks :class:`ReadsSlot` and :class:`CountsTokens` of a
logit engine): :class:`BatchesReplies` (``reply_rows``, the free-text reply
rows, trials x draws, the runner may gather across chunks into one ``sample``
call; absent or 0: each chunk's replies alone; see
:func:`probe.app.runner.plan_replies`), :class:`SamplesNext`
(``sample_next(trials)``, which the runner calls before a chunk's ``readout``
when it will sample those trials right after: the Transformers engine then
keeps the readout's prompt caches for the draws; speed only),
:class:`ChunkSize` (the engine's own trials per committed chunk),
:class:`Journaled` (an engine that keeps a journal in the run folder) and
:class:`CallStats` (totals for the manifest).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final, Protocol, runtime_checkable

from engines.flags import NO_FLAG, flag
from probe.errors import ProbeError
from probe.layers import LayerSpec, parse_layers
from probe.types import Readout, Sample, Trial

ProgressFn = Callable[[int], None]
"""Called with the number of trials (or samples) just finished."""

FRAMES: Final[tuple[str, ...]] = ("auto", "chat", "plain")
"""``--frame`` values: ``auto`` takes the chat template where the tokenizer has one, else the plain frame."""


_LAYER_SPECS: dict[str, LayerSpec] = {}


def parsed_layers(text: str) -> LayerSpec:
    """:func:`probe.layers.parse_layers`, once per value: a spec is kept under the text given and under its canonical
    text, so the settings' canonical text reads back the spec the first parse made."""
    spec = _LAYER_SPECS.get(text)
    if spec is None:
        spec = parse_layers(text)
        _LAYER_SPECS[text] = _LAYER_SPECS[spec.text] = spec
    return spec


@dataclass(frozen=True)
class Supports:
    """What a backend supports of the settings every engine shares (its package's ``SUPPORTS``, its settings'
    :attr:`EngineSettings.SUPPORTS`); :func:`check_shared` refuses the rest."""

    engine: str
    """The backend's name, as the refusals say it."""
    plain: str | None = None
    """Why the backend has no plain frame: the refusal of ``--frame plain`` (``{provider}`` is the settings'
    provider); None: it renders the plain frame."""
    think: bool = True
    """Whether it has a think mode."""
    layers: bool = False
    """Whether it reads the slot at chosen layers (``--layers``: it has the model's hidden states)."""


def check_shared(
    supports: Supports,
    *,
    frame: str = "auto",
    think: bool = False,
    layers: str | None = None,
    model: str = "",
    provider: str = "",
    template: bool | None = None,
) -> tuple[str, LayerSpec | None]:
    """The one check of ``--frame``, ``--think``'s frame and ``--layers`` against what an engine supports: every
    refusal tied to them is raised here, in one line that says what to do.

    Called by every settings class as it is made (before anything is loaded or written), by the synthetic
    subject's ``from_args``, and by a local engine at load with ``template`` (whether the tokenizer has a chat template), where
    ``auto`` is resolved. Returns the frame (``auto`` resolved where ``template`` is known) and ``layers`` parsed
    (:func:`probe.layers.parse_layers`, the one parse; None without ``--layers``).
    """
    if layers is not None and not supports.layers:
        raise ValueError(
            f"--layers {layers}: the {supports.engine} engine has no hidden states to read; layer-wise readouts need "
            "the Transformers engine (a local model folder or Hugging Face id, --engine hf), or drop --layers"
        )
    if frame not in FRAMES:
        raise ValueError(f"frame must be one of {', '.join(FRAMES)}, got {frame!r}")
    if think and not supports.think:
        raise ValueError(f"the {supports.engine} engine has no think mode; drop --think")
    if think and frame == "plain":
        raise ValueError(
            "--think needs a chat template with reasoning tags, and the plain frame has none; drop --think, or use "
            "--frame chat with a reasoning model"
        )
    if frame == "plain" and supports.plain is not None:
        raise ValueError(supports.plain.format(provider=provider))
    spec = parsed_layers(layers) if layers is not None else None
    if template is None:
        return frame, spec
    if frame == "chat" and not template:
        raise ValueError(
            f"model {model!r} has no chat template, so --frame chat cannot render it; use --frame plain (or auto) "
            "to read it in the plain-text frame, or add a chat_template to its tokenizer_config.json"
        )
    resolved = frame if frame != "auto" else "chat" if template else "plain"
    if resolved == "plain" and think:
        raise ValueError(
            f"model {model!r} is read in the plain frame (it has no chat template), which has no reasoning "
            "tags, so --think cannot run; drop --think"
        )
    return resolved, spec


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """What every engine is configured with; each backend's settings extend it with their own fields.

    Engine configuration only: what one request asks for (how many draws, the
    temperature, a reply cap for one call) is passed to :meth:`Engine.sample`,
    never stored here. Keyword-only, so a backend's own fields keep their
    positions (``ApiSettings(provider, model=...)``); the manifest and the run
    key serialize settings as sorted JSON, so the field order that the base
    class changes changes neither.

    Each field is also its command-line flag (:mod:`engines.flags`: ``--think-budget``, its default, and the first
    paragraph of its docstring as the help), added by :func:`engines.add_engine_arguments`.
    """

    model: str = field(metadata=NO_FLAG)
    """The model: a built-in tiny name, a local folder, a Hugging Face id, or the API's model name."""
    think: bool = False
    """Reason first (up to ``think_budget`` tokens), then answer or read the answer slot."""
    think_budget: int = 32768
    """Most reasoning tokens in think mode, by default the output length Qwen3 recommends; reports count the
    traces that hit it.

    32,768: the output length Qwen3's model card recommends for most queries (NVIDIA's Nemotron Nano cards likewise
    leave reasoning tens of thousands of tokens); a budget only caps, and every think-mode report counts the
    traces that hit it (docs/gpu.md)."""
    think_temperature: float = 0.0
    """Reasoning temperature in think mode (local engines): 0 decodes the reasoning greedily, as the paper did.

    Above 0 it is sampled, seeded per trial (:func:`reasoning_seed`), with ``think_top_p`` and ``think_top_k``
    (``--think-sampling qwen3`` sets Qwen3's recommended 0.6 / 0.95 / 20)."""
    think_top_p: float = 1.0
    """Top-p of sampled reasoning: the smallest set of tokens holding this much probability; 1: all tokens."""
    think_top_k: int = 0
    """Top-k of sampled reasoning: the most likely tokens it draws from; 0: all tokens."""
    system_prompt: str | None = field(default=None, metadata=flag(name="system"))
    """System prompt, added as a system turn to every trial that has none."""
    frame: str = field(default="auto", metadata=flag(choices=FRAMES))
    """Prompt frame: chat (the model's chat template), plain (the documented plain-text frame, for a base model
    without a template) or auto (chat where the tokenizer has a template, else plain).

    The plain frame (:func:`engines.render.plain_text`, docs/methods.md) writes the system text, each turn under
    ``Question:``/``Answer:`` and ends in ``Answer:``; a plain run says so in its run key and report."""
    max_new_tokens: int = 32
    """Reply tokens when sampling, after any reasoning.

    What ``sample()`` allows the answer unless the call asks for another cap (:class:`Draws`)."""
    seed: int = 0
    """Seed of the per-(trial, draw) sampling."""
    layers: str | None = field(default=None, metadata=flag(name="layers"))
    """Also read the answer slot at these layers (the logit lens: the final norm and head applied to the residual
    stream after each block, docs/methods.md): all, a list (0,6,12), every:K or last:K; 0 is the embeddings.

    Stored as the run's ``readout_layers`` table; the layer set enters the run key. Off by default: a run without
    it reads the final layer only, as before. Engines without hidden states refuse it (:class:`Supports`)."""

    SUPPORTS: ClassVar[Supports] = Supports("engine")
    """What the backend these settings configure supports of the shared settings (each backend's settings set it)."""

    def __post_init__(self) -> None:
        _, spec = check_shared(
            self.SUPPORTS,
            frame=self.frame,
            think=self.think,
            layers=self.layers,
            model=self.model,
            provider=str(getattr(self, "provider", "")),
        )
        if spec is not None:
            object.__setattr__(self, "layers", spec.text)  # the canonical form, which the run key records

    @property
    def layer_spec(self) -> LayerSpec | None:
        """``layers`` as :func:`check_shared` parsed it (the one parse, cached per value; None: the final layer
        only)."""
        return None if self.layers is None else parsed_layers(self.layers)


DTYPES: Final[tuple[str, ...]] = ("auto", "float32", "bfloat16", "float16")
"""``--dtype`` values."""

LOADING: Final[tuple[str, ...]] = (
    "dtype",
    "device",
    "batch_size",
    "max_new_tokens",
    "seed",
    "revision",
    "trust_remote_code",
)
"""The fields of the shared loading flags (:func:`engines.add_loading_arguments`, from :class:`LoadingSettings`), in
their order in ``--help``; a backend's own flags leave them out."""


@dataclass(frozen=True, kw_only=True)
class LoadingSettings(EngineSettings):
    """How a local model is loaded and sampled: the loading flags (:data:`LOADING`) every local engine and the judge
    share, each defined here once (the Transformers engine's settings are these; the vLLM engine reads the ones it
    has from the same flags)."""

    dtype: str = field(default="auto", metadata=flag(choices=DTYPES))
    """Weights dtype: auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16.

    Whatever the weights, draws sample from a float32 softmax and readouts normalize in float64 (docs/gpu.md)."""
    device: str = "auto"
    """Where the model runs: auto (one GPU if torch sees one, else the CPU), cpu, cuda, cuda:N, or split (one model
    over every visible GPU).

    auto is an error where a GPU is there but torch cannot use it; :mod:`engines.hf.placement`."""
    batch_size: int = 16
    """Most trials per forward pass."""
    revision: str | None = None
    """Model revision (hub branch, tag or commit)."""
    trust_remote_code: bool = False
    """Allow model code from the hub."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")


def draw_seed(seed: int, trial_id: str, draw: int) -> int:
    """The 63-bit seed of draw ``draw`` of a trial: the same in every engine, and in a resumed run."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{trial_id}:{draw}".encode()).digest()[:8], "little") >> 1


RAW_SAMPLING: Mapping[str, float] = {
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
}
"""vLLM's sampling fields (``SamplingParams``, and its OpenAI server's request body) that leave the model's
distribution as it is: no truncation, no penalty. Raw draws send all of them, so no server default applies."""


def reasoning_seed(seed: int, trial_id: str) -> int:
    """The seed of a trial's sampled reasoning in think mode (apart from its draws' seeds)."""
    return draw_seed(seed, f"reasoning:{trial_id}", 0)


THINK_SAMPLING = {"greedy": (0.0, 1.0, 0), "qwen3": (0.6, 0.95, 20)}
"""``--think-sampling`` presets: (temperature, top-p, top-k). qwen3: the thinking-mode settings of Qwen3's model card
(which warns that greedy decoding in thinking mode can loop); greedy: the paper's."""


UNRECORDED_DEFAULTS: Mapping[str, Any] = {"frame": "auto", "layers": None}
"""Settings the manifest leaves out at these values: fields added later whose default keeps a run as it was before
they existed (the chat template where the model has one; no layer readouts), so such a run records what it recorded
then. A run that sets one records it."""


def recorded_settings(s: EngineSettings) -> dict[str, Any]:
    """The settings as the manifest records them: every field (``asdict``), less those at their
    :data:`UNRECORDED_DEFAULTS` value."""
    return {k: v for k, v in asdict(s).items() if not (k in UNRECORDED_DEFAULTS and v == UNRECORDED_DEFAULTS[k])}


def check_reasoning(s: EngineSettings) -> None:
    """Refuse reasoning sampling settings out of range, naming the field, the range and the value."""
    if not (math.isfinite(s.think_temperature) and s.think_temperature >= 0):
        raise ValueError(f"think_temperature must be a finite number >= 0, got {s.think_temperature}")
    if not 0 < s.think_top_p <= 1:
        raise ValueError(f"think_top_p must be in (0, 1], got {s.think_top_p}")
    if s.think_top_k < 0:
        raise ValueError(f"think_top_k must be >= 0 (0: all tokens), got {s.think_top_k}")


def reasoning_record(s: EngineSettings) -> dict[str, Any]:
    """How the reasoning is decoded, for the run key: empty for greedy (so greedy run keys stay as they were)."""
    if not s.think or s.think_temperature == 0:
        return {}
    return {"think_sampling": {"temperature": s.think_temperature, "top_p": s.think_top_p, "top_k": s.think_top_k}}


@dataclass(frozen=True)
class Draws:
    """What one :meth:`Engine.sample` call asks for, as one value.

    Per request, never engine settings (see :class:`EngineSettings`); the
    public ``sample`` signature stays the contract's, and a backend's
    ``_sample`` receives this instead of repeating it.
    """

    n: int
    """Draws per trial (``Sample.replicate`` 0..n-1)."""
    temperature: float
    """Sampling temperature; 0 is greedy."""
    max_new_tokens: int | None = None
    """This call's reply cap; ``None`` keeps the engine's ``--max-new-tokens``."""
    stop_at_answer: bool = False
    """The trials ask for one of their options: parse each reply up to where its answer ends."""

    def check(self) -> None:
        """Refuse what no engine can draw (a backend with a narrower temperature range checks that first)."""
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")


@runtime_checkable
class Engine(Protocol):
    """What every backend provides.

    A backend subclasses it and so inherits :meth:`sample` as written here, the contract's signature once; it
    implements ``_sample``, which receives the request as one :class:`Draws`.
    """

    name: str

    def load(self) -> Any:
        """Load the model or open the client (idempotent); returns the engine."""
        ...

    def sample(
        self,
        trials: Sequence[Trial],
        n: int,
        temperature: float,
        progress: ProgressFn | None = None,
        *,
        max_new_tokens: int | None = None,
        stop_at_answer: bool = False,
    ) -> list[Sample]:
        """``n`` sampled answers per trial at ``temperature``, trial-major, in input order.

        ``max_new_tokens`` caps the reply for this call (an experiment's free-text replies need more room than a
        one-word answer); ``None`` keeps the engine's ``--max-new-tokens``. ``stop_at_answer``: the trials ask
        for one of their options, so each reply is parsed up to where its answer ends
        (:func:`probe.parse.answer_end`), and an engine that can may stop generating there; free-text replies
        (False) are parsed whole.
        """
        return self._sample(trials, Draws(n, temperature, max_new_tokens, stop_at_answer), progress)

    def _sample(self, trials: Sequence[Trial], draws: Draws, progress: ProgressFn | None) -> list[Sample]:
        """The backend's sampling: ``draws.n`` answers per trial, trial-major, in input order."""
        ...

    def describe(self) -> dict[str, Any]:
        """Model, revision and settings, for the run manifest."""
        ...

    def identity(self) -> dict[str, Any]:
        """Everything that changes the values (it enters the run key); speed-only settings stay out."""
        ...


@runtime_checkable
class ReadsSlot(Protocol):
    """What reads the answer slot (the runner asks this of an engine before a readout)."""

    def readout(self, trials: Sequence[Trial], progress: ProgressFn | None = None) -> list[Readout]:
        """The answer-slot distribution of each trial, in input order."""
        ...


@runtime_checkable
class CountsTokens(Protocol):
    """What counts tokens in the model's tokenizer (an experiment draws its salts to a fixed token length)."""

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in the model's tokenizer (salts are drawn to a fixed token length)."""
        ...


@runtime_checkable
class LogitEngine(Engine, ReadsSlot, CountsTokens, Protocol):
    """An engine that can read the answer-slot distribution (and so knows its tokenizer)."""


@runtime_checkable
class ReadsAlone(ReadsSlot, Protocol):
    """A local engine that can read each trial by itself on the plain path: the reference of the run's numeric
    floor (:mod:`probe.app.floor`)."""

    settings: EngineSettings

    def reading_alone(self) -> ReadsSlot:
        """The same weights reading one trial per forward pass (batch size 1, plain path)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Model, revision and settings, for the run manifest."""
        ...


@runtime_checkable
class ReasonsFirst(Protocol):
    """An engine in think mode that can also read the bare slots (the floor of a think-mode run is measured there)."""

    def without_reasoning(self) -> ReadsAlone:
        """The same engine outside think mode."""
        ...


@runtime_checkable
class BatchesReplies(Protocol):
    """An engine that decodes free-text replies best in large batches (hf, vllm, sim)."""

    @property
    def reply_rows(self) -> int:
        """Reply rows (trials x draws) the runner may gather across chunks into one ``sample`` call (0: each
        chunk's replies alone)."""
        ...


@runtime_checkable
class SamplesNext(Protocol):
    """An engine that can prepare for the draws that follow a readout (hf: it keeps the prompt caches)."""

    def sample_next(self, trials: Sequence[Trial]) -> None:
        """The next ``sample`` call after the coming ``readout`` draws these trials (speed only)."""
        ...


@runtime_checkable
class ChunkSize(Protocol):
    """An engine with its own number of trials per committed chunk (vllm on a GPU: enough to fill its batch)."""

    @property
    def default_chunk_size(self) -> int:
        """Trials per committed chunk when ``--chunk-size`` is not given."""
        ...


@dataclass(frozen=True)
class RunFolder:
    """The run a journaled engine serves, as the runner hands it over: engines never read the run store itself."""

    root: Path
    """The run folder; an engine journals into ``root / "results"``."""
    samples: int
    """Draws per trial the run's plan asks for."""
    temperature: float
    """The plan's sampling temperature (a journal entry's key)."""
    pending: Callable[[], tuple[int, Sequence[Trial]]]
    """(number of trials in the run, the trials of the chunks not yet done, a damaged chunk among them); computed
    when called, for a dry run's estimate."""


@runtime_checkable
class Journaled(Protocol):
    """An engine that persists each call in the run folder (api: a journal of paid responses; server: of answered
    readout requests), so a recomputed chunk replays them instead of asking again."""

    def attach(self, run: RunFolder) -> None:
        """Open the journal of ``run``, before the first call."""
        ...


@runtime_checkable
class CallStats(Protocol):
    """An engine that counts its calls, retries and spend (api, server), for the manifest."""

    def run_stats(self) -> dict[str, Any]:
        """The run's totals so far."""
        ...


class MissingExtra(ProbeError, ImportError):
    """A backend's library is not installed; the message says which extra to install."""


def require(module: str, extra: str) -> Any:
    """Import ``module`` or fail with a pip hint naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - depends on the install
        raise MissingExtra(f"{module} is not installed; install it with: pip install 'probe[{extra}]'") from e
