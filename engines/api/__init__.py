"""The API engine (``openai:<model>``, ``anthropic:<model>``, ``openai-compatible:<name>@<url>``): frontier models
by sampling, nothing lost on a crash, nothing paid twice.

One module a concern (docs/engines.md): :mod:`engines.api.settings` (:class:`ApiSettings`, the model spec),
:mod:`engines.api.providers` (request bodies and replies per provider, error classes), :mod:`engines.api.retry`
(the retry policy, the one retry loop, the adaptive concurrency limit), :mod:`engines.api.transport` (the client,
the run's lock), :mod:`engines.api.journal` (every call on disk), :mod:`engines.api.pricing` (usage, cost),
:mod:`engines.api.online` (concurrent calls under a budget), :mod:`engines.api.batch` (batch interfaces),
:mod:`engines.api.engine` (:class:`ApiEngine`). The server engine shares the transport, retries and journal.
"""

from engines.api.engine import ApiEngine, add_arguments, from_args, request_identity
from engines.api.settings import SUPPORTS, ApiSettings, parse_model_spec

__all__ = ["SUPPORTS", "ApiEngine", "ApiSettings", "add_arguments", "from_args", "parse_model_spec", "request_identity"]
