"""``probe show RUN TRIAL_ID`` and ``probe show RUN --item X --where instrument=binary``: trials in the terminal.

The same view as a trial page of ``probe view`` (:mod:`probe.app.trialview`),
for a shell on a cluster login node: the exact prompt, the options with
probability, log probability and token ids, coverage and the most likely
non-option tokens, the sampled replies with parse status and truncation, the
verdicts, and the reasoning in think mode.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from probe.app.prompts import Renderer
from probe.app.trialview import format_trial, trial_view
from probe.app.verbs import add_verb
from probe.query import FilterError, RunQuery, TrialFilter
from probe.runs import open_run
from probe.store import json_ready
from probe.terminal import escape_controls, escape_controls_json

#: The epilog of ``probe show --help``: examples and the ``--where`` keys.
EXAMPLES = """examples:
  probe show runs/battery-smol 8c2f0e1d9a7b3c45
  probe show runs/battery-smol --item pond_child --where instrument=binary --where order=yes_first
  probe show runs/x --where coverage_below=0.5 --limit 3
--where keys: a factor name, option (the greedy option), status (a sampled reply's parse status), \
coverage_below, disagree=1 (greedy differs from the sampled majority), chunk (verified/damaged/missing)"""


def where_pairs(where: Sequence[str]) -> list[tuple[str, str]]:
    """``["instrument=binary", ...]`` as (key, value) pairs; FilterError naming a malformed one."""
    out = []
    for w in where:
        key, sep, value = w.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise FilterError(f"--where needs KEY=VALUE (e.g. instrument=binary or coverage_below=0.5), got {w!r}")
        out.append((key.strip(), value.strip()))
    return out


def show(
    run_path: str,
    trial_ids: Sequence[str] = (),
    *,
    items: Sequence[str] = (),
    where: Sequence[str] = (),
    limit: int = 5,
    as_json: bool = False,
    out: Callable[[str], None] = print,
) -> int:
    """Print the trials asked for; returns the exit status (0, or 1 when a filter selects none).

    Everything printed is untrusted text (replies, prompts, file names): control characters are shown escaped
    (:func:`probe.terminal.escape_controls`), and ``--json`` writes strict JSON with DEL and C1 as ``\\u00HH``.
    """

    def say(text: str) -> None:
        out(escape_controls(text))

    run = open_run(run_path, allow_partial=True)
    renderer = Renderer(run.manifest)
    ids = list(trial_ids)
    if not ids:
        flt = TrialFilter.parse([*(("item", i) for i in items), *where_pairs(where)])
        page = RunQuery(run).page(flt, 0, limit)
        if page.total == 0:
            say(f"no trial of {run.root} matches {_describe(flt)}")
            return 1
        ids = list(page.rows["trial_id"])
        if not as_json:
            more = f" (the first {len(ids)}; --limit N for more)" if page.total > len(ids) else ""
            say(f"{page.total} trial(s) of {run.root} match {_describe(flt)}{more}\n")
    views = []
    for tid in ids:
        try:
            views.append(trial_view(run, tid, renderer))
        except KeyError:
            raise FilterError(
                f"run {run.root} has no trial {tid!r}; list some with `probe show {run.root} --item ITEM`"
            ) from None
    if as_json:
        doc = json_ready(views if len(views) > 1 or not trial_ids else views[0])
        out(escape_controls_json(json.dumps(doc, ensure_ascii=False, indent=1, allow_nan=False)))
    else:
        say(("\n" + "=" * 72 + "\n\n").join(format_trial(v) for v in views).rstrip("\n"))
    return 0


def _describe(flt: TrialFilter) -> str:
    pairs = flt.pairs()
    return " and ".join(f"{k}={v}" for k, v in pairs) if pairs else "(no filter)"


def cmd_show(a: argparse.Namespace) -> int:
    """print trials of a run in the terminal: exact prompt, option probabilities, replies, verdicts

    Print one or more trials of RUN as `probe view` shows them: by id, or the first --limit trials that --item and
    --where select.
    """
    return show(a.run, a.trial_ids, items=a.item or (), where=a.where or (), limit=a.limit, as_json=a.json)


def register(sub: Any) -> None:
    s = add_verb(sub, "show", cmd_show, epilog=EXAMPLES)
    s.add_argument("run", help="run folder")
    s.add_argument("trial_ids", nargs="*", help="trial ids (default: the trials --item / --where select)")
    s.add_argument("--item", action="append", help="an item id (repeatable: any of them)")
    s.add_argument(
        "--where", action="append", metavar="KEY=VALUE", help="a filter, e.g. instrument=binary (repeatable)"
    )
    s.add_argument("--limit", type=int, default=5, help="trials to print when selecting by filter (default: 5)")
    s.add_argument("--json", action="store_true", help="the trial view as JSON (what `probe view` serves)")
