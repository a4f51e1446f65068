"""The I-2 judge through the API engine (``--judge openai-compatible:...``): the verdict shares by hand, and a tiny
battery run's free choices judged through ``probe serve`` (``transformers serve`` on localhost, the ``server``
fixture), its ``judgments`` table in the local judge's format, read by the battery's I-2 section.

The real server's answers are never mocked: the tiny model is the judge, and what it answers is whatever it
answers; the test checks the format, that each verdict is the one its draws name, and that the report reads it.
The vLLM server case is ``tests/test_judge_api_vllm.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments.judge import VERDICTS
from experiments.judge_api import is_api_spec, shares, verdict_of
from probe.types import Sample

ITEM = "mine_cart_bridge"


def _s(option: str | None, status: str = "ok", r: int = 0) -> Sample:
    return Sample("t", r, option or "?", option, status)  # type: ignore[arg-type]


def test_shares_and_verdict_by_hand() -> None:
    # three draws: PRO, PRO, ANTI (and one unparsed, left out): 2/3, 1/3, 0
    p = shares([_s("PRO"), _s("PRO", r=1), _s("ANTI", r=2), _s(None, "invalid", r=3)])
    assert p == pytest.approx({"PRO": 2 / 3, "ANTI": 1 / 3, "NONCOMMIT": 0.0})
    assert verdict_of(p) == "PRO"
    assert verdict_of({"PRO": 0.5, "ANTI": 0.5, "NONCOMMIT": 0.0}) == "NONCOMMIT"  # a tie commits to neither
    assert shares([_s(None, "invalid"), _s("PRO", "refusal")]) is None
    assert verdict_of(None) == "NONCOMMIT"


def test_api_specs_are_routed_to_the_api_judge() -> None:
    assert all(
        is_api_spec(s) for s in ("openai:gpt-5.5", "anthropic:claude-opus-4-8", "openai-compatible:m@http://h/v1")
    )
    assert not any(is_api_spec(s) for s in ("rule", "tiny", "vllm:tiny", "sim"))


def _run_battery(out: Path, judge: str) -> None:
    from probe.app.cli import main

    args = ["run", "battery", "--model", "tiny", "--items", ITEM, "--instruments", "choice,graded"]
    args += ["--framings", "choose,decide", "--scales", "0-10", "--wordings", "acceptable"]
    args += ["--judge", judge, "--concurrency", "1", "--out", str(out), "--quiet"]
    assert main(args) == 0


@pytest.mark.samples
def test_api_judge_codes_a_tiny_runs_free_choices_through_probe_serve(server, tmp_path: Path) -> None:
    from probe.store import RunStore

    spec = f"openai-compatible:tiny@{server.url}"
    out = tmp_path / "judged"
    _run_battery(out, spec)
    store = RunStore(out)
    gens, judged = store.load("generations"), store.load("judgments")
    assert len(judged) == len(gens) == 2 * 2  # 2 framings x 2 print orders, one greedy reply each
    # the local judge's format: the same stored columns, dtypes and rows as the same run judged by the rule judge
    _run_battery(tmp_path / "rule", "rule")
    rule = RunStore(tmp_path / "rule").load("judgments")
    assert list(judged.columns) == list(rule.columns)
    assert dict(judged.dtypes) == dict(rule.dtypes)
    assert sorted(zip(judged["trial_id"], judged["draw"], strict=True)) == sorted(
        zip(rule["trial_id"], rule["draw"], strict=True)
    )
    assert set(judged["judge"]) == {f"api:{spec}"}
    assert set(judged["verdict"]) <= set(VERDICTS)
    p = judged[["p_pro", "p_anti", "p_noncommit"]].to_numpy()
    assert p.sum(axis=1) == pytest.approx(1.0)
    # one draw per reply at temperature 0: each probability is 0 or 1 and the verdict is the one with 1
    assert set(p.ravel()) <= {0.0, 1.0}
    col = {"PRO": "p_pro", "ANTI": "p_anti", "NONCOMMIT": "p_noncommit"}
    assert all(row[col[row["verdict"]]] == 1.0 for _, row in judged.iterrows())
    ident = json.loads((out / "manifest.json").read_text())["identity"]["judge"]
    assert (ident["judge"], ident["provider"], ident["model"], ident["n"], ident["temperature"]) == (
        "api",
        "openai-compatible",
        "tiny",
        1,
        0.0,
    )
    # the battery's I-2 section reads it: its judge line names this judge, its per-dilemma table the shares
    summary = (out / "report" / "summary.md").read_text()
    assert f"Verdicts by judge `api:{spec}` over 4 replies" in summary
    choice = pd.read_csv(out / "report" / "choice_by_item.csv", index_col=0)
    share = judged["p_pro"].mean()  # one dilemma: P(PRO) is the mean of the four judged replies' p_pro
    assert choice.iloc[0]["p_pro"] == pytest.approx(share)


def test_make_judge_builds_a_sampling_api_engine_for_every_api_spec() -> None:
    """``--judge openai-compatible:...`` is the API engine (sampled), even where the run reads the slot."""
    import argparse

    from experiments.judge import RuleJudge
    from experiments.judge_api import ApiJudge, make_free_choice_judge

    assert isinstance(make_free_choice_judge("rule"), RuleJudge)
    j = make_free_choice_judge("openai-compatible:m@http://127.0.0.1:9/v1", argparse.Namespace(no_readout=False))
    assert isinstance(j, ApiJudge) and j.engine.name == "api"
    assert j.identity()["provider"] == "openai-compatible" and j.name == "api:openai-compatible:m@http://127.0.0.1:9/v1"


def test_a_dry_run_with_a_local_subject_is_refused_before_any_call() -> None:
    import argparse

    from experiments.judge_api import make_free_choice_judge

    a = argparse.Namespace(model="tiny", dry_run=True)
    with pytest.raises(ValueError, match="drop --dry-run"):
        make_free_choice_judge("openai-compatible:m@http://127.0.0.1:9/v1", a)
