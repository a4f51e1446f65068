"""The sampling peers, and the child process that times one of them on the forced-binary trials.

Every peer draws ``n`` raw samples (temperature 1, no top-k or top-p) of at
most ``max_new_tokens`` tokens for each of the same trials, from the same
prompt token ids (probe's render of the trial), stopping at the same
end-of-turn ids:

* ``probe`` / ``probe-stop``: :meth:`engines.hf.HFEngine.sample` as it is in
  the working tree, with ``stop_at_answer`` False / True (where the engine does
  not accept ``stop_at_answer`` yet, ``probe-stop`` runs without it and says
  so in its result).
* ``today``: the same method of the engine as committed at :data:`TODAY`
  (``git show TODAY:engines/hf.py``, imported as a module of its own; it
  imports the rest of the package from the working tree).
* ``generate``: the baseline a user would write with Transformers:
  ``model.generate(input_ids, attention_mask, do_sample=True,
  num_return_sequences=n, top_k=0, top_p=1.0, temperature=1.0,
  max_new_tokens=...)`` over left-padded batches of trials.

The vLLM peers run in the vLLM venv (:mod:`scripts.bench.vllm_child`).

``python -m scripts.bench.sampling --peer P --model DIR --trials K --out FILE``
loads the model, warms the peer up on a trial outside the workload, measures
the matmul rate, resets the peak resident memory and times one run, then
writes per draw the trial index, the generated token count (stop token
included) and the text, with the run's time, tokens fed and peak memory.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SAMPLE_PEERS = ("probe", "probe-stop", "today", "generate")
TODAY = "ebf9206"
"""The commit whose ``engines/hf.py`` is "today's engine" (before the sampling work of issue 17)."""
ROOT = Path(__file__).resolve().parents[2]


def binary_trials(count_tokens: Any, k: int) -> list[Any]:
    """The first ``k`` forced-binary trials of the default battery, in the battery's order."""
    from experiments.battery import BatterySpec, expand

    trials = [t for t in expand(BatterySpec(), count_tokens=count_tokens) if t.factors["instrument"] == "binary"]
    return trials[:k]


def load_engine_module(commit: str = TODAY, root: Path = ROOT) -> Any:
    """``engines/hf.py`` as committed at ``commit``, imported as a module named after the commit."""
    text = subprocess.run(
        ["git", "show", f"{commit}:engines/hf.py"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    folder = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    name = f"bench_hf_{commit}"
    path = folder / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def answer_shares(options: Sequence[Sequence[str]], texts: Sequence[str]) -> dict[str, float]:
    """Shares of draws that parse as the trial's first option (Yes), its second (No), or neither.

    Every peer's replies are parsed by the same rule, :func:`probe.parse.parse_answer` on the reply up to
    ``probe.parse.answer_end`` where the parser has it, so a peer that stops at the answer and one that
    generates on are read alike.
    """
    from probe import parse

    end_of = getattr(parse, "answer_end", None)
    counts = {"first": 0, "second": 0, "other": 0}
    for opts, text in zip(options, texts, strict=True):
        end = end_of(text, opts) if end_of is not None else None
        got = parse.parse_answer(text if end is None else text[:end], opts, think=False).option  # no think mode
        counts["first" if got == opts[0] else "second" if got == opts[1] else "other"] += 1
    n = max(1, len(texts))
    return {k: v / n for k, v in counts.items()}


class EngineSampler:
    """probe's Transformers engine (the working tree's, or the module of another commit)."""

    def __init__(self, module: Any, model: Any, tok: Any, path: str, batch_size: int, stop: bool | None) -> None:
        self.engine = module.HFEngine(module.HFSettings(model=path, batch_size=batch_size), model=model, tokenizer=tok)
        self.engine.load()
        self.kw: dict[str, Any] = {}
        self.note = ""
        if stop is not None:
            if "stop_at_answer" in inspect.signature(self.engine.sample).parameters:
                self.kw["stop_at_answer"] = stop
            elif stop:
                self.note = "sample() does not accept stop_at_answer yet: ran without it"

    def render(self, trial: Any) -> tuple[int, ...]:
        return tuple(self.engine.render(trial))

    def run(self, trials: Sequence[Any], n: int, max_new: int) -> list[tuple[int, int, str]]:
        out = self.engine.sample(trials, n, 1.0, max_new_tokens=max_new, **self.kw)
        index = {t.trial_id: i for i, t in enumerate(trials)}
        return [(index[s.trial_id], int(s.completion_tokens), s.text) for s in out]


class GenerateSampler:
    """``model.generate(do_sample=True, num_return_sequences=n)`` per left-padded batch of trials."""

    def __init__(self, engine: Any, batch_size: int, seed: int) -> None:
        self.engine = engine  # probe's engine: only for its render and stop ids, so every peer gets the same ids
        self.model = engine.model
        self.tok = engine.tokenizer
        self.batch_size = batch_size
        self.seed = seed
        self.stops = sorted(engine._stop_ids())
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.stops[0]
        self.note = ""

    def run(self, trials: Sequence[Any], n: int, max_new: int) -> list[tuple[int, int, str]]:
        import torch

        torch.manual_seed(self.seed)
        out: list[tuple[int, int, str]] = []
        for lo in range(0, len(trials), self.batch_size):
            batch = trials[lo : lo + self.batch_size]
            ids, mask = self.engine.lm.pad_left([self.engine.render(t) for t in batch])  # on the model's device
            width = ids.shape[1]
            gen = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                num_return_sequences=n,
                max_new_tokens=max_new,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
                eos_token_id=self.stops,
                pad_token_id=self.pad,
            )
            for row, seq in enumerate(gen[:, width:].tolist()):
                body, count = [], 0
                for tid in seq:
                    count += 1
                    if tid in self.stops:
                        break
                    body.append(tid)
                out.append((lo + row // n, count, self.tok.decode(body, skip_special_tokens=False)))
        return out


def make_sampler(peer: str, model: Any, tok: Any, path: str, batch_size: int, seed: int) -> Any:
    import engines.hf as current

    if peer in ("probe", "probe-stop"):
        return EngineSampler(current, model, tok, path, batch_size, peer == "probe-stop")
    if peer == "today":
        return EngineSampler(load_engine_module(), model, tok, path, batch_size, None)
    if peer == "generate":
        engine = current.HFEngine(current.HFSettings(model=path), model=model, tokenizer=tok).load()
        return GenerateSampler(engine, batch_size, seed)
    raise ValueError(f"unknown sampling peer {peer!r}; choose from {', '.join(SAMPLE_PEERS)}")


def measure(
    peer: str, model_path: str, k: int, n: int, max_new: int, threads: int, batch_size: int, seed: int
) -> dict[str, Any]:
    """One timed run of a fresh sampler on the first ``k`` forced-binary trials."""
    import torch

    from scripts.bench.peers import TokenCounter, load_model, timed_run, warm_up_trials

    tok, model = load_model(model_path, threads)
    trials = binary_trials(lambda s: len(tok.encode(s, add_special_tokens=False)), k)
    with torch.inference_mode():
        make_sampler(peer, model, tok, model_path, batch_size, seed).run(warm_up_trials(), 2, 4)
    sampler = make_sampler(peer, model, tok, model_path, batch_size, seed)
    counter = TokenCounter(model)
    draws, numbers = timed_run(partial(sampler.run, trials, n, max_new), counter)
    # the prompt ids each peer sampled from: an engine's own render (today's engine renders with its own code),
    # probe's render for the generate() baseline, which is given exactly those
    renderer = sampler if isinstance(sampler, EngineSampler) else sampler.engine
    return {
        "peer": peer,
        "trials": len(trials),
        "n": n,
        "max_new_tokens": max_new,
        "threads": torch.get_num_threads(),
        "batch_size": batch_size,
        "note": sampler.note,
        "prompt_ids": [list(renderer.render(t)) for t in trials],
        "options": [list(t.options) for t in trials],
        "draws": [{"trial": i, "tokens": g, "text": text} for i, g, text in draws],
        "runs": [numbers],
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Time one sampling peer (a child of scripts.bench.run).")
    p.add_argument("--peer", required=True, choices=SAMPLE_PEERS)
    p.add_argument("--model", required=True)
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    result = measure(a.peer, a.model, a.trials, a.n, a.max_new_tokens, a.threads, a.batch_size, a.seed)
    Path(a.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
