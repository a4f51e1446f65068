"""The yes/no battery: trial expansion (experiments.yesno) and its decomposition (analysis.battery.yesno)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from analysis.battery.yesno import Dropped, cell_table, decompose, dropped_stories, p_cbr, salt_noise, with_cbr_verb
from experiments.dilemmas import load_dilemmas
from experiments.yesno import FORMS, YesNoSpec, expand
from probe.salts import SaltSpec

DILEMMAS = load_dilemmas()
ACTION_ITEM = next(d for d in DILEMMAS if d.cbr_pole == "action")
COMPLEMENT_ITEM = next(d for d in DILEMMAS if d.cbr_pole == "complement")


# ====================================================================== expansion


def test_count_and_unique_stable_ids() -> None:
    spec = YesNoSpec(salts=SaltSpec(count=3, seed=4))
    trials = expand(spec)
    assert len(trials) == len(DILEMMAS) * len(FORMS) * 2 * 2 * 3
    ids = [t.trial_id for t in trials]
    assert len(set(ids)) == len(ids)
    assert [t.trial_id for t in expand(YesNoSpec(salts=SaltSpec(count=3, seed=4)))] == ids


def test_count_with_subset_of_forms_and_items() -> None:
    spec = YesNoSpec(forms=("should",), items=(COMPLEMENT_ITEM.id, ACTION_ITEM.id), salts=SaltSpec(count=2))
    trials = expand(spec)
    assert len(trials) == 2 * 1 * 2 * 2 * 2
    assert {t.item_id for t in trials} == {ACTION_ITEM.id, COMPLEMENT_ITEM.id}
    assert {t.factors["form"] for t in trials} == {"should"}


def test_order_of_trials_item_form_verb_order_replicate() -> None:
    spec = YesNoSpec(forms=("acceptable", "should"), items=(ACTION_ITEM.id,), salts=SaltSpec(count=2))
    got = [(t.factors["form"], t.factors["verb"], t.factors["order"], t.replicate) for t in expand(spec)]
    expected = list(
        itertools.product(("acceptable", "should"), ("approve", "oppose"), ("yes_first", "no_first"), (0, 1))
    )
    assert got == expected


def test_printed_order_and_question_text() -> None:
    spec = YesNoSpec(items=(ACTION_ITEM.id,))
    for t in expand(spec):
        (msg,) = t.messages
        assert msg.role == "user"
        form, verb, order = t.factors["form"], t.factors["verb"], t.factors["order"]
        q = FORMS[form][0 if verb == "approve" else 1].format(action=ACTION_ITEM.action)
        if order == "yes_first":
            assert t.options == ("Yes", "No")
            assert msg.content.endswith(f"{q} Answer with Yes or No.")
        else:
            assert t.options == ("No", "Yes")
            assert msg.content.endswith(f"{q} Answer with No or Yes.")
        assert msg.content.startswith(ACTION_ITEM.story)
        assert t.factors["labels"] == "Yes/No"


def _meaning_of(trial, label: str) -> str:
    return trial.meaning[trial.options.index(label)]


@pytest.mark.parametrize(
    ("item", "approve_yes", "oppose_yes"),
    [(ACTION_ITEM, "cbr", "anti"), (COMPLEMENT_ITEM, "anti", "cbr")],
    ids=["action_pole", "complement_pole"],
)
def test_meaning_mapping(item, approve_yes: str, oppose_yes: str) -> None:
    flip = {"cbr": "anti", "anti": "cbr"}
    trials = expand(YesNoSpec(items=(item.id,)))
    assert len(trials) == len(FORMS) * 4
    for t in trials:
        yes = approve_yes if t.factors["verb"] == "approve" else oppose_yes
        assert _meaning_of(t, "Yes") == yes, t.factors
        assert _meaning_of(t, "No") == flip[yes], t.factors


def test_custom_labels_carry_meaning_and_factor() -> None:
    trials = expand(YesNoSpec(items=(ACTION_ITEM.id,), forms=("acceptable",), labels=("Oui", "Non")))
    by_cell = {(t.factors["verb"], t.factors["order"]): t for t in trials}
    t = by_cell[("approve", "no_first")]
    assert t.options == ("Non", "Oui")
    assert t.meaning == ("anti", "cbr")
    assert t.factors["labels"] == "Oui/Non"
    assert t.messages[-1].content.endswith("Answer with Non or Oui.")


def test_salted_replicates_change_only_the_salt() -> None:
    spec = YesNoSpec(items=(ACTION_ITEM.id,), forms=("acceptable",), salts=SaltSpec(count=3, seed=9, n_tokens=4))
    trials = expand(spec)
    base = {(t.factors["verb"], t.factors["order"]): t for t in trials if t.replicate == 0}
    for t in trials:
        b = base[(t.factors["verb"], t.factors["order"])]
        if t.replicate == 0:
            assert t.salt == ""
            continue
        assert len(t.salt) == 8
        assert t.messages[-1].content == f"{t.salt}\n\n{b.messages[-1].content}"
        assert (t.options, t.meaning) == (b.options, b.meaning)
    assert len({t.salt for t in trials if t.replicate == 1}) == 1  # one salt per replicate, shared by cells
    assert {t.salt for t in trials if t.replicate == 1} != {t.salt for t in trials if t.replicate == 2}


def test_system_salt_adds_a_system_message() -> None:
    spec = YesNoSpec(items=(ACTION_ITEM.id,), forms=("acceptable",), salts=SaltSpec(count=2, place="system"))
    for t in expand(spec):
        if t.replicate == 0:
            assert [m.role for m in t.messages] == ["user"]
        else:
            assert [m.role for m in t.messages] == ["system", "user"]
            assert t.messages[0].content == t.salt


def test_unknown_item_id() -> None:
    with pytest.raises(ValueError, match=r"unknown dilemma ids.*no_such_dilemma"):
        expand(YesNoSpec(items=(ACTION_ITEM.id, "no_such_dilemma")))


@pytest.mark.parametrize("forms", [("acceptable", "nope"), ()])
def test_bad_forms(forms) -> None:
    with pytest.raises(ValueError, match="forms"):
        YesNoSpec(forms=forms)


@pytest.mark.parametrize("labels", [("Yes", "Yes"), ("Yes", ""), ("Yes",)])
def test_bad_labels(labels) -> None:
    with pytest.raises(ValueError, match="labels"):
        YesNoSpec(labels=labels)


# ====================================================================== analysis

CELLS = [("approve", "yes_first"), ("approve", "no_first"), ("oppose", "yes_first"), ("oppose", "no_first")]


def _frames(p: dict[tuple[str, str, str, str, int], float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(options, per_trial) frames for chosen P(CBR) per (item, form, verb, order, replicate).

    Each trial has two options; which one is printed first follows the order, as in a real run.
    """
    opt_rows, trial_rows = [], []
    for k, (item, form, verb, order, rep) in enumerate(p):
        tid = f"t{k}"
        trial_rows.append(
            {"trial_id": tid, "item_id": item, "replicate": rep, "form": form, "verb": verb, "order": order}
        )
        pairs = [("Yes", "cbr", p[item, form, verb, order, rep]), ("No", "anti", 1 - p[item, form, verb, order, rep])]
        if verb == "oppose":
            pairs = [("Yes", "anti", pairs[1][2]), ("No", "cbr", pairs[0][2])]
        if order == "no_first":
            pairs.reverse()
        for pos, (label, meaning, prob) in enumerate(pairs):
            opt_rows.append({"trial_id": tid, "option": label, "option_index": pos, "meaning": meaning, "prob": prob})
    return pd.DataFrame(opt_rows), pd.DataFrame(trial_rows)


def _one_item(cells: dict[tuple[str, str], float], item: str = "d1", forms=("f1",)) -> dict:
    return {(item, f, v, o, 0): cells[v, o] for f in forms for v, o in CELLS}


NO_ORDER = {("approve", "yes_first"): 0.9, ("approve", "no_first"): 0.7,
            ("oppose", "yes_first"): 0.4, ("oppose", "no_first"): 0.2}  # fmt: skip
WITH_ORDER = {("approve", "yes_first"): 0.8, ("approve", "no_first"): 0.4,
              ("oppose", "yes_first"): 0.3, ("oppose", "no_first"): 0.6}  # fmt: skip


def test_p_cbr_sums_cbr_options_per_trial() -> None:
    opts = pd.DataFrame(
        {
            "trial_id": ["a", "a", "b", "b", "b", "c"],
            "meaning": ["cbr", "anti", "anti", "cbr", "cbr", "anti"],
            "prob": [0.25, 0.75, 0.5, 0.2, 0.3, 1.0],
        }
    )
    got = p_cbr(opts)
    assert got.name == "p_cbr"
    assert got.to_dict() == pytest.approx({"a": 0.25, "b": 0.5, "c": 0.0})


def test_p_cbr_of_a_trial_with_no_usable_answer_is_nan_not_zero() -> None:
    # trial "r": every sampled draw refused, so count / n_ok is NaN for both options (probe.views.count_samples)
    opts = pd.DataFrame(
        {
            "trial_id": ["a", "a", "r", "r"],
            "meaning": ["cbr", "anti", "cbr", "anti"],
            "prob": [1.0, 0.0, np.nan, np.nan],
        }
    )
    got = p_cbr(opts)
    assert got["a"] == 1.0
    assert np.isnan(got["r"])


def _refused(p: dict, opts: pd.DataFrame, per_trial: pd.DataFrame, keys: list) -> pd.DataFrame:
    """``opts`` with the trials of ``keys`` (keys of ``p``) fully refused: prob NaN, as a sampled run stores them."""
    tids = {f"t{k}" for k, key in enumerate(p) if key in keys}
    out = opts.copy()
    out.loc[out["trial_id"].isin(tids), "prob"] = np.nan
    return out


def test_refused_trials_are_left_out_of_their_cell() -> None:
    # two forms; form f2 of (approve, yes_first) fully refused: the cell is f1's 0.9 alone, not (0.9 + 0) / 2
    p = _one_item(NO_ORDER, forms=("f1", "f2"))
    opts, per_trial = _frames(p)
    opts = _refused(p, opts, per_trial, [("d1", "f2", "approve", "yes_first", 0)])
    cells = cell_table(with_cbr_verb(per_trial, opts), p_cbr(opts))
    assert cells.loc["d1"].tolist() == pytest.approx([0.9, 0.7, 0.4, 0.2])
    assert dropped_stories(with_cbr_verb(per_trial, opts), p_cbr(opts)) == ()


def test_a_story_with_an_empty_cell_is_dropped_and_named() -> None:
    # d2's (oppose, no_first) cell: its only trial fully refused; d1 is complete and kept with its own values
    p = {**_one_item(NO_ORDER, "d1"), **_one_item(WITH_ORDER, "d2")}
    opts, per_trial = _frames(p)
    opts = _refused(p, opts, per_trial, [("d2", "f1", "oppose", "no_first", 0)])
    pc = p_cbr(opts)
    cells = cell_table(with_cbr_verb(per_trial, opts), pc)
    assert list(cells.index) == ["d1"]
    assert decompose(cells).loc["d1", "z"] == pytest.approx(((0.9 + 0.7 + 0.4 + 0.2) * 2 - 4) / 4)
    (d,) = dropped_stories(with_cbr_verb(per_trial, opts), pc)
    assert isinstance(d, Dropped) and d.item_id == "d2" and d.analysis == "yes/no verb flip"
    assert "cbr_verb=oppose, order=no_first (1 trials)" in d.reason


def test_cell_table_columns_and_values() -> None:
    opts, per_trial = _frames(_one_item(NO_ORDER))
    cells = cell_table(with_cbr_verb(per_trial, opts), p_cbr(opts))
    assert list(cells.columns) == [f"p_cbr_{v}_{o}" for v, o in CELLS]
    assert list(cells.index) == ["d1"]
    assert cells.loc["d1"].tolist() == pytest.approx([0.9, 0.7, 0.4, 0.2])


def test_decompose_hand_worked_no_order_effect() -> None:
    opts, per_trial = _frames(_one_item(NO_ORDER))
    dec = decompose(cell_table(with_cbr_verb(per_trial, opts), p_cbr(opts))).loc["d1"]
    assert dec["bias_yes_first"] == pytest.approx(0.5)
    assert dec["bias_no_first"] == pytest.approx(0.5)
    assert dec["lexical"] == pytest.approx(0.5)
    assert dec["order"] == pytest.approx(0.0, abs=1e-12)
    assert dec["apparent"] == pytest.approx(0.5)
    # z = mean(2p - 1) = mean(0.8, 0.4, -0.2, -0.6)
    assert dec["z"] == pytest.approx(0.1)


def test_decompose_hand_worked_with_order_effect() -> None:
    opts, per_trial = _frames(_one_item(WITH_ORDER))
    dec = decompose(cell_table(with_cbr_verb(per_trial, opts), p_cbr(opts))).loc["d1"]
    # bias_yf = 0.8 - 0.3 = 0.5; bias_nf = 0.4 - 0.6 = -0.2
    assert dec["bias_yes_first"] == pytest.approx(0.5)
    assert dec["bias_no_first"] == pytest.approx(-0.2)
    assert dec["lexical"] == pytest.approx(0.15)
    assert dec["order"] == pytest.approx(0.35)
    assert dec["apparent"] == pytest.approx(dec["lexical"] + dec["order"])
    # z = mean(0.6, -0.2, -0.4, 0.2)
    assert dec["z"] == pytest.approx(0.05)


def test_two_items_are_kept_apart() -> None:
    p = {**_one_item(NO_ORDER, "d1"), **_one_item(WITH_ORDER, "d2")}
    opts, per_trial = _frames(p)
    dec = decompose(cell_table(with_cbr_verb(per_trial, opts), p_cbr(opts)))
    assert dec.loc["d1", "order"] == pytest.approx(0.0, abs=1e-12)
    assert dec.loc["d2", "order"] == pytest.approx(0.35)
    assert dec.loc["d2", "z"] == pytest.approx(0.05)


def test_cells_average_over_forms() -> None:
    p = {}
    p.update(_one_item(NO_ORDER, forms=("f1",)))
    p.update(_one_item(WITH_ORDER, forms=("f2",)))
    p.update(_one_item({c: 0.0 for c in CELLS}, forms=("f3",)))
    opts, per_trial = _frames(p)
    cells = cell_table(with_cbr_verb(per_trial, opts), p_cbr(opts))
    expected = [(NO_ORDER[c] + WITH_ORDER[c] + 0.0) / 3 for c in CELLS]
    assert cells.loc["d1"].tolist() == pytest.approx(expected)


def test_cell_table_uses_one_replicate() -> None:
    p = _one_item(NO_ORDER)
    p.update({(i, f, v, o, 1): 0.0 for (i, f, v, o, _) in list(p)})
    opts, per_trial = _frames(p)
    pc = p_cbr(opts)
    assert cell_table(with_cbr_verb(per_trial, opts), pc).loc["d1"].tolist() == pytest.approx([0.9, 0.7, 0.4, 0.2])
    assert cell_table(with_cbr_verb(per_trial, opts), pc, replicate=1).loc["d1"].tolist() == pytest.approx([0.0] * 4)


def test_missing_cell_raises() -> None:
    p = {k: v for k, v in _one_item(NO_ORDER).items() if k[2:4] != ("oppose", "no_first")}
    opts, per_trial = _frames(p)
    with pytest.raises(ValueError, match="cells missing"):
        cell_table(with_cbr_verb(per_trial, opts), p_cbr(opts))


def test_missing_cell_for_one_item_raises() -> None:
    p = {**_one_item(NO_ORDER, "d1"), **_one_item(WITH_ORDER, "d2")}
    p = {k: v for k, v in p.items() if not (k[0] == "d2" and k[2:4] == ("oppose", "no_first"))}
    opts, per_trial = _frames(p)
    with pytest.raises(ValueError, match="cells missing"):
        cell_table(with_cbr_verb(per_trial, opts), p_cbr(opts))


def test_salt_noise_matches_numpy_std() -> None:
    rng = np.random.default_rng(0)
    p = {
        (item, form, v, o, rep): float(rng.uniform())
        for item in ("d1", "d2")
        for form in ("f1", "f2")
        for v, o in CELLS
        for rep in range(4)
    }
    opts, per_trial = _frames(p)
    sd = salt_noise(per_trial, p_cbr(opts))
    assert sd.name == "salt_sd"
    assert len(sd) == 2 * 2 * 4
    for item in ("d1", "d2"):
        for form in ("f1", "f2"):
            for v, o in CELLS:
                vals = [p[item, form, v, o, rep] for rep in range(4)]
                assert sd.loc[(item, form, v, o)] == pytest.approx(np.std(vals, ddof=1), rel=1e-12)


def test_salt_noise_zero_when_replicates_agree() -> None:
    p = {("d1", "f1", v, o, rep): 0.3 for v, o in CELLS for rep in range(3)}
    opts, per_trial = _frames(p)
    assert salt_noise(per_trial, p_cbr(opts)).tolist() == pytest.approx([0.0] * 4, abs=1e-15)


# ====================================================================== end to end


def _run_fixed_yes(trials, p_yes: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A fake model that says the yes label with probability ``p_yes`` whatever the question."""
    opt_rows, trial_rows = [], []
    for t in trials:
        trial_rows.append({"trial_id": t.trial_id, "item_id": t.item_id, "replicate": t.replicate, **t.factors})
        for pos, (o, m) in enumerate(zip(t.options, t.meaning, strict=True)):
            opt_rows.append(
                {
                    "trial_id": t.trial_id,
                    "option": o,
                    "option_index": pos,
                    "meaning": m,
                    "prob": p_yes if o == "Yes" else 1 - p_yes,
                }
            )
    return pd.DataFrame(opt_rows), pd.DataFrame(trial_rows)


def test_end_to_end_pure_yes_pull_on_action_pole_item() -> None:
    # P(yes) = 0.8 everywhere: no order effect, lexical = 0.8 - 0.2 = 0.6 toward yes
    opts, per_trial = _run_fixed_yes(expand(YesNoSpec(items=(ACTION_ITEM.id,))), 0.8)
    dec = decompose(cell_table(with_cbr_verb(per_trial, opts), p_cbr(opts))).loc[ACTION_ITEM.id]
    assert dec["lexical"] == pytest.approx(0.6)
    assert dec["order"] == pytest.approx(0.0, abs=1e-12)
    assert dec["z"] == pytest.approx(0.0, abs=1e-12)


def test_end_to_end_pure_yes_pull_on_complement_pole_item() -> None:
    opts, per_trial = _run_fixed_yes(expand(YesNoSpec(items=(COMPLEMENT_ITEM.id,))), 0.8)
    dec = decompose(cell_table(with_cbr_verb(per_trial, opts), p_cbr(opts))).loc[COMPLEMENT_ITEM.id]
    assert dec["z"] == pytest.approx(0.0, abs=1e-12)
    assert dec["lexical"] == pytest.approx(0.6)


# ------------------------------------------- issue 18: I-3 incoherence, parity, story CIs
def test_form_decomposition_and_i3_incoherence_by_hand() -> None:
    from analysis.battery.yesno import form_decomposition, i3_incoherence

    # f1 = NO_ORDER: lexical (0.5 + 0.5) / 2 = 0.5, order 0; f2 = WITH_ORDER: bias_yf 0.5, bias_nf -0.2,
    # lexical 0.15, order 0.35. Var_forms (ddof 1) of two values = (difference)^2 / 2
    p = {**_one_item(NO_ORDER, forms=("f1",)), **_one_item(WITH_ORDER, forms=("f2",))}
    opts, per_trial = _frames(p)
    wv = with_cbr_verb(per_trial, opts)
    var_p = pd.Series(0.004, index=per_trial["trial_id"])  # every cell: sampling variance 0.004
    forms = form_decomposition(wv, p_cbr(opts), var_p)
    assert forms.loc[("d1", "f1"), "lexical"] == pytest.approx(0.5)
    assert forms.loc[("d1", "f2"), "order"] == pytest.approx(0.35)
    assert forms["var_samp"].tolist() == pytest.approx([0.004, 0.004])  # 4 cells x 0.004 / 4
    assert forms["var_samp_apparent"].tolist() == pytest.approx([0.008, 0.008])
    inc = i3_incoherence(forms).loc["d1"]
    assert inc["sigma_lexical"] == pytest.approx(np.sqrt(0.35**2 / 2 - 0.004))
    assert inc["sigma_order"] == pytest.approx(np.sqrt(0.35**2 / 2 - 0.004))
    z1, z2 = np.mean([2 * v - 1 for v in NO_ORDER.values()]), np.mean([2 * v - 1 for v in WITH_ORDER.values()])
    assert inc["sigma_z"] == pytest.approx(np.sqrt(max(0.0, (z1 - z2) ** 2 / 2 - 0.004)))
    assert inc["n_forms"] == 2


def test_form_decomposition_takes_the_replicate_spread_when_salted() -> None:
    from analysis.battery.yesno import form_decomposition

    p = _one_item(NO_ORDER)
    p.update({(i, f, v, o, 1): val + 0.1 for (i, f, v, o, _), val in list(p.items())})
    opts, per_trial = _frames(p)
    forms = form_decomposition(with_cbr_verb(per_trial, opts), p_cbr(opts))
    # two replicates 0.1 apart: Var_r = 0.1^2 / 2 = 0.005 per cell; 4 cells / 4; the value is replicate 0's
    assert forms["var_samp"].tolist() == pytest.approx([0.005])
    assert forms.loc[("d1", "f1"), "lexical"] == pytest.approx(0.5)


def test_trial_variance_of_sampled_frequencies() -> None:
    from analysis.battery.yesno import trial_variance

    opts = pd.DataFrame(
        {
            "trial_id": ["a", "a", "b", "b", "c", "c"],
            "meaning": ["cbr", "anti"] * 3,
            "prob": [0.75, 0.25, 1.0, 0.0, np.nan, np.nan],
            "n_ok": [4, 4, 1, 1, 0, 0],
        }
    )
    v = trial_variance(opts)
    assert v["a"] == pytest.approx(0.75 * 0.25 / 3)
    assert np.isnan(v["b"]) and np.isnan(v["c"])
    assert bool((trial_variance(opts.drop(columns="n_ok")) == 0).all())  # a readout: nothing sampled


def test_parity_split_by_hand() -> None:
    from analysis.battery.yesno import parity_split

    p = {**_one_item(NO_ORDER, forms=("f1", "f3")), **_one_item(WITH_ORDER, forms=("f2",))}
    opts, per_trial = _frames(p)
    split = parity_split(with_cbr_verb(per_trial, opts), p_cbr(opts), ["f1", "f2", "f3"]).loc["d1"]
    assert split["lexical_even"] == pytest.approx(0.5) and split["order_even"] == pytest.approx(0.0)
    assert split["lexical_odd"] == pytest.approx(0.15) and split["order_odd"] == pytest.approx(0.35)
    with pytest.raises(ValueError, match="at least two forms"):
        parity_split(with_cbr_verb(per_trial, opts), p_cbr(opts), ["f1"])


def test_story_mean_ci_matches_a_brute_force_bootstrap() -> None:
    from analysis.battery.yesno import story_mean_ci

    x = pd.DataFrame({"order": [0.1, -0.3, 0.2, 0.0, np.nan], "lexical": [0.5, 0.4, 0.3, 0.2, 0.1]})
    ci = story_mean_ci(x, n_boot=500, seed=7)
    for col in x.columns:
        v = x[col].dropna().to_numpy()
        idx = np.random.default_rng(7).integers(0, len(v), size=(500, len(v)))
        means = np.array([v[row].mean() for row in idx])
        assert ci.loc[col, "mean"] == pytest.approx(v.mean())
        assert (ci.loc[col, "lo"], ci.loc[col, "hi"]) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
        assert ci.loc[col, "n"] == len(v)


def test_i3_sampling_correction_removes_pure_sampling_spread_on_the_sim() -> None:
    """No planted form scatter: the forms of an item differ only by sampling noise, which the correction removes.

    120 items x 3 forms, 8 draws per trial: the mean over items of Var_forms(z_f) - Var_samp is an unbiased
    estimate of 0; its per-item SD is ~0.021 (measured on 40 items: SE 0.0033), so over 120 items SE ~0.002
    and |mean| < 0.012 is 6 SE (false failure < 1e-6); the draws are hashed, so the figure is fixed.
    """
    import tests.battery_contract as bc
    from analysis.battery.yesno import form_decomposition, trial_variance
    from engines.sim.engine import SimEngine
    from engines.sim.params import SimParams

    items = [f"i{k:03d}" for k in range(120)]
    trials = bc.binary(items)
    opts, per = bc.frames_samples(trials, SimEngine(SimParams(seed=8), seed=9).sample(trials, 8, 1.0))
    per = per.assign(cbr_verb=per["verb"])
    forms = form_decomposition(per, p_cbr(opts), trial_variance(opts))
    g = forms.groupby(level="item_id")
    excess = g["z"].var(ddof=1) - g["var_samp"].mean()
    assert abs(float(excess.mean())) < 0.012
    assert float(g["z"].std(ddof=1).mean()) > 0.05  # the raw spread is not zero


def test_resampling_diagnostics_by_hand() -> None:
    from analysis.battery.yesno import resampling_diagnostics

    # one item, two forms, the four verb x order cells; 4 parsed draws each. Form f1 unanimous everywhere
    # (P(CBR) 1, 1, 0, 0); f2 P(CBR) 0.75, 0.25, 0.0, 0.0
    p = _one_item({("approve", "yes_first"): 1.0, ("approve", "no_first"): 1.0,
                   ("oppose", "yes_first"): 0.0, ("oppose", "no_first"): 0.0}, forms=("f1",))  # fmt: skip
    p.update(_one_item({("approve", "yes_first"): 0.75, ("approve", "no_first"): 0.25,
                        ("oppose", "yes_first"): 0.0, ("oppose", "no_first"): 0.0}, forms=("f2",)))  # fmt: skip
    opts, per_trial = _frames(p)
    opts["n_ok"] = 4
    r = resampling_diagnostics(with_cbr_verb(per_trial, opts), opts)
    assert r.unanimous == pytest.approx(6 / 8) and r.n_cells == 8
    # within: one draw's unbiased variance 4 p (1 - p) / 3 = 0.25 for p = 0.75 or 0.25, else 0: mean 0.5 / 8
    within = 2 * 0.25 / 8
    # between, per (verb, order): Var of (1, 0.75) = Var of (1, 0.25)... (0.25^2 / 2, 0.75^2 / 2, 0, 0): mean
    between = (0.25**2 / 2 + 0.75**2 / 2) / 4
    assert r.between_within == pytest.approx(between / within)
    # with order inside the form: per verb, Var of (1, 1, 0.75, 0.25) and of (0, 0, 0, 0)
    assert r.between_within_orders == pytest.approx(np.var([1, 1, 0.75, 0.25], ddof=1) / 2 / within)
    # (approve, no_first): f1 majority CBR (1.0), f2 majority anti (0.25): opposite
    assert r.opposite_majority == 1.0 and r.n_items == 1
    with pytest.raises(ValueError, match="sampled answers"):
        resampling_diagnostics(with_cbr_verb(per_trial, opts), opts.drop(columns="n_ok"))


# ====================================================================== the report


def test_a_run_that_reads_and_samples_reports_the_readout_temperature(tmp_path) -> None:
    """yesno with readouts and --samples (in process or through one server) gets the battery's calibration section;
    the synthetic subject samples at its planted temperature, so its readout temperature is fitted (seeded)."""
    from probe.app.cli import main

    out = tmp_path / "r"
    args = ["run", "yesno", "--model", "sim", "--items", "mine_cart_bridge,pond_child", "--out", str(out), "--quiet"]
    assert main([*args, "--samples", "4"]) == 0
    summary = (out / "report" / "summary.md").read_text()
    assert "## Readout temperature" in summary and "answers at the slot: T = " in summary
    assert (out / "report" / "calibration_T.csv").is_file()
    plain = tmp_path / "p"
    assert main([*args[:-3], "--out", str(plain), "--quiet"]) == 0  # readouts only: no such section
    assert "## Readout temperature" not in (plain / "report" / "summary.md").read_text()
