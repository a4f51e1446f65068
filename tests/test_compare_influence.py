"""The influence audit across a panel (analysis.influence.compare and compare_report): planted models and a planted reasoning effect.

The planted panel: two synthetic models (m2's steerabilities are half of
m1's), each run with reasoning off and on, where reasoning on adds +1.0 to
the survey cue's steerability in both directions and leaves the other cues
alone. The comparison must give back the per-run steerabilities, the +1.0
change (and no change elsewhere), and fit the |Asym| regression exactly as a
direct statsmodels call does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.common.report import write_report_files
from analysis.influence import asym
from analysis.influence import compare as ci
from analysis.influence.compare_report import compare_influence
from experiments.influence import stats as st
from experiments.influence.build import COND, AuditSpec
from experiments.influence.effects import Contributions, n_clusters
from experiments.influence.triage import TriageSpec
from probe.app.runner import run
from probe.bootstrap import expanded_percentile_ci, percentile_ci
from probe.panel import panel_from_runs
from probe.record import Plan
from tests.planted import TRIAGE_BASE, TRIAGE_INFLUENCES, TRIAGE_SHIFTS, PlantedInfluence
from tests.report_files import assert_wrote

BASE = TRIAGE_BASE
INFLUENCES = TRIAGE_INFLUENCES
M1 = TRIAGE_SHIFTS
M2 = {k: v / 2 for k, v in M1.items()}
REASONING = {("survey", "A"): 1.0, ("survey", "B"): 1.0}
"""The planted reasoning effect: reasoning on adds this to s(d)."""
SPEC = TriageSpec(audit=AuditSpec(influences=INFLUENCES), factors=("gender", "age"), sizes=(1, 2, 3))
N_BOOT = 300


def _on(shifts: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    return {k: v + REASONING.get(k, 0.0) for k, v in shifts.items()}


PLANTED = {"m1": M1, "m1 think": _on(M1), "m2": M2, "m2 think": _on(M2)}


def _run(root: Path, model: str, shifts: dict[tuple[str, str], float], think: bool, spec: TriageSpec = SPEC) -> Path:
    out = root / f"{model}-{'on' if think else 'off'}-{len(spec.sizes)}"
    engine = PlantedInfluence(model, shifts, BASE, think)
    run("influence-triage", spec, engine, out, plan=Plan(readout=False, samples=20), progress=False, log=lambda s: None)
    return out


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], ci.InfluenceComparison]:
    root = tmp_path_factory.mktemp("panel")
    paths = [
        _run(root, "m1", M1, False),
        _run(root, "m1", _on(M1), True),
        _run(root, "m2", M2, False),
        _run(root, "m2", _on(M2), True),
    ]
    return paths, ci.compare_frames(panel_from_runs(paths), n_boot=N_BOOT)


def test_per_run_steerabilities_recover_each_planted_model(planted: tuple[list[Path], ci.InfluenceComparison]) -> None:
    _, res = planted
    c = res.conditions
    assert sorted(set(c["run"])) == ["m1", "m1 think", "m2", "m2 think"]
    assert len(c) == 4 * 2 * 3  # runs x pairs x influence types
    covered, total = 0, 0
    for row in c.itertuples():
        for d in ("A", "B"):
            truth = PLANTED[row.run][(row.influence, d)]
            total += 1
            covered += getattr(row, f"s_{d}_lo") <= truth <= getattr(row, f"s_{d}_hi")
            assert abs(getattr(row, f"s_{d}") - truth) < 4 * getattr(row, f"s_{d}_se"), (row.run, row.influence, d)
    assert covered >= 0.85 * total
    by_model = res.tables["by_model"].set_index(["model", "think"])
    # m2's cues are planted at half of m1's: its mean |s| is smaller in both reasoning modes
    for think in (False, True):
        assert by_model.loc[("m2", think), "|steer|"] < by_model.loc[("m1", think), "|steer|"]
    assert set(res.tables["by_reasoning"]["think"]) == {False, True}
    assert len(res.tables["by_influence_reasoning"]) == 2 * 3
    # BH within benchmark x variant over the four runs: the q-values are BH of all 24 p-values together
    np.testing.assert_allclose(c["q_asym"], st.bh_adjust(c["p_asym"]))
    assert res.matched[0].dropped_items.empty and res.matched[0].dropped_conditions.empty


def test_reasoning_change_recovers_the_planted_effect(planted: tuple[list[Path], ci.InfluenceComparison]) -> None:
    _, res = planted
    ch = res.change
    assert set(ch["model"]) == {"m1", "m2", "all pairs"}
    per_dir = ch[(ch["direction"] != "both") & (ch["model"] != "all pairs")]
    assert len(per_dir) == 2 * 3 * 2
    covered = 0
    for row in per_dir.itertuples():
        truth = REASONING.get((row.influence, row.direction), 0.0)
        covered += row.change_lo <= truth <= row.change_hi
        if truth:
            assert row.change_lo > 0, row  # the planted amplification is detected
    # 10 of 12 here: with 9 items per stratum the percentile CIs run a little narrow (sampling noise only).
    # Deterministic (the planted panel and the bootstrap are seeded): false-failure rate 0. At fresh seeds,
    # 12 exact 95% intervals would miss 3 or more with probability 0.02, and these run narrow: a regression
    # check at this seed, not a coverage estimate.
    assert covered >= len(per_dir) - 2
    both = ch[ch["direction"] == "both"].set_index(["model", "influence"])
    for model in ("m1", "m2", "all pairs"):
        assert both.loc[(model, "survey"), "verdict"] == "amplified"
        assert both.loc[(model, "survey"), "change"] == pytest.approx(1.0, abs=0.3)
        for other in ("emotional", "weak_evidence"):  # the unchanged cues move far less than the planted one
            assert abs(both.loc[(model, other), "change"]) < both.loc[(model, "survey"), "change"] - 0.5
    # percent change of mean |s| is the ratio of the two means
    r = both.loc[("m1", "survey")]
    assert r["pct_change"] == pytest.approx(100 * (r["abs_s_on"] / r["abs_s_off"] - 1))
    # per condition: change = s_on - s_off of the two runs' condition tables
    cond = res.conditions.set_index(["run", "pair", "influence"])
    row = res.change_conditions.query("model == 'm1' and direction == 'B'").iloc[0]
    key = (row["pair"], row["influence"])
    assert row["change"] == pytest.approx(cond.loc[("m1 think", *key), "s_B"] - cond.loc[("m1", *key), "s_B"])


def test_paired_replicates_are_the_one_run_bootstrap(planted: tuple[list[Path], ci.InfluenceComparison]) -> None:
    """The replicates the change CIs use are exactly those behind each run's own CIs (same items, weights, seed)."""
    _, res = planted
    m = res.matched[0]
    for r, panel_run in enumerate(m.runs):
        reps = ci.replicates(m, r, n_boot=N_BOOT)
        t = res.conditions[res.conditions["run"] == panel_run.name]
        lo, hi = percentile_ci(reps["delta_A"])
        np.testing.assert_allclose(t["delta_A_lo"], lo)
        np.testing.assert_allclose(t["delta_A_hi"], hi)
        ct = Contributions(m.conditions[list(COND)], m.items, m.strata, m.n[r], m.k[r])
        lo, hi = expanded_percentile_ci(reps["s_A"], n_clusters(ct))  # s: the small-sample interval
        np.testing.assert_allclose(t["s_A_lo"], lo)
        np.testing.assert_allclose(t["s_A_hi"], hi)


@pytest.mark.filterwarnings("ignore::statsmodels.tools.sm_exceptions.ConvergenceWarning")
def test_asym_fit_equals_a_direct_statsmodels_call(planted: tuple[list[Path], ci.InfluenceComparison]) -> None:
    import statsmodels.formula.api as smf

    _, res = planted
    frame = res.asym_data
    assert len(frame) == 24 and set(frame["model_reasoning"]) == {
        "m1 / reasoning off",
        "m1 / reasoning on",
        "m2 / reasoning off",
        "m2 / reasoning on",
    }
    assert frame["abs_asym"].to_numpy() == pytest.approx(res.conditions["asym"].abs().to_numpy())
    fit = res.fits[0]
    model = smf.mixedlm(
        "abs_asym ~ baseline_bias",
        frame,
        groups=np.ones(len(frame)),
        re_formula="0",
        vc_formula={
            "model_reasoning": "0 + C(model_reasoning)",
            "factor": "0 + C(factor)",
            "influence": "0 + C(influence)",
        },
    )
    kept = fit.attempts[-1].removeprefix("kept: ")  # every optimizer runs; the best converged one is kept
    direct = model.fit(reml=True, method=None if kept.startswith("default") else kept)
    assert direct.llf >= model.fit(reml=True).llf - asym.LLF_TIE
    assert fit.method == "MixedLM (REML)"
    assert fit.beta == pytest.approx(direct.fe_params["baseline_bias"])
    assert fit.intercept == pytest.approx(direct.fe_params["Intercept"])
    assert fit.variances.residual == pytest.approx(direct.scale)
    vc = dict(zip(model.exog_vc.names, direct.vcomp, strict=True))
    assert dict(fit.variances.components) == pytest.approx(vc)
    fixed = direct.fe_params["Intercept"] + direct.fe_params["baseline_bias"] * frame["baseline_bias"]
    var_f = float(np.var(fixed, ddof=1))
    assert fit.variances.r2_marginal == pytest.approx(var_f / (var_f + sum(vc.values()) + direct.scale))
    assert fit.variances.r2_conditional == pytest.approx(
        (var_f + sum(vc.values())) / (var_f + sum(vc.values()) + direct.scale)
    )


def test_runs_are_matched_on_shared_items_and_conditions(
    planted: tuple[list[Path], ci.InfluenceComparison], tmp_path: Path
) -> None:
    paths, _ = planted
    small = TriageSpec(audit=AuditSpec(influences=("survey", "emotional")), factors=("gender", "age"), sizes=(1, 2))
    other = _run(tmp_path, "m3", M1, False, small)
    panel = panel_from_runs([paths[0], other])
    (m,) = ci.match_panel(panel)
    # sizes 1-3 vs 1-2: the 5 size pairs with a 3 are dropped from the first run, per factor
    assert len(m.items) == 2 * 4
    assert set(m.dropped_items["run"]) == {"m1"} and len(m.dropped_items) == 2 * 5
    assert m.dropped_items["reason"].str.contains("not in run\\(s\\): m3").all()
    assert sorted(set(m.conditions["influence"])) == ["emotional", "survey"]
    assert set(m.dropped_conditions["condition"].str.split(" / ").str[1]) == {"weak_evidence"}
    out = write_report_files(tmp_path / "cmp", *compare_influence(panel, n_boot=50))
    assert_wrote(out, {"dropped_items.csv", "dropped_conditions.csv", "summary.md", "asym_regression.csv"})
    summary = (tmp_path / "cmp" / "summary.md").read_text()
    assert "No model has both a reasoning-off and a reasoning-on run" in summary
    assert "8 items they all hold" in summary


def test_tiny_panel_through_probe_compare(tmp_path: Path) -> None:
    from probe.app.cli import main

    args = ["run", "influence-triage", "--model", "tiny", "--quiet", "--factors", "gender", "--sizes", "1"]
    args += ["--influences", "role_play,few_shot"]
    assert main([*args, "--out", str(tmp_path / "off")]) == 0
    assert main([*args, "--out", str(tmp_path / "on"), "--think", "--think-budget", "2"]) == 0
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "off"), str(tmp_path / "on"), "--out", str(out), "--quiet"]) == 0
    assert_wrote(
        out,
        {
            "summary.md",
            "panel.csv",
            "conditions.csv",
            "by_model.csv",
            "reasoning_change.csv",
            "asym_regression.csv",
            "fig_steerability_by_model_triage.png",
            "fig_reasoning_change_triage.png",
            "fig_asym_vs_bias.png",
        },
    )
    change = pd.read_csv(out / "reasoning_change.csv")
    assert set(change["model"]) == {"tiny"} and set(change["influence"]) == {"role_play", "few_shot"}
    summary = (out / "summary.md").read_text()
    assert "| tiny think | tiny | on |" in summary and "## Reasoning on minus off" in summary
