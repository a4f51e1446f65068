"""The benchmark's goals: the ratios issue 17 sets and issue 54's layer-readout slowdown, each met or not.

:func:`goal` and :func:`memory_goal` mark one ratio against its target, :func:`layers_goal` readouts with
``--layers all`` against those without (at most :data:`LAYERS_SLOWDOWN` times as long), and
:func:`print_goals` prints every goal of a report.
"""

from __future__ import annotations

from typing import Any

from scripts.bench.checks import LOGPROB_TOL
from scripts.bench.plan import LABELS, SMOL_READOUT


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
