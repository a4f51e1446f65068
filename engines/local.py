"""What the two local model engines (:mod:`engines.hf`, :mod:`engines.vllm`) do alike around their model calls.

They differ in how they compute (one forward over a token tree, or ``max_tokens=1`` requests to vLLM), and must
agree on everything else, to the bit: how a trial is prepared for its slot, how a readout is assembled from the
trie's conditionals, how a generated reply is parsed, and what the manifest and the run key
record of the model. Each of those is written here once, so the engines cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engines.base import Engine, reasoning_record
from engines.render import close_reasoning
from engines.trie import Prefix, Trie, normalize, option_logprobs
from probe.models import folder_fingerprint
from probe.models.gguf import manifest_record
from probe.parse import parsed_sample
from probe.types import OptionScore, Readout, Sample, Trial

IDENTITY_SETTINGS = ("model", "think", "think_budget", "system_prompt", "revision", "trust_remote_code", "seed")
"""Settings that change the values of both engines (the rest, like batch size and device, only change speed)."""


class LocalEngine(Engine):
    """What the two local engines have alike: settings, a model's tokenizer loaded with the engine, the run key."""

    settings: Any
    _tok: Any
    value_settings: tuple[str, ...] = IDENTITY_SETTINGS
    """The settings that change this engine's values (they enter the run key)."""

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (loads the engine on first use)."""
        if self._tok is None:
            self.load()
        return self._tok

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

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
            **({"numerics": numerics} if numerics else {}),
        }

    def numerics(self) -> dict[str, Any]:
        """The settings that change values through rounding alone, outside float32 (batching, path, tree size).

        In float32 the readout paths agree within 3.3e-5 nats and these stay out of the run key; in bfloat16 the
        same trial moves by up to a few tenths of a nat between them (docs/gpu.md), so they enter it, and a resume
        or a merge never mixes them. The runner adds the chunk size, which decides what is batched together.
        """
        return {}

    def _check_chat_template(self) -> None:
        """Refuse a tokenizer without a chat template, naming the model and the fix."""
        if not getattr(self._tok, "chat_template", None):
            raise ValueError(
                f"model {self.settings.model!r} has no chat template; probe renders every trial as a chat. "
                "Use an instruction-tuned model (or add a chat_template to its tokenizer_config.json)."
            )


@dataclass(frozen=True)
class Prepared:
    """A trial rendered to ids up to its slot (reasoning appended in think mode), with its option token sequences."""

    ids: tuple[int, ...]
    options: tuple[tuple[int, ...], ...]
    reasoning: str = ""
    reasoning_tokens: int = 0
    hit_budget: bool = False


def with_reasoning(
    tok: Any,
    trials: Sequence[Trial],
    base: Sequence[tuple[int, ...]],
    opts: Sequence[tuple[tuple[int, ...], ...]],
    gens: Sequence[Sequence[int]],
    *,
    end_id: int,
    stops: set[int],
    budget: int,
) -> list[Prepared]:
    """Each think-mode prompt ``base`` with its greedy reasoning ``gens`` closed and appended
    (:func:`engines.render.close_reasoning`), ready for the slot."""
    out = []
    for t, ids, o, gen in zip(trials, base, opts, gens, strict=True):
        r = close_reasoning(tok, t, ids, gen, end_id=end_id, stops=stops, budget=budget)
        out.append(Prepared(r.ids, o, r.reasoning, r.reasoning_tokens, r.hit_budget))
    return out


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
    best = max(range(len(lps)), key=lambda i: (lps[i], -i))
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


def reply_sample(
    tok: Any,
    trial: Trial,
    draw: int,
    prompt_tokens: int,
    gen: Sequence[int],
    stops: set[int],
    *,
    think: bool,
    truncated: bool,
    stop_at_answer: bool,
) -> Sample:
    """The parsed :class:`Sample` of one generated reply ``gen`` (its stop tokens dropped before decoding)."""
    body = [g for g in gen if g not in stops]
    text = tok.decode(body, skip_special_tokens=False)
    return parsed_sample(
        trial,
        draw,
        text,
        prompt_tokens,
        len(gen),
        think=think,
        token_ids=body,
        truncated=truncated,
        stop_at_answer=stop_at_answer,
    )


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
