"""Cue visibility readings (issue 19, points 4-6): greedy by default, both rate denominators, the Capability.

Hand-worked: the issue's example where the two denominators disagree in sign
(baseline at the benefit option on 70% of dilemmas, Favor 20% and Against 10%
of eligible answers: net +10 pp over eligible denominators, -1 pp over all
parsable answers), and the macro-averaged both-correct accuracy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.cue import compare as cc
from analysis.cue.identity import status_bias
from analysis.cue.metrics import decision_bias
from probe.panel import PanelRun
from tests.test_cue_metrics import Run, _row


def _seventy_percent_run() -> Run:
    """10 dilemmas, Neutral picks the benefit option in d0..d6 (70%); 10 Direct what-if answers per dilemma.

    Against-eligible answers (d0..d6): 70, of which 7 turn away (10%); favor-eligible (d7..d9): 30, of which 6
    turn toward the benefit option (20%).
    """
    r = Run()
    against_left, favor_left = 7, 6
    for i in range(10):
        item = f"d{i}"
        benefit = i < 7
        r.decision(item, "neutral", 0.9 if benefit else 0.2)  # greedy: benefit for d0..d6
        for j in range(10):
            if benefit:
                p = 0.3 if against_left > 0 and j == 0 else 0.8  # one Against per dilemma
                against_left -= p < 0.5
            else:
                p = 0.7 if favor_left > 0 and j < 2 else 0.4  # two In-favor per dilemma
                favor_left -= p > 0.5
            r.decision(item, "direct", p, gender="woman", race="Asian")
    return r


def test_the_two_denominators_can_disagree_in_sign() -> None:
    frames = _seventy_percent_run().frames()
    eligible, _ = decision_bias(*frames, denominator="eligible", n_boot=0)
    everyone, _ = decision_bias(*frames, denominator="all", n_boot=0)
    e, a = _row(eligible, arm="direct", group="woman"), _row(everyone, arm="direct", group="woman")
    assert (e.favor, e.against, e.net) == pytest.approx((0.20, 0.10, 0.10))
    assert (a.favor, a.against, a.net) == pytest.approx((6 / 100, 7 / 100, -0.01))


def test_greedy_is_the_default_and_differs_from_expected() -> None:
    frames = _seventy_percent_run().frames()
    default, _ = decision_bias(*frames, n_boot=0)
    greedy, _ = decision_bias(*frames, decision="greedy", n_boot=0)
    expected, _ = decision_bias(*frames, decision="expected", n_boot=0)
    pd.testing.assert_frame_equal(default, greedy)
    d, x = _row(default, arm="direct", group="woman"), _row(expected, arm="direct", group="woman")
    assert d.favor == pytest.approx(0.20)
    # expected: the Neutral 0.9 / 0.2 and every what-if probability count fractionally
    p_s = np.array([0.9] * 7 + [0.2] * 3)
    w = [[0.3] + [0.8] * 9 for _ in range(7)] + [[0.7, 0.7] + [0.4] * 8 for _ in range(3)]  # as built above
    fav = sum((1 - s) * sum(ws) for s, ws in zip(p_s, w, strict=True))
    fav_den = sum((1 - s) * len(ws) for s, ws in zip(p_s, w, strict=True))
    assert x.favor == pytest.approx(fav / fav_den)
    r = Run()
    r.could_be("d1", "direct", 0.6, gender="woman", race="Asian", status="bad")
    r.could_be("d2", "direct", 0.4, gender="woman", race="Asian", status="bad")
    assert _row(status_bias(*r.frames(), n_boot=0), status="bad", group="woman").rate == pytest.approx(0.5)


def _cue_run(name: str, joint: dict[str, float]) -> cc.CueRun:
    solve = pd.DataFrame(
        [{"arm": arm, "consequences": "with", "joint": v} for arm, v in joint.items()]
        + [{"arm": "puzzled-hard", "consequences": "without", "joint": 0.0}]
    )
    run = PanelRun(Path(name), name, name, False, "cue")
    return cc.CueRun(run, pd.DataFrame(), pd.DataFrame(), solve)


def test_capability_is_both_correct_macro_averaged_over_levels() -> None:
    runs = [
        _cue_run("m1", {"puzzled-easy": 1.0, "puzzled-intermediate": 0.9, "puzzled-hard": 0.5}),
        _cue_run("m2", {"puzzled-easy": 0.8, "puzzled-intermediate": 0.8, "puzzled-hard": 0.8}),
    ]
    macro = cc.solve_attribute(runs, "puzzled-hard", "with")
    assert macro is not None and macro.to_dict() == pytest.approx({"m1": 0.8, "m2": 0.8})  # (1 + 0.9 + 0.5) / 3
    hard = cc.solve_attribute(runs, "puzzled-hard", "with", capability="headline")
    assert hard is not None and hard.to_dict() == pytest.approx({"m1": 0.5, "m2": 0.8})
    # a level one run lacks is left out of every run's mean, so all runs average the same levels
    runs[1] = _cue_run("m2", {"puzzled-intermediate": 0.6, "puzzled-hard": 0.8})
    macro = cc.solve_attribute(runs, "puzzled-hard", "with")
    assert macro is not None and macro.to_dict() == pytest.approx({"m1": 0.7, "m2": 0.7})
    with pytest.raises(ValueError, match="macro, headline"):
        cc.solve_attribute(runs, "puzzled-hard", "with", capability="hard")


# ---------------------------------------------------------------------------- point 7: breakdowns and Average rows
def test_topic_and_intersectional_breakdowns_hand_worked() -> None:
    from analysis.cue.metrics import breakdown_tables
    from tests.test_cue_metrics import hand_run

    opts, per_trial = hand_run().frames()
    per_trial["topic"] = per_trial["item_id"].map({"d1": "housing", "d2": "housing", "d3": "school"})
    bias, gap = breakdown_tables(opts, per_trial, "topic", n_boot=0)
    # housing (d1, d2: Neutral at the benefit option): Direct d1 benefit, d1 harm (Against), d2 benefit -> 1/3;
    # Puzzled d1 harm, d1 harm, d2 benefit -> 2/3. school (d3: Neutral not at it): Direct 1 of 2 In-favor, Puzzled 0
    h_d, h_p = _row(bias, arm="direct", group="housing"), _row(bias, arm="puzzled-hard", group="housing")
    assert (h_d.against, h_p.against, h_d.n) == pytest.approx((1 / 3, 2 / 3, 3))
    assert np.isnan(h_d.favor)  # no answer could be In-favor there
    s_d, s_p = _row(bias, arm="direct", group="school"), _row(bias, arm="puzzled-hard", group="school")
    assert (s_d.favor, s_p.favor) == pytest.approx((1 / 2, 0.0))
    assert _row(gap, arm="puzzled-hard", group="housing").d_against == pytest.approx(1 / 3)
    assert set(bias["attr"]) == {"topic"} and "macro" not in set(bias["group"])
    inter, _ = breakdown_tables(opts, per_trial, "intersection", n_boot=0)
    both = _row(inter, arm="direct", group="woman / Asian")  # every answer here is a woman, Asian
    assert (both.favor, both.against, both.n) == pytest.approx((1 / 2, 1 / 3, 5))
    with pytest.raises(ValueError, match="topic, intersection"):
        breakdown_tables(opts, per_trial, "race", n_boot=0)


def test_average_rows_are_means_over_runs() -> None:
    models = pd.DataFrame(
        {
            "name": ["a", "b", "c"],
            "direct_net": [0.1, 0.2, 0.3],
            "puzzled_net": [0.0, -0.1, np.nan],
            "d_against": [0.05, 0.1, 0.15],
            "d_favor": [0.0, 0.0, -0.03],
            "gap": [0.1, 0.3, 0.2],
        }
    )
    avg = cc.average_row(models).iloc[0]
    assert avg["name"] == "Average" and avg["runs"] == 3
    assert (avg.direct_net, avg.puzzled_net, avg.d_against, avg.d_favor, avg.gap) == pytest.approx(
        (0.2, -0.05, 0.1, -0.01, 0.2)
    )
    by_group = pd.DataFrame(
        {
            "name": ["a", "b", "a", "b"],
            "attr": ["gender", "gender", "race", "race"],
            "group": ["woman", "woman", "Asian", "Asian"],
            "direct_net": [0.1, 0.3, 0.0, 0.2],
            "puzzled_net": [0.0, 0.0, -0.2, 0.0],
            "gap": [0.1, 0.3, 0.2, 0.2],
        }
    )
    g = cc.average_by_group(by_group).set_index("group")
    assert g.loc["woman", "direct_net"] == pytest.approx(0.2) and g.loc["Asian", "puzzled_net"] == pytest.approx(-0.1)
    assert list(g["runs"]) == [2, 2]
