"""The rule coder (``probe code --judge rule``): keyword patterns from the taxonomy files, no model.

A transparent, deterministic and free baseline, and honest about its limits:
it matches words, so a paraphrase it has no pattern for is missed, and
``probe judge-agreement --judge rule`` says how far that goes on the
hand-labelled sets. Every pattern is data in the taxonomy YAML
(``experiments/data/taxonomies``); patterns match case-insensitively.

* ``followup``: the taxonomy's ``rules`` are tried top down on the answer; the
  first whose ``any`` matches and whose ``unless`` does not gives the code, else
  ``rules.default`` (:func:`rule_code`).
* ``rationale`` (primary) and ``rationales`` (status of each rationale): a
  rationale is *mentioned* when one of its code's ``cues`` matches the trace,
  *acted on* when a cue matches in a sentence that also matches one of the
  taxonomy's ``decision`` patterns; the primary rationale is the acted-on
  rationale whose cue comes first in the last decision sentence that has one,
  ``none`` when none is acted on (:func:`statuses`, :func:`primary`).

The judge trials carry the coded text (factor ``text``) and, for
``rationales``, the rationale asked about (factor ``rationale``); the rule
coder reads those, never the prompt.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from probe.app.coding_texts import Labelled
from probe.app.taxonomy import STATUS_CODES, Code, Taxonomy, TaxonomyError, load_taxonomy
from probe.types import Trial

_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")


def _search(patterns: Sequence[str], text: str) -> re.Match[str] | None:
    """The earliest match of any of ``patterns`` in ``text`` (case-insensitive), or None."""
    hits = [m for p in patterns if (m := re.search(p, text, flags=re.IGNORECASE | re.MULTILINE))]
    return min(hits, key=lambda m: m.start()) if hits else None


def rule_code(tax: Taxonomy, text: str) -> str:
    """The code of the first rule of ``tax`` that matches ``text`` (``rules.default`` when none does)."""
    if not tax.rules:
        raise TaxonomyError(f"{tax.source} has no 'rules' for the rule coder; add them or use a model judge")
    t = text.strip()
    for r in tax.rules:
        if _search(r.any, t) and not (r.unless and _search(r.unless, t)):
            return r.code
    return tax.default


def sentences(text: str) -> list[str]:
    """The trace cut into sentences (after . ! ? ; and at line breaks), empty ones dropped."""
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def statuses(codes: Sequence[Code], decision: Sequence[str], text: str) -> dict[str, str]:
    """Per rationale code with cues: its status in ``text`` (one of :data:`STATUS_CODES`)."""
    sents = sentences(text)
    deciding = [s for s in sents if _search(decision, s)]
    out = {}
    for c in codes:
        if not c.cues:
            continue
        if any(_search(c.cues, s) for s in deciding):
            out[c.id] = STATUS_CODES[2]
        elif _search(c.cues, text):
            out[c.id] = STATUS_CODES[1]
        else:
            out[c.id] = STATUS_CODES[0]
    return out


def primary(codes: Sequence[Code], decision: Sequence[str], text: str) -> str:
    """The acted-on rationale whose cue comes first in the last decision sentence holding one; ``none`` if none."""
    for s in reversed([s for s in sentences(text) if _search(decision, s)]):
        hits = [(m.start(), i, c.id) for i, c in enumerate(codes) if c.cues and (m := _search(c.cues, s))]
        if hits:
            return min(hits)[2]
    return "none"


@cache
def _taxonomy(path: str) -> Taxonomy:
    return load_taxonomy(path)


class RuleCoder:
    """Labels judge trials from the taxonomy's patterns: one-hot distributions, coverage 1."""

    mode = "rule"
    name = "rule"

    def __init__(self, taxonomy: str | None = None) -> None:
        self.taxonomy = taxonomy
        """The taxonomy file ``probe code --taxonomy`` names (None: the task's shipped one)."""

    def identity(self) -> dict[str, Any]:
        return {"mode": self.mode, "judge": self.name}

    def _tax(self, task: str) -> Taxonomy:
        return _taxonomy(str(self.taxonomy or task))

    def code(self, task: str, text: str, options: Sequence[str], factors: Mapping[str, str]) -> str:
        """The rule coder's code of one text of ``task`` (one of ``options``)."""
        tax = self._tax(task)
        if task == "followup":
            return rule_code(tax, text)
        if task == "rationale":
            by_id = {c.id: c for c in (*tax.codes, *(c for b in tax.benchmarks for c in tax.added[b]))}
            codes = [by_id.get(o) or Code(o, o, o, o) for o in options]
            got = primary(codes, tax.decision, text)
            return got if got in options else "none"
        if task == "rationales":
            rat = _taxonomy(tax.rationale_taxonomy or "rationale")
            every = {c.id: c for c in (*rat.codes, *(c for b in rat.benchmarks for c in rat.added[b]))}
            code = every.get(factors.get("rationale", ""))
            if code is None:
                raise TaxonomyError(f"{rat.source} has no rationale {factors.get('rationale')!r}")
            return statuses([code], rat.decision, text).get(code.id, STATUS_CODES[0])
        raise TaxonomyError(f"the rule coder has no rules for task {task!r}; use a model judge (--judge MODEL)")

    def label(self, trials: Sequence[Trial]) -> list[Labelled]:
        out = []
        for t in trials:
            task = t.experiment.removeprefix("code-")
            got = self.code(task, t.factors.get("text", ""), t.options, t.factors)
            out.append(Labelled({o: float(o == got) for o in t.options}, got, 1.0, 0))
        return out
