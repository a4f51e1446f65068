"""Where a local model's weights go, decided before a byte is loaded, and checked after.

The rules (docs/gpu.md):

* **No silent fallback.** ``--device cuda...`` with a torch that has no usable CUDA, or ``--device auto`` on a
  machine whose NVIDIA driver answers (``nvidia-smi``) while torch sees no GPU, is an error naming the installed
  torch, the CUDA it was built for, the driver's CUDA and the fix. Loading a 30B model in float32 on the CPU
  instead (122 GB) is never what the user meant.
* **One model, one GPU.** A model that fits one GPU goes on one GPU (``device_map={"": i}``): a pipeline split
  runs one GPU at a time, so more GPUs mean more processes (``--shard i/n`` or vLLM's data parallelism).
  ``--device split`` spreads one model over every visible GPU, for a model no single GPU holds.
* **No silent offload.** After loading, a device map that put weights on ``cpu`` or ``disk`` is refused unless
  the user asked for it (``--offload``), naming the memory those weights need.

Pure functions of what they are given (torch's report, nvidia-smi's text, a device map), so every branch is
tested on a machine without a GPU.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from probe.errors import ProbeError

DEVICES_HELP = "auto (one GPU if torch sees one, else the CPU), cpu, cuda, cuda:N, or split (one model over every GPU)"


class DeviceError(ProbeError, RuntimeError):
    """The device asked for cannot be used as asked; the message names what was found and the fix."""


@dataclass(frozen=True)
class TorchCuda:
    """What the installed torch says about CUDA."""

    version: str
    """``torch.__version__``, e.g. ``2.13.0+cpu``."""
    cuda: str | None
    """The CUDA version torch was built for (``torch.version.cuda``); None for a CPU build."""
    available: bool
    """``torch.cuda.is_available()``."""
    count: int
    """``torch.cuda.device_count()`` (0 when not available)."""

    @classmethod
    def of(cls, torch: Any) -> TorchCuda:
        available = bool(torch.cuda.is_available())
        return cls(
            str(torch.__version__),
            getattr(torch.version, "cuda", None),
            available,
            int(torch.cuda.device_count()) if available else 0,
        )

    def describe(self) -> str:
        return f"torch {self.version} ({'built for CUDA ' + self.cuda if self.cuda else 'a CPU-only build'})"


@dataclass(frozen=True)
class Driver:
    """What ``nvidia-smi`` says, if it answers."""

    version: str
    """The driver version, e.g. ``550.54.15``."""
    cuda: str | None
    """The newest CUDA the driver supports (``CUDA Version`` in nvidia-smi's header)."""

    @classmethod
    def parse(cls, text: str) -> Driver | None:
        """The driver named in ``nvidia-smi``'s plain output (None if it names none)."""
        version = re.search(r"Driver Version:\s*([0-9.]+)", text)
        if not version:
            return None
        cuda = re.search(r"CUDA Version:\s*([0-9.]+)", text)
        return cls(version.group(1), cuda.group(1) if cuda else None)

    def describe(self) -> str:
        return f"NVIDIA driver {self.version}" + (f" (CUDA {self.cuda})" if self.cuda else "")


def nvidia_driver(timeout: float = 10.0) -> Driver | None:
    """The NVIDIA driver of this machine, or None where ``nvidia-smi`` is absent or does not answer."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return Driver.parse(done.stdout) if done.returncode == 0 else None


def torch_fix(driver: Driver | None) -> str:
    """How to get a torch that can use this machine's GPU."""
    wheel = ""
    if driver is not None and driver.cuda:
        major, _, minor = driver.cuda.partition(".")
        wheel = f" (this driver takes CUDA <= {driver.cuda}: e.g. --index-url https://download.pytorch.org/whl/cu{major}{minor[:1]})"
    return (
        "install a torch built for a CUDA the driver supports into this venv"
        f"{wheel} (README, 'On a GPU box'), or pass --device cpu to use the CPU on purpose"
    )


@dataclass(frozen=True)
class Placement:
    """Where the weights go: the ``device_map`` for ``from_pretrained`` and the device the inputs go to."""

    device_map: Any
    """``{"": "cpu"}``, ``{"": N}`` (one GPU) or ``"auto"`` (split over the visible GPUs)."""
    cuda: bool
    """Weights on a GPU (the default dtype is then bfloat16)."""
    split: bool = False
    """One model over several devices (``--device split``)."""

    def describe(self) -> str:
        if self.split:
            return "split over the visible GPUs"
        where = self.device_map[""]
        return f"cuda:{where}" if isinstance(where, int) else str(where)


def place(device: str, torch_cuda: TorchCuda, driver: Driver | None) -> Placement:
    """The placement ``--device DEVICE`` asks for, or a :class:`DeviceError` naming why it cannot be had."""
    if device == "cpu":
        return Placement({"": "cpu"}, cuda=False)
    wants_gpu = device != "auto"
    if not torch_cuda.available:
        if wants_gpu or driver is not None:
            seen = driver.describe() + " answers (nvidia-smi)" if driver is not None else "no NVIDIA driver answers"
            raise DeviceError(
                f"--device {device}: {torch_cuda.describe()} sees no CUDA device; {seen}. Fix: {torch_fix(driver)}"
            )
        return Placement({"": "cpu"}, cuda=False)
    if device == "split":
        return Placement("auto", cuda=True, split=True)
    index = 0
    if device.startswith("cuda:"):
        index = int(device.split(":", 1)[1])
        if not 0 <= index < torch_cuda.count:
            raise DeviceError(
                f"--device {device}: torch sees {torch_cuda.count} CUDA device(s) (cuda:0..cuda:{torch_cuda.count - 1}); "
                "pick one of those, or check CUDA_VISIBLE_DEVICES"
            )
    return Placement({"": index}, cuda=True)


def check_device_arg(device: str) -> None:
    """Refuse a ``--device`` value that names no placement."""
    if device in ("auto", "cpu", "cuda", "split"):
        return
    if device.startswith("cuda:") and device[5:].isdigit():
        return
    raise ValueError(f"device must be {DEVICES_HELP}; got {device!r}")


def offloaded(device_map: Mapping[str, Any] | None, sizes: Mapping[str, int]) -> tuple[list[str], int]:
    """The modules of ``device_map`` placed on ``cpu`` or ``disk``, and their parameter bytes.

    ``sizes`` maps each parameter's name to its bytes; a module owns the parameters under its name.
    """
    if not device_map:
        return [], 0
    names = [m for m, where in device_map.items() if str(where) in ("cpu", "disk")]
    total = 0
    for param, n in sizes.items():
        if any(m == "" or param == m or param.startswith(m + ".") for m in names):
            total += n
    return names, total


def check_offload(device_map: Mapping[str, Any] | None, sizes: Mapping[str, int], *, allowed: bool) -> None:
    """Refuse weights that a GPU placement left on the CPU or disk, unless offload was asked for."""
    names, total = offloaded(device_map, sizes)
    if not names or allowed:
        return
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    raise DeviceError(
        f"the model did not fit the GPU memory: {shown} ({total / 2**30:.1f} GiB of weights) were placed on the "
        "CPU or disk, which runs far slower. Use a GPU with more free memory, --device split over several GPUs, "
        "a smaller --dtype, or pass --offload to accept offloading"
    )


def main() -> int:
    """``python -m engines.hf.placement``: where ``--device auto`` would put a model here, or why it cannot (exit 2).

    ``make install`` runs it after installing torch, so a GPU box whose torch cannot use the driver fails at
    install time, with the fix, instead of at the first run.
    """
    import sys

    import torch

    cuda = TorchCuda.of(torch)
    try:
        where = place("auto", cuda, nvidia_driver() if not cuda.available else None)
    except DeviceError as e:
        print(f"probe: {e}", file=sys.stderr)
        return 2
    print(f"probe: {cuda.describe()}; --device auto places a model on {where.describe()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
