"""The engine contract: lists in, lists out, same order.

A logit engine implements ``readout``; every engine provides ``sample``
(a backend subclasses :class:`Engine`, inherits ``sample`` and implements
``_sample``). Nothing else is required beyond ``load``, ``describe`` and ``identity`` (for
the run manifest). Engines import their heavy libraries lazily so that a
CPU-only or API-only install works.

Optional: ``reply_rows``, the free-text reply rows (trials x draws) the runner
may gather across chunks into one ``sample`` call (absent or 0: each chunk's
replies alone; see :func:`probe.app.runner.plan_replies`), and
``sample_next(trials)``, which the runner calls before a chunk's ``readout``
when it will sample those trials right after (the Transformers engine then
keeps the readout's prompt caches for the draws; speed only).
"""

from __future__ import annotations

import argparse
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from probe.errors import ProbeError
from probe.types import Readout, Sample, Trial

ProgressFn = Callable[[int], None]
"""Called with the number of trials (or samples) just finished."""


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """What every engine is configured with; each backend's settings extend it with their own fields.

    Engine configuration only: what one request asks for (how many draws, the
    temperature, a reply cap for one call) is passed to :meth:`Engine.sample`,
    never stored here. Keyword-only, so a backend's own fields keep their
    positions (``ApiSettings(provider, model=...)``); the manifest and the run
    key serialize settings as sorted JSON, so the field order that the base
    class changes changes neither.
    """

    model: str
    """The model: a built-in tiny name, a local folder, a Hugging Face id, or the API's model name."""
    think: bool = False
    """Reason first (up to ``think_budget`` tokens), then answer or read the slot."""
    think_budget: int = 32768
    """Most reasoning tokens in think mode (``--think-budget``). 32,768: the output length Qwen3's model card
    recommends for most queries (NVIDIA's Nemotron Nano cards likewise leave reasoning tens of thousands of
    tokens); a budget only caps, and every think-mode report counts the traces that hit it (docs/gpu.md)."""
    system_prompt: str | None = None
    """Added as a system turn to trials that have none."""
    max_new_tokens: int = 32
    """Answer tokens allowed to ``sample()`` after any reasoning (``--max-new-tokens``)."""
    seed: int = 0
    """Seed of the per-(trial, draw) sampling."""


SHARED_FLAGS: Mapping[str, str] = {
    "think": "think",
    "think_budget": "think_budget",
    "system_prompt": "system",
    "max_new_tokens": "max_new_tokens",
    "seed": "seed",
}
"""The :class:`EngineSettings` field each shared CLI flag sets (its ``argparse`` name: ``--system`` sets
``system_prompt``); every backend reads them the same way."""

S = TypeVar("S", bound=EngineSettings)


def settings_from_flags(
    cls: type[S],
    a: argparse.Namespace,
    same: Iterable[str] = (),
    renamed: Mapping[str, str] | None = None,
    **given: Any,
) -> S:
    """``cls`` built from parsed flags: the shared ones (:data:`SHARED_FLAGS`), the fields ``same`` (flag named as
    the field) and ``renamed`` (field -> flag name), and the values ``given``.

    A flag the namespace lacks (one built without the CLI, or without this backend's flags) is not passed, so its
    field keeps the dataclass default (or default factory), written once, on the field.
    """
    flags = {**SHARED_FLAGS, **{name: name for name in same}, **(renamed or {})}
    return cls(**{field: getattr(a, flag) for field, flag in flags.items() if hasattr(a, flag)}, **given)


def draw_seed(seed: int, trial_id: str, draw: int) -> int:
    """The 63-bit seed of draw ``draw`` of a trial: the same in every engine, and in a resumed run."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{trial_id}:{draw}".encode()).digest()[:8], "little") >> 1


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
class LogitEngine(Engine, Protocol):
    """An engine that can read the answer-slot distribution."""

    def readout(self, trials: Sequence[Trial], progress: ProgressFn | None = None) -> list[Readout]:
        """The answer-slot distribution of each trial, in input order."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in the model's tokenizer (salts are drawn to a fixed token length)."""
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
