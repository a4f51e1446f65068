"""The Transformers engine: exact answer-slot readouts and raw samples.

Design notes (why it is shaped like this):

* **Token ids, not strings.** The chat template renders the whole prompt to
  text once, it is tokenized once, and everything after (option tokens,
  reasoning, closing tags) is appended as ids. Nothing is ever cut out of a
  string that was tokenized whole, because BPE merges across a cut change the
  ids the model saw. Renders and option encodings are cached per distinct
  input, because a battery asks the same options thousands of times.
* **Options through a trie.** Options become token sequences in a trie
  (:mod:`engines.trie`); the model is asked for the next-token distribution
  after the prompt and after every proper option prefix (the trie's internal
  nodes), and nothing else: logits are computed only at those positions.
* **Each shared token once.** A battery asks the same story under many forms,
  so most prompt tokens are shared. Three readout paths (tree, branch, plain:
  :mod:`engines.hf.readout`) compute the same values and differ only in how
  much they share.
* **Batch- and padding-invariant.** Prompts are left-padded with explicit
  position ids (so RoPE positions do not depend on the padding), and rows
  are grouped so that shared prefixes are adjacent.
* **Raw logits, the readout's log-softmax in float64.** No temperature, no top-k, no processors. The
  positions a readout reads are normalized in float64 (:func:`readout_log_probs`): an option that is a prefix of
  longer ones ends with ``1 - (its continuations' mass)``, which multiplies a float32 log-softmax's rounding by
  ``mass / (1 - mass)`` (1.1e-4 nats on smol's "9" of 0-100). Draws sample from float32 log-probs, as before.

The package, one module a concern (docs/engines.md), each importing only those before it:

- :mod:`engines.hf.settings`: :class:`HFSettings` and the ``--hf-*`` flags.
- :mod:`engines.hf.tokens`: token rows and the token tree, pure functions.
- :mod:`engines.hf.weights`: loading and placing the weights; :class:`engines.hf.weights.Model`, every forward.
- :mod:`engines.hf.readout`: :class:`engines.hf.readout.Reader`, the answer-slot readouts.
- :mod:`engines.hf.reasoning`: :class:`engines.hf.reasoning.Reasoner`, think mode's traces and refilled decoding.
- :mod:`engines.hf.draws`: :class:`engines.hf.draws.Sampler`, the seeded draws.
- :mod:`engines.hf.engine`: :class:`HFEngine`, the facade that composes them.

This module names what the rest of the project imports from the engine (``from engines.hf import ...``), and
the two functions :mod:`engines` asks of every backend (:func:`add_arguments`, :func:`from_args`).
"""

from __future__ import annotations

import argparse

from engines.flags import settings_from_flags
from engines.hf.engine import HFEngine
from engines.hf.settings import SUPPORTS, HFSettings, add_arguments


def from_args(model: str, a: argparse.Namespace) -> HFEngine:
    """The engine the parsed flags ask for."""
    return HFEngine(settings_from_flags(HFSettings, a, model=model))


__all__ = ["SUPPORTS", "HFEngine", "HFSettings", "add_arguments", "from_args"]
