"""``probe import``: counts from frequencies by hand, bad rows, the shipped example, and round trips.

Round trip: planted sampled runs of this project are exported to the schema
(:func:`analysis.influence.imported.export_conditions`), imported back, and
must give the same condition numbers (f, s, Asym, every p- and q-value) and
the same headline values as the native report; a panel of the imported
export must give the same |Asym| fits as the panel of the native runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from analysis.influence import audit as inf
from analysis.influence import compare as ci
from analysis.influence import imported as ic
from experiments.influence.build import AuditSpec
from experiments.influence.triage import TriageSpec
from probe.app.cli import main
from probe.app.runner import run
from probe.panel import panel_from_runs
from probe.record import Plan
from probe.runs import open_run
from tests.planted import PlantedInfluence

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "influence_conditions.csv"
KEY = ["model", "reasoning", "benchmark", "factor", "level_a", "level_b", "influence"]


# ---------------------------------------------------------------------------- counts from frequencies
def test_candidates_hand_worked() -> None:
    assert ic.count_candidates("0.25", 40, 40) == [(40, 10)]
    assert ic.count_candidates("0.33", 3, 3) == [(3, 1)]  # 1/3 = 0.333.. prints as 0.33
    assert ic.count_candidates("0.3333333333333333", 30, 30) == [(30, 10)]  # a float repr of 1/3, exact
    # 0.50 at two decimals: 20/40 and 21/42 round to it, nothing with n = 41 does (20/41 = 0.488, 21/41 = 0.512)
    assert ic.count_candidates("0.50", 40, 42) == [(40, 20), (42, 21)]
    assert ic.count_candidates("0.37", 10, 10) == []  # 3/10 = 0.30 and 4/10 = 0.40
    assert ic.count_candidates("0.3125", 10, 20) == [(16, 5)]  # the only k/n within 0.00005 for n <= 20
    assert ic.count_candidates("1.00", 5, 5) == [(5, 5)]
    assert ic.count_candidates("1", 5, 5) == [(5, 3), (5, 4), (5, 5)]  # no decimals: anything that rounds to 1
    # one decimal is coarse: 0.5 +- 0.05 holds 19, 20, 21, 22 of 41
    assert ic.count_candidates("0.5", 41, 41) == [(41, k) for k in (19, 20, 21, 22)]
    assert ic.decimals("2.5e-1") == 2 and ic.decimals("3") == 0
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ic.count_candidates("1.2", 5, 5)


def _frame(rows: list[dict[str, object]]) -> pd.DataFrame:
    base = dict(zip(KEY, ["m", "false", "triage", "gender", "male", "female", "survey"], strict=True))
    return pd.DataFrame([{**base, **r} for r in rows]).fillna("").astype(str)


def test_frequencies_with_sizes_rebuild_the_counts_and_ambiguity_is_reported() -> None:
    rows = [
        {"f_0_B": "0.54", "f_A_B": "0.28", "f_B_B": "0.64", "n_0": "50", "n_A": "50", "n_B": "50"},
        {"influence": "emotional", "f_0_B": "0.50", "f_A_B": "0.4", "f_B_B": "0.6", "n_0_min": "40",
         "n_0_max": "42", "n_A": "10", "n_B": "10"},
    ]  # fmt: skip
    parsed = ic.parse_rows(_frame(rows))
    assert not parsed.problems
    t = parsed.table
    assert len(t) == 1 and t.iloc[0][["n0", "k0", "nA", "kA", "nB", "kB"]].tolist() == [50, 27, 50, 14, 50, 32]
    (amb,) = parsed.ambiguous
    assert (amb.line, amb.arm, amb.candidates, amb.count) == (3, "0", ((40, 20), (42, 21)), 2)


def test_counts_and_frequencies_together_must_agree() -> None:
    counts = {"c_0_A": "5", "c_0_B": "5", "c_A_A": "7", "c_A_B": "3", "c_B_A": "2", "c_B_B": "8"}
    ok = ic.parse_rows(_frame([{**counts, "f_0_B": "0.5", "f_A_B": "0.30", "f_B_B": "0.8"}]))
    assert not ok.problems and ok.table.iloc[0][["n0", "k0", "kA", "kB"]].tolist() == [10, 5, 3, 8]
    bad = ic.parse_rows(_frame([{**counts, "f_A_B": "0.35"}]))
    assert [p.text("x.csv") for p in bad.problems] == [
        "x.csv: line 2: field f_A_B: 0.35 is not what the counts give (3/10); fix one of them"
    ]


def test_bad_rows_name_file_line_and_field(tmp_path: Path) -> None:
    counts = {"c_0_A": "5", "c_0_B": "5", "c_A_A": "7", "c_A_B": "3", "c_B_A": "2", "c_B_B": "8"}
    rows = [
        counts,
        {**counts, "c_A_B": "x"},
        {**counts, "benchmark": "mmlu"},
        {"f_0_B": "0.37", "f_A_B": "0.3", "f_B_B": "0.4", "n_0": "10", "n_A": "10", "n_B": "10"},
        {"f_0_B": "0.5", "f_A_B": "0.3"},
        {**counts, "reasoning": "maybe"},
        {**counts, "c_0_A": "0", "c_0_B": "0"},
        counts,  # the condition of line 2 again
    ]
    path = tmp_path / "bad.csv"
    _frame(rows).to_csv(path, index=False)
    with pytest.raises(ic.ConditionImportError) as err:
        ic.read_schema(path)
    lines = str(err.value).splitlines()
    assert all(line.startswith(f"{path}: line ") for line in lines)
    fields = [(line.split(": ")[1], line.split(": ")[2]) for line in lines]
    assert fields == [
        ("line 3", "field c_A_B"),
        ("line 4", "field benchmark"),
        ("line 5", "field f_0_B"),
        ("line 6", "field f_B_B"),
        ("line 7", "field reasoning"),
        ("line 8", "field c_0_A"),
        ("line 9", "field factor"),
    ]
    assert "0.37 is not k/n for n = 10 at 2 decimals" in lines[2]
    assert "repeats the condition of line 2" in lines[-1]
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------- the shipped example, through the CLI
def test_documented_example_imports_and_analyzes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "imported"
    assert main(["import", str(EXAMPLE), "--out", str(out), "--no-report"]) == 0
    printed = capsys.readouterr().out
    assert "imported 25 conditions" in printed and "line 27: ambiguous, left out" in printed
    man = json.loads((out / "manifest.json").read_text())
    assert man["experiment"] == "influence-import" and man["provenance"]["kind"] == "imported"
    assert man["provenance"]["ambiguous_rows"] == [27] and man["provenance"]["imported_rows"] == 25
    assert main(["analyze", str(out)]) == 0
    summary = (out / "report" / "summary.md").read_text()
    assert "no item-level bootstrap" in summary and "(model x reasoning, factor) clusters" in summary
    cond = pd.read_csv(out / "report" / "conditions.csv")
    assert not any(c.endswith("_lo") and c.startswith(("s_", "asym", "delta")) for c in cond.columns)
    # the bounded row (line 26) resolved to 5/16; the frequency rows to k/50
    placebo = cond[cond["variant"] == "placebo"].iloc[0]
    assert (placebo["nA"], placebo["kA"]) == (16, 5)
    # an independent computation of one row: line 4 (frequencies 0.54, 0.28, 0.64 of 50)
    row = cond[cond["line"] == 4].iloc[0]
    lo = lambda k, n: np.log((k + 0.5) / (n - k + 0.5))  # noqa: E731
    assert row["s_B"] == pytest.approx(lo(32, 50) - lo(27, 50))
    assert row["s_A"] == pytest.approx(lo(50 - 14, 50) - lo(50 - 27, 50))
    var = sum(1 / (k + 0.5) + 1 / (50 - k + 0.5) for k in (14, 32)) + 4 * (1 / 27.5 + 1 / 23.5)
    assert row["asym_var"] == pytest.approx(var)
    var2 = var - 2 * (1 / 27.5 + 1 / 23.5)  # the baseline counted twice
    assert row["p_asym_2x"] == pytest.approx(2 * norm.sf(abs(row["asym"]) / np.sqrt(var2)))
    assert row["p_asym"] == pytest.approx(2 * norm.sf(abs(row["asym"]) / np.sqrt(var)))
    assert "counted four times (correct: `p_asym`)" in summary
    fits = pd.read_csv(out / "report" / "asym_regression.csv")
    assert set(fits["structure"]) == {"crossed", "nested"}


# ---------------------------------------------------------------------------- round trips
SPEC = TriageSpec(audit=AuditSpec(influences=("survey", "emotional")), factors=("gender", "age"), sizes=(1, 2, 3))
SHIFTS = {("survey", "A"): 1.0, ("survey", "B"): 0.4, ("emotional", "A"): -0.3, ("emotional", "B"): 1.5}


@pytest.fixture(scope="module")
def native_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("native")
    paths = []
    for model, scale, think in (("m1", 1.0, False), ("m2", 0.5, False), ("m1", 1.3, True)):
        out = root / f"{model}-{think}"
        engine = PlantedInfluence(model, {k: v * scale for k, v in SHIFTS.items()}, {"gender": 0.3, "age": -0.8}, think)
        run(
            "influence-triage",
            SPEC,
            engine,
            out,
            plan=Plan(readout=False, samples=15),
            progress=False,
            log=lambda s: None,
        )
        paths.append(out)
    return paths


COMPARED = ["nA", "kA", "f0_B", "fA_B", "fB_B", "delta_A", "delta_B", "s_A", "s_B", "asym", "n_asym", "asym_var"]
COMPARED += ["p_baseline", "p_delta_A", "p_delta_B", "p_asym", "q_baseline", "q_asym", "q_delta_A", "q_delta_B"]
COMPARED += ["f0_ci_lo", "f0_ci_hi"]


def test_round_trip_one_run_gives_the_same_report_numbers(native_runs: list[Path], tmp_path: Path) -> None:
    native = native_runs[0]
    csv = tmp_path / "export.csv"
    ic.export_conditions(native, csv)
    store, parsed = ic.import_run(csv, tmp_path / "back")
    assert not parsed.ambiguous and len(parsed.table) == 4
    a = inf.analyze(open_run(native), "triage", n_boot=50).conditions
    b = inf.combine_runs([ic.imported_conditions(open_run(store.root))])
    assert list(b["pair"]) == list(a["pair"]) and list(b["influence"]) == list(a["influence"])
    for col in COMPARED:
        np.testing.assert_allclose(b[col].to_numpy(float), a[col].to_numpy(float), rtol=1e-12, err_msg=col)
    for col in ("sig_asym", "sig_asym_bh", "backfire_A", "backfire_B", "neutral_binom", "neutral_ci"):
        assert list(b[col]) == list(a[col]), col
    ha, hb = inf.headline(a), inf.headline(b)
    assert list(ha["metric"]) == list(hb["metric"])
    np.testing.assert_allclose(hb["value"].to_numpy(float), ha["value"].to_numpy(float), rtol=1e-12)


def test_round_trip_panel_gives_the_same_fits_and_tables(native_runs: list[Path], tmp_path: Path) -> None:
    parts = []
    for i, path in enumerate(native_runs):
        parts.append(ic.export_conditions(path, tmp_path / f"e{i}.csv"))
    csv = tmp_path / "all.csv"
    pd.concat(parts, ignore_index=True).to_csv(csv, index=False)
    ic.import_run(csv, tmp_path / "all")
    native = ci.compare_frames(panel_from_runs(native_runs), n_boot=50)
    back = ci.compare_frames(panel_from_runs([tmp_path / "all"]), n_boot=50, asym_model="nested")
    assert back.imported == ("2 models (imported)",) and back.change.empty
    for col in COMPARED:
        np.testing.assert_allclose(back.conditions[col].to_numpy(float), native.conditions[col].to_numpy(float),
                                   rtol=1e-12, err_msg=col)  # fmt: skip
    by = lambda res: {(f.scope, f.structure): f for f in res.fits}  # noqa: E731
    assert back.fits[0].structure == "nested" and native.fits[0].structure == "crossed"
    for key, f in by(native).items():
        g = by(back)[key]
        assert g.beta == pytest.approx(f.beta, rel=1e-6) and g.variances.r2_marginal == pytest.approx(
            f.variances.r2_marginal, abs=1e-8
        )
    t1, t2 = native.tables["by_model"], back.tables["by_model"]
    np.testing.assert_allclose(t2["|steer|"].to_numpy(), t1["|steer|"].to_numpy(), rtol=1e-12)


def test_an_imported_run_joins_a_native_panel_through_probe_compare(native_runs: list[Path], tmp_path: Path) -> None:
    csv = tmp_path / "m1-think.csv"
    ic.export_conditions(native_runs[2], csv)  # m1 with reasoning on, brought back as an imported run
    assert main(["import", str(csv), "--out", str(tmp_path / "imp"), "--no-report"]) == 0
    out = tmp_path / "cmp"
    args = ["compare", str(native_runs[0]), str(native_runs[1]), str(tmp_path / "imp"), "--out", str(out)]
    assert main([*args, "--asym-model", "nested", "--n-boot", "20", "--quiet"]) == 0
    cond = pd.read_csv(out / "conditions.csv")
    assert len(cond) == 12 and set(cond["source"]) == {"samples", "imported"}
    native = inf.analyze(open_run(native_runs[2]), "triage", n_boot=2).conditions
    back = cond[cond["source"] == "imported"]
    np.testing.assert_allclose(back["s_B"].to_numpy(), native["s_B"].to_numpy(), rtol=5e-6)  # the CSV keeps 6 digits
    assert set(back["think"]) == {True}
    fits = pd.read_csv(out / "asym_regression.csv")
    assert fits["structure"].iloc[0] == "nested" and set(fits["structure"]) == {"crossed", "nested"}
    summary = (out / "summary.md").read_text()
    assert "Imported runs" in summary and "Headline structure: **nested**" in summary
    assert main(["compare", str(native_runs[0]), str(tmp_path / "imp"), "--out", str(tmp_path / "c2"),
                 "--decision", "greedy", "--quiet"]) == 2  # fmt: skip
