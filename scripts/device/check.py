"""What every step of the GPU check is handed (:class:`Check`), and the random Qwen3-MoE the moe steps share.

:func:`random_moe` builds the randomly initialised Qwen3-MoE at the real widths with :data:`MOE_LAYERS`
layers (:func:`moe_config`; the tiny model's widths on the CPU, with :func:`tiny_tokenizer`);
:meth:`Check.moe` builds it once, with the machine's matmul rate and copy bandwidth measured beside it
(:class:`Moe`), and :meth:`Check.release_moe` frees it, recording the GPU's peak memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scripts.device.trials import binary_trials

MOE_LAYERS = 8
"""Layers of the random Qwen3-MoE on a GPU (the real model has 48; figures are extrapolated by 48 / 8); 4 on a CPU."""


REAL_WIDTHS: dict[str, int] = dict(
    hidden_size=2048,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    moe_intermediate_size=768,
    intermediate_size=6144,
    vocab_size=151936,
)
"""The widths of the moe steps' model on a GPU: Qwen3-30B-A3B's (its layers: :data:`MOE_LAYERS`)."""


def moe_config(cpu: bool) -> Any:
    """Step 4's Qwen3-MoE config: :data:`REAL_WIDTHS`, or on a CPU the tiny model's widths (``probe.tiny``: the
    same code path, seconds on 2 cores) with a 4,096-token vocabulary."""
    import transformers

    widths = REAL_WIDTHS
    if cpu:
        from probe.tiny import QWEN_MOE_CONFIG

        widths = {k: QWEN_MOE_CONFIG[k] for k in REAL_WIDTHS if k != "vocab_size"} | {"vocab_size": 4096}
    return transformers.Qwen3MoeConfig(
        num_hidden_layers=4 if cpu else MOE_LAYERS, max_position_embeddings=4096, **widths
    )


def tiny_tokenizer() -> Any:
    """The tiny models' tokenizer without building a tiny model (the moe steps run while device_check.sh builds them
    in the background): trained by the same code, saved and loaded back as the tiny models' folders hold it."""
    import tempfile

    import transformers

    from probe.tiny_tokenizer import build_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        build_tokenizer().save_pretrained(folder)
        return transformers.AutoTokenizer.from_pretrained(folder)


def random_moe(dev: Any, cpu: bool) -> tuple[Any, Any, Callable[[], None]]:
    """The moe and graphs steps' model: a randomly initialised Qwen3-MoE (:func:`moe_config`; seed 0) on ``dev``,
    float32 on a CPU and bfloat16 on a GPU, in an engine computing the head in the model's dtype, with tiny's
    tokenizer (its ids fit any vocabulary); returns (config, engine, a synchronize of ``dev``)."""
    import torch
    import transformers

    from engines.hf import HFEngine, HFSettings

    torch.manual_seed(0)
    config = moe_config(cpu)
    dtype = torch.float32 if cpu else torch.bfloat16
    with dev:
        model = transformers.Qwen3MoeForCausalLM(config).to(dtype).eval()
    engine = HFEngine(
        HFSettings(model="qwen3-moe-random", dtype=str(dtype).replace("torch.", ""), head_dtype="model"),
        model=model,
        tokenizer=tiny_tokenizer(),
    ).load()
    sync = (lambda: torch.cuda.synchronize(dev)) if not cpu else (lambda: None)
    return config, engine, sync


Emit = Callable[[dict[str, Any]], None]


@dataclass
class Moe:
    """The random Qwen3-MoE the moe steps share (built once, :meth:`Check.moe`), with the machine's own limits
    measured beside it: the matmul rate and copy bandwidth every floor is computed from."""

    dev: Any
    cpu: bool
    config: Any
    base: Any
    sync: Callable[[], None]
    flops_rate: float
    bandwidth: float

    @property
    def dtype(self) -> Any:
        return next(self.base.model.parameters()).dtype

    @property
    def scale(self) -> float:
        """48 / layers: the real model's figures from this one's."""
        return 48 / self.config.num_hidden_layers

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.base.render(binary_trials()[0])


@dataclass
class Check:
    """What every step is handed: where it runs, the models of the tiny steps, where its rows go, and the shared
    random Qwen3-MoE (built at the first moe step that runs)."""

    device: str
    cpu: bool
    models: Sequence[str]
    emit: Emit
    _moe: Moe | None = None

    def moe(self) -> Moe:
        if self._moe is None:
            import torch

            from scripts import device_moe as dm

            dev = torch.device("cpu" if self.cpu else self.device)
            if not self.cpu:
                torch.cuda.reset_peak_memory_stats(dev)
            config, base, sync = random_moe(dev, self.cpu)
            dtype = next(base.model.parameters()).dtype
            self._moe = Moe(
                dev, self.cpu, config, base, sync, dm.matmul_rate(dev, dtype, sync), dm.copy_bandwidth(dev, sync)
            )
            m = self._moe
            self.emit({"check": "moe", "what": "machine", "matmul_flop_per_s": m.flops_rate,
                       "copy_bytes_per_s": m.bandwidth, "layers": config.num_hidden_layers})  # fmt: skip
        return self._moe

    def release_moe(self) -> None:
        """Free the random Qwen3-MoE, recording the GPU's peak memory while it lived."""
        if self._moe is None:
            return
        m, self._moe = self._moe, None
        if not m.cpu:
            import torch

            weights = sum(p.numel() * p.element_size() for p in m.base.model.parameters())
            self.emit({"check": "moe", "what": "peak memory", "gib": torch.cuda.max_memory_allocated(m.dev) / 2**30,
                       "weights_gib_48_layers_estimate": weights * m.scale / 2**30})  # fmt: skip
            del m
            torch.cuda.empty_cache()
