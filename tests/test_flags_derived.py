"""The engine flags derived from the settings dataclasses (:mod:`engines.flags`): every field that a flag sets has
exactly one flag, with the field's default, and parsing no flags gives the default settings."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from engines.api.engine import settings_from_model
from engines.api.settings import ApiSettings
from engines.base import EngineSettings
from engines.flags import NO_FLAG, add_flags, attr_docs, dest, flag, flag_of, flagged, settings_from_flags
from engines.hf.settings import HFSettings
from engines.server.engine import settings_from_args as server_settings
from engines.server.settings import ServerSettings
from engines.vllm.engine import settings_from_args as vllm_settings
from engines.vllm.settings import CPU_KV_CACHE_GIB, VLLMSettings
from probe.app.cli import build_parser

SETTINGS = (EngineSettings, HFSettings, VLLMSettings, ApiSettings, ServerSettings)
SERVER = "openai-compatible:tiny@http://127.0.0.1:1/v1"


def _verb(*path: str) -> argparse.ArgumentParser:
    p = build_parser()
    for name in path:
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        p = sub.choices[name]
    return p


def _field_default(f: dataclasses.Field[Any]) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


@pytest.mark.parametrize("verb", [("run", "yesno"), ("readout",)])
@pytest.mark.parametrize("cls", SETTINGS, ids=lambda c: c.__name__)
def test_each_field_has_one_flag_with_its_default(cls: type, verb: tuple[str, ...]) -> None:
    actions = [a for a in _verb(*verb)._actions if a.option_strings]
    for f in flagged(cls):
        mine = [a for a in actions if a.dest == dest(f)]
        assert len(mine) == 1, (f.name, [a.option_strings for a in mine])
        a, fl = mine[0], flag_of(f)
        if fl.negate:
            assert (a.default, _field_default(f)) == (False, True), f.name
        elif fl.convert is not None:
            assert fl.convert(a.default) == _field_default(f), f.name
        else:
            assert a.default == _field_default(f), f.name
        if a.choices is not None and a.default is not None:
            assert a.default in a.choices, f.name
        assert a.help and "%(" not in a.help, f.name


def test_no_flags_give_the_default_settings() -> None:
    a = _verb().parse_args(["run", "yesno", "--out", "x"])
    assert settings_from_flags(HFSettings, a, model="tiny") == HFSettings(model="tiny")
    assert vllm_settings("vllm:tiny", a) == VLLMSettings(model="tiny")
    assert settings_from_model("anthropic:claude", a) == ApiSettings("anthropic", model="claude")
    assert server_settings(SERVER, a) == ServerSettings(
        "openai-compatible", model="tiny", base_url="http://127.0.0.1:1/v1"
    )
    assert settings_from_flags(HFSettings, argparse.Namespace(), model="tiny") == HFSettings(model="tiny")


def test_flags_that_are_spelled_otherwise_set_their_field() -> None:
    given = ("--hf-no-group-draws", "--hf-readout-path", "tree", "--system", "S", "--no-prefix-caching")
    given += ("--api-extra-body", '{"top_k": 2}', "--api-timeout", "5", "--batch-api")
    a = _verb().parse_args(
        ["run", "yesno", "--out", "x", *given, "--server-readout", "top_logprobs", "--think-sampling", "qwen3"]
    )
    hf = settings_from_flags(HFSettings, a, model="tiny")
    assert (hf.group_draws, hf.readout_path, hf.system_prompt) == (False, "tree", "S")
    assert (hf.think_temperature, hf.think_top_p, hf.think_top_k) == (0.6, 0.95, 20)
    assert vllm_settings("vllm:tiny", a).enable_prefix_caching is False
    api = settings_from_model("openai:gpt", a)
    assert (api.extra_body, api.timeout, api.batch) == ({"top_k": 2}, 5.0, True)
    assert server_settings(SERVER, a).readout_mode == "top_logprobs"


def test_a_judge_starts_from_shorter_replies() -> None:
    a = _verb().parse_args(["code", "RUN", "--task", "followup", "--judge", "tiny"])
    assert a.max_new_tokens == 16 and EngineSettings.__dataclass_fields__["max_new_tokens"].default == 32


def test_help_keeps_what_the_old_flags_said() -> None:
    helps = {a.dest: a.help for a in _verb("run", "yesno")._actions}
    assert f"{CPU_KV_CACHE_GIB:g} on CPU" in helps["kv_cache_gib"]
    assert helps["think_budget"].endswith("(default: 32768)")
    assert helps["think"].startswith("reason first (up to --think-budget tokens)")  # a field named: its flag
    assert helps["hf_no_group_draws"].startswith("give every draw its own cache row")


# ------------------------------------------------------------------ the mechanism, on a small class
def _twice(text: str | None) -> int:
    return 2 * int(text or 1)


@dataclass(frozen=True)
class _Base:
    name: str = field(default="x", metadata=NO_FLAG)
    """Set in code."""
    size: int = 3
    """Most rows per batch (``rate`` bounds them too).

    A second paragraph that the help leaves out."""


@dataclass(frozen=True)
class _Child(_Base):
    rate: float = 0.5
    """Share of 100% kept."""
    mode: Literal["a", "b"] = "a"
    """How it reads (default: a, the exact one)."""
    cache: bool = field(default=True, metadata=flag(name="no-cache", negate=True, help="turn the cache off"))
    """Reuse what was computed."""
    fast: bool = True
    """Go fast."""
    scale: int = field(default=2, metadata=flag(name="x-scale", convert=_twice))
    """Scale, doubled."""


def test_the_flags_of_a_small_class() -> None:
    assert attr_docs(_Child)["size"].startswith("Most rows per batch")
    assert [f.name for f in flagged(_Child)] == ["size", "rate", "mode", "cache", "fast", "scale"]
    assert [f.name for f in flagged(_Child, own=True)] == ["rate", "mode", "cache", "fast", "scale"]
    p = argparse.ArgumentParser()
    add_flags(p, _Child)
    by = {a.dest: a for a in p._actions}
    assert by["size"].help == "most rows per batch (--rate bounds them too) (default: 3)"
    assert by["rate"].help == "share of 100%% kept (default: 0.5)" and by["rate"].type is float
    assert by["mode"].choices == ["a", "b"] and by["mode"].help == "how it reads (default: a, the exact one)"
    assert by["no_cache"].help == "turn the cache off" and by["no_cache"].default is False
    assert isinstance(by["fast"], argparse.BooleanOptionalAction)
    assert "name" not in by and by["x_scale"].default == 2
    a = p.parse_args(["--no-cache", "--no-fast", "--x-scale", "5", "--mode", "b"])
    assert settings_from_flags(_Child, a) == _Child(cache=False, fast=False, scale=10, mode="b")
    with pytest.raises(SystemExit):
        p.parse_args(["--mode", "c"])
    p.format_help()  # the % is escaped
