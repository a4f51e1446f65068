"""The experiment registry: modules register through ``Experiment.of`` / ``Benchmark.of``, which read four hook names."""

from __future__ import annotations

import importlib
import types

import pytest

from experiments import HOOK_NAMES, Experiment, ModuleHooks, get_experiment
from experiments.influence import Benchmark


@pytest.mark.parametrize("module_name", ["battery", "cue", "yesno", "followup"])
def test_registered_experiments_use_their_modules_hooks(module_name: str) -> None:
    module = importlib.import_module(f"experiments.{module_name}")
    exp = get_experiment(module.NAME)
    assert (exp.add_arguments, exp.spec_from_args, exp.expand) == (
        module.add_arguments,
        module.spec_from_args,
        module.expand,
    )


def test_of_passes_optional_fields() -> None:
    module = types.ModuleType("experiments.fake")
    module.NAME = "fake"
    module.add_arguments = lambda p: None
    module.spec_from_args = lambda a: None
    module.expand = lambda spec, count_tokens=None: []
    exp = Experiment.of(module, "a fake", generative=bool)
    assert (exp.name, exp.summary, exp.generative, exp.judge_options) == ("fake", "a fake", bool, None)
    with pytest.raises(TypeError, match="colour"):
        Experiment.of(module, "a fake", colour="red")


def test_a_missing_hook_is_named_with_its_module() -> None:
    module = types.ModuleType("experiments.half")
    module.NAME = "half"
    module.add_arguments = lambda p: None
    for read in (
        ModuleHooks.of,
        lambda m: Experiment.of(m, "half"),
        lambda m: Benchmark.of(m, "half", "Half", "half"),
    ):
        with pytest.raises(TypeError, match=r"experiments\.half does not define spec_from_args, expand") as err:
            read(module)
        assert ", ".join(HOOK_NAMES) in str(err.value)
