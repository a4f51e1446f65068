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

This module is the command line and the order of the run; what it runs is
planned in :mod:`scripts.bench.plan`, the children are started by
:mod:`scripts.bench.children`, the checks and speed rows of 1 to 3 are
:mod:`scripts.bench.checks`, and the goals of 4 :mod:`scripts.bench.goals`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scripts.bench.checks import (
    agreement,
    print_sampling,
    print_workload,
    readout_units,
    requests,
    sample_units,
    summarize,
    summarize_sampling,
)
from scripts.bench.children import run_peer, run_sampler, run_vllm, vllm_notes, vllm_plan, vllm_status
from scripts.bench.goals import print_goals
from scripts.bench.plan import (
    ALL_WORKLOADS,
    BATCH_SIZES,
    ITEMS,
    NOT_AVAILABLE,
    PEERS_FOR,
    QUICK_BATCH_SIZES,
    QUICK_WORKLOADS,
    ROOT,
    SAMPLE_PEERS,
    SMOL_READOUT,
    SMOL_SAMPLE,
    VLLM_PYTHON,
)
from scripts.bench.sweep import measure_swept, parse_sizes, sizes_for
from scripts.bench.workloads import NAMES, WorkloadSpec


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
                "engines/hf/sampling.py",
                "engines/vllm/engine.py",
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
