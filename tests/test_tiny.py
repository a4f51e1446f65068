"""Tests of the locally built tiny models (:mod:`probe.tiny`).

The models are built once per session into a temporary cache root, so the
suite never touches ``~/.cache`` and never downloads anything. The tiny
model is built twice in all (the second time to check bit-identical
rebuilds on the same machine), which dominates the runtime (about 55 s per
build of ``tiny`` on 2 idle cores). What the trained model answers is asserted
only through its build contract (``tiny_train.CONTRACT``), which holds on every CPU.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Any

import pytest
import torch

from probe import tiny, tiny_tokenizer, tiny_train
from probe.tiny_corpus import Sample

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def tiny_root() -> pathlib.Path:
    # The shared cache (builds are deterministic, so reusing them tests the same
    # thing); test_rebuild_is_bit_identical still builds from scratch.
    return tiny.cache_root()


@pytest.fixture(scope="session")
def built(tiny_root: pathlib.Path) -> dict[str, pathlib.Path]:
    return {name: tiny.ensure_tiny(name, tiny_root) for name in tiny.TINY_NAMES}


@pytest.fixture(scope="session")
def tokenizer(built: dict[str, pathlib.Path]) -> Any:
    return transformers.AutoTokenizer.from_pretrained(built["tiny"])


@pytest.fixture(scope="session")
def models(built: dict[str, pathlib.Path]) -> dict[str, Any]:
    return {name: transformers.AutoModelForCausalLM.from_pretrained(path).eval() for name, path in built.items()}


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _label_mass(model: Any, tokenizer: Any, sample: Sample) -> float:
    """Probability mass on the first token of each offered label at the answer slot."""
    prompt = tiny_tokenizer.render_prompt(tokenizer, sample.user, enable_thinking=False, system=sample.system)
    batch = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        probs = model(**batch).logits[0, -1].softmax(-1)
    firsts = {_ids(tokenizer, label)[0] for label in sample.labels}
    # two-way labels must differ in their first token; a rating's numbers share theirs (digits are tokens)
    assert len(firsts) == len(sample.labels) or sample.kind == "rating", "labels must differ in their first token"
    return float(probs[sorted(firsts)].sum())


# --------------------------------------------------------------------------- API and cache


def test_unknown_name_raises(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match=r"'nope'.*tiny-hybrid"):
        tiny.ensure_tiny("nope", tmp_path)
    with pytest.raises(ValueError, match="nope"):
        tiny.build_tiny("nope", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_cache_root_env(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("PROBE_CACHE", str(tmp_path))
    assert tiny.cache_root() == tmp_path
    assert tiny.model_dir("tiny").parent == tmp_path / "tiny"
    monkeypatch.delenv("PROBE_CACHE")
    assert tiny.cache_root() == pathlib.Path.home() / ".cache" / "probe"


def test_folder_names_carry_fingerprint(built: dict[str, pathlib.Path]) -> None:
    for name, path in built.items():
        assert path.name == f"{name}-{tiny.fingerprint(name)}"
        assert tiny.is_complete(path)
    assert tiny.fingerprint("tiny") != tiny.fingerprint("tiny-hybrid")


def test_ensure_is_idempotent(built: dict[str, pathlib.Path], tiny_root: pathlib.Path) -> None:
    marker = built["tiny"] / tiny.MARKER
    before = marker.stat().st_mtime_ns
    started = time.perf_counter()
    again = tiny.ensure_tiny("tiny", tiny_root)
    assert time.perf_counter() - started < 1.0
    assert again == built["tiny"]
    assert marker.stat().st_mtime_ns == before


def test_failed_build_leaves_nothing_trusted(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(name: str, out: pathlib.Path, progress: bool) -> dict[str, Any]:
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(tiny, "_build_files", crash)
    with pytest.raises(RuntimeError, match="simulated"):
        tiny.ensure_tiny("tiny-hybrid", tmp_path)
    folder = tiny.model_dir("tiny-hybrid", tmp_path)
    assert not folder.exists()
    assert not list(folder.parent.glob(".*.tmp-*"))


def test_build_tolerates_rival_destination(built: dict[str, pathlib.Path], tmp_path: pathlib.Path) -> None:
    """A concurrent builder finished first: keep its folder, drop ours."""
    import shutil

    dest = tmp_path / built["tiny-hybrid"].name
    shutil.copytree(built["tiny-hybrid"], dest)
    tiny.build_tiny("tiny-hybrid", dest)
    assert tiny.is_complete(dest)
    assert sorted(os.listdir(tmp_path)) == [dest.name]


def test_concurrent_builders_agree(tmp_path: pathlib.Path) -> None:
    """Two processes racing on one cache root both get the same, complete model."""
    import subprocess
    import sys

    code = (
        "import sys, pathlib; from probe import tiny; print(tiny.ensure_tiny('tiny-hybrid', pathlib.Path(sys.argv[1])))"
    )
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    paths = {proc.communicate(timeout=900)[0].strip() for proc in procs}  # a deadlock bound, not a speed bound
    assert all(proc.returncode == 0 for proc in procs)
    assert paths == {str(tiny.model_dir("tiny-hybrid", tmp_path))}
    assert tiny.is_complete(pathlib.Path(paths.pop()))
    assert not list((tmp_path / "tiny").glob(".*.tmp-*"))


@pytest.mark.kernels  # about a minute: make test-kernels (CI) runs it, on a fresh build under the portable kernels
def test_rebuild_is_bit_identical(built: dict[str, pathlib.Path], tmp_path: pathlib.Path) -> None:
    """Building every tiny model again gives the same weights, tokenizer and config, byte for byte."""
    for name, path in built.items():
        again = tiny.ensure_tiny(name, tmp_path)
        for file in ("model.safetensors", "tokenizer.json", "config.json"):
            assert (again / file).read_bytes() == (path / file).read_bytes(), f"{name}/{file} differs"


# --------------------------------------------------------------------------- tokenizer and template


def test_digits_are_single_tokens(tokenizer: Any) -> None:
    assert len(_ids(tokenizer, "100")) == 3
    assert len(_ids(tokenizer, "10")) == 2
    assert tokenizer.decode(_ids(tokenizer, "2026")) == "2026"


def test_special_and_think_tokens(tokenizer: Any) -> None:
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    for token in ("</think>", "<think>", "<|im_start|>", "<|im_end|>"):
        assert len(_ids(tokenizer, token)) == 1, token
    assert len(tokenizer) > 1000


def test_any_unicode_round_trips(tokenizer: Any) -> None:
    text = "Zoë says 你好 🙂 — ok?"
    assert tokenizer.decode(_ids(tokenizer, text)) == text


def test_chat_template_matches_qwen3(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Hi?"}]
    no_think = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think == "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    think = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert think == "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"
    history = [
        {"role": "system", "content": "S"},
        *messages,
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nYes"},
        {"role": "user", "content": "Sure?"},
    ]
    rendered = tokenizer.apply_chat_template(history, tokenize=False)
    assert rendered.startswith("<|im_start|>system\nS<|im_end|>\n")
    assert "<|im_start|>assistant\nYes<|im_end|>\n" in rendered  # earlier reasoning dropped


# --------------------------------------------------------------------------- models


@pytest.mark.parametrize("name", tiny.BUILT_NAMES)
def test_models_load_and_give_finite_logits(name: str, models: dict[str, Any], tokenizer: Any) -> None:
    model = models[name]
    expected = {"tiny": "Qwen3MoeForCausalLM"}.get(name, "NemotronHForCausalLM")
    assert type(model).__name__ == expected
    assert next(model.parameters()).dtype == torch.float32
    batch = tokenizer("Is it raining? Answer with Yes or No.", return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape[-1] == len(tokenizer)
    assert torch.isfinite(logits).all()


def test_tiny_base_is_tiny_without_its_chat_template(built: dict[str, pathlib.Path]) -> None:
    """``tiny-base`` keeps tiny's weights and tokenizer and loses only the chat template (a base model's state)."""
    base, chat = built["tiny-base"], built["tiny"]
    assert (base / "model.safetensors").read_bytes() == (chat / "model.safetensors").read_bytes()
    assert (base / "tokenizer.json").read_bytes() == (chat / "tokenizer.json").read_bytes()
    assert not (base / "chat_template.jinja").exists() and (chat / "chat_template.jinja").exists()
    tok = transformers.AutoTokenizer.from_pretrained(base)
    assert not tok.chat_template
    assert json.loads((base / tiny.MARKER).read_text())["from"] == "tiny"


def test_hybrid_mixes_layer_kinds(models: dict[str, Any]) -> None:
    kinds = set(models["tiny-hybrid"].config.layers_block_type)
    assert {"linear_attention", "full_attention", "moe"} <= kinds


def test_dense_hybrid_has_no_moe_layer(models: dict[str, Any]) -> None:
    """vLLM's CPU build runs no Nemotron-H MoE layer, so the hybrid it runs must have none."""
    kinds = set(models["tiny-hybrid-dense"].config.layers_block_type)
    assert {"linear_attention", "full_attention"} <= kinds and "moe" not in kinds, kinds


@pytest.mark.parametrize("name", tiny.BUILT_NAMES)
def test_attention_heads_fit_vllm_cpu(name: str, models: dict[str, Any]) -> None:
    """vLLM's CPU attention supports head sizes 32 to 512 (``Unsupported CPU attention configuration`` otherwise)."""
    assert 32 <= models[name].config.head_dim <= 512


@pytest.mark.parametrize("name", tiny.BUILT_NAMES)
def test_left_padded_batch_matches_single(name: str, models: dict[str, Any], built: dict[str, pathlib.Path]) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(built[name], padding_side="left")
    prompts = [
        tiny_tokenizer.render_prompt(tok, u, enable_thinking=False) for u in ("Is it? Answer with Yes or No.", "Hi")
    ]
    model = models[name]
    with torch.no_grad():
        batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        batched = model(**batch).logits[:, -1]
        for row, prompt in enumerate(prompts):
            single = model(**tok(prompt, return_tensors="pt", add_special_tokens=False)).logits[0, -1]
            torch.testing.assert_close(batched[row], single, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- the behaviour contract
# The trained weights differ between CPUs (torch's float kernels follow the instruction set), so these tests assert
# only what the build guarantees on every machine: tiny_train.CONTRACT, measured again here by the tests' own code on the
# contract's held-out prompts. docs/testing.md lists every test that rests on trained behaviour.


@pytest.mark.trained
def test_trained_tiny_meets_its_contract(
    models: dict[str, Any], tokenizer: Any, built: dict[str, pathlib.Path]
) -> None:
    """Far above chance (two labels of a 1283-token vocabulary: about 0.002), on prompts it never trained on."""
    import json

    contract, samples = tiny_train.CONTRACT, tiny_train.contract_samples()
    recorded = json.loads((built["tiny"] / tiny.MARKER).read_text())["contract"]
    for kind, floor in contract.floors:
        masses = [_label_mass(models["tiny"], tokenizer, s) for s in samples[f"mass/{kind}"]]
        assert sum(masses) / len(masses) >= floor, (kind, masses)
        if kind != "rating":
            assert min(masses) >= contract.min_pair_mass, (kind, masses)
        # the build measured the same figures (the marker records them): the cached model is the one it checked
        assert sum(masses) / len(masses) == pytest.approx(recorded[f"mass_{kind}"], abs=1e-3)
    assert recorded["greedy_out_of_format"] == []


@pytest.mark.trained
@pytest.mark.parametrize("enable_thinking", [False, True])
def test_greedy_answers_parse(enable_thinking: bool, models: dict[str, Any], tokenizer: Any) -> None:
    """Every held-out greedy reply of the contract is exactly one offered label (after a think block if asked)."""
    for sample in tiny_train.contract_samples()["greedy"]:
        prompt = tiny_tokenizer.render_prompt(
            tokenizer, sample.user, enable_thinking=enable_thinking, system=sample.system
        )
        batch = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        out = models["tiny"].generate(**batch, max_new_tokens=32)
        text = tokenizer.decode(out[0, batch["input_ids"].shape[1] :])
        if enable_thinking:
            assert text.startswith("<think>\n") and "</think>" in text, text
            text = text.split("</think>")[-1].lstrip("\n")
        assert text.endswith("<|im_end|>"), text
        assert text.removesuffix("<|im_end|>") in sample.labels, text


def test_contract_misses_name_each_shortfall() -> None:
    """Hand figures: every floor that is missed is named with its value; figures that meet it give no line."""
    ok = {
        "mass_yesno": 0.9,
        "min_mass_yesno": 0.6,
        "mass_choice": 0.95,
        "min_mass_choice": 0.7,
        "mass_option": 0.9,
        "min_mass_option": 0.8,
        "mass_rating": 0.7,
        "min_mass_rating": 0.1,
        "greedy_out_of_format": [],
    }
    assert tiny_train.contract_misses(ok) == []
    bad = ok | {"mass_yesno": 0.58, "min_mass_choice": 0.2, "greedy_out_of_format": ["no-think #3: 'No<|im_end|>'"]}
    misses = tiny_train.contract_misses(bad)
    assert misses[0] == "mean yesno label mass 0.580 < 0.85"
    assert misses[1] == "least choice label mass 0.200 < 0.5"
    assert misses[2].startswith("1 of 24 greedy replies out of format (no-think #3: 'No<|im_end|>')")
    assert len(misses) == 3


def test_build_keeps_training_then_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A contract that cannot hold: the extra rounds run (each on fresh samples), then ContractError with every
    round's figures; a contract that holds stops after the recipe. A 2-step recipe keeps this fast."""
    tokenizer = tiny_tokenizer.build_tokenizer()
    recipe = tiny_train.TrainRecipe(steps=2, batch_size=2, warmup=1)
    impossible = tiny_train.Contract(
        n_mass=2,
        n_greedy=1,
        floors=(("yesno", 1.01), ("choice", 0.0), ("option", 0.0), ("rating", 0.0)),
        max_rounds=2,
        extra_steps=1,
    )
    with tiny.deterministic(seed=1):
        model = tiny._init_qwen_moe(tokenizer)
        with pytest.raises(
            tiny_train.ContractError, match=r"after 2 extra rounds: mean yesno label mass .* < 1.01"
        ) as err:
            tiny_train.train_tiny(model, tokenizer, recipe, contract=impossible)
        assert str(err.value).count('"mass_yesno"') == 3  # the recipe, then each of the two rounds
        trivial = tiny_train.Contract(
            n_mass=2,
            n_greedy=1,
            floors=(("yesno", 0.0), ("choice", 0.0), ("option", 0.0), ("rating", 0.0)),
            min_pair_mass=0.0,
        )
        monkeypatch.setattr(tiny_train, "reply_in_format", lambda *a, **k: True)
        info = tiny_train.train_tiny(tiny._init_qwen_moe(tokenizer), tokenizer, recipe, contract=trivial)
    assert info["contract_rounds"] == 0 and info["train_steps"] == 2 and len(info["contract_history"]) == 1
