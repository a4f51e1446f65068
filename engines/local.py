"""What the two local model engines (:mod:`engines.hf`, :mod:`engines.vllm`) do alike around their model calls.

They differ in how they compute (one forward over a token tree, or ``max_tokens=1`` requests to vLLM), and must
agree on everything else, to the bit: how a trial is prepared for its slot, how a readout is assembled from the
trie's conditionals, how a draw is seeded and its reply parsed, and what the manifest and the run key
record of the model. Each of those is written here once, so the engines cannot drift apart. Readouts through a
server (:mod:`engines.server`) prepare their trials here too (:class:`RendersLocally`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engines.base import (
    Draws,
    Engine,
    EngineSettings,
    check_shared,
    draw_seed,
    reasoning_record,
    reasoning_seed,
)
from engines.render import (
    close_reasoning,
    has_chat_template,
    option_ids,
    plain_cut,
    render_ids,
    rendered_system_prompt,
    stop_ids,
    think_end_id,
)
from engines.trie import Prefix, Trie, normalize, option_logprobs
from probe.models import folder_fingerprint
from probe.models.gguf import manifest_record
from probe.parse import parsed_sample
from probe.types import LayerReadout, OptionScore, Readout, Sample, Trial

IDENTITY_SETTINGS = ("model", "think", "think_budget", "system_prompt", "revision", "trust_remote_code", "seed")
"""Settings that change the values of both engines (the rest, like batch size and device, only change speed)."""

MAX_TOKEN_IDS = 128
"""Most ids one ``logprob_token_ids`` request may carry (vLLM's ``MAX_LOGPROB_TOKEN_IDS``): the vLLM engine's
requests and those to a vLLM server are cut to it."""


@dataclass(frozen=True)
class Prepared:
    """A trial rendered to ids up to its slot (reasoning appended in think mode), with its option token sequences."""

    ids: tuple[int, ...]
    options: tuple[tuple[int, ...], ...]
    reasoning: str = ""
    reasoning_tokens: int = 0
    hit_budget: bool = False


@dataclass(frozen=True)
class DrawRow:
    """One draw of a sample call: draw ``draw`` of trial number ``trial``, its prompt ids and its seed."""

    trial: int
    draw: int
    prompt: tuple[int, ...]
    seed: int


@dataclass(frozen=True)
class ThinkRequest:
    """What one think-mode reasoning call (:meth:`RendersLocally._reason`) asks for, as one value (as
    :class:`engines.base.Draws` is for a sample call)."""

    prompts: tuple[tuple[int, ...], ...]
    """Each trial's prompt, rendered up to where its reasoning starts."""
    seeds: tuple[int, ...]
    """Each trial's reasoning seed (:func:`engines.base.reasoning_seed`), for ``think_temperature`` > 0."""
    budget: int
    """Most reasoning tokens of a trial."""
    end_id: int
    """The id of ``</think>``."""
    stops: frozenset[int]
    """The ids that end the model's turn."""

    @property
    def ends(self) -> set[int]:
        """The ids a trace stops at (and keeps): ``</think>`` and the end-of-turn ids."""
        return {*self.stops, self.end_id}


class RendersLocally:
    """What renders every trial to token ids with a local copy of the model's tokenizer and reads the slot after
    them: the local engines (:class:`LocalEngine`) and readouts through a server (:mod:`engines.server`).

    A trial is rendered, its options encoded and its think-mode reasoning appended here (:meth:`prepare`), so
    these engines read every slot after the same ids; each generates the reasoning its own way (:meth:`_reason`).
    """

    settings: Any
    _tok: Any
    _generation_eos: Any = None
    """The eos id(s) of the model's generation config, where the engine reads them at load; None: the tokenizer's
    eos alone ends a turn."""
    _frame: str | None = None
    """The frame resolved against the tokenizer (:meth:`_check_frame`, at load)."""

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (loaded on first use)."""
        if self._tok is None:
            self._load_tokenizer()
        return self._tok

    def _load_tokenizer(self) -> None:
        """Load the tokenizer into ``_tok``."""
        raise NotImplementedError

    def _decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens kept (as every reply is decoded)."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` in the model's tokenizer (special tokens not added)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    @property
    def frame(self) -> str:
        """The frame every prompt is rendered in, ``chat`` or ``plain`` (``--frame`` with auto resolved against the
        tokenizer: :func:`engines.render.resolve_frame`)."""
        if self._frame is None:
            self._check_frame(self.tokenizer)
        assert self._frame is not None
        return self._frame

    def _check_frame(self, tok: Any) -> None:
        """Resolve the frame against the loaded tokenizer ``tok`` (:func:`engines.base.check_shared`: ``--frame chat``
        without a template, and think mode in the plain frame ``auto`` resolved to, are refused in one line each)."""
        s = self.settings
        self._frame, _ = check_shared(
            s.SUPPORTS, frame=s.frame, think=s.think, model=s.model, template=has_chat_template(tok)
        )

    def frame_record(self) -> dict[str, Any]:
        """The frame for the manifest, ``{"frame": {"used", "asked"}}``; nothing for the chat template under
        ``--frame auto``, which records what a run recorded before frames existed."""
        if self.frame == "chat" and self.settings.frame == "auto":
            return {}
        return {"frame": {"used": self.frame, "asked": self.settings.frame}}

    def frame_identity(self) -> dict[str, Any]:
        """The frame for the run key: ``{"frame": "plain"}`` in the plain frame, nothing in the chat frame (so a chat
        run keeps the key it had before frames existed)."""
        return {"frame": "plain"} if self.frame == "plain" else {}

    def system_prompt_record(self) -> dict[str, str | None]:
        """What trials without a system turn are rendered with (:func:`engines.render.rendered_system_prompt`); in
        the plain frame only ``--system``, since no template adds its own there."""
        s = self.settings
        if self.frame == "plain":
            return {"text": s.system_prompt, "source": "--system" if s.system_prompt is not None else None}
        return rendered_system_prompt(self.tokenizer, s.system_prompt)

    def render(self, trial: Trial, *, think: bool | None = None) -> tuple[int, ...]:
        """The prompt token ids up to the answer slot (or to where reasoning starts; ``think``: the settings')."""
        think = self.settings.think if think is None else think
        return render_ids(
            self.tokenizer, trial, think=think, system_prompt=self.settings.system_prompt, frame=self.frame
        )

    def option_ids(self, trial: Trial) -> tuple[tuple[int, ...], ...]:
        """Each option as the token ids the model would emit at the slot (:func:`engines.render.option_ids`)."""
        return option_ids(self.tokenizer, trial, self.frame)

    def _stop_ids(self) -> set[int]:
        """The ids that end the model's turn (:func:`engines.render.stop_ids`)."""
        return stop_ids(self.tokenizer, self._generation_eos)

    def prepare(self, trials: Sequence[Trial]) -> list[Prepared]:
        """Render trials; in think mode, generate the reasoning (:meth:`_reason`, each trial seeded by
        :func:`engines.base.reasoning_seed`) and append it, closed, as ids (:meth:`with_reasoning`)."""
        if not self.settings.think:
            return [Prepared(self.render(t), self.option_ids(t)) for t in trials]
        request = self.think_request(trials)
        return self.with_reasoning(request, trials, self._reason(request))

    def think_request(self, trials: Sequence[Trial]) -> ThinkRequest:
        """What reasoning these trials asks for: their prompts up to where reasoning starts, their seeds, the
        budget and the ids a trace ends at."""
        s = self.settings
        return ThinkRequest(
            tuple(self.render(t) for t in trials),
            tuple(reasoning_seed(s.seed, t.trial_id) for t in trials),
            s.think_budget,
            think_end_id(self.tokenizer, s.model),
            frozenset(self._stop_ids()),
        )

    def with_reasoning(
        self, request: ThinkRequest, trials: Sequence[Trial], gens: Sequence[Sequence[int]]
    ) -> list[Prepared]:
        """Each think-mode trial with the reasoning ``gens`` it generated for ``request`` closed and appended
        (:func:`engines.render.close_reasoning`, at the request's ends and budget), ready for the slot."""
        out = []
        for t, gen in zip(trials, gens, strict=True):
            r = close_reasoning(
                self.tokenizer,
                t,
                self.render(t),
                gen,
                end_id=request.end_id,
                stops=set(request.stops),
                budget=request.budget,
            )
            out.append(Prepared(r.ids, self.option_ids(t), r.reasoning, r.reasoning_tokens, r.hit_budget))
        return out

    def _reason(self, request: ThinkRequest) -> list[list[int]]:
        """The reasoning generated after each prompt of ``request``, up to its budget, ending at (and keeping) one
        of its ``ends``: greedy, or at ``think_temperature`` from the trial's seed."""
        raise NotImplementedError


class LocalEngine(RendersLocally, Engine):
    """What the two local engines have alike: settings, a model's tokenizer loaded with the engine, the run key,
    and how draws are seeded and their replies parsed."""

    value_settings: tuple[str, ...] = IDENTITY_SETTINGS
    """The settings that change this engine's values (they enter the run key)."""

    def _load_tokenizer(self) -> None:
        self.load()

    def identity(self) -> dict[str, Any]:
        """What determines the values (enters the run key): the model's dtype and fingerprint (or hub commit),
        and the value settings."""
        d = self.describe()
        numerics = self.numerics() if d["dtype"] != "float32" else {}
        return {
            "engine": self.name,
            "dtype": d["dtype"],
            "model_fingerprint": d.get("fingerprint") or d.get("commit_hash"),
            **{k: getattr(self.settings, k) for k in self.value_settings},
            **reasoning_record(self.settings),
            **self.frame_identity(),
            **({"numerics": numerics} if numerics else {}),
        }

    def numerics(self) -> dict[str, Any]:
        """The settings that change values through rounding alone, outside float32 (batching, path, tree size).

        In float32 the readout paths agree within 3.2e-5 nats and these stay out of the run key; in bfloat16 the
        same trial moves by up to a few tenths of a nat between them (docs/gpu.md), so they enter it, and a resume
        or a merge never mixes them. The runner adds the chunk size, which decides what is batched together.
        """
        return {}

    def _seeded_rows(self, trials: Sequence[Trial], n: int) -> list[DrawRow]:
        """The ``n`` draws of each trial, trial-major: every trial rendered once, draw d seeded by (seed, trial id,
        d) (:func:`engines.base.draw_seed`), so a draw depends neither on the batch nor on the engine."""
        base = {t.trial_id: self.render(t) for t in trials}
        seed = self.settings.seed
        return [
            DrawRow(k, d, base[t.trial_id], draw_seed(seed, t.trial_id, d))
            for k, t in enumerate(trials)
            for d in range(n)
        ]

    def _reply_budget(self, draws: Draws) -> int:
        """Most tokens one draw generates: the call's reply cap (else ``max_new_tokens``), and in think mode the
        reasoning budget before it."""
        s = self.settings
        return (draws.max_new_tokens or s.max_new_tokens) + (s.think_budget if s.think else 0)

    def _parsed_reply(
        self,
        trial: Trial,
        row: DrawRow,
        gen: Sequence[int],
        stops: set[int],
        *,
        truncated: bool,
        stop_at_answer: bool,
    ) -> Sample:
        """The parsed :class:`Sample` of the reply ``gen`` generated for ``row`` (its stop tokens dropped before
        decoding); ``truncated``: it hit the token cap, not ended by the model. In the plain frame the reply ends at
        the frame's stops (:func:`engines.render.plain_cut`), wherever the engine stopped generating."""
        body = [g for g in gen if g not in stops]
        spent = len(gen)
        if self.frame == "plain":
            cut = plain_cut(self._decode, body)
            if cut.stopped:
                body, spent, truncated = list(cut.ids), cut.spent, False
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        return parsed_sample(
            trial,
            row.draw,
            text,
            len(row.prompt),
            spent,
            think=self.settings.think,
            token_ids=body,
            truncated=truncated,
            stop_at_answer=stop_at_answer,
        )


def slot_readout(
    trial: Trial,
    prep: Prepared,
    trie: Trie,
    cond: Mapping[Prefix, Mapping[int, float]],
    *,
    top_other: tuple[tuple[str, float], ...],
    computed: int,
) -> Readout:
    """The readout of one trial from the conditionals at its trie's nodes.

    ``top_other``: the most likely first tokens that start no option, with their probabilities; ``computed``: the
    tokens the engine computed for this trial. Ties in the greedy option go to the first option.
    """
    lps = option_logprobs(prep.options, trie, cond)
    return assembled_readout(trial, prep, lps, top_other=top_other, computed=computed)


def assembled_readout(
    trial: Trial,
    prep: Prepared,
    lps: Sequence[float],
    *,
    top_other: tuple[tuple[str, float], ...],
    computed: int,
    coverage: float | None = None,
) -> Readout:
    """The :class:`Readout` of one trial from its options' log probabilities ``lps`` (normalized here); every
    engine assembles its readouts here. ``coverage``: the option mass, unless the engine knows only a lower bound
    of it (readouts through a server with bounded options). Ties in the greedy option go to the first option."""
    probs, mass = normalize(lps)
    best = greedy_index(lps)
    return Readout(
        trial_id=trial.trial_id,
        scores=tuple(
            OptionScore(o, ids, lp, p) for o, ids, lp, p in zip(trial.options, prep.options, lps, probs, strict=True)
        ),
        coverage=mass if coverage is None else coverage,
        greedy_option=trial.options[best],
        top_other=top_other,
        prompt_tokens=len(prep.ids),
        computed_tokens=computed,
        reasoning=prep.reasoning,
        reasoning_tokens=prep.reasoning_tokens,
        hit_budget=prep.hit_budget,
        prompt_ids=prep.ids,
    )


def greedy_index(lps: Sequence[float]) -> int:
    """The most likely option's index among log probabilities ``lps``; ties go to the first option."""
    return max(range(len(lps)), key=lambda i: (lps[i], -i))


def layer_readout(layer: int, trial: Trial, lps: Sequence[float]) -> LayerReadout:
    """The readout of ``trial`` at ``layer`` from its options' log probabilities there, normalized, with its
    coverage and greedy option as :func:`assembled_readout` gives them at the final layer."""
    probs, mass = normalize(lps)
    return LayerReadout(layer, tuple(lps), tuple(probs), mass, trial.options[greedy_index(lps)])


def top_others(
    seen: Mapping[int, float], first: Iterable[int], k: int, decode: Callable[[int], str]
) -> tuple[tuple[str, float], ...]:
    """The ``k`` most likely tokens ``seen`` at a slot that start no option (``first``: the options' first tokens),
    decoded, with their probabilities: a readout's ``top_other`` where the engine is given the slot's log
    probabilities token by token (vLLM's replies, a server's). Ties go to the lower id."""
    firsts = set(first)
    ranked = sorted(((lp, t) for t, lp in seen.items() if t not in firsts), key=lambda x: (-x[0], x[1]))
    return tuple((decode(t), math.exp(lp)) for lp, t in ranked[:k])


def reasoning_sampling(s: EngineSettings, seed: int) -> dict[str, Any]:
    """How think mode decodes one trial's reasoning, as request fields: none for greedy reasoning, else the
    settings' ``think_temperature``, ``think_top_p`` and ``think_top_k`` (``--think-sampling``) with the trial's own
    ``seed`` (:func:`engines.base.reasoning_seed`), so vLLM and a server reason as the Transformers engine does."""
    if s.think_temperature == 0:
        return {}
    return {
        "temperature": float(s.think_temperature),
        "top_p": float(s.think_top_p),
        "top_k": int(s.think_top_k),
        "seed": seed,
    }


def with_stop(gen: Sequence[int], stop_reason: Any, end_id: int) -> list[int]:
    """Generated ids with the ``end_id`` (``</think>``) they stopped at: vLLM keeps it among the ids, and where a
    version or a server left it out, it is restored from the reply's ``stop_reason``."""
    out = [int(g) for g in gen]
    if stop_reason == end_id and (not out or out[-1] != end_id):
        out.append(end_id)
    return out


def folder_info(path: str | None) -> dict[str, Any]:
    """What the manifest records of a local model folder (its fingerprint, and a GGUF's record); ``{}`` for
    anything else (a hub id)."""
    from pathlib import Path

    if not path or not Path(path).is_dir():
        return {}
    info: dict[str, Any] = {"fingerprint": folder_fingerprint(path)}
    if (gguf := manifest_record(path)) is not None:
        info["gguf"] = gguf
    return info
