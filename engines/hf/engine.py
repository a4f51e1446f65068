"""The Transformers engine itself: :class:`HFEngine`, the facade that composes the parts.

Owns: the engine contract (``readout``, ``sample`` and their hooks, :class:`engines.local.LocalEngine`), the
caches of rendered prompts and encoded options, the manifest and run-key records, and the wiring: one
:class:`engines.hf.weights.Model` handed to a :class:`engines.hf.readout.Reader`, a
:class:`engines.hf.reasoning.Reasoner` and a :class:`engines.hf.draws.Sampler`. Every method either belongs to
the contract or composes the parts; none computes one part's concern (:attr:`HFEngine.lm` and
:attr:`HFEngine.reasoner` hand two parts to the device check, the bench and the tests that step through them). May import every module of :mod:`engines.hf`,
:mod:`engines.base`, :mod:`engines.hf.graphs` (a type), :mod:`engines.local`, :mod:`engines.render`,
:mod:`probe.types`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import asdict, replace
from typing import Any

from engines.base import Draws, ProgressFn, recorded_settings
from engines.hf.draws import Sampler
from engines.hf.readout import KeptTrees, Reader
from engines.hf.reasoning import Reasoner
from engines.hf.settings import HFSettings
from engines.hf.weights import READOUT_SOFTMAX, Experts, Model, Weights, model_experts
from engines.local import LocalEngine, Prepared, ThinkRequest
from engines.render import checked_option_ids, encode_option, option_texts, stop_ids
from probe.types import Readout, Sample, Trial


class HFEngine(LocalEngine):
    """Answer-slot readouts and samples from a Transformers causal LM."""

    name = "hf"
    settings: HFSettings

    def __init__(
        self, settings: HFSettings, *, model: Any = None, tokenizer: Any = None, weights: Weights | None = None
    ) -> None:
        self.settings = settings
        if weights is None and model is not None and tokenizer is not None:
            # a model handed in (tests, the bench) was placed by its caller
            weights = Weights(model, tokenizer, experts=model_experts(model))
        self._tok: Any = None  # set when the model part has loaded it (:meth:`_tokenizer_loaded`)
        self._renders: dict[tuple[Any, ...], tuple[int, ...]] = {}
        self._encodings: dict[str, tuple[int, ...] | str] = {}
        self._lm = Model(settings, weights, on_tokenizer=self._tokenizer_loaded)
        self._trees = KeptTrees()
        self._reasoner = Reasoner(settings, self._lm)
        self._reader = Reader(settings, self._lm, self._trees)
        self._sampler = Sampler(settings, self._lm, self._reasoner, self._trees)

    # ---------------------------------------------------------------- loading
    def load(self) -> HFEngine:
        """Load tokenizer and model (idempotent), then derive what this engine's settings make of them
        (:meth:`engines.hf.weights.Model.load`); an engine built on loaded :class:`Weights` (:meth:`variant`) only
        derives."""
        self._lm.load()
        self._reader.lens()  # --layers: resolved on the model now, so a layer past its last fails before any readout
        return self

    def _tokenizer_loaded(self, tok: Any) -> None:
        """The model part loaded ``tok``: the engine renders with it, in the frame resolved here."""
        self._tok = tok
        self._check_frame(tok)

    @property
    def model(self) -> Any:
        return self._lm.module

    @property
    def experts(self) -> Experts | None:
        """Each phase's experts implementation this engine computes with (None: the model has no switchable
        experts): its settings' auto resolved on its device (:func:`engines.hf.weights.experts_by_phase`)."""
        return self.load()._lm.experts

    @property
    def device(self) -> Any:
        return self._lm.device

    def describe(self) -> dict[str, Any]:
        """Model, revision, dtype and settings for the manifest."""
        info: dict[str, Any] = {
            "engine": self.name,
            "settings": recorded_settings(self.settings),
            **self._lm.describe(),
        }
        info["system_prompt"] = self.system_prompt_record()
        return {**info, **self.frame_record()}

    def variant(self, **settings: Any) -> HFEngine:
        """An engine on the same loaded weights with other settings (no second load): what loading decided (the
        weights, their placement) is shared, and what the settings decide (the head's dtype among them) is derived
        again by the one :meth:`engines.hf.weights.Model.load`, so a variant reads what a fresh engine with its
        settings reads."""
        return HFEngine(replace(self.settings, **settings), weights=self._lm.weights).load()

    def reading_alone(self) -> HFEngine:
        """The reference reader of the numeric floor (:mod:`probe.app.floor`): one trial per forward, plain path."""
        return self.variant(batch_size=1, readout_path="plain")

    def without_reasoning(self) -> HFEngine:
        """The same engine outside think mode (the floor of a think-mode run is measured on its bare slots)."""
        return self.variant(think=False)

    def run_stats(self) -> dict[str, Any]:
        """What this engine's think mode decoded so far (:class:`engines.hf.refill.ReasoningStats`), for the
        manifest's ``engine_stats``: ``reasoning`` (the traces before a slot is read) and ``think_draws`` (sampled
        answers that reason first); empty where it did neither."""
        parts = {"reasoning": self._reasoner.stats, "think_draws": self._sampler.stats}
        return {name: stats.record() for name, stats in parts.items() if stats.traces}

    def identity(self) -> dict[str, Any]:
        """:meth:`LocalEngine.identity`, and the dtype a readout normalizes in (``readout_softmax``,
        :func:`engines.hf.weights.readout_log_probs`).

        float64 replaced float32 there, which moved the options that prefix longer ones by up to 9.3e-5 nats on
        smol's 0-100 scales (docs/gpu.md): above the 3.2e-5 within which float32's readout paths agree, the bound
        under which a value change stays out of the key. So the key changed with it, in every dtype, and a run begun on float32
        readouts is never resumed or merged with float64 ones (``probe run`` names ``readout_softmax`` as what
        differs). Draws did not change; a run that only samples gets a new key all the same.

        ``--layers`` adds its spec (``layers``): a run with layers stores a table a run without has not, so they
        never resume or merge into each other; a run without it keeps the key it had before layers existed.
        """
        layers = {"layers": self.settings.layers} if self.settings.layers is not None else {}
        return {**super().identity(), "readout_softmax": READOUT_SOFTMAX, **layers}

    def numerics(self) -> dict[str, Any]:
        s = self.settings
        reasoning = (
            {"reasoning_schedule": self._reasoner.schedule(), "reasoning_rows": s.reasoning_rows} if s.think else {}
        )
        experts = {"experts": asdict(self._lm.experts)} if self._lm.experts is not None else {}
        return {
            **reasoning,
            **experts,
            "head_dtype": self._lm.head,
            "readout_path": self.readout_path(),
            "batch_size": s.batch_size,
            "max_batch_tokens": s.max_batch_tokens,
            "tree_tokens": s.tree_tokens,
            "sample_path": self.sample_path(),
            "sample_rows": s.sample_rows,
            "sample_cache_tokens": s.sample_cache_tokens,
            "group_draws": s.group_draws,
        }

    # ------------------------------------------------------------- rendering
    def render(self, trial: Trial, *, think: bool | None = None) -> tuple[int, ...]:
        """The prompt token ids up to the answer slot (or to where reasoning starts); cached per distinct prompt."""
        think = self.settings.think if think is None else think
        key = (trial.messages, trial.assistant_prefix, think)
        if key not in self._renders:
            self._renders[key] = super().render(trial, think=think)
        return self._renders[key]

    def option_ids(self, trial: Trial) -> tuple[tuple[int, ...], ...]:
        """Each option as the token ids the model would emit at the slot (rules: :func:`engines.render.option_texts`)."""
        encoded = []
        for text in option_texts(trial, self.frame):
            if text not in self._encodings:
                self._encodings[text] = encode_option(self.tokenizer, text)
            encoded.append(self._encodings[text])
        return checked_option_ids(trial, encoded)

    def _stop_ids(self) -> set[int]:
        """The ids that end the model's turn: the tokenizer's eos and the loaded model's generation config's."""
        gen = getattr(self.model, "generation_config", None)
        return stop_ids(self.tokenizer, getattr(gen, "eos_token_id", None))

    # -------------------------------------------------------------- readouts
    def readout_path(self) -> str:
        """The readout path this engine takes on this model (:meth:`engines.hf.readout.Reader.path`)."""
        return self._reader.path()

    def sample_next(self, trials: Sequence[Trial]) -> None:
        """Say that ``sample()`` on these trials comes right after the next ``readout()`` (the runner does so).

        On the tree path, outside think mode, that readout then keeps the KV
        cache of the trees holding these prompts, and the sample draws from it
        instead of computing the prompts again (speed only; the next readout
        or sample call drops it).
        """
        self._trees.expect({self.render(t) for t in trials} if not self.settings.think else set())

    def readout(self, trials: Sequence[Trial], progress: ProgressFn | None = None) -> list[Readout]:
        """The answer-slot distribution of each trial, in input order (:class:`engines.hf.readout.Reader`).

        In think mode the reasoning of every trial is generated together
        (refilled: :meth:`engines.hf.reasoning.Reasoner.reasoned`), and the slots are read ``batch_size``
        trials at a time as their traces end, so progress is reported as it goes.
        """
        if not trials:
            return []
        for t in trials:  # fail on a bad option before spending any compute
            self.option_ids(t)
        return self._reader.readout(trials, self._prepared_groups(trials), progress)

    def _prepared_groups(self, trials: Sequence[Trial]) -> Iterator[tuple[Sequence[int], list[Prepared]]]:
        """``(trial indices, those trials prepared)`` as they are ready: all at once, or in think mode
        ``batch_size`` at a time as their traces end."""
        if not self.settings.think:
            yield range(len(trials)), self.prepare(trials)
            return
        request = self.think_request(trials)
        reasoned = self._reasoner.reasoned(request)
        while ready := list(itertools.islice(reasoned, self.settings.batch_size)):
            group = [i for i, _ in ready]
            yield group, self.with_reasoning(request, [trials[i] for i in group], [g for _, g in ready])

    def _reason(self, request: ThinkRequest) -> list[list[int]]:
        """The reasoning of think mode, each trial's trace in request order
        (:meth:`engines.hf.reasoning.Reasoner.reason`)."""
        return self._reasoner.reason(request)

    # -------------------------------------------------------------- sampling
    @property
    def reply_rows(self) -> int:
        """How many free-text reply rows the runner should hand over at once (``settings.sample_rows``; the engine
        cuts them into batches that also respect ``sample_cache_tokens``)."""
        return self.settings.sample_rows

    def sample_path(self) -> str:
        """The sampling path this engine takes (:meth:`engines.hf.draws.Sampler.path`)."""
        return self._sampler.path()

    def _sample(self, trials: Sequence[Trial], draws: Draws, progress: ProgressFn | None) -> list[Sample]:
        """``n`` raw samples per trial at ``temperature`` (no top-k/top-p), parsed; trial-major order.

        ``Sample.replicate`` is the draw index 0..n-1; draw d of a trial is
        drawn from its own generator seeded by (seed, trial id, d), so it does
        not depend on the batch, the path or the other trials. In think mode
        the model reasons and answers freely, so an assistant prefix is not
        forced. ``stop_at_answer`` (forced-answer trials): replies are parsed
        up to their answer end (:func:`probe.parse.answer_end`), and outside
        think mode a draw stops there (:func:`probe.parse.answer_scan`), which
        changes no parse; free-text replies get their whole budget.
        """
        draws.check()
        budget = self._reply_budget(draws)
        stops = self._stop_ids()
        rows = self._sampler.rows(
            trials, self._seeded_rows(trials, draws.n), draws.stop_at_answer, plain=self.frame == "plain"
        )
        gens = self._sampler.generate(rows, draws.n, draws.temperature, budget, stops, progress)
        return [
            self._parsed_reply(
                trials[row.trial],
                row,
                gen,
                stops,
                truncated=len(gen) >= budget and gen[-1] not in stops,  # ran out of tokens, not ended by the model
                stop_at_answer=draws.stop_at_answer,
            )
            for row, gen in zip(rows, gens, strict=True)
        ]

    # ------------------------------------------------------------ the parts
    @property
    def lm(self) -> Model:
        """The loaded model part (padding, forwards, whether it is split): what the device check and the bench time,
        and tests step through, without going through a readout or a draw."""
        return self._lm

    @property
    def reasoner(self) -> Reasoner:
        """The reasoning part (schedules, slot decoders): what the device check times."""
        return self._reasoner
