"""A stored run against a command line, without loading the model (what shard_status.py skips on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from probe.app.cli import main
from probe.app.request import identity_differences, parse_run_args, requested_identity
from probe.store import RunStore

ARGS = ["--items", "mine_cart_bridge", "--forms", "acceptable"]


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("req") / "run"
    assert main(["run", "yesno", "--model", "sim", "--out", str(out), "--shard", "0/2", "--quiet", *ARGS]) == 0
    return RunStore(out / "shard-0-of-2").manifest()["identity"]


def differences(stored: dict, *extra: str, model: str = "sim", experiment: str = "yesno") -> list[str]:
    a = parse_run_args(experiment, model, Path("unused"), [*ARGS, *extra, "--shard", "0/2"])
    return identity_differences(stored, requested_identity(a))


def test_the_same_command_line_matches_and_speed_settings_may_change(stored):
    assert differences(stored) == []
    assert differences(stored, "--batch-size", "64", "--chunk-size", "2") == []


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (("--forms", "should"), "spec.forms: stored ['acceptable'], requested ['should']"),
        (("--samples", "2"), "plan.samples: stored 0, requested 2"),
        (("--sim-seed", "5"), "params.seed: stored 0, requested 5"),
    ],
)
def test_each_changed_part_is_named(stored, extra, named):
    assert named in differences(stored, *extra)


def test_another_engine_or_model_is_a_difference(stored):
    diffs = differences(stored, model="tiny")
    assert "engine: stored 'sim', requested 'hf'" in diffs
    assert "model: stored 'sim', requested 'tiny'" in diffs
