"""The follow-up self-report probe (paper 000, Section 4.3 and Appendix P).

After an influence run, chosen trials are asked a second turn: the original
conversation, the model's **own first answer kept**, and one more user message
asking whether anything in the prompt tried to influence the choice and
whether it did. The reply is free text, stored with the trial (the run's
``generations``); a judge codes it later (``probe code RUN --task followup``)
and :mod:`analysis.influence.followup` crosses the codes with the cell the source trial
came from (significant backfire, significant compliance, ...).

Which trials: the source run's conditions are measured and tested exactly as its report does
(:func:`experiments.influence.effects.run_conditions`, :func:`experiments.influence.effects.with_fdr`,
:func:`experiments.influence.effects.effects`, as :func:`analysis.influence.audit.analyze` calls them), and
every effect (condition x cue direction, main cues by default) gets a class:

==============  ==============================================================
``backfire``    significant shift (raw p, or BH q with ``--significance bh``)
                *against* the cue: s(d) < 0
``compliance``  significant shift toward the cue
``no_effect``   cued, no significant shift
``baseline``    not an effect: the no-cue trials, one cell per pair (does the
                model claim an influence when there was none?)
==============  ==============================================================

From each chosen cell a fixed-seed sample of ``--per-cell`` first answers is
drawn, uniformly over the cell's (trial, draw) answers (items, printed orders
and draws), and each becomes one follow-up trial.

What "the first answer" is:

* a **sampled** source (``samples`` table): that draw's reply, exactly: its
  text as stored, and the token ids the engine generated (``token_ids``),
  which the local engines put back unchanged (:func:`engines.render.kept_parts`).
  Only parsed answers (status ``ok``) are used: a refusal made no choice to ask about.
* a **readout-only** source: the greedy option, after the trial's assistant
  prefix (``Answer: A``), and in think mode after the model's reasoning
  (``<think>\\n...\\n</think>\\n\\n``): what the model would most likely have
  written. Its ids are not stored, so the text is encoded (exact for the
  option when it starts a pre-token, as in the shipped designs; the reasoning
  text was stripped of surrounding whitespace when it was stored).

The follow-up must be asked of the same model, in the same think mode and
with the same system prompt as the source: the kept turn is rendered as the
prompt that model answered. ``--allow-other-model`` lifts this check (a
cross-model probe: another model reads a conversation it did not write).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

import yaml

from engines import engine_kind
from experiments import Experiment, ManifestSpec
from experiments.influence import BENCHMARK_OF
from experiments.influence.build import COND, split_list, stable_hash
from probe.errors import ProbeError, StoreError, at_least
from probe.record import Manifest
from probe.shards import find_shards
from probe.store import MANIFEST, RunStore
from probe.types import Message, Trial, make_trial_id

if TYPE_CHECKING:
    import pandas as pd


NAME: Final[str] = "followup"
DATA: Final[Path] = Path(__file__).resolve().parent / "data" / "followup.yaml"
CLASSES: Final[tuple[str, ...]] = ("backfire", "compliance", "no_effect", "baseline")
SOURCES: Final[dict[str, str]] = BENCHMARK_OF
"""Experiments a follow-up can start from, and their benchmark name in :mod:`experiments.influence.effects`."""


class FollowupError(ProbeError, ValueError):
    """A source run or a question file that cannot be used; the message says why and what to do."""


# ============================================================================ wordings
@dataclass(frozen=True)
class Wordings:
    """The follow-up questions (templates with ``{label_1}``, ``{label_2}``) and the printed options."""

    default: str
    wordings: Mapping[str, str]
    options: tuple[str, ...]
    meaning: tuple[str, ...]
    source: str

    def question(self, name: str, labels: Sequence[str]) -> str:
        if name not in self.wordings:
            raise FollowupError(f"{self.source}: no wording {name!r}; it defines {sorted(self.wordings)}")
        return self.wordings[name].format(label_1=labels[0], label_2=labels[-1])


def load_wordings(path: str | Path | None = None) -> Wordings:
    """The question file (``None`` = the shipped ``experiments/data/followup.yaml``), validated."""
    import string

    from experiments.dilemmas import _StrictLoader

    src = Path(path) if path else DATA
    try:
        doc = yaml.load(src.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except (OSError, yaml.YAMLError) as e:
        raise FollowupError(f"cannot read the question file {src}: {e}") from None
    keys = {"default", "wordings", "options", "meaning"}
    if not isinstance(doc, Mapping) or set(doc) != keys:
        got = sorted(doc) if isinstance(doc, Mapping) else type(doc).__name__
        raise FollowupError(f"{src}: needs exactly the keys {sorted(keys)}, got {got}")
    words = doc["wordings"]
    if not isinstance(words, Mapping) or not words:
        raise FollowupError(f"{src}: wordings must be a non-empty mapping of name -> question")
    for name, text in words.items():
        if not isinstance(text, str) or not text.strip():
            raise FollowupError(f"{src}: wordings.{name} must be a non-empty string")
        fields = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
        if not fields <= {"label_1", "label_2"}:
            raise FollowupError(f"{src}: wordings.{name} uses {sorted(fields)}; only label_1 and label_2 exist")
    if doc["default"] not in words:
        raise FollowupError(f"{src}: default {doc['default']!r} is not one of the wordings {sorted(words)}")
    opts, meaning = doc["options"], doc["meaning"]
    if not (isinstance(opts, list) and isinstance(meaning, list) and len(opts) == len(meaning) >= 2):
        raise FollowupError(f"{src}: options and meaning must be lists of the same length (at least 2)")
    return Wordings(
        str(doc["default"]),
        {str(k): str(v) for k, v in words.items()},
        tuple(map(str, opts)),
        tuple(map(str, meaning)),
        str(src),
    )


# ================================================================================ spec
@dataclass(frozen=True)
class FollowupSpec(ManifestSpec):
    """What the follow-up asks of which trials. Serialized into the run manifest."""

    experiment_name: ClassVar[str] = NAME

    source: str
    """The source influence run (absolute path)."""
    source_run_key: str
    """Its run key: the follow-up refuses a source folder that now holds another run."""
    select: tuple[str, ...] = ("backfire", "compliance")
    """Cell classes to sample (see the module docstring): backfire, compliance, no_effect, baseline."""
    per_cell: int = 10
    """First answers sampled per cell (fewer when a cell has fewer)."""
    seed: int = 0
    """Seed of the per-cell sampling."""
    wording: str = ""
    """Name of the question in the question file (empty: the file's default)."""
    question_file: str | None = None
    """A question file (YAML, layout of ``experiments/data/followup.yaml``); None = the shipped one."""
    significance: str = "raw"
    """Which test decides a significant effect: raw (p < 0.05, as the paper's cells) or bh (BH q < 0.05)."""
    answers: str = "auto"
    """Where first answers come from: samples, readout, or auto (samples when the source has them)."""
    variants: tuple[str, ...] = ("cue",)
    """Cue variants whose effects are cells (main cues; add placebo / negated for the controls)."""
    n_boot: int = 1000
    """Bootstrap replicates of the source analysis (its readout-run tests use the bootstrap SE)."""
    keep_ids: bool = True
    """Carry the generated token ids of sampled first answers; off for another model (its tokenizer differs)."""

    def __post_init__(self) -> None:
        bad = [c for c in self.select if c not in CLASSES]
        if bad or not self.select:
            raise ValueError(f"--select takes {', '.join(CLASSES)} (comma-separated), got {list(self.select)}")
        at_least("--per-cell", self.per_cell, 1)
        if self.significance not in ("raw", "bh"):
            raise ValueError(f"--significance must be raw or bh, got {self.significance!r}")
        if self.answers not in ("auto", "samples", "readout"):
            raise ValueError(f"--answers must be auto, samples or readout, got {self.answers!r}")
        at_least("n_boot", self.n_boot, 2)


# ============================================================================== source
def open_source(path: str | Path) -> tuple[RunStore, str]:
    """The source run and its benchmark; refuses a run that is not a finished influence run."""
    root = Path(path).resolve()
    store = RunStore(root)
    try:
        if not (root / MANIFEST).exists() and find_shards(root):
            raise StoreError(f"{root} holds shards but no merged run; run `probe merge {root}` first")
        store.manifest()
    except StoreError as e:
        raise FollowupError(f"--source: {e}") from None
    man = store.manifest()
    exp = man.experiment
    if exp not in SOURCES:
        raise FollowupError(
            f"--source {store.root} is a {exp!r} run; a follow-up needs an influence run ({', '.join(SOURCES)})"
        )
    if man.shard:
        raise FollowupError(
            f"--source {store.root} is one shard; merge the shards (probe merge) and use the merged run"
        )
    need = len(store.bounds())
    done = len(store.verified_chunks())
    if done != need:
        raise FollowupError(
            f"--source {store.root} is unfinished ({done}/{need} chunks); rerun its `probe run` command to finish it"
        )
    return store, SOURCES[exp]


def model_name(spec: str) -> str:
    """The model a ``--model`` spec names, as engines record it (``vllm:X`` -> X, ``openai-compatible:n@url`` -> n)."""
    kind = engine_kind(spec)
    if kind == "api":
        from engines.api import parse_model_spec

        return str(parse_model_spec(spec).model)
    if kind == "vllm":
        return spec.split(":", 1)[1]
    return spec


def check_subject(source: Manifest, model: str, think: bool, system: str | None) -> list[str]:
    """How the follow-up's subject differs from the source run's (empty: the same model, think mode, system)."""
    ident = source.identified
    problems = []
    src_model = str(ident("model", "?"))
    if model_name(src_model) != model_name(model):
        problems.append(f"model {model!r} is not the source's {src_model!r}")
    src_think = bool(ident("think", False))
    if src_think != think:
        problems.append(f"think mode {'on' if think else 'off'} is not the source's ({'on' if src_think else 'off'})")
    if ident("system_prompt") != system:
        problems.append(f"system prompt {system!r} is not the source's {ident('system_prompt')!r}")
    return problems


# =========================================================================== selection
def effect_cells(conditions: pd.DataFrame, spec: FollowupSpec) -> pd.DataFrame:
    """One row per effect (condition x direction) of the chosen variants, with its ``cell`` class and ``cell_key``.

    ``conditions``: the source run's condition table with its BH q-values
    (:func:`experiments.influence.effects.with_fdr`), as its report has it.
    """
    from experiments.influence.effects import effects

    eff = effects(conditions)
    eff = eff[eff["variant"].isin(spec.variants)].reset_index(drop=True)
    sig = eff["sig_bh" if spec.significance == "bh" else "sig"].astype(bool)
    tested = eff["p"].notna()
    cls = [
        ("backfire" if bf else "compliance") if s else ("no_effect" if t else "")
        for s, bf, t in zip(sig, eff["backfire"].astype(bool), tested, strict=True)
    ]
    eff["cell"] = cls
    eff["cell_key"] = ["|".join(str(r[k]) for k in (*COND, "direction")) for _, r in eff.iterrows()]
    return eff[eff["cell"] != ""].reset_index(drop=True)


def first_answers(store: RunStore, answers: str) -> pd.DataFrame:
    """One row per usable first answer: trial_id, draw, option, text, reply_ids (tuple), ids (generated/encoded)."""
    import pandas as pd

    samples = store.load("samples") if answers in ("auto", "samples") else pd.DataFrame()
    if answers == "samples" and samples.empty:
        raise FollowupError(f"--answers samples: {store.root} has no samples (it was run without --samples N)")
    if not samples.empty:
        ok = samples[samples["status"] == "ok"].copy()
        ids = ok["token_ids"] if "token_ids" in ok.columns else pd.Series([[]] * len(ok), index=ok.index)
        ok["reply_ids"] = [tuple(int(i) for i in x) for x in ids]
        ok["ids"] = ["generated" if len(x) else "encoded" for x in ok["reply_ids"]]
        return ok[["trial_id", "draw", "option", "text", "reply_ids", "ids"]].reset_index(drop=True)
    per = store.load("readout_trials")
    if per.empty:
        raise FollowupError(f"{store.root} has neither samples nor readouts")
    trials = {t.trial_id: t for t in store.trials()}
    rows = []
    for r in per.itertuples(index=False):
        t = trials[r.trial_id]
        rows.append(
            {
                "trial_id": r.trial_id,
                "draw": -1,
                "option": r.greedy_option,
                "text": readout_answer(t, str(r.greedy_option), str(r.reasoning or "")),
                "reply_ids": (),
                "ids": "encoded",
            }
        )
    return pd.DataFrame(rows, columns=["trial_id", "draw", "option", "text", "reply_ids", "ids"])


def readout_answer(trial: Trial, option: str, reasoning: str) -> str:
    """What a readout's greedy answer reads as a reply: [think block] + assistant prefix + option.

    The separator follows :func:`engines.render.option_texts` (a space after a
    prefix that does not end in whitespace), the think block Qwen3's layout.
    """
    pre = trial.assistant_prefix
    sep = " " if pre and not pre[-1].isspace() else ""
    think = f"<think>\n{reasoning}\n</think>\n\n" if reasoning else ""
    return f"{think}{pre}{sep}{option}"


def _members(trials: Sequence[Trial], row: Mapping[str, Any], benchmark: str) -> list[str]:
    """Trial ids asked in the cell of effect ``row`` (DailyDilemmas cells are per value: both sides' trials)."""
    same = [t for t in trials if all(t.factors.get(k) == row[k] for k in COND if k != "pair")]
    d = row["direction"]
    if benchmark != "dd":
        return [t.trial_id for t in same if t.factors["pair"] == row["pair"] and t.factors["direction"] == d]
    other = {"A": "B", "B": "A"}[d]
    return [
        t.trial_id
        for t in same
        if (t.factors["group_a"] == row["pair"] and t.factors["direction"] == d)
        or (t.factors["group_b"] == row["pair"] and t.factors["direction"] == other)
    ]


def _sample(units: pd.DataFrame, k: int, seed: int, key: str) -> pd.DataFrame:
    """``k`` rows of ``units`` without replacement (all if fewer), drawn by (seed, cell), kept in source order."""
    import numpy as np

    if len(units) <= k:
        return units
    rng = np.random.default_rng(stable_hash(seed, key))
    pick = np.sort(rng.choice(len(units), size=k, replace=False))
    return units.iloc[pick]


def selection(store: RunStore, benchmark: str, spec: FollowupSpec) -> pd.DataFrame:
    """The chosen first answers: one row per (cell, source trial, draw), cells in class then table order."""
    import pandas as pd

    from experiments.influence.effects import run_conditions, with_fdr
    from probe.runs import open_run

    measured = run_conditions(open_run(store.root), benchmark, n_boot=spec.n_boot)
    conditions = with_fdr(measured.result.table.assign(benchmark=benchmark), ("benchmark", "variant"))
    trials = store.trials()
    order = {t.trial_id: i for i, t in enumerate(trials)}
    ans = first_answers(store, spec.answers)
    ans = ans.assign(_o=ans["trial_id"].map(order)).sort_values(["_o", "draw"], kind="stable").drop(columns="_o")
    eff = effect_cells(conditions, spec)
    parts = []
    for cls in spec.select:
        if cls == "baseline":
            for pair in dict.fromkeys(t.factors["pair"] for t in trials):
                ids = [t.trial_id for t in trials if t.factors["pair"] == pair and t.factors["direction"] == "base"]
                key = f"{pair}|baseline"
                units = ans[ans["trial_id"].isin(ids)]
                chosen = _sample(units, spec.per_cell, spec.seed, key)
                parts.append(chosen.assign(cell=cls, cell_key=key, cell_direction="base"))
            continue
        for _, row in eff[eff["cell"] == cls].iterrows():
            units = ans[ans["trial_id"].isin(_members(trials, row, benchmark))]
            chosen = _sample(units, spec.per_cell, spec.seed, row["cell_key"])
            parts.append(chosen.assign(cell=cls, cell_key=row["cell_key"], cell_direction=row["direction"]))
    cols = [*ans.columns, "cell", "cell_key", "cell_direction"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


# ============================================================================== expand
def expand(spec: FollowupSpec, count_tokens: Callable[[str], int] | None = None) -> list[Trial]:
    """One follow-up trial per chosen (source trial, draw), in selection order."""
    store, benchmark = open_source(spec.source)
    key = store.manifest().run_key
    if key != spec.source_run_key:
        raise FollowupError(
            f"--source {store.root} now holds run {key}, not {spec.source_run_key} that this follow-up was made from"
        )
    words = load_wordings(spec.question_file)
    wording = spec.wording or words.default
    chosen = selection(store, benchmark, spec)
    source = {t.trial_id: t for t in store.trials()}
    out = []
    for r in chosen.itertuples(index=False):
        src = source[r.trial_id]
        factors = {
            **src.factors,
            "cell": r.cell,
            "cell_key": r.cell_key,
            "cell_direction": r.cell_direction,
            "source_trial": r.trial_id,
            "source_draw": str(r.draw),
            "source_option": str(r.option),
            "source_choice": src.meaning[src.options.index(r.option)],
            "wording": wording,
        }
        ids = tuple(r.reply_ids) if spec.keep_ids else ()
        factors["first_ids"] = "generated" if ids else "encoded"
        kept = Message("assistant", str(r.text), reply_ids=ids)
        messages = (*src.messages, kept, Message("user", words.question(wording, src.options)))
        out.append(
            Trial(
                trial_id=make_trial_id(NAME, src.item_id, factors, "", 0),
                experiment=NAME,
                item_id=src.item_id,
                factors=factors,
                messages=messages,
                options=words.options,
                meaning=words.meaning,
            )
        )
    return out


# ========================================================================= command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("follow-up probe")
    g.add_argument("--source", required=True, help="the influence run whose trials are followed up (its --out)")
    g.add_argument(
        "--select",
        default="backfire,compliance",
        help="cell classes to sample: backfire, compliance, no_effect, baseline (default: backfire,compliance)",
    )
    g.add_argument("--per-cell", type=int, default=10, help="first answers sampled per cell (default: 10)")
    g.add_argument(
        "--select-seed", type=int, default=0, help="seed of the per-cell sampling (--seed is the engine's; default: 0)"
    )
    g.add_argument("--wording", default="", help="question name in the question file (default: its default, paper)")
    g.add_argument("--question-file", default=None, help="YAML question file (default: experiments/data/followup.yaml)")
    g.add_argument(
        "--significance",
        default="raw",
        choices=["raw", "bh"],
        help="significant effect = raw p < 0.05 (default) or BH q < 0.05",
    )
    g.add_argument(
        "--answers",
        default="auto",
        choices=["auto", "samples", "readout"],
        help="first answers from the source's samples or its greedy readouts (auto: samples if any)",
    )
    g.add_argument(
        "--variants", default="cue", help="cue variants whose effects are cells: cue, placebo, negated (default: cue)"
    )
    g.add_argument(
        "--allow-other-model",
        action="store_true",
        help="ask a model other than the source's (or in another think mode / system prompt): a cross-model probe",
    )


def spec_from_args(a: argparse.Namespace) -> FollowupSpec:
    store, _ = open_source(a.source)
    man = store.manifest()
    problems = check_subject(man, a.model, bool(a.think), a.system)
    if problems and not a.allow_other_model:
        raise FollowupError(
            "the follow-up keeps the source model's own answer, so it must ask the same model the same way: "
            + "; ".join(problems)
            + ". Pass the source's --model/--think/--system, or --allow-other-model for a cross-model probe."
        )
    spec = FollowupSpec(
        source=str(store.root.resolve()),
        source_run_key=man.run_key,
        select=split_list(a.select),
        per_cell=a.per_cell,
        seed=a.select_seed,
        wording=a.wording,
        question_file=str(Path(a.question_file).resolve()) if a.question_file else None,
        significance=a.significance,
        answers=a.answers,
        variants=split_list(a.variants),
        keep_ids=not any(p.startswith("model ") for p in problems),
    )
    words = load_wordings(spec.question_file)
    words.question(spec.wording or words.default, ("A", "B"))  # fail now on an unknown wording, not mid-run
    return spec


EXPERIMENT = Experiment.of(
    sys.modules[__name__],
    "follow-up self-report on chosen trials of an influence run: did anything influence your choice? "
    "(paper 000, Section 4.3)",
    generative=lambda t: True,
)
EXPERIMENTS = (EXPERIMENT,)
