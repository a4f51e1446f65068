"""probe.open_run: the notebook API the viewer reads through (issue 29).

Runs of the sim engine (seconds): the yes/no battery on two dilemmas, sampled,
with planted refusals and partial coverage, in chunks of 8 trials; and the
cue experiment, whose factor ``status`` must not clash with the samples'
column of that name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import probe
from probe import runs as runs_mod
from probe import trial_index
from probe.app.cli import main
from probe.errors import ProbeError, StoreError
from probe.query import FilterError, RunQuery, TrialFilter
from probe.runs import COLUMNS, TRIAL_COLUMNS, NotARunError, open_run, run_folders
from probe.store import RunStore
from tests.view_runs import ITEMS, index_cache, sim_run  # noqa: F401 (index_cache: autouse fixture)


@pytest.fixture(scope="module")
def yesno(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sim_run(tmp_path_factory.mktemp("runs") / "yesno-sim", "--no-report")


@pytest.fixture(scope="module")
def cue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "cue-sim"
    assert main(["run", "cue", "--model", "sim", "--out", str(out), "--quiet", "--no-report"]) == 0
    return out


def _dtypes(frame: pd.DataFrame) -> dict[str, str]:
    return {c: str(t) if str(t) != "str" else "string" for c, t in frame.dtypes.items()}


def test_import_probe_is_cheap_and_open_run_is_lazy() -> None:
    import subprocess
    import sys

    code = (
        "import sys, probe; print('pandas' in sys.modules, 'pyarrow' in sys.modules); print(probe.open_run.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "probe.runs"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        probe.nope  # noqa: B018


def test_frames_have_the_documented_columns_and_dtypes(yesno: Path) -> None:
    run = probe.open_run(yesno)
    factors = ["form", "labels", "order", "verb"]
    assert run.factor_names == tuple(factors)
    expected_trials = {**TRIAL_COLUMNS, **dict.fromkeys(factors, "category")}
    assert _dtypes(run.trials) == expected_trials
    assert list(run.trials.columns) == list(expected_trials)
    for kind in ("readouts", "options", "samples", "codes"):
        frame = getattr(run, kind)
        want = {**expected_trials, **COLUMNS[kind]}
        assert list(frame.columns) == list(want), kind
        if len(frame):
            assert _dtypes(frame) == want, kind
    assert len(run.trials) == run.n_trials == 24
    assert len(run.readouts) == 24 and len(run.options) == 48 and len(run.samples) == 72
    assert run.codes.empty  # the yes/no battery has no judge
    # every option row is a stored readout row, and the probabilities are the stored ones exactly
    stored = RunStore(yesno).load("readout_options")
    merged = run.options.merge(stored, on=["trial_id", "option"], suffixes=("", "_stored"))
    assert len(merged) == len(stored)
    assert (merged["prob"] == merged["prob_stored"]).all() and (merged["logprob"] == merged["logprob_stored"]).all()
    # the joins carry the trial's own values: the factors and the meaning of each option
    trials = {t.trial_id: t for t in RunStore(yesno).trials()}
    for row in run.options.head(6).itertuples():
        t = trials[row.trial_id]
        assert row.meaning == t.meaning[t.options.index(row.option)]
        assert row.order == t.factors["order"] and row.item_id == t.item_id
    assert run.options.groupby("trial_id")["greedy"].sum().eq(1).all()


def test_empty_frames_keep_their_columns_and_dtypes(yesno: Path) -> None:
    codes = probe.open_run(yesno).codes
    assert codes.empty
    assert {c: str(t) for c, t in codes.dtypes.items() if c in COLUMNS["codes"]} == COLUMNS["codes"]


def test_a_factor_named_like_a_column_is_spread_as_factor_name(cue: Path) -> None:
    run = open_run(cue)
    assert "status" in run.factor_names
    assert "factor_status" in run.trials.columns and "status" not in run.trials.columns
    assert runs_mod.factor_column("status") == "factor_status" and runs_mod.factor_column("instrument") == "instrument"
    value = str(run.trials["factor_status"].dropna().iloc[0])
    page = run.page(TrialFilter.parse([("factor_status", value)]), 0, 5)
    assert page.total == int((run.trials["factor_status"] == value).sum()) > 0


def test_trial_is_the_stored_trial(yesno: Path) -> None:
    run = open_run(yesno)
    stored = RunStore(yesno).trials()
    for t in (stored[0], stored[13], stored[-1]):
        assert run.trial(t.trial_id) == t
    with pytest.raises(KeyError, match="no trial 'nope'"):
        run.trial("nope")


def test_page_filters_and_paging(yesno: Path) -> None:
    run = open_run(yesno)
    trials = run.trials
    everything = run.page(TrialFilter(), 0, 10)
    assert everything.total == 24 and list(everything.rows["position"]) == list(range(10))
    second = run.page(TrialFilter(), 20, 10)
    assert list(second.rows["position"]) == [20, 21, 22, 23]
    one = run.page(TrialFilter.parse([("item", "pond_child"), ("order", "yes_first")]), 0, 50)
    want = trials[(trials.item_id == "pond_child") & (trials.order == "yes_first")]
    assert one.total == len(want) == 6 and list(one.rows["trial_id"]) == list(want.trial_id)
    either = run.page(TrialFilter.parse([("verb", "approve"), ("verb", "oppose")]), 0, 50)
    assert either.total == 24
    readouts = run.readouts
    yes = run.page(TrialFilter(option="Yes"), 0, 50)
    assert set(yes.rows["trial_id"]) == set(readouts.trial_id[readouts.greedy_option == "Yes"])
    low = run.page(TrialFilter(coverage_below=0.9), 0, 50)
    assert set(low.rows["trial_id"]) == set(readouts.trial_id[readouts.coverage < 0.9]) and low.total > 0
    assert run.page(TrialFilter(coverage_below=0.5), 0, 50).total == int((readouts.coverage < 0.5).sum())
    samples = run.samples
    refused = run.page(TrialFilter(status="refusal"), 0, 50)
    assert set(refused.rows["trial_id"]) == set(samples.trial_id[samples.status == "refusal"]) and refused.total > 0
    # the row of a page shows the greedy option, its probability and the replies' statuses
    row = refused.rows.iloc[0]
    opts = run.options[run.options.trial_id == row.trial_id]
    assert row.greedy_prob == float(opts.prob[opts.greedy].iloc[0]) and "refusal" in row.statuses


def test_disagree_is_greedy_against_the_sampled_majority(yesno: Path) -> None:
    run = open_run(yesno)
    parsed = run.samples.dropna(subset=["option"])
    greedy = run.readouts.set_index("trial_id")["greedy_option"]
    want = set()
    for tid, group in parsed.groupby("trial_id"):
        counts = group["option"].value_counts()
        top = counts[counts == counts.max()]
        if len(top) != 1 or top.index[0] != greedy[tid]:
            want.add(tid)
    got = run.page(TrialFilter(disagree=True), 0, 100)
    assert set(got.rows["trial_id"]) == want and 0 < len(want) < 24


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([("item", "no_such_item")], r"unknown item 'no_such_item'.*known items: mine_cart_bridge, pond_child"),
        ([("colour", "red")], r"unknown filter 'colour'.*factors form, labels, order, verb"),
        ([("order", "sideways")], r"unknown value 'sideways' of factor 'order'.*its values: no_first, yes_first"),
        ([("option", "Maybe")], r"unknown option 'Maybe'.*options: No, Yes"),
        ([("status", "fine")], r"unknown parse status 'fine'; statuses: ok, refusal, invalid, error"),
        ([("coverage_below", "lots")], r"coverage_below must be a number"),
        ([("coverage_below", "2")], r"coverage_below must lie in \[0, 1\], got 2.0"),
    ],
)
def test_an_unknown_filter_value_names_itself_and_the_known_ones(yesno: Path, pairs: list, message: str) -> None:
    run = open_run(yesno)
    with pytest.raises(FilterError, match=message) as err:
        run.page(TrialFilter.parse(pairs))
    assert isinstance(err.value, ProbeError)


def test_filter_round_trips_through_its_pairs() -> None:
    pairs = [
        ("item", "a"),
        ("order", "x"),
        ("order", "y"),
        ("option", "Yes"),
        ("coverage_below", "0.5"),
        ("disagree", "1"),
    ]
    flt = TrialFilter.parse(pairs)
    assert TrialFilter.parse(flt.pairs()) == flt
    assert flt.factors == (("order", ("x", "y")),) and flt.coverage_below == 0.5 and flt.disagree


def test_trial_data_reads_one_trial(yesno: Path) -> None:
    run = open_run(yesno)
    tid = run.trials.trial_id[9]
    data = run.trial_data(tid)
    assert data.position == 9 and data.chunk.chunk == 1 and data.chunk.status == "verified"
    assert data.readout is not None and data.readout["greedy_option"] in ("Yes", "No")
    assert list(data.options["option"]) == list(data.trial.options)
    assert list(data.samples["draw"]) == [0, 1, 2]
    expected = run.samples[run.samples.trial_id == tid]
    assert list(data.samples["status"]) == list(expected["status"].astype(str))


def test_not_a_run_says_what_the_folder_is(tmp_path: Path, yesno: Path) -> None:
    with pytest.raises(NotARunError, match=r"does not exist; give the --out folder of `probe run`"):
        open_run(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotARunError, match=r"is not a run folder \(no manifest.json\)"):
        open_run(tmp_path / "empty")
    report = tmp_path / "run"
    shutil.copytree(yesno, report)
    (report / "report").mkdir(exist_ok=True)
    with pytest.raises(NotARunError, match=r"is the report of a run; give the run folder itself"):
        open_run(report / "report")
    shards = tmp_path / "sharded"
    shutil.copytree(yesno, shards / "shard-0-of-2")
    with pytest.raises(NotARunError, match=r"unmerged shards.*probe merge"):
        open_run(shards)


def test_a_compare_folder_names_its_runs(tmp_path: Path, yesno: Path, cue: Path) -> None:
    folder = tmp_path / "cmp"
    folder.mkdir()
    (folder / "panel.csv").write_text(
        f"name,model,reasoning,experiment,run\na,sim,False,yesno,{yesno}\nb,sim,False,cue,{cue}\n"
    )
    assert run_folders(folder) == (yesno, cue)
    assert run_folders(yesno) == (yesno,)
    with pytest.raises(NotARunError, match=r"probe compare` folder"):
        open_run(folder)
    (folder / "panel.csv").write_text("name,run\na,gone\n")
    with pytest.raises(NotARunError, match=r"lists run 'gone', which is not a run folder here"):
        run_folders(folder)


def test_a_damaged_chunk_is_reported_never_dropped(tmp_path: Path, yesno: Path) -> None:
    run_dir = tmp_path / "damaged"
    shutil.copytree(yesno, run_dir)
    victim = RunStore(run_dir).table_path(1, "readout_options")
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(StoreError, match=r"is incomplete.*chunk 1 \(trials 8-15\): damaged"):
        open_run(run_dir).options  # noqa: B018
    run = open_run(run_dir, allow_partial=True)
    assert [c.chunk for c in run.integrity.damaged] == [1]
    assert len(run.options) == 32 and len(run.trials) == 24  # the trials are all there; their results are not
    data = run.trial_data(run.trials.trial_id[8])
    assert data.chunk.status == "damaged" and "readout_options.parquet is" in data.chunk.reason
    assert data.readout is None and data.options.empty
    page = run.page(TrialFilter(chunk="damaged"), 0, 50)
    assert list(page.rows["position"]) == list(range(8, 16)) and set(page.rows["chunk_status"]) == {"damaged"}
    listed = run.page(TrialFilter(), 0, 50).rows
    assert len(listed) == 24 and (listed.chunk_status == "damaged").sum() == 8


def test_the_index_is_cached_and_rebuilt_when_the_trials_change(tmp_path: Path, yesno: Path) -> None:
    run_dir = tmp_path / "copy"
    shutil.copytree(yesno, run_dir)
    first = open_run(run_dir).index()
    cached = list(trial_index.cache_dir().glob("trials-*.parquet"))
    assert cached
    again = open_run(run_dir).index()
    assert again.equals(first)
    lines = (run_dir / "trials.jsonl").read_text().splitlines(keepends=True)
    rec = json.loads(lines[0])
    rec["item_id"] = "renamed"
    lines[0] = json.dumps(rec) + "\n"
    (run_dir / "trials.jsonl").write_text("".join(lines))
    rebuilt = open_run(run_dir).index()
    assert rebuilt["item_id"][0].as_py() == "renamed"
    assert open_run(run_dir).trial_at(1) == open_run(yesno).trial_at(1)  # offsets follow the longer first line


def test_the_python_fallback_reads_what_arrow_cannot(tmp_path: Path, yesno: Path) -> None:
    arrow = trial_index._arrow_records(yesno / "trials.jsonl")
    python = trial_index._python_records(yesno / "trials.jsonl")
    assert arrow.select(sorted(arrow.column_names)).equals(python.select(sorted(python.column_names)))


def test_chunks_whose_columns_differ_in_type_are_read_file_by_file(tmp_path: Path) -> None:
    """A chunk where no reply parsed stores ``option`` as Parquet's null type; the one-scan read of all chunks
    cannot cast the others' strings to it, so those chunks are read one by one, and nothing is lost."""
    from probe.types import Message, Trial

    trials = [
        Trial(f"t{i}", "x", "item", {"k": "v"}, (Message("user", f"q{i}"),), ("Yes", "No"), ("cbr", "anti"))
        for i in range(4)
    ]
    store = RunStore.open(tmp_path / "run", {"run_key": "k", "n_trials": 4, "chunk_size": 2, "experiment": "x"}, trials)

    def samples(ids: list[str], option: str | None, status: str) -> pd.DataFrame:
        return pd.DataFrame({"trial_id": ids, "draw": 0, "option": [option] * len(ids), "status": status, "text": "t",
                             "reasoning": "", "prompt_tokens": 1, "completion_tokens": 1, "token_ids": [[1]] * len(ids),
                             "truncated": False})  # fmt: skip

    store.write_chunk(0, {"samples": samples(["t0", "t1"], None, "refusal")})
    store.write_chunk(1, {"samples": samples(["t2", "t3"], "Yes", "ok")})
    run = open_run(store.root)
    assert RunQuery(run).narrow_samples()["option"].to_pylist() == [None, None, "Yes", "Yes"]
    assert list(run.page(TrialFilter(status="refusal")).rows["trial_id"]) == ["t0", "t1"]
    assert list(run.samples["status"].astype(str)) == ["refusal", "refusal", "ok", "ok"]
