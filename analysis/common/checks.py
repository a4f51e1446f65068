"""Checks that keep a report honest on a real, weak model: what the numbers rest on.

A readout normalizes over the options, so a model that puts 1% of its
answer-slot mass on them still yields clean-looking probabilities; a sampled
reply cut off by the token cap looks like a non-answer; a server that ignores
the temperature returns the same reply every draw. Each check here is a small
pure function on the run's tables, and :func:`checks_section` puts them in
every report (``analysis.report.write_report`` appends it to ``summary.md``).

Casing matters because tokenizers spell ``Yes`` and ``yes`` as different
tokens: ``--options yes,no`` scores tokens the model rarely writes at the
start of a reply, while its mass sits on ``Yes`` and ``No``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from experiments.battery import BatterySpec
from probe.record import Manifest

LOW_COVERAGE = 0.5
"""Option mass below which a readout is flagged: most of the model's answer lies elsewhere."""
MIN_IDENTICAL_TRIALS = 5
"""Sampled trials (with 2+ draws) needed before all-identical draws are called suspicious."""

Token = tuple[str, float]


# --------------------------------------------------------------------------- coverage


def casing_fixes(
    options: Sequence[str], top_other: Iterable[Token], option_mass: Mapping[str, float] | None = None
) -> dict[str, str]:
    """Options that the model writes in another casing among its most likely non-option tokens.

    Returns ``{option: the model's spelling}`` (``{"yes": "Yes"}``), the most
    likely spelling first wins. Leading spaces of tokens are ignored. With
    ``option_mass`` (each option's unnormalized probability), a spelling counts
    only where it holds more mass than the option itself.
    """
    fixes: dict[str, str] = {}
    lowered = {o.lower(): o for o in options}
    for token, p in top_other:
        word = token.strip()
        opt = lowered.get(word.lower())
        if opt is None or word == opt or opt in fixes or word in options:
            continue
        if option_mass is None or p > option_mass.get(opt, 0.0):
            fixes[opt] = word
    return fixes


def _tokens(top_other: Iterable[Token], k: int = 5) -> str:
    return ", ".join(f"{t!r} {p:.4f}" for t, p in list(top_other)[:k])


def coverage_warning(
    coverage: float,
    options: Sequence[str],
    top_other: Sequence[Token],
    option_mass: Mapping[str, float] | None = None,
    *,
    sep: str = ",",
) -> str:
    """The warning ``probe readout`` prints for one prompt ("" when the options hold the answer).

    Names the mass on the options, the non-option tokens that hold the rest,
    and a casing mismatch with the ``--options`` that fixes it.
    """
    fixes = casing_fixes(options, top_other, option_mass)
    if coverage >= LOW_COVERAGE and not fixes:
        return ""
    parts = [
        f"warning: the options hold {coverage:.1%} of the answer-slot mass (coverage {coverage:.4f}); "
        f"the most likely non-option tokens: {_tokens(top_other)}."
    ]
    if fixes:
        spelled = ", ".join(f"{w!r} where the options say {o!r}" for o, w in fixes.items())
        fixed = sep.join(fixes.get(o, o) for o in options)
        parts.append(f"The model writes {spelled}: pass --options {fixed}")
    else:
        parts.append(
            "The probabilities are normalized over the options, so they describe a small part of what the model "
            "would say: check that the prompt asks for exactly these options, or add --assistant-prefix."
        )
    return " ".join(parts)


def _top_other(cell: Any) -> list[Token]:
    if isinstance(cell, str):
        return [(str(t), float(p)) for t, p in json.loads(cell)]
    return [(str(t), float(p)) for t, p in (cell or [])]


@dataclass(frozen=True)
class RunCoverage:
    """Coverage over a run's readouts, and what holds the mass that misses the options."""

    n_trials: int
    """Readout trials of the run."""
    mean: float
    """Mean coverage over them: the answer-slot mass on the printed options (NaN without readouts)."""
    n_low: int
    """Trials with coverage below :data:`LOW_COVERAGE`."""
    off_tokens: tuple[Token, ...]
    """The non-option tokens with the most mass, summed over trials and divided by the number of trials."""
    casing: tuple[tuple[str, str, int], ...]
    """(option, the model's spelling, trials where it is among the top non-option tokens)."""

    def warning(self) -> str:
        """The warning ``probe run`` prints ("" when the options hold the answers)."""
        if self.n_trials == 0 or (self.n_low == 0 and not self.casing):
            return ""
        lines = [
            f"warning: {self.n_low} of {self.n_trials} readouts have option coverage below {LOW_COVERAGE:g} "
            f"(mean coverage {self.mean:.3f}); the mass off the options is mostly on {_tokens(self.off_tokens)} "
            "(mean per trial). Probabilities are normalized over the options, so those trials describe a small "
            "part of what the model would say."
        ]
        if self.casing:
            spelled = "; ".join(f"{w!r} for option {o!r} in {n} trials" for o, w, n in self.casing[:4])
            lines.append(
                f"The model writes the options in another casing ({spelled}): ask for the labels the model writes "
                "(e.g. 'Yes' rather than 'yes')."
            )
        return " ".join(lines)


def run_coverage(
    readout_trials: pd.DataFrame,
    options: Mapping[str, Sequence[str]],
    readout_options: pd.DataFrame | None = None,
    k: int = 5,
) -> RunCoverage:
    """:class:`RunCoverage` of a run's ``readout_trials`` table; ``options`` maps trial id -> printed options.

    With the ``readout_options`` table (unnormalized ``logprob`` per option), a casing mismatch counts only
    where the model's spelling holds more mass than the option.
    """
    if readout_trials.empty:
        return RunCoverage(0, float("nan"), 0, (), ())
    mass: dict[str, dict[str, float]] = {}
    if readout_options is not None and not readout_options.empty:
        for tid, opt, lp in zip(
            readout_options["trial_id"], readout_options["option"], readout_options["logprob"], strict=True
        ):
            mass.setdefault(tid, {})[opt] = math.exp(lp)
    off: dict[str, float] = {}
    casing: Counter[tuple[str, str]] = Counter()
    for tid, cell in zip(readout_trials["trial_id"], readout_trials["top_other"], strict=True):
        top = _top_other(cell)
        for t, p in top:
            off[t] = off.get(t, 0.0) + p
        for o, w in casing_fixes(options.get(tid, ()), top, mass.get(tid) if mass else None).items():
            casing[(o, w)] += 1
    n = len(readout_trials)
    cov = readout_trials["coverage"].astype(float)
    return RunCoverage(
        n_trials=n,
        mean=float(cov.mean()),
        n_low=int((cov < LOW_COVERAGE).sum()),
        off_tokens=tuple((t, m / n) for t, m in sorted(off.items(), key=lambda kv: -kv[1])[:k]),
        casing=tuple((o, w, c) for (o, w), c in casing.most_common()),
    )


def coverage_tables(per_trial: pd.DataFrame, group: str = "instrument") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per ``group``, per item x ``group``) coverage: mean, min, trials below :data:`LOW_COVERAGE`, trials.

    ``per_trial`` is a per-trial table with ``coverage`` and ``item_id`` (and
    ``group`` where the run has one; otherwise every trial is in ``all``).
    """
    df = per_trial.assign(**{group: per_trial.get(group, "all")})
    df = df.assign(low=df["coverage"] < LOW_COVERAGE)
    agg = {"mean": ("coverage", "mean"), "min": ("coverage", "min"), "n_low": ("low", "sum"), "n": ("coverage", "size")}
    return df.groupby(group).agg(**agg), df.groupby([group, "item_id"]).agg(**agg)  # type: ignore[call-overload]


# --------------------------------------------------------------------------- reasoning (think mode)
LOOP_WORDS = 8
"""A trace loops when some run of this many words recurs :data:`LOOP_REPEATS` times (docs/gpu.md, "Think mode")."""
LOOP_REPEATS = 3
BUDGET_WARNING = 0.1
"""Warn when more than this share of a cell's traces hit the budget: their slots were read after reasoning that was
cut off and closed by probe, not by the model (docs/gpu.md gives the reasoning behind the threshold)."""


def looped(text: str, words: int = LOOP_WORDS, repeats: int = LOOP_REPEATS) -> bool:
    """Whether some run of ``words`` consecutive words occurs ``repeats`` or more times in ``text``.

    Greedy decoding in thinking mode is known to loop (Qwen3's model card); a loop repeats whole phrases, which
    this counts, while ordinary reasoning rarely repeats eight words in a row three times.
    """
    toks = text.split()
    seen: Counter[tuple[str, ...]] = Counter(tuple(toks[i : i + words]) for i in range(len(toks) - words + 1))
    return any(n >= repeats for n in seen.values())


def reasoning_table(per_trial: pd.DataFrame, meta: pd.DataFrame, group: str = "instrument") -> pd.DataFrame:
    """Think-mode traces per ``group``: traces, hit the budget, looped, mean and max reasoning tokens (empty for a
    run without reasoning)."""
    if per_trial.empty or "reasoning_tokens" not in per_trial or not (per_trial["reasoning_tokens"] > 0).any():
        return pd.DataFrame(columns=["traces", "hit_budget", "looped", "mean_tokens", "max_tokens"])
    m = meta.set_index("trial_id")
    g = per_trial["trial_id"].map(m[group]) if group in m else pd.Series("all", index=per_trial.index)
    df = per_trial.assign(
        group=g.fillna("all").to_numpy(),
        hit=per_trial["hit_budget"].astype(bool),
        loop=per_trial["reasoning"].fillna("").map(looped),
    )
    out = df.groupby("group").agg(
        traces=("hit", "size"),
        hit_budget=("hit", "sum"),
        looped=("loop", "sum"),
        mean_tokens=("reasoning_tokens", "mean"),
        max_tokens=("reasoning_tokens", "max"),
    )
    out.index.name = group
    return out


def reasoning_lines(table: pd.DataFrame, budget: Any) -> list[str]:
    """The report's lines on think-mode traces: how many hit the budget and looped, per cell, and a warning."""
    if table.empty:
        return []
    cells = ", ".join(
        f"{g} {int(r['hit_budget'])} of {int(r['traces'])} hit the budget, {int(r['looped'])} looped"
        for g, r in table.iterrows()
    )
    lines = [f"- think-mode reasoning (budget {budget} tokens; per cell in `reasoning_by_instrument.csv`): {cells}"]
    over = [str(g) for g, r in table.iterrows() if r["hit_budget"] > BUDGET_WARNING * r["traces"]]
    if over:
        where = "" if over == ["all"] else f" in {', '.join(over)}"
        lines.append(
            f"- **warning:{where} more than {BUDGET_WARNING:.0%} of the traces hit the budget: those "
            "slots were read after reasoning that probe cut off and closed; raise --think-budget**"
        )
    return lines


# --------------------------------------------------------------------------- sampling


def truncation_table(replies: pd.DataFrame, meta: pd.DataFrame, group: str = "instrument") -> pd.DataFrame:
    """Replies that hit the token cap, per ``group``: replies, truncated, share.

    ``replies`` is a samples or generations table with a ``truncated`` column
    (runs made before it existed have none: an empty table is returned).
    """
    if replies.empty or "truncated" not in replies:
        return pd.DataFrame(columns=["replies", "truncated", "share"])
    m = meta.set_index("trial_id")
    g = replies["trial_id"].map(m[group]) if group in m else pd.Series("all", index=replies.index)
    t = replies.assign(group=g.fillna("all").to_numpy(), truncated=replies["truncated"].astype(bool))
    out = t.groupby("group").agg(replies=("truncated", "size"), truncated=("truncated", "sum"))
    out["share"] = out["truncated"] / out["replies"]
    out.index.name = group
    return out


@dataclass(frozen=True)
class Repeats:
    """How many sampled trials drew the same reply every time."""

    n_trials: int
    """Trials with two or more draws."""
    n_identical: int

    def suspicious(self, temperature: float) -> bool:
        """Every trial identical at a temperature above 0, over enough trials to rule out a confident model."""
        return temperature > 0 and self.n_trials >= MIN_IDENTICAL_TRIALS and self.n_identical == self.n_trials


def repeated_draws(samples: pd.DataFrame) -> Repeats:
    """Trials whose draws (2 or more) all returned the same text."""
    if samples.empty:
        return Repeats(0, 0)
    per = samples.groupby("trial_id")["text"].agg(["size", "nunique"])
    multi = per[per["size"] >= 2]
    return Repeats(len(multi), int((multi["nunique"] == 1).sum()))


NOT_SAMPLING = (
    "the server may not be sampling: every one of the {n} trials drew the same reply {k} times at temperature "
    "{t:g}. transformers serve samples only when the model's generation_config.json says do_sample: true (the "
    "request's temperature does not turn it on): serve the model with `probe serve MODEL`. vLLM and OpenAI sample at "
    "the request's temperature (vLLM also applies the model's own top_k / top_p unless the request overrides them)."
)


# --------------------------------------------------------------------------- the report section


def system_prompt_line(manifest: Manifest) -> str:
    """Which system prompt the trials without their own were rendered with (from the engine's manifest entry)."""
    sp = manifest.engine.system_prompt
    if sp is None:
        return "- system prompt: not recorded by this engine"
    if sp.get("text") is None:
        none = (
            "none (--system was not given)"
            if manifest.engine.frame == "plain"
            else ("none (the chat template adds none and --system was not given)")
        )
        return f"- system prompt: {sp.get('source') or none}"
    return f"- system prompt ({sp.get('source')}): {sp['text']!r}"


def frame_line(manifest: Manifest) -> str | None:
    """The report's line on the prompt frame, for a run read in the plain frame (None in the chat frame, the
    default before frames existed: those reports stay as they were)."""
    if manifest.engine.frame != "plain":
        return None
    why = (
        "the model has no chat template, so --frame auto fell back to it"
        if manifest.engine.frame_asked == "auto"
        else "--frame plain"
    )
    return (
        f"- prompt frame: plain ({why}): every prompt is Question:/Answer: text ending in 'Answer:', not the "
        "model's chat template (docs/methods.md); compare it with a chat-frame run only as a different prompt"
    )


def floor_line(floor: Mapping[str, Any] | None) -> str | None:
    """The report's line on the run's numeric floor (:mod:`probe.app.floor`; None for a run that recorded none)."""
    if not isinstance(floor, Mapping) or "max_logprob_diff" not in floor:
        return None
    return (
        f"- numeric floor ({floor.get('dtype')}): {int(floor['trials'])} trials {floor['how']} moved by at most "
        f"{float(floor['max_logprob_diff']):.2g} nats ({float(floor['max_prob_diff']):.2g} in probability; "
        f"{int(floor['greedy_flips'])} greedy option(s) flipped); differences between readouts below this mean nothing"
    )


def checks_section(
    manifest: Manifest,
    readout_trials: pd.DataFrame,
    meta: pd.DataFrame,
    samples: pd.DataFrame,
    generations: pd.DataFrame,
    options: Mapping[str, Sequence[str]],
    readout_options: pd.DataFrame | None = None,
) -> tuple[list[str], dict[str, pd.DataFrame]]:
    """The Markdown lines of the report's "What the numbers rest on" section, and its CSV tables by file stem."""
    lines = ["## What the numbers rest on", "", system_prompt_line(manifest)]
    if frame := frame_line(manifest):
        lines.append(frame)
    if floor := floor_line(manifest.numeric_floor):
        lines.append(floor)
    tables: dict[str, pd.DataFrame] = {}
    if not readout_trials.empty:
        per = readout_trials.merge(meta, on="trial_id", how="left")
        by_inst, by_item = coverage_tables(per)
        tables["coverage_by_instrument"], tables["coverage_by_item"] = by_inst, by_item
        cov = run_coverage(readout_trials, options, readout_options)
        lines += [
            f"- answer-slot coverage (option mass before normalization): mean {cov.mean:.3f}, "
            f"{cov.n_low} of {cov.n_trials} readouts below {LOW_COVERAGE:g}; per item: `coverage_by_item.csv`",
            "",
            "| instrument | mean | min | below | trials |",
            "|---|---|---|---|---|",
            *(
                f"| {g} | {r['mean']:.3f} | {r['min']:.3f} | {int(r['n_low'])} | {int(r['n'])} |"
                for g, r in by_inst.iterrows()
            ),
            "",
        ]
        if cov.warning():
            lines += [f"- {cov.warning().removeprefix('warning: ')}", ""]
        think = reasoning_table(readout_trials, meta)
        if not think.empty:
            tables["reasoning_by_instrument"] = think
            budget = manifest.engine.setting("think_budget", "?")
            lines += [*reasoning_lines(think, budget), ""]
    cap = manifest.engine.setting("max_new_tokens")
    reply_cap = (  # an experiment's own cap of free replies (the battery's --choice-tokens)
        manifest.spec_as(BatterySpec).choice_tokens if manifest.experiment == BatterySpec.experiment_name else cap
    )
    for name, replies, limit in (("sampled answers", samples, cap), ("generated replies", generations, reply_cap)):
        trunc = truncation_table(replies, meta)
        if len(trunc):
            tables[f"truncated_{name.split()[0]}"] = trunc
            lines.append(
                f"- {name} that hit the token cap{f' ({limit} tokens)' if limit else ''}: "
                + ", ".join(f"{g} {int(r['truncated'])} of {int(r['replies'])}" for g, r in trunc.iterrows())
                + ("; a cut-off reply may never state its answer" if trunc["truncated"].any() else "")
            )
    rep = repeated_draws(samples)
    temp = float(manifest.plan.temperature if manifest.plan else 0)  # no plan: nothing was sampled
    if rep.n_trials:
        k = int(samples.groupby("trial_id").size().max())
        if rep.suspicious(temp):
            lines.append(f"- **{NOT_SAMPLING.format(n=rep.n_trials, k=k, t=temp)}**")
        else:
            lines.append(f"- sampled trials with identical draws: {rep.n_identical} of {rep.n_trials}")
    has_text = {"trial_id", "text", "option", "status"} <= set(samples.columns)
    parsed = samples[samples["trial_id"].isin(options)] if has_text else samples.iloc[0:0]
    if not parsed.empty:  # every sampled report: which parse rule decided each answer (issue 27 F)
        from analysis.battery.calibration import rule_count_line

        inst = meta["instrument"] if "instrument" in meta.columns else pd.Series("all", index=meta.index)
        groups = {str(t): "other" if pd.isna(g) else str(g) for t, g in zip(meta["trial_id"], inst, strict=True)}
        lines.append(rule_count_line(parsed, options, groups, think=manifest.think))
    return [*lines, ""], tables
