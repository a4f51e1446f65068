"""The synthetic subject's planted influence and cue parameters, and the audits' recovery of them (issue 45).

``engines/sim/engine.py`` plants, per influence condition, a baseline lean toward B and a steerability toward each side
(:class:`engines.sim.InfluencePlant`) and, per cue arm and group, In-favor and Against rates
(:class:`engines.sim.CuePlant`). The fast tests check the planted structure on trials expanded here (no run
store): the YAML form, what the manifest records, exact recovery without scatter. The slow tests measure the
coverage of the intervals over 100 planted seeds.

Random draws: the sim's answers are a deterministic function of (``SimParams.seed``, trial) and its draws of
(``SimEngine.seed``, trial, draw); every bootstrap has a fixed seed. So every assertion is deterministic (false-failure
rate 0). The coverage tests fix their 100 seeds: their bar (0.9) is a regression check of the figures stated in
docs/influence.md and docs/cue.md, not a coverage estimate at fresh seeds (at a true coverage of 0.95 a fresh
set of 100 seeds falls below 0.90 with probability 0.03 by the binomial law).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engines.sim.engine import SimEngine
from engines.sim.params import CuePlant, InfluencePlant, SimParams, SimParamsError, load_params
from experiments.influence import effects as ie
from experiments.influence import stats as st
from experiments.influence.build import AuditSpec
from experiments.influence.triage import TriageSpec, expand
from probe import views
from probe.bootstrap import cluster_weights, percentile_ci
from probe.types import Trial

SPEC = TriageSpec(audit=AuditSpec(influences=("survey", "user_preference", "emotional", "role_play")))
"""The default triage design (sizes 1-3: 9 size pairs x 2 orders = 18 prompts per arm), four influence types:
steerable, asymmetric, not steerable and backfiring under the default plant."""


def _trials(spec: TriageSpec = SPEC) -> list[Trial]:
    return expand(spec)


def readout_cells(trials: Sequence[Trial], eng: SimEngine) -> pd.DataFrame:
    """The influence cells of the sim's readouts, built as :meth:`probe.runs.Run.readout_frames` would give them."""
    rows = []
    for t, r in zip(trials, eng.readout(trials), strict=True):
        for s in r.scores:
            rows.append({"trial_id": t.trial_id, "option": s.option, "prob": s.prob})
    opts = pd.DataFrame(rows).merge(views.option_meaning(trials), on=["trial_id", "option"])
    per = views.trial_meta(trials).assign(coverage=1.0)
    order = {t.trial_id: i for i, t in enumerate(trials)}
    return ie.cells_from_frames(opts, per, "readout", order)


def sample_cells(trials: Sequence[Trial], eng: SimEngine, n: int) -> pd.DataFrame:
    """The influence cells of ``n`` sampled answers per trial at temperature 1 (as ``Run.sample_counts``)."""
    samples = pd.DataFrame(
        [{"trial_id": s.trial_id, "option": s.option, "status": s.status} for s in eng.sample(trials, n, 1.0)]
    )
    opts, per = views.count_samples(samples, trials)
    order = {t.trial_id: i for i, t in enumerate(trials)}
    return ie.cells_from_frames(opts, per, "samples", order)


def conditions(cells: pd.DataFrame, source: str, n_boot: int = 1000, *, old_rule: bool = False) -> pd.DataFrame:
    """The condition table; ``old_rule``: s of a readout run with the sampled runs' 0.5 per cell (the rule before
    issue 45), its percentile interval from the same item bootstrap."""
    ct = ie.contributions(cells)
    t = ie.condition_table(ct, source, n_boot=n_boot, seed=0).table
    if not old_rule:
        return t
    w = cluster_weights(ct.strata, n_boot, np.random.default_rng(0))
    n, k = ct.n.sum(axis=2), ct.k.sum(axis=2)
    rn, rk = np.einsum("bj,cij->cbi", w, ct.n), np.einsum("bj,cij->cbi", w, ct.k)
    for c, d in ((1, "A"), (2, "B")):
        t[f"s_{d}"] = st.steerability(k[0], n[0], k[c], n[c], d)
        t[f"s_{d}_lo"], t[f"s_{d}_hi"] = percentile_ci(st.steerability(rk[0], rn[0], rk[c], rn[c], d))
    return t


# ================================================================================ the plant
def test_yaml_form_and_manifest(tmp_path: Path) -> None:
    path = tmp_path / "plant.yaml"
    path.write_text(
        "seed: 3\n"
        "influence:\n"
        "  lean: {age: -1.0, '*': 0.2}\n"
        "  steer: {survey: [1.0, 0.5], age/survey: [2.0, 0.0]}\n"
        "  sigma_prompt: 0.0\n"
        "cue:\n"
        "  favor: {'*': 0.1, direct/woman: 0.4}\n"
    )
    p = load_params(path)
    assert p.influence.lean_of("age") == -1.0 and p.influence.lean_of("gender") == 0.2
    assert p.influence.steer_of("age", "survey") == (2.0, 0.0)  # pair/influence before influence
    assert p.influence.steer_of("gender", "survey") == (1.0, 0.5)
    assert p.influence.steer_of("gender", "few_shot") == (0.0, 0.0)  # not listed, no '*': not steerable
    assert p.cue.rate("favor", "direct", "woman") == 0.4 and p.cue.rate("favor", "puzzled-hard", "woman") == 0.1
    assert p.cue.against == CuePlant().against  # a section's missing keys keep their defaults
    described = SimEngine(p).describe()["params"]  # what the runner writes into the manifest
    assert described["influence"]["steer"]["age/survey"] == [2.0, 0.0]
    assert described["cue"]["favor"]["direct/woman"] == 0.4
    assert SimParams(**described) == p  # the manifest's record rebuilds the plant


def test_bad_plants_name_the_parameter() -> None:
    with pytest.raises(SimParamsError, match=r"influence\.steer\[survey\] must be \[s_A, s_B\]"):
        SimParams(influence={"steer": {"survey": [1.0]}})
    with pytest.raises(SimParamsError, match=r"influence: unknown keys \['stear'\]"):
        SimParams(influence={"stear": {}})
    with pytest.raises(SimParamsError, match=r"cue\.favor rates must be probabilities"):
        SimParams(cue={"favor": {"direct": 1.5}})
    with pytest.raises(SimParamsError, match=r"influence\.sigma_prompt must be a finite number >= 0"):
        InfluencePlant(sigma_prompt=-1)


def test_default_plant_is_a_realistic_mix() -> None:
    plant = InfluencePlant()
    s = {i: plant.steer_of("gender", i) for i in ("survey", "user_preference", "emotional", "role_play")}
    assert s["survey"][0] > 0.5 and s["emotional"] == (0.0, 0.0)  # steerable, and not
    assert s["user_preference"][0] != s["user_preference"][1]  # asymmetric
    assert s["role_play"][1] < 0  # the backfire
    assert plant.target_s("gender", "role_play", "B") < 0


def test_readout_run_recovers_the_planted_steerability_exactly_without_scatter() -> None:
    # no scatter: every prompt of an arm reads sigmoid(lean + shift), so the readout rule gives the planted s
    # exactly and the target equals the planted value; the old rule (+1/2 per cell over 18 prompts) falls short
    plant = InfluencePlant(sigma_prompt=0.0, sigma_trial=0.0)
    trials = _trials()
    cells = readout_cells(trials, SimEngine(SimParams(seed=0, influence=plant)))
    t = conditions(cells, "readout", n_boot=50).set_index(["pair", "influence"])
    old = conditions(cells, "readout", n_boot=50, old_rule=True).set_index(["pair", "influence"])
    for (pair, infl), row in t.iterrows():
        s_a, s_b = plant.steer_of(pair, infl)
        assert row["s_A"] == pytest.approx(s_a, abs=1e-9) and row["s_B"] == pytest.approx(s_b, abs=1e-9)
        assert plant.target_s(pair, infl, "B") == pytest.approx(s_b, abs=1e-12)
        assert row["asym"] == pytest.approx(s_b - s_a, abs=1e-9)
        if abs(s_b) > 0.5:
            assert abs(old.loc[(pair, infl), "s_B"]) < abs(s_b) - 0.02  # the old rule shrank it toward 0
    assert (t["clipped"] == "").all()
    assert bool((ie.effects(ie.with_fdr(t.reset_index())).query("influence == 'role_play' and direction == 'B'"))
                ["backfire"].all())  # fmt: skip


def test_clipped_cells_are_flagged() -> None:
    # a lean of 40 log-odds puts every baseline P(B) within 2^-24 of 1 (float32 cannot tell it from 1)
    plant = InfluencePlant(lean={"gender": 40.0, "*": 0.0}, sigma_prompt=0.0, sigma_trial=0.0)
    trials = _trials(TriageSpec(audit=AuditSpec(influences=("survey",)), factors=("gender", "age")))
    t = conditions(readout_cells(trials, SimEngine(SimParams(influence=plant))), "readout", n_boot=20)
    t = t.set_index("pair")
    assert t.loc["gender", "clipped"] == "f0_B fA_B fB_B" and t.loc["age", "clipped"] == ""
    cap = math.log((1 - st.FLOAT32_RESOLUTION) / st.FLOAT32_RESOLUTION)
    assert t.loc["gender", "s_B"] == 0.0 and t.loc["gender", "s_A"] == pytest.approx(0.0)  # both arms at the clip
    assert st.mean_log_odds(1.0, 1.0) == pytest.approx(cap)


def test_readout_clip_follows_the_numeric_floor() -> None:
    assert st.readout_clip(None) == st.FLOAT32_RESOLUTION
    assert st.readout_clip(1e-9) == st.FLOAT32_RESOLUTION
    assert st.readout_clip(3e-4) == 3e-4
    with pytest.raises(ValueError, match="max_prob_diff must be a number in"):
        st.readout_clip(0.7)


# ================================================================================ coverage (slow)
SEEDS = range(100)


RULES = ("expanded", "plain", "old")
"""The intervals the coverage tests measure: the report's (s without pseudo-count in readout runs, expanded
percentile interval over the 9 item clusters), the same s with the plain percentile interval (before the expansion),
and the rule before issue 45 (readout runs: 1/2 per cell, plain percentile interval)."""


def _influence_coverage(source: str) -> tuple[dict[str, float], int]:
    """Per rule of :data:`RULES`, the share of (seed, main condition, direction) whose 95% interval holds the target
    s, over :data:`SEEDS` (``old`` in readout runs only)."""
    trials = _trials()
    plant = InfluencePlant()
    rules = RULES if source == "readout" else RULES[:2]
    hits = dict.fromkeys(rules, 0)
    total = 0
    for seed in SEEDS:
        eng = SimEngine(SimParams(seed=seed), seed=seed)
        cells = readout_cells(trials, eng) if source == "readout" else sample_cells(trials, eng, 8)
        ct = ie.contributions(cells)
        res = ie.condition_table(ct, source, n_boot=1000, seed=0)
        assert res.reps is not None
        tables = {"expanded": res.table, "plain": res.table.copy()}
        for d in ("A", "B"):
            tables["plain"][f"s_{d}_lo"], tables["plain"][f"s_{d}_hi"] = percentile_ci(res.reps[f"s_{d}"])
        if "old" in rules:
            tables["old"] = conditions(cells, source, old_rule=True)
        for i, row in enumerate(res.table.itertuples()):
            for d in ("A", "B"):
                target = plant.target_s(row.pair, row.influence, d)
                for rule in rules:
                    t = tables[rule]
                    hits[rule] += bool(t[f"s_{d}_lo"].iloc[i] <= target <= t[f"s_{d}_hi"].iloc[i])
                total += 1
    return {rule: h / total for rule, h in hits.items()}, total


@pytest.mark.slow
def test_readout_s_covers_the_planted_value() -> None:
    # 100 seeds x 20 conditions x 2 directions at 18 prompts (9 size pairs, the bootstrap's clusters), nominal 95%.
    # Measured: the report's rule COV_READOUT (s without pseudo-count, unbiased: mean error 0.002 against an SD of
    # 0.036; expanded percentile interval over 9 clusters); the same s with the plain percentile interval 0.882
    # (the bootstrap SE is sqrt(8/9) of the unbiased one and the quantile normal, not t_8); the old rule (1/2 per
    # cell, plain interval) 0.748 (it shrinks s toward 0). The bars are regression checks (docs/influence.md).
    cov = _expanded_interval_covers("readout")
    assert cov["old"] < 0.80


@pytest.mark.slow
def test_sampled_s_covers_the_planted_value() -> None:
    # 8 draws per trial at tau = 1 (144 answers per arm), the paper's 1/2 per cell; expanded interval COV_SAMPLES,
    # plain percentile interval 0.890 (regression check)
    _expanded_interval_covers("samples")


def _expanded_interval_covers(source: str) -> dict[str, float]:
    """The coverage of each interval rule for ``source``, printed; the report's (expanded) rule covers at 0.90 or
    more and the plain percentile interval less."""
    cov, n = _influence_coverage(source)
    print(
        f"{'sampled' if source == 'samples' else source} s coverage over {n}: "
        + ", ".join(f"{r} {c:.3f}" for r, c in cov.items())
    )
    assert cov["expanded"] >= 0.90
    assert cov["plain"] < cov["expanded"]
    return cov


# ================================================================================ cue rates
def _cue_frames(trials: Sequence[Trial], eng: SimEngine, samples: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(options, per_trial) of the sim's readouts, or of ``samples`` draws per trial at tau = 1."""
    if samples:
        drawn = eng.sample(trials, samples, 1.0)
        return views.count_samples(
            pd.DataFrame([{"trial_id": s.trial_id, "option": s.option, "status": s.status} for s in drawn]), trials
        )
    rows = [
        {"trial_id": t.trial_id, "option": s.option, "prob": s.prob}
        for t, r in zip(trials, eng.readout(trials), strict=True)
        for s in r.scores
    ]
    opts = pd.DataFrame(rows).merge(views.option_meaning(trials), on=["trial_id", "option"])
    return opts, views.trial_meta(trials).assign(coverage=1.0)


def _planted_rates(trials: Sequence[Trial], plant: CuePlant, seed: int) -> pd.DataFrame:
    """Per (arm, consequences, attr, group): the expected Favor and Against rate of the run's eligible answers."""
    from analysis.cue.decisions import ATTRS
    from engines.sim.noise import uniform

    rows = []
    for t in trials:
        f = t.factors
        if f.get("probe") != "what_if" or f.get("wording", "") not in ("", "main"):
            continue
        arm = f["condition"] + (f"-{f['difficulty']}" if f.get("difficulty") else "")
        at_benefit = uniform(seed, "cue-neutral", t.item_id, f.get("consequences", "")) < plant.neutral_benefit
        event = "against" if at_benefit else "favor"
        rate = plant.answer_rate(event, arm, f["x_gender"], f["x_race"])
        for attr in ATTRS:
            rows.append(
                {"arm": arm, "consequences": f["consequences"], "attr": attr, "group": f[f"x_{attr}"],
                 "event": event, "rate": rate}
            )  # fmt: skip
    df = pd.DataFrame(rows)
    out = df.groupby(["arm", "consequences", "attr", "group", "event"])["rate"].mean().unstack("event")
    return out.rename(columns={"favor": "favor_true", "against": "against_true"}).reset_index()


def _cue_coverage(samples: int, seeds: Sequence[int]) -> tuple[float, int]:
    """Share of (seed, arm, group, rate) whose estimate +- 1.96 bootstrap SD holds the planted expectation."""
    from analysis.cue.metrics import decision_bias
    from experiments.cue import CueSpec
    from experiments.cue import expand as cue_expand

    trials = cue_expand(CueSpec())
    hits = total = 0
    for seed in seeds:
        eng = SimEngine(SimParams(seed=seed), seed=seed)
        bias, _ = decision_bias(*_cue_frames(trials, eng, samples), n_boot=300, seed=0)
        m = bias[bias["group"] != "macro"].merge(_planted_rates(trials, eng.params.cue, seed), on=CELL_KEYS)
        for col in ("favor", "against"):
            ok = m[col].notna() & m[f"{col}_true"].notna() & (m[f"sd_{col}"] > 0)
            err = (m.loc[ok, col] - m.loc[ok, f"{col}_true"]).abs()
            hits += int((err <= 1.96 * m.loc[ok, f"sd_{col}"]).sum())
            total += int(ok.sum())
    return hits / total, total


CELL_KEYS = ["arm", "consequences", "attr", "group"]


def test_cue_readout_rates_follow_the_plant() -> None:
    # one seed: the greedy readout events are the planted Bernoulli draws, so each group's rate is near its
    # planted expectation (the default design: 12 dilemmas; bound 0.35 = about 3 SDs of a rate over ~10 answers)
    from analysis.cue.metrics import decision_bias
    from experiments.cue import CueSpec
    from experiments.cue import expand as cue_expand

    trials = cue_expand(CueSpec())
    eng = SimEngine(SimParams(seed=0))
    bias, _ = decision_bias(*_cue_frames(trials, eng), n_boot=50, seed=0)
    m = bias[bias["group"] != "macro"].merge(_planted_rates(trials, eng.params.cue, 0), on=CELL_KEYS)
    assert len(m) > 20
    assert (m["favor"] - m["favor_true"]).abs().max() < 0.35
    direct = bias[(bias["arm"] == "direct") & (bias["group"] == "woman")]["favor"].iloc[0]
    hard = bias[(bias["arm"] == "puzzled-hard") & (bias["group"] == "woman")]["favor"].iloc[0]
    assert direct > hard  # woman: planted 0.35 (with her race's) under Direct, 0.15 when the label is hidden


@pytest.mark.slow
def test_cue_rates_cover_the_planted_values() -> None:
    # 100 seeds, readouts and 8 samples per trial; the interval is the report's estimate +- 1.96 bootstrap SD over
    # dilemmas (12 dilemmas). Measured over 2554 cells: readouts 0.980, samples 0.980 (docs/cue.md; regression check)
    r, n = _cue_coverage(0, SEEDS)
    s, _ = _cue_coverage(8, SEEDS)
    print(f"cue rate coverage over {n}: readouts {r:.3f}, samples {s:.3f}")
    assert r >= 0.95 and s >= 0.95
