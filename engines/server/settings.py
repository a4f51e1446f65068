"""The settings of readouts through a server (:mod:`engines.server`): the API engine's, and how the slot is read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from engines.api.settings import ApiSettings
from engines.base import Supports
from engines.flags import NO_FLAG, flag

MODES = ("auto", "token_ids", "prompt_logprobs", "top_logprobs")
"""How option tokens are read (``--server-readout``); auto: the first of the others the server offers."""
EXACT_MODES = ("token_ids", "prompt_logprobs")
SUPPORTS = Supports("server")
"""Readouts through a server render locally (both frames, think mode); a server gives no hidden states."""


@dataclass(frozen=True)
class ServerSettings(ApiSettings):
    """The API engine's settings, and how the slot is read through the server (each field its flag but
    ``top_other``, :mod:`engines.flags`)."""

    tokenizer: str | None = None
    """Local copy of the served model's tokenizer: a folder, tiny, smol or a cached hub id (default: the served
    name, resolved as a local model)."""
    readout_mode: str = field(default="auto", metadata=flag(name="server-readout", choices=MODES))
    """How option tokens are read: token_ids (vLLM logprob_token_ids), prompt_logprobs (vLLM), top_logprobs (any
    server; options outside the top-k are bounded), auto (the first the server offers, in that order)."""
    top_other: int = field(default=5, metadata=NO_FLAG)
    """How many of the most likely non-option tokens to report (as the local engines)."""
    top_logprobs: int = 20
    """Most top-k log probabilities asked for in one request.

    vLLM's and OpenAI's default cap is 20."""

    SUPPORTS: ClassVar[Supports] = SUPPORTS

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.provider != "openai-compatible":
            raise ValueError(
                f"readouts through a server need an openai-compatible:<name>@<url> model, got {self.provider}"
            )
        if self.readout_mode not in MODES:
            raise ValueError(f"--server-readout must be one of {', '.join(MODES)}, got {self.readout_mode!r}")
        if not isinstance(self.top_other, int) or self.top_other < 0:
            raise ValueError(f"top_other must be an integer >= 0, got {self.top_other!r}")
        if not isinstance(self.top_logprobs, int) or self.top_logprobs < 1:
            raise ValueError(f"--top-logprobs must be an integer >= 1, got {self.top_logprobs!r}")
