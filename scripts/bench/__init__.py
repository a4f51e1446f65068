"""Readout benchmark: probe's Transformers engine against lm-evaluation-harness, side by side.

``python -m scripts.bench`` (or ``make bench``) builds a CPU-sized Qwen3-MoE
locally (:mod:`scripts.bench.model`), expands three workloads from the
project's real batteries (:mod:`scripts.bench.workloads`), checks that every
peer computes the same numbers as probe, then times each peer on each
workload in a fresh subprocess (:mod:`scripts.bench.peers`) and prints
throughput, tokens computed, peak memory and the fraction of the machine's
compute limit (:mod:`scripts.bench.run`, over :mod:`scripts.bench.plan`,
:mod:`scripts.bench.children`, :mod:`scripts.bench.checks` and
:mod:`scripts.bench.goals`). Numbers are measured, never
asserted; the method is in ``docs/speed.md``.
"""
