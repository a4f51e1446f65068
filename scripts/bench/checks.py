"""What the benchmark checks and prints per workload: the same requests, the agreement, and the speed rows.

:func:`requests` gives probe's token ids for every (trial, option), :func:`agreement` compares every peer's
log probabilities with lm-evaluation-harness's (within :data:`LOGPROB_TOL`, with the prefix identity);
:func:`summarize` and :func:`summarize_sampling` make a peer's speed row (trials/s, tokens fed, peak
memory, the fraction of the compute limit: :func:`readout_units`, :func:`sample_units`), and
:func:`print_workload` and :func:`print_sampling` print them.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import Any

from scripts.bench.plan import LABELS
from scripts.bench.sweep import sweep_line
from scripts.bench.workloads import WorkloadSpec

LOGPROB_TOL = 1e-4


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
