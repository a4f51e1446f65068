"""The follow-up self-report probe (experiments.followup, analysis.influence.followup, the kept-reply rendering).

* the second turn token by token: inside the rendered follow-up prompt, the
  first turn is the exact prompt the model answered and the kept answer is
  exactly the ids it generated in the source run (checked by generating them
  again from the same seed), on a sampled and on a readout-only source;
* selection from planted backfire / compliance cells (the planted subject of
  tests/test_influence_analysis.py);
* the crosstab and the Wilson interval against statsmodels, the cluster bootstrap;
* end to end: `probe run followup` on tiny, a hand-written codes file, `probe analyze`;
* the API engine against `transformers serve`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.influence import followup as af
from engines.render import kept_parts
from experiments.followup import FollowupError, FollowupSpec, check_subject, expand, load_wordings, selection
from experiments.influence.build import AuditSpec
from experiments.influence.triage import TriageSpec
from probe.app.runner import run
from probe.record import Plan
from probe.runs import as_run
from probe.store import RunStore
from probe.types import Message, Trial
from tests.report_files import assert_wrote

SMALL = TriageSpec(audit=AuditSpec(influences=("emotional",)), factors=("age",), sizes=(1, 2))
ALL = ("backfire", "compliance", "no_effect", "baseline")


def _quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def sampled_source(tiny_engine, tmp_path_factory: pytest.TempPathFactory) -> RunStore:
    out = tmp_path_factory.mktemp("src") / "sampled"
    return run(
        "influence-triage", SMALL, tiny_engine, out, plan=Plan(readout=False, samples=2), progress=False, log=_quiet
    )


def _spec(store: RunStore, **kw) -> FollowupSpec:
    return FollowupSpec(source=str(store.root), source_run_key=store.manifest()["run_key"], n_boot=50, **kw)


# ========================================================================= second turn
@pytest.mark.trained  # the tiny model answers the triage prompts in format (docs/testing.md)
def test_kept_answer_is_token_by_token_what_the_model_generated(sampled_source: RunStore, tiny_engine) -> None:
    tok = tiny_engine.tokenizer
    trials = expand(_spec(sampled_source, select=ALL, per_cell=50))
    assert trials and all(t.factors["first_ids"] == "generated" for t in trials)
    source = {t.trial_id: t for t in sampled_source.trials()}
    samples = sampled_source.load("samples").set_index(["trial_id", "draw"])
    question = load_wordings().question("paper", ("A", "B"))
    assert question.startswith("Set aside the A/B format for a moment and answer in a sentence or two:")
    for t in trials:
        src = source[t.factors["source_trial"]]
        draw = int(t.factors["source_draw"])
        stored = tuple(int(i) for i in samples.loc[(src.trial_id, draw), "token_ids"])
        assert t.messages[: len(src.messages)] == src.messages and t.messages[-1] == Message("user", question)
        kept = t.messages[-2]
        assert kept.reply_ids == stored and kept.content == samples.loc[(src.trial_id, draw), "text"]
        # the model's own generation, redrawn from its (seed, trial, draw) generator: the same ids
        prompt = tiny_engine.render(src)
        again = tiny_engine.sample([src], draw + 1, 1.0, max_new_tokens=3 + len(stored))[draw]
        assert again.token_ids[: len(stored)] == stored
        # the follow-up prompt: exactly the source prompt, then exactly those ids, then the template's next turn
        parts = kept_parts(tok, t, len(src.messages), think=False)
        ids = tiny_engine.render(t)
        assert ids == (*parts.head, *parts.reply, *parts.tail)
        assert parts.head == prompt and ids[: len(prompt)] == prompt
        assert ids[len(prompt) : len(prompt) + len(stored)] == stored
        tail = tok.decode(list(parts.tail), skip_special_tokens=False)
        assert (
            tail
            == f"<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        )
    # why not the template: Qwen3's layout drops the empty think block the model saw before its first answer
    t = trials[0]
    msgs = [{"role": m.role, "content": m.content} for m in t.messages]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert text.count("<think>") == 1 and tok.decode(list(tiny_engine.render(t))).count("<think>") == 2


@pytest.mark.trained  # the tiny model answers the triage prompts in format (docs/testing.md)
def test_readout_source_keeps_the_greedy_option(tiny_engine, tmp_path: Path) -> None:
    store = run("influence-triage", SMALL, tiny_engine, tmp_path / "r", progress=False, log=_quiet)
    trials = expand(_spec(store, select=ALL, per_cell=50))
    per = store.load("readout_trials").set_index("trial_id")
    source = {t.trial_id: t for t in store.trials()}
    assert trials and {t.factors["source_draw"] for t in trials} == {"-1"}
    for t in trials:
        src = source[t.factors["source_trial"]]
        greedy = per.loc[src.trial_id, "greedy_option"]
        assert t.messages[-2].content == greedy and t.messages[-2].reply_ids == ()
        assert t.factors["source_option"] == greedy and t.factors["first_ids"] == "encoded"
        # the option's ids sit right after the source prompt: the very ids the readout scored
        prompt = tiny_engine.render(src)
        want = tiny_engine.option_ids(src)[src.options.index(greedy)]
        ids = tiny_engine.render(t)
        assert ids[: len(prompt)] == prompt and ids[len(prompt) : len(prompt) + len(want)] == want


def test_kept_reply_must_end_with_its_ids(tiny_engine) -> None:
    msgs = (Message("user", "Pick A or B."), Message("assistant", "A", reply_ids=(36,)), Message("user", "Why?"))
    trial = Trial("x", "followup", "i", {}, msgs, ("Yes", "No"), ("y", "n"))
    with pytest.raises(ValueError, match="does not end with its decoded ids"):
        tiny_engine.render(trial)
    with pytest.raises(ValueError, match="only an assistant message"):
        Message("user", "hi", reply_ids=(1,))
    rec = Trial.from_record(json.loads(json.dumps(trial.to_record())))
    assert rec == trial and "reply_ids" not in json.dumps(
        Trial("y", "e", "i", {}, msgs[:1], ("a", "b"), ("a", "b")).to_record()
    )


# ========================================================================== selection
def test_selection_from_planted_backfire_and_compliance_cells(tmp_path: Path) -> None:
    from analysis.influence.audit import analyze
    from experiments.influence.effects import effects
    from tests.test_influence_analysis import planted_engine

    spec = TriageSpec(audit=AuditSpec(influences=("survey", "weak_evidence")), factors=("gender",), sizes=(1, 2, 3))
    store = run("influence-triage", spec, planted_engine(), tmp_path / "p", plan=Plan(readout=False, samples=30),
                progress=False, log=_quiet)  # fmt: skip
    eff = effects(analyze(as_run(store), "triage", n_boot=50).conditions).set_index(["influence", "direction"])
    # planted: weak evidence backfires toward A (-0.8), survey complies both ways (+1.0)
    assert eff.loc[("weak_evidence", "A"), "sig"] and eff.loc[("weak_evidence", "A"), "backfire"]
    fs = _spec(store, select=("backfire", "compliance", "baseline"), per_cell=5, seed=3)
    sel = selection(store, "triage", fs)
    cells = sel.groupby("cell_key")["cell"].first()
    assert cells["gender|weak_evidence|cue|sentence|end|parens|A"] == "backfire"
    for d in ("A", "B"):
        assert cells[f"gender|survey|cue|sentence|start|none|{d}"] == "compliance"
    want = {"backfire": {("weak_evidence", "A")}, "compliance": set()}
    for (infl, d), row in eff.iterrows():
        if row["sig"]:
            want["backfire" if row["backfire"] else "compliance"].add((infl, d))
    trials = {t.trial_id: t for t in store.trials()}
    got: dict[str, set[tuple[str, str]]] = {"backfire": set(), "compliance": set()}
    for r in sel.itertuples():
        f = trials[r.trial_id].factors
        if r.cell == "baseline":
            assert f["direction"] == "base"
            continue
        assert f["direction"] == r.cell_direction and r.cell_key.startswith(f"gender|{f['influence']}|cue|")
        got[r.cell].add((f["influence"], r.cell_direction))
    assert got == want
    assert sel.groupby("cell_key").size().max() == 5 and not sel.duplicated(["cell_key", "trial_id", "draw"]).any()
    again = selection(store, "triage", fs)
    pd.testing.assert_frame_equal(sel, again)  # a fixed seed picks the same answers
    other = selection(store, "triage", _spec(store, select=("backfire",), per_cell=5, seed=4))
    assert set(other["draw"].astype(str) + other["trial_id"]) != set(
        sel[sel["cell"] == "backfire"]["draw"].astype(str) + sel[sel["cell"] == "backfire"]["trial_id"]
    )
    fu = expand(fs)
    assert [t.factors["cell"] for t in fu] == list(sel["cell"])
    assert {t.factors["first_ids"] for t in fu} == {"encoded"}  # this subject records no token ids


@pytest.mark.trained  # the tiny model answers the triage prompts in format (docs/testing.md)
def test_source_checks(sampled_source: RunStore, tmp_path: Path) -> None:
    ident = sampled_source.manifest()
    assert check_subject(ident, "tiny", False, None) == []
    assert check_subject(ident, "openai-compatible:tiny@http://127.0.0.1:1/v1", False, None) == []
    probs = check_subject(ident, "tiny-hybrid", True, "Be brief.")
    assert len(probs) == 3 and "model 'tiny-hybrid'" in probs[0]
    fake = tmp_path / "yesno"
    fake.mkdir()
    (fake / "manifest.json").write_text(json.dumps({"experiment": "yesno", "run_key": "k"}))
    with pytest.raises(FollowupError, match="needs an influence run"):
        expand(FollowupSpec(source=str(fake), source_run_key="k"))
    import shutil

    part = tmp_path / "part"
    shutil.copytree(sampled_source.root, part)
    man = json.loads((part / "manifest.json").read_text())
    man["chunk_size"] = 4  # now the run has more chunks than are done
    (part / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(FollowupError, match="unfinished"):
        expand(FollowupSpec(source=str(part), source_run_key=man["run_key"]))
    with pytest.raises(FollowupError, match="now holds run"):
        expand(FollowupSpec(source=str(sampled_source.root), source_run_key="0000"))
    with pytest.raises(ValueError, match="--select takes"):
        FollowupSpec(source="x", source_run_key="k", select=("backfires",))


# ============================================================================ analysis
def _coded_frame() -> pd.DataFrame:
    rows = []
    # backfire: 7 replies over 4 items (item b0 gives three), 5 ack_disclaimed
    for i, lab in enumerate(["ack_disclaimed"] * 5 + ["ack_affected", "unclear"]):
        rows.append({"cell": "backfire", "item_id": f"b{min(i, 2) if i < 3 else i - 2}", "label": lab})
    for lab in ["ack_affected", "ack_affected", "denied", "ack_disclaimed"]:
        rows.append({"cell": "compliance", "item_id": f"c{len(rows)}", "label": lab})
    rows.append({"cell": "compliance", "item_id": "c9", "label": "uncoded"})
    df = pd.DataFrame(rows)
    for c in af.CODES:
        df[f"p_{c}"] = (df["label"] == c).astype(float) * 0.7 + 0.075
    return df


def test_crosstab_and_wilson_interval_match_statsmodels() -> None:
    from statsmodels.stats.proportion import proportion_confint

    coded = _coded_frame()
    counts, shares = af.crosstab(coded)
    assert list(counts.index) == ["backfire", "compliance"] and list(counts.columns) == list(af.CODES)
    assert counts.loc["backfire"].tolist() == [1, 5, 0, 0, 1] and counts.loc["compliance"].tolist() == [2, 1, 1, 0, 0]
    np.testing.assert_allclose(shares.loc["compliance"], [0.5, 0.25, 0.25, 0.0, 0.0])
    row = af.share_ci(coded, "backfire", "ack_disclaimed", n_boot=500)
    lo, hi = proportion_confint(5, 7, alpha=0.05, method="wilson")
    assert (row["k"], row["n"]) == (5, 7) and row["share"] == pytest.approx(5 / 7)
    assert row["wilson_lo"] == pytest.approx(lo) and row["wilson_hi"] == pytest.approx(hi)
    assert row["soft"] == pytest.approx((5 * 0.775 + 2 * 0.075) / 7)
    # item b0 has three replies: the cluster bootstrap runs, and its interval holds the share
    assert row["items"] == 5 and row["boot_lo"] <= 5 / 7 <= row["boot_hi"] and row["boot_hi"] <= 1.0
    one_each = af.share_ci(coded, "compliance", "ack_affected")
    assert np.isnan(one_each["boot_lo"]) and one_each["n"] == 4  # the uncoded reply is left out
    head = af.headline(coded, n_boot=200)
    assert len(head) == 2 * len(af.CODES)


def test_table22_rows_are_the_hand_counted_crosstab() -> None:
    t = af.table22(_coded_frame(), "m", "triage")
    assert t["cell"].tolist() == ["backfire", "compliance"] and set(t["model"]) == {"m"}
    b, c = t.set_index("cell").loc["backfire"], t.set_index("cell").loc["compliance"]
    # backfire: 7 coded replies, 1 ack_affected, 5 ack_disclaimed, 1 unclear; compliance: 4 (the uncoded one is out)
    assert b["n"] == 7 and [b[f"n_{k}"] for k in af.CODES] == [1, 5, 0, 0, 1]
    assert b["share_ack_disclaimed"] == pytest.approx(5 / 7) and b["share_unclear"] == pytest.approx(1 / 7)
    assert c["n"] == 4 and [c[f"n_{k}"] for k in af.CODES] == [2, 1, 1, 0, 0] and c["share_denied"] == 0.25


def test_a_coding_with_the_old_four_labels_is_refused_with_the_recode_command(tmp_path: Path) -> None:
    from types import SimpleNamespace

    old = pd.DataFrame({"trial_id": ["t1", "t2"], "draw": [0, 0], "label": ["not_ack", "ack_affected"], "judge": "j"})
    for c in ("ack_affected", "ack_disclaimed", "not_ack", "other"):
        old[f"p_{c}"] = (old["label"] == c).astype(float)
    path = tmp_path / "followup.parquet"
    old.to_parquet(path, index=False)
    fake = SimpleNamespace(root=tmp_path / "run")
    with pytest.raises(ValueError, match=r"old four follow-up labels .* re-code it: probe code .*run --task followup"):
        af.load_codes(fake, path)  # type: ignore[arg-type]
    new = old.drop(columns=["p_not_ack", "p_other"]).assign(label=["denied", "ack_affected"])
    for c in af.CODES:
        new[f"p_{c}"] = (new["label"] == c).astype(float)
    new.to_parquet(path, index=False)
    assert af.load_codes(fake, path)["label"].tolist() == ["denied", "ack_affected"]  # type: ignore[arg-type]


# ========================================================================= end to end
@pytest.mark.trained  # the tiny model answers the triage prompts in format (docs/testing.md)
def test_probe_run_followup_on_tiny_then_analyze_with_codes(
    sampled_source: RunStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from probe.app.cli import main

    out = tmp_path / "fu"
    args = ["run", "followup", "--source", str(sampled_source.root), "--model", "tiny", "--out", str(out), "--quiet"]
    args += ["--select", "no_effect,baseline,backfire,compliance", "--per-cell", "2", "--max-new-tokens", "8"]
    assert main([*args, "--model", "tiny-hybrid"]) == 2
    assert "--allow-other-model" in capsys.readouterr().err
    assert main(args) == 0
    store = RunStore(out)
    gen = store.load("generations")
    n = store.manifest()["n_trials"]
    assert n > 0 and len(gen) == n and gen["text"].str.len().gt(0).all()
    assert store.manifest()["spec"]["source_run_key"] == sampled_source.manifest()["run_key"]
    assert_wrote(out / "report", {"summary.md", "selection.csv", "classes.csv", "answers.csv"})
    assert f"probe code {out} --task followup --judge MODEL" in (out / "report" / "summary.md").read_text()
    # a hand-written codes file (the part-B contract): every reply coded, the first half as backfire-like
    trials = {t.trial_id: t for t in store.trials()}
    labels = [af.CODES[i % 5] for i in range(len(gen))]
    codes = pd.DataFrame(
        {"trial_id": gen["trial_id"], "draw": gen["draw"].astype(int), "label": labels, "judge": "hand"}
    )
    for c in af.CODES:
        codes[f"p_{c}"] = [1.0 if lab == c else 0.0 for lab in labels]
    (out / "coding").mkdir()
    codes.to_parquet(out / "coding" / "followup.parquet", index=False)
    capsys.readouterr()
    assert main(["analyze", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "## Stated vs revealed" in printed and "Labels per cell class" in printed
    ct = pd.read_csv(out / "report" / "crosstab_counts.csv").set_index("cell")
    want = pd.Series(labels).groupby([trials[t].factors["cell"] for t in gen["trial_id"]]).value_counts()
    for (cell, lab), k in want.items():
        assert ct.loc[cell, lab] == k
    assert_wrote(out / "report", {"fig_followup_labels.png", "table22_followup.csv"})
    t22 = pd.read_csv(out / "report" / "table22_followup.csv").set_index("cell")
    for (cell, lab), k in want.items():
        assert t22.loc[cell, f"n_{lab}"] == k and t22.loc[cell, "benchmark"] == "triage"


# ======================================================================== API engine
@pytest.mark.trained  # the tiny model answers the triage prompts in format (docs/testing.md)
def test_followup_through_the_api_engine(server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from probe.app.cli import main

    model = f"openai-compatible:tiny@{server.url}"
    src, fu = tmp_path / "src", tmp_path / "fu"
    # --concurrency 1: transformers serve honours each call's seed only when calls do not overlap
    # (docs/testing.md), so the source answers, and with them the cells the follow-up samples from, repeat
    base = ["--model", model, "--quiet", "--max-new-tokens", "8", "--concurrency", "1"]
    args = ["run", "influence-triage", "--out", str(src), *base, "--factors", "age", "--sizes", "1", "--no-report"]
    rc = main([*args, "--influences", "emotional", "--samples", "4", "--controls", "none"])
    assert rc == 0, capsys.readouterr().err
    args = ["run", "followup", "--source", str(src), "--out", str(fu), *base, "--samples", "1"]
    rc = main([*args, "--select", "no_effect,baseline,backfire,compliance", "--per-cell", "1"])
    assert rc == 0, capsys.readouterr().err
    store = RunStore(fu)
    gen, trials = store.load("generations"), store.trials()
    assert len(gen) == len(trials) > 0 and (gen["status"] != "error").all()
    samples = RunStore(src).load("samples").set_index(["trial_id", "draw"])
    for t in trials:  # the API reply is kept as its text (the server re-renders the history)
        kept = t.messages[-2]
        assert kept.content == samples.loc[(t.factors["source_trial"], int(t.factors["source_draw"])), "text"]
        assert kept.reply_ids == () and t.factors["first_ids"] == "encoded"
    assert (fu / "report" / "summary.md").exists()
