"""The Transformers engine: exact answer-slot readouts and raw samples.

Design notes (why it is shaped like this):

* **Token ids, not strings.** The chat template renders the whole prompt to
  text once, it is tokenized once, and everything after (option tokens,
  reasoning, closing tags) is appended as ids. Nothing is ever cut out of a
  string that was tokenized whole, because BPE merges across a cut change the
  ids the model saw.
* **One prompt pass, then the trie on its cache.** Options become token
  sequences in a trie (:mod:`engines.trie`); the prompt is run once, and the
  trie's internal nodes are expanded one token per step by gathering rows of
  the prompt's cache (``Cache.reorder_cache``, the beam-search primitive, which
  every Transformers cache, attention and Mamba alike, implements). One token
  per step keeps hybrid (Mamba) models on their well-trodden decode path.
* **Batch- and padding-invariant.** Prompts are left-padded with explicit
  position ids (so RoPE positions do not depend on the padding), length-bucketed,
  and only the last position's logits are computed.
* **float32 from raw logits.** No temperature, no top-k, no processors.
"""

from __future__ import annotations

import argparse
import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from engines.base import ProgressFn, require
from engines.trie import Prefix, build_trie, normalize, option_logprobs
from probe.parse import parse_answer, split_reasoning
from probe.types import OptionScore, Readout, Sample, Trial

DTYPES = ("auto", "float32", "bfloat16", "float16")


class OptionError(ValueError):
    """An option string that the tokenizer cannot encode faithfully."""


@dataclass(frozen=True)
class HFSettings:
    """Settings of the Transformers engine (all recorded in the run manifest)."""

    model: str
    """A built-in tiny model name, a local folder, or a Hugging Face id."""
    dtype: str = "auto"
    """Weights dtype: auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16. Softmax is always float32."""
    device: str = "auto"
    """auto (all visible GPUs via accelerate, else CPU), cpu, cuda, cuda:N."""
    batch_size: int = 16
    """Most trials per forward pass."""
    max_batch_tokens: int = 32768
    """Most padded prompt tokens per forward pass (bounds activation memory)."""
    think: bool = False
    """Reason first (greedy, up to ``think_budget`` tokens), then read the slot."""
    think_budget: int = 512
    system_prompt: str | None = None
    """Added as a system turn to trials that have none."""
    top_other: int = 5
    """How many of the most likely non-option tokens to report."""
    max_new_tokens: int = 32
    """Answer tokens allowed to ``sample()`` after any reasoning."""
    seed: int = 0
    """Seed of the per-(trial, draw) sampling generators."""
    revision: str | None = None
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in ("batch_size", "max_batch_tokens", "think_budget", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.top_other < 0:
            raise ValueError(f"top_other must be >= 0, got {self.top_other}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")


@dataclass(frozen=True)
class _Prepared:
    """A trial rendered to ids, with its option token sequences."""

    ids: tuple[int, ...]
    options: tuple[tuple[int, ...], ...]
    reasoning: str = ""
    reasoning_tokens: int = 0
    hit_budget: bool = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The Transformers engine uses only the shared engine flags."""


def from_args(model: str, a: argparse.Namespace) -> HFEngine:
    return HFEngine(
        HFSettings(
            model=model,
            dtype=a.dtype,
            device=a.device,
            batch_size=a.batch_size,
            think=a.think,
            think_budget=a.think_budget,
            system_prompt=a.system,
            max_new_tokens=a.max_new_tokens,
            seed=a.seed,
            revision=a.revision,
            trust_remote_code=a.trust_remote_code,
        )
    )


# Settings that change values (the rest, like batch size and device, only change speed).
_IDENTITY_SETTINGS = ("model", "think", "think_budget", "system_prompt", "revision", "trust_remote_code", "seed")


def _seed_for(seed: int, trial_id: str, draw: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{trial_id}:{draw}".encode()).digest()[:8], "little") >> 1


def length_batches(lengths: Sequence[int], batch_size: int, max_tokens: int) -> list[list[int]]:
    """Group indices into batches of similar length (longest first), bounded in rows and padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = lengths[cur[0]] if cur else lengths[i]  # longest first: the first row sets the width
        if cur and (len(cur) >= batch_size or width * (len(cur) + 1) > max_tokens):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


class HFEngine:
    """Answer-slot readouts and samples from a Transformers causal LM."""

    name = "hf"

    def __init__(self, settings: HFSettings, *, model: Any = None, tokenizer: Any = None) -> None:
        self.settings = settings
        self._model = model
        self._tok = tokenizer
        self._path: str | None = None
        self._cache_kw = "past_key_values"

    # ---------------------------------------------------------------- loading
    def load(self) -> HFEngine:
        """Load tokenizer and model (idempotent)."""
        if self._model is not None and self._tok is not None:
            self._setup()
            return self
        torch = require("torch", "hf")
        transformers = require("transformers", "hf")
        from probe.models import ModelError, resolve_model

        ref = resolve_model(self.settings.model)
        self._path = ref.path
        s = self.settings
        cuda = torch.cuda.is_available() and s.device != "cpu"
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
            s.dtype, torch.bfloat16 if cuda else torch.float32
        )
        kw: dict[str, Any] = {"revision": s.revision, "trust_remote_code": s.trust_remote_code}
        transformers.logging.disable_progress_bar()  # probe shows its own progress; keep logs clean
        try:
            self._tok = transformers.AutoTokenizer.from_pretrained(ref.path, **kw)
            device_map: Any = "auto" if (cuda and s.device == "auto") else (s.device if cuda else "cpu")
            self._model = transformers.AutoModelForCausalLM.from_pretrained(
                ref.path, dtype=dtype, device_map=device_map, **kw
            )
        except (OSError, ValueError) as e:
            raise ModelError(
                f"cannot load model {s.model!r} ({ref.path}): {str(e).splitlines()[0]}. "
                "Pass a built-in name (tiny, tiny-hybrid), a local model folder, or a Hugging Face id "
                "that is in the local cache or downloadable from here."
            ) from e
        self._model.eval()
        self._setup()
        return self

    def _setup(self) -> None:
        import inspect

        params = inspect.signature(self._model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        tok = self._tok
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        if not getattr(tok, "chat_template", None):
            raise ValueError(
                f"model {self.settings.model!r} has no chat template; probe renders every trial as a chat. "
                "Use an instruction-tuned model (or add a chat_template to its tokenizer_config.json)."
            )

    @property
    def model(self) -> Any:
        if self._model is None:
            self.load()
        return self._model

    @property
    def tokenizer(self) -> Any:
        if self._tok is None:
            self.load()
        return self._tok

    @property
    def device(self) -> Any:
        return self.model.get_input_embeddings().weight.device

    def identity(self) -> dict[str, Any]:
        """What determines the values (enters the run key): model, its fingerprint, dtype, value settings."""
        d = self.describe()
        return {
            "engine": self.name,
            "dtype": d["dtype"],
            "model_fingerprint": d.get("fingerprint") or d.get("commit_hash"),
            **{k: getattr(self.settings, k) for k in _IDENTITY_SETTINGS},
        }

    def describe(self) -> dict[str, Any]:
        """Model, revision, dtype and settings for the manifest."""
        from probe.models import folder_fingerprint

        m = self.model
        path = str(self._path or getattr(m, "name_or_path", ""))
        info: dict[str, Any] = {
            "engine": self.name,
            "settings": asdict(self.settings),
            "model_path": path,
            "model_class": type(m).__name__,
            "dtype": str(next(m.parameters()).dtype).replace("torch.", ""),
            "device": str(self.device),
            "commit_hash": getattr(m.config, "_commit_hash", None),
            "n_parameters": sum(p.numel() for p in m.parameters()),
        }
        from pathlib import Path

        if path and Path(path).is_dir():
            info["fingerprint"] = folder_fingerprint(path)
        return info

    # ------------------------------------------------------------- rendering
    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def render(self, trial: Trial, *, think: bool | None = None) -> tuple[int, ...]:
        """The prompt token ids up to the answer slot (or to where reasoning starts)."""
        think = self.settings.think if think is None else think
        msgs = [{"role": m.role, "content": m.content} for m in trial.messages]
        if self.settings.system_prompt is not None and msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": self.settings.system_prompt})
        text = self.tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=True, enable_thinking=think
        )
        if not think:
            text += trial.assistant_prefix
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def option_ids(self, trial: Trial) -> tuple[tuple[int, ...], ...]:
        """Each option as the token ids the model would emit at the slot.

        After an assistant prefix that does not end in whitespace (``Answer:``)
        the option is scored with a leading space (``Answer: Yes``), because
        that is how the model would continue; right after the template's
        newline it is scored bare.
        """
        pre = trial.assistant_prefix
        sep = " " if pre and not pre[-1].isspace() else ""
        tok = self.tokenizer
        out = []
        for opt in trial.options:
            if not opt:
                raise OptionError(f"trial {trial.trial_id}: empty option string")
            ids = tuple(tok.encode(sep + opt, add_special_tokens=False))
            back = tok.decode(list(ids), clean_up_tokenization_spaces=False)
            if not ids or back != sep + opt or (tok.unk_token_id is not None and tok.unk_token_id in ids):
                raise OptionError(
                    f"trial {trial.trial_id}: option {opt!r} does not survive the tokenizer "
                    f"(encodes to {list(ids)}, decodes to {back!r}); use options this model can write"
                )
            out.append(ids)
        return tuple(out)

    def _special_ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _think_end_id(self) -> int:
        tid = self.tokenizer.convert_tokens_to_ids("</think>")
        if tid is None or tid == self.tokenizer.unk_token_id:
            raise ValueError(f"model {self.settings.model!r} has no </think> token; think mode needs a reasoning model")
        return int(tid)

    def _stop_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        gen = getattr(self.model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(eos)
        return {i for i in ids if i is not None}

    def prepare(self, trials: Sequence[Trial]) -> list[_Prepared]:
        """Render trials; in think mode, generate and append the reasoning."""
        base = [self.render(t) for t in trials]
        opts = [self.option_ids(t) for t in trials]
        if not self.settings.think:
            return [_Prepared(ids, o) for ids, o in zip(base, opts, strict=True)]
        end_id = self._think_end_id()
        budget = self.settings.think_budget
        stops = self._stop_ids()
        gens = self._decode(base, budget, stops | {end_id}, 0.0, None, progress=None)
        tok = self.tokenizer
        out = []
        for t, ids, o, gen in zip(trials, base, opts, gens, strict=True):
            closed = bool(gen) and gen[-1] == end_id
            body = [g for g in gen if g not in stops]
            # budget spent (or the model stopped inside the block): close the block for it
            tail = self._special_ids("\n\n" if closed else "\n</think>\n\n")
            pre = t.assistant_prefix
            full = (*ids, *body, *tail, *(self._special_ids(pre) if pre else ()))
            reasoning, _ = split_reasoning(tok.decode(body + ([] if closed else [end_id]), skip_special_tokens=False))
            out.append(_Prepared(full, o, reasoning, len(gen), not closed and len(gen) >= budget))
        return out

    # ------------------------------------------------------------ the forward
    def _pad_left(self, seqs: Sequence[Sequence[int]]) -> tuple[Any, Any]:
        torch = require("torch", "hf")
        width = max(len(s) for s in seqs)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[r, width - len(s) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _forward(self, ids: Any, mask: Any, cache: Any) -> tuple[Any, Any]:
        """Last-position float32 log-probs and the updated cache."""
        torch = require("torch", "hf")
        if cache is None:
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
        else:
            pos = (mask.sum(-1, keepdim=True) - 1).expand(-1, ids.shape[1])
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        new_cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        return torch.log_softmax(out.logits[:, -1, :].float(), dim=-1), new_cache

    # -------------------------------------------------------------- readouts
    def readout(self, trials: Sequence[Trial], progress: ProgressFn | None = None) -> list[Readout]:
        """The answer-slot distribution of each trial, in input order.

        In think mode the reasoning is generated one length bucket at a time
        (so progress is reported as it goes and memory stays bounded), then
        the bucket's slots are read.
        """
        if not trials:
            return []
        torch = require("torch", "hf")
        s = self.settings
        for t in trials:  # fail on a bad option before spending any compute
            self.option_ids(t)
        if s.think:
            groups = length_batches([len(self.render(t)) for t in trials], s.batch_size, s.max_batch_tokens)
        else:
            groups = [list(range(len(trials)))]
        results: list[Readout | None] = [None] * len(trials)
        with torch.inference_mode():
            for group in groups:
                prepared = self.prepare([trials[i] for i in group])
                for batch in length_batches([len(p.ids) for p in prepared], s.batch_size, s.max_batch_tokens):
                    rows = [group[j] for j in batch]
                    outs = self._readout_batch([trials[i] for i in rows], [prepared[j] for j in batch])
                    for i, r in zip(rows, outs, strict=True):
                        results[i] = r
                    if progress:
                        progress(len(batch))
        return [r for r in results if r is not None]

    def _readout_batch(self, trials: Sequence[Trial], prepared: Sequence[_Prepared]) -> list[Readout]:
        torch = require("torch", "hf")
        ids, mask = self._pad_left([p.ids for p in prepared])
        root_lp, cache = self._forward(ids, mask, None)
        tries = [build_trie(p.options) for p in prepared]
        cond: list[dict[Prefix, dict[int, float]]] = [{} for _ in prepared]
        for b, trie in enumerate(tries):
            kids = list(trie[()])
            cond[b][()] = dict(zip(kids, root_lp[b, kids].tolist(), strict=True))
        expanded = [0] * len(prepared)
        rows: list[tuple[int, Prefix]] = [(b, ()) for b in range(len(prepared))]
        while True:  # breadth-first over internal nodes, one token per step
            nxt = [(r, b, (*p, t)) for r, (b, p) in enumerate(rows) for t in tries[b][p] if (*p, t) in tries[b]]
            if not nxt:
                break
            idx = torch.tensor([r for r, _, _ in nxt], device=mask.device)
            cache.reorder_cache(idx)
            mask = torch.cat([mask[idx], torch.ones((len(nxt), 1), dtype=mask.dtype, device=mask.device)], dim=1)
            step = torch.tensor([[p[-1]] for _, _, p in nxt], device=mask.device)
            lp, cache = self._forward(step, mask, cache)
            for r, (_, b, p) in enumerate(nxt):
                kids = list(tries[b][p])
                cond[b][p] = dict(zip(kids, lp[r, kids].tolist(), strict=True))
                expanded[b] += 1
            rows = [(b, p) for _, b, p in nxt]
        return [
            self._assemble(t, p, tries[b], cond[b], root_lp[b], expanded[b])
            for b, (t, p) in enumerate(zip(trials, prepared, strict=True))
        ]

    def _assemble(
        self, trial: Trial, prep: _Prepared, trie: Any, cond: dict[Prefix, dict[int, float]], root: Any, expanded: int
    ) -> Readout:
        torch = require("torch", "hf")
        lps = option_logprobs(prep.options, trie, cond)
        probs, coverage = normalize(lps)
        best = max(range(len(lps)), key=lambda i: (lps[i], -i))
        other: tuple[tuple[str, float], ...] = ()
        if self.settings.top_other:
            masked = root.clone()
            masked[list(trie[()])] = -math.inf
            vals, idx = torch.topk(masked, self.settings.top_other)
            other = tuple(
                (self.tokenizer.decode([int(i)]), float(math.exp(v)))
                for v, i in zip(vals.tolist(), idx.tolist(), strict=True)
            )
        return Readout(
            trial_id=trial.trial_id,
            scores=tuple(
                OptionScore(o, ids, lp, p)
                for o, ids, lp, p in zip(trial.options, prep.options, lps, probs, strict=True)
            ),
            coverage=coverage,
            greedy_option=trial.options[best],
            top_other=other,
            prompt_tokens=len(prep.ids),
            computed_tokens=len(prep.ids) + expanded,
            reasoning=prep.reasoning,
            reasoning_tokens=prep.reasoning_tokens,
            hit_budget=prep.hit_budget,
            prompt_ids=prep.ids,
        )

    # -------------------------------------------------------------- sampling
    def _decode(
        self,
        prompts: Sequence[Sequence[int]],
        max_new: int,
        stops: set[int],
        temperature: float,
        seeds: Sequence[int] | None,
        progress: ProgressFn | None,
    ) -> list[list[int]]:
        """Batched decoding with a KV cache: greedy at temperature 0, else raw sampling.

        Each row samples from its own generator seeded by (seed, trial, draw),
        so a sample does not depend on what else was in the batch: a resumed
        run redraws exactly what an uninterrupted one would have.
        """
        torch = require("torch", "hf")
        s = self.settings
        out: list[list[int]] = [[] for _ in prompts]
        with torch.inference_mode():
            for batch in length_batches([len(p) for p in prompts], s.batch_size, s.max_batch_tokens):
                ids, mask = self._pad_left([prompts[i] for i in batch])
                lp, cache = self._forward(ids, mask, None)
                gens = (
                    [torch.Generator(device=lp.device).manual_seed(seeds[i]) for i in batch]
                    if temperature > 0 and seeds is not None
                    else None
                )
                done = [False] * len(batch)
                for step in range(max_new):
                    if gens is None:
                        nxt = lp.argmax(-1)
                    else:
                        probs = torch.softmax(lp / temperature, dim=-1)
                        nxt = torch.stack([torch.multinomial(probs[r], 1, generator=g)[0] for r, g in enumerate(gens)])
                    toks = nxt.tolist()
                    for r, i in enumerate(batch):
                        if not done[r]:
                            out[i].append(toks[r])
                            done[r] = toks[r] in stops
                    if all(done) or step == max_new - 1:
                        break
                    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                    lp, cache = self._forward(nxt[:, None], mask, cache)
                if progress:
                    progress(len(batch))
        return out

    def sample(
        self, trials: Sequence[Trial], n: int, temperature: float, progress: ProgressFn | None = None
    ) -> list[Sample]:
        """``n`` raw samples per trial at ``temperature`` (no top-k/top-p), parsed; trial-major order.

        ``Sample.replicate`` is the draw index 0..n-1. In think mode the model
        reasons and answers freely, so an assistant prefix is not forced.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not (temperature >= 0 and math.isfinite(temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
        s = self.settings
        rows = [(t, d) for t in trials for d in range(n)]
        base = {t.trial_id: self.render(t) for t in trials}
        prompts = [base[t.trial_id] for t, _ in rows]
        seeds = [_seed_for(s.seed, t.trial_id, d) for t, d in rows]
        budget = s.max_new_tokens + (s.think_budget if s.think else 0)
        stops = self._stop_ids()
        gens = self._decode(prompts, budget, stops, temperature, seeds, progress)
        out = []
        for (t, d), p, gen in zip(rows, prompts, gens, strict=True):
            body = [g for g in gen if g not in stops]
            text = self.tokenizer.decode(body, skip_special_tokens=False)
            if t.assistant_prefix and not s.think:
                text = t.assistant_prefix + text
            reasoning, _ = split_reasoning(text)
            parsed = parse_answer(text, t.options)
            out.append(
                Sample(
                    trial_id=t.trial_id,
                    replicate=d,
                    text=text,
                    option=parsed.option,
                    status=parsed.status,
                    prompt_tokens=len(p),
                    completion_tokens=len(gen),
                    reasoning=reasoning,
                )
            )
        return out
