"""``--layers`` on the command line: ``probe readout``'s per-layer table and JSON, and the one-line refusal of the
engines without hidden states (vLLM, a server, an API model), which writes nothing."""

from __future__ import annotations

import json

import pytest

from probe.app.cli import main

READOUT = ["readout", "--prompt", "Is water wet? Answer Yes or No.", "--options", "Yes,No"]


def test_readout_prints_a_table_of_every_layer(capsys):
    assert main([*READOUT, "--model", "tiny", "--layers", "all"]) == 0
    out = capsys.readouterr().out
    table = out.split("readout by layer (logit lens; normalized over the options)\n", 1)[1].splitlines()
    assert table[0].split() == ["layer", "Yes", "No", "coverage", "greedy"]
    assert [row.split()[0] for row in table[1:4]] == ["0", "1", "2"]  # tiny: 2 blocks, layers 0..2


def test_readout_json_holds_the_layers_and_the_last_equals_the_readout(capsys):
    assert main([*READOUT, "--model", "tiny", "--layers", "0,2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [lay["layer"] for lay in doc["layers"]] == [0, 2]
    assert doc["layers"][-1]["probs"] == [o["prob"] for o in doc["options"]]
    assert doc["layers"][-1]["greedy_option"] == doc["greedy_option"]


def test_readout_without_layers_has_no_layer_output(capsys):
    assert main([*READOUT, "--model", "tiny", "--json"]) == 0
    assert "layers" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("model", "engine"),
    [
        ("vllm:tiny", "vllm"),
        ("openai:gpt-4o-mini", "api"),
        ("anthropic:claude-3-5-haiku-latest", "api"),
        ("openai-compatible:tiny@http://127.0.0.1:9/v1", "server"),
    ],
)
def test_engines_without_hidden_states_refuse_layers_in_one_line_and_write_nothing(model, engine, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "yesno", "--model", model, "--layers", "all", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"the {engine} engine has no hidden states" in err and "Transformers engine" in err
    assert not out.exists()


def test_a_bad_layer_spec_is_refused_before_loading(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "yesno", "--model", "tiny", "--layers", "every:0", "--out", str(out)]) == 2
    assert "every:K needs a whole number K >= 1" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(("model", "last"), [("tiny", 2), ("sim", 24)])
def test_a_layer_past_the_model_is_refused_before_the_run_folder_is_written(model, last, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "yesno", "--model", model, "--layers", f"0,{last + 1}", "--out", str(out)]) == 2
    assert f"past this model's last layer {last}" in capsys.readouterr().err
    assert not out.exists()
