"""Tests of the locally built tiny models (:mod:`probe.tiny`).

The models are built once per session into a temporary cache root, so the
suite never touches ``~/.cache`` and never downloads anything. The tiny
model is built twice in all (the second time to check bit-identical
rebuilds), which dominates the runtime (~10-15 s per build on 2 cores).
"""

from __future__ import annotations

import os
import pathlib
import time
from typing import Any

import pytest
import torch

from probe import tiny, tiny_corpus
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
    prompt = tiny.render_prompt(tokenizer, sample.user, enable_thinking=False)
    batch = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        probs = model(**batch).logits[0, -1].softmax(-1)
    firsts = {_ids(tokenizer, label)[0] for label in sample.labels}
    assert len(firsts) == len(sample.labels), "labels must differ in their first token"
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


def test_rebuild_is_bit_identical(built: dict[str, pathlib.Path], tmp_path: pathlib.Path) -> None:
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


@pytest.mark.parametrize("name", tiny.TINY_NAMES)
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


def test_hybrid_mixes_layer_kinds(models: dict[str, Any]) -> None:
    kinds = set(models["tiny-hybrid"].config.layers_block_type)
    assert {"linear_attention", "full_attention", "moe"} <= kinds


def test_dense_hybrid_has_no_moe_layer(models: dict[str, Any]) -> None:
    """vLLM's CPU build runs no Nemotron-H MoE layer, so the hybrid it runs must have none."""
    kinds = set(models["tiny-hybrid-dense"].config.layers_block_type)
    assert {"linear_attention", "full_attention"} <= kinds and "moe" not in kinds, kinds


@pytest.mark.parametrize("name", tiny.TINY_NAMES)
def test_attention_heads_fit_vllm_cpu(name: str, models: dict[str, Any]) -> None:
    """vLLM's CPU attention supports head sizes 32 to 512 (``Unsupported CPU attention configuration`` otherwise)."""
    assert 32 <= models[name].config.head_dim <= 512


@pytest.mark.parametrize("name", tiny.TINY_NAMES)
def test_left_padded_batch_matches_single(name: str, models: dict[str, Any], built: dict[str, pathlib.Path]) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(built[name], padding_side="left")
    prompts = [tiny.render_prompt(tok, u, enable_thinking=False) for u in ("Is it? Answer with Yes or No.", "Hi")]
    model = models[name]
    with torch.no_grad():
        batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        batched = model(**batch).logits[:, -1]
        for row, prompt in enumerate(prompts):
            single = model(**tok(prompt, return_tensors="pt", add_special_tokens=False)).logits[0, -1]
            torch.testing.assert_close(batched[row], single, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("kind", "floor"), [("yesno", 0.8), ("choice", 0.6)])
def test_trained_tiny_covers_offered_labels(
    kind: tiny_corpus.Kind, floor: float, models: dict[str, Any], tokenizer: Any
) -> None:
    """Far above chance (two labels of a 1201-token vocabulary: about 0.002)."""
    samples = tiny_corpus.make_samples(8, tiny.HELDOUT_SEED, kind=kind, think_rate=0.0)
    masses = [_label_mass(models["tiny"], tokenizer, s) for s in samples]
    assert sum(masses) / len(masses) > floor, masses


@pytest.mark.parametrize("enable_thinking", [False, True])
def test_greedy_answers_parse(enable_thinking: bool, models: dict[str, Any], tokenizer: Any) -> None:
    for sample in tiny_corpus.make_samples(4, tiny.HELDOUT_SEED + 1, think_rate=0.0):
        prompt = tiny.render_prompt(tokenizer, sample.user, enable_thinking=enable_thinking)
        batch = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        out = models["tiny"].generate(**batch, max_new_tokens=32)
        text = tokenizer.decode(out[0, batch["input_ids"].shape[1] :])
        if enable_thinking:
            assert text.startswith("<think>\n") and "</think>" in text, text
            text = text.split("</think>")[-1].lstrip("\n")
        assert text.endswith("<|im_end|>"), text
        assert text.removesuffix("<|im_end|>") in sample.labels, text
