"""The synthetic subject: planted response model by hand, engine contract, determinism, CLI, and a real run.

Random draws: every subject, draw and bootstrap here is seeded (SimParams(seed=...) and SimEngine(seed=...)),
and tests/test_determinism.py checks that the seeds are honoured across processes; so every assertion here is
deterministic, false-failure rate 0. Thresholds were set at these seeds; the frequency checks say what they
would cost at fresh seeds.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from scipy.special import expit

import tests.battery_contract as bc
from engines import engine_kind, make_engine
from engines.base import LogitEngine
from engines.sim.engine import REFUSAL_TEXT, SimEngine, count_tokens, from_args, graded_logits
from engines.sim.params import SimParams, SimParamsError
from probe.parse import parse_answer
from probe.salts import SaltSpec, make_salt

Z_1E6 = float(stats.norm.isf(0.5e-6))
"""A two-sided band of this many standard errors fails a fresh, correct sampler with probability 1e-6 (4.89)."""


def _binary_trial(verb, order, pair="Yes/No", mapping="canonical", item="i"):
    [t] = [
        t
        for t in bc.binary([item], forms=("f",), pairs=(pair,))
        if t.factors["verb"] == verb and t.factors["order"] == order and t.factors["mapping"] == mapping
    ]
    return t


def _p_cbr(engine, t):
    r = engine.readout([t])[0]
    return r.prob(t.options[t.meaning.index("cbr")])


# --------------------------------------------------------------- the model
def test_binary_readout_is_the_planted_logistic_by_hand():
    p = SimParams(theta={"i": 0.2}, s=0.5, m_order=0.1, m_word=-0.2, m_logic=0.05)
    e = SimEngine(p)
    # approve, yes first: CBR = "Yes" is first, the canonical label and the affirmative verdict
    assert _p_cbr(e, _binary_trial("approve", "yes_first")) == pytest.approx(expit((0.2 + 0.1 - 0.2 + 0.05) / 0.5))
    # oppose, no first: CBR = "No" is first, neither canonical nor affirmative
    assert _p_cbr(e, _binary_trial("oppose", "no_first")) == pytest.approx(expit((0.2 + 0.1 + 0.2 - 0.05) / 0.5))
    # A/B with the swapped mapping: yes rides on B; approve + no_first prints A first and CBR = B (affirmative,
    # not the canonical label A, printed second)
    t = _binary_trial("approve", "no_first", pair="A/B", mapping="swapped")
    assert t.options == ("A", "B") and t.factors["yes_label"] == "B"
    assert _p_cbr(e, t) == pytest.approx(expit((0.2 - 0.1 + 0.2 + 0.05) / 0.5))
    # a per-pair label offset replaces m_word for that pair only
    e2 = SimEngine(SimParams(theta={"i": 0.2}, s=0.5, m_label={"A/B": 0.4}))
    assert _p_cbr(e2, t) == pytest.approx(expit((0.2 - 0.4) / 0.5))
    assert _p_cbr(e2, _binary_trial("approve", "yes_first")) == pytest.approx(expit(0.2 / 0.5))


def test_choice_readout_uses_its_own_decisiveness_and_order_pull():
    e = SimEngine(SimParams(theta={"i": -0.1}, s=0.5, s_choice=0.2, m_choice_order=0.05))
    [cf, af] = bc.choice(["i"], framings=("choose",))
    assert _p_cbr(e, cf) == pytest.approx(expit((-0.1 + 0.05) / 0.2))
    assert _p_cbr(e, af) == pytest.approx(expit((-0.1 - 0.05) / 0.2))


@pytest.mark.parametrize("mu", [-0.97, -0.3, 0.0, 0.55, 0.98])
def test_graded_distribution_has_exactly_the_planted_mean(mu):
    x = np.linspace(-1, 1, 11)
    q = np.exp(graded_logits(x, mu, 0.15))
    q /= q.sum()
    assert float(q @ x) == pytest.approx(mu, abs=1e-12)
    assert x[np.argmax(q)] == pytest.approx(round(mu * 5) / 5)  # peaked at the nearest scale point


def test_graded_centre_adds_the_planted_contrasts():
    p = SimParams(theta={"i": 0.3}, sigma_dir=0.1, sigma_scale=0.1, bipolar_shift=0.05)
    e = SimEngine(p)
    d, c = e.anchor_contrast("i"), e.scale_contrast("i")
    assert d != 0 and c != 0
    for t in bc.graded(["i"], scales=("0-10", "0-100", "bipolar-5")):
        f = t.factors
        want = 0.3 + (d if f["anchor"] == "ascending" else -d) + (c if f["scale"] in ("0-10", "bipolar-5") else -c)
        want += 0.05 if f["scale"] == "bipolar-5" else 0.0
        assert e.graded_centre(t) == pytest.approx(want)
        r = e.readout([t])[0]
        x = np.array([float(m) for m in t.meaning])
        assert float(np.dot([s.prob for s in r.scores], x)) == pytest.approx(want, abs=1e-12)


def test_graded_trials_of_the_real_battery_read_the_contract_meanings():
    from experiments.battery import BatterySpec, expand

    trials = expand(BatterySpec(instruments=("graded",), items=("mine_cart_bridge",), scales=("0-10",)))
    e = SimEngine(SimParams(theta={"mine_cart_bridge": 0.8}))
    for t in trials:
        greedy = e.readout([t])[0].greedy_option
        a = int(greedy) / 10
        a = 1 - a if t.factors["anchor"] == "descending" else a
        cbr_rated = t.factors["pole"] == "action"  # the item's CBR pole is the action
        assert (2 * a - 1 if cbr_rated else 1 - 2 * a) == pytest.approx(0.8)


# ----------------------------------------------------------- engine contract
def test_readout_contract_and_batch_invariance():
    trials = bc.graded(["a", "b"], scales=("0-10",)) + bc.binary(["a", "b"]) + bc.choice(["a"])
    e = SimEngine(SimParams(seed=3, sigma_form=0.1, sigma_binary=0.1, coverage=0.9))
    assert isinstance(e, LogitEngine)
    whole = e.readout(trials)
    pieces = [r for k in range(0, len(trials), 7) for r in e.readout(trials[k : k + 7])]
    rev = e.readout(trials[::-1])[::-1]
    assert whole == pieces == rev
    for t, r in zip(trials, whole, strict=True):
        assert r.trial_id == t.trial_id and [s.option for s in r.scores] == list(t.options)
        probs = np.array([s.prob for s in r.scores])
        assert probs.sum() == pytest.approx(1.0) and r.coverage == 0.9
        assert [s.logprob for s in r.scores] == pytest.approx(list(np.log(probs * 0.9)))
        assert r.greedy_option == t.options[int(np.argmax(probs))]
        assert r.top_other[0][1] == pytest.approx(0.1)


def test_samples_follow_the_tempered_distribution():
    t = _binary_trial("approve", "yes_first")
    e = SimEngine(SimParams(theta={"i": 0.3}, s=0.6, T=0.5), seed=1)
    n = 4000
    draws = e.sample([t], n, 0.8)
    want = expit((0.3 / 0.6) / (0.8 * 0.5))  # softmax(z / (tau T)) with z = +-margin / 2
    got = np.mean([s.option == "Yes" for s in draws])
    assert abs(got - want) < 4 * math.sqrt(want * (1 - want) / n)
    assert all(s.status == "ok" and parse_answer(s.text, t.options, think=False).option == s.option for s in draws)
    assert [s.replicate for s in draws] == list(range(n))
    # greedy at temperature 0, and draws do not depend on the batch
    assert {s.option for s in e.sample([t], 5, 0.0)} == {"Yes"}
    other = _binary_trial("oppose", "no_first")
    assert e.sample([other, t], 50, 1.0)[50:] == e.sample([t], 50, 1.0)


def test_refusals_and_noncommittal_choices_are_data():
    from experiments.judge import rule_verdict

    p = SimParams(seed=2, refusal=0.2, noncommit=0.3)
    e = SimEngine(p, seed=4)
    t = _binary_trial("approve", "yes_first")
    s = e.sample([t], 2000, 1.0)
    share = np.mean([x.status == "refusal" for x in s])
    # deterministic (seeds 2 and 4); at fresh seeds, Z_1E6 standard errors each side fail with probability 1e-6
    assert share == pytest.approx(0.2, abs=Z_1E6 * math.sqrt(0.2 * 0.8 / 2000))
    assert parse_answer(REFUSAL_TEXT, t.options, think=False).status == "refusal"
    [c, _] = bc.choice(["i"], framings=("choose",))
    cs = e.sample([c], 2000, 1.0)
    verdicts = pd.Series([rule_verdict(c, x.text, think=False) for x in cs])
    # NONCOMMIT = refused (0.2) or, if not, non-committal (0.8 * 0.3)
    p_nc = 0.2 + 0.8 * 0.3
    assert (verdicts == "NONCOMMIT").mean() == pytest.approx(p_nc, abs=Z_1E6 * math.sqrt(p_nc * (1 - p_nc) / 2000))
    committed = [x for x, v in zip(cs, verdicts, strict=True) if v != "NONCOMMIT"]
    assert all(x.status == "ok" and x.option in c.options for x in committed)


def test_salts_are_drawable_and_every_context_is_one_draw():
    spec = SaltSpec(count=4, n_tokens=8)
    salts = [make_salt(r, spec, count_tokens) for r in range(4)]
    assert salts[0] == "" and all(count_tokens(s) == 8 for s in salts[1:])
    p = SimParams(theta={"a": 0.1}, sigma_salt=0.05)
    e = SimEngine(p)
    reps = [
        t for t in bc.binary(["a"], salts=4) if t.factors["verb"] == "approve" and t.factors["order"] == "yes_first"
    ]
    reps = [t for t in reps if t.factors["form"] == "acceptable"]
    margins = [e.cbr_margin(t, "binary") * p.s for t in reps]
    assert len(set(margins)) == 4  # the unsalted context is one draw like the salted ones
    assert np.std(margins) < 0.2 and all(abs(m - 0.1) < 0.25 for m in margins)


def test_params_validate_and_load_from_yaml(tmp_path):
    with pytest.raises(SimParamsError, match="s must be"):
        SimParams(s=0)
    with pytest.raises(SimParamsError, match="refusal"):
        SimParams(refusal=1.5)
    with pytest.raises(SimParamsError, match="theta values"):
        SimParams(theta={"a": 1.5})
    f = tmp_path / "p.yaml"
    f.write_text("s: 0.2\nm_order: -0.1\ntheta: {a: 0.4}\nm_label: {A/B: 0.3}\n")
    a = argparse.Namespace(sim_params=None, sim_seed=7, think=False, seed=5)
    e = from_args(f"sim:{f}", a)
    assert e.params.s == 0.2 and e.params.theta == {"a": 0.4} and e.params.seed == 7 and e.seed == 5
    assert e.identity()["params"]["m_label"] == {"A/B": 0.3}
    assert e.describe()["params"]["m_order"] == -0.1
    bad = tmp_path / "bad.yaml"
    bad.write_text("s: 0.2\ndecisivness: 3\n")
    with pytest.raises(SimParamsError, match="unknown sim parameters"):
        from_args("sim", argparse.Namespace(sim_params=str(bad), sim_seed=None, think=False, seed=0))


def test_the_registry_routes_sim_specs_to_this_engine():
    assert engine_kind("sim") == "sim" and engine_kind("sim:params.yaml") == "sim"
    from probe.app.cli import build_parser

    a = build_parser().parse_args(["run", "yesno", "--model", "sim", "--out", "x", "--sim-seed", "3"])
    e = make_engine(a)
    assert isinstance(e, SimEngine) and e.params.seed == 3


# ------------------------------------------------------------- a real run
def test_yesno_run_through_the_store_gives_eq1_to_machine_precision(tmp_path):
    """The plain yes/no battery, run on the sim by the real runner, read back, decomposed two independent ways."""
    from analysis.battery import fit
    from analysis.battery.yesno import cell_table, decompose, p_cbr, with_cbr_verb
    from experiments.yesno import YesNoSpec
    from probe.app.runner import run
    from probe.runs import open_run

    e = SimEngine(SimParams(seed=1, m_order=-0.15, m_word=-0.1, m_logic=0.04, sigma_binary=0.1))
    store = run("yesno", YesNoSpec(), e, tmp_path / "run", progress=False, log=lambda m: None)
    opts, per = open_run(store.root).readout_frames()
    dec = decompose(cell_table(with_cbr_verb(per, opts), p_cbr(opts)))
    assert float((dec["apparent"] - dec["order"] - dec["lexical"]).abs().max()) < 1e-15
    b = fit.binary_trials(opts, per)
    order = fit.channel_sides(b, "order").reindex(dec.index)
    lexical = fit.channel_sides(b, "lexical").reindex(dec.index)
    assert np.allclose(order["bias"], dec["order"], atol=1e-15, rtol=0)
    assert np.allclose(lexical["bias"], dec["lexical"], atol=1e-15, rtol=0)
    assert np.allclose(order["z"], dec["z"], atol=1e-15, rtol=0)
    # the planted pulls show with their signs: toward the last-printed option and toward "No"
    assert (dec["order"].mean() < 0) and (dec["lexical"].mean() < 0)


def test_battery_run_on_the_sim_feeds_every_estimator(tmp_path):
    """The lead's real battery, run by the real runner on the sim (readouts, greedy free choice judged by rule)."""
    from analysis.battery import channel_fit, fit, stance
    from experiments.battery import REDUCED, BatterySpec
    from experiments.judge import RuleJudge
    from probe.app.runner import run
    from probe.runs import open_run

    items = ("mine_cart_bridge", "freight_yard_switch", "flooded_mine_door", "brake_failure", "uncle_juice")
    spec = BatterySpec(**REDUCED, items=items, salts=SaltSpec(count=2))
    p = SimParams(seed=2, m_order=-0.1, m_word=-0.1, sigma_form=0.1, sigma_salt=0.02, s_choice=0.1)
    store = run("battery", spec, SimEngine(p), tmp_path / "run", judge=RuleJudge(think=False), progress=False, log=lambda m: None)
    opts, per = open_run(store.root).readout_frames()
    gt = stance.graded_trials(opts, per, "readout")
    forms = stance.per_form(gt)
    th = stance.theta(forms)
    assert np.corrcoef(th, [p.item_theta(i) for i in th.index])[0, 1] > 0.95
    inc = stance.incoherence(forms)
    assert inc["n_forms"].eq(2 * 2 * 2 * 2).all()  # reduced preset: 2 unipolar scales x 2 wordings x anchor x pole
    assert 0 < stance.generalizability(inc).G <= 1
    floor = stance.salt_floor(stance.salt_spread(gt[~gt["bipolar"]], "mean_x", stance.FORM))
    assert floor.within_sd_mean < floor.between_sd_mean
    b = fit.binary_trials(opts, per)
    assert set(b["family"]) == {"yesno", "arbitrary", "mark", "foreign"}
    fits = channel_fit.fit_each_channel(th, b, n_boot=50, seed=0)[0].set_index("channel")
    assert list(fits.index) == ["order", "lexical", "logic", "label"]
    assert fits.loc["order", "m"] == pytest.approx(-0.1, abs=0.05)
    judgments = store.load("judgments").merge(open_run(store.root).trial_meta()[["trial_id", "item_id"]], on="trial_id")
    choice = stance.choice_stance(judgments)
    assert set(choice.index) == set(items) and choice.abs().max() <= 1


def test_refused_sampled_trials_do_not_bias_z_the_issue_18_repro():
    """Bug 1 of issue 18: with refusal 0.6 and 3 draws, a fully refused trial used to count as P(CBR) = 0.

    Sampled z is then an unbiased estimate of the readout z (the same planted
    logits) over the stories that keep all four cells. 120 items x 3 forms x 4
    cells x 3 draws at refusal 0.6: a trial keeps n ~ Bin(3, 0.4) parsed draws,
    E[1/n | n >= 1] = 0.76, so a trial's frequency has variance <= 0.19, a cell
    (mean of <= 3 usable forms) <= 0.09, and z (mean of four 2 P - 1) <= 0.09:
    per-item SD <= 0.3 (0.26 observed). Over >= 100 kept items the mean
    difference has SD <= 0.03, and |mean| < 0.15 (5 SD) fails with probability
    < 1e-6; the sim's draws are hashed from (seed, trial, draw), so the figure
    is fixed anyway (-0.02). The old rule (a fully refused trial read as
    P(CBR) = 0) gives -0.25 on the same draws.
    """
    from analysis.battery.yesno import cell_table, decompose, dropped_stories, p_cbr, with_cbr_verb

    items = [f"i{k:03d}" for k in range(120)]
    trials = bc.binary(items)
    e = SimEngine(SimParams(seed=3, refusal=0.6), seed=5)
    r_opts, r_per = bc.frames_readout(trials, e.readout(trials))
    s_opts, s_per = bc.frames_samples(trials, e.sample(trials, 3, 1.0))

    def z(opts, per):
        pc, wv = p_cbr(opts), with_cbr_verb(per, opts)
        return decompose(cell_table(wv, pc))["z"], dropped_stories(wv, pc)

    z_read, none = z(r_opts, r_per)
    z_samp, dropped = z(s_opts, s_per)
    assert none == () and len(z_read) == 120
    assert len(z_samp) + len(dropped) == 120 and len(z_samp) >= 100
    assert {d.item_id for d in dropped}.isdisjoint(z_samp.index)
    diff = (z_samp - z_read.reindex(z_samp.index)).mean()
    assert abs(diff) < 0.15
    # the old rule (a fully refused trial read as P(CBR) = 0) is biased far beyond that on the same draws
    old = s_opts.assign(prob=s_opts["prob"].fillna(0.0))
    z_old = decompose(cell_table(with_cbr_verb(s_per, old), p_cbr(old)))["z"]
    assert (z_old - z_read).mean() < -0.15


def test_planted_per_pair_label_pulls_are_what_the_gradient_reports():
    """Bug 2 of issue 18: per-pair surface pulls (m_label) come back as the label pull of Fig. 6, not as logic.

    The expected story-averaged label pull b is computed here from the planted
    sigmoid directly (not through the sim engine or the analysis), and the
    per-pair joint fit gives the planted m back in theta units (readouts: no
    sampling noise, so the tolerance is the optimizer's).
    """
    from analysis.battery import fit, joint_fit
    from analysis.battery.binary import cell_events, lexicality_gradient, projections

    items = [f"i{k:02d}" for k in range(12)]
    pulls = {"A/B": -0.15, "1/2": 0.1, "Ja/Nein": -0.3}
    p = SimParams(seed=4, s=0.3, m_order=-0.1, m_logic=0.02, m_label=pulls)
    trials = bc.binary(items, forms=("f",), pairs=tuple(pulls))
    opts, per = bc.frames_readout(trials, SimEngine(p).readout(trials))
    proj = projections(cell_events(per, opts), set(pulls))
    by_pair, contrast = lexicality_gradient(proj, {"A/B": 0, "1/2": 0, "Ja/Nein": 2})
    for pair, m in pulls.items():
        # P(label1) over verb x order x mapping: the CBR option is label1 iff affirmative == canonical
        b = []
        for i in items:
            th = p.item_theta(i)
            for cbr_first in (1, -1):
                for aff in (1, -1):
                    for canon_map in (1, -1):
                        cbr_is_label1 = aff * canon_map
                        pc = expit((th + p.m_order * cbr_first + m * cbr_is_label1 + p.m_logic * aff) / p.s)
                        b.append(2 * (pc if cbr_is_label1 > 0 else 1 - pc) - 1)
        assert by_pair.loc[pair, "label_pull"] == pytest.approx(np.mean(b), abs=1e-12)
        assert by_pair.loc[pair, "logic"] != pytest.approx(by_pair.loc[pair, "label_pull"], abs=0.01)
        th = pd.Series({i: p.item_theta(i) for i in items})
        pf = joint_fit.fit_pair(th, fit.binary_trials(opts, per), pair, n_boot=0)
        got = dict(zip(pf.channels, pf.m, strict=True))
        assert got["label"] == pytest.approx(m, abs=1e-6)
        assert got["order"] == pytest.approx(p.m_order, abs=1e-6)
        assert got["logic"] == pytest.approx(p.m_logic, abs=1e-6)
    word, nonlex = abs(by_pair.loc["Ja/Nein", "label_pull"]), by_pair.loc[["A/B", "1/2"], "label_pull"].abs().mean()
    assert contrast == pytest.approx(word - nonlex, abs=1e-12)


# ------------------------------------------- free-text replies decoded ahead
_AHEAD_ITEMS = ("mine_cart_bridge", "freight_yard_switch", "flooded_mine_door", "brake_failure")
_AHEAD_CHUNK = 33
"""Each item is 66 trials with its 6 free-choice trials at 24-29: chunks 0, 2, 4, 6 hold 6 each, 1, 3, 5, 7 none."""


class _ReplyCounting:
    """The sim with a set reply batch (0: off), recording every ``sample`` call on free-choice trials as
    (n, temperature, trial ids, keywords); ``fail_readout``: raise on the readout of a trial with that index."""

    def __init__(self, reply_rows: int, fail_readout: int | None = None) -> None:
        self.inner = SimEngine(SimParams(seed=5, s_choice=0.2, noncommit=0.2, refusal=0.1))
        self.name = self.inner.name
        self.reply_rows = reply_rows
        self.fail_readout = fail_readout
        self.calls: list[tuple[int, float, list[str], dict]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def readout(self, trials, progress=None):
        if self.fail_readout is not None and any(t.trial_id == self.fail_readout for t in trials):
            raise RuntimeError("killed mid-run")
        return self.inner.readout(trials, progress)

    def sample(self, trials, n, temperature, progress=None, **kw):
        from experiments.battery import is_choice

        if any(is_choice(t) for t in trials):
            assert all(is_choice(t) for t in trials)
            self.calls.append((n, temperature, [t.trial_id for t in trials], kw))
        return self.inner.sample(trials, n, temperature, progress, **kw)


def _ahead_run(engine, out):
    from experiments.battery import REDUCED, BatterySpec
    from experiments.judge import RuleJudge
    from probe.app.runner import run
    from probe.record import Plan

    spec = BatterySpec(**REDUCED, items=_AHEAD_ITEMS)
    plan = Plan(samples=3, temperature=0.8, sample_only=(("order", "cbr_first"),))  # 3 drawn + 3 greedy per chunk
    return run("battery", spec, engine, out, plan=plan, judge=RuleJudge(think=False), chunk_size=_AHEAD_CHUNK, progress=False,
               log=lambda m: None)  # fmt: skip


def _chunk_frames(store) -> dict[str, pd.DataFrame]:
    return {p.name: pd.read_parquet(p) for p in sorted(store.results_dir.glob("chunk-*.parquet"))}


def _assert_same_chunks(a, b) -> None:
    fa, fb = _chunk_frames(a), _chunk_frames(b)
    assert list(fa) == list(fb)
    for name in fa:
        pd.testing.assert_frame_equal(fa[name], fb[name], check_exact=True, obj=name)


def _groups(engine, store) -> list[tuple[int, float, list[int]]]:
    """Each recorded call as (n, temperature, the chunks of its trials)."""
    index = {t.trial_id: i for i, t in enumerate(store.trials())}
    return [(n, temp, sorted({index[i] // _AHEAD_CHUNK for i in ids})) for n, temp, ids, _ in engine.calls]


def test_replies_decoded_ahead_write_the_same_chunks_in_fewer_calls(tmp_path):
    """Look-ahead (reply rows 30: two 12-row chunks fit, a third does not) writes every chunk's tables exactly as
    each chunk alone (reply rows 0) does, in whole-chunk groups; a batch below one chunk still decodes the chunk."""
    off, ahead, small = _ReplyCounting(0), _ReplyCounting(30), _ReplyCounting(5)
    ref = _ahead_run(off, tmp_path / "off")
    got = _ahead_run(ahead, tmp_path / "ahead")
    below = _ahead_run(small, tmp_path / "small")
    tables = {name.split(".")[1] for name in _chunk_frames(ref)}
    assert tables == {"generations", "judgments", "readout_trials", "readout_options"}
    assert {n for n, _, _, _ in off.calls} == {3, 1}
    _assert_same_chunks(ref, got)
    _assert_same_chunks(ref, below)
    per_chunk = [(n, t, [k]) for k in (0, 2, 4, 6) for n, t in ((3, 0.8), (1, 0.0))]
    assert _groups(off, ref) == _groups(small, below) == per_chunk
    assert _groups(ahead, got) == [(n, t, ks) for ks in ([0, 2], [4, 6]) for n, t in ((3, 0.8), (1, 0.0))]
    assert all(kw == {"max_new_tokens": off.calls[0][3]["max_new_tokens"]} for *_, kw in ahead.calls + off.calls)
    gens = got.load("generations")
    assert len(gens) == 4 * (3 * 3 + 3) and gens.groupby("trial_id").size().isin([1, 3]).all()


def test_a_run_killed_with_replies_decoded_ahead_resumes_to_the_same_tables(tmp_path):
    """Killed at chunk 1's readout, after chunk 0 was written with the replies of chunks 0 and 2 decoded: the
    resume decodes chunk 2's replies again and ends with the tables of an uninterrupted run."""
    ref = _ahead_run(_ReplyCounting(0), tmp_path / "ref")
    first_of_chunk_1 = ref.trials()[_AHEAD_CHUNK].trial_id
    killed = _ReplyCounting(30, fail_readout=first_of_chunk_1)
    with pytest.raises(RuntimeError, match="killed mid-run"):
        _ahead_run(killed, tmp_path / "run")
    assert [ks for _, _, ks in _groups(killed, ref)] == [[0, 2], [0, 2]]
    from probe.store import RunStore

    assert {c.chunk for c in RunStore(tmp_path / "run").integrity().verified} == {0}
    again = _ReplyCounting(30)
    store = _ahead_run(again, tmp_path / "run")
    assert [ks for _, _, ks in _groups(again, store)] == [[2, 4], [2, 4], [6], [6]]
    _assert_same_chunks(ref, store)


def test_the_progress_bar_counts_replies_decoded_ahead_once(tmp_path, monkeypatch):
    """The bar advances for replies when they are decoded: it ends at its total, on a full run and on a resume."""
    import tqdm.auto

    bars = []

    class Bar:
        def __init__(self, total, initial, **kw):
            self.total, self.n = total, initial
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n=1):
            self.n += n

        def set_postfix_str(self, *a, **kw):
            pass

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    ref = _ahead_run(_ReplyCounting(30), tmp_path / "ref")
    with pytest.raises(RuntimeError):
        _ahead_run(_ReplyCounting(30, fail_readout=ref.trials()[_AHEAD_CHUNK].trial_id), tmp_path / "run")
    _ahead_run(_ReplyCounting(30), tmp_path / "run")
    assert bars[0].n == bars[0].total and bars[2].n == bars[2].total and bars[1].n < bars[1].total


def test_plan_replies_takes_whole_chunks_within_the_batch():
    from probe.app.runner import plan_replies

    chunks = [["a"] * 4, [], ["b"] * 3, ["c"] * 5]
    one = lambda t: 1  # noqa: E731
    assert plan_replies(chunks, one, 0) == 1
    assert plan_replies(chunks, one, 3) == 1  # the first chunk alone is over the batch: still taken, alone
    assert plan_replies(chunks, one, 4) == 2  # a chunk without replies adds none
    assert plan_replies(chunks, one, 7) == 3
    assert plan_replies(chunks, one, 11) == 3
    assert plan_replies(chunks, one, 12) == 4
    assert plan_replies([], one, 12) == 0


def test_refusal_rules_refuse_only_the_matching_cells(tmp_path):
    """Issue 27: cell-dependent refusals. Rate 1 on (binary, approve, canonical) of the rejected stories: every
    draw of exactly those trials is a refusal, every other draw is answered (rate 0 elsewhere: exact)."""
    from engines.sim.params import RefusalRule, SimParamsError, load_params
    from experiments.dilemmas import load_dilemmas

    path = tmp_path / "p.yaml"
    path.write_text(
        "seed: 0\nrefusal_rules:\n  - {rate: 1.0, when: {instrument: binary, verb: approve, mapping: canonical},"
        " theta: negative}\n"
    )
    p = load_params(path)
    assert p.refusal_rules == (
        RefusalRule(1.0, {"instrument": "binary", "verb": "approve", "mapping": "canonical"}, "negative"),
    )
    assert SimParams(**p.to_dict()) == p  # survives the manifest round trip
    items = [d.id for d in load_dilemmas()[:8]]
    trials = bc.binary(items, pairs=("Yes/No", "A/B"))
    samples = SimEngine(p).sample(trials, 3, 1.0)
    by_trial = {t.trial_id: t for t in trials}
    for s in samples:
        t = by_trial[s.trial_id]
        f = t.factors
        hit = f["verb"] == "approve" and f.get("mapping", "canonical") == "canonical" and p.item_theta(t.item_id) < 0
        assert (s.status == "refusal") == hit, (t.item_id, f)
    assert any(s.status == "refusal" for s in samples) and any(s.status == "ok" for s in samples)
    with pytest.raises(SimParamsError, match="rate must be a probability"):
        SimParams(refusal_rules=[{"rate": 2.0}])
    with pytest.raises(SimParamsError, match="theta must be one of"):
        SimParams(refusal_rules=[{"rate": 0.5, "theta": "neg"}])
    with pytest.raises(SimParamsError, match="needs 'rate'"):
        SimParams(refusal_rules=[{"when": {"verb": "approve"}}])
