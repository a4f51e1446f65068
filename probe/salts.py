"""Salted replicates: meaningless context strings that give a within-form noise floor.

A greedy readout is deterministic, so repeating it measures nothing. Putting a
meaningless string into the prompt perturbs the context without changing the
question; the spread of readouts over salts is the within-form noise the
greedy channel otherwise hides (paper 003, salt replication).

Salts are hex strings drawn from a seeded stream. When the engine's tokenizer
is known the draw is rejected until the salt has exactly ``n_tokens`` tokens,
so every replicate perturbs the prompt by the same amount; without a tokenizer
(API engines) the salt has ``2 * n_tokens`` characters.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from probe.types import Message, Trial, make_trial_id

SaltPlace = Literal["user_start", "user_end", "system"]
SALT_PLACES: tuple[str, ...] = ("user_start", "user_end", "system")
_MAX_DRAWS = 10_000


@dataclass(frozen=True)
class SaltSpec:
    """How salted replicates are made.

    ``count`` replicates in all: replicate 0 is unsalted, 1..count-1 are salted.
    """

    count: int = 1
    seed: int = 0
    n_tokens: int = 8
    place: SaltPlace = "user_start"

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"salts: count must be >= 1 (1 = unsalted only), got {self.count}")
        if not 1 <= self.n_tokens <= 64:
            raise ValueError(f"salts: n_tokens must be in 1..64, got {self.n_tokens}")
        if self.place not in SALT_PLACES:
            raise ValueError(f"salts: place must be one of {SALT_PLACES}, got {self.place!r}")


def _hex_stream(seed: int, replicate: int, draw: int, n_chars: int) -> str:
    out = ""
    block = 0
    while len(out) < n_chars:
        out += hashlib.sha256(f"probe-salt:{seed}:{replicate}:{draw}:{block}".encode()).hexdigest()
        block += 1
    return out[:n_chars]


def make_salt(
    replicate: int,
    spec: SaltSpec,
    count_tokens: Callable[[str], int] | None = None,
) -> str:
    """The salt of ``replicate`` (``""`` for replicate 0).

    Deterministic in (seed, replicate, tokenizer). With ``count_tokens``, draws
    hex strings of growing length until one has exactly ``spec.n_tokens``
    tokens.
    """
    if replicate < 0:
        raise ValueError(f"replicate must be >= 0, got {replicate}")
    if replicate == 0:
        return ""
    if count_tokens is None:
        return _hex_stream(spec.seed, replicate, 0, 2 * spec.n_tokens)
    for draw in range(_MAX_DRAWS):
        # Try lengths around the target so tokenizers that merge hex pairs also converge.
        for n_chars in range(spec.n_tokens, 4 * spec.n_tokens + 1):
            cand = _hex_stream(spec.seed, replicate, draw, n_chars)
            n = count_tokens(cand)
            if n == spec.n_tokens:
                return cand
            if n > spec.n_tokens:
                break
    raise RuntimeError(f"could not draw a salt of exactly {spec.n_tokens} tokens; try another n_tokens")


def apply_salt(system: str | None, user: str, salt: str, place: SaltPlace) -> tuple[str | None, str]:
    """Insert ``salt`` into (system, user) text at ``place``; returns the new pair."""
    if not salt:
        return system, user
    if place == "user_start":
        return system, f"{salt}\n\n{user}"
    if place == "user_end":
        return system, f"{user}\n\n{salt}"
    return (f"{system}\n\n{salt}" if system else salt), user


def salted_trials(
    experiment: str,
    item_id: str,
    factors: dict[str, str],
    text: str,
    options: tuple[str, ...],
    meaning: tuple[str, ...],
    salts: Sequence[str],
    place: SaltPlace,
) -> list[Trial]:
    """The trials of one single-turn question, one per salt replicate (``salts[r]`` for replicate r).

    Every instrument builds its trials through here, so salting, message
    layout and the trial id are the same everywhere.
    """
    out = []
    for rep, salt in enumerate(salts):
        system, user = apply_salt(None, text, salt, place)
        msgs = ((Message("system", system),) if system else ()) + (Message("user", user),)
        out.append(
            Trial(
                trial_id=make_trial_id(experiment, item_id, factors, salt, rep),
                experiment=experiment,
                item_id=item_id,
                factors=factors,
                messages=msgs,
                options=options,
                meaning=meaning,
                salt=salt,
                replicate=rep,
            )
        )
    return out
