"""What ``probe view`` never shows: values in a run's manifest that could be a secret, replaced by ``[redacted]``.

A manifest records the engine's settings, and an API engine's settings can
hold a key, a token or a header; a run folder is copied and shown to others.
:func:`redact` replaces every value that could be a secret: a field named like
one (:func:`secret_name`), a string shaped like a provider's key, a token, a
private key block or a URL's password, and the value of any environment
variable of this process whose name says it is a secret.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["redact", "secret_name"]

_SECRET_WORDS = frozenset(
    {
        "secret", "secrets", "password", "passwords", "passwd", "pwd", "passphrase", "credential", "credentials",
        "auth", "authorization", "cookie", "cookies", "apikey", "apikeys", "privatekey", "header", "headers",
        "bearer",
    }
)  # fmt: skip
"""A field whose name holds one of these words (``aws_secret_access_key``, ``pwd``) is redacted; so is one whose
last word is ``token`` (``hfToken``, ``access_token``; not ``eos_token_id`` or ``max_tokens``)."""
_KEY_KINDS = frozenset(
    {"api", "access", "private", "ssh", "secret", "signing", "encryption", "client", "master", "auth", "app",
     "service", "account", "deploy", "session", "gpg", "pgp"}
)  # fmt: skip
"""A field named ``<kind>_key`` or ``<kind>_keys`` with one of these kinds is redacted (``run_key`` is not)."""
_SECRET_VALUE = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)"
    r"|\b(?:sk-[A-Za-z0-9_-]{12,}"  # OpenAI, Anthropic (sk-ant-), OpenRouter (sk-or-)
    r"|hf_[A-Za-z0-9]{20,}"  # Hugging Face
    r"|AIza[0-9A-Za-z_-]{20,}"  # Google
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key id
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
    r"|npm_[A-Za-z0-9]{30,}"  # npm
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,})"  # a JSON web token
    r"|\b(?:[Bb]earer|[Bb]asic)\s+[A-Za-z0-9._~+/=-]{16,}"  # an Authorization header's value
)
_URL_PASSWORD = re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+@")
"""The ``user:password@`` of a URL."""
_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|AUTH|CREDENTIAL", re.IGNORECASE)


def _env_secrets() -> set[str]:
    """Values of this process's environment variables that look like secrets (never shown)."""
    return {v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= 8}


def secret_name(name: str) -> bool:
    """Whether a field named ``name`` could hold a secret: its words (split at ``_``, ``-``, ``.``, spaces and
    camelCase) hold a word of :data:`_SECRET_WORDS`, or end in ``key``/``keys`` after a word of :data:`_KEY_KINDS`
    (``private_key``, ``ssh_key``, ``api_keys``, ``apiKey``; not ``run_key``), or its last word is ``token``."""
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()) if w]
    if any(w in _SECRET_WORDS for w in words) or words[-1:] == ["token"]:
        return True
    return len(words) >= 2 and words[-1] in ("key", "keys") and words[-2] in _KEY_KINDS


def redact(obj: Any, secrets: set[str] | None = None) -> Any:
    """``obj`` (a manifest) with every value that could be a secret replaced by ``[redacted]``: fields named like
    a key, token, password or header (:func:`secret_name`), strings shaped like a provider's key, a token, a
    private key block or a URL's password, and any secret environment value."""
    secrets = _env_secrets() if secrets is None else secrets
    if isinstance(obj, Mapping):
        return {
            str(k): ("[redacted]" if secret_name(str(k)) and v not in (None, "", {}, []) else redact(v, secrets))
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [redact(v, secrets) for v in obj]
    if isinstance(obj, str):
        out = _URL_PASSWORD.sub("[redacted]@", _SECRET_VALUE.sub("[redacted]", obj))
        for s in secrets:
            if s in out:
                out = out.replace(s, "[redacted]")
        return out
    return obj
