"""``probe compare`` of runs that hold readouts and samples (issue 45): both sources where every run has both.

Influence and cue panels of two synthetic-subject runs: when every run holds both sources the comparison is
computed from each (the readout half equals the comparison of readouts alone), every CSV holds both in long form
with a ``source`` column and every figure is drawn per source; a panel where one run has readouts only is compared
as before (each run's own source, no per-source files).

Random draws: the sim's answers are a deterministic function of its seeds and every bootstrap is seeded, so every
assertion is deterministic (false-failure rate 0).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analysis.common.report import write_report_files
from analysis.common.tables import source_tables
from analysis.cue import compare as cc
from analysis.cue.compare_report import compare_cue
from analysis.influence import compare as ci
from analysis.influence.compare_report import compare_influence
from engines.sim.engine import SimEngine
from engines.sim.params import SimParams
from experiments.cue import CueSpec
from experiments.influence.build import AuditSpec
from experiments.influence.triage import TriageSpec
from probe.app.runner import run
from probe.panel import panel_from_runs
from probe.record import Plan

TRIAGE = TriageSpec(audit=AuditSpec(influences=("survey", "role_play")), factors=("gender", "age"), sizes=(1, 2))
CUE = CueSpec(items=("rent_arrears", "fallen_fence"), conditions=("neutral", "direct", "puzzled"), probes=("what_if",))
N_BOOT = 50


def _run(root: Path, experiment: str, spec: TriageSpec | CueSpec, seed: int, samples: int) -> Path:
    out = root / f"{experiment}-{seed}-{samples}"
    eng = SimEngine(SimParams(seed=seed), seed=seed)
    run(experiment, spec, eng, out, plan=Plan(samples=samples), progress=False, log=lambda s: None)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    return {
        "inf_both_1": _run(root, "influence-triage", TRIAGE, 1, 4),
        "inf_both_2": _run(root, "influence-triage", TRIAGE, 2, 4),
        "inf_readout_2": _run(root, "influence-triage", TRIAGE, 2, 0),
        "cue_both_1": _run(root, "cue", CUE, 1, 4),
        "cue_both_2": _run(root, "cue", CUE, 2, 4),
        "cue_readout_2": _run(root, "cue", CUE, 2, 0),
    }


def _csvs(out: Path) -> dict[str, pd.DataFrame]:
    return {p.name: pd.read_csv(p) for p in sorted(out.glob("*.csv")) if p.name != "panel.csv" and p.stat().st_size > 1}


def test_influence_panel_of_runs_with_both_sources_shows_both(runs: dict[str, Path], tmp_path: Path) -> None:
    panel = panel_from_runs([runs["inf_both_1"], runs["inf_both_2"]])
    assert ci.both_sources(panel)
    parts = ci.compare_sources(panel, n_boot=N_BOOT)
    assert [p.source for p in parts] == ["readout", "samples"]
    own = ci.compare_frames(panel, n_boot=N_BOOT)  # each run's own source: readouts
    pd.testing.assert_frame_equal(parts[0].conditions, own.conditions)
    assert (parts[1].conditions["source"] == "samples").all()
    assert not parts[0].conditions["s_B"].equals(parts[1].conditions["s_B"])
    write_report_files(tmp_path, *compare_influence(panel, n_boot=N_BOOT))
    tables = _csvs(tmp_path)
    for name in ("conditions.csv", "by_model.csv", "by_run.csv", "headline.csv", "asym_regression.csv"):
        assert list(tables[name]["source"].drop_duplicates()) == ["readout", "samples"], name
    by_model = tables["by_model.csv"].set_index("source")
    assert by_model.loc["readout", "conditions"] == by_model.loc["samples", "conditions"]
    figs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert "fig_steerability_by_model_triage_readout.png" in figs
    assert "fig_steerability_by_model_triage_samples.png" in figs
    assert all(f.endswith(("_readout.png", "_samples.png")) for f in figs)
    summary = (tmp_path / "summary.md").read_text()
    assert "## Source: readout" in summary and "## Source: samples" in summary
    assert summary.index("## Source: readout") < summary.index("### Matching") < summary.index("## Source: samples")


def test_influence_panel_with_a_one_source_run_is_compared_as_before(runs: dict[str, Path], tmp_path: Path) -> None:
    panel = panel_from_runs([runs["inf_both_1"], runs["inf_readout_2"]])
    tables = _one_source_report(panel, ci.both_sources, ci.compare_sources, compare_influence, tmp_path)
    assert "source" not in tables["by_model.csv"].columns
    assert not list(tmp_path.glob("*_readout.png")) and not list(tmp_path.glob("*_samples.png"))
    assert "## Source:" not in (tmp_path / "summary.md").read_text()


def test_cue_panel_of_runs_with_both_sources_shows_both(runs: dict[str, Path], tmp_path: Path) -> None:
    panel = panel_from_runs([runs["cue_both_1"], runs["cue_both_2"]])
    assert cc.both_sources(panel)
    parts = cc.compare_cue_sources(panel, n_boot=N_BOOT)
    assert [p.source for p in parts] == ["readout", "samples"]
    own = cc.compare_cue_frames(panel, n_boot=N_BOOT)
    pd.testing.assert_frame_equal(parts[0].models, own.models)
    write_report_files(tmp_path, *compare_cue(panel, n_boot=N_BOOT))
    tables = _csvs(tmp_path)
    for name in ("cue_rankings.csv", "cue_net_by_group.csv", "cue_average.csv", "cue_sign_tests.csv"):
        assert list(tables[name]["source"].drop_duplicates()) == ["readout", "samples"], name
    rank = tables["cue_rankings.csv"]
    assert len(rank) == 4 and list(rank.columns[:2]) == ["source", "name"]
    figs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert {"fig_cue_rankings_readout.png", "fig_cue_rankings_samples.png"} <= set(figs)
    summary = (tmp_path / "summary.md").read_text()
    assert "## Source: readout" in summary and "## Source: samples" in summary and "### Rankings" in summary


def test_cue_panel_with_a_one_source_run_is_compared_as_before(runs: dict[str, Path], tmp_path: Path) -> None:
    panel = panel_from_runs([runs["cue_both_1"], runs["cue_readout_2"]])
    tables = _one_source_report(panel, cc.both_sources, cc.compare_cue_sources, compare_cue, tmp_path)
    assert "source" not in tables["cue_rankings.csv"].columns
    assert (tmp_path / "fig_cue_rankings.png").exists() and not list(tmp_path.glob("*_readout.png"))


def test_source_tables_are_long_form() -> None:
    a = pd.DataFrame({"x": [1, 2]})
    b = pd.DataFrame({"x": [3], "source": ["samples"]})
    tables, dropped = source_tables(
        [
            ("readout", {"t": a, "u": a.assign(source="readout"), "none": None}, pd.DataFrame({"item_id": ["i"]})),
            ("samples", {"t": a.iloc[:1], "u": b, "none": None}, pd.DataFrame({"item_id": []})),
        ]
    )
    assert tables["none"] is None
    t = tables["t"]
    assert t is not None and list(t.columns) == ["source", "x"] and list(t["source"]) == ["readout"] * 2 + ["samples"]
    u = tables["u"]
    assert u is not None and list(u.columns) == ["x", "source"] and list(u["source"]) == ["readout"] * 2 + ["samples"]
    assert list(dropped.columns) == ["source", "item_id"] and list(dropped["source"]) == ["readout"]


def test_the_sources_disagree_only_beyond_a_few_cluster_test(runs: dict[str, Path]) -> None:
    """A run's two sources are compared on paired replicates with the expanded interval's t test: each p is
    expanded_pvalue of the difference, its SE and the condition's item clusters, and never below the z test's
    (which rejects 10% of the time at 9 clusters; docs/influence.md)."""
    import numpy as np

    from analysis.influence.audit import analyze_sources, source_agreement
    from experiments.influence import stats as st
    from probe.bootstrap import expanded_pvalue
    from probe.runs import open_run

    readout, samples = analyze_sources(open_run(runs["inf_both_1"]), "triage", n_boot=N_BOOT)
    assert readout.clusters is not None and np.all(readout.clusters >= 1)
    agree = source_agreement(readout, samples)
    assert agree["paired"].all()
    clusters = np.tile(readout.clusters, len(agree) // len(readout.clusters))
    np.testing.assert_allclose(agree["p"], expanded_pvalue(agree["diff"], agree["diff_se"], clusters), equal_nan=True)
    z = st.z_pvalue(st.z_from_se(agree["diff"], agree["diff_se"]))
    finite = np.isfinite(agree["p"].to_numpy())
    assert np.all(agree["p"].to_numpy()[finite] >= z[finite] - 1e-12)


def _one_source_report(
    panel: Any, both: Callable[..., bool], sources: Callable[..., Any], report: Callable[..., Any], tmp_path: Path
) -> dict[str, pd.DataFrame]:
    """Write the report of a panel in which some run holds one source only: one comparison, of no named source;
    its CSVs."""
    assert not both(panel)
    (only,) = sources(panel, n_boot=N_BOOT)
    assert only.source is None
    write_report_files(tmp_path, *report(panel, n_boot=N_BOOT))
    return _csvs(tmp_path)
