"""Stance theta, incoherence sigma_repro and its components, G, the bipolar contrast, the salt floor, validity.

Every formula is checked on a small table worked out by hand (the arithmetic
is in the comments), then on the synthetic subject against planted values.

Random draws: every subject, draw and bootstrap here is seeded (SimParams seeds and explicit numpy
generators), and tests/test_determinism.py checks that the seeds are honoured across processes; so every
assertion here is deterministic, false-failure rate 0. Thresholds were set at these seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import tests.battery_contract as bc
from analysis.battery import stance
from engines.sim.engine import SimEngine
from engines.sim.params import SimParams

FORM = ["scale", "wording", "anchor", "pole"]


def _graded_frames(rows):
    """rows: (trial_id, item, replicate, scale, anchor, options, meanings, weights) -> (options, per_trial)."""
    per, opts = [], []
    for tid, item, rep, scale, anchor, options, means, weights in rows:
        per.append(
            {
                "trial_id": tid,
                "item_id": item,
                "replicate": rep,
                "instrument": "graded",
                "scale": scale,
                "wording": "w",
                "anchor": anchor,
                "pole": "action",
            }
        )
        for i, (o, m, w) in enumerate(zip(options, means, weights, strict=True)):
            opts.append({"trial_id": tid, "option": o, "option_index": i, "meaning": m, "prob": w, "count": w})
    return pd.DataFrame(opts), pd.DataFrame(per)


# ------------------------------------------------------------------ per trial
def test_graded_trial_mean_mode_and_variance_by_hand():
    # stances -1, 0, 1 with readout probabilities 0.2, 0.3, 0.5:
    # mean = -0.2 + 0 + 0.5 = 0.3; variance = 0.2*1.69 + 0.3*0.09 + 0.5*0.49 = 0.61; mode = 1
    opts, per = _graded_frames(
        [("t", "a", 0, "0-2", "ascending", ["0", "1", "2"], ["-1.0", "0.0", "1.0"], [0.2, 0.3, 0.5])]
    )
    g = stance.graded_trials(opts, per, "readout").iloc[0]
    assert g["mean_x"] == pytest.approx(0.3)
    assert g["var_x"] == pytest.approx(0.61)
    assert g["mode_x"] == 1.0
    assert g["var_mean"] == 0.0 and not g["bipolar"]


def test_graded_trial_from_sample_counts_by_hand():
    # counts 1, 1, 2 over stances -1, 0, 1 (n = 4): mean = 1/4; sum of squares = 1.5625 + 0.0625 + 2*0.5625 = 2.75
    # var_x = 2.75 / 4; var_mean = 2.75 / (4 * 3) (unbiased variance of the draws over n)
    opts, per = _graded_frames([("t", "a", 0, "0-2", "ascending", ["0", "1", "2"], ["-1.0", "0.0", "1.0"], [1, 1, 2])])
    g = stance.graded_trials(opts, per, "samples").iloc[0]
    assert g["mean_x"] == pytest.approx(0.25)
    assert g["var_x"] == pytest.approx(2.75 / 4)
    assert g["var_mean"] == pytest.approx(2.75 / 12)
    assert g["n"] == 4 and g["mode_x"] == 1.0


def test_mode_ties_go_to_the_first_printed_and_bipolar_is_read_from_the_values():
    opts, per = _graded_frames(
        [("t", "a", 0, "bi", "ascending", ["-1", "0", "1"], ["-1.0", "0.0", "1.0"], [0.4, 0.4, 0.2])]
    )
    g = stance.graded_trials(opts, per, "readout").iloc[0]
    assert g["mode_x"] == -1.0 and g["bipolar"]


# ------------------------------------------------------------------- per form
def _trials_table(values, *, var_mean=0.0):
    """values: {(item, scale, anchor): [x per replicate]} -> a graded_trials-like table."""
    rows = []
    for (item, scale, anchor), xs in values.items():
        for r, x in enumerate(xs):
            rows.append(
                {
                    "trial_id": f"{item}{scale}{anchor}{r}",
                    "item_id": item,
                    "replicate": r,
                    "scale": scale,
                    "wording": "w",
                    "anchor": anchor,
                    "pole": "action",
                    "bipolar": scale.startswith("bipolar"),
                    "mean_x": x,
                    "mode_x": round(x),
                    "var_mean": var_mean,
                }
            )
    return pd.DataFrame(rows)


def test_per_form_unsalted_and_pooled_by_hand():
    # replicates 0.2, 0.4, 0.6: Var (ddof 1) = 0.04
    t = _trials_table({("a", "0-10", "ascending"): [0.2, 0.4, 0.6]})
    un = stance.per_form(t, replicates="unsalted").iloc[0]
    assert un["x"] == pytest.approx(0.2) and un["var_samp"] == pytest.approx(0.04) and un["n_rep"] == 3
    po = stance.per_form(t, replicates="pooled").iloc[0]
    assert po["x"] == pytest.approx(0.4) and po["var_samp"] == pytest.approx(0.04 / 3)


def test_per_form_single_replicate_uses_the_trials_own_sampling_variance():
    t = _trials_table({("a", "0-10", "ascending"): [0.3]}, var_mean=0.002)
    f = stance.per_form(t).iloc[0]
    assert f["x"] == pytest.approx(0.3) and f["var_samp"] == pytest.approx(0.002)


def _forms(rows):
    """rows: (item, anchor, x, var_samp[, scale]) -> a per_form-like table (var_rep = 4 var_samp: 4 draws)."""
    out = []
    for k, row in enumerate(rows):
        item, anchor, x, vs = row[:4]
        scale = row[4] if len(row) > 4 else "0-10"
        out.append(
            {
                "item_id": item,
                "scale": scale,
                "wording": f"w{k}",
                "anchor": anchor,
                "pole": "action",
                "x": x,
                "var_samp": vs,
                "var_rep": 4 * vs,
                "n_rep": 1,
                "bipolar": scale.startswith("bipolar"),
            }
        )
    return pd.DataFrame(out)


HAND = _forms(
    [
        ("a", "ascending", 0.5, 0.01),
        ("a", "ascending", 0.3, 0.01),
        ("a", "descending", 0.1, 0.01),
        ("a", "descending", -0.1, 0.01),
        ("b", "ascending", -0.4, 0.0),
        ("b", "ascending", -0.6, 0.0),
        ("b", "descending", -0.5, 0.0),
        ("b", "descending", -0.5, 0.0),
    ]
)


def test_incoherence_and_its_components_by_hand():
    inc = stance.incoherence(HAND)
    a, b = inc.loc["a"], inc.loc["b"]
    # item a: mean 0.2, deviations +-0.3, +-0.1 -> SS = 0.2, Var_forms = 0.2/3; noise 0.01
    assert a["theta"] == pytest.approx(0.2)
    assert a["var_forms"] == pytest.approx(0.2 / 3)
    assert a["sigma_repro"] == pytest.approx(math.sqrt(0.2 / 3 - 0.01))
    # direction means 0.4 and 0.0: SS_between = 4 * 0.2^2 = 0.16 (1 df), SS_within = 4 * 0.1^2 = 0.04 (2 df)
    # dir^2 = (0.16 - 0.01 * 1) / 3 = 0.05; scale^2 = (0.04 - 0.01 * 2) / 3 = 0.02 / 3
    assert a["sigma_dir"] == pytest.approx(math.sqrt(0.05))
    assert a["sigma_scale"] == pytest.approx(math.sqrt(0.02 / 3))
    assert a["sigma_quad"] == pytest.approx(a["sigma_repro"], abs=1e-15)  # the shares add exactly
    # item b: mean -0.5, SS = 0.02, no sampling variance, equal direction means
    assert b["theta"] == pytest.approx(-0.5)
    assert b["sigma_repro"] == pytest.approx(math.sqrt(0.02 / 3))
    assert b["sigma_dir"] == pytest.approx(0.0, abs=1e-12)
    assert b["sigma_raw"] == pytest.approx(math.sqrt(0.02 / 3))


def test_sigma_repro_is_floored_at_zero_and_components_in_quadrature():
    # Var_forms = 0.02/3 < noise 0.05: nothing left beyond sampling
    f = _forms([("c", "ascending", 0.1, 0.05), ("c", "ascending", 0.0, 0.05), ("c", "descending", -0.1, 0.05)])
    row = stance.incoherence(f).loc["c"]
    assert row["sigma_repro"] == 0.0
    assert row["sigma_raw"] == pytest.approx(0.1)
    # direction: means 0.05 / -0.1, grand 0; SS_b = 2*0.05^2 + 0.1^2 = 0.015 -> (0.015 - 0.05) / 2 < 0 -> 0
    assert row["sigma_dir"] == 0.0


def test_generalizability_by_hand():
    # theta 0.2 and -0.5: Var_items = 0.7^2 / 2 = 0.245; sigma^2: 0.2/3 - 0.01 and 0.02/3; G = 0.245 / (0.245 + mean)
    g = stance.generalizability(stance.incoherence(HAND))
    mean_s2 = (0.2 / 3 - 0.01 + 0.02 / 3) / 2
    assert g.var_items == pytest.approx(0.245)
    assert g.mean_sigma2 == pytest.approx(mean_s2)
    coefficient = g.G
    assert coefficient == pytest.approx(0.245 / (0.245 + mean_s2))
    assert g.n_items == 2


def test_bipolar_forms_stay_out_of_theta_and_give_the_contrast():
    f = _forms(
        [
            ("a", "ascending", 0.4, 0.0),
            ("a", "descending", 0.2, 0.0),
            ("a", "ascending", 0.9, 0.0, "bipolar-5"),
            ("a", "descending", 0.7, 0.0, "bipolar-5"),
        ]
    )
    c = stance.bipolar_contrast(f).loc["a"]
    assert c["theta"] == pytest.approx(0.3) and c["theta_bipolar"] == pytest.approx(0.8)
    assert c["contrast"] == pytest.approx(0.5)
    assert stance.incoherence(f).loc["a", "n_forms"] == 2
    assert stance.incoherence(f, include_bipolar=True).loc["a", "n_forms"] == 4


def test_variance_shares_match_a_one_way_anova():
    rng = np.random.default_rng(3)
    x = rng.normal(size=12)
    groups = np.repeat(["asc", "desc", "mid"], 4)
    between, within = stance.variance_shares(x, groups, noise=0.0)
    # statsmodels-free check with scipy: F = (SS_b / 2) / (SS_w / 9)
    f_stat = stats.f_oneway(*(x[groups == g] for g in ("asc", "desc", "mid"))).statistic
    assert f_stat == pytest.approx((between * 11 / 2) / (within * 11 / 9))
    assert between + within == pytest.approx(np.var(x, ddof=1))


# ------------------------------------------------------------------ salt floor
def test_salt_floor_by_hand():
    # form 1: 0.1, 0.2, 0.3 -> SD 0.1, mean 0.2; form 2: 0.5 x 3 -> SD 0, mean 0.5; between-form SD = 0.3 / sqrt(2)
    rows = [("f1", r, v) for r, v in enumerate([0.1, 0.2, 0.3])] + [("f2", r, 0.5) for r in range(3)]
    values = pd.DataFrame([{"item_id": "a", "form": f, "replicate": r, "p": v} for f, r, v in rows])
    spread = stance.salt_spread(values, "p", ["form"])
    assert spread.set_index("form")["within_sd"].tolist() == pytest.approx([0.1, 0.0])
    floor = stance.salt_floor(spread)
    assert floor.within_sd_mean == pytest.approx(0.05) and floor.within_sd_median == pytest.approx(0.05)
    assert floor.between_sd_mean == pytest.approx(0.3 / math.sqrt(2))
    assert floor.ratio == pytest.approx(0.3 / math.sqrt(2) / 0.05)


def test_salt_floor_needs_replicates():
    values = pd.DataFrame([{"item_id": "a", "form": "f", "replicate": 0, "p": 0.2}])
    with pytest.raises(ValueError, match="--salts"):
        stance.salt_spread(values, "p", ["form"])


# ---------------------------------------------------------- convergent validity
def test_pearson_ci_matches_scipy_and_a_brute_force_bootstrap():
    rng = np.random.default_rng(0)
    a = pd.Series(rng.normal(size=15), index=[f"i{k}" for k in range(15)])
    b = (a * 0.7 + pd.Series(rng.normal(size=15), index=a.index) * 0.5).iloc[::-1]  # order must not matter
    c = stance.pearson_ci(a, b, n_boot=400, seed=5)
    assert c.r == pytest.approx(stats.pearsonr(a, b.reindex(a.index)).statistic)
    idx = np.random.default_rng(5).integers(0, 15, size=(400, 15))
    x, y = a.to_numpy(), b.reindex(a.index).to_numpy()
    rs = [np.corrcoef(x[i], y[i])[0, 1] for i in idx]
    assert (c.lo, c.hi) == pytest.approx(tuple(np.quantile(rs, [0.025, 0.975])))
    assert c.lo < c.r < c.hi and c.n == 15


def test_choice_stance_by_hand():
    j = pd.DataFrame(
        {"item_id": ["a", "a", "a", "b"], "p_pro": [1.0, 0.0, 0.0, 0.2], "p_anti": [0.0, 0.0, 1.0, 0.7]}
    )  # a: PRO, NONCOMMIT, ANTI -> 0; b: a logit judge's 0.2 - 0.7
    s = stance.choice_stance(j)
    assert s["a"] == pytest.approx(0.0) and s["b"] == pytest.approx(-0.5)


# ------------------------------------------------------------ on the sim subject
ITEMS = [f"i{k:02d}" for k in range(24)]


def test_sim_theta_recovered_and_incoherence_components_planted():
    p = SimParams(seed=1, sigma_form=0.08, sigma_dir=0.15, sigma_scale=0.0, bipolar_shift=0.1)
    trials = bc.graded(ITEMS, scales=("0-10", "0-100", "bipolar-5"))
    opts, per = bc.frames_readout(trials, SimEngine(p).readout(trials))
    forms = stance.per_form(stance.graded_trials(opts, per, "readout"))
    th = stance.theta(forms)
    planted = pd.Series({i: p.item_theta(i) for i in ITEMS})
    assert stats.pearsonr(th, planted[th.index]).statistic > 0.95
    # the per-form scatter is the only error in theta: mean of 24 draws of SD 0.08
    assert float((th - planted[th.index]).abs().max()) < 4 * 0.08 / math.sqrt(24)
    inc = stance.incoherence(forms)
    # planted: anchor contrast +-d per item (d ~ N(0, 0.15)), residual SD 0.08 per form. With K = 24 balanced
    # forms the direction share is (K d^2 + noise) / (K - 1), so sigma_dir tracks |d| and the rest is residual
    d = np.array([abs(SimEngine(p).anchor_contrast(i)) for i in inc.index])
    assert stats.pearsonr(inc["sigma_dir"], d).statistic > 0.95
    assert float(np.sqrt((inc["sigma_scale"] ** 2).mean())) == pytest.approx(0.08, rel=0.2)
    contrast = stance.bipolar_contrast(forms)["contrast"]
    assert float(contrast.mean()) == pytest.approx(0.1, abs=0.03)
    g = stance.generalizability(inc)
    assert 0.5 < g.G < 1


def test_sampling_correction_removes_pure_sampling_spread():
    # no planted incoherence at all: every form of an item has mean exactly theta, so the
    # spread of the per-form sample means is sampling noise, which the correction must remove
    p = SimParams(seed=2)
    trials = bc.graded(ITEMS[:12], scales=("0-10",))
    eng = SimEngine(p, seed=3)
    opts, per = bc.frames_samples(trials, eng.sample(trials, 6, 1.0))
    forms = stance.per_form(stance.graded_trials(opts, per, "samples"))
    inc = stance.incoherence(forms)
    assert float((inc["var_forms"] - inc["var_samp"]).mean()) == pytest.approx(0.0, abs=0.004)
    assert float(inc["sigma_raw"].mean()) > 2 * float(inc["sigma_repro"].mean())


def test_salt_floor_on_the_sim_separates_salt_noise_from_form_scatter():
    p = SimParams(seed=4, sigma_form=0.2, sigma_salt=0.03)
    trials = bc.graded(ITEMS[:8], scales=("0-10",), salts=4)
    opts, per = bc.frames_readout(trials, SimEngine(p).readout(trials))
    gt = stance.graded_trials(opts, per, "readout")
    floor = stance.salt_floor(stance.salt_spread(gt, "mean_x", FORM))
    assert floor.within_sd_mean == pytest.approx(0.03, rel=0.35)
    assert floor.between_sd_mean == pytest.approx(0.2, rel=0.35)
    assert floor.ratio > 4


def test_on_the_real_battery_expansion():
    """The estimators run on the lead's real instrument, and x follows the contract's normalization."""
    from experiments.battery import BatterySpec, expand

    spec = BatterySpec(instruments=("graded",), items=("mine_cart_bridge", "freight_yard_switch"))
    trials = expand(spec)
    p = SimParams(seed=0, theta={"mine_cart_bridge": 0.6, "freight_yard_switch": -0.4})
    opts, per = bc.frames_readout(trials, SimEngine(p).readout(trials))
    forms = stance.per_form(stance.graded_trials(opts, per, "readout"))
    assert len(forms) == 2 * 48
    th = stance.theta(forms)
    assert th["mine_cart_bridge"] == pytest.approx(0.6, abs=1e-9)
    assert th["freight_yard_switch"] == pytest.approx(-0.4, abs=1e-9)


# ------------------------------------------------------- issue 18: paper definitions
def test_theta_with_a_missing_form_weighs_the_two_poles_equally():
    # action forms x = 0.6, 0.4 (a = 0.8, 0.7); one complement form left, x = 0.0 (a = 0.5):
    # the paper's theta = mean a_action - mean a_complement = 0.75 - 0.5 = 0.25, not the mean of x (1/3)
    f = _forms([("a", "ascending", 0.6, 0.0), ("a", "descending", 0.4, 0.0), ("a", "ascending", 0.0, 0.0)])
    f.loc[2, "pole"] = "complement"
    assert stance.theta(f)["a"] == pytest.approx(0.25)
    assert stance.theta(f)["a"] != pytest.approx(f["x"].mean())
    # balanced forms: the same as the plain mean of x
    full = pd.concat([f, f.iloc[[2]].assign(wording="w9")], ignore_index=True)
    assert stance.theta(full)["a"] == pytest.approx(full["x"].mean())


def test_pooled_incoherence_is_the_paper_headline_not_the_mean_of_per_item_sigma():
    # the example: per-item sigma 0.05, 0.10, 0.30 with equal form counts -> mean 0.15, pooled 0.185
    sig = np.array([0.05, 0.10, 0.30])
    inc = pd.DataFrame(
        {
            "var_forms": sig**2,
            "var_samp": 0.0,
            "n_forms": 4,
            "sigma_repro": sig,
            "var_dir": sig**2 / 2,
            "var_scale": sig**2 / 2,
            "var_rep": 0.0,
        },
        index=["x", "y", "z"],
    )
    pooled = stance.pooled_incoherence(inc)
    assert pooled.mean_item_sigma_repro == pytest.approx(0.15)
    assert pooled.sigma_repro == pytest.approx(math.sqrt(np.mean(sig**2)))
    assert round(pooled.sigma_repro, 3) == 0.185
    assert pooled.sigma_repeat == 0.0 and pooled.sigma_tot == pytest.approx(pooled.sigma_repro)


def test_pooled_split_repeat_and_total_by_hand():
    # HAND: item a Var_forms 0.2/3, noise 0.01, dir^2 0.05, scale^2 0.02/3; item b Var_forms 0.02/3, noise 0,
    # equal direction means (dir^2 = 0), scale^2 = 0.02/3. Four forms each: pooled = plain means.
    p = stance.pooled_incoherence(stance.incoherence(HAND))
    var_repro = (0.2 / 3 + 0.02 / 3) / 2 - 0.005
    assert p.sigma_repro == pytest.approx(math.sqrt(var_repro))
    assert p.sigma_dir == pytest.approx(math.sqrt(0.025))
    assert p.sigma_scale == pytest.approx(math.sqrt(0.02 / 3))
    assert p.sigma_dir**2 + p.sigma_scale**2 == pytest.approx(var_repro)  # the shares add in quadrature
    # issue 27: sigma_repeat is the SD of ONE elicitation (var_rep: item a 0.04 = 4 draws x Var_samp 0.01,
    # item b 0), not the standard error of a form's value (sqrt(pooled Var_samp) = sqrt(0.005), sigma_value)
    assert p.sigma_repeat == pytest.approx(math.sqrt(0.02))
    assert p.sigma_value == pytest.approx(math.sqrt(0.005))
    assert p.sigma_tot**2 == pytest.approx(var_repro + 0.02)
    assert (p.n_items, p.n_forms) == (2, 8)


def _sampled_trials(draws):
    """draws: {(item, anchor, replicate): [x of each parsed draw]} -> a graded_trials table of a sampled run."""
    rows = []
    for (item, anchor, r), xs in draws.items():
        xs = np.asarray(xs, float)
        n = len(xs)
        rows.append(
            {
                "trial_id": f"{item}{anchor}{r}",
                "item_id": item,
                "replicate": r,
                "scale": "0-10",
                "wording": "w",
                "anchor": anchor,
                "pole": "action",
                "bipolar": False,
                "mean_x": xs.mean() if n else np.nan,
                "mode_x": xs[0] if n else np.nan,
                "var_x": xs.var() if n else np.nan,
                "n": float(n),
                "var_mean": xs.var(ddof=1) / n if n > 1 else np.nan,
            }
        )
    return pd.DataFrame(rows)


def test_repeat_variance_is_one_draw_whether_the_replicates_are_draws_or_salts():
    # HAND: the draws 0.2, 0.4, 0.6, 0.8 of one form: unbiased variance 0.2/3 (deviations +-0.3, +-0.1).
    # As one trial of 4 draws: var_samp = 0.2/3 / 4 (the SE^2 of the mean) and var_rep = 0.2/3;
    # as 4 salted replicates of one draw each: var_rep = Var_r(x_r) = 0.2/3 again;
    # as 2 salts of 2 draws ((0.2, 0.4), (0.6, 0.8)): SS within 0.02 + 0.02, between 2 * 0.2^2 + 2 * 0.2^2
    # (means 0.3, 0.7 about 0.5): 0.2 in all, over N - 1 = 3.
    xs = [0.2, 0.4, 0.6, 0.8]
    one = stance.per_form(_sampled_trials({("a", "ascending", 0): xs})).iloc[0]
    assert one["var_rep"] == pytest.approx(0.2 / 3)
    assert one["var_samp"] == pytest.approx(0.2 / 3 / 4)
    salts = stance.per_form(_sampled_trials({("a", "ascending", r): [x] for r, x in enumerate(xs)})).iloc[0]
    assert salts["var_rep"] == pytest.approx(0.2 / 3)
    two = stance.per_form(_sampled_trials({("a", "ascending", 0): xs[:2], ("a", "ascending", 1): xs[2:]})).iloc[0]
    assert two["var_rep"] == pytest.approx(0.2 / 3)
    # readouts: one deterministic elicitation per context; with one replicate the repeat variance is 0
    ro = stance.per_form(_trials_table({("a", "0-10", "ascending"): [0.3]})).iloc[0]
    assert ro["var_rep"] == 0.0
    ro3 = stance.per_form(_trials_table({("a", "0-10", "ascending"): [0.2, 0.4, 0.6]})).iloc[0]
    assert ro3["var_rep"] == pytest.approx(0.04)


def test_per_form_falls_back_to_the_salted_mean_when_the_unsalted_replicate_was_refused():
    # issue 27 D: replicate 0 fully refused (no parsed draw); salts 1 and 2 give means 0.3 and 0.5
    t = _sampled_trials(
        {
            ("a", "ascending", 0): [],
            ("a", "ascending", 1): [0.2, 0.4],
            ("a", "ascending", 2): [0.4, 0.6],
            ("a", "descending", 0): [0.0, 0.2],
            ("a", "descending", 1): [0.6, 0.8],
        }
    )
    f = stance.per_form(t).set_index("anchor")
    lost, kept = f.loc["ascending"], f.loc["descending"]
    assert lost["value_from"] == "salted mean" and lost["x"] == pytest.approx(0.4)
    assert lost["var_samp"] == pytest.approx(0.02 / 2)  # Var_r(0.3, 0.5) = 0.02 over the R' = 2 replicates
    assert kept["value_from"] == "unsalted" and kept["x"] == pytest.approx(0.1)
    assert kept["var_samp"] == pytest.approx(0.18)  # the unsalted policy: Var_r(0.1, 0.7) = 2 * 0.3^2 / 1
    assert stance.unusable_forms(t).empty
    t2 = _sampled_trials({("a", "ascending", 0): [], ("a", "ascending", 1): [], ("a", "descending", 0): [0.1]})
    gone = stance.unusable_forms(t2)
    assert gone[["item_id", "anchor"]].values.tolist() == [["a", "ascending"]]
    assert stance.per_form(t2)["anchor"].tolist() == ["descending"]


def test_bipolar_contrast_reports_the_signed_mean_and_the_mean_absolute_value():
    c = pd.DataFrame({"contrast": [0.1, -0.3, np.nan]}, index=["a", "b", "c"])
    b = stance.bipolar_summary(c)
    assert (b.mean, b.mean_abs, b.n_items) == (pytest.approx(-0.1), pytest.approx(0.2), 2)


def test_sim_repeat_noise_and_pooled_incoherence_recovered():
    """Planted per-form scatter 0.1 and per-context (salt) noise 0.05 come back as pooled sigma_repro and sigma_repeat.

    24 items x 12 unipolar forms x 4 salted replicates (readouts): the pooled
    variances average 24 x 11 form deviations and 24 x 12 x 3 replicate
    deviations; their relative SEs (~sqrt(2/df)) are ~9% and ~5%, so the
    20% and 15% tolerances are > 2 SE in sigma units (sqrt halves the
    relative error) plus the small planted-vs-realized gap; the sim is
    deterministic (hashed draws), so the figures are fixed.
    """
    p = SimParams(seed=6, sigma_form=0.1, sigma_salt=0.05)
    trials = bc.graded(ITEMS[:24], scales=("0-10", "0-100"), salts=4)
    opts, per = bc.frames_readout(trials, SimEngine(p).readout(trials))
    forms = stance.per_form(stance.graded_trials(opts, per, "readout"))
    pooled = stance.pooled_incoherence(stance.incoherence(forms))
    assert pooled.sigma_repeat == pytest.approx(0.05, rel=0.15)
    # the unsalted form value carries its own context draw too, so the between-form spread beyond the
    # repeat noise is the planted scatter
    assert pooled.sigma_repro == pytest.approx(0.1, rel=0.2)
    assert pooled.sigma_tot == pytest.approx(math.hypot(0.1, 0.05), rel=0.2)


def test_salt_invariance_by_hand():
    # item a: form 1 keeps its mode (0.2) under both salts, form 2 does not (0.4 -> 0.6); item b (two forms)
    # keeps both. Salted theta (mean of replicates 1..2) vs unsalted (replicate 0) over three items.
    rows = []
    for item, forms in {
        "a": [(0.2, 0.2, 0.2), (0.4, 0.6, 0.4)],
        "b": [(-0.5, -0.5, -0.5), (-0.3, -0.3, -0.3)],
        "c": [(0.9, 0.8, 0.7), (0.5, 0.5, 0.5)],
    }.items():
        for k, values in enumerate(forms):
            for rep, v in enumerate(values):
                rows.append(
                    {
                        "item_id": item,
                        "replicate": rep,
                        "scale": "0-10",
                        "wording": f"w{k}",
                        "anchor": "ascending",
                        "pole": "action",
                        "bipolar": False,
                        "mode_x": v,
                        "mean_x": v,
                    }
                )
    inv = stance.salt_invariance(pd.DataFrame(rows))
    assert inv.invariant == pytest.approx(4 / 6) and inv.n_forms == 6
    unsalted = [0.3, -0.4, 0.7]
    salted = [(0.2 + 0.5) / 2, -0.4, (0.75 + 0.5) / 2]
    assert inv.r_theta == pytest.approx(stats.pearsonr(salted, unsalted).statistic)
    with pytest.raises(ValueError, match="salted replicates"):
        stance.salt_invariance(pd.DataFrame(rows).query("replicate == 0"))


def test_salt_invariance_on_the_sim():
    """No salt noise planted: every form invariant and r = 1; with salt noise the greedy rating moves somewhere."""
    trials = bc.graded(ITEMS[:8], scales=("0-10",), salts=3)
    quiet = SimEngine(SimParams(seed=4, sigma_form=0.2))
    opts, per = bc.frames_readout(trials, quiet.readout(trials))
    inv = stance.salt_invariance(stance.graded_trials(opts, per, "readout"))
    assert inv.invariant == 1.0 and inv.r_theta == pytest.approx(1.0)
    noisy = SimEngine(SimParams(seed=4, sigma_form=0.2, sigma_salt=0.1))
    opts, per = bc.frames_readout(trials, noisy.readout(trials))
    inv = stance.salt_invariance(stance.graded_trials(opts, per, "readout"))
    assert inv.invariant < 1.0 and 0.9 < inv.r_theta < 1.0


def test_choice_forms_incoherence_and_order_bias_by_hand():
    # item a, two framings x two orders, 2 replies per form (replicate 0). Values p_pro - p_anti per reply:
    # f1 cbr_first (1, 1) -> 1, var 0; f1 anti_first (1, -1) -> 0, var_mean = 2 / 2 = 1;
    # f2 cbr_first (1, 0) -> 0.5, var_mean = 0.5 / 2; f2 anti_first (-1, -1) -> -1, var 0
    replies = {("f1", "cbr_first"): [(1, 0), (1, 0)], ("f1", "anti_first"): [(1, 0), (0, 1)],
               ("f2", "cbr_first"): [(1, 0), (0, 0)], ("f2", "anti_first"): [(0, 1), (0, 1)]}  # fmt: skip
    rows = [
        {"item_id": "a", "framing": fr, "order": o, "replicate": 0, "trial_id": f"{fr}{o}", "p_pro": p, "p_anti": q}
        for (fr, o), rs in replies.items()
        for p, q in rs
    ]
    forms = stance.choice_forms(pd.DataFrame(rows))
    assert forms.set_index(["framing", "order"])["x"].to_dict() == pytest.approx(
        {("f1", "anti_first"): 0.0, ("f1", "cbr_first"): 1.0, ("f2", "anti_first"): -1.0, ("f2", "cbr_first"): 0.5}
    )
    inc = stance.choice_incoherence(forms).loc["a"]
    x = np.array([1.0, 0.0, 0.5, -1.0])
    noise = (0 + 1 + 0.25 + 0) / 4
    assert inc["stance"] == pytest.approx(x.mean())
    assert inc["sigma_repro"] == pytest.approx(math.sqrt(np.var(x, ddof=1) - noise))
    # order: stance with CBR first (1 + 0.5) / 2 minus with ANTI first (0 - 1) / 2, halved
    assert inc["order"] == pytest.approx((0.75 - (-0.5)) / 2)
    with pytest.raises(ValueError, match="lack the columns"):
        stance.choice_forms(pd.DataFrame(rows).drop(columns="framing"))


def test_choice_order_bias_recovered_on_the_sim():
    """Planted m_choice_order shows as the I-2 order bias with its sign; readout-free, greedy: no sampling noise."""
    from experiments.judge import RuleJudge

    trials = bc.choice(ITEMS[:12], framings=("choose", "what_would"))
    e = SimEngine(SimParams(seed=5, s_choice=0.3, m_choice_order=-0.3))
    samples = e.sample(trials, 1, 0.0)
    j = RuleJudge(think=False).judge(trials, samples)
    meta = pd.DataFrame([{"trial_id": t.trial_id, "item_id": t.item_id, "replicate": t.replicate, **t.factors}
                         for t in trials])  # fmt: skip
    inc = stance.choice_incoherence(stance.choice_forms(j.merge(meta, on="trial_id")))
    assert float(inc["order"].mean()) < -0.1  # toward the last-printed course
    assert inc["sigma_repro"].notna().all()
