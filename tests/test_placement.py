"""Where a model's weights go (engines.hf.placement) and the device moves of a split model, on a CPU-only machine.

The CUDA side of the same code runs in tests/test_gpu.py and scripts/device_check.sh (a model split over a GPU and
the CPU). Here the moves are checked with torch's ``meta`` device standing in for a second device: whatever a
helper hands back for a device must live on that device.
"""

from __future__ import annotations

import pytest
import torch

from engines.hf.placement import (
    DeviceError,
    Driver,
    Placement,
    TorchCuda,
    check_device_arg,
    check_offload,
    offloaded,
    place,
    torch_fix,
)

SMI = """
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |
|-----------------------------------------+------------------------+----------------------+
"""
CPU_TORCH = TorchCuda("2.13.0+cpu", None, False, 0)
CUDA_TORCH = TorchCuda("2.13.0+cu130", "13.0", True, 2)
BROKEN_TORCH = TorchCuda("2.13.0+cu130", "13.0", False, 0)  # built for a CUDA newer than the driver's


def test_driver_parsed_from_nvidia_smi() -> None:
    assert Driver.parse(SMI) == Driver("550.54.15", "12.4")
    assert Driver.parse("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver") is None


def test_cpu_placement_needs_nothing() -> None:
    assert place("cpu", CPU_TORCH, Driver.parse(SMI)) == Placement({"": "cpu"}, cuda=False)
    assert place("auto", CPU_TORCH, None) == Placement({"": "cpu"}, cuda=False)  # no GPU anywhere: the CPU


def test_a_gpu_asked_for_without_cuda_is_refused_in_one_line() -> None:
    with pytest.raises(DeviceError) as e:
        place("cuda:0", CPU_TORCH, None)
    msg = str(e.value)
    assert "\n" not in msg
    assert "torch 2.13.0+cpu (a CPU-only build)" in msg and "no NVIDIA driver answers" in msg
    assert "--device cpu" in msg


def test_a_driver_that_torch_cannot_use_is_refused_even_on_auto() -> None:
    """The silent fallback of old: a GPU box whose torch does not match the driver loaded on the CPU in float32."""
    with pytest.raises(DeviceError) as e:
        place("auto", BROKEN_TORCH, Driver.parse(SMI))
    msg = str(e.value)
    assert "built for CUDA 13.0" in msg and "NVIDIA driver 550.54.15 (CUDA 12.4) answers" in msg
    assert "cu124" in msg  # the wheel index that fits this driver


def test_one_model_one_gpu_and_split_on_request() -> None:
    assert place("auto", CUDA_TORCH, None) == Placement({"": 0}, cuda=True)
    assert place("cuda", CUDA_TORCH, None) == Placement({"": 0}, cuda=True)
    assert place("cuda:1", CUDA_TORCH, None).device_map == {"": 1}
    assert place("split", CUDA_TORCH, None) == Placement("auto", cuda=True, split=True)
    with pytest.raises(DeviceError, match=r"sees 2 CUDA device\(s\) \(cuda:0..cuda:1\)"):
        place("cuda:2", CUDA_TORCH, None)


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cuda:", "mps0", ""])
def test_device_argument_checked(bad: str) -> None:
    with pytest.raises(ValueError, match="device must be"):
        check_device_arg(bad)


def test_offloaded_weights_are_counted_and_refused() -> None:
    dmap = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "lm_head": "disk"}
    sizes = {
        "model.embed_tokens.weight": 100,
        "model.layers.0.mlp.weight": 10,
        "model.layers.1.mlp.weight": 2**30,
        "model.layers.10.mlp.weight": 7,  # not under model.layers.1: a prefix of a name is not its parent
        "lm_head.weight": 2**30,
    }
    assert offloaded(dmap, sizes) == (["model.layers.1", "lm_head"], 2**31)
    with pytest.raises(DeviceError, match=r"model.layers.1, lm_head \(2.0 GiB of weights\).*--offload"):
        check_offload(dmap, sizes, allowed=False)
    check_offload(dmap, sizes, allowed=True)
    check_offload({"": 0}, sizes, allowed=False)
    check_offload(None, sizes, allowed=False)


def test_fix_names_no_wheel_without_a_driver_cuda() -> None:
    assert "whl/cu" not in torch_fix(None)
    assert "whl/cu124" in torch_fix(Driver("550.54.15", "12.4"))


def test_cli_refuses_a_gpu_it_does_not_have(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from probe.app.cli import main

    rc = main(
        ["readout", "--model", "tiny", "--device", "cuda:0", "--prompt", "Is it? Yes or No.", "--options", "Yes,No"]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "sees no CUDA device" in err


# ------------------------------------------------------------------ device moves of a split model
def test_on_device_copies_once_per_device() -> None:
    from engines.hf.sampling import OnDevice

    idx = torch.tensor([2, 0, 1])
    d = OnDevice(idx)
    assert d.on(idx.device) is idx
    meta = d.on(torch.device("meta"))
    assert meta.device.type == "meta" and d.on(torch.device("meta")) is meta


def test_grouped_rows_and_masks_are_made_on_the_device_asked_for() -> None:
    from engines.hf.sampling import Groups

    g = Groups(torch.tensor([[0, 1, 1], [1, 1, 1]]), n=2, n_layers=2)
    cpu_mask = g.mask(1, torch.float32, 2, torch.device("cpu"))
    meta_mask = g.mask(1, torch.float32, 2, torch.device("meta"))
    assert cpu_mask.device.type == "cpu" and meta_mask.device.type == "meta"
    assert meta_mask.shape == cpu_mask.shape == (2, 1, 4, 5)
    group, slot = g.rows_on(torch.device("meta"))
    assert group.device.type == "meta" and slot.device.type == "meta"
    # a new selection of live rows drops the per-device copies of the old one
    for _ in range(2):
        g.select(torch.tensor([0, 3]))
    assert g.rows_on(torch.device("cpu"))[0].tolist() == [0, 1]


def test_tree_cache_gathered_per_layer_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """gather_tree_cache indexes each layer with an index on that layer's device (layer 1 on the stand-in device).

    ``meta`` tensors accept an index from any device, so the index's device is checked where it is asked for.
    """
    import transformers

    from engines.hf import sampling
    from engines.hf.sampling import gather_tree_cache

    asked: list[str] = []
    on = sampling.OnDevice.on

    def spy(self: sampling.OnDevice, device: torch.device) -> torch.Tensor:
        asked.append(device.type)
        got = on(self, device)
        assert got.device.type == device.type
        return got

    monkeypatch.setattr(sampling.OnDevice, "on", spy)
    from probe.tiny import ensure_tiny

    config = transformers.AutoConfig.from_pretrained(ensure_tiny("tiny"))
    cache = transformers.DynamicCache(config=config)
    heads, nodes, dim = 2, 4, 3
    for i, layer in enumerate(cache.layers):
        dev = "cpu" if i == 0 else "meta"
        layer.lazy_initialization(torch.zeros(1, heads, 0, dim, device=dev), torch.zeros(1, heads, 0, dim, device=dev))
        layer.update(torch.ones(1, heads, nodes, dim, device=dev), torch.ones(1, heads, nodes, dim, device=dev))
    merged, mask = gather_tree_cache([cache], [[[0, 1], [0, 2, 3]]], repeats=2, reserve=4, config=config)
    assert mask.shape == (4, 3)
    assert asked == ["cpu", "cpu"] + ["meta", "meta"] * (len(merged.layers) - 1)  # keys and values of each layer
    assert [layer.keys.device.type for layer in merged.layers] == ["cpu"] + ["meta"] * (len(merged.layers) - 1)
    assert merged.layers[0].keys.shape == (4, heads, 3, dim)
