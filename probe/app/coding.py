"""Coding texts with a judge: follow-up answers and reasoning traces, labelled from editable taxonomies.

Four coding tasks (paper 000, sections 4.3 and 5, appendices K and P):

* ``followup``: how the answer to the follow-up question treats the cue
  (the paper's ``ack_affected``, ``ack_disclaimed``, ``denied``, ``partial``, ``unclear``);
* ``compliance``: how a reasoning trace treats the cue in its prompt
  (complies, resists, discounts, unresolved, not mentioned);
* ``rationale``: the primary rationale of a reasoning trace (the paper's 17
  triage codes and ``none``, plus six added codes on BBQ and DailyDilemmas);
* ``rationales``: every rationale a trace states: per (trace, rationale) one
  judge trial, coded ``not_mentioned``, ``mentioned_but_not_acted_on`` or
  ``mentioned_and_acted_on`` (appendix K.3); the file has a ``rationale`` column.

A taxonomy is a YAML data file (``experiments/data/taxonomies/<task>.yaml``):
the codes (id, label, definition, example) and the judge prompt template.
:func:`probe.app.taxonomy.load_taxonomy` validates it and names the file, the
code and the field of any error.

One judge trial per text: the prompt is the taxonomy's template filled with
the text and its context (the cue, the side it favours, the subject's choice),
and the trial's options are the code ids. Two ways to get a label
distribution (the distribution is kept, not only its argmax), or none:

* a **logit judge** (any logit engine: the tiny model, a local model) is read
  at the answer slot over the code ids, each id scored as a whole string
  through the engine's token trie; ``coverage`` says how much of the judge's
  answer mass lay on the codes;
* a **sampling judge** (an API model, or any engine with ``--samples N``):
  ``N`` draws at ``--temperature`` (default 1.0), each parsed into a code by
  :func:`probe.parse.parse_answer`; the distribution is the share of each code
  among the parsed draws. ``--samples 1`` (the default for engines that cannot
  read logits) is one greedy draw (temperature 0): a one-hot distribution.
  Judge answers that parse into no code are kept apart
  (``<task>.failed.parquet``) and counted, never retried away;
* the **rule coder** (``--judge rule``, :mod:`probe.app.coding_rules`): the
  taxonomy's keyword patterns, one-hot, no model.

:func:`code_run` writes ``RUN/coding/<task>.parquet`` (one row per coded text:
``trial_id``, ``draw`` (-1 for a readout's reasoning), ``label``, one
``p_<code>`` column per code, ``judge``, and for audit ``origin``,
``judge_prompt``, ``judge_raw``, ``coverage``, ``judge_draws``) and
``RUN/coding/<task>.json`` (taxonomy hash and codes, judge identity, counts,
time). It works in chunks written atomically, so a killed coding run resumes
where it stopped.

This module holds the judge prompts, the two judges, :func:`code_run`, the
agreement with a validation set and the ``probe code`` command; the
taxonomies and validation sets are read by :mod:`probe.app.taxonomy`, the
texts to code collected by :mod:`probe.app.coding_texts`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from engines import add_loading_arguments, available_modules
from experiments.judge import judge_engine
from probe.app.coding_texts import SOURCES, CodingItem, Labelled, clip, collect
from probe.app.taxonomy import (
    FIELDS,
    TASKS,
    Code,
    Taxonomy,
    TaxonomyError,
    codes_block,
    load_taxonomy,
    load_validation,
)
from probe.app.verbs import add_verb
from probe.files import atomic_write_parquet, atomic_write_text, canonical_json
from probe.store import RunStore
from probe.types import Message, Trial


# ================================================================ judge trials
def judge_prompt(tax: Taxonomy, codes: Sequence[Code], text: str, context: Mapping[str, str]) -> str:
    """The taxonomy's template filled with the code list, the text and its context (missing fields: "n/a")."""
    values = {k: "n/a" for k in FIELDS}
    values.update({k: str(v) for k, v in context.items() if k in FIELDS})
    values.update(codes=codes_block(codes), code_ids=", ".join(c.id for c in codes), text=clip(text))
    return tax.prompt.format(**values)


def judge_trial(
    task: str, key: str, draw: int, prompt: str, codes: Sequence[Code], factors: Mapping[str, str] | None = None
) -> Trial:
    """The judge's trial: one user message, options = the code ids (read at the slot, or parsed from a reply);
    ``factors``: the coded text (and rationale) for the rule coder, which reads them instead of the prompt."""
    ids = tuple(c.id for c in codes)
    return Trial(
        trial_id=f"code-{task}:{key}:{draw}",
        experiment=f"code-{task}",
        item_id=key,
        factors=dict(factors or {}),
        messages=(Message("user", prompt),),
        options=ids,
        meaning=ids,
    )


# ================================================================ judges
class LogitCoder:
    """A logit engine read at the answer slot over the code ids."""

    mode = "logit"

    def __init__(self, engine: Any, model: str) -> None:
        self.engine = engine
        self.name = f"logit:{model}"

    def identity(self) -> dict[str, Any]:
        return {"mode": self.mode, **self.engine.identity()}

    def label(self, trials: Sequence[Trial]) -> list[Labelled]:
        out = []
        for r in self.engine.readout(list(trials)):
            out.append(
                Labelled(
                    {s.option: float(s.prob) for s in r.scores},
                    json.dumps([[t, p] for t, p in r.top_other], ensure_ascii=False),
                    float(r.coverage),
                    0,
                )
            )
        return out


class SampleCoder:
    """Any engine's sampled replies, parsed into codes; the distribution is the share among parsed draws."""

    mode = "sample"

    def __init__(self, engine: Any, model: str, n: int = 1, temperature: float | None = None) -> None:
        if n < 1:
            raise ValueError(f"--samples must be >= 1 for a sampling judge, got {n}")
        self.engine = engine
        self.n = n
        self.temperature = (0.0 if n == 1 else 1.0) if temperature is None else float(temperature)
        if self.temperature < 0:
            raise ValueError(f"--temperature must be >= 0, got {self.temperature}")
        self.name = f"sample:{model}"

    def identity(self) -> dict[str, Any]:
        return {"mode": self.mode, "n": self.n, "temperature": self.temperature, **self.engine.identity()}

    def label(self, trials: Sequence[Trial]) -> list[Labelled]:
        samples = self.engine.sample(list(trials), self.n, self.temperature)
        by_trial: dict[str, list[Any]] = {}
        for s in samples:
            by_trial.setdefault(s.trial_id, []).append(s)
        out = []
        for t in trials:
            got = sorted(by_trial.get(t.trial_id, []), key=lambda s: s.replicate)
            parsed = [s.option for s in got if s.status == "ok" and s.option in t.options]
            raw = json.dumps([s.text for s in got], ensure_ascii=False)
            cover = len(parsed) / len(got) if got else 0.0
            if not parsed:
                out.append(Labelled(None, raw, cover, 0))
                continue
            out.append(Labelled({o: parsed.count(o) / len(parsed) for o in t.options}, raw, cover, len(parsed)))
        return out


class Coder(Protocol):
    """What :func:`code_run` needs of a judge: a name, its identity and labels for judge trials, in order."""

    name: str
    mode: str

    def identity(self) -> dict[str, Any]: ...

    def label(self, trials: Sequence[Trial]) -> list[Labelled]: ...


def make_coder(
    spec: str, args: argparse.Namespace | None = None, samples: int = 0, temperature: float | None = None
) -> Coder:
    """The judge for ``spec``: the rule coder for ``rule``, a logit judge when the engine reads logits and
    ``samples`` is 0, else a sampling judge."""
    if spec == "rule":
        from probe.app.coding_rules import RuleCoder

        return RuleCoder(getattr(args, "taxonomy", None))
    engine = judge_engine(spec, args)
    if samples == 0 and hasattr(engine, "readout"):
        return LogitCoder(engine, spec)
    return SampleCoder(engine, spec, max(1, samples), temperature)


# ================================================================ coding a run
def rationale_codes(tax: Taxonomy, benchmark: str | None) -> tuple[Code, ...]:
    """The rationales a ``rationales`` taxonomy asks about: its rationale taxonomy's codes for ``benchmark``
    but ``none`` (a trace with no rationale is one whose every status is not_mentioned)."""
    rat = load_taxonomy(tax.rationale_taxonomy or "rationale")
    return tuple(c for c in rat.codes_for(benchmark) if c.id != "none")


def rationale_context(code: Code) -> dict[str, str]:
    """The judge-prompt fields of the rationale a ``rationales`` trial asks about."""
    return {"rationale": f"{code.id} ({code.label})", "definition": code.definition}


def per_rationale(items: Sequence[CodingItem], codes: Sequence[Code]) -> tuple[CodingItem, ...]:
    """One item per (text, rationale code), texts in order, codes in taxonomy order."""
    return tuple(
        replace(it, rationale=c.id, context={**it.context, **rationale_context(c)}) for it in items for c in codes
    )


def _key(it: CodingItem) -> str:
    """The judge trial's key of an item: its trial id (and rationale, for ``rationales``)."""
    return f"{it.trial_id}#{it.rationale}" if it.rationale else it.trial_id


def benchmark_of(store: RunStore) -> str | None:
    """The influence benchmark of a run (``influence-bbq`` -> ``bbq``), or of a follow-up run's source."""
    man = store.manifest()
    if man.experiment.startswith("influence-"):
        return man.experiment.split("-", 1)[1]
    sources = man.source_runs()
    return benchmark_of(RunStore(sources[0])) if sources else None


@dataclass(frozen=True)
class CodingResult:
    path: Path
    meta: Mapping[str, Any]
    frame: pd.DataFrame


def coding_dir(run: Path) -> Path:
    return Path(run) / "coding"


def _label_rows(
    items: Sequence[CodingItem], prompts: Sequence[str], labels: Sequence[Labelled], codes: Sequence[Code], judge: str
) -> pd.DataFrame:
    rows = []
    for it, prompt, lab in zip(items, prompts, labels, strict=True):
        probs = lab.probs or {}
        best = max(codes, key=lambda c: probs.get(c.id, -1.0)).id if lab.probs else ""
        rows.append(
            {
                "trial_id": it.trial_id,
                "draw": it.draw,
                **({"rationale": it.rationale} if it.rationale else {}),
                "label": best,
                **{f"p_{c.id}": float(probs[c.id]) if lab.probs else float("nan") for c in codes},
                "judge": judge,
                "origin": it.origin,
                "status": "ok" if lab.probs else "unparsed",
                "judge_prompt": prompt,
                "judge_raw": lab.raw,
                "coverage": lab.coverage,
                "judge_draws": lab.draws,
            }
        )
    return pd.DataFrame(rows)


def code_run(
    run: str | Path,
    task: str,
    judge: Coder,
    *,
    taxonomy: str | Path | None = None,
    benchmark: str | None = None,
    source: str = "auto",
    chunk_size: int = 32,
    limit: int | None = None,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
) -> CodingResult:
    """Code the texts of ``task`` in a run with ``judge``; write ``RUN/coding/<task>.parquet`` and ``.json``.

    Resumable: chunks of ``chunk_size`` texts are written atomically under
    ``RUN/coding/.<task>-<key>/`` (the key hashes the judge, the codes and
    every judge prompt), so re-running the same command computes only the
    missing chunks. A finished coding by another judge or taxonomy is kept
    unless ``overwrite``.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    store = RunStore(Path(run))
    man = store.manifest()
    tax = load_taxonomy(taxonomy or task)
    if tax.task != task:
        raise TaxonomyError(f"{tax.source} is a {tax.task!r} taxonomy, not {task!r}")
    bench = benchmark or benchmark_of(store)
    codes = tax.codes_for(bench)
    got = collect(store, task, source)
    texts = got.items[:limit] if limit is not None else got.items
    items = per_rationale(texts, rationale_codes(tax, bench)) if task == "rationales" else texts
    prompts = [judge_prompt(tax, codes, it.text, it.context) for it in items]
    ident = judge.identity()
    keys = [[it.trial_id, it.draw, *([it.rationale] if it.rationale else [])] for it in items]
    key = hashlib.sha256(canonical_json([ident, [c.id for c in codes], keys, prompts]).encode()).hexdigest()[:16]
    out_dir = coding_dir(store.root)
    final, meta_path = out_dir / f"{task}.parquet", out_dir / f"{task}.json"
    if (finished := _finished_coding(final, meta_path, key, overwrite, log)) is not None:
        return finished
    parts = out_dir / f".{task}-{key}"
    frame = _code_chunks(parts, task, items, prompts, codes, judge, chunk_size, log)
    ok, failed = frame[frame["status"] == "ok"].drop(columns="status"), frame[frame["status"] != "ok"]
    meta = {
        "task": task,
        "key": key,
        "run": str(store.root),
        "run_key": man.run_key,
        "benchmark": bench,
        "taxonomy": {"path": tax.source, "sha256": tax.sha256, "codes": [c.id for c in codes]},
        **({"rationales": [c.id for c in rationale_codes(tax, bench)]} if task == "rationales" else {}),
        "judge": {"name": judge.name, "identity": ident},
        "source": source,
        "counts": {
            **({"traces": len(texts)} if task == "rationales" else {}),
            "texts": len(items),
            "coded": len(ok),
            "unparsed": len(failed),
            "skipped": dict(got.skipped),
            "not_coded_by_limit": len(got.items) - len(texts),
            "by_origin": {str(k): int(v) for k, v in ok["origin"].value_counts().sort_index().items()},
        },
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    failed_path = out_dir / f"{task}.failed.parquet"
    _write_coding(final, meta_path, failed_path, ok, failed, meta)
    shutil.rmtree(parts, ignore_errors=True)
    log(
        f"coded {len(ok)} texts ({task}) with {judge.name} into {final}"
        + (f"; {len(failed)} judge answers parsed into no code (in {failed_path.name})" if len(failed) else "")
        + (
            f"; skipped {', '.join(f'{v} {k}' for k, v in got.skipped.items() if v)}"
            if any(got.skipped.values())
            else ""
        )
    )
    return CodingResult(final, meta, ok.reset_index(drop=True))


def _finished_coding(
    final: Path, meta_path: Path, key: str, overwrite: bool, log: Callable[[str], None]
) -> CodingResult | None:
    """The finished coding with this key, if there is one; refuses to replace another coding unless ``overwrite``."""
    if not meta_path.exists():
        return None
    old = json.loads(meta_path.read_text())
    if old.get("key") == key and final.exists():
        log(f"{final}: already coded ({old['counts']['coded']} texts)")
        return CodingResult(final, old, pd.read_parquet(final))
    if not overwrite:
        raise ValueError(
            f"{final} holds a coding by another judge, taxonomy or text selection ({old.get('judge', {}).get('name')}); "
            "pass --overwrite to replace it"
        )
    return None


def _code_chunks(
    parts: Path,
    task: str,
    items: Sequence[CodingItem],
    prompts: Sequence[str],
    codes: Sequence[Code],
    judge: Coder,
    chunk_size: int,
    log: Callable[[str], None],
) -> pd.DataFrame:
    """Label the texts chunk by chunk under ``parts`` (the chunks already there are kept); all the labels."""
    bounds = [(lo, min(lo + chunk_size, len(items))) for lo in range(0, len(items), chunk_size)]
    done = {int(p.stem.split("-")[1]) for p in parts.glob("chunk-*.parquet")} if parts.is_dir() else set()
    if done:
        log(f"{parts}: resuming, {len(done)}/{len(bounds)} chunks already coded")
    for k, (lo, hi) in enumerate(bounds):
        if k in done:
            continue
        trials = [
            judge_trial(task, _key(it), it.draw, p, codes, {"text": it.text, "rationale": it.rationale})
            for it, p in zip(items[lo:hi], prompts[lo:hi], strict=True)
        ]
        labels = judge.label(trials)
        atomic_write_parquet(
            parts / f"chunk-{k:06d}.parquet", _label_rows(items[lo:hi], prompts[lo:hi], labels, codes, judge.name)
        )
    frames = [pd.read_parquet(parts / f"chunk-{k:06d}.parquet") for k in range(len(bounds))]
    cols = ["trial_id", "draw", *(["rationale"] if task == "rationales" else []), "label"]
    cols += [*[f"p_{c.id}" for c in codes], "judge", "origin", "status"]
    cols += ["judge_prompt", "judge_raw", "coverage", "judge_draws"]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)
    frame["draw"] = frame["draw"].astype(int)
    return frame


def _write_coding(
    final: Path, meta_path: Path, failed_path: Path, ok: pd.DataFrame, failed: pd.DataFrame, meta: dict[str, Any]
) -> None:
    """Write the coded texts, the unparsed ones (if any; else remove a stale file) and the metadata."""
    atomic_write_parquet(final, ok.reset_index(drop=True))
    if len(failed):
        atomic_write_parquet(failed_path, failed.reset_index(drop=True))
    else:
        failed_path.unlink(missing_ok=True)
    atomic_write_text(meta_path, json.dumps(meta, indent=2, sort_keys=True) + "\n")


# ================================================================ validation
def _validation_context(tax: Taxonomy, task: str, bench: str | None, context: Mapping[str, str]) -> dict[str, str]:
    """A validation item's judge-prompt fields; a ``rationales`` item names its rationale by id."""
    if task != "rationales":
        return dict(context)
    by_id = {c.id: c for c in rationale_codes(tax, bench)}
    rid = context.get("rationale", "")
    if rid not in by_id:
        raise TaxonomyError(f"validation item rationale {rid!r} is not a rationale for benchmark {bench}")
    return {**context, **rationale_context(by_id[rid])}


def judge_validation(
    task: str, judge: Coder, *, taxonomy: str | Path | None = None, validation: str | Path | None = None
) -> pd.DataFrame:
    """Run the judge over the validation set: one row per item with gold, label, distribution and the prompt."""
    tax = load_taxonomy(taxonomy or task)
    items = load_validation(task, validation, tax)
    rows = []
    for bench in dict.fromkeys(it.benchmark for it in items):  # one code set per benchmark
        group = [it for it in items if it.benchmark == bench]
        codes = tax.codes_for(bench)
        ctx = [_validation_context(tax, task, bench, it.context) for it in group]
        prompts = [judge_prompt(tax, codes, it.text, c) for it, c in zip(group, ctx, strict=True)]
        trials = [
            judge_trial(task, it.id, 0, p, codes, {"text": it.text, "rationale": it.context.get("rationale", "")})
            for it, p in zip(group, prompts, strict=True)
        ]
        labels = judge.label(trials)
        for it, p, lab in zip(group, prompts, labels, strict=True):
            probs = lab.probs or {}
            label = max(codes, key=lambda c: probs.get(c.id, -1.0)).id if lab.probs else ""
            rows.append(
                {
                    "id": it.id,
                    "benchmark": it.benchmark or "",
                    "gold": it.gold,
                    "label": label,
                    "p_gold": float(probs.get(it.gold, float("nan"))) if lab.probs else float("nan"),
                    "coverage": lab.coverage,
                    "judge_raw": lab.raw,
                    "judge_prompt": p,
                }
            )
    return pd.DataFrame(rows)


# ================================================================ command line
def _add_judge_engine_arguments(p: argparse.ArgumentParser) -> None:
    """The engine flags that apply to a judge (the judge never thinks and takes no system prompt)."""
    g = p.add_argument_group("judge engine")
    g.add_argument(
        "--judge",
        required=True,
        help="judge model: tiny, a local folder or Hugging Face id (read at the logit level), vllm:<model>, "
        "openai:<model>, anthropic:<model> or openai-compatible:<name>@<url> (sampled)",
    )
    g.add_argument(
        "--samples",
        type=int,
        default=0,
        help="judge draws per text: 0 = read a logit judge at the slot (an API judge then makes one greedy draw); "
        "N >= 1 = N sampled replies parsed into codes (default: 0)",
    )
    g.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="judge sampling temperature (default: 0 for one draw, 1 for several)",
    )
    g.add_argument("--taxonomy", default=None, help="taxonomy YAML (default: experiments/data/taxonomies/<task>.yaml)")
    add_loading_arguments(g, max_new_tokens=16)
    for module in available_modules():
        module.add_arguments(p)


def cmd_code(a: argparse.Namespace) -> int:
    """label a run's follow-up answers or reasoning traces with a judge model

    Code the texts of a run with a judge: follow-up answers (task followup), or reasoning traces (compliance: how the
    trace treats the cue; rationale: its primary rationale). Writes RUN/coding/TASK.parquet (label, one p_<code> column
    per code, the judge prompt and raw output) and TASK.json; resumes if killed.
    """
    judge = make_coder(a.judge, a, a.samples, a.temperature)
    res = code_run(
        Path(a.run),
        a.task,
        judge,
        taxonomy=a.taxonomy,
        benchmark=a.benchmark,
        source=a.source,
        chunk_size=a.chunk_size,
        limit=a.limit,
        overwrite=a.overwrite,
    )
    f = res.frame
    if len(f):
        codes = [c[2:] for c in f.columns if c.startswith("p_")]
        counts = f["label"].value_counts()
        print("code                          argmax   mean p")
        for c in codes:
            print(f"{c:<28} {int(counts.get(c, 0)):7d}  {f[f'p_{c}'].mean():7.3f}")
    return 0


def cmd_agreement(a: argparse.Namespace) -> int:
    """measure a judge against the hand-labelled validation set of a coding task

    Run the judge over experiments/data/validation/TASK.yaml and print accuracy, Cohen's kappa (with a percentile
    bootstrap CI and the asymptotic standard error), the confusion matrix and per-code recall.
    """
    from analysis.influence.coding import agreement, agreement_text

    judge = make_coder(a.judge, a, a.samples, a.temperature)
    frame = judge_validation(a.task, judge, taxonomy=a.taxonomy, validation=a.validation)
    tax = load_taxonomy(a.taxonomy or a.task)
    codes = [c.id for c in tax.codes_for(None)] + [c.id for b in tax.benchmarks for c in tax.added[b]]
    codes = list(dict.fromkeys(codes))
    ag = agreement(frame["gold"], frame["label"], codes, n_boot=a.n_boot, seed=a.seed)
    print(f"judge {judge.name} on {len(frame)} hand-labelled {a.task} texts")
    print(agreement_text(ag))
    if a.out:
        out = Path(a.out)
        atomic_write_text(out, frame.to_csv(index=False))
        print(f"per-item labels written to {out}")
    return 0


def register(sub: Any) -> None:
    """Add ``probe code`` and ``probe judge-agreement`` to the CLI's subparsers."""
    c = add_verb(sub, "code", cmd_code)
    c.add_argument("run", help="run directory")
    c.add_argument("--task", required=True, choices=TASKS, help="what to code")
    c.add_argument("--source", default="auto", choices=SOURCES, help="which table's texts to code (default: auto)")
    c.add_argument("--benchmark", default=None, help="benchmark whose added codes apply (default: from the run)")
    c.add_argument("--chunk-size", type=int, default=32, help="texts per committed chunk (default: 32)")
    c.add_argument("--limit", type=int, default=None, help="code only the first N texts")
    c.add_argument("--overwrite", action="store_true", help="replace a coding by another judge or taxonomy")
    _add_judge_engine_arguments(c)

    g = add_verb(sub, "judge-agreement", cmd_agreement)
    g.add_argument("--task", required=True, choices=TASKS, help="coding task")
    g.add_argument("--validation", default=None, help="validation YAML (default: the shipped set of the task)")
    g.add_argument("--n-boot", type=int, default=2000, help="bootstrap replicates of the kappa CI (default: 2000)")
    g.add_argument("--out", default=None, help="write the per-item labels as CSV here")
    _add_judge_engine_arguments(g)
