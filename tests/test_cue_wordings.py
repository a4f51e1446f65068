"""Paraphrased what-if wordings (paper 001, App. Q): trials, ids, and the per-wording table by hand."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.common.report import write_report_files
from analysis.cue.metrics import decision_bias, wording_table
from analysis.cue.report import cue_report
from experiments.cue import CueSpec, expand
from probe.app.runner import run
from probe.runs import open_run
from probe.types import Trial
from tests.planted import PlantedCue

BASE = {"items": ("rent_arrears", "fallen_fence"), "conditions": ("neutral", "direct"), "probes": ("what_if",)}


def test_paraphrases_add_trials_and_keep_the_main_ids() -> None:
    main = expand(CueSpec(**BASE))
    all4 = expand(CueSpec(**BASE, wordings=("main", "v1", "v2", "v3")))
    assert {t.trial_id for t in main} <= {t.trial_id for t in all4}  # runs made before the paraphrases still resume
    whatif = [t for t in all4 if t.factors["probe"] == "what_if"]
    assert len(whatif) == 4 * sum(t.factors["probe"] == "what_if" for t in main)
    v2 = next(t for t in whatif if t.factors.get("wording") == "v2")
    assert "If individual A turns out to be the" in v2.messages[-1].content
    assert "wording" not in next(t for t in whatif if t.factors["individual"] == "A").factors
    with pytest.raises(ValueError, match="wordings"):
        CueSpec(**BASE, wordings=("v4",))


class _ByWording(PlantedCue):
    """P(benefit) 0.9 under Direct with the main wording, 0.2 with v1; Neutral 1/2."""

    def prob(self, t: Trial) -> float:
        if t.factors["condition"] == "direct" and t.factors.get("wording") == "v1":
            return 0.2
        return super().prob(t)


def test_wording_table_by_hand_and_main_tables_ignore_paraphrases(tmp_path: Path) -> None:
    spec = CueSpec(**BASE, wordings=("main", "v1"))
    out = tmp_path / "run"
    run("cue", spec, _ByWording("w", {"direct": 0.9}), out, progress=False, log=lambda s: None)
    options, per_trial, _ = open_run(out).choice_probs()
    wt = wording_table(options, per_trial, decision="expected", n_boot=0).set_index("wording")
    # expected decisions, p_s = 1/2: eligible favor = p, against = 1 - p; all parsable: favor = p/2, against = (1-p)/2
    assert wt.loc["main", "net_eligible"] == pytest.approx(0.8) and wt.loc["v1", "net_eligible"] == pytest.approx(-0.6)
    assert (wt.loc["v1", "favor_all"], wt.loc["v1", "against_all"]) == pytest.approx((0.1, 0.4))
    assert wt.loc["main", "net_all"] == pytest.approx(0.45 - 0.05)
    both, _ = decision_bias(options, per_trial, decision="expected", n_boot=0)
    main_only = per_trial[per_trial["wording"].fillna("") == ""]
    alone, _ = decision_bias(options[options["trial_id"].isin(main_only["trial_id"])], main_only, decision="expected",
                             n_boot=0)  # fmt: skip
    pd.testing.assert_frame_equal(both, alone)
    write_report_files(out / "report", *cue_report(open_run(out), n_boot=2))
    assert "What-if wordings (App. Q" in (out / "report" / "summary.md").read_text()
    assert (out / "report" / "cue_wordings.csv").exists()
