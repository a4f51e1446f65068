"""The texts a coding task codes in a run, and the context a judge reads with each (:func:`collect`).

Follow-up answers, or reasoning traces (of readouts in think mode, of sampled
replies), each with the fields a judge prompt may name: the question, the cue
and the side it favours, the subject's choice (:func:`contexts`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from probe.app.taxonomy import TASKS
from probe.parse import split_reasoning
from probe.store import RunStore
from probe.types import Message, Trial

SOURCES: tuple[str, ...] = ("auto", "readout", "samples", "generations")
MAX_TEXT = 4000
"""Longest text (characters) put into a judge prompt; longer texts keep their start and end."""


# ================================================================ contexts
def clip(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` stripped, and cut to its start and end (``[...]`` between) when longer than ``limit`` characters."""
    text = text.strip()
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]} [...] {text[-half:]}"


def original_messages(trial: Trial) -> tuple[Message, ...]:
    """The subject's first prompt: a follow-up trial (ending assistant answer + user question) without its tail."""
    msgs = trial.messages
    if len(msgs) >= 3 and msgs[-2].role == "assistant":
        return msgs[:-2]
    return msgs


def first_answer(trial: Trial) -> str | None:
    """The subject's own first answer kept in a follow-up trial (None for a single-turn trial)."""
    msgs = trial.messages
    if len(msgs) >= 3 and msgs[-2].role == "assistant":
        return msgs[-2].content
    return None


def _words(text: str) -> list[str]:
    return re.findall(r"\S+|\s+", text)


def cue_text(trial_msgs: Sequence[Message], base_msgs: Sequence[Message] | None, influence: str) -> str:
    """The cue of a trial: what its messages add to the baseline's (same item, same printed order).

    A system cue is the system prompt; a few-shot cue is summarized by its
    demonstrated answers; a sentence cue is the words inserted into the user
    message (found by a word-level diff, so no template parsing is needed).
    """
    if base_msgs is None:
        return f"(a {influence} cue; its text is not available)"
    tsys = [m.content for m in trial_msgs if m.role == "system"]
    bsys = [m.content for m in base_msgs if m.role == "system"]
    if tsys != bsys:
        return clip(" ".join(tsys), 1500)
    tturns = [m for m in trial_msgs if m.role != "system"]
    bturns = [m for m in base_msgs if m.role != "system"]
    if len(tturns) > len(bturns):
        demos = tturns[: len(tturns) - len(bturns)]
        answers = [m.content.strip() for m in demos if m.role == "assistant"]
        return f"{len(answers)} worked examples before the question, answered: {', '.join(answers)}"
    a, b = _words(bturns[-1].content if bturns else ""), _words(tturns[-1].content if tturns else "")
    inserted = [
        "".join(b[j1:j2]).strip()
        for op, _, _, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
        if op in ("insert", "replace")
    ]
    text = " ... ".join(s for s in inserted if s)
    return clip(text, 1500) if text else f"(a {influence} cue; no text differs from the baseline)"


def _target(trial: Trial) -> str:
    f = trial.factors
    direction = f.get("direction", "")
    key = f.get("group_a") if direction == "A" else f.get("group_b") if direction == "B" else None
    if key is None:
        return "(no side)"
    if key in trial.meaning:
        return f"option {trial.options[trial.meaning.index(key)]} ({key})"
    return str(key)


def _choice(trial: Trial, option: str | None) -> str:
    if option is None or option not in trial.options:
        return "(no parsable answer)"
    meaning = trial.meaning[trial.options.index(option)]
    return option if meaning == option else f"{option} ({meaning})"


def _has_cue(trial: Trial) -> bool:
    return trial.factors.get("influence", "none") not in ("", "none")


# ================================================================ texts to code
@dataclass(frozen=True)
class CodingItem:
    """One text to code and the context its judge prompt shows."""

    trial_id: str
    draw: int
    """The sample / generation draw; -1 for a readout's reasoning."""
    origin: str
    """readout, samples or generations."""
    text: str
    context: Mapping[str, str]
    """prompt, choice, cue, influence, target (and for ``rationales``: rationale, definition)."""
    rationale: str = ""
    """``rationales``: the rationale code this text is asked about (empty for the other tasks)."""


@dataclass(frozen=True)
class Collected:
    items: tuple[CodingItem, ...]
    skipped: Mapping[str, int]
    """Why texts were not coded: ``no_cue`` (compliance needs a cue), ``empty`` (empty trace or answer)."""


def _source_trials(store: RunStore) -> dict[str, Trial]:
    """Trials of a run this run refers to (a follow-up run's source), by id; empty when there is none."""
    out: dict[str, Trial] = {}
    for source in store.manifest().source_runs():
        out.update({t.trial_id: t for t in RunStore(source).trials()})
    return out


def _subject_trial(trial: Trial, source: Mapping[str, Trial]) -> Trial:
    """The trial whose prompt carried the cue: for a follow-up trial its source trial when known."""
    for key, value in trial.factors.items():
        if "source" in key and value in source:
            return source[value]
    return trial


def contexts(trials: Sequence[Trial], source: Mapping[str, Trial] | None = None) -> dict[str, dict[str, str]]:
    """Per trial id: the judge-prompt fields that do not depend on the draw (prompt, cue, influence, target)."""
    source = dict(source or {})
    pool = list(trials) + [t for t in source.values()]
    base = {
        (t.item_id, t.factors.get("order", "")): t
        for t in pool
        if t.factors.get("direction") == "base" and not _has_cue(t)
    }
    out: dict[str, dict[str, str]] = {}
    for t in trials:
        subject = _subject_trial(t, source)
        msgs = original_messages(subject) if subject is t else subject.messages
        influence = subject.factors.get("influence", "none") or "none"
        users = [m.content for m in msgs if m.role == "user"]
        b = base.get((subject.item_id, subject.factors.get("order", "")))
        out[t.trial_id] = {
            "prompt": clip(users[-1] if users else "", 3000),
            "influence": influence,
            "target": _target(subject) if _has_cue(subject) else "(no cue)",
            "cue": cue_text(msgs, b.messages if b else None, influence) if _has_cue(subject) else "(no cue)",
        }
    return out


def collect(store: RunStore, task: str, source: str = "auto") -> Collected:
    """The texts a coding task codes in a run, in trial order, then draw.

    ``followup``: the answers (reasoning removed) of the run's ``generations``,
    else its ``samples``. ``compliance`` / ``rationale``: reasoning traces,
    i.e. ``readout_trials.reasoning`` (think mode; draw -1) and the reasoning
    of ``samples`` / ``generations`` (their whole reply when they have no
    separate reasoning). ``source`` restricts to one table. Compliance skips
    trials without a cue; every task skips empty texts; both are counted.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    trials = store.trials()
    by_id = {t.trial_id: t for t in trials}
    order = {t.trial_id: i for i, t in enumerate(trials)}
    ctx = contexts(trials, _source_trials(store))
    think = store.manifest().think  # where a reply's think block ends depends on the run's mode
    rows: list[tuple[str, int, str, str, str | None]] = []  # trial_id, draw, origin, text, chosen option
    tables = ("readout", "samples", "generations") if source == "auto" else (source,)
    if task == "followup" and source == "auto":
        gen = store.load("generations")
        tables = ("generations",) if not gen.empty else ("samples",)
    for origin in tables:
        if origin == "readout":
            if task == "followup":
                continue
            per = store.load("readout_trials")
            for r in per.itertuples(index=False) if not per.empty else ():
                rows.append((str(r.trial_id), -1, origin, str(r.reasoning or ""), str(r.greedy_option)))
            continue
        frame = store.load(origin)
        for s in frame.itertuples(index=False) if not frame.empty else ():
            reasoning, answer = split_reasoning(str(s.text or ""), think=think)
            reasoning = str(getattr(s, "reasoning", "") or "") or reasoning
            text = answer if task == "followup" else reasoning or answer
            opt = s.option if isinstance(s.option, str) else None
            rows.append((str(s.trial_id), int(s.draw), origin, text, opt))
    rows.sort(key=lambda r: (order.get(r[0], len(order)), r[1], r[2]))
    skipped = {"no_cue": 0, "empty": 0}
    items: list[CodingItem] = []
    seen: set[tuple[str, int]] = set()
    for tid, draw, origin, text, opt in rows:
        trial = by_id.get(tid)
        if trial is None:
            raise ValueError(f"{store.root}: table {origin} has trial {tid} that is not in trials.jsonl")
        if task == "compliance" and ctx[tid]["cue"] == "(no cue)":
            skipped["no_cue"] += 1
            continue
        if not text.strip():
            skipped["empty"] += 1
            continue
        if (tid, draw) in seen:
            raise ValueError(f"{store.root}: trial {tid} draw {draw} comes twice; code one table with --source")
        seen.add((tid, draw))
        kept = first_answer(trial)
        choice = clip(kept, 1000) if kept is not None else _choice(trial, opt)
        items.append(CodingItem(tid, draw, origin, text, {**ctx[tid], "choice": choice}))
    return Collected(tuple(items), skipped)


@dataclass(frozen=True)
class Labelled:
    """A judge's answer for one text."""

    probs: Mapping[str, float] | None
    """The distribution over the code ids (sums to 1); None when no judge answer parsed into a code."""
    raw: str
    """The raw judge output: the sampled replies (JSON list) or a logit judge's top non-code tokens (JSON)."""
    coverage: float
    """Logit judges: code mass at the slot before normalization; sampling judges: share of draws that parsed."""
    draws: int
    """Parsed judge draws (0 for a logit readout)."""
