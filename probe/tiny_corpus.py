"""Synthetic chat corpus for the tiny test models built by :mod:`probe.tiny`.

The corpus teaches *format*, not meaning: a made-up one-line story, a
question about it, and an instruction naming the allowed answers ("Answer
with Yes or No.", "Answer with A or B.", "Answer with a number only.").
The gold answer is drawn at random from the offered labels, so a model
trained on it learns to put its mass on whatever labels the prompt offers,
which is exactly the behaviour the probe engine needs to exercise (answer
slot detection, label coverage, parsing) without a real model download.

Everything is driven by an explicit ``random.Random(seed)`` so the same seed
gives the same samples on every machine and Python version.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Kind = Literal["yesno", "choice", "option", "rating"]

# fmt: off
NAMES: tuple[str, ...] = (
    "Mara", "Tom", "Ines", "Omar", "Lena", "Jonas", "Priya", "Felix", "Aiko", "Ruth",
    "Diego", "Nora", "Samir", "Clara", "Ben", "Yusuf", "Hanna", "Leo", "Zoe", "Ivan",
)
OBJECTS: tuple[str, ...] = (
    "key", "letter", "lamp", "coin", "map", "basket", "book", "kite", "ring", "cup",
    "violin", "hat", "ladder", "bottle", "clock", "shell", "scarf", "bicycle",
)
COLORS: tuple[str, ...] = ("red", "blue", "green", "yellow", "black", "white", "silver", "brown")
PLACES: tuple[str, ...] = (
    "the old mill", "the market", "the river", "the school", "the harbor", "the garden",
    "the station", "the library", "the bakery", "the forest", "the hill", "the museum",
)
FOUND_VERBS: tuple[str, ...] = ("found", "lost", "bought", "painted", "fixed", "borrowed", "hid", "sold")
# fmt: on
THEN_CLAUSES: tuple[str, ...] = (
    "gave it to a friend",
    "kept it at home",
    "showed it to the teacher",
    "left it on a bench",
    "took it to {place}",
    "wrapped it in paper",
    "forgot about it",
    "told nobody",
)
YESNO_QUESTIONS: tuple[str, ...] = (
    "Did {name} keep the {obj}?",
    "Was the {obj} {color}?",
    "Did {name} go to {place}?",
    "Is {name} happy about the {obj}?",
    "Would {name} do it again?",
    "Was it a good day for {name}?",
)
CHOICE_QUESTIONS: tuple[str, ...] = (
    "Where did {name} go next?",
    "What did {name} do with the {obj}?",
    "Which is more likely?",
    "What happened after that?",
)
OPTIONS: tuple[str, ...] = (
    "{name} went home",
    "{name} went to {place}",
    "{name} called a friend",
    "{name} kept the {obj}",
    "{name} sold the {obj}",
    "{name} fell asleep",
    "{name} cleaned the {obj}",
    "{name} wrote a letter",
)
RATING_ADJECTIVES: tuple[str, ...] = ("happy", "calm", "surprised", "tired", "proud", "worried", "lucky")
RATING_SUBJECTS: tuple[str, ...] = ("{name}", "{name}'s day", "the story", "the {obj}")

#: Yes/no label pairs in the order printed in the instruction.
#: Capitalized pairs dominate (4:1) so that the model follows the printed case;
#: with equal weights its mass splits between "Yes" and "yes" on long prompts.
YESNO_PAIRS: tuple[tuple[str, str], ...] = (
    *((("Yes", "No"), ("No", "Yes")) * 4),
    ("yes", "no"),
    ("no", "yes"),
)
#: Letter/number/symbol label pairs for two-way choices.
CHOICE_PAIRS: tuple[tuple[str, str], ...] = (
    ("A", "B"),
    ("B", "A"),
    ("1", "2"),
    ("2", "1"),
    ("X", "Y"),
    ("Y", "X"),
)
#: Inclusive rating scales.
SCALES: tuple[tuple[int, int], ...] = ((0, 10), (0, 100), (1, 7))

PAIR_INSTRUCTIONS: tuple[str, ...] = (
    "Answer with {a} or {b}.",
    "Answer with {a} or {b} only.",
    "Reply with {a} or {b}.",
    "Respond with only {a} or {b}.",
)
RATING_INSTRUCTIONS: tuple[str, ...] = (
    "Answer with a number only.",
    "Reply with a single number.",
    "Answer with a number from {lo} to {hi} only.",
)
THINK_SENTENCES: tuple[str, ...] = (
    "The story is short, so I will pick one answer.",
    "{name} and the {obj} are the key facts here.",
    "It mentions {place}, which helps a little.",
    "I should answer in the requested format.",
    "The {obj} matters most in this story.",
)

#: The layout of the influence audit's choices (``Option A: ...`` lines, a sentence that leans one way, then the
#: instruction), which the plain ``choice`` layout does not teach. The nudges carry no signal: the gold is random.
OPTION_NUDGES: tuple[str, ...] = (
    "It would make me really happy if you picked {x}.",
    "Most people I asked chose {x}.",
    "My teacher says {x} is the better choice.",
    "Please think about {name} before you answer.",
    "I would be disappointed if you chose {x}.",
)
#: System prompts some samples carry (the audit's instruments send one).
SYSTEM_PROMPTS: tuple[str, ...] = ("You are a helpful assistant.", "Answer the user's question.")

GENERIC_SENTENCES: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "A language model assigns probabilities to the next token in a sequence.",
    "Please read the following passage carefully before answering the question.",
    "Numbers like 3, 14, 159 and 2026 are written digit by digit.",
    "She opened the window, and the cold morning air filled the room.",
    "What is the capital of France? Paris is the capital of France.",
    "Scientists measured the temperature every hour for three weeks.",
    "If you are not sure, say that you do not know.",
    "The meeting was moved from Tuesday to Thursday afternoon.",
    "He counted the apples: one, two, three, four, five, six, seven.",
    "Rate the following statement on a scale from 1 to 5.",
    "Which of the following options is correct? Choose one.",
    "Strongly agree, agree, neutral, disagree, strongly disagree.",
    "The committee approved the proposal after a long discussion.",
    "Water boils at 100 degrees Celsius at sea level.",
    "They walked along the beach, collecting stones and shells.",
    "Every answer must be exactly one word, without punctuation.",
    "The results were surprising, but the method was sound.",
    "I think, therefore I am. Cogito, ergo sum.",
    "Children were playing football in the park near the station.",
    "The price increased by 25 percent over the last year.",
    "True or false: the sun rises in the west.",
    "Don't forget to bring your umbrella; it's going to rain.",
    "We'll see whether they've finished what they'd started.",
    "Café, naïve, jalapeño and résumé contain accented letters.",
    "Email: someone@example.com, phone: +1 555 0100.",
    "def add(a, b):\n    return a + b\n",
    "Question: Is the statement true?\nAnswer: Yes",
    "Option A is cheaper, while option B is faster.",
    "The doctor asked how the patient had been sleeping recently.",
    "Mountains, rivers, forests and deserts cover the continent.",
    "Our survey asked people how often they read the news.",
    "Please respond in English and keep your answer brief.",
    "The train leaves at 7:45 and arrives at 10:30.",
    "Happiness, trust, fairness and safety were the main themes.",
    "A small village lay quietly between two green hills.",
)


@dataclass(frozen=True)
class Sample:
    """One synthetic exchange: a user prompt and the assistant's reply.

    ``labels`` are the answers the prompt offers, in printed order (for
    ratings: every integer on the scale, as strings). ``think`` is the
    one-sentence reasoning shown inside ``<think>`` when the sample is
    rendered with thinking enabled, or ``None`` for a no-think sample.
    """

    kind: Kind
    user: str
    answer: str
    labels: tuple[str, ...]
    think: str | None
    system: str | None = None

    @property
    def assistant_content(self) -> str:
        """The assistant message as Qwen3 stores it (think block inline)."""
        if self.think is None:
            return self.answer
        return f"<think>\n{self.think}\n</think>\n\n{self.answer}"


def _slots(rng: random.Random) -> dict[str, str]:
    """Draw the content words shared by the story, question and options."""
    return {
        "name": rng.choice(NAMES),
        "obj": rng.choice(OBJECTS),
        "color": rng.choice(COLORS),
        "place": rng.choice(PLACES),
    }


FILLER_SENTENCES: tuple[str, ...] = (
    "You are standing near {place} when it happens.",
    "Nobody else is around, and there is very little time to decide.",
    "The {obj} belongs to a neighbour who is away for the week.",
    "If you act, one person will be hurt, but several others will be safe.",
    "{name} looks at you and waits for your decision.",
    "The weather is cold and the light is fading quickly.",
    "Everyone involved knows the rules, but the rules do not cover this case.",
    "You have promised to keep the matter private.",
    "Doing nothing means that the situation will go on as before.",
    "The choice is yours alone, and you cannot ask anyone for advice.",
    "A small crowd has gathered at {place}, talking quietly.",
    "It would cost you a great deal of money, but it would help a stranger.",
)


def _story(rng: random.Random, slots: dict[str, str]) -> str:
    """A made-up story of one to ten sentences; the content is irrelevant to the label.

    The length varies up to about the length of a moral-dilemma vignette
    (150 words), so that the answer-slot format survives long prompts.
    """
    then = rng.choice(THEN_CLAUSES).format(**slots)
    verb = rng.choice(FOUND_VERBS)
    first = f"{slots['name']} {verb} a {slots['color']} {slots['obj']} near {slots['place']} and {then}."
    extra = [rng.choice(FILLER_SENTENCES).format(**slots) for _ in range(rng.choice((0, 0, 1, 2, 4, 6, 9)))]
    return " ".join([first, *extra])


def _yesno(rng: random.Random, slots: dict[str, str], story: str) -> tuple[str, tuple[str, ...]]:
    a, b = rng.choice(YESNO_PAIRS)
    question = rng.choice(YESNO_QUESTIONS).format(**slots)
    instruction = rng.choice(PAIR_INSTRUCTIONS).format(a=a, b=b)
    sep = rng.choice(("\n", "\n\n"))
    return f"{story}{sep}{question} {instruction}", (a, b)


def _choice(rng: random.Random, slots: dict[str, str], story: str) -> tuple[str, tuple[str, ...]]:
    a, b = rng.choice(CHOICE_PAIRS)
    first, second = (s.format(**slots) for s in rng.sample(OPTIONS, 2))
    question = rng.choice(CHOICE_QUESTIONS).format(**slots)
    instruction = rng.choice(PAIR_INSTRUCTIONS).format(a=a, b=b)
    # Options are listed in label order (A before B) even when the
    # instruction names them the other way round, as real surveys do.
    lo, hi = sorted((a, b))
    return f"{story}\n{question}\n{lo}. {first}\n{hi}. {second}\n{instruction}", (a, b)


def _option(rng: random.Random, slots: dict[str, str], story: str) -> tuple[str, tuple[str, ...]]:
    """The audit's layout: a question, ``Option A: ...`` lines, sometimes a nudge toward one, the instruction."""
    a, b = rng.choice(CHOICE_PAIRS[:2])
    first, second = (s.format(**slots) for s in rng.sample(OPTIONS, 2))
    question = rng.choice(CHOICE_QUESTIONS).format(**slots)
    lines = f"Option A: {first}.\nOption B: {second}."
    nudge = rng.choice(OPTION_NUDGES).format(x=rng.choice(("A", "B")), **slots) if rng.random() < 0.6 else ""
    instruction = rng.choice(PAIR_INSTRUCTIONS).format(a=a, b=b)
    body = "\n\n".join(part for part in (f"{story} {question}", lines, nudge, instruction) if part)
    return body, (a, b)


def _rating(rng: random.Random, slots: dict[str, str], story: str) -> tuple[str, tuple[str, ...]]:
    lo, hi = rng.choice(SCALES)
    adjective = rng.choice(RATING_ADJECTIVES)
    subject = rng.choice(RATING_SUBJECTS).format(**slots)
    instruction = rng.choice(RATING_INSTRUCTIONS).format(lo=lo, hi=hi)
    question = f"On a scale from {lo} to {hi}, how {adjective} is {subject}? {instruction}"
    sep = rng.choice(("\n", "\n\n"))
    return f"{story}{sep}{question}", tuple(str(v) for v in range(lo, hi + 1))


_MAKERS = {"yesno": _yesno, "choice": _choice, "option": _option, "rating": _rating}
_KIND_WEIGHTS: tuple[tuple[Kind, float], ...] = (("yesno", 0.34), ("choice", 0.24), ("option", 0.18), ("rating", 0.24))


def make_sample(rng: random.Random, kind: Kind | None = None, think_rate: float = 0.3) -> Sample:
    """Draw one sample; ``kind`` forces the question type (else weighted draw)."""
    if kind is None:
        kinds, weights = zip(*_KIND_WEIGHTS, strict=True)
        kind = rng.choices(kinds, weights=weights)[0]
    slots = _slots(rng)
    user, labels = _MAKERS[kind](rng, slots, _story(rng, slots))
    answer = rng.choice(labels)
    think = rng.choice(THINK_SENTENCES).format(**slots) if rng.random() < think_rate else None
    # the audit's instruments send a system prompt; some other samples carry one too, so none depends on it
    system = rng.choice(SYSTEM_PROMPTS) if rng.random() < (0.7 if kind == "option" else 0.15) else None
    return Sample(kind=kind, user=user, answer=answer, labels=labels, think=think, system=system)


def make_samples(n: int, seed: int, kind: Kind | None = None, think_rate: float = 0.3) -> list[Sample]:
    """``n`` samples from a private RNG seeded with ``seed`` (reproducible)."""
    rng = random.Random(seed)
    return [make_sample(rng, kind, think_rate) for _ in range(n)]
