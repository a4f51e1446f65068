"""Readouts through a server: the answer-slot distribution from a running vLLM (or any OpenAI-compatible server
that returns log probabilities), the same :class:`~probe.types.Readout` records as the local engines.

Selected by the model spec users already write for sampling, ``openai-compatible:<name>@<url>``, whenever a
readout is wanted (``probe readout``; ``probe run`` without ``--no-readout``; see :func:`engines.make_engine`).

Why it is shaped like this:

* **The client renders, the server computes.** Every trial is rendered to token ids by
  :mod:`engines.render` with the model's tokenizer (a local copy: ``--tokenizer``, else the served name resolved
  as a local model, e.g. ``tiny`` or ``smol``), exactly as the local engines render it, and sent as a token-id
  prompt to ``/v1/completions``. The server's chat template is never used. Each reply's ``usage.prompt_tokens``
  must equal the ids sent: a server that counted otherwise read a different prompt, and the run is refused,
  naming both counts.
* **Exact option scoring, by what the server offers** (found by the canary, below):
  ``token_ids``: vLLM's ``logprob_token_ids``, the log probabilities of exactly the option tokens, one
  ``max_tokens=1`` request per trie node (:mod:`engines.trie`), plus one top-k request at the slot for the most
  likely non-option tokens: the in-process vLLM engine's requests, sent over HTTP.
  ``prompt_logprobs``: vLLM's ``prompt_logprobs`` on ``prompt + option``: the actual token's log probability at
  every prompt position, inside or outside the top-k, so one request per trie *leaf* (an option that is a
  prefix of no other) gives every conditional on its path, and every trie edge lies on some leaf's path.
  ``top_logprobs``: the plain OpenAI ``logprobs`` top-k at each trie node. An option token outside the top-k is
  not known: its log probability is reported as the bound it cannot exceed (the chain with that token at the
  k-th log probability), never as zero, and ``coverage`` counts only the options known exactly, a lower bound.
* **A canary, once per engine** (:meth:`ServerEngine.load`): one request per mode on a fixed prompt, checked
  for what a working server must return: the prompt token count, finite log probabilities in (-9999, 0], not
  all equal, not all zero, a top-k sorted with the greedy token first, the same value for the same token asked
  two ways. A server that returns constant, zero, sentinel or missing log probabilities (llama.cpp echoes 0.0;
  some providers -9999) is refused with one line naming what it returned. What was found (the modes, the mode
  used, the server's ``/version``, the URL without credentials) goes into the manifest.
* **The API engine's transport, held, not inherited.** The engine holds a :class:`engines.api.transport.Transport`
  (the client, the adaptive concurrency limit, transport retries, the run folder's lock); each readout request is
  a typed :class:`Request` whose ``/v1/completions`` reply is read into a typed :class:`ServerReply`, appended,
  fsync-ed, to ``results/server-journal.jsonl`` (:class:`engines.api.journal.AppendLog`) keyed by the hash of its
  whole request body, so a killed run resumes without sending an answered request again.
* **Sampling through the same prompt.** ``sample()`` is an :class:`engines.api.ApiEngine` the server engine holds
  on the same transport (its journal, budget, progress and parsing), asking each draw through this module
  (:meth:`ServerEngine._ask_draw`): a ``/v1/completions`` request on the same rendered token ids with raw sampling
  (no top-k, top-p, min-p or penalties) and the draw's seed, its completion read as the draw's reply (the text
  decoded from the generated ids), so readout and sampled behaviour come from one prompt and one endpoint, and
  the readout temperature calibration of local runs applies.

The parts, each its own module, composed by :class:`ServerEngine`: the settings (:mod:`engines.server.settings`),
the replies and their checks (:mod:`engines.server.replies`), the requests of a readout and what their replies add
up to (:mod:`engines.server.requests`), the canary (:mod:`engines.server.canary`) and the readout journal
(:mod:`engines.server.journal`). Their public names are importable from here too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engines.api import ApiEngine, ApiSettings, parse_model_spec, request_identity
from engines.api import from_args as api_from_args
from engines.api.engine import Draw
from engines.api.pricing import Usage
from engines.api.providers import Reply
from engines.api.retry import RetryPolicy
from engines.api.transport import ClientFactory, Transport
from engines.base import RAW_SAMPLING, Draws, Engine, ProgressFn, RunFolder, draw_seed, reasoning_record, require
from engines.flags import add_flags, settings_from_flags
from engines.local import (
    Prepared,
    RendersLocally,
    ThinkRequest,
    folder_info,
    reasoning_sampling,
    slot_readout,
    top_others,
    with_stop,
)
from engines.render import plain_cut
from engines.server.canary import CANARY_OPTIONS, CANARY_PROMPT, Canary
from engines.server.journal import ReadoutJournal
from engines.server.replies import (
    NoLogprobs,
    ServerRefused,
    ServerReply,
    check_prompt_count,
    parse_completion,
    public_url,
)
from engines.server.requests import (
    Conditionals,
    Request,
    bounded_readout,
    by_kind,
    completion_body,
    node_requests,
)
from engines.server.settings import ServerSettings
from engines.trie import Trie, build_trie
from probe.errors import ModelError
from probe.types import Message, Readout, Sample, Trial


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The server readout's own flags (the API engine's, like --concurrency, apply too)."""
    g = p.add_argument_group("readouts through a server (openai-compatible:<name>@<url> with a readout)")
    add_flags(g, ServerSettings, own=True)


def settings_from_args(model: str, a: argparse.Namespace) -> ServerSettings:
    """The settings of ``openai-compatible:`` model ``model`` with the parsed flags (the API engine's and these)."""
    spec = parse_model_spec(model)
    return settings_from_flags(ServerSettings, a, provider=spec.provider, model=spec.model, base_url=spec.base_url)


def from_args(model: str, a: argparse.Namespace) -> Any:
    """A server engine, checked by its canary; where the server returns no log probabilities at all (or there is no
    local copy of the model's tokenizer) and the run also samples (``--samples N``), the plain API engine with a
    one-line notice (the sample-only run it was)."""
    engine = ServerEngine(settings_from_args(model, a))
    try:
        return engine.load()
    except (NoLogprobs, ModelError) as e:  # no log probabilities, or no local tokenizer to render the prompt with
        if not getattr(a, "samples", 0):
            raise
        engine._log(f"api: {e}; sampling only (pass --no-readout to skip this check)")
        return api_from_args(model, a)


# ------------------------------------------------------------------ engine
class ServerEngine(RendersLocally, Engine):
    """Answer-slot readouts and samples through an OpenAI-compatible server; see the module docstring.

    It holds its :class:`~engines.api.transport.Transport` and, for sampling, an :class:`~engines.api.ApiEngine`
    on that transport (:attr:`sampler`) whose draws it asks itself. ``tokenizer`` and ``client_factory`` can be
    injected (tests).
    """

    name = "server"
    settings: ServerSettings
    value_settings = (*ApiEngine.value_settings, "top_other", "think_budget")
    """The API engine's value settings, and how many non-option tokens a readout reports and how long it reasons."""

    def __init__(
        self,
        settings: ServerSettings,
        *,
        tokenizer: Any = None,
        client_factory: ClientFactory | None = None,
        log: Any = None,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        self.settings = settings
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.transport = Transport(settings, client_factory=client_factory, retry_policy=retry_policy)
        self.sampler = ApiEngine(
            settings,
            log=self._log,
            transport=self.transport,
            draw=Draw(self._draw_body, self._ask_draw),
            more_stats=lambda: {"readout": self._readout_record()},
        )
        """The draws (journal, budget, progress, parsing): an API engine on this engine's transport."""
        self._tok = tokenizer
        self._tok_path: str | None = None
        self._generation_eos: Any = None
        self._reverse: dict[str, int] | None = None
        self.capabilities: dict[str, Any] | None = None
        """What the canary found (None until :meth:`load`)."""
        self.mode: str = ""
        self.readout_stats: dict[str, float] = {
            "trials": 0,
            "requests": 0,
            "resumed": 0,
            "prompt_tokens": 0,
            "seconds": 0.0,
            "bounded_options": 0,
        }
        """Readout requests sent and answered from the journal, their prompt tokens and wall seconds, and options
        reported as bounds (top_logprobs), since load."""
        self.journal = ReadoutJournal(
            self.transport,
            concurrency=settings.concurrency,
            reverse_for=self._reverse_for,
            session=self.sampler.session,
            stats=self.readout_stats,
            log=self._log,
        )
        """The readout requests' replies: from the run's journal where answered, else sent and journaled."""

    # ---------------------------------------------------------------- loading
    def load(self) -> ServerEngine:
        """Open the client, load the local tokenizer, run the canary once (idempotent)."""
        self.sampler.load()
        self.transport.open_client()  # a dry run sends no draw, but the readout's identity needs the canary's mode
        if self._tok is None:
            self._load_tokenizer()
        if self.capabilities is None:
            self.capabilities = self._probe()
            self.mode = str(self.capabilities["mode"])
        return self

    def _load_tokenizer(self) -> None:
        from probe.models import resolve_model

        s = self.settings
        spec = s.tokenizer or s.model
        try:
            ref = resolve_model(spec)
            transformers = require("transformers", "hf")
            transformers.logging.disable_progress_bar()
            self._tok = transformers.AutoTokenizer.from_pretrained(ref.path, local_files_only=True)
        except (OSError, ValueError, ModelError) as e:
            raise ModelError(
                f"cannot load a local tokenizer for the served model {s.model!r} from {spec!r} "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); readouts through a server render "
                "the prompt here: pass --tokenizer with the model's folder (or tiny, smol, a cached hub id)"
            ) from e
        self._tok_path = ref.path
        self._check_frame(self._tok)
        gen = Path(ref.path) / "generation_config.json"
        self._generation_eos = json.loads(gen.read_text()).get("eos_token_id") if gen.is_file() else None

    def _reverse_vocab(self) -> dict[str, int]:
        """Decoded token text -> id, for servers that name top-k tokens by text (ambiguous texts left out)."""
        if self._reverse is None:
            tok = self.tokenizer
            seen: dict[str, int] = {}
            dup: set[str] = set()
            for i in range(len(tok)):
                text = tok.decode([i], skip_special_tokens=False)
                if text in seen:
                    dup.add(text)
                seen[text] = i
            self._reverse = {k: v for k, v in seen.items() if k not in dup}
        return self._reverse

    # ---------------------------------------------------------------- canary
    def _probe(self) -> dict[str, Any]:
        """Find out once what the server returns, on the canary trial rendered here (:class:`Canary`)."""
        trial = Trial(
            "canary", "canary", "canary", {}, (Message("user", CANARY_PROMPT),), CANARY_OPTIONS, CANARY_OPTIONS
        )
        ids = self.render(trial, think=False)
        yes, no = (o[0] for o in self.option_ids(trial))
        return Canary(self.settings, self.transport, self._reverse_for).run(ids, yes, no)

    def _reverse_for(self, raw: Any) -> dict[str, int] | None:
        """The text -> id map, only where a reply names its top-k tokens by text (not ``token_id:N``)."""
        try:
            top = raw["choices"][0]["logprobs"]["top_logprobs"][0]
        except (KeyError, IndexError, TypeError):
            return None
        if top and not all(str(k).startswith("token_id:") for k in top):
            return self._reverse_vocab()
        return None

    # ------------------------------------------------------------- the journal
    def attach(self, run: RunFolder) -> None:
        """The sampler's journal and the run lock, and the readout journal ``results/server-journal.jsonl``."""
        self.sampler.attach(run)
        self.journal.attach(Path(run.root))

    def close(self) -> None:
        self.sampler.close()
        self.journal.close()

    def fetch(self, requests: Sequence[Request]) -> list[ServerReply]:
        """The reply of every request, in order (:meth:`ReadoutJournal.fetch`)."""
        return self.journal.fetch(requests)

    # ---------------------------------------------------------------- manifest
    def identity(self) -> dict[str, Any]:
        """The API engine's identity under this engine's name and value settings, the readout's mode, the reasoning
        settings, and the local tokenizer's fingerprint."""
        s = self.settings
        return {
            **request_identity(self.name, s, self.value_settings),
            "readout_mode": self.mode,
            **reasoning_record(s),
            **self.frame_identity(),
            "tokenizer": (folder_info(self._tok_path) or {}).get("fingerprint") or s.tokenizer or s.model,
        }

    def describe(self) -> dict[str, Any]:
        """The API engine's record (the URL without credentials), what the canary found, the tokenizer used."""
        d = self.sampler.describe()
        s = self.settings
        d["engine"] = self.name
        d["settings"] = {**d["settings"], "base_url": public_url(s.base_url)}
        d["model_path"] = f"{s.provider}:{s.model}@{public_url(s.base_url)}"
        d["server"] = dict(self.capabilities or {})
        d["tokenizer"] = {
            "source": "local copy",
            "spec": s.tokenizer or s.model,
            "path": self._tok_path,
            **folder_info(self._tok_path),
        }
        d["system_prompt"] = self.system_prompt_record()
        return {**d, **self.frame_record()}

    def run_stats(self) -> dict[str, Any]:
        """The sampler's totals, and the readout requests' under ``readout`` (:meth:`_readout_record`)."""
        return self.sampler.run_stats()

    def _readout_record(self) -> dict[str, Any]:
        """The readout requests' totals: sent, resumed from the journal, throughput, the mode."""
        r: dict[str, Any] = dict(self.readout_stats)
        r["requests_per_s"] = round(r["requests"] / r["seconds"], 3) if r["seconds"] else None
        r["trials_per_s"] = round(r["trials"] / r["seconds"], 3) if r["seconds"] else None
        r["seconds"] = round(r["seconds"], 3)
        r["mode"] = self.mode
        return r

    # ---------------------------------------------------------------- readouts
    def _reason(self, request: ThinkRequest) -> list[list[int]]:
        """The reasoning of think mode, through the server: one ``/v1/completions`` request per trial."""
        s = self.settings
        reqs = [
            Request(
                i,
                (),
                "think",
                completion_body(
                    s.model,
                    ids,
                    max_tokens=request.budget,
                    stop_token_ids=sorted(request.ends),
                    skip_special_tokens=False,
                    return_token_ids=True,
                    logprobs=0,
                    **reasoning_sampling(s, seed),
                ),
            )
            for i, (ids, seed) in enumerate(zip(request.prompts, request.seeds, strict=True))
        ]
        return [with_stop(r.generated, r.stop_reason, request.end_id) for r in self.fetch(reqs)]

    def readout(self, trials: Sequence[Trial], progress: ProgressFn | None = None) -> list[Readout]:
        """The answer-slot distribution of each trial, in input order (see the module docstring)."""
        if not trials:
            return []
        self.load()
        t0 = time.perf_counter()
        before = self.readout_stats["bounded_options"]
        for t in trials:  # fail on a bad option before sending anything
            self.option_ids(t)
        prepared = self.prepare(trials)
        tries = [build_trie(p.options) for p in prepared]
        s = self.settings
        reqs = [
            q
            for i, (p, trie) in enumerate(zip(prepared, tries, strict=True))
            for q in node_requests(s.model, i, p.ids, trie, self.mode, top_other=s.top_other, cap=s.top_logprobs)
        ]
        conds = [Conditionals() for _ in prepared]
        for group in by_kind(reqs):
            for q, r in zip(group, self.fetch(group), strict=True):
                conds[q.row].absorb(q, r)
        out = []
        for i, (t, p, trie) in enumerate(zip(trials, prepared, tries, strict=True)):
            out.append(self._assemble(t, p, trie, conds[i], [q for q in reqs if q.row == i]))
        bounded = self.readout_stats["bounded_options"] - before
        if bounded:
            self._log(
                f"server: {int(bounded)} option(s) of {len(trials)} trials lay outside the top-{s.top_logprobs} "
                "log probabilities: reported at their bound, coverage a lower bound (a server with "
                "logprob_token_ids or prompt_logprobs reads them exactly)"
            )
        self.readout_stats["trials"] += len(trials)
        self.readout_stats["seconds"] += time.perf_counter() - t0
        if progress:
            progress(len(trials))
        return out

    def _assemble(self, trial: Trial, prep: Prepared, trie: Trie, c: Conditionals, reqs: Sequence[Request]) -> Readout:
        """The readout of one trial; ``top_other`` from the slot's returned tokens that start no option."""
        other = top_others(c.seen, trie[()], self.settings.top_other, lambda t: self.tokenizer.decode([t]))
        if self.mode == "prompt_logprobs":
            computed = sum(q.sent for q in reqs)  # prompt_logprobs requests skip the prefix cache
        else:
            computed = len(prep.ids) + sum(1 for node in trie if node)
        missing = any(kid not in c.cond.get(node, {}) for node, kids in trie.items() for kid in kids)
        if not missing:
            return slot_readout(trial, prep, trie, c.cond, top_other=other, computed=computed)
        if self.mode != "top_logprobs":  # pragma: no cover - absorb raises first
            raise ServerRefused(f"trial {trial.trial_id}: the server left option tokens unscored")
        readout, bounded = bounded_readout(trial, prep, trie, c, top_other=other, computed=computed)
        self.readout_stats["bounded_options"] += bounded
        return readout

    # ---------------------------------------------------------------- sampling
    def _draw_body(self, s: ApiSettings, trial: Trial, draw: int, temperature: float) -> dict[str, Any]:
        """A ``/v1/completions`` draw on the readout's own token ids: raw sampling at ``temperature`` (no top-k,
        top-p, min-p or penalties), the draw's seed, stopping at the model's end-of-turn ids; ``s``: the settings
        of this sampling call (its reply cap)."""
        ids = self.render(trial)
        return {
            "model": s.model,
            "prompt": list(ids),
            "max_tokens": s.max_tokens,
            "temperature": float(temperature),
            **RAW_SAMPLING,
            "seed": draw_seed(s.seed, trial.trial_id, draw),
            "stop_token_ids": sorted(self._stop_ids()),
            "skip_special_tokens": False,
            "return_token_ids": True,
            **dict(s.extra_body),
        }

    def _ask_draw(self, body: Mapping[str, Any]) -> Reply:
        """One draw: the completion, checked for its prompt count, as the draw's reply (the text decoded here from
        the generated ids, stop tokens dropped and, in the plain frame, cut at its stops, as the local engines
        do)."""
        raw = self.transport.completion(body)
        reply = parse_completion(raw)
        check_prompt_count(len(body["prompt"]), reply, "a sampling request")
        stops = self._stop_ids()
        text = raw["choices"][0].get("text") or ""
        usage = raw.get("usage") or {}
        finish, spent = reply.finish, _count(usage.get("completion_tokens"))
        if reply.generated:
            ids = [t for t in reply.generated if t not in stops]
            if self.frame == "plain":  # the reply ends at the frame's stops, as every engine cuts it
                cut = plain_cut(self._decode, ids)
                if cut.stopped:
                    ids, finish, spent = list(cut.ids), "stop", cut.spent
            text = self._decode(ids)
        return Reply(
            text=str(text or ""),
            finish=finish,
            refused=reply.finish == "content_filter",
            usage=Usage(input_tokens=_count(usage.get("prompt_tokens")), output_tokens=spent),
            response_id=str(raw.get("id") or ""),
            served_model=str(raw.get("model") or ""),
        )

    def _sample(self, trials: Sequence[Trial], draws: Draws, progress: ProgressFn | None) -> list[Sample]:
        self.load()
        return self.sampler.sample(
            trials,
            draws.n,
            draws.temperature,
            progress,
            max_new_tokens=draws.max_new_tokens,
            stop_at_answer=draws.stop_at_answer,
        )


def _count(v: Any) -> int:
    """A token count of a reply's usage (0 where absent or not a number)."""
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0
