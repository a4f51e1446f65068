"""The data that flows through probe: trials in, readouts and samples out.

Everything here is a frozen dataclass of plain values, so that a trial can be
hashed, serialized into the run store and compared across runs. Engines and
analyses depend on these types and on nothing else of each other.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

Role = Literal["system", "user", "assistant"]
SampleStatus = Literal["ok", "refusal", "invalid", "error"]


@dataclass(frozen=True)
class Message:
    """One chat turn, as the chat template will render it."""

    role: Role
    content: str
    reply_ids: tuple[int, ...] | None = None
    """None for an ordinary turn (rendered by the chat template). For an assistant turn the subject model wrote
    itself (a kept first answer): the token ids it generated after the prompt of the turns before it, stop tokens
    excluded; empty when they are not known (then the text is encoded). Logit engines render such a turn as the
    continuation of that exact prompt (:func:`engines.render.render_ids`), never re-rendered by the template."""

    def __post_init__(self) -> None:
        if self.role not in ("system", "user", "assistant"):
            raise ValueError(f"message role must be system, user or assistant, got {self.role!r}")
        if self.reply_ids is not None:
            if self.role != "assistant":
                raise ValueError(f"only an assistant message can carry reply_ids, got a {self.role!r} message")
            object.__setattr__(self, "reply_ids", tuple(int(i) for i in self.reply_ids))

    def to_record(self) -> dict[str, object]:
        """A JSON-ready dict; ``reply_ids`` only when set (so older run stores read back unchanged)."""
        rec: dict[str, object] = {"role": self.role, "content": self.content}
        if self.reply_ids is not None:
            rec["reply_ids"] = list(self.reply_ids)
        return rec


def _canonical(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def make_trial_id(experiment: str, item_id: str, factors: Mapping[str, str], salt: str, replicate: int) -> str:
    """A stable id: the hash of what makes a trial this trial.

    Prompt text is deliberately *not* hashed: fixing a typo in a template must
    not silently orphan stored results, and the run store refuses a spec change
    anyway (the spec hash is in the manifest).
    """
    key = _canonical([experiment, item_id, dict(factors), salt, replicate])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Trial:
    """One prompt to one model.

    ``options`` are the printed answer strings in print order; ``meaning[i]``
    says what ``options[i]`` stands for (e.g. ``"yes" -> "cbr"``), so analyses
    never have to re-derive the label mapping from the text.
    ``assistant_prefix`` is text the assistant turn starts with before the
    answer slot (e.g. ``"Answer:"``); empty means the slot is the first token of
    the reply.
    """

    trial_id: str
    experiment: str
    item_id: str
    factors: Mapping[str, str]
    messages: tuple[Message, ...]
    options: tuple[str, ...]
    meaning: tuple[str, ...]
    salt: str = ""
    replicate: int = 0
    assistant_prefix: str = ""

    def __post_init__(self) -> None:
        if not self.options:
            raise ValueError(f"trial {self.trial_id}: the option list is empty; give at least two options")
        if len(set(self.options)) != len(self.options):
            raise ValueError(f"trial {self.trial_id}: options must be distinct, got {list(self.options)}")
        if len(self.meaning) != len(self.options):
            raise ValueError(
                f"trial {self.trial_id}: meaning has {len(self.meaning)} entries for {len(self.options)} options"
            )
        if not self.messages or self.messages[-1].role != "user":
            raise ValueError(f"trial {self.trial_id}: the last message must be the user's question")
        # freeze the mapping so the dataclass stays hashable in spirit
        object.__setattr__(self, "factors", dict(sorted(self.factors.items())))

    def to_record(self) -> dict[str, object]:
        """A JSON-ready dict (the run store's trials file)."""
        rec = asdict(self)
        rec["messages"] = [m.to_record() for m in self.messages]
        rec["options"] = list(self.options)
        rec["meaning"] = list(self.meaning)
        return rec

    @classmethod
    def from_record(cls, rec: Mapping[str, object]) -> Trial:
        msgs = rec["messages"]
        assert isinstance(msgs, list)
        return cls(
            trial_id=str(rec["trial_id"]),
            experiment=str(rec["experiment"]),
            item_id=str(rec["item_id"]),
            factors=dict(rec["factors"]),  # type: ignore[call-overload]
            messages=tuple(Message(role=m["role"], content=m["content"], reply_ids=m.get("reply_ids")) for m in msgs),
            options=tuple(rec["options"]),  # type: ignore[arg-type]
            meaning=tuple(rec["meaning"]),  # type: ignore[arg-type]
            salt=str(rec.get("salt", "")),
            replicate=int(rec.get("replicate", 0)),  # type: ignore[call-overload]
            assistant_prefix=str(rec.get("assistant_prefix", "")),
        )


@dataclass(frozen=True)
class OptionScore:
    """The answer-slot score of one option (one complete answer string)."""

    option: str
    """The option as the trial prints it."""
    token_ids: tuple[int, ...]
    """The tokens the model would emit for it at the slot."""
    logprob: float
    """log P(option is the whole answer), raw model, untempered."""
    prob: float
    """P normalized over the options (sums to 1 over a readout)."""


@dataclass(frozen=True)
class LayerReadout:
    """The answer-slot readout at one layer (the logit lens, :mod:`engines.hf.lens`): the model's final norm and
    head applied to the residual stream after block ``layer`` (0: the embeddings, :mod:`probe.layers`) at every
    position the option trie reads, the options scored as the final readout scores them."""

    layer: int
    logprobs: tuple[float, ...]
    """log P(option is the whole answer) at this layer, in the trial's option order."""
    probs: tuple[float, ...]
    """Normalized over the options."""
    coverage: float
    """The options' mass before normalization."""
    greedy_option: str
    """The most probable option at this layer (the first of them on a tie)."""


@dataclass(frozen=True)
class Readout:
    """The answer-slot distribution for one trial."""

    trial_id: str
    scores: tuple[OptionScore, ...]
    """One score per option, in the trial's option order."""
    coverage: float
    """Option mass before normalization: how much of the model's answer lies on the options."""
    greedy_option: str
    """The most probable option (the first of them on a tie)."""
    top_other: tuple[tuple[str, float], ...]
    """The most likely first tokens at the slot that start no option, with their probabilities."""
    prompt_tokens: int
    """Tokens of the prompt up to the slot (in think mode the reasoning is appended to it)."""
    computed_tokens: int
    """Tokens actually run through the model for this trial (prompt + trie expansion + reasoning)."""
    reasoning: str = ""
    """Think mode: the reasoning generated before the slot was read."""
    reasoning_tokens: int = 0
    """Think mode: the tokens the model generated for it (its stop token included)."""
    hit_budget: bool = False
    """Think mode: the reasoning ran out of ``--think-budget`` before the model closed it."""
    prompt_ids: tuple[int, ...] = field(default=(), repr=False)
    """The token ids the slot was read after (local engines)."""
    layers: tuple[LayerReadout, ...] = field(default=(), repr=False)
    """``--layers``: the readout at each layer asked for, ascending (the last equals this readout); empty without."""

    def prob(self, option: str) -> float:
        for s in self.scores:
            if s.option == option:
                return s.prob
        raise KeyError(
            f"{option!r} is not an option of trial {self.trial_id}; options: {[s.option for s in self.scores]}"
        )


@dataclass(frozen=True)
class Sample:
    """One sampled answer (behaviour), parsed into an option or a status."""

    trial_id: str
    replicate: int
    text: str
    option: str | None
    status: SampleStatus
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning: str = ""
    token_ids: tuple[int, ...] = field(default=(), repr=False)
    """The generated ids behind ``text`` (stop tokens excluded; any assistant prefix not included), where the
    engine knows them (local engines); empty for API replies. A follow-up turn keeps them exactly."""
    truncated: bool = False
    """The reply hit the token cap (``--max-new-tokens``) before the model ended it: its answer may be cut off."""


def options_meaning(options: Sequence[str], mapping: Mapping[str, str]) -> tuple[str, ...]:
    """Look up the meaning of each option, failing loudly on a missing one."""
    missing = [o for o in options if o not in mapping]
    if missing:
        raise KeyError(f"no meaning given for options {missing}; known: {sorted(mapping)}")
    return tuple(mapping[o] for o in options)
