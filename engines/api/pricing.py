"""Token usage per call and its cost, from a user-editable price table.

Usage is normalized across providers so that totals mean the same thing:

* ``input_tokens``: every prompt token, cached or not (OpenAI's
  ``prompt_tokens``; Anthropic's ``input_tokens + cache_read_input_tokens +
  cache_creation_input_tokens``, because Anthropic reports the three apart);
* ``cached_tokens``: the part of the prompt read from the provider's cache;
* ``cache_write_tokens``: the part written to it (Anthropic);
* ``output_tokens``: every generated token, reasoning included (both
  providers bill reasoning as output);
* ``reasoning_tokens``: the reasoning part of ``output_tokens``.

Cost = uncached input x input + cached x cached_input + cache writes x
cache_write + output x output, per million tokens, times the batch
multiplier for batch calls.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from probe.errors import ProbeError
from probe.files import read_yaml

DEFAULT_PRICES = Path(__file__).resolve().parent / "data" / "prices.yaml"


@dataclass(frozen=True)
class Usage:
    """Tokens of one call (or a sum of calls), normalized across providers (see the module docstring)."""

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Usage:
        d = d or {}
        return cls(**{f.name: int(d.get(f.name) or 0) for f in fields(cls)})


@dataclass(frozen=True)
class Price:
    """USD per million tokens of one model."""

    input: float
    output: float
    cached_input: float | None = None
    """Prompt-cache reads (None = the input price)."""
    cache_write: float | None = None
    """Prompt-cache writes (None = the input price)."""
    batch: float = 0.5
    """Multiplier for calls made through a batch interface."""
    key: str = ""
    """The price-table key this came from (recorded in the manifest)."""

    def __post_init__(self) -> None:
        for name in ("input", "output", "cached_input", "cache_write", "batch"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"price {self.key or '?'}: {name} must be a number >= 0, got {v!r}")

    def cost(self, usage: Usage, *, batch: bool = False) -> float:
        """USD for ``usage`` at these prices."""
        uncached = max(0, usage.input_tokens - usage.cached_tokens - usage.cache_write_tokens)
        cached = self.input if self.cached_input is None else self.cached_input
        write = self.input if self.cache_write is None else self.cache_write
        usd = (
            uncached * self.input
            + usage.cached_tokens * cached
            + usage.cache_write_tokens * write
            + usage.output_tokens * self.output
        ) / 1e6
        return usd * (self.batch if batch else 1.0)


class PriceTableError(ProbeError, ValueError):
    """A price table that cannot be read: missing, not YAML, or an entry without input and output prices."""


class PriceTable:
    """The price table: ``provider:model[@host]`` keys (wildcards allowed) to :class:`Price`."""

    def __init__(self, prices: Mapping[str, Price], source: str) -> None:
        self.prices = dict(prices)
        self.source = source

    @classmethod
    def load(cls, path: str | Path | None = None) -> PriceTable:
        """Read a price YAML (``prices: {key: {input, output, ...}}``); None = the shipped table."""
        p = Path(path) if path is not None else DEFAULT_PRICES
        doc = read_yaml(p, "price table", PriceTableError, "pass --prices with an existing price YAML")
        entries = doc.get("prices") if isinstance(doc, dict) else None
        if not isinstance(entries, dict):
            raise PriceTableError(f"price table {p} needs a top-level 'prices:' mapping of 'provider:model' to prices")
        known = {"input", "output", "cached_input", "cache_write", "batch"}
        out = {}
        for key, rec in entries.items():
            if not isinstance(rec, dict) or not {"input", "output"} <= set(rec):
                raise PriceTableError(
                    f"price table {p}: entry {key!r} needs at least input and output (USD per 1M tokens)"
                )
            unknown = set(rec) - known
            if unknown:
                raise PriceTableError(
                    f"price table {p}: entry {key!r} has unknown fields {sorted(unknown)}; use {sorted(known)}"
                )
            if rec["input"] is None or rec["output"] is None:
                raise PriceTableError(f"price table {p}: entry {key!r} needs numbers for input and output, got {rec}")
            try:
                nums = {k: (float(v) if v is not None else None) for k, v in rec.items()}
            except (TypeError, ValueError):
                raise PriceTableError(f"price table {p}: entry {key!r} has a non-numeric price: {rec}") from None
            out[str(key)] = Price(
                input=nums["input"] or 0.0,
                output=nums["output"] or 0.0,
                cached_input=nums.get("cached_input"),
                cache_write=nums.get("cache_write"),
                batch=0.5 if nums.get("batch") is None else float(nums["batch"] or 0.0),
                key=str(key),
            )
        return cls(out, str(p))

    def lookup(self, provider: str, model: str, host: str | None = None) -> Price | None:
        """The most specific entry for this model: exact keys first, then the longest matching pattern."""
        names = [f"{provider}:{model}"] + ([f"{provider}:{model}@{host}"] if host else [])
        for name in reversed(names):
            if name in self.prices:
                return self.prices[name]
        hits = [k for k in self.prices if any(fnmatch.fnmatchcase(n, k) for n in names)]
        if not hits:
            return None
        return self.prices[max(hits, key=lambda k: (len(k.replace("*", "")), k))]


def estimate_prompt_tokens(texts: Sequence[str]) -> int:
    """A rough token count of a chat prompt: 4 characters a token plus 4 tokens of framing per message.

    Used only for the dry-run estimate and the budget reserve before any
    call has returned; actual usage replaces it as responses arrive.
    """
    return sum(math.ceil(len(t) / 4) + 4 for t in texts) + 3
