"""Is a stored run the one a command line asks for? Answered without loading the model.

A run's key hashes its identity (:func:`probe.app.runner.run`): the experiment,
its spec, the plan, the judge and the engine's identity. Most of that comes
from the command line; only the model's fingerprint and loaded dtype need
the model. A Slurm array task checks a shard folder before it starts
``probe run`` (``scripts/slurm/shard_status.py``), because a complete shard
is skipped without loading the model: comparing every part of the identity
that the command line determines with the folder's manifest is what stops a
resubmission with a changed option from being answered with the old
results. The model-dependent parts are checked by ``probe run`` itself
whenever it runs (a shard that is not complete).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from engines import make_engine
from experiments import get_experiment
from probe.app.cli import build_parser, plan_from_args

_FROM_THE_MODEL = ("dtype", "model_fingerprint")
"""Identity fields that only a loaded model knows; everything else is compared."""


def parse_run_args(experiment: str, model: str, out: Path, run_args: Sequence[str]) -> argparse.Namespace:
    """The namespace ``probe run EXPERIMENT --model MODEL --out OUT RUN_ARGS...`` parses to."""
    return build_parser().parse_args(["run", experiment, "--model", model, "--out", str(out), *run_args])


def requested_identity(a: argparse.Namespace) -> dict[str, Any]:
    """Every part of a run's identity that the parsed ``probe run`` arguments determine, JSON-normalized.

    Keys are those of the stored ``identity`` (engine settings at top level,
    the judge as a sub-mapping); building the engine reads no model file.
    """
    exp = get_experiment(a.experiment)
    engine = make_engine(a)
    settings = getattr(engine, "settings", None)
    # a settings dataclass (hf, vllm, api); an engine without one (sim) knows its identity unloaded
    fields = asdict(settings) if is_dataclass(settings) and not isinstance(settings, type) else engine.identity()
    out: dict[str, Any] = {
        "experiment": a.experiment,
        "spec": exp.spec_from_args(a).to_dict(),
        "plan": asdict(plan_from_args(a)),
        "engine": engine.name,
        "settings": fields,
    }
    if exp.judge_options is not None and hasattr(a, "judge"):
        out["judge"] = {"judge": "rule"} if a.judge == "rule" else {"judge": "logit", "model": a.judge}
    return _normalized(out)


def identity_differences(stored: Mapping[str, Any], requested: Mapping[str, Any]) -> list[str]:
    """Each part of the stored identity that differs from the request, as ``name: stored ..., requested ...``.

    An engine setting is compared when the stored identity records it (so
    speed settings such as the batch size may change between submissions);
    a stored field the request cannot know (``dtype``, ``model_fingerprint``)
    is left to ``probe run``.
    """
    stored = _normalized(dict(stored))
    settings = requested.get("settings", {})
    diffs = []
    for key in ("experiment", "spec", "plan", "engine"):
        if key in stored and stored[key] != requested.get(key):
            diffs.extend(_describe(key, stored[key], requested.get(key)))
    for key, value in stored.items():
        if key in ("experiment", "spec", "plan", "engine", "judge", *_FROM_THE_MODEL) or key not in settings:
            continue
        if value != settings[key]:
            diffs.extend(_describe(key, value, settings[key]))
    judge_stored, judge_asked = stored.get("judge"), requested.get("judge")
    if isinstance(judge_stored, dict) and isinstance(judge_asked, dict):
        for key, value in judge_asked.items():
            if judge_stored.get(key) != value:
                diffs.append(f"judge.{key}: stored {judge_stored.get(key)!r}, requested {value!r}")
    elif (judge_stored is None) != (judge_asked is None):
        diffs.append(f"judge: stored {judge_stored!r}, requested {judge_asked!r}")
    return diffs


def _describe(name: str, stored: Any, requested: Any) -> list[str]:
    """Name the differing leaves of two JSON values (``spec.forms: stored [...], requested [...]``)."""
    if isinstance(stored, dict) and isinstance(requested, dict):
        out = []
        for k in sorted(set(stored) | set(requested)):
            if stored.get(k) != requested.get(k):
                out.extend(_describe(f"{name}.{k}", stored.get(k), requested.get(k)))
        return out
    return [f"{name}: stored {stored!r}, requested {requested!r}"]


def _normalized(obj: Any) -> Any:
    """``obj`` as the manifest stores it (tuples as lists, other values as JSON writes them)."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))
