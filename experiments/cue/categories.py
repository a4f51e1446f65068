"""Demographic attributes and their categories, demographic combinations, and name lists.

The cue-visibility design (paper 001) conveys two attributes of each of four
individuals: a gender and a race (the paper's race set mixes continental
groups with one religious group, Muslim; see its Limitations). Each item uses
two categories of each attribute, bound to the puzzle's abstract value slots
0 and 1; a *combination* is that binding (gender slot 0, gender slot 1, race
slot 0, race slot 1).

A category knows how to appear in a sentence, because the puzzle renders
clues such as "A is not a woman" and "Exactly two of A, B and D are Asian":
a noun category needs an article in the singular and its own plural, an
adjective category uses the bare word in both.
"""

from __future__ import annotations

import itertools
import pathlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from probe.files import read_yaml

DEFAULT_GENDERS: Final[tuple[str, ...]] = ("man", "woman", "non-binary")
DEFAULT_RACES: Final[tuple[str, ...]] = ("Asian", "Black", "Hispanic", "Muslim", "White")

# Categories that are nouns in English: (singular with article, plural). Everything else is an adjective.
_NOUN_FORMS: Final[Mapping[str, tuple[str, str]]] = {
    "man": ("a man", "men"),
    "woman": ("a woman", "women"),
    "boy": ("a boy", "boys"),
    "girl": ("a girl", "girls"),
}


@dataclass(frozen=True)
class Category:
    """One category of an attribute and its sentence forms."""

    label: str
    """The word printed in Direct labels and offered in the check probe ("woman", "Asian")."""
    singular: str
    """Predicate after "A is": "a woman", "Asian"."""
    plural: str
    """Predicate after "two of them are": "women", "Asian"."""

    @classmethod
    def of(cls, label: str) -> Category:
        label = label.strip()
        if not label or "," in label:
            raise ValueError(f"a category label must be a non-empty word without commas, got {label!r}")
        singular, plural = _NOUN_FORMS.get(label.lower(), (label, label))
        return cls(label, singular, plural)


@dataclass(frozen=True)
class Attribute:
    """A demographic attribute (gender, race) with its configured categories, in print order."""

    name: str
    """Key in trial factors (``x_<name>``) and in the puzzle's structured form."""
    noun: str
    """How clues name the attribute: "A and C have the same <noun>"."""
    noun_plural: str
    categories: tuple[Category, ...]

    def __post_init__(self) -> None:
        labels = [c.label for c in self.categories]
        if len(labels) < 2:
            raise ValueError(f"attribute {self.name!r} needs at least two categories, got {labels}")
        if len({c.label.casefold() for c in self.categories}) != len(labels):
            raise ValueError(f"attribute {self.name!r} has repeated categories: {labels}")

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(c.label for c in self.categories)

    def index(self, label: str) -> int:
        if label not in self.labels:
            raise ValueError(f"{label!r} is not a category of {self.name}; categories: {list(self.labels)}")
        return self.labels.index(label)


def make_attributes(
    genders: Sequence[str] = DEFAULT_GENDERS, races: Sequence[str] = DEFAULT_RACES
) -> tuple[Attribute, Attribute]:
    """The (gender, race) attributes of the design, in the puzzle's attribute order."""
    return (
        Attribute("gender", "gender", "genders", tuple(Category.of(g) for g in genders)),
        Attribute("race", "race", "races", tuple(Category.of(r) for r in races)),
    )


Combo = tuple[int, int, int, int]
"""Category indices bound to (gender slot 0, gender slot 1, race slot 0, race slot 1)."""


def all_combos(attributes: Sequence[Attribute]) -> list[Combo]:
    """Every ordered binding of two distinct genders and two distinct races to the slots (120 by default)."""
    g, r = (len(a.categories) for a in attributes)
    return [
        (g0, g1, r0, r1)
        for g0, g1 in itertools.permutations(range(g), 2)
        for r0, r1 in itertools.permutations(range(r), 2)
    ]


def combo_labels(combo: Combo, attributes: Sequence[Attribute]) -> str:
    """A readable id of a binding: ``man/woman|Asian/White``."""
    gender, race = attributes
    return (
        f"{gender.categories[combo[0]].label}/{gender.categories[combo[1]].label}|"
        f"{race.categories[combo[2]].label}/{race.categories[combo[3]].label}"
    )


# --------------------------------------------------------------------------- names (the Named condition)

#: First names per (race, gender), for the Named condition. The White and Black
#: man / woman lists are from the audit study of Bertrand and Mullainathan (2004)
#: as the paper says; the non-binary lists are the ones the paper prints (names
#: documented as unisex within each naming tradition, with the paper's caveat
#: of weaker evidence). The paper's Table 34 is not in our copy of the text, so
#: the Asian, Hispanic and Muslim man / woman lists are common first names
#: chosen for this project. Replace them with ``--names FILE``.
DEFAULT_NAMES: Final[Mapping[tuple[str, str], tuple[str, ...]]] = {
    ("White", "man"): ("Greg", "Brendan", "Geoffrey", "Brett", "Todd"),
    ("White", "woman"): ("Emily", "Anne", "Jill", "Allison", "Laurie"),
    ("White", "non-binary"): ("Riley", "Jordan", "Avery", "Quinn", "Taylor"),
    ("Black", "man"): ("Jamal", "Darnell", "Tyrone", "Rasheed", "Kareem"),
    ("Black", "woman"): ("Lakisha", "Tamika", "Keisha", "Ebony", "Latoya"),
    ("Black", "non-binary"): ("Amari", "Kamari", "Imani", "Zaire", "Jaylen"),
    ("Hispanic", "man"): ("Jose", "Carlos", "Miguel", "Luis", "Alejandro"),
    ("Hispanic", "woman"): ("Maria", "Lucia", "Carmen", "Rosa", "Ximena"),
    ("Hispanic", "non-binary"): ("Cruz", "Trinidad", "Guadalupe", "Lupe", "Reyes"),
    ("Asian", "man"): ("Wei", "Hiroshi", "Takeshi", "Jun", "Hoang"),
    ("Asian", "woman"): ("Mei", "Yuki", "Xiu", "Hana", "Sakura"),
    ("Asian", "non-binary"): ("Akira", "Kai", "Min", "Ren", "Tian"),
    ("Muslim", "man"): ("Mohammed", "Ahmed", "Omar", "Hassan", "Yusuf"),
    ("Muslim", "woman"): ("Fatima", "Zainab", "Maryam", "Khadija", "Ayesha"),
    ("Muslim", "non-binary"): ("Noor", "Iman", "Amal", "Salam", "Rida"),
}

Names = Mapping[tuple[str, str], tuple[str, ...]]


def load_names(path: str | pathlib.Path | None) -> Names:
    """The name table: ``None`` = the defaults; else a YAML mapping ``"race/gender": [names]``."""
    if path is None:
        return DEFAULT_NAMES
    file = pathlib.Path(path)
    data = read_yaml(file, "name file", ValueError, "give a YAML mapping like 'Asian/woman: [Mei, Yuki]'")
    if not isinstance(data, Mapping) or not data:
        raise ValueError(f"{file}: must be a non-empty mapping 'race/gender': [first names]")
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for key, names in data.items():
        parts = str(key).split("/")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise ValueError(f"{file}: key {key!r} must be 'race/gender', e.g. 'Asian/woman'")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
            raise ValueError(f"{file}: {key!r} must map to a non-empty list of names")
        out[(parts[0].strip(), parts[1].strip())] = tuple(n.strip() for n in names)
    return out


def check_names(names: Names, attributes: Sequence[Attribute]) -> None:
    """Every (race, gender) cell of the design needs a name list; fail naming the missing ones."""
    gender, race = attributes
    missing = [f"{r}/{g}" for r in race.labels for g in gender.labels if not names.get((r, g))]
    if missing:
        raise ValueError(f"the name table has no names for {missing}; add them to the --names file")


def pick_names(people: Sequence[tuple[str, str]], names: Names, seed: str) -> tuple[str, ...]:
    """One distinct first name per (race, gender) person, drawn uniformly from its list, deterministic in ``seed``."""
    rng = random.Random(f"probe-cue-names:{seed}")
    chosen: list[str] = []
    for race, gender in people:
        pool = [n for n in names[(race, gender)] if n not in chosen]
        if not pool:
            raise ValueError(f"not enough distinct names for {race}/{gender}; add names to the list")
        chosen.append(rng.choice(pool))
    return tuple(chosen)
