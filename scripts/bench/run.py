"""``python -m scripts.bench``: the readout benchmark, peers side by side, agreement before speed.

For each workload, every peer runs in a fresh subprocess on the same model
folder and the same trials (:mod:`scripts.bench.peers`), ``--repeats`` times,
the peers taking turns so that a busy spell on a shared machine does not fall
on one peer only; the fastest run counts. Then, in this order:

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
   probe's normalized probability within 1e-4.
3. **Speed**: trials/s and the ratio to probe, tokens fed to the model
   (padding included) against the tokens in the prompts, peak resident
   memory, and the fraction of the compute limit: the FLOPs of the workload's
   unique tokens (:mod:`scripts.bench.flops`) over the matmul rate measured in
   the same process just before the timed run, divided by the time taken.

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

from scripts.bench.workloads import NAMES, WorkloadSpec

ROOT = Path(__file__).resolve().parents[2]
LOGPROB_TOL = 1e-4
PEERS_FOR = {
    "forced_binary": ("probe", "probe-plain", "lm-eval", "transformers-decision"),
    "graded": ("probe", "probe-plain", "lm-eval"),
    "salted": ("probe", "probe-plain", "lm-eval", "transformers-decision"),
}
NOT_AVAILABLE = {
    "graded": "transformers-decision: n/a (it reads single-token labels, and at most 26 of them; 0-100 needs 101 "
    "options of up to 3 tokens)",
}
# dilemmas per workload: (default, --quick)
ITEMS = {"forced_binary": (22, 4), "graded": (3, 1), "salted": (4, 2)}


def run_peer(peer: str, spec: WorkloadSpec, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """One peer on one workload in a fresh Python process; its JSON result."""
    batch = args.lmeval_batch_size if peer == "lm-eval" else args.batch_size
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
        cmd = [
            sys.executable,
            "-m",
            "scripts.bench.peers",
            "--peer",
            peer,
            "--workload",
            json.dumps(asdict(spec)),
            "--model",
            model,
            "--threads",
            str(args.threads),
            "--batch-size",
            str(batch),
            "--repeats",
            "1",
            "--out",
            str(out),
        ]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"peer {peer} on {spec.name} failed:\n{done.stderr[-3000:]}")
        return dict(json.loads(out.read_text()))


def measure_interleaved(
    peers: Sequence[str], spec: WorkloadSpec, model: str, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """Each peer ``args.repeats`` times, one timed run per process, peers taking turns (the order reversed
    every other round), so that a busy spell on a shared machine does not fall on one peer's runs only."""
    results: dict[str, dict[str, Any]] = {}
    for r in range(args.repeats):
        for peer in peers if r % 2 == 0 else list(reversed(peers)):
            got = run_peer(peer, spec, model, args)
            if peer in results:
                results[peer]["runs"] += got["runs"]
            else:
                results[peer] = got
    return {peer: results[peer] for peer in peers}


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
        "tokens_fed": best["tokens_fed"],
        "forwards": best["forwards"],
        "prompt_tokens": prompt_tokens,
        "peak_rss_mib": max(r["peak_rss_mib"] for r in result["runs"]),
        "peak_growth_mib": max(max(0.0, r["peak_rss_mib"] - r["rss_before_mib"]) for r in result["runs"]),
        "matmul_gflops": best["matmul_gflops"],
        "achieved_gflops": need.flops / best["seconds"] / 1e9,
        "compute_limit_seconds": limit_seconds,
        "fraction_of_compute_limit": limit_seconds / best["seconds"],
        "batch_size": result["batch_size"],
        "threads": result["threads"],
    }


def print_workload(name: str, spec: WorkloadSpec, need: Any, rows: list[dict[str, Any]], agree: dict[str, Any]) -> None:
    probe = next(r for r in rows if r["peer"] == "probe")
    print(f"\n== {name}: {probe['trials']} trials ({len(spec.items)} dilemmas, salts {spec.salts}) ==")
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
    if name in NOT_AVAILABLE:
        print(f"  {NOT_AVAILABLE[name]}")
    print(
        f"{'peer':<22}{'trials/s':>9}{'probe x':>8}{'x @rate':>8}{'seconds':>9}{'tok fed':>9}{'fed/prompt':>11}"
        f"{'peak MiB':>9}{'(+run)':>7}{'GFLOP/s':>8}{'matmul':>8}{'of limit':>9}"
    )
    for r in rows:
        flag = "" if r["peer"] == "probe" or agree.get(r["peer"], {}).get("ok") else "  (disagrees: not comparable)"
        print(
            f"{r['peer']:<22}{r['trials_per_s']:>9.2f}{probe['trials_per_s'] / r['trials_per_s']:>8.2f}"
            f"{probe['fraction_of_compute_limit'] / r['fraction_of_compute_limit']:>8.2f}"
            f"{r['seconds']:>9.2f}{r['tokens_fed']:>9}{r['tokens_fed'] / r['prompt_tokens']:>11.3f}"
            f"{r['peak_rss_mib']:>9.0f}{r['peak_growth_mib']:>+7.0f}"
            f"{r['achieved_gflops']:>8.2f}{r['matmul_gflops']:>8.1f}"
            f"{r['fraction_of_compute_limit']:>9.1%}{flag}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default=",".join(NAMES), help=f"comma-separated, from {', '.join(NAMES)}")
    p.add_argument("--quick", action="store_true", help="fewer dilemmas per workload (a smoke test of the bench)")
    p.add_argument("--salts", type=int, default=4, help="K of the salted workload (default: 4)")
    p.add_argument("--threads", type=int, default=1, help="torch threads in every peer (default: 1, see docs/speed.md)")
    p.add_argument("--batch-size", type=int, default=64, help="probe's trials per forward pass (default: 64)")
    p.add_argument("--lmeval-batch-size", type=int, default=4, help="lm-eval's batch size (default: 4, its best here)")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per peer, the fastest counts (default: 2)")
    p.add_argument("--model", default=None, help="model folder (default: the bench model, built on first use)")
    p.add_argument("--out", default=None, help="JSON path (default: runs/bench/bench-<UTC time>.json)")
    a = p.parse_args(argv)
    names = [w for w in a.workloads.split(",") if w]
    for w in names:
        if w not in NAMES:
            p.error(f"unknown workload {w!r}; choose from {', '.join(NAMES)}")

    import torch
    import transformers

    from experiments.dilemmas import load_dilemmas
    from scripts.bench.flops import workload_need
    from scripts.bench.model import ensure_bench_model

    model = a.model or str(ensure_bench_model())
    tok = transformers.AutoTokenizer.from_pretrained(model)
    config = transformers.AutoConfig.from_pretrained(model)
    ids = [d.id for d in load_dilemmas(None)]
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": model,
        "parameters": {
            "threads": a.threads,
            "batch_size": a.batch_size,
            "lmeval_batch_size": a.lmeval_batch_size,
            "repeats": a.repeats,
        },
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "lm_eval": _version("lm_eval"),
        },
        "workloads": {},
    }
    print(f"model {model}; {a.threads} thread(s) per peer; best of {a.repeats} run(s) per peer")
    failed = False
    for name in names:
        n = ITEMS[name][1 if a.quick else 0]
        spec = WorkloadSpec(name=name, items=tuple(ids[:n]), salts=a.salts if name == "salted" else 1)
        trials, prompts, options = requests(tok, spec)
        seqs = [
            prompt + o[:k] for prompt, opts in zip(prompts, options, strict=True) for o in opts for k in range(len(o))
        ]
        need = workload_need(config, seqs)
        results = measure_interleaved(PEERS_FOR[name], spec, model, a)
        agree = {
            peer: agreement(trials, options, results["probe"], r) for peer, r in results.items() if peer != "probe"
        }
        rows = [summarize(r, need, sum(len(x) for x in prompts)) for r in results.values()]
        print_workload(name, spec, need, rows, agree)
        failed |= not all(x["ok"] for x in agree.values())
        report["workloads"][name] = {"spec": asdict(spec), "need": asdict(need), "agreement": agree, "peers": rows}
    print(
        "\nprobe x: probe's trials/s over the peer's; x @rate: the same, each run scaled by the matmul rate measured "
        "just before it (the machine is shared); peak MiB: peak resident memory of the peer's process during the "
        "timed run (+run: above its resident memory at the start); of limit: the least FLOPs / matmul rate, over "
        "the time taken"
    )
    out = (
        Path(a.out)
        if a.out
        else ROOT / "runs" / "bench" / f"bench-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out}")
    if failed:
        print("error: a peer disagrees with probe (see above); its speed is not comparable", file=sys.stderr)
    return 1 if failed else 0


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module.replace("_", "-"))
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
