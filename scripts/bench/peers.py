"""The peers, and the child process that times one peer on one workload.

Every peer answers the same (prompt, option) requests on the same model
folder: the prompt is the trial rendered by the model's chat template (the
empty think block of Qwen3 included), the option the printed answer string.

* ``probe``: :class:`engines.hf.HFEngine.readout` (log P(option is the whole
  answer) per option); ``probe-plain`` is the same engine on its plain path
  (every prompt whole, then the trie), the reference the speed work is
  measured against; ``probe-layers`` is the same engine reading every layer
  too (``--layers all``, the logit lens: what layer-wise readouts cost).
* ``lm-eval``: lm-evaluation-harness's Hugging Face backend,
  ``HFLM.loglikelihood`` on ``(context, continuation)`` string requests. One
  override: ``loglikelihood`` moves the context's trailing whitespace into
  the continuation, and a chat prompt ends in ``\\n\\n``, so it would score
  P("\\n\\nYes") instead of P("Yes" | prompt). :class:`VerbatimHFLM` keeps the
  split where the caller put it (everything else, tokenization per request
  included, is lm-eval's own code); the bench checks that the token ids are
  then exactly probe's.
* ``transformers-decision``: Transformers' ``pipeline("decision")`` with a
  decision template that passes the rendered prompt through verbatim and the
  two labels of a yes/no question; it reads the label logits after the prompt
  (single-token labels only) and normalizes over them.

Run one measurement with ``python -m scripts.bench.peers --peer P --workload
JSON --model DIR --out FILE``: it loads the model, warms the peer up on a
prompt outside the workload, measures the matmul rate, resets the peak
resident memory (``/proc/self/clear_refs``) and runs the workload under a
timer, ``--repeats`` times with a fresh peer each time (so no cache of a
previous run helps), then writes the values, and per run the time, the
tokens fed to the model and the peak memory, as JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PEERS = ("probe", "probe-plain", "probe-layers", "lm-eval", "transformers-decision")
T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """One peer's answer for one trial: a value per option, and the token ids it scored per option."""

    values: dict[str, float]
    ids: dict[str, str]
    """Option -> hash of (prompt ids, option ids) as the peer ran them."""


def ids_key(prompt: Sequence[int], option: Sequence[int]) -> str:
    return hashlib.sha1(json.dumps([list(prompt), list(option)]).encode()).hexdigest()[:16]


def render_text(tok: Any, trial: Any) -> str:
    """The prompt text exactly as :meth:`engines.hf.HFEngine.render` builds it (no think mode)."""
    msgs = [{"role": m.role, "content": m.content} for m in trial.messages]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    return str(text) + trial.assistant_prefix


def option_text(trial: Any, option: str) -> str:
    pre = trial.assistant_prefix
    return (" " if pre and not pre[-1].isspace() else "") + option


class ProbePeer:
    def __init__(
        self, model: Any, tok: Any, path: str, batch_size: int, readout_path: str, layers: str | None = None
    ) -> None:
        from engines.hf import HFEngine, HFSettings

        settings = HFSettings(model=path, batch_size=batch_size, readout_path=readout_path, layers=layers)
        self.engine = HFEngine(settings, model=model, tokenizer=tok).load()

    def run(self, trials: Sequence[Any]) -> list[Answer]:
        out = []
        for r in self.engine.readout(trials):
            out.append(
                Answer(
                    {s.option: s.logprob for s in r.scores},
                    {s.option: ids_key(r.prompt_ids, s.token_ids) for s in r.scores},
                )
            )
        return out


def verbatim_encode_pair(lm: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's ``_encode_pair`` with the context/continuation split kept where the caller put it (lm-eval's own
    moves the context's trailing whitespace into the continuation); each pair is kept in ``lm.seen``."""
    whole = lm.tok_encode(context + continuation)
    ctx = lm.tok_encode(context)
    lm.seen.append((ctx, whole[len(ctx) :]))
    return ctx, whole[len(ctx) :]


class LMEvalPeer:
    def __init__(self, model: Any, tok: Any, batch_size: int) -> None:
        from lm_eval.models.huggingface import HFLM

        class VerbatimHFLM(HFLM):  # type: ignore[misc]
            """lm-eval's HFLM with the context/continuation split kept where the caller put it."""

            _encode_pair = verbatim_encode_pair

        self.lm = VerbatimHFLM(pretrained=model, tokenizer=tok, batch_size=batch_size, device="cpu")
        self.lm.seen = []
        self.tok = tok

    def run(self, trials: Sequence[Any]) -> list[Answer]:
        from lm_eval.api.instance import Instance

        reqs: list[Instance] = []
        for t in trials:
            ctx = render_text(self.tok, t)
            reqs += [Instance("loglikelihood", {}, (ctx, option_text(t, o)), len(reqs)) for o in t.options]
        self.lm.seen.clear()
        res = self.lm.loglikelihood(reqs, disable_tqdm=True)
        out, i = [], 0
        for t in trials:
            n = len(t.options)
            vals = {o: float(lp) for o, (lp, _) in zip(t.options, res[i : i + n], strict=True)}
            keys = {o: ids_key(*self.lm.seen[i + j]) for j, o in enumerate(t.options)}
            out.append(Answer(vals, keys))
            i += n
        return out


class DecisionPeer:
    """Transformers' decision pipeline: label logits after the prompt, normalized over a yes/no question's labels."""

    def __init__(self, model: Any, tok: Any) -> None:
        from transformers import pipeline
        from transformers.decision import DecisionConfig

        self.tok = tok
        self.model = model
        self.pipes: dict[tuple[str, str], Any] = {}
        self._make = lambda labels: pipeline(
            "decision",
            model=model,
            tokenizer=tok,
            decision_config=DecisionConfig(
                labels={"noul": list(labels)}, chat_template="{{ state }}", sanitize_control_tokens=False
            ),
        )

    def run(self, trials: Sequence[Any]) -> list[Answer]:
        out = []
        for t in trials:
            yes, no = sorted(t.options, key=lambda o: o != "Yes")  # the noul question's true label first
            if (yes, no) not in self.pipes:
                self.pipes[(yes, no)] = self._make((yes, no))
            text = render_text(self.tok, t)
            p_yes = self.pipes[(yes, no)]({"state": text, "questions": {"q": {"type": "noul"}}})["q"]["noul"]
            prompt = self.tok(text, add_special_tokens=False)["input_ids"]
            out.append(
                Answer(
                    {yes: float(p_yes), no: 1.0 - float(p_yes)},
                    {
                        o: ids_key(prompt, self.tok.encode(option_text(t, o), add_special_tokens=False))
                        for o in t.options
                    },
                )
            )
        return out


def make_peer(name: str, model: Any, tok: Any, path: str, batch_size: int) -> Any:
    if name == "probe":
        return ProbePeer(model, tok, path, batch_size, "auto")
    if name == "probe-plain":
        return ProbePeer(model, tok, path, batch_size, "plain")
    if name == "probe-layers":
        return ProbePeer(model, tok, path, batch_size, "auto", layers="all")
    if name == "lm-eval":
        return LMEvalPeer(model, tok, batch_size)
    if name == "transformers-decision":
        return DecisionPeer(model, tok)
    raise ValueError(f"unknown peer {name!r}; choose from {', '.join(PEERS)}")


# ---------------------------------------------------------------- measuring


def matmul_rate(seconds: float = 1.0, n: int = 2048) -> float:
    """Sustained float32 matmul rate of this process (GFLOP/s): a large square torch.matmul, timed."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        torch.matmul(a, b)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.matmul(a, b)
        count += 1
    return 2 * n**3 * count / (time.perf_counter() - start) / 1e9


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux >= 4.0); False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def rss_mib() -> tuple[float, float]:
    """(current, peak) resident memory in MiB: VmRSS and VmHWM, else ru_maxrss for both."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
    except (OSError, KeyError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return peak, peak


def warm_up_trials() -> list[Any]:
    """One yes/no trial outside every workload, to warm a peer up before it is timed."""
    from probe.types import Message, Trial

    question = "A warm-up question, outside the workload. Answer with Yes or No."
    return [Trial("warm-up", "bench", "warm-up", {}, (Message("user", question),), ("Yes", "No"), ("Yes", "No"))]


def load_model(model_path: str, threads: int) -> tuple[Any, Any]:
    """The tokenizer and the float32 Transformers model of a folder, on ``threads`` CPU threads, logs quiet."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    transformers.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    tok = transformers.AutoTokenizer.from_pretrained(model_path)
    return tok, transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()


def run_record(
    seconds: float, rate: float, tokens: int, forwards: int, base: float, peak: float, exact: bool
) -> dict[str, Any]:
    """The numbers of one timed run, as every bench child writes them."""
    return {
        "seconds": seconds,
        "matmul_gflops": rate,
        "tokens_fed": tokens,
        "forwards": forwards,
        "rss_before_mib": base,
        "peak_rss_mib": peak,
        "peak_is_of_the_run": exact,
    }


class TokenCounter:
    """Counts the tokens (padding included) and forward passes a model is asked to compute."""

    def __init__(self, model: Any) -> None:
        self.tokens = 0
        self.forwards = 0
        model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.tokens += int(ids.numel())
            self.forwards += 1


def timed_run(fn: Callable[[], T], counter: TokenCounter) -> tuple[T, dict[str, Any]]:
    """``fn()`` under the timer, after measuring the matmul rate and resetting the peak memory and ``counter``;
    its result and the run's numbers (:func:`run_record`)."""
    import torch

    rate = matmul_rate()
    counter.tokens = counter.forwards = 0
    base, _ = rss_mib()
    exact_peak = reset_peak_rss()
    start = time.perf_counter()
    with torch.inference_mode():
        result = fn()
    seconds = time.perf_counter() - start
    _, peak = rss_mib()
    return result, run_record(seconds, rate, counter.tokens, counter.forwards, base, peak, exact_peak)


def measure(
    peer_name: str, spec: dict[str, Any], model_path: str, threads: int, batch_size: int, repeats: int
) -> dict[str, Any]:
    """Time ``repeats`` runs of a fresh peer on the workload (caches cold each time); keep every run's numbers."""
    import torch

    from scripts.bench.workloads import WorkloadSpec, expand_workload

    tok, model = load_model(model_path, threads)
    workload = WorkloadSpec(name=spec["name"], items=tuple(spec["items"]), salts=spec["salts"])
    trials = expand_workload(workload, count_tokens=lambda s: len(tok.encode(s, add_special_tokens=False)))
    with torch.inference_mode():
        make_peer(peer_name, model, tok, model_path, batch_size).run(warm_up_trials())
    counter = TokenCounter(model)
    runs = []
    answers: list[Answer] = []
    for _ in range(repeats):
        peer = make_peer(peer_name, model, tok, model_path, batch_size)
        answers, numbers = timed_run(partial(peer.run, trials), counter)
        runs.append(numbers)
    return {
        "peer": peer_name,
        "workload": spec,
        "trials": len(trials),
        "threads": torch.get_num_threads(),
        "batch_size": batch_size,
        "runs": runs,
        "values": [a.values for a in answers],
        "ids": [a.ids for a in answers],
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Time one peer on one workload (a child of scripts.bench.run).")
    p.add_argument("--peer", required=True, choices=PEERS)
    p.add_argument("--workload", required=True, help="WorkloadSpec as JSON")
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    result = measure(a.peer, json.loads(a.workload), a.model, a.threads, a.batch_size, a.repeats)
    Path(a.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
