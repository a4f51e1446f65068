"""Issue 27 end to end from the CLI on the synthetic subject: refusals that empty cells, sigma_repeat, form order.

Random draws: every sampled answer of the sim is a hash of (sampling seed, trial id, draw) and every planted
quantity of (SimParams seed, keys); the bootstraps have fixed seeds. So the runs below are deterministic and
the assertions on them have false-failure rate 0. Where a threshold compares an estimate with its planted
value, it is computed from the estimator's exact sampling distribution (the planted answer distributions of
the sim) at 4.9 standard errors: a two-sided normal tail of 1e-6.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engines.sim.engine import SimEngine
from engines.sim.params import SimParams
from probe.app.cli import main
from probe.store import RunStore

Z_1E6 = 4.9
"""Two-sided normal quantile for a false-failure rate of 1e-6 (P(|Z| > 4.9) = 9.6e-7)."""

LEAK = """seed: 0
refusal_rules:
  - {rate: 1.0, when: {instrument: binary, verb: approve, mapping: canonical}, theta: negative}
"""
"""Planted logic = label = order = 0; every approve question of the canonical mapping refused on the stories
the subject rejects (theta < 0): both approve cells of the canonical mapping are empty there."""


def _run(out: Path, *args: str) -> Path:
    assert main(["run", "battery", "--model", "sim", "--out", str(out), "--quiet", *args]) == 0
    return out


@pytest.fixture(scope="module")
def leak_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("leak")
    (root / "p.yaml").write_text(LEAK)
    return _run(
        root / "run",
        "--sim-params", str(root / "p.yaml"), "--instruments", "graded,binary", "--label-pairs", "A/B",
        "--no-readout", "--samples", "16",
    )  # fmt: skip


@pytest.fixture(scope="module")
def refused_run(tmp_path_factory) -> Path:
    """Uniform refusal 0.5 with 2 draws: the 8 single-form A/B cells empty a cell in nearly every story."""
    root = tmp_path_factory.mktemp("r05")
    (root / "p.yaml").write_text("seed: 0\nrefusal: 0.5\n")
    return _run(
        root / "run", "--sim-params", str(root / "p.yaml"), "--instruments", "graded,binary", "--no-readout",
        "--samples", "2",
    )  # fmt: skip


def test_label_map_leaves_out_stories_with_an_empty_cell(leak_run: Path):
    rep = leak_run / "report"
    params = SimParams(**RunStore(leak_run).manifest()["engine"]["params"])
    items = sorted({t.item_id for t in RunStore(leak_run).trials()})
    rejected = sorted(i for i in items if params.item_theta(i) < 0)
    assert 0 < len(rejected) < len(items) - 3

    # the old rule (average the surviving cells), computed here from the run: the stance leaks into the bias
    from analysis.battery.binary import cell_events
    from analysis.battery.yesno import story_mean_ci
    from probe.runs import open_run

    opts, per, _ = open_run(leak_run).choice_probs()
    ev = cell_events(per[(per["instrument"] == "binary") & (per["labels"] == "A/B")], opts)
    for col in ("p_first", "p_yes", "p_label1"):
        ev[col] = 2 * ev[col] - 1
    old = ev.groupby(["item_id", "verb", "order", "mapping"])[["p_yes", "p_label1"]].mean().groupby("item_id").mean()
    old_ci = story_mean_ci(old, n_boot=2000, seed=0)
    assert (old_ci["lo"] > 0).all(), old_ci  # logic and label both read > 0 with the stories kept

    grad = pd.read_csv(rep / "binary_label_gradient.csv", index_col=0)
    ab = grad.loc["A/B"]
    assert ab["n_items"] == len(items) - len(rejected)
    assert ab["n_dropped"] == len(rejected)
    assert ab["logic_lo"] <= 0 <= ab["logic_hi"], ab
    assert ab["label_pull_lo"] <= 0 <= ab["label_pull_hi"], ab  # the label projection (mapping crossed)
    dropped = pd.read_csv(rep / "dropped_stories.csv")
    lm = dropped[dropped["table"] == "label map: A/B"]
    assert sorted(lm["dilemma"]) == rejected
    for reason in lm["reason"]:
        assert "verb=approve, order=yes_first, mapping=canonical (1 trials)" in reason
        assert "verb=approve, order=no_first, mapping=canonical (1 trials)" in reason
    summary = (rep / "summary.md").read_text()
    assert "Complete stories only" in summary and f"{rejected[0]}, label map: A/B: no usable answer" in summary


def test_one_unfittable_channel_leaves_the_others_fitted(refused_run: Path):
    rep = refused_run / "report"
    fits = pd.read_csv(rep / "fit_sm.csv", index_col=0)
    assert list(fits.index) == ["order", "lexical"]
    assert fits["s"].notna().all() and (fits["n_items"] >= 3).all()
    summary = (rep / "summary.md").read_text()
    for ch in ("logic", "label"):
        line = next(x for x in summary.splitlines() if x.startswith(f"- {ch}: not fitted: "))
        assert "stories have every cell usable" in line and "empty in" in line
    assert "Not computed (The (s, m) fit" not in summary


def test_probe_compare_lists_dropped_stories_and_unfitted_channels(leak_run: Path, refused_run: Path, tmp_path):
    out = tmp_path / "cmp"
    args = ["compare", str(leak_run), str(refused_run), "--names", "leak,r05", "--out", str(out), "--n-boot", "200"]
    assert main(args) == 0
    summary = (out / "summary.md").read_text()
    assert "## Dropped stories" in summary
    dropped = pd.read_csv(out / "dropped_stories.csv")
    assert (dropped.loc[dropped["run"] == "leak", "table"] == "label map: A/B").any()
    fits = pd.read_csv(out / "fit_sm.csv")
    assert set(fits.loc[fits["run"] == "r05", "channel"]) == {"order", "lexical"}
    assert "- r05: logic: " in summary and "stories have every cell usable" in summary


def _planted_repeat(run: Path, n: int) -> tuple[float, float]:
    """The planted single-draw variance pooled as :func:`analysis.battery.stance.pooled_incoherence` pools it (the mean
    over the unipolar forms of replicate 0: equal form counts), and the variance of its estimate from n draws
    per form: Var(s^2) = mu4 / n - sigma^4 (n - 3) / (n (n - 1)) per form, over F^2."""
    store = RunStore(run)
    eng = SimEngine(SimParams(**store.manifest()["engine"]["params"]))
    var, var_est = [], []
    for t in store.trials():
        if t.factors.get("instrument") != "graded" or t.replicate != 0 or float(min(t.options, key=float)) < 0:
            continue
        x = np.array([float(m) for m in t.meaning])
        p = eng.probs(t)
        mu = p @ x
        s2, m4 = p @ (x - mu) ** 2, p @ (x - mu) ** 4
        var.append(s2)
        var_est.append(m4 / n - s2**2 * (n - 3) / (n * (n - 1)))
    return float(np.mean(var)), float(np.sum(var_est) / len(var_est) ** 2)


@pytest.fixture(scope="module")
def graded_runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("graded")
    base = ("--instruments", "graded", "--no-readout")
    return {
        "4 draws": _run(root / "d4", *base, "--samples", "4"),
        "16 draws": _run(root / "d16", *base, "--samples", "16"),
        "4 salts x 1 draw": _run(root / "s4", *base, "--samples", "1", "--salts", "4"),
    }


def test_sigma_repeat_is_one_elicitation_whatever_the_draws_or_salts(graded_runs: dict[str, Path]):
    got, planted, bound = {}, {}, {}
    for name, run in graded_runs.items():
        pooled = pd.read_csv(run / "report" / "graded_pooled.csv").iloc[0]
        got[name] = float(pooled["sigma_repeat"]) ** 2
        n = 16 if name == "16 draws" else 4
        planted[name], v = _planted_repeat(run, n)
        bound[name] = v
        assert abs(got[name] - planted[name]) <= Z_1E6 * np.sqrt(v), (name, got[name], planted[name], np.sqrt(v))
        if "draws" in name:  # one trial of n draws: the value's variance is the draw variance over n, exactly
            assert float(pooled["sigma_value"]) ** 2 * n == pytest.approx(got[name], rel=1e-9)
    diff = got["4 draws"] - got["16 draws"]
    assert abs(diff) <= Z_1E6 * np.sqrt(bound["4 draws"] + bound["16 draws"])
    # the old estimator (sqrt of the pooled Var_samp) halves from 4 to 16 draws: the test can tell them apart
    se4 = pd.read_csv(graded_runs["4 draws"] / "report" / "graded_pooled.csv").iloc[0]["sigma_value"]
    se16 = pd.read_csv(graded_runs["16 draws"] / "report" / "graded_pooled.csv").iloc[0]["sigma_value"]
    assert se4 / se16 == pytest.approx(2.0, rel=0.1)


def test_graded_section_survives_a_fully_refused_unsalted_replicate(tmp_path: Path):
    (tmp_path / "p.yaml").write_text("seed: 0\nrefusal: 0.5\n")
    run = _run(
        tmp_path / "run", "--sim-params", str(tmp_path / "p.yaml"), "--instruments", "graded", "--no-readout",
        "--samples", "2", "--salts", "3",
    )  # fmt: skip
    summary = (run / "report" / "summary.md").read_text()
    assert "Not computed" not in summary
    line = next(x for x in summary.splitlines() if "no usable unsalted answer" in x)
    assert int(line.split()[0]) > 0
    theta = pd.read_csv(run / "report" / "graded_theta.csv", index_col=0)
    assert theta["theta"].notna().all() and len(theta) == 22


def test_full_preset_parity_split_in_corpus_order_and_story_outside_the_contrast(tmp_path: Path):
    from analysis.battery.yesno import p_cbr, parity_split
    from experiments.battery import load_corpus
    from probe.runs import open_run

    (tmp_path / "p.yaml").write_text("seed: 1\nsigma_binary: 0.2\nm_order: 0.1\nm_label: {Ja/Nein: 0.2}\n")
    run = _run(
        tmp_path / "full", "--preset", "full", "--instruments", "binary", "--sim-params", str(tmp_path / "p.yaml"),
        "--items", "mine_cart_bridge,dam_spillway,pond_child,hospital_budget",
    )  # fmt: skip
    opts, per, _ = open_run(run).choice_probs()
    yn = per[(per["instrument"] == "binary") & (per["labels"] == "Yes/No")].assign(cbr_verb=lambda d: d["verb"])
    corpus_order = list(load_corpus()["binary"]["forms"])
    assert corpus_order != sorted(corpus_order)  # otherwise this test could not tell the two apart
    got = pd.read_csv(run / "report" / "binary_form_parity.csv", index_col=0)
    want = parity_split(yn, p_cbr(opts), corpus_order)
    alpha = parity_split(yn, p_cbr(opts), sorted(corpus_order))
    assert got.to_numpy() == pytest.approx(want.to_numpy(), abs=1e-6)
    assert not np.allclose(got.to_numpy(), alpha.to_numpy(), atol=1e-6)

    grad = pd.read_csv(run / "report" / "binary_label_gradient.csv", index_col=0)
    assert grad.loc["story", "pull_from"] != "label"
    crossed = grad[grad["pull_from"] == "label"]
    want_c = (
        crossed.loc[crossed["lexicality"] >= 2, "label_pull"].abs().mean()
        - crossed.loc[crossed["lexicality"] == 0, "label_pull"].abs().mean()
    )
    summary = (run / "report" / "summary.md").read_text()
    assert f"non-lexical pairs): {want_c:+.3f} (descriptive); pairs whose mapping is not counterbalanced (story)" in (
        summary
    )
    with_story = (
        grad.loc[grad["lexicality"] >= 2, "label_pull"].abs().mean()
        - grad.loc[grad["lexicality"] == 0, "label_pull"].abs().mean()
    )
    assert f"as Fig. 6 groups story among the words: {with_story:+.3f}." in summary
