"""The API engine: frontier models by sampling, at study scale, losing nothing.

Model specs (the scheme picks this engine, see :mod:`engines`):

* ``openai:<model>``: OpenAI's API, key in ``OPENAI_API_KEY``;
* ``anthropic:<model>``: Anthropic's API, key in ``ANTHROPIC_API_KEY``;
* ``openai-compatible:<name>@<base_url>``: any Chat Completions server
  (OpenRouter, Gemini's compatible endpoint, ``vllm serve``,
  ``transformers serve``); the key comes from ``--api-key-env NAME``, or the
  usual variable of a well-known host, and is optional on other hosts.

The engine implements ``sample()`` only: APIs expose no answer-slot logits.
Each (trial, draw) is one call; the reply is parsed by the parser every
engine shares (:mod:`probe.parse`); refusals and unparseable answers are
data and are never retried. Only transport failures are retried
(:mod:`engines.api.retry`), under an adaptive concurrency limit per
(provider, model). Every response is journaled durably as it arrives
(:mod:`engines.api.journal`), so a killed run resumes without repeating a
paid call. Usage and cost are kept per call (:mod:`engines.api.pricing`);
``--max-cost`` stops cleanly at a budget and ``--dry-run`` prints the
calls and their estimated cost before spending anything. ``--batch-api``
sends single-turn trials through the providers' batch interfaces
(:mod:`engines.api.batch`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from engines.api.batch import BatchClient, run_batches
from engines.api.journal import (
    BATCHES,
    JOURNAL,
    STATS,
    AppendLog,
    CallRecord,
    Journal,
    Key,
    quarantine_message,
    quarantined_count,
)
from engines.api.online import Budget, BudgetExhausted, OnlineCalls, Progress
from engines.api.pricing import Price, PriceTable, Usage, estimate_prompt_tokens
from engines.api.providers import Reply, TransportError, anthropic_body, openai_body, parse_reply
from engines.api.retry import RetryPolicy
from engines.api.settings import ApiSettings, parse_model_spec
from engines.api.transport import ClientFactory, Transport
from engines.base import Draws, Engine, ProgressFn, RunFolder, draw_seed, recorded_settings
from engines.flags import add_flags, settings_from_flags
from probe.files import atomic_write_text
from probe.parse import parse_answer, split_reasoning
from probe.types import Sample, Trial

# ------------------------------------------------------------------- CLI
OWN_FLAGS = (
    "concurrency",
    "max_cost",
    "dry_run",
    "prices",
    "batch",
    "batch_poll",
    "reasoning_effort",
    "thinking_budget",
    "timeout",
    "max_retries",
    "api_key_env",
    "extra_body",
)
"""The fields of the API engine's flags, in their order in ``--help``."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The API engine's own flags (the shared ``--system``, ``--max-new-tokens``, ``--seed``,
    ``--think`` and ``--think-budget`` keep their meaning)."""
    add_flags(
        p.add_argument_group("API engine (openai:, anthropic:, openai-compatible: models)"), ApiSettings, OWN_FLAGS
    )


def settings_from_model(model: str, a: argparse.Namespace) -> ApiSettings:
    """The settings of API model spec ``model`` with the parsed flags."""
    spec = parse_model_spec(model)
    return settings_from_flags(ApiSettings, a, provider=spec.provider, model=spec.model, base_url=spec.base_url)


def from_args(model: str, a: argparse.Namespace) -> ApiEngine:
    return ApiEngine(settings_from_model(model, a))


def call_seed(seed: int, trial_id: str, draw: int) -> int:
    """A 31-bit seed per (run seed, trial, draw): the top bits of :func:`engines.base.draw_seed`, so
    replicates differ and a re-sent call asks for the same draw."""
    return draw_seed(seed, trial_id, draw) >> 32


# ----------------------------------------------------------------- engine
@dataclass(frozen=True)
class Draw:
    """How one draw is asked of an endpoint: the request ``body`` of (settings, trial, draw, temperature), and
    ``ask``, which sends one body and returns the typed reply (a transport failure raises, to be retried).

    The API engine's own is Chat Completions (or Anthropic's Messages API) through :meth:`Transport.chat`;
    :class:`engines.server.ServerEngine` passes its ``/v1/completions`` draws on the readout's token ids."""

    body: Callable[[ApiSettings, Trial, int, float], dict[str, Any]]
    ask: Callable[[Mapping[str, Any]], Reply]


def chat_body(s: ApiSettings, trial: Trial, draw: int, temperature: float) -> dict[str, Any]:
    """The JSON body of the Chat Completions (or Messages) call for (trial, draw) at ``temperature``."""
    if s.provider == "anthropic":
        return anthropic_body(
            model=s.model,
            messages=trial.messages,
            system=s.system_prompt,
            max_tokens=s.max_tokens,
            temperature=temperature,
            reasoning_effort=s.reasoning_effort,
            think=s.think,
            thinking_budget=s.thinking_budget,
            extra=s.extra_body,
        )
    return openai_body(
        provider=s.provider,
        model=s.model,
        messages=trial.messages,
        system=s.system_prompt,
        max_tokens=s.max_tokens,
        temperature=temperature,
        seed=call_seed(s.seed, trial.trial_id, draw),
        reasoning_effort=s.reasoning_effort,
        think=s.think,
        extra=s.extra_body,
    )


def request_identity(name: str, settings: ApiSettings, value_settings: Sequence[str]) -> dict[str, Any]:
    """The identity of an engine that asks a server (:class:`ApiEngine`, :class:`engines.server.ServerEngine`): its
    name, its ``value_settings`` and the extra request body."""
    return {
        "engine": name,
        **{k: getattr(settings, k) for k in value_settings},
        "extra_body": dict(settings.extra_body),
    }


class ApiEngine(Engine):
    """Sampling through a provider's API; see the module docstring."""

    name = "api"
    value_settings: tuple[str, ...] = (
        "provider",
        "model",
        "system_prompt",
        "max_tokens",
        "think",
        "thinking_budget",
        "reasoning_effort",
        "seed",
    )
    """The settings that change the answers (they enter the run key, with ``extra_body``)."""

    def __init__(
        self,
        settings: ApiSettings,
        *,
        client_factory: ClientFactory | None = None,
        log: Callable[[str], None] | None = None,
        retry_policy: RetryPolicy | None = None,
        transport: Transport | None = None,
        draw: Draw | None = None,
        more_stats: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        """``transport``: the one to call through (the server engine shares its own), else one made from
        ``client_factory`` and ``retry_policy``; ``draw``: how a draw is asked (default: Chat Completions);
        ``more_stats``: what the engine that holds this one adds to :meth:`run_stats` (the server's readouts)."""
        self.settings = settings
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.transport = transport or Transport(settings, client_factory=client_factory, retry_policy=retry_policy)
        self.draw = draw or Draw(chat_body, self.transport.chat)
        self._more_stats = more_stats
        self._prices: PriceTable | None = None
        self._price: Price | None = None
        self._journal = Journal(None)
        self._batch_log: AppendLog | None = None
        self._store_root: Path | None = None
        self._prior_unrecovered: Counter[str] = Counter()
        self.session = os.urandom(6).hex()

    # ------------------------------------------------------------ set-up
    def load(self) -> ApiEngine:
        """Read the price table, check the key (not in a dry run), open the client (idempotent; no network)."""
        s = self.settings
        if self._prices is None:
            self._prices = PriceTable.load(s.prices)
            self._price = self._prices.lookup(s.provider, s.model, s.host)
        if s.max_cost is not None and self._price is None:
            raise ValueError(
                f"--max-cost needs a price for {s.provider}:{s.model}, and {self._prices.source} has none; "
                "add an entry (USD per million tokens) or pass --prices FILE"
            )
        self.transport.open_limit()
        if not s.dry_run:
            self.transport.open_client()
        return self

    def attach(self, run: RunFolder) -> None:
        """Journal into the run's results folder; in a dry run, print the estimate and exit.

        The runner calls this after opening the run folder and before the
        first chunk.
        """
        root = Path(run.root)
        results = root / "results"
        results.mkdir(parents=True, exist_ok=True)
        if self._store_root != root:
            self.close()  # a previous run folder's files, if this engine served one
            self.transport.attach(root)
            self._journal = Journal(results / JOURNAL)
            if (results / BATCHES).exists() or self.settings.batch:
                self._batch_log = AppendLog(results / BATCHES)
                if self._batch_log.quarantined:
                    self._log(quarantine_message(results / BATCHES, self._batch_log.quarantined, None))
            self._store_root = root
            prior = _read_json(results / STATS)
            self._prior_unrecovered = Counter({str(k): int(v) for k, v in prior.get("unrecovered", {}).items()})
            if self._journal.torn_bytes:
                self._log(f"api: cut a torn last line ({self._journal.torn_bytes} bytes) off {results / JOURNAL}")
            if self._journal.quarantined:
                self._log(quarantine_message(results / JOURNAL, self._journal.quarantined, len(self._journal)))
        if self.settings.dry_run:
            self._log(self.dry_run_report(run))
            raise SystemExit(0)

    def close(self) -> None:
        """Close the run folder's journal and batch log (the engine can be attached to another run after)."""
        self._journal.close()
        if self._batch_log is not None:
            self._batch_log.close()
            self._batch_log = None

    # --------------------------------------------------------- manifest
    def identity(self) -> dict[str, Any]:
        """What changes the answers: provider, model and the request settings.

        The base URL is left out (a server that moved to another port still
        serves the same model, and the run may resume against it); so are
        speed and spending settings and the batch switch.
        """
        return request_identity(self.name, self.settings, self.value_settings)

    def describe(self) -> dict[str, Any]:
        """Settings, endpoint, key variable (never the key), price entry, SDK versions."""
        s = self.settings
        var, required = s.key_env()
        versions: dict[str, str | None] = {}
        for pkg in ("openai", "anthropic"):
            try:
                versions[pkg] = metadata.version(pkg)
            except metadata.PackageNotFoundError:
                versions[pkg] = None
        return {
            "engine": self.name,
            "settings": {**recorded_settings(s), "extra_body": dict(s.extra_body)},
            "model_path": f"{s.provider}:{s.model}" + (f"@{s.base_url}" if s.base_url else ""),
            "max_tokens_sent": s.max_tokens,
            "key_env": var,
            "key_required": required,
            "price": asdict(self._price) if self._price else None,
            "price_table": self._prices.source if self._prices else None,
            "sdk_versions": versions,
            "temperature_policy": "sent always"
            if s.provider == "openai-compatible"
            else "omitted at 1.0 (the provider's default), sent otherwise",
            "system_prompt": {"text": s.system_prompt, "source": "--system"}
            if s.system_prompt is not None
            else {"text": None, "source": "none sent; the server's chat template may add its own"},
        }

    # ---------------------------------------------------------- requests
    def request_body(self, trial: Trial, draw: int, temperature: float) -> dict[str, Any]:
        """The JSON body of the call for (trial, draw) at ``temperature`` (:attr:`draw`'s, under the settings of
        this call)."""
        return self.draw.body(self.settings, trial, draw, temperature)

    def record(
        self,
        trial: Trial,
        key: Key,
        reply: Reply,
        *,
        attempts: int,
        retries: Mapping[str, int],
        batch: bool,
        latency: float,
    ) -> CallRecord:
        """Parse a reply into the journal record of (trial, draw)."""
        answer_reasoning = reply.reasoning
        if reply.refused:
            status, option = "refusal", None
        else:
            parsed = parse_answer(reply.text, trial.options, think=self.settings.think)
            status, option = parsed.status, parsed.option
        if not answer_reasoning:
            answer_reasoning, _ = split_reasoning(reply.text, think=self.settings.think)
        cost = self._price.cost(reply.usage, batch=batch) if self._price else None
        return CallRecord(
            trial_id=key[0],
            draw=key[1],
            temperature=key[2],
            status=status,
            option=option,
            text=reply.text,
            reasoning=answer_reasoning,
            finish=reply.finish,
            usage=reply.usage,
            cost=cost,
            attempts=attempts,
            retries=dict(retries),
            batch=batch,
            latency=latency,
            response_id=reply.response_id,
            served_model=reply.served_model,
            session=self.session,
        )

    # ------------------------------------------------------------ budget
    def spent(self) -> float:
        """USD of every call journaled in this run (all sessions)."""
        return self._journal.total_cost

    def estimate_call(self, trial: Trial) -> tuple[int, int]:
        """(estimated prompt tokens, most output tokens) of one call of ``trial``."""
        texts = [m.content for m in trial.messages]
        if self.settings.system_prompt and not any(m.role == "system" for m in trial.messages):
            texts.append(self.settings.system_prompt)
        return estimate_prompt_tokens(texts), self.settings.max_tokens

    def _reserve_for(self, trial: Trial, *, batch: bool = False) -> float:
        """The cost to hold back for one call in flight: the mean so far, else the upper-bound estimate."""
        if self._price is None:
            return 0.0
        if self._journal.n_priced >= 10:
            return self._journal.total_cost / self._journal.n_priced
        inp, out = self.estimate_call(trial)
        return self._price.cost(Usage(input_tokens=inp, output_tokens=out), batch=batch)

    def dry_run_report(self, run: RunFolder) -> str:
        """Calls still to make in the run and their estimated cost."""
        n, temperature = run.samples, run.temperature
        n_trials, todo = run.pending()
        calls = [(t, d) for t in todo for d in range(n) if (t.trial_id, d, temperature) not in self._journal]
        inp = sum(self.estimate_call(t)[0] for t, _ in calls)
        out = len(calls) * self.settings.max_tokens
        s = self.settings
        lines = [
            f"dry run: {len(calls)} calls to {s.provider}:{s.model} "
            f"({len(todo)} trials x {n} samples, {n_trials * n - len(calls) if n else 0} already done), nothing sent",
            f"  tokens: ~{inp} prompt (estimated at 4 characters a token), at most {out} output ({s.max_tokens} a call)",
        ]
        if self._price is None:
            lines.append(
                f"  cost: unknown, {self._prices.source if self._prices else 'the price table'} has no price "
                f"for {s.provider}:{s.model}; add one or pass --prices FILE"
            )
        else:
            bound = self._price.cost(Usage(input_tokens=inp, output_tokens=out), batch=s.batch)
            lines.append(f"  cost: at most ${bound:.4f} (every reply at the token limit; price {self._price.key})")
            if self._journal.n_priced:
                mean = self._journal.total_cost / self._journal.n_priced
                lines.append(
                    f"  cost at the mean of the {self._journal.n_priced} calls so far: ${mean * len(calls):.4f}"
                )
            spent = self.spent()
            lines.append(f"  spent so far in this run: ${spent:.4f}")
            if s.max_cost is not None:
                lines.append(f"  budget --max-cost ${s.max_cost:.4f}: ${max(0.0, s.max_cost - spent):.4f} left")
        return "\n".join(lines)

    # ----------------------------------------------------------- sample
    def _sample(self, trials: Sequence[Trial], draws: Draws, progress: ProgressFn | None) -> list[Sample]:
        """``n`` answers per trial at ``temperature``, one call each, trial-major, in input order.

        ``stop_at_answer``: forced answers are parsed up to their answer end
        (:func:`probe.parse.answer_end`), as every engine parses them; the
        journal keeps the reply whole and its plain parse.

        Pairs already in the journal are answered from it; the rest are
        called (or batched) and journaled as they arrive. Raises (after
        every call in flight has been journaled) when the budget is reached,
        a call is rejected, or transport retries run out; the next run
        resumes from the journal.
        """
        draws.check()
        n, cap = draws.n, draws.max_new_tokens
        if cap is not None and cap != self.settings.max_new_tokens:
            saved = self.settings  # every request of this call is built from the settings: cap them for its length
            self.settings = replace(saved, max_new_tokens=cap)
            try:
                return self._sample(trials, replace(draws, max_new_tokens=None), progress)
            finally:
                self.settings = saved
        if self.transport.client is None:
            self.load()
        temperature = float(draws.temperature)
        pairs = [(t, d) for t in trials for d in range(n)]
        todo = [(t, d) for t, d in pairs if (t.trial_id, d, temperature) not in self._journal]
        prog = Progress(len(pairs), len(pairs) - len(todo), self.spent(), progress, self._log)
        prog.priced = self._price is not None
        if progress and prog.resumed:
            progress(prog.resumed)
        try:
            if todo:
                with self.transport.hold_run():
                    self._call(todo, temperature, prog)
        finally:
            self._write_stats()
        return [self._sample_of(t, d, temperature, draws.stop_at_answer) for t, d in pairs]

    def _call(self, todo: list[tuple[Trial, int]], temperature: float, prog: Progress) -> None:
        """Batch what may be batched (single-turn trials, with --batch-api); call the rest directly."""
        if self.settings.batch:
            single = [(t, d) for t, d in todo if sum(m.role != "system" for m in t.messages) == 1]
            multi = [(t, d) for t, d in todo if sum(m.role != "system" for m in t.messages) != 1]
            if multi:
                self._log(f"api: --batch-api takes single-turn trials only; calling {len(multi)} draws directly")
            todo = multi + (self._run_batch(single, temperature, prog) if single else [])
        if todo:
            self._run_online(todo, temperature, prog)

    def _sample_of(self, t: Trial, d: int, temperature: float, forced: bool = False) -> Sample:
        rec = self._journal.get((t.trial_id, d, temperature))
        if rec is None:  # pragma: no cover - sample() raises before this can happen
            raise RuntimeError(f"no response recorded for trial {t.trial_id} draw {d}")
        status, option = rec.status, rec.option
        if forced:
            plain = parse_answer(rec.text, t.options, think=self.settings.think)
            if (plain.status, plain.option) == (status, option):  # the text decided, not a provider refusal flag
                parsed = parse_answer(rec.text, t.options, think=self.settings.think, forced=True)
                status, option = parsed.status, parsed.option
        return Sample(
            trial_id=t.trial_id,
            replicate=d,
            text=rec.text,
            option=option,
            status=status,  # type: ignore[arg-type]
            prompt_tokens=rec.usage.input_tokens,
            completion_tokens=rec.usage.output_tokens,
            reasoning=rec.reasoning,
            truncated=rec.finish in ("length", "max_tokens"),  # OpenAI's and Anthropic's word for the token cap
        )

    def _run_online(self, todo: Sequence[tuple[Trial, int]], temperature: float, prog: Progress) -> None:
        """Call ``todo`` directly, concurrently, within the budget (:class:`engines.api.online.OnlineCalls`)."""
        var, _ = self.settings.key_env()
        OnlineCalls(
            self.transport,
            ask=self.draw.ask,
            body=self.request_body,
            record=self.record,
            journal=self._journal,
            hold_for=self._reserve_for,
            budget=Budget(self.settings.max_cost, self.spent()),
            key_var=var,
            concurrency=self.settings.concurrency,
            prog=prog,
            log=self._log,
        ).run(todo, temperature)

    def _run_batch(
        self, todo: Sequence[tuple[Trial, int]], temperature: float, prog: Progress
    ) -> list[tuple[Trial, int]]:
        """Send ``todo`` through the batch interface; returns the pairs to call directly (transient failures)."""
        if self._batch_log is None:
            raise ValueError(
                "--batch-api keeps batch ids in the run folder; run it through `probe run` (attach a store)"
            )
        by_key = {(t.trial_id, d, temperature): t for t, d in todo}
        pending = [(key, self.request_body(t, key[1], temperature)) for key, t in by_key.items()]
        stop = threading.Event()
        bc = BatchClient(
            self.settings.provider, self.transport.client, guard=lambda call: self.transport.guard(call, stop)
        )

        def on_success(key: Key, body: dict[str, Any], batch_id: str) -> None:
            trial = by_key.get(key)
            if trial is None:
                return
            try:
                reply = parse_reply(self.settings.provider, body)
            except TransportError as e:
                prog.failed(e.kind)
                return  # left out of the journal: sent again directly
            rec = self.record(trial, key, reply, attempts=1, retries={}, batch=True, latency=0.0)
            rec = dataclasses.replace(rec, response_id=rec.response_id or batch_id)
            self._journal.add(rec)
            prog.called(rec.cost)

        if self.settings.max_cost is not None:
            need = sum(self._reserve_for(by_key[k], batch=True) for k, _ in pending)
            if self.spent() + need > self.settings.max_cost:
                raise BudgetExhausted(
                    f"--max-cost ${self.settings.max_cost:.4f}: this batch of {len(pending)} calls may cost up to "
                    f"${need:.4f} on top of ${self.spent():.4f} spent; raise the budget (or drop --batch-api) to go on"
                )
        retry = run_batches(
            client=bc,
            log=self._batch_log,
            pending=pending,
            done=lambda k: k in self._journal,
            on_success=on_success,
            poll_seconds=self.settings.batch_poll,
            on_poll=lambda status: self._log(f"api: batches {dict(status)}; {prog.line()}") if status else None,
        )
        for _, kind in retry:
            prog.failed(kind)
        return [(by_key[k], k[1]) for k, _ in by_key.items() if k not in self._journal]

    # ------------------------------------------------------------- stats
    def run_stats(self) -> dict[str, Any]:
        """Totals over the whole run (every session): calls, statuses, usage, spend, retries, failures."""
        recs = self._journal.records()
        unique: dict[Key, CallRecord] = {}
        for r in recs:
            unique.setdefault(r.key, r)
        usage = sum((r.usage for r in recs), Usage())
        retries: Counter[str] = Counter()
        for r in recs:
            retries.update(r.retries)
        costs = [r.cost for r in recs]
        return {
            "calls": len(unique),
            "by_status": dict(sorted(Counter(r.status for r in unique.values()).items())),
            "batch_calls": sum(r.batch for r in unique.values()),
            "usage": usage.to_dict(),
            "cost_usd": None if any(c is None for c in costs) else round(sum(c or 0.0 for c in costs), 6),
            "retries": dict(sorted(retries.items())),
            "unrecovered": dict(sorted((self._prior_unrecovered + self.transport.unrecovered).items())),
            "duplicates": self._journal.duplicates,
            "corrupt_journal_lines": self._journal.corrupt_lines,
            "quarantined_journal_lines": quarantined_count(self._journal.path),
            "sessions": len({r.session for r in recs}),
            "session": self.session,
            "concurrency": {
                "cap": self.settings.concurrency,
                "limit_now": int(limiter.limit) if (limiter := self.transport.limiter) else None,
                "cuts": limiter.n_cuts if limiter else 0,
            },
            "price": self._price.key if self._price else None,
            **(self._more_stats() if self._more_stats else {}),
        }

    def _write_stats(self) -> None:
        if self._store_root is None:
            return

        path = self._store_root / "results" / STATS
        atomic_write_text(path, json.dumps(self.run_stats(), indent=2, sort_keys=True) + "\n")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
        return value if isinstance(value, dict) else {}
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
