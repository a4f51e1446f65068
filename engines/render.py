"""Prompt rendering and option encoding shared by the logit engines (pure functions of a tokenizer).

These are the rules of :class:`engines.hf.HFEngine` (``render``,
``option_ids`` and the think-mode tail of ``prepare``), written as functions
so that a second engine (vLLM) reads the *same* token ids at the *same* slot.
Parity between engines is only meaningful when the prompt ids are identical,
so this module is tested for equality against the Transformers engine on the
tiny tokenizer (``tests/test_vllm_engine.py``).

* The chat template renders the whole prompt to text once and it is tokenized
  once; everything after it (reasoning, closing tags, the assistant prefix) is
  appended as ids. Nothing is cut out of a string that was tokenized whole,
  because BPE merges across a cut change the ids the model saw.
* After an assistant prefix that does not end in whitespace (``Answer:``) an
  option is scored with a leading space (``Answer: Yes``), because that is how
  the model would continue; right after the template's newline it is bare.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from probe.parse import split_reasoning
from probe.types import Trial

__all__ = [
    "OptionError",
    "Reasoned",
    "checked_option_ids",
    "close_reasoning",
    "encode_option",
    "option_ids",
    "option_texts",
    "render_ids",
    "stop_ids",
    "think_end_id",
]


def render_ids(tok: Any, trial: Trial, *, think: bool, system_prompt: str | None = None) -> tuple[int, ...]:
    """The prompt token ids up to the answer slot (or, with ``think``, to where reasoning starts)."""
    msgs = [{"role": m.role, "content": m.content} for m in trial.messages]
    if system_prompt is not None and msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": system_prompt})
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=think)
    if not think:
        text += trial.assistant_prefix
    return tuple(tok.encode(text, add_special_tokens=False))


class OptionError(ValueError):
    """An option string that the tokenizer cannot encode faithfully."""


def option_texts(trial: Trial) -> tuple[str, ...]:
    """Each option as the text the model would write at the slot.

    After an assistant prefix that does not end in whitespace (``Answer:``) the
    option gets a leading space (``Answer: Yes``), because that is how the model
    would continue; right after the template's newline it is bare.
    """
    pre = trial.assistant_prefix
    sep = " " if pre and not pre[-1].isspace() else ""
    for opt in trial.options:
        if not opt:
            raise OptionError(f"trial {trial.trial_id}: empty option string")
    return tuple(sep + opt for opt in trial.options)


def encode_option(tok: Any, text: str) -> tuple[int, ...] | str:
    """The ids of ``text``, or why they would not be ``text`` (a tokenizer that loses characters)."""
    ids = tuple(tok.encode(text, add_special_tokens=False))
    back = tok.decode(list(ids), clean_up_tokenization_spaces=False)
    if not ids or back != text or (tok.unk_token_id is not None and tok.unk_token_id in ids):
        return f"does not survive the tokenizer (encodes to {list(ids)}, decodes to {back!r})"
    return ids


def checked_option_ids(trial: Trial, encoded: Sequence[tuple[int, ...] | str]) -> tuple[tuple[int, ...], ...]:
    """The encodings of ``option_texts(trial)``, refusing any the tokenizer loses."""
    out = []
    for opt, ids in zip(trial.options, encoded, strict=True):
        if isinstance(ids, str):
            raise OptionError(f"trial {trial.trial_id}: option {opt!r} {ids}; use options this model can write")
        out.append(ids)
    return tuple(out)


def option_ids(tok: Any, trial: Trial) -> tuple[tuple[int, ...], ...]:
    """Each option as the token ids the model would emit at the slot; refuses options the tokenizer loses."""
    return checked_option_ids(trial, [encode_option(tok, text) for text in option_texts(trial)])


def think_end_id(tok: Any, model: str) -> int:
    """The id of ``</think>``; a model without it cannot run in think mode."""
    tid = tok.convert_tokens_to_ids("</think>")
    if tid is None or tid == tok.unk_token_id:
        raise ValueError(f"model {model!r} has no </think> token; think mode needs a reasoning model")
    return int(tid)


def stop_ids(tok: Any, generation_eos: int | Iterable[int] | None) -> set[int]:
    """End-of-turn ids: the tokenizer's eos plus the generation config's (Qwen3 lists two)."""
    ids = {tok.eos_token_id}
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos:
        ids.update(generation_eos)
    return {int(i) for i in ids if i is not None}


@dataclass(frozen=True)
class Reasoned:
    """A prompt with its generated reasoning appended, ready for the slot readout."""

    ids: tuple[int, ...]
    reasoning: str
    reasoning_tokens: int
    hit_budget: bool


def close_reasoning(
    tok: Any,
    trial: Trial,
    base: Sequence[int],
    gen: Sequence[int],
    *,
    end_id: int,
    stops: set[int],
    budget: int,
) -> Reasoned:
    """Append greedy reasoning ``gen`` to the think-mode prompt ``base`` and close the block.

    ``gen`` is what the model generated, its stop token included (``</think>``
    or an end-of-turn id). If it closed the block itself, ``"\\n\\n"`` follows
    (what Qwen3's template puts after ``</think>``); if it ran out of budget or
    stopped inside the block, ``"\\n</think>\\n\\n"`` closes it for it. The
    assistant prefix then follows as its own ids: the slot is read on the
    concatenated ids, never on a re-rendered string.
    """
    closed = bool(gen) and gen[-1] == end_id
    body = [int(g) for g in gen if g not in stops]
    tail = tok.encode("\n\n" if closed else "\n</think>\n\n", add_special_tokens=False)
    pre = trial.assistant_prefix
    prefix = tok.encode(pre, add_special_tokens=False) if pre else []
    full = (*base, *body, *tail, *prefix)
    reasoning, _ = split_reasoning(tok.decode(body + ([] if closed else [end_id]), skip_special_tokens=False))
    return Reasoned(tuple(int(i) for i in full), reasoning, len(gen), not closed and len(gen) >= budget)
