"""The synthetic subject's hashed randomness (:mod:`engines.sim`): uniform and normal numbers fixed by (seed, keys),
so every planted and sampled value is a deterministic function of its parameters and the trial alone, never of the
batch or the order of calls.
"""

from __future__ import annotations

import hashlib
import json
import math


def digest(seed: int, *keys: object) -> bytes:
    return hashlib.sha256(json.dumps([seed, *keys], sort_keys=True, ensure_ascii=False).encode()).digest()


def uniform(seed: int, *keys: object) -> float:
    """A uniform number in (0, 1) fixed by (seed, keys)."""
    return (int.from_bytes(digest(seed, *keys)[:8], "little") + 0.5) / 2.0**64


def normal(seed: int, *keys: object) -> float:
    """A standard normal number fixed by (seed, keys) (Box-Muller on two hashed uniforms)."""
    d = digest(seed, *keys)
    u1 = (int.from_bytes(d[:8], "little") + 0.5) / 2.0**64
    u2 = (int.from_bytes(d[8:16], "little") + 0.5) / 2.0**64
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def draw_uniforms(seed: int, trial_id: str, draw: int) -> tuple[float, float, float]:
    """Three uniforms in (0, 1) for one sampled draw, fixed by (sampling seed, trial, draw)."""
    d = hashlib.sha256(f"sim:{seed}:{trial_id}:{draw}".encode()).digest()
    u1, u2, u3 = ((int.from_bytes(d[k : k + 8], "little") + 0.5) / 2.0**64 for k in (0, 8, 16))
    return u1, u2, u3
