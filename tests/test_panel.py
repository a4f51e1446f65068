"""Panels (probe.panel) and the `probe compare` plumbing (analysis.compare): what every comparison shares.

Random draws: every subject, draw and bootstrap here is seeded (SimParams seeds, --n-boot/--seed), and
tests/test_determinism.py checks that the seeds are honoured across processes; so every assertion here is
deterministic, false-failure rate 0. Thresholds were set at these seeds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from probe.app.cli import main
from probe.panel import Panel, PanelError, PanelRun, load_panel, panel_from_runs, shared_items
from probe.store import RESULTS


def fake_run(root: Path, name: str, *, model: str = "m", think: bool = False, experiment: str = "yesno") -> Path:
    """A run folder with just enough manifest and one finished chunk for the panel to accept it."""
    path = root / name
    (path / RESULTS).mkdir(parents=True)
    (path / RESULTS / "chunk-000000.done").write_text("")
    man = {
        "experiment": experiment,
        "engine": {"engine": "hf", "settings": {"model": model, "think": think}},
        "n_trials": 1,
    }
    (path / "manifest.json").write_text(json.dumps(man))
    return path


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    return [
        fake_run(tmp_path, "a", model="Qwen/Qwen3-8B"),
        fake_run(tmp_path, "b", model="Qwen/Qwen3-8B", think=True),
        fake_run(tmp_path, "c", model="other"),
    ]


def test_runs_read_names_models_and_reasoning_from_manifests(runs: list[Path]) -> None:
    p = panel_from_runs(runs)
    assert p.names() == ["Qwen/Qwen3-8B", "Qwen/Qwen3-8B think", "other"]
    assert [r.reasoning for r in p.runs] == [False, True, False]
    assert p.experiments == ("yesno",)
    ((off, on),) = p.reasoning_pairs()
    assert (off.path.name, on.path.name) == ("a", "b")


def test_colliding_default_names_get_the_folder_name(tmp_path: Path) -> None:
    p = panel_from_runs([fake_run(tmp_path, "x1"), fake_run(tmp_path, "x2")])
    assert p.names() == ["m [x1]", "m [x2]"]


def test_explicit_names_must_be_distinct_and_one_per_run(runs: list[Path]) -> None:
    assert panel_from_runs(runs, names=["A", "B", "C"]).names() == ["A", "B", "C"]
    with pytest.raises(PanelError, match="distinct name"):
        panel_from_runs(runs, names=["A", "A", "C"])
    with pytest.raises(PanelError, match="one per run"):
        panel_from_runs(runs, names=["A"])


def test_a_folder_without_manifest_or_finished_chunk_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(PanelError, match="not a run folder"):
        panel_from_runs([tmp_path / "empty"])
    path = fake_run(tmp_path, "unfinished")
    (path / RESULTS / "chunk-000000.done").unlink()
    with pytest.raises(PanelError, match="no finished chunk"):
        panel_from_runs([path])


def test_panel_file_paths_are_relative_to_the_file_and_override_the_manifest(tmp_path: Path, runs: list[Path]) -> None:
    (tmp_path / "humans.csv").write_text("item_id,p_cbr\nx,0.5\n")
    f = tmp_path / "panel.yaml"
    f.write_text(
        "runs:\n"
        "  - {run: a, name: Q off, model: Q, reasoning: false}\n"
        "  - {run: c, name: Q on, model: Q, reasoning: true}\n"
        "  - b\n"
        "humans: humans.csv\n"
    )
    p = load_panel(f)
    assert p.names() == ["Q off", "Q on", "Qwen/Qwen3-8B think"]
    assert [(a.name, b.name) for a, b in p.reasoning_pairs()] == [("Q off", "Q on")]
    assert p.humans == (tmp_path / "humans.csv").resolve()
    assert p.source == str(f)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("runs: []\n", "non-empty `runs:`"),
        ("runs:\n  - {name: x}\n", r"runs\[0\] needs a `run:`"),
        ("runs:\n  - {run: a, colour: red}\n", "unknown field"),
        ("runs:\n  - {run: a, reasoning: maybe}\n", "true or false"),
        ("runs:\n  - a\nhumanz: h.csv\n", "unknown top-level"),
        ("runs:\n  - a\nhumans: nope.csv\n", "humans table .* does not exist"),
        ("runs:\n  - zzz\n", "not a run folder"),
        ("runs: [a, b\n", r"not valid YAML \(expected ',' or '\]', but got '<stream end>' at line 2, column 1\)"),
    ],
)
def test_bad_panel_files_name_the_problem(tmp_path: Path, runs: list[Path], text: str, match: str) -> None:
    f = tmp_path / "panel.yaml"
    f.write_text(text)
    with pytest.raises(PanelError, match=match):
        load_panel(f)


def test_a_missing_panel_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PanelError, match=r"panel file .*nope.yaml does not exist; see `probe compare --help`"):
        load_panel(tmp_path / "nope.yaml")


def test_shared_items_keeps_first_run_order_and_logs_every_drop() -> None:
    runs = tuple(PanelRun(Path(n), n, n, False, "yesno") for n in ("A", "B", "C"))
    shared, dropped = shared_items(
        Panel(runs), {"A": ["i3", "i1", "i2", "i9"], "B": ["i1", "i2", "i3"], "C": ["i2", "i3", "i1", "i7"]}
    )
    assert shared == ["i3", "i1", "i2"]
    assert sorted(map(tuple, dropped[["run", "item_id", "reason"]].values.tolist())) == [
        ("A", "i9", "not in run(s): B, C"),
        ("C", "i7", "not in run(s): A, B"),
    ]


def test_compare_cli_errors_are_one_line_exit_2(
    tmp_path: Path, runs: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", "--out", str(tmp_path / "o")]) == 2
    assert "nothing to compare" in capsys.readouterr().err
    assert main(["compare", str(runs[0]), "--panel", "p.yaml", "--out", str(tmp_path / "o")]) == 2
    assert "not both" in capsys.readouterr().err
    mixed = fake_run(tmp_path, "mixed", experiment="cue")
    assert main(["compare", str(runs[0]), str(mixed), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "compare" in err


def test_compare_passes_bootstrap_size_and_seed_to_the_comparison(tmp_path: Path) -> None:
    """`probe compare --n-boot 40 --seed 3` on two synthetic battery runs: the report states what it used."""
    for name, seed in (("s1", 1), ("s2", 2)):
        (tmp_path / f"{name}.yaml").write_text(f"seed: {seed}\nm_order: 0.1\n")
        args = ["run", "battery", "--model", "sim", "--sim-params", str(tmp_path / f"{name}.yaml")]
        assert main([*args, "--out", str(tmp_path / name), "--quiet", "--no-report"]) == 0
    runs = [str(tmp_path / "s1"), str(tmp_path / "s2")]
    out = tmp_path / "cmp"
    assert (
        main(["compare", *runs, "--names", "A,B", "--out", str(out), "--quiet", "--n-boot", "40", "--seed", "3"]) == 0
    )
    assert (out / "panel.csv").read_text().splitlines()[1].startswith("A,sim,False,battery,")
    summary = (out / "summary.md").read_text()
    assert "(40 resamples, seed 3)" in summary and "2000 resamples" not in summary
    assert main(["compare", *runs, "--out", str(tmp_path / "c2"), "--n-boot", "1"]) == 2


def test_experiments_load_no_analysis_and_the_influence_benchmarks_share_one_comparison() -> None:
    """Importing the experiments loads no analysis code; the three influence benchmarks pool (one compare function)."""
    import subprocess
    import sys

    from analysis.registry import COMPARISONS

    code = (
        "import sys, experiments; experiments.all_experiments(); "
        "print(sorted(m for m in sys.modules if m.startswith('analysis') or m in ('torch', 'matplotlib')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert COMPARISONS["influence-bbq"] is COMPARISONS["influence-dd"] is COMPARISONS["influence-triage"]
