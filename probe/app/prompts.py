"""The prompt of a stored trial exactly as the model saw it, for ``probe view`` and ``probe show``.

The run store keeps each trial's chat messages, its salt (already in the
messages) and its assistant prefix, and each readout's prompt length in
tokens, but not the prompt's token ids. So the exact text is rebuilt the way
the engine built it:

* **hf / vllm** (Transformers and vLLM read the slot through the same
  :func:`engines.render.render_ids`): the model folder of the manifest
  (``engine.model_path``; the tiny and smol models are local) gives the
  tokenizer and its chat template, the manifest's settings give the system
  prompt and think mode; the ids are rendered and *decoded*, so special tokens,
  the template's own system prompt (SmolLM2 adds one) and the assistant prefix
  appear as the model got them. Their count is checked against the stored
  ``prompt_tokens`` (outside think mode they must be equal). The options' token
  ids come from the same tokenizer (:func:`engines.render.option_ids`).
* **sim**: the messages; the synthetic subject reads them as data and has no
  chat template or tokenizer.
* **api**, or a model folder that is not on this machine: the messages as
  they were sent (with the ``--system`` prompt where the trial has no system
  turn); the server applied its own chat template, which probe never sees.

Nothing is downloaded: a tokenizer is loaded only from a local folder, or a
hub id that is already in the local Hugging Face cache.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.record import EngineRecord, Manifest
from probe.store import as_manifest
from probe.types import Trial

TOKENIZER_ENGINES = ("hf", "vllm")


@dataclass(frozen=True)
class RenderedPrompt:
    """What the model was given for one trial."""

    text: str
    """The prompt up to the answer slot (in think mode: up to where the reasoning starts)."""
    source: str
    """How ``text`` was obtained (tokenizer decode, or the messages as sent)."""
    exact: bool
    """True when ``text`` is the decode of the very ids the engine scored."""
    n_tokens: int | None = None
    """The length of ``text`` in tokens (None where there is no tokenizer to count them)."""
    option_ids: tuple[tuple[int, ...], ...] | None = None
    """Each option's token ids at the slot, in print order (tokenizer engines only)."""
    note: str = ""
    """A check against the store (token count) or why the exact text cannot be shown."""


def messages_text(trial: Trial, system_prompt: str | None) -> str:
    """The messages as sent, one block per turn (``[system]``, ``[user]``, ...)."""
    turns = [(m.role, m.content) for m in trial.messages]
    if system_prompt and not any(r == "system" for r, _ in turns):
        turns.insert(0, ("system", system_prompt))
    return "\n\n".join(f"[{role}]\n{content}" for role, content in turns)


class Renderer:
    """Renders the trials of one run; keeps its tokenizer once loaded (thread-safe)."""

    def __init__(self, manifest: Manifest | Mapping[str, Any]) -> None:
        self.manifest = as_manifest(manifest)
        rec = self.manifest.engine
        self.engine = rec.kind
        self.model_path = rec.model_path or ""
        self.think = rec.think
        self.frame = rec.frame
        sp = rec.setting("system_prompt")
        self.system_prompt = str(sp) if sp is not None else None
        self._tok: Any = None
        self._why: str | None = None
        self._lock = threading.Lock()

    def tokenizer(self) -> Any:
        """The run's tokenizer, or None (and :attr:`_why` says why)."""
        with self._lock:
            if self._tok is None and self._why is None:
                self._tok, self._why = _load_tokenizer(self.manifest.engine)
            return self._tok

    def render(self, trial: Trial, prompt_tokens: int | None = None) -> RenderedPrompt:
        """The prompt of ``trial``; ``prompt_tokens`` (the stored readout's) is checked against the rendering."""
        sent = messages_text(trial, self.system_prompt)
        if self.engine == "sim":
            return RenderedPrompt(
                sent, "messages (the sim engine reads them as data: no chat template, no tokenizer)", False
            )
        if self.engine not in TOKENIZER_ENGINES:
            prefix = f"; the assistant prefix {trial.assistant_prefix!r} is not sent" if trial.assistant_prefix else ""
            return RenderedPrompt(
                sent,
                f"messages as sent to the {self.engine or 'unknown'} engine (its server applies its own chat template{prefix})",
                False,
            )
        tok = self.tokenizer()
        if tok is None:
            return RenderedPrompt(
                sent, "messages (the exact prompt needs the model's tokenizer)", False, note=str(self._why)
            )
        from engines.render import option_ids, render_ids

        with self._lock:
            ids = render_ids(tok, trial, think=self.think, system_prompt=self.system_prompt, frame=self.frame)
            text = tok.decode(list(ids), skip_special_tokens=False)
            try:
                opts: tuple[tuple[int, ...], ...] | None = option_ids(tok, trial, self.frame)
            except ValueError:
                opts = None
        note = ""
        if prompt_tokens is not None and not self.think:
            note = (
                f"{len(ids)} tokens, as stored in the readout"
                if len(ids) == prompt_tokens
                else f"rendered {len(ids)} tokens but the readout stored {prompt_tokens}: the tokenizer or template "
                f"in {self.model_path} is not the one the run used"
            )
        elif self.think:
            note = (
                f"{len(ids)} tokens up to where the reasoning starts; the reasoning, the closing of the think block and "
                "the assistant prefix follow it, shown below as text: their ids are not stored"
            )
        how = "chat template" if self.frame == "chat" else "plain frame (Question:/Answer:, no chat template)"
        source = f"decode of the rendered token ids ({how} and tokenizer of {self.model_path})"
        return RenderedPrompt(text, source, True, len(ids), opts, note)


def _load_tokenizer(rec: EngineRecord) -> tuple[Any, str | None]:
    path = rec.model_path or ""
    if rec.kind not in TOKENIZER_ENGINES:
        return None, f"the {rec.kind} engine has no tokenizer here"
    if not path:
        return None, "the manifest records no model path"
    try:
        import transformers
    except ImportError:
        return None, "transformers is not installed"
    if rec.setting("trust_remote_code"):  # a run folder is untrusted: its manifest may not make us run code
        return None, (
            "the run was made with trust_remote_code, and the viewer never runs code that a run folder's manifest "
            "names (it could come from anyone); the messages are shown instead"
        )
    local = Path(path).is_dir()
    kw: dict[str, Any] = {"local_files_only": True}
    if not local and rec.setting("revision"):
        kw["revision"] = rec.setting("revision")
    try:
        transformers.logging.set_verbosity_error()
        return transformers.AutoTokenizer.from_pretrained(path, **kw), None
    except Exception as e:  # OSError / ValueError for a folder that is gone or a hub id not in the cache
        where = "is not on this machine" if not local else "holds no tokenizer that loads"
        return None, (
            f"the model {path} {where} ({type(e).__name__}); the messages are shown instead. Run `probe view` where "
            "the model is, or put it in the local Hugging Face cache"
        )
