"""The answer parser shared by every engine's ``sample()``.

Sampled text is turned into one of the trial's options, or a status. The
order of the rules matters and is the documented contract:

1. **exact label**: the reply (think block removed, markup and trailing
   punctuation stripped) is one option;
2. **stated format**: the last line of the form ``Answer: X`` names an option;
3. **refusal**: a recognizable refusal phrase -> ``refusal`` (checked before the
   next rule so that "I can't say yes to this" is not read as *yes*);
4. **single standalone label**: exactly one option occurs as a standalone
   token in the reply;
5. everything else is ``invalid``.

Refusals and invalid answers are data: callers must never retry them away.

**The think block depends on the mode** (:func:`split_reasoning`, ``think``).
The rules read the answer: the reply with its think block removed. In think
mode the chat template opens the block (``<think>\n``) and the model closes
it, so everything before the first ``</think>`` is reasoning. Outside think
mode the template has already closed an empty block (``<think>\n\n</think>``)
before the reply, so a ``</think>`` the model writes is a stray token *inside*
the answer, not the end of reasoning: ``" pick one answer.\n</think>\n\nNo"``
is not an answer at the slot (rule 1 fails on its first sentence); rule 4
takes it when exactly one option stands alone in it (here *No*), else it is
``invalid``. Every caller says which mode the reply came from.

**Forced answers end at the answer.** A trial that asks for one of its
options (a readout trial sampled with ``stop_at_answer``; ``forced=True``
here) is answered by the answer's first sentence or line when that is exactly
one option: "No. The man..." answers *No*. :func:`answer_end` finds that
point; the rules above then parse the answer up to it. This is what the answer-slot readout reads
too (the first tokens of the reply), and it is what lets an engine stop a draw
there: nothing generated after that point can change the parse. Free-text
replies (generated trials, judged) are always parsed whole.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from probe.types import Sample, SampleStatus, Trial

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_OPEN_THINK = re.compile(r"^.*?</think>", re.DOTALL)
_STRIP = " \t\r\n*_`\"'“”‘’()[]{}.,;:!?"
_ANSWER_LINE = re.compile(r"^\s*(?:\*\*)?(?:final\s+)?answer(?:\*\*)?\s*[:：]\s*(.+?)\s*$", re.IGNORECASE)
_REFUSAL = re.compile(
    r"\b(?:i\s*(?:'m|am)\s+(?:not\s+able|unable|not\s+comfortable|not\s+going)\s+to"
    r"|i\s+(?:can(?:no|')t|cannot|won't|will\s+not|must\s+decline|decline\s+to|refuse\s+to"
    r"|(?:don't|do\s+not)\s+feel\s+comfortable)"
    r"|as\s+an\s+ai\b"
    r"|it(?:'s|\s+is|\s+would\s+(?:not\s+)?be)\s+(?:not\s+)?(?:appropriate|inappropriate)\s+for\s+me)",
    re.IGNORECASE,
)
_APOSTROPHES = str.maketrans({"’": "'", "‘": "'", "ʼ": "'"})


@dataclass(frozen=True)
class Parsed:
    option: str | None
    status: SampleStatus
    rule: str
    """Which rule decided: exact, stated, standalone, refusal or none."""


def split_reasoning(text: str, *, think: bool) -> tuple[str, str]:
    """Split ``text`` into (reasoning, answer) at a think block, if any.

    A whole ``<think>...</think>`` block is reasoning in either mode. ``think``:
    the reply was generated in think mode, where the template opened the
    block, so text before a ``</think>`` with no ``<think>`` is reasoning too.
    Outside think mode such a ``</think>`` stays in the answer (the module
    docstring says why).
    """
    m = _THINK.search(text)
    if m:
        return m.group(0)[len("<think>") : -len("</think>")].strip(), (text[: m.start()] + text[m.end() :]).strip()
    m = _OPEN_THINK.search(text) if think else None  # think mode: the template opened the block, the model closed it
    if m:
        return m.group(0)[: -len("</think>")].strip(), text[m.end() :].strip()
    if "<think>" in text:  # never closed: all reasoning, no answer
        return text.split("<think>", 1)[1].strip(), ""
    return "", text.strip()


def _fold(options: Sequence[str]) -> bool:
    """Match case-insensitively unless that would merge two options."""
    return len({o.casefold() for o in options}) == len(options)


def _match(candidate: str, options: Sequence[str], fold: bool) -> str | None:
    cand = candidate.strip(_STRIP)
    for o in options:
        if cand == o or (fold and cand.casefold() == o.casefold()):
            return o
    return None


def _standalone(text: str, options: Sequence[str], fold: bool) -> set[str]:
    found: set[str] = set()
    flags = re.IGNORECASE if fold else 0
    for o in options:
        if re.search(rf"(?<!\w){re.escape(o)}(?!\w)", text, flags):
            found.add(o)
    return found


_END = re.compile(r"\n|[.!?,;](?=\s)")
"""An end-of-answer mark: a line break, or sentence punctuation followed by white space."""


def _key(text: str, fold: bool) -> str:
    return text.casefold() if fold else text


def answer_scan(reply: str, options: Sequence[str]) -> tuple[int | None, bool]:
    """``(end, open)`` of a reply, possibly still being generated, to a forced-answer trial.

    ``end``: where the answer ends (just after the first end-of-answer mark
    whose sentence is exactly one option, markup and punctuation stripped as
    in rule 1), or None. ``open``: no end yet, but more text could still make
    one (the reply so far is the start of an option). Once ``end`` is set or
    ``open`` is False, no continuation of the reply changes either. A mark
    inside a longer option ("wait, then act" after "wait,") keeps the
    answer open.
    """
    fold = _fold(options)
    body = reply.lstrip()
    start = len(reply) - len(body)
    keys = [_key(o, fold) for o in options]
    for m in _END.finditer(body):
        head = body[: m.end()]
        lead = _key(head.lstrip(_STRIP), fold)
        longer = [k for k in keys if k.startswith(lead) and k != lead]
        hit = _match(head, options, fold)
        if hit is not None and not longer:
            return start + m.end(), False
        if not longer:
            return None, False  # the first sentence is no option and no start of one
    lead = _key(body.strip(_STRIP), fold)
    return None, any(k.startswith(lead) for k in keys)


def answer_end(reply: str, options: Sequence[str]) -> int | None:
    """Where the answer of a finished reply to a forced-answer trial ends (None: parse the reply whole)."""
    return answer_scan(reply, options)[0]


def parse_answer(text: str, options: Sequence[str], *, think: bool, forced: bool = False) -> Parsed:
    """Parse a sampled reply into one of ``options`` (see the module docstring).

    ``think``: the reply was generated in think mode (:func:`split_reasoning`).
    ``forced``: the trial asks for one of its options, so the answer (the reply
    after any think block) is parsed only up to :func:`answer_end`.
    """
    _, answer = split_reasoning(text, think=think)
    if forced:
        end = answer_end(answer, options)
        answer = answer if end is None else answer[:end]
    fold = _fold(options)
    if (hit := _match(answer, options, fold)) is not None:
        return Parsed(hit, "ok", "exact")
    for line in reversed(answer.splitlines()):
        m = _ANSWER_LINE.match(line)
        if m:
            hit = _match(m.group(1), options, fold)
            if hit is not None:
                return Parsed(hit, "ok", "stated")
            break
    if _REFUSAL.search(answer.translate(_APOSTROPHES)):
        return Parsed(None, "refusal", "refusal")
    found = _standalone(answer, options, fold)
    if len(found) == 1:
        return Parsed(found.pop(), "ok", "standalone")
    return Parsed(None, "invalid", "none")


def parsed_sample(
    trial: Trial,
    draw: int,
    text: str,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    think: bool,
    token_ids: Sequence[int] = (),
    truncated: bool = False,
    stop_at_answer: bool = False,
) -> Sample:
    """A :class:`Sample` from a decoded reply (shared by every local engine).

    Outside think mode the trial's assistant prefix is put back in front of the
    reply, because the model saw it and the stated-format rule may need it
    (``Answer: Yes``). ``token_ids`` are the generated ids the text was decoded
    from (stop tokens excluded); the prefix is not among them. ``truncated``: the reply hit the token cap.
    ``stop_at_answer``: a forced answer, parsed up to :func:`answer_end`; ``text`` keeps everything generated.
    """
    if trial.assistant_prefix and not think:
        text = trial.assistant_prefix + text
    reasoning, _ = split_reasoning(text, think=think)
    parsed = parse_answer(text, trial.options, think=think, forced=stop_at_answer)
    return Sample(
        trial_id=trial.trial_id,
        replicate=draw,
        text=text,
        option=parsed.option,
        status=parsed.status,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        reasoning=reasoning,
        token_ids=tuple(token_ids),
        truncated=truncated,
    )
