"""Label-map projections on hand-worked cells, and against the real battery expansion."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.binary import cell_events, lexicality_gradient, projections


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
            opts.append({"trial_id": tid, "option": o, "position": pos, "meaning": m, "prob": p})
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
    # mean |pull| of the word pairs (0.4, 0.3) minus the non-lexical (0.15); with logic it would be 0.6
    assert contrast == pytest.approx((0.4 + 0.3) / 2 - 0.15)


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
