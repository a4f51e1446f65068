"""Manifests of every format open, typed (issue 46): the plan as a Plan, the spec as its experiment's type, the
format version; manifests written by probe at fd38b79 (format 1, no version field) give the same run key and the
same report as the manifest the current code writes for the same command.

The fixtures in tests/data/manifests-fd38b79/ are manifest.json files as ``probe run EXPERIMENT --model sim``
wrote them at commit fd38b79 (the commands in :data:`COMMANDS`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from experiments.battery import BatterySpec
from experiments.cue import CueSpec
from experiments.followup import FollowupSpec
from experiments.influence.triage import TriageSpec
from experiments.yesno import YesNoSpec
from probe.errors import StoreError
from probe.record import MANIFEST_FORMAT, Manifest, Plan
from probe.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
OLD = ROOT / "tests" / "data" / "manifests-fd38b79"
ITEMS = "mine_cart_bridge,transplant_traveler,pond_child,hospital_budget,deathbed_promise,water_additive"
COMMANDS: dict[str, list[str]] = {
    "yesno": ["yesno", "--samples", "2"],
    "triage": ["influence-triage", "--samples", "4", "--no-readout"],
    "cue": ["cue"],
    "battery": [
        "battery",
        "--items",
        ITEMS,
        "--samples",
        "3",
        "--sample-only",
        "instrument=binary",
        "--temperature",
        "0.7",
    ],
}
"""``probe run ... --model sim`` as the fixtures were made (followup.json: ``followup --source TRIAGE --samples 2``)."""
SPECS: dict[str, type[Any]] = {
    "yesno": YesNoSpec,
    "triage": TriageSpec,
    "cue": CueSpec,
    "battery": BatterySpec,
    "followup": FollowupSpec,
}


def _old(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((OLD / f"{name}.json").read_text())
    return doc


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_format_1_manifest_opens_typed(name: str) -> None:
    doc = _old(name)
    m = Manifest.from_dict(doc)
    assert m.format == 1 and "format" not in m  # read as written: no field is added to the stored JSON
    assert isinstance(m.plan, Plan) and m.plan.to_dict() == doc["plan"] == doc["identity"]["plan"]
    spec = m.spec_as(SPECS[name])
    assert type(spec) is SPECS[name]
    assert json.loads(json.dumps(spec.to_dict())) == doc["spec"]  # every field read back as its type, none lost
    assert (m.plan.samples, m.plan.temperature) == (doc["plan"]["samples"], doc["plan"]["temperature"])


def test_the_plan_and_spec_read_as_their_types() -> None:
    battery = Manifest.from_dict(_old("battery"))
    assert battery.plan == Plan(readout=True, samples=3, temperature=0.7, sample_only=(("instrument", "binary"),))
    spec = battery.spec_as(BatterySpec)
    assert spec.items == tuple(ITEMS.split(",")) and spec.salts.count == 1 and isinstance(spec.instruments, tuple)
    assert Manifest.from_dict(_old("triage")).spec_as(TriageSpec).audit.controls == ("rerun",)
    with pytest.raises(StoreError, match="'yesno', not 'battery'"):
        Manifest.from_dict(_old("yesno")).spec_as(BatterySpec)
    damaged = {**_old("yesno"), "spec": {**_old("yesno")["spec"], "forms": "acceptable"}}
    with pytest.raises(StoreError, match=r"YesNoSpec.*forms"):
        Manifest.from_dict(damaged).spec_as(YesNoSpec)


def test_a_run_without_a_plan_has_none_and_a_damaged_plan_is_an_error() -> None:
    imported = Manifest.from_dict({"experiment": "influence-import", "spec": {"source": "/x.csv"}})
    assert imported.plan is None  # readers take Plan's defaults or say the run sampled nothing
    partial = Manifest.from_dict({"plan": {"samples": 3}})  # a plan written before its other fields
    assert partial.plan == Plan(samples=3)
    for bad in ({"samples": "3"}, {"readout": False, "samples": 0}, {"sample_only": [["a"]]}, {"samplse": 3}):
        with pytest.raises(StoreError, match="'plan'"):
            Manifest.from_dict({"plan": bad})


def test_the_format_is_recorded_and_a_newer_one_refused() -> None:
    built = Manifest.build(run_key="k", identity={}, plan=Plan(samples=2), experiment="yesno")
    assert built.format == MANIFEST_FORMAT == built["format"] == 2 and built["plan"]["samples"] == 2
    assert Manifest.from_dict(built.to_dict()).plan == Plan(samples=2)
    with pytest.raises(StoreError, match="format 3, written by a newer probe"):
        Manifest.from_dict({"format": MANIFEST_FORMAT + 1})
    with pytest.raises(StoreError, match="'format'"):
        Manifest.from_dict({"format": "2"})


def _run(out: Path, command: list[str]) -> None:
    argv = [sys.executable, "-m", "probe.app.cli", "run", command[0], "--model", "sim", "--out", str(out)]
    subprocess.run([*argv, *command[1:], "--quiet", "--no-report"], check=True, cwd=ROOT)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_same_command_records_the_same_spec_plan_and_trials(name: str, tmp_path: Path) -> None:
    """The same command now writes format 2 with the same spec, plan and trials as fd38b79 wrote (the engine's part
    of the identity is the engine's: the synthetic subject may gain planted parameters)."""
    old = _old(name)
    _run(tmp_path / "run", COMMANDS[name])
    new = RunStore(tmp_path / "run").manifest()
    assert new.format == MANIFEST_FORMAT and Manifest.from_dict(old).format == 1
    for key in ("experiment", "spec", "plan"):
        assert new.identity[key] == old["identity"][key] and new.to_dict()[key] == old[key]
    assert (new.trials_sha256, new.n_trials) == (old["trials_sha256"], old["n_trials"])


RUN = ROOT / "tests" / "data" / "run-fd38b79-yesno"
"""A whole run as fd38b79 wrote it, and its report's tables and summary: ``probe run yesno --model sim --items
mine_cart_bridge,pond_child --samples 2`` (written to /tmp/small46/yesno; the figure left out)."""


def test_a_run_written_at_fd38b79_reports_byte_for_byte_as_then(tmp_path: Path) -> None:
    run = tmp_path / "yesno"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("report"))
    store = RunStore(run)
    assert store.manifest().format == 1 and store.manifest().plan == Plan(samples=2)
    assert len(store.verified_chunks()) == 1
    subprocess.run(
        [sys.executable, "-m", "probe.app.cli", "analyze", str(run)], check=True, cwd=ROOT, capture_output=True
    )
    for want in sorted((RUN / "report").iterdir()):
        text = want.read_text().replace("/tmp/small46/yesno", str(run))  # the summary names the run folder
        assert (run / "report" / want.name).read_text() == text, want.name
    assert (run / "manifest.json").read_bytes() == (RUN / "manifest.json").read_bytes()  # read, never rewritten
