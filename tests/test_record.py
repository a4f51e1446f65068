"""The typed run record (probe.record.Manifest): what it reads, that it writes back every byte, and that the
viewer, a panel and the reports name a run through it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.yesno import YesNoSpec
from probe.errors import StoreError
from probe.record import Manifest, Plan, display_name
from probe.store import RunStore, manifest_text

ROOT = Path(__file__).resolve().parents[1]

HF = {
    "experiment": "yesno",
    "run_key": "abc",
    "identity": {"experiment": "yesno", "model": "tiny", "think": True},
    "spec": {"experiment": "yesno", "forms": ["acceptable"]},
    "plan": {"samples": 3, "temperature": 0.7},
    "engine": {
        "engine": "hf",
        "settings": {"model": "tiny", "think": True, "think_budget": 64, "max_new_tokens": 8},
        "model_path": "/models/tiny",
        "model_class": "Qwen3ForCausalLM",
        "dtype": "bfloat16",
        "head_dtype": "float32",
        "device": "cpu",
        "placement": "given",
        "system_prompt": {"text": None, "source": "none"},
    },
    "shard": {"index": 1, "count": 3},
    "n_trials": 12,
    "chunk_size": 4,
    "trials_sha256": "f" * 64,
    "numeric_floor": {"trials": 4, "max_logprob_diff": 1e-6},
    "future_field": {"kept": [1, 2]},
}


def test_fields_are_typed_and_the_questions_answered_once() -> None:
    m = Manifest.from_dict(HF)
    assert (m.experiment, m.run_key, m.n_trials, m.chunk_size) == ("yesno", "abc", 12, 4)
    assert m.model == "tiny" and m.think and m.display_name == "tiny think" == display_name("tiny", True)
    assert m.plan == Plan(samples=3, temperature=0.7) and m.spec_as(YesNoSpec).forms == ("acceptable",)
    assert m.engine.kind == "hf" and m.engine.model_path == "/models/tiny" and m.engine.setting("think_budget") == 64
    assert (m.engine.dtype, m.engine.head_dtype, m.engine.device, m.engine.model_class) == (
        "bfloat16",
        "float32",
        "cpu",
        "Qwen3ForCausalLM",
    )
    assert m.shard_of == (1, 3) and m.numeric_floor == {"trials": 4, "max_logprob_diff": 1e-6}
    assert m.engine.system_prompt == {"text": None, "source": "none"} and m.engine.params == {}
    assert not m.imported and m.provenance is None and m.merged_from == ()
    assert m["engine"]["engine"] == "hf" and "future_field" in m  # the stored JSON, as docs/python.md shows


def test_the_written_text_round_trips_byte_for_byte_unknown_keys_included() -> None:
    text = manifest_text(HF)
    again = manifest_text(Manifest.from_dict(json.loads(text)))
    assert again == text
    changed = Manifest.from_dict(HF).with_fields(throughput=[{"trials": 1}])
    assert json.loads(manifest_text(changed)) == {**HF, "throughput": [{"trials": 1}]}
    copy = Manifest.from_dict(HF).to_dict()
    copy["engine"]["settings"]["model"] = "other"  # a copy: the record does not change
    assert Manifest.from_dict(HF).model == "tiny"


def test_an_old_or_sparse_manifest_still_reads() -> None:
    """A manifest from before the count, the hash, the chunk size and the think setting were recorded."""
    old = Manifest.from_dict({"experiment": "battery", "run_key": "k", "engine": {"engine": "sim"}})
    assert (old.n_trials, old.chunk_size, old.trials_sha256, old.shard_of) == (None, None, None, None)
    assert old.model == "sim" and not old.think and old.plan is None and old.spec == {}
    assert Manifest.from_dict({}).model == "?" and Manifest.from_dict({}).display_name == "?"


def test_the_model_falls_back_in_one_order() -> None:
    """--model, then the engine's own name, then the folder, then the identity's, then the engine kind."""
    e = {"engine": "hf", "settings": {}, "model": "named", "model_path": "/p"}
    assert Manifest.from_dict({"engine": e}).model == "named"
    assert Manifest.from_dict({"engine": {**e, "model": None}}).model == "/p"
    assert Manifest.from_dict({"engine": {"engine": "hf"}, "identity": {"model": "id"}}).model == "id"
    assert Manifest.from_dict({"engine": {"engine": "api"}}).model == "api"


@pytest.mark.parametrize("key", ["engine", "spec", "plan", "identity"])
def test_a_damaged_field_is_an_error_naming_it(key: str) -> None:
    with pytest.raises(StoreError, match=re.escape(repr(key))):
        Manifest.from_dict({**HF, key: ["not", "an", "object"]})


def test_provenance_of_an_imported_run() -> None:
    prov = {"kind": "imported", "source": "/x.csv", "source_sha256": "ab", "rows": 3, "ambiguous_rows": [4]}
    m = Manifest.from_dict({"experiment": "influence-import", "provenance": prov})
    assert m.imported and m.provenance is not None
    assert (m.provenance.source, m.provenance.rows, m.provenance.ambiguous_rows) == ("/x.csv", 3, (4,))


def test_no_module_reads_the_manifest_by_string_key() -> None:
    """The acceptance check of issue 39: only probe/record.py reads manifest fields by name."""
    pattern = re.compile(r"""manifest(\(\))?(\["|\.get\()""")
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for pkg in ("probe", "engines", "experiments", "analysis")
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if p.name != "record.py"
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


def test_the_viewer_a_panel_and_each_report_name_the_run_through_the_record(tmp_path: Path) -> None:
    """One definition of a run's model and display name: change what the manifest says, and every reader follows."""
    from analysis.report import write_report
    from probe.app.view import Viewer
    from probe.panel import panel_from_runs
    from probe.runs import open_run

    out = tmp_path / "run"
    subprocess.run(
        [sys.executable, "-m", "probe.app.cli", "run", "yesno", "--model", "sim", "--out", str(out), "--quiet"],
        check=True,
        cwd=ROOT,
    )
    store = RunStore(out)
    engine = dict(store.manifest().engine.raw)
    store.update_manifest({"engine": {**engine, "settings": {**engine["settings"], "model": "Renamed-7B"}}})
    record = store.manifest()
    assert record.model == "Renamed-7B" and record.display_name == "Renamed-7B"
    assert panel_from_runs([out]).runs[0].name == record.display_name
    assert panel_from_runs([out]).runs[0].model == record.model
    run = open_run(out)
    assert run.model == record.model and run.display_name == record.display_name
    assert Viewer.open([out]).run_info(0)["model"] == record.model
    write_report(out)
    assert (out / "report" / "summary.md").read_text().startswith(f"# yes/no battery: {record.model}\n")
