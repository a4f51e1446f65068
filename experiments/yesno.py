"""The forced yes/no instrument (paper 003, I-3, its first slice).

Each dilemma is asked as a yes/no question crossed by

* **verb**: ``approve`` ("Is it morally acceptable to X?", *yes* endorses X)
  or ``oppose`` ("Is it morally wrong to X?", *yes* rejects X);
* **order**: ``yes_first`` ("Answer with Yes or No.") or ``no_first``;
* **form**: a small family of logically equivalent wordings of each verb.

Crossing verb with order is what separates the order bias (a pull toward a
printed position) from the lexical bias (a pull toward the word) in the
analysis; the forms make the result a property of a family of wordings rather
than of one sentence. Each option carries its meaning: ``cbr`` when answering
it endorses the dilemma's cost-benefit pole, ``anti`` otherwise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from experiments import Experiment, ManifestSpec
from experiments.dilemmas import Dilemma, load_dilemmas, select_dilemmas
from probe.grid import Grid
from probe.salts import SaltSpec, make_salt, salted_trials
from probe.types import Trial

if TYPE_CHECKING:
    pass

NAME = "yesno"

# form -> (approve question, oppose question); {action} is the dilemma's action phrase.
FORMS: dict[str, tuple[str, str]] = {
    "acceptable": ("Is it morally acceptable to {action}?", "Is it morally wrong to {action}?"),
    "permissible": ("Is it permissible for you to {action}?", "Is it impermissible for you to {action}?"),
    "should": ("Should you {action}?", "Should you refuse to {action}?"),
}
VERBS = ("approve", "oppose")
ORDERS = ("yes_first", "no_first")


@dataclass(frozen=True)
class YesNoSpec(ManifestSpec):
    """What the yes/no battery asks. Serialized into the run manifest."""

    experiment_name: ClassVar[str] = NAME

    dilemmas: str | None = None
    """Path of a dilemma file (YAML/JSONL); None = the project's own set."""
    forms: tuple[str, ...] = tuple(FORMS)
    labels: tuple[str, str] = ("Yes", "No")
    """The printed yes and no words (the options the slot is read over)."""
    salts: SaltSpec = field(default_factory=SaltSpec)
    items: tuple[str, ...] = ()
    """Restrict to these dilemma ids (empty = all)."""

    def __post_init__(self) -> None:
        bad = [f for f in self.forms if f not in FORMS]
        if bad or not self.forms:
            raise ValueError(f"unknown yes/no forms {bad or '(none given)'}; choose from {sorted(FORMS)}")
        if len(self.labels) != 2 or self.labels[0] == self.labels[1] or not all(self.labels):
            raise ValueError(f"labels must be two distinct non-empty strings, got {self.labels!r}")


def question(d: Dilemma, form: str, verb: str, order: str, labels: tuple[str, str]) -> tuple[str, tuple[str, str]]:
    """The user message text and the printed options (in print order)."""
    q = FORMS[form][VERBS.index(verb)].format(action=d.action)
    yes, no = labels
    printed = (yes, no) if order == "yes_first" else (no, yes)
    return f"{d.story}\n\n{q} Answer with {printed[0]} or {printed[1]}.", printed


def meaning(d: Dilemma, verb: str, option_is_yes: bool) -> str:
    """``cbr`` if answering this option endorses the dilemma's cost-benefit pole."""
    endorses_action = option_is_yes == (verb == "approve")
    endorsed = "action" if endorses_action else "complement"
    return "cbr" if endorsed == d.cbr_pole else "anti"


def expand(spec: YesNoSpec, count_tokens: Callable[[str], int] | None = None) -> list[Trial]:
    """All trials of the battery, in a fixed order (item, form, verb, order, replicate)."""
    dilemmas = select_dilemmas(load_dilemmas(spec.dilemmas), spec.items)
    grid = Grid.of({"form": spec.forms, "verb": VERBS, "order": ORDERS})
    salts = [make_salt(r, spec.salts, count_tokens) for r in range(spec.salts.count)]
    label_pair = "/".join(spec.labels)
    trials: list[Trial] = []
    for d in dilemmas:
        for cell in grid:
            text, printed = question(d, cell["form"], cell["verb"], cell["order"], spec.labels)
            means = tuple(meaning(d, cell["verb"], o == spec.labels[0]) for o in printed)
            factors = {**cell, "labels": label_pair}
            trials += salted_trials(NAME, d.id, factors, text, printed, means, salts, spec.salts.place)
    return trials


def add_salt_arguments(p: argparse.ArgumentParser) -> None:
    """The salted-replicate flags, shared by every dilemma instrument."""
    g = p.add_argument_group("salted replicates")
    g.add_argument("--salts", type=int, default=1, help="replicates per trial, the unsalted one included (default: 1)")
    g.add_argument("--salt-seed", type=int, default=0, help="seed of the salt strings (default: 0)")
    g.add_argument("--salt-tokens", type=int, default=8, help="tokens per salt string (default: 8)")
    g.add_argument(
        "--salt-place",
        default="user_start",
        choices=["user_start", "user_end", "system"],
        help="where the salt goes (default: user_start)",
    )


def salts_from_args(a: argparse.Namespace) -> SaltSpec:
    return SaltSpec(count=a.salts, seed=a.salt_seed, n_tokens=a.salt_tokens, place=a.salt_place)


def add_dilemma_arguments(p: argparse.ArgumentParser) -> None:
    """``--dilemmas`` and ``--items``, shared by every dilemma instrument."""
    g = p.add_argument_group("dilemmas")
    g.add_argument("--dilemmas", default=None, help="dilemma file (YAML or JSONL) instead of the project's own set")
    g.add_argument("--items", default=None, help="comma-separated dilemma ids to keep (default: all)")


def dilemma_path(a: argparse.Namespace) -> str | None:
    return str(Path(a.dilemmas).resolve()) if a.dilemmas else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_dilemma_arguments(p)
    g = p.add_argument_group("yes/no battery")
    g.add_argument("--forms", default=None, help=f"comma-separated wording forms (default: all of {', '.join(FORMS)})")
    g.add_argument("--labels", default="Yes,No", help="the yes and no words, comma-separated (default: Yes,No)")
    add_salt_arguments(p)


def spec_from_args(a: argparse.Namespace) -> YesNoSpec:
    labels = tuple(a.labels.split(","))
    if len(labels) != 2:
        raise ValueError(f"--labels needs exactly two words separated by a comma, got {a.labels!r}")
    return YesNoSpec(
        dilemmas=dilemma_path(a),
        items=tuple(a.items.split(",")) if a.items else (),
        salts=salts_from_args(a),
        labels=(labels[0], labels[1]),
        **({"forms": tuple(a.forms.split(","))} if a.forms else {}),
    )


EXPERIMENTS = (
    Experiment.of(
        sys.modules[__name__],
        "forced yes/no: verb x printed order x wording form (paper 003, I-3)",
    ),
)
