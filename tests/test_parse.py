"""probe.parse: the answer parser's rules, in their documented order."""

from __future__ import annotations

import pytest

from probe.parse import parse_answer, split_reasoning

YN = ["Yes", "No"]
AB = ["A", "B"]


def _check(text: str, options, option, status, rule, *, think: bool = False) -> None:
    got = parse_answer(text, options, think=think)
    assert (got.option, got.status, got.rule) == (option, status, rule), text


# ---------------------------------------------------------------- rule 1: exact label


@pytest.mark.parametrize(
    ("text", "option"),
    [
        ("Yes", "Yes"),
        ("**Yes.**", "Yes"),
        ("  No!\n", "No"),
        ('"No"', "No"),
        ("`Yes`", "Yes"),
        ("(No).", "No"),
        ("yes", "Yes"),  # case folded: options differ otherwise
        ("NO", "No"),
    ],
)
def test_exact_label(text: str, option: str) -> None:
    _check(text, YN, option, "ok", "exact")


def test_exact_returns_the_option_spelling() -> None:
    assert parse_answer("b", AB, think=False).option == "B"


# ---------------------------------------------------------------- rule 2: stated format


@pytest.mark.parametrize(
    ("text", "option"),
    [
        ("Reasoning about the case...\nAnswer: B", "B"),
        ("Some thoughts.\n**Answer:** A", "A"),
        ("Some thoughts.\n**Answer**: A", "A"),
        ("Weighing it up.\nFinal answer: **B**", "B"),
        ("Thinking.\nANSWER: b.", "B"),
        ("Answer: A\nOn reflection...\nAnswer: B", "B"),  # the last such line counts
    ],
)
def test_stated_format(text: str, option: str) -> None:
    _check(text, AB, option, "ok", "stated")


def test_stated_beats_refusal_and_standalone() -> None:
    # a refusal phrase and both labels occur, but the stated line decides
    _check("I can't be certain; A or B both have merit.\nAnswer: B", AB, "B", "ok", "stated")


def test_stated_non_option_falls_through_to_later_rules() -> None:
    # the last Answer: line names no option, so rule 4 finds the single standalone label
    _check("I lean towards B here.\nAnswer: C", AB, "B", "ok", "standalone")


# ---------------------------------------------------------------- rule 3: refusal


@pytest.mark.parametrize(
    "text",
    [
        "I can't help with that.",
        "I cannot answer this question.",
        "I won't choose between these.",
        "I must decline to answer.",
        "As an AI, I do not have moral opinions.",
        "It would not be appropriate for me to pick.",
        # other phrasings, a yes / no named inside the refusal
        "It's not appropriate for me to say yes.",
        "It would not be appropriate for me to say yes",
        "I’m unable to say no",
    ],
)
def test_refusal(text: str) -> None:
    _check(text, YN, None, "refusal", "refusal")


def test_refusal_checked_before_standalone() -> None:
    _check("I can't say yes to this", YN, None, "refusal", "refusal")


@pytest.mark.parametrize("text", ["I'm unable to say yes to this.", "I'm not able to say yes to this."])
def test_refusal_contracted_im(text: str) -> None:
    _check(text, YN, None, "refusal", "refusal")


def test_refusal_typographic_apostrophe() -> None:
    _check("I can’t say yes to this.", YN, None, "refusal", "refusal")


# ---------------------------------------------------------------- rule 4: single standalone label


@pytest.mark.parametrize(
    ("text", "option"),
    [
        ("I think the answer is no, definitely", "No"),
        ("My verdict: yes. It saves more lives.", "Yes"),
    ],
)
def test_single_standalone(text: str, option: str) -> None:
    _check(text, YN, option, "ok", "standalone")


def test_standalone_needs_word_boundaries() -> None:
    # "Nothing", "yesterday" and "Noah" contain the labels only inside words
    _check("Nothing happened yesterday to Noah.", YN, None, "invalid", "none")


# ---------------------------------------------------------------- rule 5: invalid


@pytest.mark.parametrize("text", ["yes or no?", "", "   \n ", "Maybe.", "Yes. No. Yes."])
def test_invalid(text: str) -> None:
    _check(text, YN, None, "invalid", "none")


# ---------------------------------------------------------------- think blocks


def test_think_block_is_stripped_before_parsing() -> None:
    _check("<think>yes yes</think>\n\nNo", YN, "No", "ok", "exact")


def test_template_opened_think_only_closed_by_model() -> None:
    _check("Yes seems right... or not.</think>\nNo", YN, "No", "ok", "exact", think=True)


STRAY = " pick one answer.\n</think>\n\nNo"
"""A reply of the tiny model outside think mode (issue 38): its template already closed an empty think block."""


def test_a_stray_close_outside_think_mode_is_not_an_answer_at_the_slot() -> None:
    """Outside think mode a ``</think>`` with no ``<think>`` is a token of the answer: the reply's first sentence is
    "pick one answer.", so rule 1 (exact, the slot) fails and rule 4 (standalone) takes it; in think mode the same
    text is reasoning, then the answer "No" (exact)."""
    assert split_reasoning(STRAY, think=False) == ("", STRAY.strip())
    assert split_reasoning(STRAY, think=True) == ("pick one answer.", "No")
    for forced in (False, True):
        off = parse_answer(STRAY, YN, think=False, forced=forced)
        assert (off.option, off.status, off.rule) == ("No", "ok", "standalone")
        on = parse_answer(STRAY, YN, think=True, forced=forced)
        assert (on.option, on.status, on.rule) == ("No", "ok", "exact")
    # both labels around the stray close: no single standalone label, so invalid outside think mode
    assert parse_answer("Yes, I think.\n</think>\n\nNo", YN, think=False).rule == "none"
    assert parse_answer("Yes, I think.\n</think>\n\nNo", YN, think=True).rule == "exact"
    # an answer before the stray close is at the slot in either mode: the slot is the reply's first tokens
    assert parse_answer("No\n</think>\n\nYes", YN, think=False, forced=True).rule == "exact"
    # a whole think block is reasoning in either mode
    assert parse_answer("<think>yes</think>No", YN, think=False).rule == "exact"


def test_parsed_sample_parses_in_the_run_mode() -> None:
    from probe.parse import parsed_sample
    from probe.types import Message, Trial

    ask = (Message("user", "Yes or No?"),)
    trial = Trial(trial_id="t", experiment="x", item_id="i", factors={}, messages=ask, options=("Yes", "No"),
                  meaning=("cbr", "anti"))  # fmt: skip
    off = parsed_sample(trial, 0, STRAY, 1, 1, think=False, stop_at_answer=True)
    on = parsed_sample(trial, 0, STRAY, 1, 1, think=True, stop_at_answer=True)
    assert (off.option, off.reasoning) == ("No", "")
    assert (on.option, on.reasoning) == ("No", "pick one answer.")


def test_unclosed_think_is_invalid() -> None:
    _check("<think>I am leaning towards yes", YN, None, "invalid", "none")


def test_split_reasoning_cases() -> None:
    for think in (False, True):
        assert split_reasoning("<think> weigh it </think>\n\n Yes ", think=think) == ("weigh it", "Yes")
        assert split_reasoning("pre <think>r</think> post", think=think) == ("r", "pre  post")
        assert split_reasoning("<think>never closed", think=think) == ("never closed", "")
        assert split_reasoning("  plain answer \n", think=think) == ("", "plain answer")
    assert split_reasoning("only closed</think>  No", think=True) == ("only closed", "No")
    assert split_reasoning("only closed</think>  No", think=False) == ("", "only closed</think>  No")


# ---------------------------------------------------------------- case folding and symbol labels


@pytest.mark.parametrize(
    ("text", "option", "rule"),
    [
        ("A", "A", "exact"),
        ("a", "a", "exact"),
        ("**a.**", "a", "exact"),
        ("Reasoning.\nAnswer: A", "A", "stated"),
        ("Reasoning.\nAnswer: a", "a", "stated"),
        ("My pick is a, clearly.", "a", "standalone"),
        ("My pick is A, clearly.", "A", "standalone"),
    ],
)
def test_no_case_folding_when_options_differ_only_by_case(text: str, option: str, rule: str) -> None:
    _check(text, ["A", "a"], option, "ok", rule)


@pytest.mark.parametrize(
    ("text", "options", "option", "rule"),
    [
        ("✓", ["✓", "✗"], "✓", "exact"),
        ("**✗**", ["✓", "✗"], "✗", "exact"),
        ("I would mark it ✗ because of the harm.", ["✓", "✗"], "✗", "standalone"),
        ("+", ["+", "-"], "+", "exact"),
        ("-", ["+", "-"], "-", "exact"),
        ("Considering it.\nAnswer: -", ["+", "-"], "-", "stated"),
        ("A well-meant + from me.", ["+", "-"], "+", "standalone"),  # the hyphen in a word is no label
    ],
)
def test_symbol_labels(text: str, options, option: str, rule: str) -> None:
    _check(text, options, option, "ok", rule)


def test_symbol_labels_ambiguous() -> None:
    _check("Either ✓ or ✗.", ["✓", "✗"], None, "invalid", "none")


# ---------------------------------------------------------------- forced answers end at the answer


@pytest.mark.parametrize(
    ("reply", "end", "still_open"),
    [
        ("", None, True),
        ("N", None, True),  # may still become "No"
        ("No", None, True),  # a mark may still follow
        ("No.", None, True),  # "." is a mark only once white space follows
        ("No. The man", 3, False),
        ("**No**, because", 7, False),
        ("No\n\nBecause", 3, False),
        ("  Yes!\nmore", 6, False),
        ("Nope, never", None, False),  # the first sentence is no option and no start of one
        ("The answer is No. Really", None, False),
        ("Yes and no", None, False),
    ],
)
def test_answer_scan(reply: str, end, still_open: bool) -> None:
    from probe.parse import answer_scan

    assert answer_scan(reply, YN) == (end, still_open)


def test_answer_scan_longer_options_and_numbers() -> None:
    from probe.parse import answer_scan

    course = ["wait", "wait, then act"]
    assert answer_scan("wait, then", course) == (None, True)  # the comma is inside the longer option
    assert answer_scan("wait, then act. Because", course) == (15, False)
    assert answer_scan("I do. Sure", ["I do", "I do not"]) == (5, False)
    assert answer_scan("I do not. Sure", ["I do", "I do not"]) == (9, False)
    scale = [str(v) for v in range(11)]
    assert answer_scan("7.5 out of 10", scale) == (None, False)  # "7.5" is no option: parsed whole
    assert answer_scan("7. It is", scale) == (2, False)
    assert answer_scan("1", scale) == (None, True)  # may become 10


@pytest.mark.parametrize(
    ("text", "option", "status"),
    [
        ("No. But yes, on reflection.", "No", "ok"),  # whole: both labels -> invalid
        ("Yes. No. Yes.", "Yes", "ok"),  # whole: invalid (rule 5)
        ("<think>No. Let me see.</think>Yes. Because", "Yes", "ok"),  # the cut is in the answer, not the reasoning
        ("The answer is no, and yes.", None, "invalid"),  # no leading option: parsed whole
    ],
)
def test_forced_parse_reads_the_answer_up_to_its_end(text: str, option, status) -> None:
    got = parse_answer(text, YN, think=False, forced=True)
    assert (got.option, got.status) == (option, status)
    if "But" in text or text.startswith("Yes. No"):
        assert parse_answer(text, YN, think=False).status == "invalid"  # the unforced rules read the whole reply
