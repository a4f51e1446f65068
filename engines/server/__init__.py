"""The server engine (``openai-compatible:<name>@<url>`` with a readout): answer-slot readouts through a running
OpenAI-compatible server (vLLM's, ``transformers serve``, ``probe serve``); its samples go as the API engine's.

One module a concern (docs/engines.md): :mod:`engines.server.settings` (:class:`ServerSettings`),
:mod:`engines.server.requests` (the completion bodies of a readout), :mod:`engines.server.replies` (reading a
server's reply), :mod:`engines.server.canary` (the check that the server reads what we ask),
:mod:`engines.server.journal` (readout replies on disk), :mod:`engines.server.engine` (:class:`ServerEngine`).
"""

from engines.server.engine import ServerEngine, add_arguments, from_args
from engines.server.settings import SUPPORTS, ServerSettings

__all__ = ["SUPPORTS", "ServerEngine", "ServerSettings", "add_arguments", "from_args"]
