"""The crossed-frame moral battery of paper 003: graded rating, free choice, forced binary.

Three instruments over the same dilemmas, each crossing logically irrelevant
factors so that their contributions separate in the analysis:

* **I-1 graded** (``instrument=graded``): the action and its complement rated
  on 0-10, 0-100 and two bipolar scales x three wordings x both anchor
  directions (48 conditions). Options are every value on the scale; each
  option's ``meaning`` is its signed stance toward the cost-benefit (CBR) pole,
  so the analysis never re-derives the scale arithmetic.
* **I-2 free choice** (``instrument=choice``): twelve framings asking which of
  the two courses the model takes, with no scale and no labels. The reply is
  generated (greedy, or sampled with ``--samples``) and judged PRO / ANTI /
  NONCOMMIT (:mod:`experiments.judge`).
* **I-3 forced binary** (``instrument=binary``): the verb-flip family (question
  forms x approve/oppose x printed order, with Yes/No) and the label map (label
  pairs x approve/oppose x printed order x, for arbitrary labels, the
  label-to-verdict mapping).

The trial contract (factors and meanings) is documented in
``docs/battery-analysis.md``; the corpus is data (``experiments/data/battery.yaml``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from experiments import Experiment, ManifestSpec
from experiments.dilemmas import Dilemma, load_dilemmas, select_dilemmas
from experiments.yesno import (
    add_dilemma_arguments,
    add_salt_arguments,
    dilemma_path,
    salts_from_args,
)
from probe.errors import ProbeError, at_least
from probe.files import read_yaml
from probe.grid import Grid
from probe.salts import SaltSpec, make_salt, salted_trials
from probe.types import Trial

if TYPE_CHECKING:
    pass

NAME = "battery"
DEFAULT_CORPUS = Path(__file__).with_name("data") / "battery.yaml"
INSTRUMENTS = ("graded", "choice", "binary")
ANCHORS = ("ascending", "descending")
POLES = ("action", "complement")
VERBS = ("approve", "oppose")
ORDERS = ("yes_first", "no_first")


class CorpusError(ProbeError, ValueError):
    """A malformed battery corpus file; the message names the file and the key."""


@lru_cache(maxsize=8)
def load_corpus(path: str | None = None) -> dict[str, Any]:
    """Read and check the corpus (wordings, scales, forms, labels, framings)."""
    p = Path(path) if path else DEFAULT_CORPUS
    doc = read_yaml(p, "battery corpus", CorpusError, "pass --corpus with an existing corpus YAML")
    for key in ("graded", "binary", "choice"):
        if not isinstance(doc, dict) or not isinstance(doc.get(key), dict):
            raise CorpusError(f"{p}: missing section {key!r}")
    need = {
        "graded": ("wordings", "scales", "instruction", "bipolar_instruction"),
        "binary": ("forms", "labels", "instruction_yesno", "instruction_mapped"),
        "choice": ("framings",),
    }
    for sec, keys in need.items():
        for k in keys:
            if k not in doc[sec]:
                raise CorpusError(f"{p}: section {sec!r} lacks {k!r}")
    for form, pair in doc["binary"]["forms"].items():
        if not (isinstance(pair, list) and len(pair) == 2 and all("{x}" in q for q in pair)):
            raise CorpusError(f"{p}: binary form {form!r} needs [approve, oppose] questions that both contain {{x}}")
    for name, lab in doc["binary"]["labels"].items():
        if not (isinstance(lab.get("pair"), list) and len(lab["pair"]) == 2 and lab["pair"][0] != lab["pair"][1]):
            raise CorpusError(f"{p}: label pair {name!r} needs two distinct labels, got {lab.get('pair')!r}")
    for name, text in doc["choice"]["framings"].items():
        if "{first}" not in text or "{second}" not in text:
            raise CorpusError(f"{p}: choice framing {name!r} must contain {{first}} and {{second}}")
    return dict(doc)


def _pick(kind: str, asked: tuple[str, ...], known: Mapping[str, Any]) -> tuple[str, ...]:
    if not asked:
        return tuple(known)
    bad = [a for a in asked if a not in known]
    if bad:
        raise ValueError(f"unknown {kind} {bad}; choose from {list(known)}")
    return asked


CHOICE_TOKENS = 512
"""Default token cap of a free-choice reply ("explain briefly, then state your choice"). Measured on
SmolLM2-135M-Instruct (``smol``), greedy, the "choose" framing, 12 dilemmas, cap 320: replies ran 189 to 320
tokens and 4 of 12 were still going at 320; the 32 tokens of ``--max-new-tokens`` cut all of them off before
their choice (24 of 24 in a battery run). Models that answer briefly stop long before the cap (the tiny model
after 2 tokens), so the cap costs only where a model needs it."""


@dataclass(frozen=True)
class BatterySpec(ManifestSpec):
    """What the battery asks (serialized into the run manifest). Empty tuples mean "all"."""

    experiment_name: ClassVar[str] = NAME

    dilemmas: str | None = None
    corpus: str | None = None
    items: tuple[str, ...] = ()
    instruments: tuple[str, ...] = INSTRUMENTS
    scales: tuple[str, ...] = ()
    wordings: tuple[str, ...] = ()
    forms: tuple[str, ...] = ()
    """Verb-flip forms (asked with Yes/No)."""
    label_pairs: tuple[str, ...] = ()
    """Label pairs of the label map (other than Yes/No)."""
    label_forms: tuple[str, ...] = ("acceptable",)
    """Forms the label map is asked with."""
    framings: tuple[str, ...] = ()
    choice_tokens: int = CHOICE_TOKENS
    """Token cap of a free-choice reply ("explain briefly, then state your choice")."""
    salts: SaltSpec = field(default_factory=SaltSpec)

    def __post_init__(self) -> None:
        at_least("--choice-tokens", self.choice_tokens, 1)
        bad = [i for i in self.instruments if i not in INSTRUMENTS]
        if bad or not self.instruments:
            raise ValueError(f"unknown instruments {bad or '(none)'}; choose from {list(INSTRUMENTS)}")
        c = load_corpus(self.corpus)
        _pick("scales", self.scales, c["graded"]["scales"])
        _pick("wordings", self.wordings, c["graded"]["wordings"])
        _pick("forms", self.forms, c["binary"]["forms"])
        _pick("forms", self.label_forms, c["binary"]["forms"])
        _pick("label pairs", self.label_pairs, c["binary"]["labels"])
        _pick("framings", self.framings, c["choice"]["framings"])


REDUCED = {
    "scales": ("0-10", "0-100", "bipolar-5"),
    "wordings": ("acceptable", "should"),
    "forms": ("acceptable", "should", "right"),
    "label_pairs": ("A/B", "Y/N", "Ja/Nein"),
    "framings": ("choose", "what_would", "right_thing"),
}
"""The reduced preset: every instrument and every crossing, few forms (for ``make probe`` on a CPU)."""


# ----------------------------------------------------------------- trial text
def cbr_text(d: Dilemma) -> str:
    return d.pole_text(d.cbr_pole)


def anti_text(d: Dilemma) -> str:
    return d.pole_text("complement" if d.cbr_pole == "action" else "action")


def _fmt(x: float) -> str:
    return repr(round(x, 12) + 0.0)


def graded_question(
    d: Dilemma, corpus: Mapping[str, Any], scale: str, wording: str, anchor: str, pole: str
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(user text, options, meanings) of one graded condition."""
    g = corpus["graded"]
    sc = g["scales"][scale]
    lo, hi = int(sc["lo"]), int(sc["hi"])
    w = g["wordings"][wording]
    low_label, high_label = w["anchors"]
    if anchor == "descending":
        low_label, high_label = high_label, low_label
    template = g["bipolar_instruction"] if sc.get("bipolar") else g["instruction"]
    text = (
        f"{d.story}\n\n{w['question'].format(pole=d.pole_text(pole))} "
        f"{template.format(lo=lo, hi=hi, lo_label=low_label, hi_label=high_label)}"
    )
    values = range(lo, hi + 1)
    options = tuple(str(v) for v in values)
    meanings = []
    for v in values:
        a = (v - lo) / (hi - lo)
        if anchor == "descending":
            a = 1.0 - a
        x = 2 * a - 1 if pole == d.cbr_pole else 1 - 2 * a
        meanings.append(_fmt(x))
    return text, options, tuple(meanings)


def binary_question(
    d: Dilemma, corpus: Mapping[str, Any], form: str, verb: str, order: str, pair_name: str, swapped: bool
) -> tuple[str, tuple[str, str], tuple[str, str], str]:
    """(user text, printed options, meanings, yes_label) of one forced-binary condition.

    The affirmative verdict rides on ``pair[0]`` unless ``swapped`` (the
    counterbalanced mapping of arbitrary labels). ``order`` says whether the
    affirmative label is printed first.
    """
    b = corpus["binary"]
    q = b["forms"][form][VERBS.index(verb)].format(x=cbr_text(d))
    lab = b["labels"][pair_name]
    pos, neg = (s.format(cbr=cbr_text(d), anti=anti_text(d)) for s in lab["pair"])
    if lab.get("family") == "story":  # the affirmative answer names the course the question asks about
        pos, neg = (cbr_text(d), anti_text(d)) if verb == "approve" else (anti_text(d), cbr_text(d))
    yes_label, no_label = (neg, pos) if swapped else (pos, neg)
    first, second = (yes_label, no_label) if order == "yes_first" else (no_label, yes_label)
    if lab.get("family") == "yesno":
        instr = b["instruction_yesno"].format(first=first, second=second)
    elif lab.get("family") == "story":
        instr = f'Answer with "{first}" or "{second}".'
    else:
        verdict = {yes_label: "yes", no_label: "no"}
        instr = b["instruction_mapped"].format(
            first=first, second=second, first_verdict=verdict[first], second_verdict=verdict[second]
        )
    means = tuple("cbr" if (o == yes_label) == (verb == "approve") else "anti" for o in (first, second))
    return f"{d.story}\n\n{q} {instr}", (first, second), (means[0], means[1]), yes_label


def choice_question(d: Dilemma, corpus: Mapping[str, Any], framing: str, order: str) -> tuple[str, tuple[str, str]]:
    first, second = (cbr_text(d), anti_text(d)) if order == "cbr_first" else (anti_text(d), cbr_text(d))
    text = corpus["choice"]["framings"][framing].format(first=first, second=second)
    return f"{d.story}\n\n{text}", (first, second)


# ------------------------------------------------------------------ expansion
def _cells(spec: BatterySpec, corpus: Mapping[str, Any]) -> list[tuple[dict[str, str], Callable[[Dilemma], Any]]]:
    """Every condition as (factors, builder); the builder makes (text, options, meanings) for a dilemma."""
    cells: list[tuple[dict[str, str], Callable[[Dilemma], Any]]] = []
    if "graded" in spec.instruments:
        grid = Grid.of(
            {
                "scale": _pick("scales", spec.scales, corpus["graded"]["scales"]),
                "wording": _pick("wordings", spec.wordings, corpus["graded"]["wordings"]),
                "anchor": ANCHORS,
                "pole": POLES,
            }
        )
        for c in grid:
            f = {"instrument": "graded", **c}

            def graded(d: Dilemma, c: dict[str, str] = c) -> Any:
                return graded_question(d, corpus, c["scale"], c["wording"], c["anchor"], c["pole"])

            cells.append((f, graded))
    if "choice" in spec.instruments:
        for framing in _pick("framings", spec.framings, corpus["choice"]["framings"]):
            for order in ("cbr_first", "anti_first"):
                f = {"instrument": "choice", "framing": framing, "order": order}

                def choice(d: Dilemma, fr: str = framing, o: str = order) -> Any:
                    text, printed = choice_question(d, corpus, fr, o)
                    return text, printed, ("cbr", "anti") if o == "cbr_first" else ("anti", "cbr")

                cells.append((f, choice))
    if "binary" in spec.instruments:
        labels = corpus["binary"]["labels"]
        runs: list[tuple[str, str]] = [
            (form, "Yes/No") for form in _pick("forms", spec.forms, corpus["binary"]["forms"])
        ]
        pairs = [p for p in _pick("label pairs", spec.label_pairs, labels) if p != "Yes/No"]
        runs += [(form, pair) for pair in pairs for form in spec.label_forms]
        for form, pair in runs:
            maps = (False, True) if labels[pair].get("counterbalance") else (False,)
            for verb in VERBS:
                for order in ORDERS:
                    for swapped in maps:
                        mapping = "swapped" if swapped else "canonical"
                        f = binary_factors(form, verb, order, pair, str(labels[pair]["family"]), mapping)

                        def build(d: Dilemma, f: dict[str, str] = f, s: bool = swapped) -> Any:
                            text, opts, means, yes = binary_question(
                                d, corpus, f["form"], f["verb"], f["order"], f["labels"], s
                            )
                            return text, opts, means, yes

                        cells.append((f, build))
    return cells


def binary_factors(form: str, verb: str, order: str, pair: str, family: str, mapping: str) -> dict[str, str]:
    """The factors of one binary cell (the trial adds ``yes_label``, the label that carries yes)."""
    return {
        "instrument": "binary",
        "form": form,
        "verb": verb,
        "order": order,
        "labels": pair,
        "family": family,
        "mapping": mapping,
    }


def expand(spec: BatterySpec, count_tokens: Callable[[str], int] | None = None) -> list[Trial]:
    """All trials, in a fixed order: item, then instrument cells, then salt replicate."""
    corpus = load_corpus(spec.corpus)
    dilemmas = select_dilemmas(load_dilemmas(spec.dilemmas), spec.items)
    salts = [make_salt(r, spec.salts, count_tokens) for r in range(spec.salts.count)]
    cells = _cells(spec, corpus)
    trials: list[Trial] = []
    for d in dilemmas:
        for factors, build in cells:
            built = build(d)
            text, options, meanings = built[0], tuple(built[1]), tuple(built[2])
            f = dict(factors)
            if f["instrument"] == "binary":
                f["yes_label"] = built[3]
            if len(set(options)) != len(options):
                raise ValueError(f"dilemma {d.id!r}, condition {f}: options are not distinct: {options}")
            trials += salted_trials(NAME, d.id, f, text, options, meanings, salts, spec.salts.place)
    return trials


def is_choice(t: Trial) -> bool:
    return t.factors.get("instrument") == "choice"


# ------------------------------------------------------------------------ CLI
def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip()) if text else ()


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_dilemma_arguments(p)
    g = p.add_argument_group("battery (empty = the preset's choice)")
    g.add_argument("--preset", default="reduced", choices=["reduced", "full"], help="reduced (default) or full design")
    g.add_argument("--instruments", default=None, help="comma-separated subset of graded,choice,binary (default: all)")
    g.add_argument("--corpus", default=None, help="battery corpus YAML (default: the project's own)")
    g.add_argument("--scales", default=None, help="graded scales, e.g. 0-10,0-100,bipolar-5,bipolar-50")
    g.add_argument("--wordings", default=None, help="graded wordings, e.g. acceptable,right,should")
    g.add_argument("--forms", default=None, help="verb-flip forms asked with Yes/No")
    g.add_argument("--label-pairs", default=None, help="label pairs of the label map, e.g. A/B,Y/N,Ja/Nein")
    g.add_argument("--label-forms", default=None, help="forms the label map is asked with (default: acceptable)")
    g.add_argument("--framings", default=None, help="free-choice framings")
    g.add_argument(
        "--choice-tokens",
        type=int,
        default=CHOICE_TOKENS,
        help=f"token cap of a free-choice reply (default: {CHOICE_TOKENS}; --max-new-tokens caps sampled answers)",
    )
    g.add_argument(
        "--judge",
        default="rule",
        help="free-choice verdicts: 'rule' (which course the reply names; default), or a logit model spec "
        "(e.g. tiny, a local folder, a hub id) read over PRO/ANTI/NONCOMMIT, or an API model sampled on the same "
        "question (openai:<model>, anthropic:<model>, openai-compatible:<name>@<url>)",
    )
    add_salt_arguments(p)


def spec_from_args(a: argparse.Namespace) -> BatterySpec:
    preset: dict[str, tuple[str, ...]] = dict(REDUCED) if a.preset == "reduced" else {}
    chosen = {
        "scales": _csv(a.scales),
        "wordings": _csv(a.wordings),
        "forms": _csv(a.forms),
        "label_pairs": _csv(a.label_pairs),
        "framings": _csv(a.framings),
    }
    kw = {k: v or preset.get(k, ()) for k, v in chosen.items()}
    return BatterySpec(
        dilemmas=dilemma_path(a),
        corpus=str(Path(a.corpus).resolve()) if a.corpus else None,
        items=_csv(a.items),
        instruments=_csv(a.instruments) or INSTRUMENTS,
        label_forms=_csv(a.label_forms) or ("acceptable",),
        choice_tokens=a.choice_tokens,
        salts=salts_from_args(a),
        **kw,
    )


def _judge(a: argparse.Namespace) -> Any:
    from experiments.judge_api import make_free_choice_judge

    return make_free_choice_judge(a.judge, a)


EXPERIMENTS = (
    Experiment.of(
        sys.modules[__name__],
        "the crossed-frame battery of paper 003: graded rating (I-1), free choice (I-2), forced binary (I-3)",
        generative=is_choice,
        reply_tokens=lambda spec: spec.choice_tokens,
        judge_options=_judge,
    ),
)
