"""The API engine's model specs and settings (:mod:`engines.api`): ``openai:<model>``, ``anthropic:<model>``,
``openai-compatible:<name>@<base_url>``, and :class:`ApiSettings`, each field its flag.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlparse

from engines.api.providers import HOST_KEY_ENV, KEY_ENV, PROVIDERS
from engines.base import EngineSettings, Supports
from engines.flags import NO_FLAG, flag

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})


# ------------------------------------------------------------------ specs
@dataclass(frozen=True)
class ModelSpec:
    provider: str
    model: str
    base_url: str | None = None

    @property
    def host(self) -> str | None:
        return urlparse(self.base_url).hostname if self.base_url else None


def parse_model_spec(spec: str) -> ModelSpec:
    """``openai:<model>``, ``anthropic:<model>`` or ``openai-compatible:<name>@<base_url>``."""
    provider, sep, rest = spec.partition(":")
    if not sep or provider not in PROVIDERS:
        raise ValueError(
            f"API model spec {spec!r} must start with one of {', '.join(p + ':' for p in PROVIDERS)} "
            "(e.g. openai:gpt-5.5, anthropic:claude-sonnet-4-6, openai-compatible:llama@http://127.0.0.1:8000/v1)"
        )
    if provider != "openai-compatible":
        if not rest:
            raise ValueError(f"API model spec {spec!r} names no model; write {provider}:<model>")
        return ModelSpec(provider, rest)
    cut = max(rest.rfind("@http://"), rest.rfind("@https://"))
    if cut <= 0:
        raise ValueError(
            f"openai-compatible model spec {spec!r} needs <name>@<base_url> with an http(s) URL, "
            "e.g. openai-compatible:tiny@http://127.0.0.1:8000/v1"
        )
    return ModelSpec(provider, rest[:cut], rest[cut + 1 :].rstrip("/"))


# --------------------------------------------------------------- settings
def _extra_body(text: str | None) -> dict[str, Any]:
    """The ``--api-extra-body`` text as a dict (none: an empty one)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--api-extra-body is not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"--api-extra-body must be a JSON object, got {text!r}")
    return value


SUPPORTS = Supports(
    "api",
    plain="--frame plain needs the prompt rendered to token ids here, and the API engine sends chat messages that "
    "{provider} renders with its own template; read a base model with the Transformers or vLLM engine, or "
    "through a server that returns log probabilities (docs/engines.md)",
)
"""The API engine sends chat messages (no plain frame), has a think mode (the provider's reasoning), and no hidden
states."""


@dataclass(frozen=True)
class ApiSettings(EngineSettings):
    """Settings of the API engine (all recorded in the run manifest; see :meth:`ApiEngine.identity`).

    Of the shared settings: ``think`` asks the model to reason (Anthropic adaptive thinking, ``enable_thinking``
    on a compatible server), and ``max_new_tokens`` is per call, with ``think_budget`` added when the model reasons.
    Each field but the model spec's (``provider``, ``base_url``) is its flag (:mod:`engines.flags`).
    """

    provider: str = field(metadata=NO_FLAG)
    base_url: str | None = field(default=None, metadata=NO_FLAG)
    """The endpoint of an openai-compatible model (None: the provider's default)."""
    thinking_budget: int | None = None
    """Extended thinking budget of Anthropic models (>= 1024): manual extended thinking with this many tokens."""
    reasoning_effort: str | None = field(default=None, metadata=flag(choices=EFFORTS))
    """Reasoning effort of OpenAI / Anthropic models.

    Sent as OpenAI's ``reasoning_effort`` and Anthropic's ``output_config.effort``."""
    extra_body: Mapping[str, Any] = field(
        default_factory=dict, metadata=flag(name="api-extra-body", convert=_extra_body)
    )
    """JSON object merged into every request, e.g. '{"top_k": 20}'."""
    api_key_env: str | None = None
    """Environment variable with the key (default: the provider's usual one)."""
    concurrency: int = 16
    """Most API calls in flight; the adaptive limit starts lower and grows to this cap."""
    timeout: float = field(default=300.0, metadata=flag(name="api-timeout"))
    """Seconds one call may take before it counts as a transport timeout and is retried."""
    max_retries: int = field(default=8, metadata=flag(name="api-retries"))
    """Transport retries per call; when they are spent the run stops, to be resumed."""
    max_cost: float | None = None
    """USD budget for the whole run, resumes included: the run stops before its spend would pass it (default: no
    limit)."""
    dry_run: bool = False
    """Print the calls and their estimated cost, call nothing."""
    prices: str | None = None
    """Price table YAML (default: engines/api/data/prices.yaml)."""
    batch: bool = field(default=False, metadata=flag(name="batch-api"))
    """Use the provider's batch interface for single-turn trials."""
    batch_poll: float = 30.0
    """Seconds between polls of a running batch."""

    SUPPORTS: ClassVar[Supports] = SUPPORTS

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ValueError(f"provider must be one of {PROVIDERS}, got {self.provider!r}")
        if not self.model:
            raise ValueError("the model name is empty")
        super().__post_init__()
        if self.provider == "openai-compatible" and not self.base_url:
            raise ValueError("an openai-compatible model needs a base URL: openai-compatible:<name>@<base_url>")
        for name in ("max_new_tokens", "think_budget", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_retries < 0:
            raise ValueError(f"--api-retries must be >= 0, got {self.max_retries}")
        if not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise ValueError(f"--api-timeout must be a number of seconds > 0, got {self.timeout}")
        if self.max_cost is not None and not (self.max_cost >= 0 and math.isfinite(self.max_cost)):
            raise ValueError(f"--max-cost must be a number of USD >= 0, got {self.max_cost}")
        if self.reasoning_effort is not None and self.reasoning_effort not in EFFORTS:
            raise ValueError(f"--reasoning-effort must be one of {', '.join(EFFORTS)}, got {self.reasoning_effort!r}")
        if self.thinking_budget is not None:
            if self.provider != "anthropic":
                raise ValueError("--thinking-budget is Anthropic's extended thinking; use --reasoning-effort elsewhere")
            if self.thinking_budget < 1024:
                raise ValueError(f"--thinking-budget must be >= 1024 (Anthropic's minimum), got {self.thinking_budget}")
        if self.think and self.provider == "openai":
            raise ValueError("OpenAI models reason by effort: use --reasoning-effort instead of --think")
        if self.batch_poll <= 0:
            raise ValueError(f"--batch-poll must be > 0 seconds, got {self.batch_poll}")
        if not isinstance(self.extra_body, Mapping):
            raise ValueError(f"--api-extra-body must be a JSON object, got {self.extra_body!r}")

    @property
    def reasons(self) -> bool:
        return self.think or self.thinking_budget is not None or self.reasoning_effort not in (None, "none")

    @property
    def max_tokens(self) -> int:
        """The token limit sent: the answer allowance plus, when the model reasons, the reasoning allowance."""
        if self.thinking_budget is not None:
            return self.max_new_tokens + self.thinking_budget
        return self.max_new_tokens + (self.think_budget if self.reasons else 0)

    @property
    def host(self) -> str | None:
        return urlparse(self.base_url).hostname if self.base_url else None

    def key_env(self) -> tuple[str | None, bool]:
        """(variable, required): where the key lives and whether a missing one is an error."""
        if self.api_key_env:
            return self.api_key_env, True
        if self.provider in KEY_ENV:
            return KEY_ENV[self.provider], True
        host = self.host or ""
        if host in HOST_KEY_ENV:
            return HOST_KEY_ENV[host], True
        return "OPENAI_API_KEY", False  # a self-hosted server usually wants no key
