"""Cue-visibility metrics (analysis.cue.metrics) on hand-worked examples and independent computations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from analysis.cue.across_models import sign_test, sign_tests, stack_models
from analysis.cue.cell_stats import cell_sums, cluster_bootstrap
from analysis.cue.decisions import by_group, decision_frame, greedy_is, with_baseline
from analysis.cue.identity import check_frame, correct_only_keep, solve_rates, status_bias
from analysis.cue.metrics import decision_bias

GENDERS = ("man", "woman", "non-binary")
RACES = ("Asian", "Black", "Hispanic", "Muslim", "White")


class Run:
    """Builds the (options, per_trial) frames that probe.runs.Run.choice_probs returns."""

    def __init__(self) -> None:
        self.opts: list[dict] = []
        self.trials: list[dict] = []

    def _trial(self, item: str, condition: str, probe: str, **f: object) -> str:
        tid = f"t{len(self.trials)}"
        row = {
            "trial_id": tid,
            "item_id": item,
            "replicate": f.pop("rep", 0),
            "condition": condition,
            "probe": probe,
            "consequences": f.pop("cons", "with"),
            "difficulty": f.pop("level", ""),
            "combo": f.pop("combo", "" if condition == "neutral" else "0"),
            "individual": f.pop("who", ""),
            "x_gender": f.pop("gender", ""),
            "x_race": f.pop("race", ""),
            "status": f.pop("status", ""),
            "coverage": 1.0,
        }
        assert not f, f
        self.trials.append(row)
        return tid

    def decision(self, item: str, condition: str, p: float, *, benefit_first: bool = True, **f: object) -> None:
        probe = "decision" if condition == "neutral" else "what_if"
        tid = self._trial(item, condition, probe, **f)
        means = ("benefit", "harm") if benefit_first else ("harm", "benefit")
        probs = (p, 1 - p) if benefit_first else (1 - p, p)
        for i, (o, m, q) in enumerate(zip(("1", "2"), means, probs, strict=True)):
            self.opts.append({"trial_id": tid, "option": o, "prob": q, "meaning": m, "option_index": i})

    def could_be(self, item: str, condition: str, p_yes: float, **f: object) -> None:
        tid = self._trial(item, condition, "could_be", **f)
        for i, (o, m, q) in enumerate(zip(("Yes", "No"), ("yes", "no"), (p_yes, 1 - p_yes), strict=True)):
            self.opts.append({"trial_id": tid, "option": o, "prob": q, "meaning": m, "option_index": i})

    def check(self, item: str, condition: str, attr: str, probs: dict[str, float], **f: object) -> None:
        tid = self._trial(item, condition, f"check_{attr}", **f)
        labels = GENDERS if attr == "gender" else RACES
        for i, label in enumerate(labels):
            self.opts.append(
                {"trial_id": tid, "option": label, "prob": probs.get(label, 0.0), "meaning": label, "option_index": i}
            )

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        return pd.DataFrame(self.opts), pd.DataFrame(self.trials)


def _row(table: pd.DataFrame, **key: str) -> pd.Series:
    m = np.ones(len(table), dtype=bool)
    for k, v in key.items():
        m &= (table[k] == v).to_numpy()
    (i,) = np.flatnonzero(m)
    return table.iloc[i]


# =========================================================================== In-favor / Against, hand-worked


def hand_run() -> Run:
    """Three dilemmas; Neutral picks the benefit option in d1 and d2, the other one in d3.

    Direct, woman/Asian: d1 benefit (-), d1 harm (Against), d2 benefit (-), d3 benefit (In-favor), d3 harm (-).
    Puzzled-hard, same people: d1 harm (Against), d1 harm (Against), d2 benefit (-), d3 harm, d3 harm (-).
    """
    r = Run()
    for item, p in (("d1", 1.0), ("d2", 1.0), ("d3", 0.0)):
        r.decision(item, "neutral", p)
    for item, p in (("d1", 1.0), ("d1", 0.0), ("d2", 1.0), ("d3", 1.0), ("d3", 0.0)):
        r.decision(item, "direct", p, gender="woman", race="Asian")
    for item, p in (("d1", 0.0), ("d1", 0.0), ("d2", 1.0), ("d3", 0.0), ("d3", 0.0)):
        r.decision(item, "puzzled", p, level="hard", gender="woman", race="Asian")
    return r


@pytest.mark.parametrize("decision", ["expected", "greedy"])
def test_events_hand_worked_eligible_denominators(decision: str) -> None:
    bias, gap = decision_bias(*hand_run().frames(), decision=decision, n_boot=0)  # type: ignore[arg-type]
    d = _row(bias, arm="direct", attr="gender", group="woman")
    # In-favor possible in the two d3 answers, one happened; Against possible in the three d1/d2 answers, one happened
    assert (d.favor, d.against, d.net) == pytest.approx((1 / 2, 1 / 3, 1 / 2 - 1 / 3))
    assert (d.favor_den, d.against_den, d.n) == (2, 3, 5)
    p = _row(bias, arm="puzzled-hard", attr="race", group="Asian")
    assert (p.favor, p.against, p.net) == pytest.approx((0.0, 2 / 3, -2 / 3))
    g = _row(gap, arm="puzzled-hard", attr="gender", group="woman")
    assert g.d_against == pytest.approx(2 / 3 - 1 / 3)
    assert g.d_favor == pytest.approx(0 - 1 / 2)
    assert g.gap == pytest.approx((1 / 2 - 1 / 3) - (-2 / 3))  # = 5/6 = d_against - d_favor
    macro = _row(gap, arm="puzzled-hard", group="macro")
    assert macro.gap == pytest.approx(5 / 6)  # both groups (woman, Asian) are the same answers here


def test_events_hand_worked_all_denominators() -> None:
    bias, gap = decision_bias(*hand_run().frames(), denominator="all", n_boot=0)
    d = _row(bias, arm="direct", group="woman")
    assert (d.favor, d.against, d.net) == pytest.approx((1 / 5, 1 / 5, 0.0))
    p = _row(bias, arm="puzzled-hard", group="woman")
    assert (p.favor, p.against) == pytest.approx((0.0, 2 / 5))
    assert _row(gap, arm="puzzled-hard", group="woman").gap == pytest.approx(2 / 5)


def test_expected_events_equal_exhaustive_enumeration() -> None:
    """Expected In-favor / Against rates = E[events] / E[eligible] over independent draws, enumerated exactly."""
    neutral = {"d1": 0.8, "d2": 0.25}
    answers = [("d1", 0.3), ("d1", 0.6), ("d2", 0.9)]
    r = Run()
    for item, p in neutral.items():
        r.decision(item, "neutral", p)
    for item, p in answers:
        r.decision(item, "direct", p, gender="man", race="White")
    bias, _ = decision_bias(*r.frames(), decision="expected", n_boot=0)
    got = _row(bias, arm="direct", group="man")

    e = dict.fromkeys(("fav", "fav_den", "ag", "ag_den"), 0.0)
    items = list(neutral)
    for s_out in itertools.product((0, 1), repeat=len(items)):  # 1 = baseline picked the benefit option
        ps = math.prod(neutral[i] if s else 1 - neutral[i] for i, s in zip(items, s_out, strict=True))
        base = dict(zip(items, s_out, strict=True))
        for w_out in itertools.product((0, 1), repeat=len(answers)):
            pw = math.prod(p if w else 1 - p for (_, p), w in zip(answers, w_out, strict=True))
            for (item, _), w in zip(answers, w_out, strict=True):
                s = base[item]
                e["fav"] += ps * pw * (s == 0 and w == 1)
                e["fav_den"] += ps * pw * (s == 0)
                e["ag"] += ps * pw * (s == 1 and w == 0)
                e["ag_den"] += ps * pw * (s == 1)
    assert got.favor == pytest.approx(e["fav"] / e["fav_den"])
    assert got.against == pytest.approx(e["ag"] / e["ag_den"])
    # and by hand: (0.2*0.3 + 0.2*0.6 + 0.75*0.9) / 1.15, (0.8*0.7 + 0.8*0.4 + 0.25*0.1) / 1.85
    assert (got.favor, got.against) == pytest.approx((0.855 / 1.15, 0.905 / 1.85))


def test_greedy_decision_ties_go_to_the_first_printed_option() -> None:
    p = pd.Series([0.7, 0.3, 0.5, 0.5, np.nan])
    first = pd.Series([True, True, True, False, True])
    out = greedy_is(p, first)
    assert out.iloc[:4].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert np.isnan(out.iloc[4])


def test_benefit_printed_second_is_read_from_the_meanings() -> None:
    r = Run()
    r.decision("d1", "neutral", 0.9, benefit_first=False)
    r.decision("d1", "direct", 0.2, benefit_first=False, gender="man", race="Asian")
    df = decision_frame(*r.frames())
    assert df["p"].tolist() == pytest.approx([0.9, 0.2])
    assert df["benefit_first"].tolist() == [False, False]


def test_macro_is_the_mean_over_groups() -> None:
    r = Run()
    r.decision("d1", "neutral", 0.0)
    r.decision("d2", "neutral", 1.0)
    # man/Asian: favor 1 (d1 benefit), against 0 (d2 benefit); woman/Asian: favor 0, against 1
    r.decision("d1", "direct", 1.0, gender="man", race="Asian")
    r.decision("d2", "direct", 1.0, gender="man", race="Asian")
    r.decision("d1", "direct", 0.0, gender="woman", race="Asian")
    r.decision("d2", "direct", 0.0, gender="woman", race="Asian")
    bias, _ = decision_bias(*r.frames(), decision="expected", n_boot=0)
    assert _row(bias, group="man").net == 1.0
    assert _row(bias, group="woman").net == -1.0
    assert _row(bias, group="Asian").net == pytest.approx(0.5 - 0.5)
    m = _row(bias, group="macro")
    assert (m.net, m.favor, m.against) == pytest.approx((0.0, 0.5, 0.5))  # mean over man, woman, Asian
    assert m.n == 4


def test_macro_gap_averages_groups_defined_in_both_arms() -> None:
    r = Run()
    r.decision("d1", "neutral", 0.0)
    r.decision("d2", "neutral", 1.0)
    for item, p, g in (("d1", 1.0, "man"), ("d2", 1.0, "man"), ("d1", 0.0, "woman"), ("d2", 0.0, "woman")):
        r.decision(item, "direct", p, gender=g, race="Asian")  # man +1, woman -1, Asian 0
    r.decision("d1", "puzzled", 0.0, level="hard", gender="man", race="Asian")  # no woman under Puzzled
    r.decision("d2", "puzzled", 0.0, level="hard", gender="man", race="Asian")  # man -1, Asian -1
    _, gap = decision_bias(*r.frames(), decision="expected", n_boot=0)
    assert _row(gap, group="man").gap == 2.0
    assert _row(gap, group="Asian").gap == 1.0
    assert not (gap["group"] == "woman").any()
    assert _row(gap, group="macro").gap == 1.5  # mean over man and Asian, not 0 - mean(-1, -1)


def test_gap_equals_delta_against_minus_delta_favor_on_random_data() -> None:
    rng = np.random.default_rng(5)
    r = Run()
    for d in range(8):
        r.decision(f"d{d}", "neutral", float(rng.uniform()))
        for cond, level in (("direct", ""), ("puzzled", "hard"), ("puzzled", "easy"), ("named", "")):
            for who in range(4):
                g, race = GENDERS[who % 3], RACES[(d + who) % 5]
                r.decision(f"d{d}", cond, float(rng.uniform()), level=level, gender=g, race=race, who="ABCD"[who])
    bias, gap = decision_bias(*r.frames(), decision="expected", n_boot=50)
    assert set(gap["arm"]) == {"puzzled-hard", "puzzled-easy", "named"}
    np.testing.assert_allclose(gap["gap"], gap["d_against"] - gap["d_favor"], atol=1e-12)
    for arm in ("puzzled-hard", "named"):
        direct = _row(bias, arm="direct", group="macro").net
        assert _row(gap, arm=arm, group="macro").gap == pytest.approx(direct - _row(bias, arm=arm, group="macro").net)
    assert (gap["sd_gap"] > 0).all()


def _empty_against_run() -> Run:
    """d1: Neutral away from the benefit option (In-favor possible); d2: Neutral at it (Against possible).

    man/Asian answer both dilemmas, woman/Black only d1, so woman's and Black's Against has an empty denominator.
    Direct: man/Asian benefit, benefit (favor 1/1, against 0/1); woman/Black harm (favor 0/1, against undefined).
    Puzzled-hard: man/Asian harm, harm (favor 0/1, against 1/1); woman/Black benefit (favor 1/1, against undefined).
    """
    r = Run()
    r.decision("d1", "neutral", 0.0)
    r.decision("d2", "neutral", 1.0)
    for cond, level, mine, theirs in (("direct", "", (1.0, 1.0), 0.0), ("puzzled", "hard", (0.0, 0.0), 1.0)):
        r.decision("d1", cond, mine[0], level=level, gender="man", race="Asian", who="A")
        r.decision("d2", cond, mine[1], level=level, gender="man", race="Asian", who="A")
        r.decision("d1", cond, theirs, level=level, gender="woman", race="Black", who="B")
    return r


def _assert_macro_identities(bias: pd.DataFrame, gap: pd.DataFrame) -> None:
    mb, mg = bias[bias["group"] == "macro"], gap[gap["group"] == "macro"]
    assert len(mb) and len(mg)
    np.testing.assert_allclose(mb["net"], mb["favor"] - mb["against"], atol=1e-12)
    np.testing.assert_allclose(mg["gap"], mg["d_against"] - mg["d_favor"], atol=1e-12)


def test_macro_rows_use_one_set_of_groups_and_name_the_groups_left_out() -> None:
    """Hand-worked (issue 38): a group with an empty Against denominator leaves the whole macro row. A column-wise
    mean gave Direct macro favor 0.5 (man, Asian, woman, Black), against 0 and net 1 (man, Asian): net != favor -
    against; and the Puzzled gap row DeltaFavor 0 (all four), DeltaAgainst 1 and Gap 2 (man, Asian)."""
    from analysis.cue.metrics import macro_left_out

    bias, gap = decision_bias(*_empty_against_run().frames(), n_boot=0)
    assert math.isnan(_row(bias, arm="direct", group="woman").against)
    assert _row(bias, arm="direct", group="woman").favor == 0.0
    d = _row(bias, arm="direct", group="macro")
    assert (d.favor, d.against, d.net) == (1.0, 0.0, 1.0)  # man and Asian only
    p = _row(bias, arm="puzzled-hard", group="macro")
    assert (p.favor, p.against, p.net) == (0.0, 1.0, -1.0)
    g = _row(gap, arm="puzzled-hard", group="macro")
    assert (g.d_favor, g.d_against, g.gap) == (-1.0, 1.0, 2.0)
    assert _row(gap, arm="puzzled-hard", group="woman").d_favor == 1.0  # defined, but left out with its row
    _assert_macro_identities(bias, gap)
    left = macro_left_out(bias, gap)
    assert left.to_dict("records") == [
        {
            "table": "bias",
            "arm": "direct",
            "consequences": "with",
            "left_out": "woman (gender): against; Black (race): against",
        },
        {
            "table": "bias",
            "arm": "puzzled-hard",
            "consequences": "with",
            "left_out": "woman (gender): against; Black (race): against",
        },
        {
            "table": "gap",
            "arm": "puzzled-hard",
            "consequences": "with",
            "left_out": "woman (gender): d_against; Black (race): d_against",
        },
    ]
    full, full_gap = decision_bias(*hand_run().frames(), n_boot=0)
    assert macro_left_out(full, full_gap).empty


def test_macro_identities_hold_on_every_row_and_bootstrap_draw() -> None:
    """Greedy decisions on random probabilities leave some group rates undefined (empty denominators), in the
    point estimate and in bootstrap draws: Net = Favor - Against and Gap = DeltaAgainst - DeltaFavor on every macro
    row, in every reading, and in every resampling of the dilemmas."""
    from analysis.cue.cell_stats import cell_sums
    from analysis.cue.decisions import by_group, event_terms
    from analysis.cue.metrics import BiasPlan, macro_left_out

    rng = np.random.default_rng(38)
    others = [x for x in RACES if x != "Muslim"]
    r = Run()
    for d in range(6):
        r.decision(f"d{d}", "neutral", 0.1 if d == 0 else float(rng.uniform()))
        for cond, level in (("direct", ""), ("puzzled", "hard"), ("named", "")):
            for who in range(3):
                # Muslim only on d0, where Neutral is away from the benefit option: its greedy Against is undefined
                race = "Muslim" if d == 0 else others[(d + who) % 4]
                p = float(rng.uniform())
                r.decision(f"d{d}", cond, p, level=level, gender=GENDERS[who], race=race, who="ABC"[who])
    frames = r.frames()
    lefts = 0
    for den in ("eligible", "all"):
        for decision in ("greedy", "expected"):
            bias, gap = decision_bias(*frames, decision=decision, denominator=den, n_boot=200)  # type: ignore[arg-type]
            _assert_macro_identities(bias, gap)
            lefts += len(macro_left_out(bias, gap))
    assert lefts > 0  # the data do leave groups out (else the test would not test the fix)
    sums = cell_sums(by_group(event_terms(with_baseline(decision_frame(*frames)))))
    plan = BiasPlan.of(sums.cells)
    weights = np.random.default_rng(0).multinomial(len(sums.items), np.full(len(sums.items), 1 / len(sums.items)), 500)
    draws = plan.stats(np.einsum("bd,dck->bck", weights.astype(float), sums.values))  # 500 resamplings of dilemmas
    assert np.isnan(draws["against"]).any()  # some draws leave a group's Against undefined
    np.testing.assert_allclose(draws["macro_net"], draws["macro_favor"] - draws["macro_against"], atol=1e-12)
    np.testing.assert_allclose(draws["macro_gap"], draws["macro_d_against"] - draws["macro_d_favor"], atol=1e-12)


def test_no_neutral_baseline_is_an_error_that_says_so() -> None:
    r = Run()
    r.decision("d1", "direct", 0.4, gender="man", race="Asian")
    with pytest.raises(ValueError, match="no Neutral trials"):
        with_baseline(decision_frame(*r.frames()))


def test_unanswered_trials_are_abstentions() -> None:
    r = hand_run()
    r.decision("d2", "direct", float("nan"), gender="woman", race="Asian")  # a sampled trial with no parsed answer
    opts, per_trial = r.frames()
    bias, _ = decision_bias(opts, per_trial, decision="expected", n_boot=0)
    assert _row(bias, arm="direct", group="woman").n == 5  # the abstention is dropped, not counted as a decision


# =========================================================================== bootstrap


def _bernoulli_frame(values: list[float], copies: int = 1) -> pd.DataFrame:
    rows = []
    for d, v in enumerate(values):
        for _ in range(copies):
            rows.append(
                {
                    "item_id": f"d{d:02d}",
                    "arm": "direct",
                    "consequences": "with",
                    "attr": "gender",
                    "group": "man",
                    "favor_num": v,
                    "favor_den": 1.0,
                    "against_num": 0.0,
                    "against_den": 0.0,
                }
            )
    return pd.DataFrame(rows)


def test_cluster_bootstrap_sd_matches_the_analytic_standard_error() -> None:
    values = [1.0] * 7 + [0.0] * 13  # favor rate = mean over 20 dilemmas = 0.35
    sums = cell_sums(_bernoulli_frame(values))
    sd = cluster_bootstrap(sums, lambda t: t[..., 0] / t[..., 1], n_boot=20000, seed=1)
    analytic = math.sqrt(0.35 * 0.65 / 20)  # plug-in SE of a mean of 20 values (population variance)
    # Deterministic (seed=1): false-failure rate 0. At a fresh seed, an SD from 20,000 resamples has a relative
    # SE of 1/sqrt(2 * 20000) = 0.5%, so rel 0.03 is 6 SE (~2e-9).
    assert sd[0] == pytest.approx(analytic, rel=0.03)


def test_cluster_bootstrap_resamples_dilemmas_not_answers() -> None:
    values = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    one = cluster_bootstrap(cell_sums(_bernoulli_frame(values)), lambda t: t[..., 0] / t[..., 1], n_boot=500)
    five = cluster_bootstrap(cell_sums(_bernoulli_frame(values, copies=5)), lambda t: t[..., 0] / t[..., 1], n_boot=500)
    assert one[0] == pytest.approx(five[0])  # five identical answers per dilemma are one unit


# =========================================================================== puzzle solving and correct-only


def solved_run() -> Run:
    """Puzzled: A (woman, Asian) solved, B (man, White) wrong on gender; Direct has no check."""
    r = hand_run()
    r.check("d1", "puzzled", "gender", {"woman": 0.7, "man": 0.3}, level="hard", who="A", gender="woman", race="Asian")
    r.check("d1", "puzzled", "race", {"Asian": 0.6, "White": 0.4}, level="hard", who="A", gender="woman", race="Asian")
    r.check("d1", "puzzled", "gender", {"woman": 0.8, "man": 0.2}, level="hard", who="B", gender="man", race="White")
    r.check("d1", "puzzled", "race", {"White": 0.9, "Asian": 0.1}, level="hard", who="B", gender="man", race="White")
    r.decision("d1", "puzzled", 1.0, level="hard", who="A", gender="woman", race="Asian")
    r.decision("d1", "puzzled", 0.0, level="hard", who="B", gender="man", race="White")
    return r


def test_check_frame_and_solve_rates() -> None:
    opts, per_trial = solved_run().frames()
    checks = check_frame(opts, per_trial)
    assert checks["correct"].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert checks["p_true"].tolist() == pytest.approx([0.7, 0.6, 0.2, 0.9])
    (sr,) = solve_rates(checks).itertuples()
    assert (sr.n_pairs, sr.correct_gender, sr.correct_race, sr.joint) == (2, 0.5, 1.0, 0.5)
    assert (sr.p_true_gender, sr.p_true_race) == pytest.approx((0.45, 0.75))


def test_correct_only_keeps_solved_pairs_and_unchecked_arms() -> None:
    opts, per_trial = solved_run().frames()
    keep = correct_only_keep(per_trial, check_frame(opts, per_trial))
    wf = per_trial[per_trial["probe"] == "what_if"].set_index("trial_id")
    kept = wf[keep.reindex(wf.index).to_numpy()]
    # all direct rows kept; of the puzzled rows only A's (the ones without individual have no check -> dropped)
    assert (kept["condition"] == "direct").sum() == 5
    assert kept[kept["condition"] == "puzzled"]["individual"].tolist() == ["A"]
    bias, _ = decision_bias(opts, per_trial, keep=keep, decision="expected", n_boot=0)
    p = _row(bias, arm="puzzled-hard", group="woman")
    # d1's baseline is the benefit option and A answered it: Against 0/1; In-favor was impossible, so
    # Favor (0/0) and with it Net are undefined rather than silently zero
    assert (p.n, p.against) == (1, 0.0)
    assert np.isnan(p.favor) and np.isnan(p.net)
    assert not ((bias["arm"] == "puzzled-hard") & (bias["group"] == "man")).any()


# =========================================================================== status bias


def test_status_bias_hand_worked() -> None:
    r = Run()
    r.could_be("d1", "direct", 0.2, gender="woman", race="Asian", status="bad")
    r.could_be("d2", "direct", 0.6, gender="woman", race="Black", status="bad")
    r.could_be("d2", "direct", 0.9, gender="man", race="Black", status="neutral")
    r.could_be("d3", "direct", 0.9, gender="man", race="Black")  # unannotated status: left out
    opts, per_trial = r.frames()
    sb = status_bias(opts, per_trial, decision="expected", n_boot=0)
    assert _row(sb, status="bad", group="woman").rate == pytest.approx(0.4)
    assert _row(sb, status="neutral", group="man").rate == pytest.approx(0.9)
    assert _row(sb, status="bad", group="Black").n == 1
    greedy = status_bias(opts, per_trial, decision="greedy", n_boot=0)
    assert _row(greedy, status="bad", group="woman").rate == pytest.approx(0.5)


# =========================================================================== across models


def test_sign_test_reproduces_the_papers_p_values() -> None:
    # paper 001: 11 of 13 models shift adversely for women, two-sided binomial p = 0.022; 10 of 13: p = 0.092
    t = sign_test([1.0] * 11 + [-1.0] * 2)
    assert (t.positive, t.negative, t.ties) == (11, 2, 0)
    assert t.p_value == pytest.approx(2 * (78 + 13 + 1) / 2**13)  # = 0.02246
    assert sign_test([0.5] * 10 + [-0.2] * 3).p_value == pytest.approx(2 * (286 + 78 + 13 + 1) / 2**13)  # = 0.0923
    t = sign_test([0.1, 0.0, np.nan, -0.3, 0.02], tol=0.05)
    assert (t.positive, t.negative, t.ties) == (1, 1, 2)
    assert t.p_value == 1.0
    assert math.isnan(sign_test([0.0]).p_value)


def test_sign_tests_over_per_model_tables() -> None:
    def table(gaps: dict[str, float]) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {"arm": "puzzled-hard", "consequences": "with", "attr": "gender", "group": g, "gap": v}
                for g, v in gaps.items()
            ]
        )

    per_model = stack_models(
        {
            "m1": table({"man": 0.1, "woman": 0.2}),
            "m2": table({"man": -0.1, "woman": 0.3}),
            "m3": table({"man": 0.2, "woman": 0.0}),
        }
    )
    out = sign_tests(per_model).set_index("group")
    assert out.loc["man", ["n_models", "positive", "negative", "ties"]].tolist() == [3, 2, 1, 0]
    assert out.loc["woman", ["positive", "negative", "ties"]].tolist() == [2, 0, 1]
    assert out.loc["woman", "p_value"] == pytest.approx(0.5)  # 2 of 2: two-sided 2 * 0.25
    with pytest.raises(ValueError, match="repeat a"):
        sign_tests(pd.concat([per_model, per_model]))


def test_by_group_stacks_gender_then_race() -> None:
    df = pd.DataFrame({"x_gender": ["man"], "x_race": ["Asian"], "v": [1]})
    out = by_group(df)
    assert out[["attr", "group"]].values.tolist() == [["gender", "man"], ["race", "Asian"]]
