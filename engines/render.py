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
* A **kept reply** (an assistant message with ``reply_ids``, e.g. the first
  answer of a follow-up probe) is not re-rendered by the chat template: the
  turns before it are rendered exactly as the prompt the model answered
  (its think block, assistant prefix and all), its generated ids follow
  unchanged, and only the text after it (end of turn, the next user turn, the
  new generation prompt) comes from the template. Re-rendering would change
  what the model saw: Qwen3's template drops the empty ``<think></think>``
  block and any reasoning from turns before the last user message, and
  re-tokenizing sampled text need not give back the sampled ids.
* A prompt is rendered in one of two **frames**: the model's chat template
  (``chat``), or, for a model without one (a pretrained base checkpoint), the
  documented plain-text frame (``plain``, :func:`plain_text`): the system
  text, each turn under a role label (``Question:`` / ``Answer:``, the
  convention of lm-evaluation-harness), turns separated by a blank line, and
  the prompt ending in the answer label ``Answer:``, so the slot is read where
  a chat template's generation prompt would put it. ``--frame auto`` (the
  default) takes the chat template where the tokenizer has one
  (:func:`resolve_frame`). Every rule above holds in both frames.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from engines.base import Supports, check_shared
from probe.errors import ProbeError
from probe.parse import split_reasoning
from probe.types import Message, Trial

__all__ = [
    "PLAIN_STOPS",
    "KeptParts",
    "OptionError",
    "PlainReply",
    "Reasoned",
    "checked_option_ids",
    "close_reasoning",
    "encode_option",
    "kept_parts",
    "option_ids",
    "option_texts",
    "plain_cut",
    "plain_stop",
    "plain_text",
    "render_ids",
    "render_kept",
    "rendered_system_prompt",
    "resolve_frame",
    "stop_ids",
    "template_system_prompt",
    "think_end_id",
]

LOCAL = Supports("local")
"""What rendering supports (both frames, think mode in the chat frame): the rules a local engine's prompts keep."""


PLAIN_USER: Final[str] = "Question:"
"""The plain frame's label of a user turn (lm-evaluation-harness's ``Question:``/``Answer:``)."""
PLAIN_ASSISTANT: Final[str] = "Answer:"
"""The plain frame's label of an assistant turn, and the answer prefix every plain prompt ends in."""
PLAIN_SEP: Final[str] = "\n\n"
"""What separates the plain frame's blocks (the system text, each turn): a blank line."""
PLAIN_STOPS: Final[tuple[str, ...]] = (PLAIN_SEP, "\n" + PLAIN_USER, "\n" + PLAIN_ASSISTANT)
"""Where a reply sampled in the plain frame ends: at a blank line, or at a role label that starts a line (a base
model runs on into the next turn where a chat model would end its own)."""


def has_chat_template(tok: Any) -> bool:
    """Whether the tokenizer carries a chat template."""
    return bool(getattr(tok, "chat_template", None))


def resolve_frame(tok: Any, asked: str, model: str) -> str:
    """The frame a run renders in: ``chat`` or ``plain``, from ``--frame`` (``asked``) and the tokenizer.

    ``auto`` is the chat template where the tokenizer has one, else the plain
    frame; ``chat`` on a tokenizer without a template is refused in one line that
    names ``--frame plain`` (:func:`engines.base.check_shared`, the one check).
    """
    return check_shared(LOCAL, frame=asked, model=model, template=has_chat_template(tok))[0]


def plain_text(trial: Trial, system_prompt: str | None = None) -> str:
    """The plain frame of ``trial`` up to its generation prompt: the text the slot follows, less the trial's
    assistant prefix (:func:`answer_suffix` adds it).

    The system text (the trial's system turn, else ``system_prompt``) comes
    first as it is; each user turn follows as ``Question: <content>``, each
    assistant turn as ``Answer: <content>``; blocks are separated by a blank
    line; the text ends in ``Answer:``. Contents are written verbatim.
    """
    blocks: list[str] = []
    msgs = list(trial.messages)
    if msgs and msgs[0].role == "system":
        blocks.append(msgs.pop(0).content)
    elif system_prompt is not None:
        blocks.append(system_prompt)
    for m in msgs:
        if m.role == "system":
            raise ValueError(f"trial {trial.trial_id}: a system message after the first turn has no plain rendering")
        blocks.append(f"{PLAIN_USER if m.role == 'user' else PLAIN_ASSISTANT} {m.content}")
    blocks.append(PLAIN_ASSISTANT)
    return PLAIN_SEP.join(blocks)


def answer_suffix(trial: Trial, frame: str) -> str:
    """What follows the generation prompt before the slot: the trial's assistant prefix, after a space in the plain
    frame (``Answer: The answer is``)."""
    pre = trial.assistant_prefix
    return (" " + pre if pre else "") if frame == "plain" else pre


def _bos(tok: Any) -> tuple[int, ...]:
    """The plain frame's first id: the tokenizer's BOS where its own encoding starts with one (Llama's, Gemma's),
    as the model saw text in pretraining; none where it adds none (Qwen's, SmolLM2's)."""
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        return ()
    ids = tok.encode("a", add_special_tokens=True)
    return (int(bos),) if ids and ids[0] == bos else ()


def _frame_text(tok: Any, trial: Trial, *, think: bool, system_prompt: str | None, frame: str) -> str:
    """The prompt text of ``frame`` up to the generation prompt (the trial's assistant prefix not added)."""
    if frame == "plain":
        check_shared(LOCAL, frame=frame, think=think)  # think mode has no reasoning tags to write here
        return plain_text(trial, system_prompt)
    return _chat_text(tok, trial, think=think, system_prompt=system_prompt)


def _chat_text(tok: Any, trial: Trial, *, think: bool, system_prompt: str | None) -> str:
    msgs = [{"role": m.role, "content": m.content} for m in trial.messages]
    if system_prompt is not None and msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": system_prompt})
    return str(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=think))


_SYSTEM_MARK: Final[str] = "PROBESYSTEMMARK"
_USER_MARK: Final[str] = "PROBEUSERMARK"


def template_system_prompt(tok: Any) -> str | None:
    """The system prompt the chat template inserts when a conversation has none (``None``: it adds none).

    Some templates add their own (SmolLM2's: "You are a helpful AI assistant
    named SmolLM, ..."), and the model answers under it although no trial asked
    for it. Found by rendering a marked system turn to learn how the template
    wraps one, then looking for that wrapping in a conversation without one.
    """

    def text(msgs: list[dict[str, str]]) -> str:
        return str(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))

    user = {"role": "user", "content": _USER_MARK}
    try:
        marked = text([{"role": "system", "content": _SYSTEM_MARK}, user])
    except Exception:  # a template that rejects system turns (Gemma's older ones) inserts none of its own
        return None
    bare = text([user])
    head, _, rest = marked.partition(_SYSTEM_MARK)
    between = rest.partition(_USER_MARK)[0]
    if not head or _SYSTEM_MARK not in marked or not bare.startswith(head):
        return None
    body = bare[len(head) :]
    end = body.find(between) if between else -1
    return body[:end] if end > 0 else None


def rendered_system_prompt(tok: Any, system_prompt: str | None) -> dict[str, str | None]:
    """What trials without a system turn of their own are rendered with: ``{"text", "source"}`` for the manifest."""
    if system_prompt is not None:
        return {"text": system_prompt, "source": "--system"}
    default = template_system_prompt(tok)
    return {"text": default, "source": "chat template default" if default is not None else None}


def render_ids(
    tok: Any, trial: Trial, *, think: bool, system_prompt: str | None = None, frame: str = "chat"
) -> tuple[int, ...]:
    """The prompt token ids up to the answer slot (or, with ``think``, to where reasoning starts), in ``frame``
    (``chat`` or ``plain``: :func:`resolve_frame` resolves ``auto``).

    A trial holding a kept reply (an assistant message with ``reply_ids``) is
    rendered by :func:`render_kept` instead.
    """
    kept = [i for i, m in enumerate(trial.messages) if m.reply_ids is not None]
    if kept:
        return render_kept(tok, trial, kept[-1], think=think, system_prompt=system_prompt, frame=frame)
    text = _frame_text(tok, trial, think=think, system_prompt=system_prompt, frame=frame)
    if not think:
        text += answer_suffix(trial, frame)
    head = _bos(tok) if frame == "plain" else ()
    return (*head, *tok.encode(text, add_special_tokens=False))


KEPT_MARK: Final[str] = "PROBEKEPTREPLYMARK"
"""Stands in for a kept reply while the template renders what follows it (letters only: templates strip space)."""


@dataclass(frozen=True)
class KeptParts:
    """A rendered conversation with a kept reply, in its three parts (their concatenation is the prompt)."""

    head: tuple[int, ...]
    """The prompt the model answered, exactly as it was rendered then (with the assistant prefix)."""
    reply: tuple[int, ...]
    """The reply's ids: the generated ids, or the encoded text when they are not known."""
    tail: tuple[int, ...]
    """End of that turn, the turns after it and the new generation prompt, from the chat template."""


def kept_parts(
    tok: Any, trial: Trial, index: int, *, think: bool, system_prompt: str | None = None, frame: str = "chat"
) -> KeptParts:
    """Split the rendering of ``trial`` around its kept reply ``trial.messages[index]``.

    The reply's text is its ``content``; the generated ids decode to the end of
    it, and what comes before (an assistant prefix such as ``Answer:``, which the
    model was given, not generated) is put back into the head the way the
    original prompt had it: tokenized together with the template text outside
    think mode, appended as its own ids in think mode. Without ids (a readout's
    greedy option, an API reply) the whole content is that prefix, i.e. it is
    encoded as text right after the original prompt.
    """
    msg = trial.messages[index]
    if msg.reply_ids is None or msg.role != "assistant":
        raise ValueError(f"trial {trial.trial_id}: message {index} is not a kept assistant reply")
    if index == 0 or trial.messages[index - 1].role != "user":
        raise ValueError(f"trial {trial.trial_id}: a kept reply must follow a user message (message {index})")
    ids = msg.reply_ids
    text = tok.decode(list(ids), skip_special_tokens=False) if ids else ""
    if not msg.content.endswith(text):
        raise ValueError(
            f"trial {trial.trial_id}: the kept reply's text does not end with its decoded ids ({text[-40:]!r}); "
            "keep the reply text exactly as the engine decoded it"
        )
    prefix = msg.content[: len(msg.content) - len(text)]
    first = replace(trial, messages=trial.messages[:index], assistant_prefix=prefix)
    head = render_ids(tok, first, think=think, system_prompt=system_prompt, frame=frame)
    if think and prefix:
        head = (*head, *tok.encode(prefix, add_special_tokens=False))
    marked = replace(
        trial, messages=(*trial.messages[:index], Message("assistant", KEPT_MARK), *trial.messages[index + 1 :])
    )
    full = _frame_text(tok, marked, think=think, system_prompt=system_prompt, frame=frame)
    if full.count(KEPT_MARK) != 1:
        raise ValueError(
            f"trial {trial.trial_id}: the chat template does not render an assistant turn's content verbatim "
            f"(the marker appears {full.count(KEPT_MARK)} times); a kept reply cannot be placed"
        )
    after = full.split(KEPT_MARK, 1)[1] + ("" if think else answer_suffix(trial, frame))
    return KeptParts(tuple(head), tuple(ids), tuple(tok.encode(after, add_special_tokens=False)))


def render_kept(
    tok: Any, trial: Trial, index: int, *, think: bool, system_prompt: str | None = None, frame: str = "chat"
) -> tuple[int, ...]:
    """The prompt ids of a trial whose message ``index`` is a kept reply (see :func:`kept_parts`)."""
    p = kept_parts(tok, trial, index, think=think, system_prompt=system_prompt, frame=frame)
    return (*p.head, *p.reply, *p.tail)


class OptionError(ProbeError, ValueError):
    """An option string that the tokenizer cannot encode faithfully."""


def option_texts(trial: Trial, frame: str = "chat") -> tuple[str, ...]:
    """Each option as the text the model would write at the slot.

    After an assistant prefix that does not end in whitespace (``Answer:``) the
    option gets a leading space (``Answer: Yes``), because that is how the model
    would continue; right after the template's newline it is bare. The plain
    frame's prompt always ends in ``Answer:`` (and the trial's prefix after it).
    """
    pre = PLAIN_ASSISTANT + answer_suffix(trial, frame) if frame == "plain" else trial.assistant_prefix
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


def option_ids(tok: Any, trial: Trial, frame: str = "chat") -> tuple[tuple[int, ...], ...]:
    """Each option as the token ids the model would emit at the slot; refuses options the tokenizer loses."""
    return checked_option_ids(trial, [encode_option(tok, text) for text in option_texts(trial, frame)])


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
    text = tok.decode(body + ([] if closed else [end_id]), skip_special_tokens=False)
    reasoning, _ = split_reasoning(text, think=True)
    return Reasoned(tuple(int(i) for i in full), reasoning, len(gen), not closed and len(gen) >= budget)


def plain_stop(text: str) -> int | None:
    """Where the first of :data:`PLAIN_STOPS` starts in ``text`` (None: none does)."""
    found = [i for i in (text.find(stop) for stop in PLAIN_STOPS) if i >= 0]
    return min(found) if found else None


@dataclass(frozen=True)
class PlainReply:
    """A reply sampled in the plain frame, cut at its stop (:func:`plain_cut`)."""

    ids: tuple[int, ...]
    """The answer's ids: those whose text ends before the stop."""
    stopped: bool
    """A stop was found: the reply ended (it was not cut off by the token cap)."""
    spent: int
    """Tokens generated up to the one at which the stop is complete (all of them where none is): what an engine
    that stops there generates."""


def plain_cut(decode: Callable[[Sequence[int]], str], gen: Sequence[int]) -> PlainReply:
    """The part of a reply sampled in the plain frame that is its answer.

    A reply ends where the first of :data:`PLAIN_STOPS` starts in its decoded
    text (a blank line, a role label at the start of a line). Its ids are the
    longest run of leading ids whose text ends before that point, so the
    answer's text is exactly ``decode(ids)`` (a follow-up keeps them) and
    holds nothing of the stop; a token that straddles the stop is dropped
    whole. Every engine cuts its replies here, whatever it generated past the
    stop, so they agree on the ids and the token count.
    """
    ids = tuple(int(g) for g in gen)
    full = decode(ids)
    end = plain_stop(full)
    if end is None:
        return PlainReply(ids, False, len(ids))
    keep, fits = 0, True
    for k in range(1, len(ids) + 1):  # the stop is complete at or after the first token that crosses ``end``
        head = decode(ids[:k])
        fits = fits and len(head) <= end and full.startswith(head)
        keep = k if fits else keep
        if plain_stop(head) is not None:
            return PlainReply(ids[:keep], True, k)
    raise AssertionError("the whole reply holds a stop, so one of its prefixes does")  # pragma: no cover
