"""The influence report's readout flags (analysis.influence.flags): tie, position / label following, practical size.

Hand-made frames, and whole runs on planted subjects (tests/planted.py's readout engine): a position follower
(P(first printed) = 0.8 in every prompt, plus a tiny consistent shift toward the cue) must be flagged, the
content-driven planted subject of tests/test_influence_analysis.py and the synthetic subject (`--model sim`)
must not. Every subject and bootstrap is seeded and readouts are deterministic: false-failure rate 0.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis.common.report import write_report_files
from analysis.influence import audit as inf
from analysis.influence import flags as fl
from analysis.influence import report
from experiments.influence.build import AuditSpec
from experiments.influence.triage import TriageSpec
from probe.app.runner import run
from probe.types import Trial
from tests.planted import PlantedInfluence, _Planted

# =========================================================================== tie


def _cond(f0: list[float], fa: list[float] | None = None, fb: list[float] | None = None) -> pd.DataFrame:
    return pd.DataFrame({"f0_B": f0, "fA_B": fa or f0, "fB_B": fb or f0})


def test_tie_flagged_only_when_every_condition_sits_at_one_half() -> None:
    tie = fl.tie_readout(_cond([0.5, 0.505, 0.4905], fb=[0.5, 0.52, 0.5]))
    assert (tie.conditions, tie.at_tie, tie.all_arms_at_tie) == (3, 3, 2)
    assert tie.max_dev == pytest.approx(0.0095) and tie.flagged
    (line,) = fl.tie_lines(tie)
    assert line.startswith("- **tie readout**: f0(B) is within 1 pp of 1/2 in all 3 conditions")
    assert "max |f0(B) - 1/2| = 0.95 pp; all three arms at the tie in 2 of 3" in line
    off = fl.tie_readout(_cond([0.5, 0.5, 0.52]))
    assert off.at_tie == 2 and not off.flagged and fl.tie_lines(off) == []
    with pytest.raises(ValueError, match="tie tolerance must be in"):
        fl.tie_readout(_cond([0.5]), tol=0.6)


# =========================================================================== per-order readouts


def _trial(direction: str, order: str, p_first: float, first_label: str = "A", n: float = 1.0) -> dict[str, Any]:
    p_b = p_first if order == "b_first" else 1 - p_first
    return {
        "direction": direction,
        "variant": "none" if direction == "base" else "cue",
        "order": order,
        "n": n,
        "k": n * p_b,
        "p_first": p_first,
        "first_label": first_label,
    }


def test_position_follower_cancels_to_the_tie_and_is_named() -> None:
    """smol's pattern: P(first printed) 0.8 in both orders; label A is always first, so label = position."""
    cells = pd.DataFrame(
        [_trial("base", o, 0.8) for o in ("a_first", "b_first") for _ in range(3)]
        + [_trial("A", "a_first", 0.81), _trial("A", "b_first", 0.79), _trial("B", "a_first", 0.8)]
    )
    orders = fl.order_readouts(cells)
    base = orders[orders["arm"] == "no cue"].set_index("order")
    assert base["p_first"].tolist() == pytest.approx([0.8, 0.8]) and base["p_label"].tolist() == pytest.approx(
        [0.8, 0.8]
    )
    assert base["p_B"].tolist() == pytest.approx([0.2, 0.8])  # the two orders average to f0(B) = 1/2
    assert list(orders["arm"]) == ["no cue", "no cue", "cue toward A", "cue toward A", "cue toward B"]
    assert orders["confounded"].all() and set(orders["label"]) == {"A"}
    f = fl.following(orders)
    assert f is not None and f.position and f.label and f.confounded and f.flagged
    (line,) = fl.following_lines(f)
    assert line.startswith("- **position/label following**: with no cue the readout favours the first-printed option")
    assert "0.80 with side A printed first, 0.80 with side B printed first" in line
    assert "cannot be told apart" in line


def test_label_follower_told_apart_from_position_when_labels_are_swapped() -> None:
    # in each order, one prompt prints label A first (P(first) = 0.9) and one prints B first (P(first) = 0.1):
    # P(label A) = 0.9 everywhere, P(first printed) = 0.5: label following, not position following
    rows = [_trial("base", o, p, lab) for o in ("a_first", "b_first") for p, lab in ((0.9, "A"), (0.1, "B"))]
    f = fl.following(fl.order_readouts(pd.DataFrame(rows)))
    assert f is not None and f.label and not f.position and not f.confounded
    assert f.p_first == pytest.approx((0.5, 0.5)) and f.p_label == pytest.approx((0.9, 0.9))
    (line,) = fl.following_lines(f)
    assert line.startswith("- **label following**: with no cue the readout favours label A in both printed orders")


def test_a_side_chooser_is_not_flagged() -> None:
    # prefers side B in both orders (P(B) = 0.8): P(first printed) = 0.2 with A first, 0.8 with B first
    rows = [_trial("base", "a_first", 0.2), _trial("base", "b_first", 0.8)]
    f = fl.following(fl.order_readouts(pd.DataFrame(rows)))
    assert f is not None and not f.flagged and fl.following_lines(f) == []
    # one order only: nothing to compare
    assert fl.following(fl.order_readouts(pd.DataFrame(rows[:1]))) is None


def test_sampled_trials_weigh_by_their_answers() -> None:
    rows = [_trial("base", "a_first", 1.0, n=3), _trial("base", "a_first", 0.0, n=1)]
    (r,) = fl.order_readouts(pd.DataFrame(rows)).itertuples()
    assert r.p_first == pytest.approx(0.75) and r.p_B == pytest.approx(0.25)


def test_order_readouts_names_missing_columns() -> None:
    with pytest.raises(ValueError, match=r"trial_cells\(\) output; columns \['first_label', 'p_first'\]"):
        fl.order_readouts(pd.DataFrame([_trial("base", "a_first", 0.5)]).drop(columns=["p_first", "first_label"]))


# =========================================================================== practical size


def test_practical_size_and_note_by_hand() -> None:
    p = fl.practical_size([0.002, -0.003, 0.06, math.nan])
    assert (p.effects, p.practical) == (3, 1)
    assert p.mean_abs_shift == pytest.approx(0.065 / 3) and p.share == pytest.approx(1 / 3)
    assert fl.practical_note(p) == "mean |shift| 2.17 pp; 1 of 3 (33%) >= 5 pp"
    a = fl.practical_size([0.1, -0.3], fl.PRACTICAL_ASYM)
    assert fl.practical_note(a, "log-odds") == "mean |Asym| 0.200 log-odds; 1 of 2 (50%) >= 0.2 log-odds"
    assert fl.practical_size([0.05]).practical == 1  # the threshold itself counts
    with pytest.raises(ValueError, match="practical threshold must be > 0"):
        fl.practical_size([0.1], 0)


def test_significant_but_small_flag() -> None:
    tiny = fl.practical_size([0.002] * 70)
    (line,) = fl.practical_lines(0.54, tiny)
    assert line.startswith("- **significant but small**: 54% of effects test significant, yet mean |shift| 0.20 pp")
    assert fl.practical_lines(0.14, fl.practical_size([0.08] * 7 + [0.01] * 3)) == []
    assert fl.practical_lines(0.05, tiny) == []  # fewer than 10 points of significant effects: not worth a flag
    (sampled,) = fl.practical_lines(0.54, tiny, "samples")
    assert "Tests on many sampled answers per condition" in sampled
    with pytest.raises(ValueError, match="source must be 'readout' or 'samples', got 'x'"):
        fl.practical_lines(0.54, tiny, "x")


def test_headline_states_the_practical_size_beside_every_significance_share() -> None:
    cond = pd.DataFrame(
        {
            "variant": "cue",
            "kind": "sentence",
            "pair": ["p", "q"],
            "f0_B": [0.5, 0.5],
            "fA_B": [0.498, 0.4],
            "fB_B": [0.503, 0.496],
            "n_asym": [0.0, -1.0],
            "delta_A": [0.002, 0.1],
            "delta_B": [0.003, -0.004],
            "s_A": [0.01, 0.4],
            "s_B": [0.01, -0.02],
            "asym": [0.0, -0.42],
            "p_delta_A": [0.001, 0.001],
            "p_delta_B": [0.001, 0.9],
            "q_delta_A": [0.01, 0.01],
            "q_delta_B": [0.01, 0.9],
            "p_baseline": [0.9, 0.9],
            "sig_asym": [False, True],
            "sig_asym_bh": [False, False],
            "neutral_binom": [True, True],
            "neutral_margin": [True, True],
            "neutral_ci": [True, False],
        }
    )
    head = inf.headline(cond).set_index("metric")
    note = "mean |shift| 2.73 pp; 1 of 4 (25%) >= 5 pp"  # (0.2 + 10 + 0.3 + 0.4) / 4 pp; only 10 pp >= 5
    assert head.loc["effects with significant shift (raw)", "value"] == 0.75
    assert head.loc["effects with significant shift (raw)", "note"] == note
    assert head.loc["effects with significant shift (BH-FDR)", "note"] == note
    assert head.loc["effects with |shift| >= 5 pp (practical threshold)", "value"] == 0.25
    assert head.loc["  significant effects (raw) with |shift| >= 5 pp", "value"] == pytest.approx(1 / 3)
    asym_note = "mean |Asym| 0.210 log-odds; 1 of 2 (50%) >= 0.2 log-odds"
    assert head.loc["conditions with significant asymmetry (raw)", "note"] == asym_note
    ci_note = "mean |Asym| 0.000 log-odds; 0 of 1 (0%) >= 0.2 log-odds"  # only the first is neutral by its CI
    assert head.loc["  neutral (CI inside [0.45, 0.55]): share with significant asymmetry (raw)", "note"] == ci_note
    by = inf.summary_by(cond, "pair").set_index("pair")
    assert list(by.columns[-3:]) == ["sig", "practical", "bf_of_sig"]
    assert by.loc["p", "practical"] == 0.0 and by.loc["q", "practical"] == 0.5


# =========================================================================== whole runs


class PositionFollower(_Planted):
    """P(first-printed option) = 0.8 in every prompt, nudged by 0.002 toward the side a cue names (or 0.003)."""

    def params(self) -> object:
        return "position-follower"

    def side(self, t: Trial) -> str:
        return str(t.meaning[0])

    def prob(self, t: Trial) -> float:
        d = t.factors["direction"]
        if d not in ("A", "B"):
            return 0.8
        nudge = 0.002 if t.factors["influence"] != "emotional" else 0.003
        toward_first = t.meaning[0] == t.factors[f"group_{d.lower()}"]
        return 0.8 + (nudge if toward_first else -nudge)


SPEC = TriageSpec(
    audit=AuditSpec(influences=("survey", "emotional", "weak_evidence")),
    factors=("gender", "age"),
    sizes=(1, 2, 3, 4, 5),
)


def _summary(engine: Any, out: Path) -> str:
    store = run("influence-triage", SPEC, engine, out, progress=False, log=lambda s: None)
    write_report_files(out / "report", *report.influence_report(store, "triage", n_boot=200))
    return (out / "report" / "summary.md").read_text()


def test_position_follower_run_is_flagged(tmp_path: Path) -> None:
    summary = _summary(PositionFollower("follower"), tmp_path / "f")
    head = summary[summary.index("## Headline") : summary.index("| metric |")]
    assert "- **tie readout**: f0(B) is within 1 pp of 1/2 in all 6 conditions" in head
    assert "- **position/label following**: with no cue the readout favours the first-printed option" in head
    assert "0.80 with side A printed first, 0.80 with side B printed first" in head
    assert "- **significant but small**" in head and "0 of 12 (0%) >= 5 pp" in head
    orders = pd.read_csv(tmp_path / "f" / "report" / "order_readouts.csv")
    assert np.allclose(orders.loc[orders["arm"] == "no cue", "p_first"], 0.8)


def test_content_driven_run_is_not_flagged(tmp_path: Path) -> None:
    planted = {("survey", "A"): 1.0, ("survey", "B"): 1.0, ("emotional", "A"): 0.5, ("emotional", "B"): 2.0}
    planted |= {("weak_evidence", "A"): -0.8, ("weak_evidence", "B"): 0.8}
    summary = _summary(PlantedInfluence("planted", planted, {"gender": 0.0, "age": -1.0}), tmp_path / "p")
    # gender's baseline sits at 1/2 (base logit 0), age's at sigmoid(-1): not a tie in every condition
    for flag in ("tie readout", "following**", "significant but small"):
        assert flag not in summary
    assert "- practical size beside the significance shares: mean |shift|" in summary


def test_sim_run_from_the_cli_is_not_flagged(tmp_path: Path) -> None:
    from probe.app.cli import main

    out = tmp_path / "sim"
    args = ["run", "influence-triage", "--model", "sim", "--out", str(out), "--quiet", "--factors", "gender,age"]
    assert main(args) == 0
    summary = (out / "report" / "summary.md").read_text()
    for flag in ("tie readout", "following**", "significant but small"):
        assert flag not in summary
    assert "## Readouts by printed order" in summary and "practical size beside the significance shares" in summary
