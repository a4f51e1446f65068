"""Label-map projections on hand-worked cells, and against the real battery expansion."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.battery.binary import cell_events, incomplete_stories, lexicality_gradient, projections


def _frames(rows):
    """rows: (tid, verb, order, mapping, yes_label, printed, meanings, probs)."""
    per, opts = [], []
    for tid, verb, order, mapping, yes, printed, means, probs in rows:
        per.append(
            {
                "trial_id": tid,
                "item_id": "d",
                "replicate": 0,
                "labels": "A/B",
                "verb": verb,
                "order": order,
                "mapping": mapping,
                "yes_label": yes,
            }
        )
        for pos, (o, m, p) in enumerate(zip(printed, means, probs, strict=True)):
            opts.append({"trial_id": tid, "option": o, "option_index": pos, "meaning": m, "prob": p})
    return pd.DataFrame(per), pd.DataFrame(opts)


def _design(p_of):
    """All 8 cells of verb x order x mapping for A/B, with P(option) given by p_of(option, position, verdict)."""
    rows = []
    k = 0
    for verb in ("approve", "oppose"):
        for order in ("yes_first", "no_first"):
            for mapping in ("canonical", "swapped"):
                yes, no = ("A", "B") if mapping == "canonical" else ("B", "A")
                printed = (yes, no) if order == "yes_first" else (no, yes)
                means = tuple("cbr" if (o == yes) == (verb == "approve") else "anti" for o in printed)
                raw = [p_of(o, i, "yes" if o == yes else "no") for i, o in enumerate(printed)]
                probs = tuple(r / sum(raw) for r in raw)
                rows.append((f"t{k}", verb, order, mapping, yes, printed, means, probs))
                k += 1
    return _frames(rows)


def test_pure_order_pull_shows_only_in_order():
    per, opts = _design(lambda o, pos, v: 0.7 if pos == 0 else 0.3)
    pr = projections(cell_events(per, opts), {"A/B"}).loc[("d", "A/B")]
    assert pr["order"] == pytest.approx(0.4)
    assert pr["logic"] == pytest.approx(0.0, abs=1e-12)
    assert pr["label"] == pytest.approx(0.0, abs=1e-12)
    assert pr["z"] == pytest.approx(0.0, abs=1e-12)


def test_pure_label_pull_toward_A():
    per, opts = _design(lambda o, pos, v: 0.8 if o == "A" else 0.2)
    pr = projections(cell_events(per, opts), {"A/B"}).loc[("d", "A/B")]
    assert pr["label"] == pytest.approx(0.6)
    assert pr["logic"] == pytest.approx(0.0, abs=1e-12) and pr["order"] == pytest.approx(0.0, abs=1e-12)


def test_pure_verdict_pull_toward_yes():
    per, opts = _design(lambda o, pos, v: 0.9 if v == "yes" else 0.1)
    pr = projections(cell_events(per, opts), {"A/B"}).loc[("d", "A/B")]
    assert pr["logic"] == pytest.approx(0.8)
    assert pr["label"] == pytest.approx(0.0, abs=1e-12) and pr["z"] == pytest.approx(0.0, abs=1e-12)


def test_label_is_nan_where_not_counterbalanced():
    per, opts = _design(lambda o, pos, v: 0.5)
    pr = projections(cell_events(per, opts), set()).loc[("d", "A/B")]
    assert np.isnan(pr["label"])


def test_lexicality_gradient_contrast_uses_the_label_pull_not_the_logic_projection():
    # Fig. 6 reading (issue 18, bug 2): A/B label pull -0.15 with logic 0 (Fig. 5) must show as -0.15;
    # story has no counterbalanced mapping, so its label pull is its logic projection
    idx = [("d", "A/B"), ("e", "A/B"), ("d", "Ja/Nein"), ("e", "Ja/Nein"), ("d", "story"), ("e", "story")]
    proj = pd.DataFrame(
        {
            "order": [0.0] * 6,
            "logic": [0.0, 0.0, 0.9, 0.9, 0.2, 0.4],
            "label": [-0.1, -0.2, -0.3, -0.5, np.nan, np.nan],
            "z": [0.0] * 6,
        },
        index=pd.MultiIndex.from_tuples(idx, names=["item_id", "labels"]),
    )
    by_pair, contrast = lexicality_gradient(proj, {"A/B": 0, "Ja/Nein": 2, "story": 2})
    assert list(by_pair.index) == ["A/B", "Ja/Nein", "story"]
    assert by_pair["label_pull"].tolist() == pytest.approx([-0.15, -0.4, 0.3])
    assert by_pair["pull_from"].tolist() == ["label", "label", "logic (mapping not crossed)"]
    # issue 27: story's pull is its logic projection, so by default it stays out of the contrast:
    # mean |pull| of the word pair Ja/Nein (0.4) minus the non-lexical A/B (0.15)
    assert contrast == pytest.approx(0.4 - 0.15)
    # with it, as Fig. 6 groups it: word pairs (0.4, 0.3); with logic in place of label it would be 0.6
    _, with_story = lexicality_gradient(proj, {"A/B": 0, "Ja/Nein": 2, "story": 2}, include_uncrossed=True)
    assert with_story == pytest.approx((0.4 + 0.3) / 2 - 0.15)


def _refuse(per, opts, tids):
    """The trials ``tids`` fully refused: a sampled trial with no usable draw has NaN probabilities."""
    opts = opts.copy()
    opts.loc[opts["trial_id"].isin(tids), "prob"] = np.nan
    return per, opts


def test_a_story_with_an_empty_cell_is_left_out_not_averaged():
    # issue 27 hand case: P(CBR) = 0.9 in every cell of one story, one cell fully refused.
    # The 7 surviving cells give order = logic = label = -0.8/7 = -0.114 (the removed cell has
    # 2P(first) - 1 = 2P(yes) - 1 = 2P(A) - 1 = +0.8); the truth is 0, and the story must be left out.
    per, opts = _design(lambda o, pos, v: 0.5)
    opts["prob"] = np.where(opts["meaning"] == "cbr", 0.9, 0.1)
    e_per = per.assign(item_id="e", trial_id="e" + per["trial_id"])
    e_opts = opts.assign(trial_id="e" + opts["trial_id"])
    per, opts = pd.concat([per, e_per], ignore_index=True), pd.concat([opts, e_opts], ignore_index=True)
    # the refused cell of story e: approve, yes_first, canonical (its first option is A = yes = CBR)
    cell = (per["item_id"] == "e") & (per["verb"] == "approve") & (per["order"] == "yes_first")
    refused = per.loc[cell & (per["mapping"] == "canonical"), "trial_id"].tolist()
    per, opts = _refuse(per, opts, refused)
    ev = cell_events(per, opts)

    # what averaging the surviving cells would give (the old rule), by hand
    e_cells = ev[(ev["item_id"] == "e") & ~ev["trial_id"].isin(refused)]
    for col in ("p_first", "p_yes", "p_label1"):
        assert float((2 * e_cells[col] - 1).mean()) == pytest.approx(-0.8 / 7)
    assert pytest.approx(-0.114, abs=5e-4) == -0.8 / 7

    pr = projections(ev, {"A/B"})
    assert list(pr.index) == [("d", "A/B")]  # e is left out
    story_mean = pr[["order", "logic", "label"]].mean()
    assert story_mean.tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)
    assert pr.loc[("d", "A/B"), "z"] == pytest.approx(0.8)  # the stance: 2 * 0.9 - 1
    (dropped,) = incomplete_stories(ev)
    assert dropped.item_id == "e" and dropped.analysis == "label map: A/B"
    assert "verb=approve, order=yes_first, mapping=canonical (1 trials)" in dropped.reason


def test_a_story_lacking_a_cell_of_the_design_is_left_out_too():
    per, opts = _design(lambda o, pos, v: 0.7 if pos == 0 else 0.3)
    keep = per["trial_id"] != "t0"
    per2, opts2 = per[keep], opts[opts["trial_id"] != "t0"]
    both = pd.concat([per, per2.assign(item_id="e", trial_id=lambda d: "e" + d["trial_id"])], ignore_index=True)
    o = pd.concat([opts, opts2.assign(trial_id=lambda d: "e" + d["trial_id"])], ignore_index=True)
    ev = cell_events(both, o)
    pr = projections(ev, {"A/B"})
    assert list(pr.index) == [("d", "A/B")]
    (dropped,) = incomplete_stories(ev)
    assert dropped.item_id == "e" and "(0 trials)" in dropped.reason


def test_battery_expansion_is_balanced_for_every_pair():
    from experiments.battery import BatterySpec, expand, load_corpus

    trials = expand(BatterySpec(items=("mine_cart_bridge", "dam_spillway"), instruments=("binary",)))
    corpus = load_corpus()
    by_pair: dict[str, list] = {}
    for t in trials:
        by_pair.setdefault(t.factors["labels"], []).append(t)
    assert set(by_pair) == set(corpus["binary"]["labels"])
    for pair, ts in by_pair.items():
        cb = corpus["binary"]["labels"][pair]["counterbalance"]
        n_forms = 12 if pair == "Yes/No" else 1
        assert len(ts) == 2 * n_forms * 4 * (2 if cb else 1), pair
        for t in ts:  # the affirmative label means cbr exactly under approve
            yes = t.factors["yes_label"]
            assert (t.meaning[t.options.index(yes)] == "cbr") == (t.factors["verb"] == "approve")
