"""The arms of paper 000 beyond the cues proper: J.4's random contexts and the step-by-step instruction.

**Random contexts** (appendix J.4, Table 17) name no group: "a random string of
characters appended to the prompt", the same prepended, and "an incorrect
arithmetic statement ("2 * 3 + 4 / 2 = 111")". They are cues of kind ``random``
in a design (:mod:`experiments.influence.design`); their ``{gibberish}`` field is
filled per trial by :func:`gibberish`, derived from the trial id alone (never a
global generator), so a run's prompts are the same on every machine and resume.

**Step-by-step** (section 3 and Table 2: non-reasoning models get "a
'step-by-step' condition where we prepend a chain-of-thought prompt ("Think
step-by-step before answering")"): :func:`with_step_by_step` prepends the
design's ``step_by_step`` instruction to the last user message.
"""

from __future__ import annotations

import hashlib
import string
from typing import Final

GIBBERISH_LENGTH: Final[int] = 32
"""Characters of one gibberish string (the paper does not give a length; ours, documented in docs/influence.md)."""
GIBBERISH_ALPHABET: Final[str] = string.ascii_letters + string.digits
"""What a gibberish string is drawn from: ASCII letters and digits (no braces, quotes or line breaks)."""
STEP_FACTOR: Final[tuple[str, str]] = ("prompting", "step_by_step")
"""The factor (name, value) every trial of a ``--step-by-step`` run carries (absent otherwise)."""


def gibberish(trial_id: str, length: int = GIBBERISH_LENGTH) -> str:
    """A reproducible random string for one trial: SHA-256 of ``("gibberish", trial_id, block)`` mapped to
    :data:`GIBBERISH_ALPHABET`, one character per byte (the small modulo bias is irrelevant for noise text)."""
    if length < 1:
        raise ValueError(f"gibberish length must be >= 1, got {length}")
    out: list[str] = []
    block = 0
    while len(out) < length:
        digest = hashlib.sha256(f"gibberish\x1f{trial_id}\x1f{block}".encode()).digest()
        out.extend(GIBBERISH_ALPHABET[b % len(GIBBERISH_ALPHABET)] for b in digest)
        block += 1
    return "".join(out[:length])


def random_context(template: str, trial_id: str) -> str:
    """A random context's text for one trial: its template with ``{gibberish}`` filled from the trial id."""
    return template.format(gibberish=gibberish(trial_id))


def with_step_by_step(user: str, instruction: str) -> str:
    """The user message with the step-by-step instruction prepended, then a blank line."""
    return f"{instruction}\n\n{user}"
