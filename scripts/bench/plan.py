"""What the benchmark runs: its workloads, the peers of each and their labels, the dilemmas and batch sizes.

:data:`ALL_WORKLOADS` (the bench model's three and the two on ``smol``: :data:`SMOL_READOUT`,
:data:`SMOL_SAMPLE`), :data:`PEERS_FOR` and :data:`SAMPLE_PEERS` (the peers of each), :data:`LABELS` (how the
tables name them), :data:`ITEMS` and :data:`BATCH_SIZES` (default and ``--quick``), and where the vLLM
venv's Python is (:data:`VLLM_PYTHON`).
"""

from __future__ import annotations

from pathlib import Path

from scripts.bench.workloads import NAMES

ROOT = Path(__file__).resolve().parents[2]
SMOL_READOUT = "smol_binary"
SMOL_SAMPLE = "smol_sample"
ALL_WORKLOADS = (*NAMES, SMOL_READOUT, SMOL_SAMPLE)
QUICK_WORKLOADS = ("forced_binary", SMOL_READOUT, SMOL_SAMPLE)
PEERS_FOR = {
    "forced_binary": ("probe", "probe-plain", "lm-eval", "transformers-decision"),
    "graded": ("probe", "probe-plain", "lm-eval"),
    "salted": ("probe", "probe-plain", "lm-eval", "transformers-decision"),
    SMOL_READOUT: ("probe", "probe-layers", "lm-eval"),
}
SAMPLE_PEERS = ("probe", "probe-stop", "today", "generate")
NOT_AVAILABLE = {
    "graded": "transformers-decision: n/a (it reads single-token labels, and at most 26 of them; 0-100 needs 101 "
    "options of up to 3 tokens)",
}
# dilemmas per workload: (default, --quick)
ITEMS = {"forced_binary": (22, 2), "graded": (3, 1), "salted": (4, 2), SMOL_READOUT: (4, 1)}
BATCH_SIZES = "1,4,16,64"
QUICK_BATCH_SIZES = "4,16"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
LABELS = {
    "probe": "probe",
    "probe-stop": "probe stop_at_answer",
    "probe-plain": "probe plain path",
    "probe-layers": "probe --layers all",
    "lm-eval": "lm-eval HF",
    "transformers-decision": "transformers decision",
    "today": "today's engine",
    "generate": "generate() baseline",
    "probe-vllm": "probe vLLM engine",
    "vllm-generate": "vLLM LLM.generate",
    "lm-eval-vllm": "lm-eval vLLM",
}
