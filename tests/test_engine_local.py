"""What the local engines and readouts through a server share (engines/local.py), checked without a model."""

from __future__ import annotations

from engines.local import with_stop

END = 7  # the </think> id


def test_the_think_end_a_reply_stopped_at_is_kept_or_restored_once():
    """vLLM keeps the stop token among the ids; where a version or a server left it out, ``stop_reason`` restores
    it, and nothing else is appended."""
    assert with_stop([1, 2, END], END, END) == [1, 2, END]  # kept: not doubled
    assert with_stop([1, 2], END, END) == [1, 2, END]  # left out: restored
    assert with_stop([], END, END) == [END]
    assert with_stop([1, 2], 3, END) == [1, 2]  # stopped at another id (end of turn): nothing added
    assert with_stop((1, 2), None, END) == [1, 2]  # ran out of budget
