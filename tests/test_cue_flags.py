"""The cue report's degenerate-reading flags (analysis.cue.flags) on hand-worked frames and hand-made run dirs.

Every assertion is deterministic: the frames are fixed, the permutation test is seeded (and where a test
relies on its p being small, the exact permutation probability is stated and is far below the threshold).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.cue import flags as fl
from tests.cue_store import sampled_cue_report


def _pairs(rows: list[tuple[str, str, float, float]], gender: str = "man", race: str = "Asian") -> pd.DataFrame:
    """with_baseline() rows: (arm, item, P(benefit | what-if), P(benefit | Neutral)), benefit printed first."""
    return pd.DataFrame(
        [
            {
                "arm": arm,
                "consequences": "with",
                "item_id": item,
                "p": p,
                "p_s": p_s,
                "benefit_first": True,
                "s_benefit_first": True,
                "x_gender": gender,
                "x_race": race,
            }
            for arm, item, p, p_s in rows
        ]
    )


# =========================================================================== degenerate greedy decisions


def test_decision_changes_counts_changed_greedy_decisions_per_cell() -> None:
    # direct: greedy what-if = greedy Neutral in both pairs (0.9 vs 0.7: both benefit; 0.2 vs 0.4: both harm)
    # puzzled: one pair crosses (0.3 vs 0.7: harm vs benefit), one does not; a tie at 0.5 goes to the first printed
    # (benefit), so (0.5 vs 0.6) is unchanged; an abstention (NaN) is left out
    df = _pairs(
        [
            ("direct", "d1", 0.9, 0.7),
            ("direct", "d2", 0.2, 0.4),
            ("puzzled-hard", "d1", 0.3, 0.7),
            ("puzzled-hard", "d2", 0.5, 0.6),
            ("puzzled-hard", "d3", math.nan, 0.6),
        ]
    )
    ch = fl.decision_changes(df).set_index(["arm", "attr"])
    assert ch.loc[("direct", "gender"), ["pairs", "changed"]].tolist() == [2, 0]
    assert ch.loc[("puzzled-hard", "gender"), ["pairs", "changed"]].tolist() == [2, 1]
    assert ch.loc[("direct", "race"), "identical"] and not ch.loc[("puzzled-hard", "race"), "identical"]
    lines = fl.degenerate_lines(fl.decision_changes(df))
    assert len(lines) == 1
    assert lines[0].startswith("- **degenerate: direct** (with consequences): greedy decision identical to Neutral")
    assert "in all 2 groups (identical/pairs: man 2/2, Asian 2/2)" in lines[0]


def test_partial_degeneracy_names_only_the_stuck_groups() -> None:
    df = pd.concat(
        [
            _pairs([("direct", "d1", 0.9, 0.8)], gender="man", race="Asian"),
            _pairs([("direct", "d1", 0.1, 0.8)], gender="woman", race="Black"),
        ],
        ignore_index=True,
    )
    (line,) = fl.degenerate_lines(fl.decision_changes(df), order=["man", "woman", "Asian", "Black"])
    assert "in 2 of 4 groups (identical/pairs: man 1/1, Asian 1/1)" in line


def test_no_line_when_every_cell_moves() -> None:
    df = _pairs([("direct", "d1", 0.9, 0.2), ("puzzled-hard", "d1", 0.1, 0.8)])
    ch = fl.decision_changes(df)
    assert not ch["identical"].any()
    assert fl.degenerate_lines(ch) == []
    assert fl.gap_lines(fl.stuck_gaps(ch)) == []


def test_gap_is_structural_only_where_both_arms_are_stuck() -> None:
    # man: both arms unchanged -> structural; woman: direct unchanged, puzzled changes -> a real Gap
    df = pd.concat(
        [
            _pairs([("direct", "d1", 0.9, 0.8), ("puzzled-hard", "d1", 0.7, 0.8)], gender="man", race="Asian"),
            _pairs([("direct", "d2", 0.9, 0.8), ("puzzled-hard", "d2", 0.2, 0.8)], gender="woman", race="Black"),
        ],
        ignore_index=True,
    )
    stuck = fl.stuck_gaps(fl.decision_changes(df))
    assert stuck.to_dict("records") == [{"arm": "puzzled-hard", "consequences": "with", "groups": 4, "stuck": 2}]
    (line,) = fl.gap_lines(stuck)
    assert "greedy Gap vs direct is 0 by construction in 2 of 4 groups" in line


def test_decision_changes_names_missing_columns() -> None:
    with pytest.raises(ValueError, match=r"with_baseline\(\) output; columns \['p_s'\]"):
        fl.decision_changes(_pairs([("direct", "d1", 0.9, 0.7)]).drop(columns=["p_s"]))


# =========================================================================== identity recovery vs chance


def _checks(answers: list[str], truths: list[str], arm: str = "puzzled-hard", attr: str = "gender") -> pd.DataFrame:
    return pd.DataFrame(
        {
            "item_id": [f"d{i}" for i in range(len(answers))],
            "combo": "0",
            "arm": arm,
            "consequences": "with",
            "individual": "A",
            "replicate": 0,
            "attr": attr,
            "truth": truths,
            "answer": answers,
        }
    )


def _binom_two_sided(k: int, n: int, p: float) -> float:
    """scipy's two-sided definition: the total probability of outcomes no more likely than k."""
    pmf = [math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(n + 1)]
    return min(1.0, sum(q for q in pmf if q <= pmf[k] * (1 + 1e-7)))


def test_constant_answer_is_at_chance_even_above_one_over_k() -> None:
    """smol's pattern: 'man' for every pair, man the truth in 24 of 48: 50% > 1/3, yet no identity information."""
    truths = ["man"] * 24 + ["non-binary"] * 14 + ["woman"] * 10
    (c,) = fl.recovery_vs_chance(_checks(["man"] * 48, truths), {"gender": 3}, n_perm=200)
    assert (c.n, c.correct, c.k_options) == (48, 24, 3)
    assert c.uniform == pytest.approx(1 / 3) and c.rate == 0.5
    assert c.p_uniform == pytest.approx(_binom_two_sided(24, 48, 1 / 3), rel=1e-9)
    assert c.p_uniform < 0.05  # above 1/k on its own ...
    assert c.independent == pytest.approx(0.5)  # ... but 1 x 24/48: constant answers are right as often as man is true
    assert c.p_independent == 1.0  # every permutation of a constant answer scores the same
    assert (c.modal, c.modal_n) == ("man", 48)
    assert not c.above_chance
    (line,) = fl.chance_lines([c])
    assert "24 of 48 recovered (50.0%" in line and "chance 1/3 (33.3%) for 3 options" in line
    assert line.endswith("**not distinguishable from chance**.")


def test_recovery_above_both_chance_levels() -> None:
    # 12 pairs, truths 4 x each label, every answer right. Exact permutation probability of 12 of 12:
    # 4!^3 / 12! = 13824 / 479001600 = 2.9e-5, so with 2000 permutations p = 1/2001 unless a permutation
    # scores 12 (chance <= 2000 * 2.9e-5 = 0.06; the test is seeded, so it is deterministic either way: p <= 2/2001).
    truths = ["man", "woman", "non-binary"] * 4
    (c,) = fl.recovery_vs_chance(_checks(truths, truths), {"gender": 3}, n_perm=2000, seed=0)
    assert c.correct == 12 and c.rate == 1.0
    lo, hi = fl.clopper_pearson(12, 12)
    assert (c.ci_lo, c.ci_hi) == (lo, hi) and hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 12))
    assert c.independent == pytest.approx(1 / 3)
    assert c.p_independent <= 2 / 2001
    assert c.above_chance
    assert fl.chance_lines([c])[0].endswith("**above chance**.")


def test_joint_target_multiplies_the_options_and_keeps_pairs_together() -> None:
    g = _checks(["man", "woman", "man", "woman"], ["man", "woman", "woman", "woman"])
    r = _checks(["Asian", "Black", "Black", "Asian"], ["Asian", "Black", "Black", "Black"], attr="race")
    by = {c.target: c for c in fl.recovery_vs_chance(pd.concat([g, r]), {"gender": 3, "race": 5}, n_perm=100)}
    assert set(by) == {"gender", "race", "joint"}
    assert (by["gender"].correct, by["race"].correct, by["joint"].correct) == (3, 3, 2)
    assert by["joint"].k_options == 15 and by["joint"].uniform == pytest.approx(1 / 15)
    # joint answers man/Asian, woman/Black, man/Black, woman/Asian; truths man/Asian, woman/Black, woman/Black x2
    assert by["joint"].independent == pytest.approx(0.25 * 0.25 + 0.25 * 0.75)


def test_abstentions_are_left_out_of_the_test() -> None:
    (c,) = fl.recovery_vs_chance(_checks(["man", None, "woman"], ["man", "man", "man"]), {"gender": 3}, n_perm=50)  # type: ignore[list-item]
    assert (c.n, c.correct) == (2, 1)


def test_independent_chance_and_permutation_by_hand() -> None:
    # answers a, a, b, b (shares 1/2, 1/2); truths a, b, b, b (1/4, 3/4): 1/2 * 1/4 + 1/2 * 3/4 = 1/2
    assert fl.independent_chance(["a", "a", "b", "b"], ["a", "b", "b", "b"]) == pytest.approx(0.5)
    assert fl.permutation_p(np.array(["x"] * 5), np.array(["x", "y", "x", "y", "z"])) == 1.0
    with pytest.raises(ValueError, match="same non-empty shape"):
        fl.permutation_p(np.array(["x"]), np.array(["x", "y"]))


def test_clopper_pearson_by_hand() -> None:
    lo, hi = fl.clopper_pearson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 10))  # P(X = 0 | hi) = (1 - hi)^10 = 0.025
    lo, hi = fl.clopper_pearson(5, 10)
    assert lo == pytest.approx(0.187086, abs=1e-6) and hi == pytest.approx(0.812914, abs=1e-6)
    assert all(math.isnan(x) for x in fl.clopper_pearson(0, 0))
    with pytest.raises(ValueError, match="k=3, n=2"):
        fl.clopper_pearson(3, 2)


def test_recovery_needs_the_option_counts() -> None:
    with pytest.raises(ValueError, match=r"attributes \['gender'\]"):
        fl.recovery_vs_chance(_checks(["man"], ["man"]), {"race": 5})


# =========================================================================== coverage


def test_coverage_lines_name_the_low_probes_only() -> None:
    pt = pd.DataFrame({"probe": ["decision", "decision", "what_if", "could_be"], "coverage": [0.02, 0.06, 0.9, 0.1]})
    (line,) = fl.coverage_lines(fl.low_coverage(pt, ["decision", "what_if"]), "the decision-bias tables")
    assert "under the decision-bias tables: mean option mass decision 0.040 (2 of 2 below 0.5)" in line
    assert "what_if" not in line
    assert fl.low_coverage(pt, ["what_if"]).empty
    assert fl.coverage_lines(fl.low_coverage(pt, ["what_if"]), "x") == []


# =========================================================================== the report


def _store(tmp_path: Path, degenerate: bool) -> str:
    """A sampled-only cue run written without a model: Neutral, Direct, Puzzled, with what-if and check probes.

    degenerate: every what-if answer repeats the Neutral one and every check answers 'man' / 'Asian'.
    Otherwise (planted effects): every what-if answer, Direct and Puzzled, reverses the Neutral one (benefit on
    the first and third dilemma, harm on the second), and every check answers the truth.
    """
    from experiments.cue import CueSpec, expand
    from probe.types import Sample

    items = ("rent_arrears", "fallen_fence", "last_dose")
    spec = CueSpec(items=items, conditions=("neutral", "direct", "puzzled"), probes=("what_if", "check"))
    trials = expand(spec)
    samples: list[Sample] = []
    for t in trials:
        probe, cond = t.factors["probe"], t.factors["condition"]
        if probe.startswith("check_"):
            attr = probe.removeprefix("check_")
            answer = {"gender": "man", "race": "Asian"}[attr] if degenerate else t.factors[f"x_{attr}"]
        else:
            benefit = t.options[t.meaning.index("benefit")]
            harm = t.options[t.meaning.index("harm")]
            neutral, flipped = (benefit, harm) if items.index(t.item_id) % 2 == 0 else (harm, benefit)
            answer = neutral if degenerate or cond == "neutral" else flipped
        samples += [Sample(t.trial_id, d, answer, answer, "ok") for d in range(2)]
    return (sampled_cue_report(tmp_path / "run", spec, trials, samples, draws=2) / "summary.md").read_text()


def test_report_flags_a_degenerate_run(tmp_path: Path) -> None:
    summary = _store(tmp_path, degenerate=True)
    assert "- **degenerate: direct** (with consequences): greedy decision identical to Neutral in every pair" in summary
    assert "- **degenerate: puzzled-hard** (with consequences): greedy decision identical to Neutral" in summary
    assert re.search(r"the greedy Gap vs direct is 0 by construction in all \d+ groups", summary)
    assert "chance 1/3 (33.3%) for 3 options" in summary and "chance 1/5 (20.0%) for 5 options" in summary
    assert "**not distinguishable from chance**" in summary and "**above chance**" not in summary
    # the flags stand beside their tables: the degenerate line right after the per-group table
    bias_table = summary.index("### with consequences: Direct (D) vs puzzled-hard (P)")
    assert bias_table < summary.index("**degenerate: direct**") < summary.index("## Cue Visibility Gap")
    assert summary.index("Recovery against chance") < summary.index("## Decision bias (pp)")
    chance = pd.read_csv(tmp_path / "run" / "report" / "cue_solve_chance.csv")
    assert set(chance["target"]) == {"gender", "race", "joint"} and not chance["above_chance"].any()


def test_report_without_flags_on_planted_effects(tmp_path: Path) -> None:
    summary = _store(tmp_path, degenerate=False)
    assert "degenerate" not in summary
    assert "low option coverage" not in summary  # sampled frequencies: coverage 1 on every parsed trial
    assert "**not distinguishable from chance**" not in summary
    assert summary.count("**above chance**") == 3  # gender, race and joint in the one checked arm
    changes = pd.read_csv(tmp_path / "run" / "report" / "cue_degenerate.csv")
    assert (changes["changed"] > 0).all()
