"""The honesty checks of every report (analysis/common/checks.py) and the guards on fits and correlations, on small frames."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest


def test_casing_fixes_name_the_models_spelling_only_where_it_outweighs_the_option():
    from analysis.common.checks import casing_fixes

    top = [("Yes", 0.45), (" No", 0.18), ("It", 0.07)]
    assert casing_fixes(["yes", "no"], top) == {"yes": "Yes", "no": "No"}
    assert casing_fixes(["Yes", "No"], top) == {}
    assert casing_fixes(["yes", "no"], top, {"yes": 0.6, "no": 0.01}) == {"no": "No"}


def test_coverage_warning_names_the_mass_the_tokens_and_the_fix():
    from analysis.common.checks import coverage_warning

    w = coverage_warning(0.0081, ["yes", "no"], [("Yes", 0.4542), ("No", 0.1848), ("It", 0.0668)])
    assert w.startswith("warning: the options hold 0.8% of the answer-slot mass (coverage 0.0081)")
    assert "'Yes' 0.4542" in w and w.endswith("pass --options Yes,No")
    assert coverage_warning(0.64, ["Yes", "No"], [("It", 0.07)]) == ""
    low = coverage_warning(0.2, ["A", "B"], [("The", 0.5)])
    assert "normalized over the options" in low and "pass --options" not in low
    assert coverage_warning(0.1, ["yes", "no"], [("Yes", 0.5)], sep="|").endswith("pass --options Yes|no")


def test_run_coverage_counts_low_trials_off_tokens_and_casing():
    from analysis.common.checks import run_coverage

    per = pd.DataFrame(
        {
            "trial_id": ["a", "b", "c"],
            "coverage": [0.9, 0.2, 0.1],
            "top_other": [
                json.dumps([["It", 0.05]]),
                json.dumps([["Yes", 0.6], ["It", 0.1]]),
                json.dumps([["The", 0.5]]),
            ],
        }
    )
    opts = {"a": ("A", "B"), "b": ("yes", "no"), "c": ("0", "1")}
    cov = run_coverage(per, opts)
    assert (cov.n_trials, cov.n_low) == (3, 2) and cov.mean == pytest.approx(0.4)
    assert cov.off_tokens[0] == ("Yes", pytest.approx(0.2)) and dict(cov.off_tokens)["It"] == pytest.approx(0.05)
    assert cov.casing == (("yes", "Yes", 1),)
    w = cov.warning()
    assert "2 of 3 readouts have option coverage below 0.5" in w and "'Yes' for option 'yes' in 1 trials" in w
    mass = pd.DataFrame({"trial_id": ["b", "b"], "option": ["yes", "no"], "logprob": [math.log(0.7), math.log(0.1)]})
    assert run_coverage(per, opts, mass).casing == ()  # 'yes' itself holds more than 'Yes'
    assert run_coverage(per.iloc[:1], opts).warning() == ""


def test_coverage_tables_per_instrument_and_item():
    from analysis.common.checks import coverage_tables

    per = pd.DataFrame(
        {
            "item_id": ["x", "x", "y", "y"],
            "instrument": ["graded", "binary", "graded", "binary"],
            "coverage": [0.9, 0.1, 0.7, 0.3],
        }
    )
    by_inst, by_item = coverage_tables(per)
    assert by_inst.loc["binary", "mean"] == pytest.approx(0.2) and by_inst.loc["binary", "n_low"] == 2
    assert by_item.loc[("graded", "y"), "min"] == pytest.approx(0.7)
    assert list(coverage_tables(per.drop(columns="instrument"))[0].index) == ["all"]


def test_truncation_is_counted_per_instrument():
    from analysis.common.checks import truncation_table

    replies = pd.DataFrame({"trial_id": ["a", "a", "b"], "truncated": [True, False, True]})
    meta = pd.DataFrame({"trial_id": ["a", "b"], "instrument": ["choice", "binary"]})
    t = truncation_table(replies, meta)
    assert t.loc["choice", "replies"] == 2 and t.loc["choice", "truncated"] == 1 and t.loc["binary", "share"] == 1.0
    assert truncation_table(replies.drop(columns="truncated"), meta).empty  # runs from before the column


def test_checks_section_states_the_system_prompt_and_the_sampling_flag():
    from analysis.common.checks import checks_section
    from probe.record import Manifest

    manifest = Manifest.from_dict(
        {
            "engine": {
                "system_prompt": {"text": "Be kind.", "source": "chat template default"},
                "settings": {"max_new_tokens": 32},
            },
            "experiment": "battery",
            "plan": {"temperature": 1.0},
            "spec": {"experiment": "battery", "choice_tokens": 256},  # the battery's own cap of free replies
        }
    )
    samples = pd.DataFrame(
        {"trial_id": [f"t{i // 2}" for i in range(12)], "text": ["Yes"] * 12, "truncated": [False] * 12}
    )
    gens = pd.DataFrame({"trial_id": ["g"], "text": ["..."], "truncated": [True]})
    meta = pd.DataFrame({"trial_id": [*(f"t{i}" for i in range(6)), "g"], "instrument": ["binary"] * 6 + ["choice"]})
    lines, tables = checks_section(manifest, pd.DataFrame(), meta, samples, gens, {})
    text = "\n".join(lines)
    assert "system prompt (chat template default): 'Be kind.'" in text
    assert "sampled answers that hit the token cap (32 tokens): binary 0 of 12" in text
    assert "generated replies that hit the token cap (256 tokens): choice 1 of 1" in text
    assert "the server may not be sampling: every one of the 6 trials drew the same reply 2 times" in text
    assert set(tables) == {"truncated_sampled", "truncated_generated"}


def test_correlations_need_items_and_spread():
    from analysis.battery.stance import correlation_blocker

    idx = [f"i{k}" for k in range(6)]
    theta = pd.Series(np.linspace(-0.5, 0.5, 6), index=idx)
    assert correlation_blocker(theta, theta * 2) == ""
    assert (
        correlation_blocker(theta.iloc[:3], theta.iloc[:3]) == "only 3 items in both (a correlation needs at least 5)"
    )
    flat = pd.Series([0.001, 0.002, 0.0, 0.004, 0.003, 0.002], index=idx)
    assert correlation_blocker(flat, theta, ("theta", "z")).startswith("theta spans 0.004 across the 6 items (< 0.05)")


def test_sm_fit_without_theta_spread_is_unidentified_though_not_clip_limited():
    from scipy.special import expit

    from analysis.battery.channel_fit import fit_channel

    rng = np.random.default_rng(0)
    idx = [f"i{k}" for k in range(10)]
    flat = pd.Series(rng.uniform(-0.002, 0.002, 10), index=idx)
    sides = pd.DataFrame(
        {"p_plus": 0.6 + rng.normal(0, 0.01, 10), "p_minus": 0.4 + rng.normal(0, 0.01, 10), "z": 0.0}, index=idx
    )
    f = fit_channel(flat, sides, n_boot=200)
    assert not f.clip_limited
    assert f.unidentified.startswith("theta spans 0.004 over the items (< 0.1): only m/s is identified")
    spread = pd.Series(np.linspace(-0.8, 0.8, 10), index=idx)
    clean = pd.DataFrame({"p_plus": expit((spread + 0.1) / 0.3), "p_minus": expit((spread - 0.1) / 0.3), "z": 0.0})
    g = fit_channel(spread, clean.set_index(spread.index), n_boot=200)
    assert g.unidentified == "" and g.s == pytest.approx(0.3, abs=1e-4)
