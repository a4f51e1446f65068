"""One trial, as ``probe view`` (JSON and HTML) and ``probe show`` (terminal) present it.

:func:`trial_view` turns :meth:`probe.runs.Run.trial_data` into one JSON-ready
dict (the viewer's ``/api/.../trial/ID`` answer and what its page renders);
:func:`format_trial` prints the same dict as text. One source, so the page
and the terminal never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from probe.app.prompts import RenderedPrompt, Renderer
from probe.runs import Run, TrialData


def _num(x: Any) -> float | None:
    """A float for JSON (None for missing / NaN)."""
    if x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _text(x: Any) -> str | None:
    if x is None:
        return None
    try:
        if x != x:  # NaN / NA
            return None
    except (TypeError, ValueError):
        return None
    return str(x)


def trial_view(run: Run, trial_id: str, renderer: Renderer) -> dict[str, Any]:
    """Everything about ``trial_id`` in ``run`` (KeyError for an unknown trial)."""
    data = run.trial_data(trial_id)
    return view_of(run, data, renderer)


def view_of(run: Run, data: TrialData, renderer: Renderer) -> dict[str, Any]:
    t = data.trial
    readout = data.readout
    prompt_tokens = int(readout["prompt_tokens"]) if readout is not None else None
    rendered = renderer.render(t, prompt_tokens)
    return {
        "run": run.name,
        "trial_id": t.trial_id,
        "position": data.position,
        "experiment": t.experiment,
        "item_id": t.item_id,
        "factors": dict(t.factors),
        "salt": t.salt,
        "replicate": t.replicate,
        "assistant_prefix": t.assistant_prefix,
        "messages": [{"role": m.role, "content": m.content} for m in t.messages],
        "chunk": {"chunk": data.chunk.chunk, "status": data.chunk.status, "reason": data.chunk.reason},
        "prompt": {
            "text": rendered.text,
            "source": rendered.source,
            "exact": rendered.exact,
            "n_tokens": rendered.n_tokens,
            "note": rendered.note,
        },
        "readout": _readout_view(readout, prompt_tokens),
        "options": _option_views(data, rendered),
        "samples": _sample_views(data),
        "codes": _code_views(data),
    }


def _readout_view(readout: Any, prompt_tokens: int | None) -> dict[str, Any] | None:
    """The trial's stored readout: coverage, greedy option, tokens, reasoning (None where it has none)."""
    if readout is None:
        return None
    return {
        "coverage": _num(readout.get("coverage")),
        "greedy_option": _text(readout.get("greedy_option")),
        "greedy_meaning": _text(readout.get("greedy_meaning")),
        "prompt_tokens": prompt_tokens,
        "computed_tokens": int(readout.get("computed_tokens") or 0),
        "top_other": [[str(tok), _num(p)] for tok, p in (readout.get("top_other") or [])],
        "reasoning": _text(readout.get("reasoning")) or "",
        "reasoning_tokens": int(readout.get("reasoning_tokens") or 0),
        "hit_budget": bool(readout.get("hit_budget", False)),
    }


def _option_views(data: TrialData, rendered: RenderedPrompt) -> list[dict[str, Any]]:
    """Each option with its meaning, stored probabilities and the token ids it renders to."""
    t = data.trial
    options: list[dict[str, Any]] = []
    stored = {r["option"]: r for r in data.options.to_dict("records")} if len(data.options) else {}
    for i, (opt, meaning) in enumerate(zip(t.options, t.meaning, strict=True)):
        row = stored.get(opt, {})
        options.append(
            {
                "option": opt,
                "meaning": meaning,
                "prob": _num(row.get("prob")),
                "logprob": _num(row.get("logprob")),
                "n_tokens": int(row["n_tokens"]) if "n_tokens" in row else None,
                "token_ids": list(rendered.option_ids[i]) if rendered.option_ids is not None else None,
                "greedy": bool(row.get("greedy", False)),
            }
        )
    return options


def _sample_views(data: TrialData) -> list[dict[str, Any]]:
    """The trial's sampled replies; each says whether its text keeps its reasoning."""
    samples = [
        {
            "source": str(r["source"]),
            "draw": int(r["draw"]),
            "option": _text(r.get("option")),
            "status": str(r["status"]),
            "truncated": bool(r.get("truncated", False)),
            "text": _text(r.get("text")) or "",
            "reasoning": _text(r.get("reasoning")) or "",
            "completion_tokens": int(r.get("completion_tokens") or 0),
        }
        for r in (data.samples.to_dict("records") if len(data.samples) else [])
    ]
    for smp in samples:  # a reply whose text keeps its think block needs no second copy of the reasoning
        reasoning, text = str(smp["reasoning"]), str(smp["text"])
        smp["reasoning_in_text"] = bool(reasoning) and reasoning.strip() in text
    return samples


def _code_views(data: TrialData) -> list[dict[str, Any]]:
    """The judge's codes of the trial's replies."""
    return [
        {
            "task": str(r["task"]),
            "draw": int(r["draw"]),
            "label": _text(r.get("label")),
            "p_label": _num(r.get("p_label")),
            "probs": {str(k): _num(v) for k, v in dict(r.get("probs") or {}).items()},
            "judge": _text(r.get("judge")),
            "status": _text(r.get("status")),
        }
        for r in (data.codes.to_dict("records") if len(data.codes) else [])
    ]


def side_by_side(runs: Sequence[Run], view: Mapping[str, Any], here: int) -> list[dict[str, Any]]:
    """The same trial (matched on item, factors and replicate) in every other run: its id, greedy option,
    coverage and option probabilities, or why it is not there."""
    trial = runs[here].trial(str(view["trial_id"]))
    out = []
    for i, other in enumerate(runs):
        if i == here:
            continue
        tid = other.find_match(trial)
        entry: dict[str, Any] = {"run_index": i, "run": other.name, "model": other.model, "trial_id": tid}
        if tid is None:
            entry["missing"] = "no trial with this item, factors and replicate"
        else:
            d = other.trial_data(tid)
            entry["chunk"] = d.chunk.status
            entry["greedy_option"] = _text(d.readout.get("greedy_option")) if d.readout else None
            entry["coverage"] = _num(d.readout.get("coverage")) if d.readout else None
            entry["probs"] = (
                {str(r["option"]): _num(r["prob"]) for r in d.options.to_dict("records")} if len(d.options) else {}
            )
            entry["samples"] = {
                str(k): int(v)
                for k, v in (d.samples["status"].astype(str).value_counts().items() if len(d.samples) else [])
            }
        out.append(entry)
    return out


def _block(title: str, body: str) -> list[str]:
    return [f"--- {title} ---", body.rstrip("\n"), ""]


def _count(n: Any, word: str) -> str:
    """``1 token``, ``2 tokens``, ``- tokens`` (unknown)."""
    if n is None:
        return f"- {word}s"
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def format_trial(view: Mapping[str, Any]) -> str:
    """The terminal form of :func:`trial_view` (``probe show``)."""
    lines = [
        f"trial {view['trial_id']} ({view['experiment']}, item {view['item_id']}, position {view['position']}, "
        f"replicate {view['replicate']})",
        "factors: " + (", ".join(f"{k}={v}" for k, v in view["factors"].items()) or "(none)"),
    ]
    if view["salt"]:
        lines.append(f"salt: {view['salt']!r}")
    if view["assistant_prefix"]:
        lines.append(f"assistant prefix: {view['assistant_prefix']!r}")
    chunk = view["chunk"]
    if chunk["status"] != "verified":
        lines.append(
            f"chunk {chunk['chunk']}: {chunk['status']}"
            + (f", {chunk['reason']}" if chunk["reason"] else "")
            + "; this trial's results are not shown"
        )
    lines.append("")
    p = view["prompt"]
    lines += [f"--- prompt ({p['source']}) ---", p["text"] if p["text"].endswith("\n") else p["text"] + "\n"]  # exact:
    # its trailing newlines too (the blank lines after </think> are part of what the model read)
    if p["note"]:
        lines += [f"({p['note']})", ""]
    r = view["readout"]
    if r is not None:
        if r["reasoning"]:
            budget = ", budget hit" if r["hit_budget"] else ""
            lines += _block(f"reasoning ({_count(r['reasoning_tokens'], 'token')}{budget})", r["reasoning"])
        width = max(len("option"), *(len(o["option"]) for o in view["options"]))
        mwidth = max(len("meaning"), *(len(str(o["meaning"])) for o in view["options"]))
        lines.append(f"  {'option':<{width}}  {'meaning':<{mwidth}}  {'prob':>8}  {'logprob':>10}  tokens")
        for o in view["options"]:
            mark = "*" if o["greedy"] else " "
            ids = (
                o["token_ids"]
                if o["token_ids"] is not None
                else (_count(o["n_tokens"], "token") if o["n_tokens"] else "")
            )
            lines.append(
                f"{mark} {o['option']:<{width}}  {o['meaning']!s:<{mwidth}}  {_fmt(o['prob'], '8.4f')}  "
                f"{_fmt(o['logprob'], '10.4f')}  {ids}"
            )
        lines.append(
            f"coverage {_fmt(r['coverage'], '.4f')}; greedy option {r['greedy_option']!r}"
            + (f" ({r['greedy_meaning']})" if r["greedy_meaning"] else "")
            + f"; prompt {_count(r['prompt_tokens'], 'token')}"
        )
        if r["top_other"]:
            lines.append(
                "most likely non-option tokens: " + ", ".join(f"{t!r} {_fmt(q, '.4f')}" for t, q in r["top_other"])
            )
        lines.append("")
    elif chunk["status"] == "verified":
        lines += ["(no readout for this trial)", ""]
    for s in view["samples"]:
        trunc = ", truncated at the token cap" if s["truncated"] else ""
        head = f"{s['source'][:-1]} {s['draw']}: {s['status']}, option {s['option']!r}{trunc}"
        shown = s["reasoning"] and not s.get("reasoning_in_text")
        body = (f"<think>{s['reasoning']}</think>\n" if shown else "") + s["text"]
        lines += _block(head, body)
    for c in view["codes"]:
        lines.append(f"{c['task']} (draw {c['draw']}, judge {c['judge']}): {c['label']} p={_fmt(c['p_label'], '.3f')}")
    return "\n".join(lines).rstrip() + "\n"
