"""Coding texts with a judge (probe.app.coding, analysis.influence.coding): taxonomies, the label readout, resume,
agreement statistics against scikit-learn and statsmodels, `probe code` and `probe judge-agreement` end to end,
and an API judge against a real `transformers serve`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from probe.app import coding, coding_texts, taxonomy
from probe.app.cli import main
from probe.store import RunStore
from tests.report_files import assert_wrote

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ taxonomies
def test_shipped_taxonomies_load() -> None:
    f = taxonomy.load_taxonomy("followup")
    assert tuple(c.id for c in f.codes) == taxonomy.FOLLOWUP_CODES
    c = taxonomy.load_taxonomy("compliance")
    assert [x.id for x in c.codes] == ["complies", "resists", "discounts", "unresolved", "not_mentioned"]
    r = taxonomy.load_taxonomy("rationale")
    assert len(r.codes) == 18 and r.codes[0].id == "save_more_lives" and r.codes[-1].id == "none"
    assert set(r.benchmarks) == {"bbq", "dd"}
    assert len(r.codes_for("bbq")) == len(r.codes_for("dd")) == 24
    assert r.codes_for("triage") == r.codes and r.codes_for(None) == r.codes
    for task in taxonomy.TASKS:  # every validation set is balanced and uses only its taxonomy's codes
        items = taxonomy.load_validation(task)
        counts = pd.Series([i.gold for i in items]).value_counts()
        assert len(items) >= 30 and counts.max() == counts.min()


GOOD = """task: compliance
prompt: "Trace: {text}\\nCodes:\\n{codes}"
codes:
  - {id: yes_code, label: y, definition: d, example: e}
  - {id: no_code, label: n, definition: d, example: e}
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "tax.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("id: no_code", "id: No-Code"), r"code codes\[1\] \('No-Code'\): field 'id' must be lower case"),
        (
            (
                "definition: d, example: e}\n  - {id: no_code, label: n, definition: d",
                "definition: d, example: e}\n  - {id: no_code, label: n, definition: ''",
            ),
            r"\('no_code'\): field 'definition' must be a non-empty string",
        ),
        (("id: no_code", "id: yes_code"), "code id 'yes_code' appears twice"),
        (("{codes}", "{codes} {choices}"), r"unknown fields \['choices'\]"),
        (("Trace: {text}", "Trace:"), r"must contain \{text\}"),
        (("task: compliance", "task: sentiment"), "field 'task' must be one of"),
        (("label: y,", "label: y, colour: red,"), r"code codes\[0\] \('yes_code'\) has unknown fields \['colour'\]"),
    ],
)
def test_taxonomy_errors_name_file_code_and_field(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    assert taxonomy.load_taxonomy(_write(tmp_path, GOOD)).codes[1].id == "no_code"
    bad = _write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(taxonomy.TaxonomyError, match=message) as e:
        taxonomy.load_taxonomy(bad)
    assert str(bad) in str(e.value)


def test_followup_codes_are_a_contract(tmp_path: Path) -> None:
    text = (taxonomy.TAXONOMY_DIR / "followup.yaml").read_text().replace("id: denied", "id: not_ack")
    with pytest.raises(taxonomy.TaxonomyError, match="followup codes must be exactly"):
        taxonomy.load_taxonomy(_write(tmp_path, text.replace("code: denied", "code: not_ack")))
    # the earlier four codes: refused, with what to do
    old = GOOD.replace("task: compliance", "task: followup").replace("codes:\n", "codes:\n" + "".join(
        f"  - {{id: {c}, label: l, definition: d, example: e}}\n" for c in taxonomy.LEGACY_FOLLOWUP_CODES
    )).split("  - {id: yes_code")[0]  # fmt: skip
    with pytest.raises(taxonomy.TaxonomyError, match=r"old four follow-up codes .* use the paper.s five"):
        taxonomy.load_taxonomy(_write(tmp_path, old))
    text = (taxonomy.TAXONOMY_DIR / "rationales.yaml").read_text().replace("id: not_mentioned", "id: absent")
    with pytest.raises(taxonomy.TaxonomyError, match="rationales codes must be exactly"):
        taxonomy.load_taxonomy(_write(tmp_path, text))


def test_added_codes_must_be_new(tmp_path: Path) -> None:
    text = GOOD + "added:\n  bbq:\n    - {id: yes_code, label: y, definition: d, example: e}\n"
    with pytest.raises(taxonomy.TaxonomyError, match=r"added.bbq repeats base code ids \['yes_code'\]"):
        taxonomy.load_taxonomy(_write(tmp_path, text))


def test_cue_text_finds_inserted_words() -> None:
    from probe.types import Message

    base = (Message("system", "S"), Message("user", "Save A or B?\n\nAnswer with A or B."))
    cued = (Message("system", "S"), Message("user", "Save A or B?\nMost people prefer A.\n\nAnswer with A or B."))
    assert coding_texts.cue_text(cued, base, "survey") == "Most people prefer A."
    sys_cue = (Message("system", "You are old."), base[1])
    assert coding_texts.cue_text(sys_cue, base, "role_play") == "You are old."
    shots = (base[0], Message("user", "q1"), Message("assistant", "A"), base[1])
    assert coding_texts.cue_text(shots, base, "few_shot") == "1 worked examples before the question, answered: A"
    assert "not available" in coding_texts.cue_text(cued, None, "survey")


# ------------------------------------------------------------------ agreement vs sklearn / statsmodels
def test_agreement_matches_sklearn_and_statsmodels() -> None:
    sk = pytest.importorskip("sklearn.metrics")
    from statsmodels.stats.inter_rater import cohens_kappa

    from analysis.influence.coding import agreement, kappa_from_table

    rng = np.random.default_rng(3)
    codes = ["a", "b", "c", "d"]
    gold = list(rng.choice(codes, 60))
    pred = [g if rng.random() < 0.6 else str(rng.choice(codes)) for g in gold]
    ag = agreement(gold, pred, codes, n_boot=500, seed=1)
    assert ag.kappa == pytest.approx(sk.cohen_kappa_score(gold, pred), abs=1e-12)
    assert ag.accuracy == pytest.approx(sk.accuracy_score(gold, pred))
    m = sk.confusion_matrix(gold, pred, labels=codes)
    assert (ag.confusion.to_numpy() == m).all()
    recall = sk.recall_score(gold, pred, labels=codes, average=None)
    assert ag.recall["recall"].to_numpy() == pytest.approx(recall)
    sm = cohens_kappa(m)
    kappa, se = kappa_from_table(m)
    assert kappa == pytest.approx(sm.kappa) and se == pytest.approx(sm.std_kappa, rel=1e-9)
    assert ag.kappa_ci[0] < ag.kappa < ag.kappa_ci[1]
    # the bootstrap is seeded: same seed, same CI
    assert agreement(gold, pred, codes, n_boot=500, seed=1).kappa_ci == ag.kappa_ci


def test_agreement_hand_worked_and_unparsed() -> None:
    from analysis.influence.coding import agreement

    # 2x2: po = 0.75, pe = 0.5 * 0.5 + 0.5 * 0.5 = 0.5 -> kappa = 0.5
    ag = agreement(["x", "x", "y", "y"], ["x", "y", "y", "y"], ["x", "y"], n_boot=10)
    assert ag.accuracy == 0.75 and ag.kappa == pytest.approx(0.5)
    # an unparsed judge answer is wrong and gets its own column
    ag = agreement(["x", "y"], ["x", ""], ["x", "y"], n_boot=10)
    assert ag.accuracy == 0.5 and "(none)" in ag.confusion.columns


# ------------------------------------------------------------------ label readout on the tiny judge
@pytest.fixture(scope="module")
def tiny_judge(tiny_engine):
    return coding.LogitCoder(tiny_engine, "tiny")


def test_label_readout_equals_direct_readout(tiny_judge, tiny_engine) -> None:
    tax = taxonomy.load_taxonomy("followup")
    items = taxonomy.load_validation("followup")[:3]
    trials = [
        coding.judge_trial("followup", it.id, 0, coding.judge_prompt(tax, tax.codes, it.text, it.context), tax.codes)
        for it in items
    ]
    assert trials[0].options == taxonomy.FOLLOWUP_CODES
    assert "<<<\n" + items[0].text + "\n>>>" in trials[0].messages[0].content
    labels = tiny_judge.label(trials)
    direct = tiny_engine.readout(trials)
    for lab, r in zip(labels, direct, strict=True):
        assert lab.probs == {s.option: s.prob for s in r.scores}
        assert sum(lab.probs.values()) == pytest.approx(1.0, abs=1e-6)
        assert lab.coverage == r.coverage and lab.draws == 0
        assert json.loads(lab.raw) == [[t, p] for t, p in r.top_other]


# ------------------------------------------------------------------ coding a run
@pytest.fixture(scope="module")
def think_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("coding") / "think"
    args = ["run", "influence-triage", "--model", "tiny", "--out", str(out), "--quiet", "--no-report"]
    args += ["--factors", "gender", "--sizes", "1-2", "--influences", "survey,few_shot", "--controls", "none"]
    assert main([*args, "--think", "--think-budget", "16"]) == 0
    return out


class Interrupt(RuntimeError):
    pass


class Flaky:
    """A judge that dies after ``ok`` chunks (a killed coding run), counting the texts it labelled."""

    def __init__(self, inner, ok: int) -> None:
        self.inner, self.ok, self.calls, self.seen = inner, ok, 0, 0
        self.name, self.mode = inner.name, inner.mode

    def identity(self):
        return self.inner.identity()

    def label(self, trials):
        if self.calls >= self.ok:
            raise Interrupt("killed")
        self.calls += 1
        self.seen += len(trials)
        return self.inner.label(trials)


def test_code_run_resumes_and_matches_an_uninterrupted_run(think_run: Path, tiny_judge, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(think_run, run)
    flaky = Flaky(tiny_judge, ok=2)
    with pytest.raises(Interrupt):
        coding.code_run(run, "compliance", flaky, chunk_size=8, log=lambda m: None)
    parts = list((run / "coding").glob(".compliance-*/chunk-*.parquet"))
    assert len(parts) == 2 and not (run / "coding" / "compliance.parquet").exists()
    again = Flaky(tiny_judge, ok=99)
    res = coding.code_run(run, "compliance", again, chunk_size=8, log=lambda m: None)
    assert again.seen == 32 - 16  # only the missing chunks were judged
    other = tmp_path / "other"
    shutil.copytree(think_run, other)
    whole = coding.code_run(other, "compliance", tiny_judge, chunk_size=32, log=lambda m: None)
    pd.testing.assert_frame_equal(res.frame, whole.frame)
    assert not list((run / "coding").glob(".compliance-*"))  # the parts are gone once the file is whole


def test_probe_code_end_to_end_and_analyze(think_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Codes a private copy of the module's run: a coding already in the shared folder would read "already coded"."""
    run = tmp_path / "think"
    shutil.copytree(think_run, run)
    shutil.rmtree(run / "coding", ignore_errors=True)
    assert main(["code", str(run), "--task", "compliance", "--judge", "tiny", "--overwrite"]) == 0
    assert main(["code", str(run), "--task", "rationale", "--judge", "tiny", "--limit", "20"]) == 0
    out = capsys.readouterr().out
    assert "coded 32 texts (compliance) with logit:tiny" in out and "skipped 8 no_cue" in out
    assert "coded 20 texts (rationale)" in out
    comp = pd.read_parquet(run / "coding" / "compliance.parquet")
    meta = json.loads((run / "coding" / "compliance.json").read_text())
    codes = [c.id for c in taxonomy.load_taxonomy("compliance").codes]
    assert list(comp.columns[:3]) == ["trial_id", "draw", "label"]
    assert [c for c in comp.columns if c.startswith("p_")] == [f"p_{c}" for c in codes]
    assert comp[[f"p_{c}" for c in codes]].sum(axis=1).to_numpy() == pytest.approx(1.0, abs=1e-6)
    assert (comp["draw"] == -1).all() and (comp["origin"] == "readout").all()
    assert comp["label"].isin(codes).all() and (comp["judge"] == "logit:tiny").all()
    assert {"judge_prompt", "judge_raw", "coverage"} <= set(comp.columns)
    assert meta["counts"] == {
        "texts": 32, "coded": 32, "unparsed": 0, "skipped": {"no_cue": 8, "empty": 0},
        "not_coded_by_limit": 0, "by_origin": {"readout": 32},
    }  # fmt: skip
    assert meta["taxonomy"]["codes"] == codes and len(meta["taxonomy"]["sha256"]) == 64
    trials = {t.trial_id: t for t in RunStore(run).trials()}
    reasoning = RunStore(run).load("readout_trials").set_index("trial_id")["reasoning"]
    for row in comp.itertuples():  # every prompt holds its trace, and the cue of its trial
        assert reasoning[row.trial_id].strip() in row.judge_prompt
        assert trials[row.trial_id].factors["influence"] in row.judge_prompt
    survey = comp[comp["judge_prompt"].str.contains('"survey"')]
    assert survey["judge_prompt"].str.contains("In a recent survey, people preferred").all()
    # a second identical command does nothing; another judge's coding is kept unless --overwrite
    assert main(["code", str(run), "--task", "compliance", "--judge", "tiny"]) == 0
    assert "already coded" in capsys.readouterr().out
    assert main(["code", str(run), "--task", "compliance", "--judge", "tiny", "--samples", "2", "--limit", "2"]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert main(["analyze", str(run)]) == 0
    summary = (run / "report" / "summary.md").read_text()
    assert "## Coded reasoning traces: compliance" in summary and "## Coded reasoning traces: rationale" in summary
    assert_wrote(
        run / "report",
        {
            "coded_compliance_vs_effect.csv",
            "coded_compliance_by_label.csv",
            "coded_rationale_by_arm.csv",
            "coded_rationale_by_condition.csv",
            "coded_backfire_patterns.csv",
            "fig_coded_rationale.png",
            "fig_coded_compliance_effect.png",
        },
    )
    by_label = pd.read_csv(run / "report" / "coded_compliance_by_label.csv")
    assert by_label["traces"].sum() == 32


def test_sampling_judge_distribution_is_parsed_counts(think_run: Path, tiny_engine) -> None:
    judge = coding.SampleCoder(tiny_engine, "tiny", n=3)
    assert judge.temperature == 1.0 and coding.SampleCoder(tiny_engine, "tiny").temperature == 0.0
    tax = taxonomy.load_taxonomy("compliance")
    trial = coding.judge_trial("compliance", "t", 0, coding.judge_prompt(tax, tax.codes, "I follow it.", {}), tax.codes)
    (lab,) = judge.label([trial])
    texts = json.loads(lab.raw)
    assert len(texts) == 3
    from probe.parse import parse_answer

    parsed = [parse_answer(t, trial.options, think=False).option for t in texts]
    ok = [p for p in parsed if p is not None]
    assert lab.draws == len(ok) and lab.coverage == pytest.approx(len(ok) / 3)
    if ok:
        assert lab.probs == {c: ok.count(c) / len(ok) for c in trial.options}
    else:
        assert lab.probs is None


class ScriptedEngine:
    """Replies from a script, parsed by the shared parser: draw d of every trial answers ``replies[d]``."""

    name = "scripted"

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies

    def identity(self) -> dict[str, object]:
        return {"engine": self.name}

    def sample(self, trials, n, temperature, progress=None):  # type: ignore[no-untyped-def]
        from probe.parse import parsed_sample

        assert n == len(self.replies)
        return [parsed_sample(t, d, self.replies[d], 0, 0, think=False) for t in trials for d in range(n)]


def test_sampling_judge_shares_are_counts_over_parsed_draws_only() -> None:
    """Four draws: two name `complies`, one `resists`, one names no code: shares 2/3 and 1/3, coverage 3/4."""
    tax = taxonomy.load_taxonomy("compliance")
    prompt = coding.judge_prompt(tax, tax.codes, "I follow it.", {})
    trials = [coding.judge_trial("compliance", f"t{i}", 0, prompt, tax.codes) for i in range(2)]
    judge = coding.SampleCoder(ScriptedEngine(["complies", "resists", "no idea", "complies"]), "scripted", n=4)
    for lab in judge.label(trials):
        assert lab.draws == 3 and lab.coverage == pytest.approx(0.75)
        assert lab.probs is not None
        assert lab.probs["complies"] == pytest.approx(2 / 3) and lab.probs["resists"] == pytest.approx(1 / 3)
        assert sum(lab.probs.values()) == pytest.approx(1.0)
        assert json.loads(lab.raw) == ["complies", "resists", "no idea", "complies"]
    (none,) = coding.SampleCoder(ScriptedEngine(["??"]), "scripted", n=1).label(trials[:1])
    assert none.probs is None and none.draws == 0 and none.coverage == 0.0


def test_judge_agreement_on_the_tiny_judge(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "agree.csv"
    args = ["judge-agreement", "--task", "followup", "--judge", "tiny", "--n-boot", "200", "--out", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "judge logit:tiny on 40 hand-labelled followup texts" in text
    assert "accuracy" in text and "Cohen's kappa" in text and "confusion matrix" in text and "recall" in text
    frame = pd.read_csv(out)
    assert len(frame) == 40 and set(frame["gold"]) == set(taxonomy.FOLLOWUP_CODES)
    from analysis.influence.coding import agreement

    ag = agreement(frame["gold"], frame["label"], taxonomy.FOLLOWUP_CODES, n_boot=200)
    assert f"accuracy {ag.accuracy:.3f}" in text and f"Cohen's kappa {ag.kappa:.3f}" in text


# ------------------------------------------------------------------ API judge against transformers serve
def test_api_judge_codes_followup_answers(server, think_run: Path, tmp_path: Path, capsys) -> None:
    """A sampled run's answers coded as follow-up answers by an API judge (3 draws each at T = 1)."""

    run = tmp_path / "run"
    shutil.copytree(think_run, run)
    shutil.rmtree(run / "coding", ignore_errors=True)
    model = f"openai-compatible:tiny@{server.url}"
    sampled = tmp_path / "sampled"
    args = [
        "run",
        "influence-triage",
        "--model",
        "tiny",
        "--out",
        str(sampled),
        "--quiet",
        "--no-report",
        "--no-readout",
    ]
    args += ["--factors", "gender", "--sizes", "1", "--influences", "survey", "--controls", "none", "--samples", "1"]
    args += ["--max-new-tokens", "6"]
    assert main(args) == 0
    code = ["code", str(sampled), "--task", "followup", "--judge", model, "--samples", "3", "--max-new-tokens", "8"]
    code += ["--concurrency", "1"]  # the server honours each call's seed only when calls do not overlap
    assert main(code) == 0
    meta = json.loads((sampled / "coding" / "followup.json").read_text())
    assert meta["judge"]["identity"]["mode"] == "sample" and meta["judge"]["identity"]["n"] == 3
    counts = meta["counts"]
    # 6 sampled answers; an empty one (the model ended its turn at once) is skipped and counted, not coded
    assert counts["texts"] + counts["skipped"]["empty"] == 6 and counts["texts"] >= 1
    assert counts["coded"] + counts["unparsed"] == counts["texts"]
    frame = pd.read_parquet(sampled / "coding" / "followup.parquet")
    if len(frame):
        p = frame[[f"p_{c}" for c in taxonomy.FOLLOWUP_CODES]]
        assert p.sum(axis=1).to_numpy() == pytest.approx(1.0)
        assert ((p * 3).round(9) % 1 == 0).all().all()  # shares of three draws
        assert all(len(json.loads(r)) == 3 for r in frame["judge_raw"])
