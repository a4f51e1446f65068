"""Model panels: several runs of one experiment, lined up for comparison.

Every design in the papers compares a panel (several models, each with
reasoning off and on, sometimes a human sample). A :class:`Panel` is the list
of runs with the names the report shows, which runs belong to the same model
(so reasoning-on can be paired with reasoning-off), and the optional user
tables (human anchors, model attributes).

A panel comes from run folders on the command line (names, models and the
reasoning flag read from each manifest) or from a panel file::

    # panel.yaml (paths relative to this file)
    runs:
      - run: runs/q8-off
        name: Qwen3-8B           # optional; default: the model from the manifest
        model: Qwen3-8B          # optional; groups reasoning off/on of one model
        reasoning: false         # optional; default: the run's think setting
        consensus: false         # optional; battery: in the consensus reference set (default: sampled runs)
      - run: runs/q8-on
        name: Qwen3-8B think
        model: Qwen3-8B
        reasoning: true
    humans: data/humans.csv      # optional: per-item human choice rates / ratings
    attributes: data/attrs.csv   # optional: one row per model (e.g. capability)

Runs of one panel must be of the same experiment family (the experiments that
share a comparison, e.g. the three influence benchmarks); the comparison
itself matches items across runs (:func:`shared_items`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from probe.errors import ProbeError
from probe.files import read_yaml
from probe.record import Manifest, display_name
from probe.runs import Run, open_run
from probe.store import RunStore


class PanelError(ProbeError, ValueError):
    """A bad panel: the message names the run or the field and how to fix it."""


@dataclass(frozen=True)
class PanelRun:
    """One run of a panel, with how the report names and groups it."""

    path: Path
    name: str
    """Display name, unique within the panel."""
    model: str
    """The model the run measured; runs of one model (reasoning off / on) share it."""
    reasoning: bool
    """Whether the model reasoned before answering (think mode)."""
    experiment: str
    consensus: bool | None = None
    """Whether the run belongs to the consensus reference set (None: the comparison's default rule)."""
    frame: str = "chat"
    """The prompt frame its trials were rendered in (``chat``, or ``plain`` for a model read without its chat
    template)."""

    def run(self) -> Run:
        """The run, opened (:func:`probe.runs.open_run`); a PanelError naming it if it disappeared since."""
        try:
            return open_run(self.path)
        except ProbeError as e:  # the folder was checked when the panel was built
            raise PanelError(f"run {self.name!r} ({self.path}): {e}") from e


@dataclass(frozen=True)
class Panel:
    """Runs to compare, plus the optional user tables."""

    runs: tuple[PanelRun, ...]
    humans: Path | None = None
    attributes: Path | None = None
    source: str = "command line"
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def experiments(self) -> tuple[str, ...]:
        return tuple(sorted({r.experiment for r in self.runs}))

    def names(self) -> list[str]:
        return [r.name for r in self.runs]

    def by_name(self, name: str) -> PanelRun:
        for r in self.runs:
            if r.name == name:
                return r
        raise KeyError(f"no run named {name!r} in the panel; names: {self.names()}")

    def reasoning_pairs(self) -> list[tuple[PanelRun, PanelRun]]:
        """(reasoning off, reasoning on) run pairs of the same model, in panel order.

        A model with several runs on one side pairs its first off run with its first on run.
        """
        pairs = []
        for model in dict.fromkeys(r.model for r in self.runs):
            off = [r for r in self.runs if r.model == model and not r.reasoning]
            on = [r for r in self.runs if r.model == model and r.reasoning]
            if off and on:
                pairs.append((off[0], on[0]))
        return pairs

    @property
    def framed(self) -> bool:
        """Whether any run was read in the plain frame (then the panel's tables say each run's frame)."""
        return any(r.frame != "chat" for r in self.runs)

    def table(self) -> pd.DataFrame:
        """One row per run: name, model, reasoning, (where a run is in the plain frame) frame, experiment, path."""
        return pd.DataFrame(
            [
                {
                    "name": r.name,
                    "model": r.model,
                    "reasoning": r.reasoning,
                    **({"frame": r.frame} if self.framed else {}),
                    "experiment": r.experiment,
                    "run": str(r.path),
                }
                for r in self.runs
            ]
        )


def _manifest(path: Path) -> Manifest:
    if not (path / "manifest.json").exists():
        raise PanelError(f"{path} is not a run folder (no manifest.json); give the --out folder of `probe run`")
    store = RunStore(path)
    man = store.manifest()
    if not store.done_chunks() and man.n_trials:
        raise PanelError(f"run {path} has no finished chunk yet; finish it (re-run its `probe run` command) first")
    return man


def _entry(
    path: Path, name: str | None, model: str | None, reasoning: bool | None, consensus: bool | None = None
) -> PanelRun:
    man = _manifest(path)
    mod = model or man.model
    think = man.think if reasoning is None else bool(reasoning)
    frame = man.engine.frame
    shown = name or display_name(mod, think) + (f" {frame}" if frame != "chat" else "")
    return PanelRun(
        path=path,
        name=shown,
        model=mod,
        reasoning=think,
        experiment=man.experiment,
        consensus=consensus,
        frame=frame,
    )


def _unique_names(runs: Sequence[PanelRun], explicit: Sequence[bool]) -> tuple[PanelRun, ...]:
    """Keep explicit names; disambiguate default ones that collide by their run folder's name."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.name] = counts.get(r.name, 0) + 1
    out = []
    for r, given in zip(runs, explicit, strict=True):
        if counts[r.name] > 1 and not given:
            r = replace(r, name=f"{r.name} [{r.path.name}]")
        out.append(r)
    seen: set[str] = set()
    for r in out:
        if r.name in seen:
            raise PanelError(f"two runs of the panel are both named {r.name!r}; give each run a distinct name")
        seen.add(r.name)
    return tuple(out)


def panel_from_runs(
    paths: Sequence[str | Path],
    *,
    names: Sequence[str] | None = None,
    humans: str | Path | None = None,
    attributes: str | Path | None = None,
) -> Panel:
    """A panel from run folders; names, models and reasoning flags come from the manifests."""
    if names is not None and len(names) != len(paths):
        raise PanelError(f"--names gives {len(names)} names for {len(paths)} runs; give one per run, in order")
    runs = [_entry(Path(p), names[i] if names else None, None, None) for i, p in enumerate(paths)]
    return _checked(
        Panel(
            _unique_names(runs, [names is not None] * len(runs)),
            Path(humans) if humans else None,
            Path(attributes) if attributes else None,
        )
    )


def load_panel(path: str | Path) -> Panel:
    """Read a panel file (YAML, see the module docstring); relative paths are relative to the file."""
    p = Path(path)
    doc = read_yaml(p, "panel file", PanelError, "see `probe compare --help` for its format")
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list) or not doc["runs"]:
        raise PanelError(f"{p}: a panel file needs a non-empty `runs:` list (see `probe compare --help`)")
    known = {"run", "name", "model", "reasoning", "consensus"}
    runs, explicit = [], []
    for i, rec in enumerate(doc["runs"]):
        if isinstance(rec, str):
            rec = {"run": rec}
        if not isinstance(rec, dict) or "run" not in rec:
            raise PanelError(f"{p}: runs[{i}] needs a `run:` folder, got {rec!r}")
        bad = set(rec) - known
        if bad:
            raise PanelError(f"{p}: runs[{i}] has unknown field(s) {sorted(bad)}; allowed: {sorted(known)}")
        for flag in ("reasoning", "consensus"):
            if flag in rec and not isinstance(rec[flag], bool):
                raise PanelError(f"{p}: runs[{i}].{flag} must be true or false, got {rec[flag]!r}")
        run_path = (p.parent / str(rec["run"])).resolve()
        runs.append(_entry(run_path, rec.get("name"), rec.get("model"), rec.get("reasoning"), rec.get("consensus")))
        explicit.append("name" in rec)
    extra = {k: v for k, v in doc.items() if k not in ("runs", "humans", "attributes")}
    if extra:
        raise PanelError(f"{p}: unknown top-level field(s) {sorted(extra)}; allowed: runs, humans, attributes")

    def rel(key: str) -> Path | None:
        v = doc.get(key)
        return (p.parent / str(v)).resolve() if v else None

    return _checked(Panel(_unique_names(runs, explicit), rel("humans"), rel("attributes"), source=str(p)))


def _checked(panel: Panel) -> Panel:
    if len(panel.runs) < 1:
        raise PanelError("a panel needs at least one run")
    for key in ("humans", "attributes"):
        f = getattr(panel, key)
        if f is not None and not Path(f).exists():
            raise PanelError(f"the {key} table {f} does not exist")
    return panel


def shared_items(panel: Panel, items: Mapping[str, Sequence[str]]) -> tuple[list[str], pd.DataFrame]:
    """Items present in every run, in first-run order, and a table of what was dropped and why.

    ``items`` maps run name -> that run's item ids. The dropped table has one row
    per (run, item) left out: ``run``, ``item_id``, ``reason``.
    """
    names = panel.names()
    missing = [n for n in names if n not in items]
    if missing:
        raise PanelError(f"no item list for run(s) {missing}")
    sets = {n: set(items[n]) for n in names}
    shared = [i for i in dict.fromkeys(items[names[0]]) if all(i in sets[n] for n in names)]
    keep = set(shared)
    rows = []
    for n in names:
        for i in dict.fromkeys(items[n]):
            if i not in keep:
                absent = [m for m in names if i not in sets[m]]
                rows.append({"run": n, "item_id": i, "reason": "not in run(s): " + ", ".join(absent)})
    return shared, pd.DataFrame(rows, columns=["run", "item_id", "reason"])
