"""The ``probe`` command line: run, readout, merge, analyze, tiny."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engines import add_engine_arguments, make_engine
from experiments import all_experiments, get_experiment
from probe.app import importer, serve
from probe.app.check import check_run
from probe.app.verbs import add_no_report, add_verb, report_unless_skipped
from probe.errors import ProbeError, ReportError
from probe.shards import Shard, merge_shards
from probe.store import json_ready
from probe.terminal import escape_controls, escape_controls_json
from probe.types import Message, Trial

EPILOG = """examples:
  probe run yesno --model tiny --out runs/yesno-tiny
  probe analyze runs/yesno-tiny
  probe readout --model tiny --prompt "Is water wet? Answer with Yes or No." --options Yes,No
  probe serve smol   # then: probe run yesno --model openai-compatible:smol@http://127.0.0.1:8000/v1 --samples 4 --out runs/s
  probe run yesno --model Qwen/Qwen3-8B --out runs/q8 --shard $SLURM_ARRAY_TASK_ID/8   # then: probe merge runs/q8
"""


def cmd_run(a: argparse.Namespace) -> int:
    from probe.app.runner import run  # imports pandas

    exp = get_experiment(a.experiment)
    spec = exp.spec_from_args(a)
    shard = Shard.parse(a.shard) if a.shard else None
    plan = plan_from_args(a)
    engine = make_engine(a)
    judge = exp.judge_options(a) if exp.judge_options else None
    store = run(
        a.experiment,
        spec,
        engine,
        Path(a.out),
        plan=plan,
        judge=judge,
        shard=shard,
        chunk_size=a.chunk_size,
        progress=not a.quiet,
        wait_for_lock=a.wait_for_lock,
    )
    print(f"wrote {store.root}")
    _warn_coverage(store)
    if shard is None:
        report_unless_skipped(a, store.root)
    return 0


def plan_from_args(a: argparse.Namespace) -> Any:
    """The :class:`~probe.record.Plan` (what to collect) that ``probe run`` arguments ask for."""
    from probe.record import Plan

    only = []
    for pair in a.sample_only or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--sample-only needs FACTOR=VALUE (e.g. instrument=binary), got {pair!r}")
        only.append((key, value))
    return Plan(readout=not a.no_readout, samples=a.samples, temperature=a.temperature, sample_only=tuple(only))


def _warn_coverage(store: Any) -> None:
    """After a run: warn on stderr when the readouts' options hold little of the answer-slot mass."""
    from analysis.common.checks import run_coverage

    per = store.load("readout_trials")
    if per.empty:
        return
    options = {t.trial_id: t.options for t in store.trials()}
    warning = run_coverage(per, options, store.load("readout_options")).warning()
    if warning:
        print(warning, file=sys.stderr)


def layer_table(r: Any) -> str:
    """The readout at each layer of ``--layers`` as text: one row a layer, each option's normalized probability,
    the coverage and the greedy option (the last row is the final readout)."""
    names = [s.option for s in r.scores]
    widths = [max(8, len(n)) for n in names]
    head = "layer  " + "  ".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True)) + "  coverage  greedy"
    rows = [
        f"{lay.layer:>5}  "
        + "  ".join(f"{p:>{w}.4f}" for p, w in zip(lay.probs, widths, strict=True))
        + f"  {lay.coverage:8.2e}  {lay.greedy_option}"
        for lay in r.layers
    ]
    return "\n".join(["readout by layer (logit lens; normalized over the options)", head, *rows])


def cmd_readout(a: argparse.Namespace) -> int:
    """print the answer-slot distribution of one prompt

    Render one prompt through the model's chat template (or, for a model without one, the plain-text frame:
    --frame) and print the probability of each option at the answer slot.
    """
    options = tuple(o for o in a.options.split(a.sep))
    if not a.options or any(not o for o in options):
        raise ValueError(f"--options needs non-empty options separated by {a.sep!r}, got {a.options!r}")
    msgs = ((Message("system", a.system),) if a.system else ()) + (Message("user", a.prompt),)
    trial = Trial("cli", "cli", "cli", {}, msgs, options, options, assistant_prefix=a.assistant_prefix)
    engine = make_engine(a)
    if not hasattr(engine, "readout"):
        raise ValueError(f"the {engine.name!r} engine cannot read logits; readout needs a logit engine")
    r = engine.load().readout([trial])[0]
    from analysis.common.checks import coverage_warning

    mass = {s.option: math.exp(s.logprob) for s in r.scores}
    warning = coverage_warning(r.coverage, options, r.top_other, mass, sep=a.sep)
    if a.json:
        doc = {
            "model": a.model,
            "model_path": engine.describe()["model_path"],
            "think": a.think,
            "frame": getattr(engine, "frame", None),
            "prompt_token_ids": list(r.prompt_ids),
            "options": [
                {"option": s.option, "token_ids": list(s.token_ids), "logprob": s.logprob, "prob": s.prob}
                for s in r.scores
            ],
            "coverage": r.coverage,
            "greedy_option": r.greedy_option,
            "top_other": [{"token": t, "prob": p} for t, p in r.top_other],
            "reasoning": r.reasoning,
            "reasoning_tokens": r.reasoning_tokens,
            "hit_budget": r.hit_budget,
            "warning": warning or None,
        }
        if r.layers:  # --layers: the readout at each layer (the last is the readout above)
            doc["layers"] = [
                {
                    "layer": lay.layer,
                    "logprobs": list(lay.logprobs),
                    "probs": list(lay.probs),
                    "coverage": lay.coverage,
                    "greedy_option": lay.greedy_option,
                }
                for lay in r.layers
            ]
        text = json.dumps(json_ready(doc), ensure_ascii=False, indent=2, allow_nan=False)  # strict JSON: -inf -> null
        # keep token-id lists on one line each: readable, and still valid JSON
        text = re.sub(r"\[\s*((?:-?\d+,\s*)*-?\d+)\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
        print(escape_controls_json(text))
        return 0
    if r.reasoning:  # the model's text: control characters escaped (probe.terminal)
        budget = ", budget hit" if r.hit_budget else ""
        print(escape_controls(f"reasoning ({r.reasoning_tokens} tokens{budget}): {r.reasoning}\n"))
    width = max(len(s.option) for s in r.scores)
    print(f"{'option':<{width}}  {'prob':>8}  {'logprob':>10}  tokens")
    for s in r.scores:
        print(f"{s.option:<{width}}  {s.prob:8.4f}  {s.logprob:10.4f}  {list(s.token_ids)}")
    print(f"coverage {r.coverage:.4f}; greedy option {r.greedy_option!r}; prompt {r.prompt_tokens} tokens")
    if getattr(engine, "frame", "chat") == "plain":
        why = "the model has no chat template" if a.frame == "auto" else "--frame plain"
        print(f"frame: plain ({why}): Question:/Answer: text, read after 'Answer:' (docs/methods.md)")
    if r.top_other:
        print("most likely non-option tokens: " + ", ".join(f"{t!r} {p:.4f}" for t, p in r.top_other))
    if r.layers:
        print("\n" + layer_table(r))
    if warning:
        print(warning, file=sys.stderr)
    return 0


def cmd_merge(a: argparse.Namespace) -> int:
    """join the shard-i-of-n folders of a run

    Join OUT/shard-*-of-n (from --shard runs) into OUT, after checking that every shard is present, complete and from
    the same run.
    """
    store = merge_shards(Path(a.run))
    man = store.manifest()
    print(f"merged {len(man.merged_from)} shards into {store.root} ({man.n_trials} trials)")
    report_unless_skipped(a, store.root)
    return 0


def cmd_analyze(a: argparse.Namespace) -> int:
    """write a run's report (CSV tables and a Markdown summary)

    Read a run directory and write RUN/report/.
    """
    from analysis.report import write_report

    paths = write_report(Path(a.run), allow_partial=a.allow_partial)
    summary = paths[0].parent / "summary.md"
    if summary.exists():
        print(summary.read_text())
    print(f"report written to {paths[0].parent}: {', '.join(p.name for p in paths)}")
    return 0


def cmd_check(a: argparse.Namespace) -> int:
    """verify a run folder: chunks done, verified, damaged, missing

    Re-hash every table of RUN against its chunk's receipt, scan the API journal for damaged lines and show who holds
    the writer lock. Read-only. Exit 0 when every chunk verifies and the journal is clean, 1 otherwise.
    """
    lines, ok = check_run(Path(a.run))
    print("\n".join(lines))
    return 0 if ok else 1


def cmd_compare(a: argparse.Namespace) -> int:
    """one report across runs of an experiment (a model panel)

    Line up runs of one experiment (models, reasoning off / on, logit vs sampled) in one report: CSV tables, summary.md
    and PNG figures in --out. Runs are matched on the items they share; the report says what was dropped. Give run
    folders (names, models and the reasoning flag are read from their manifests) or a panel file.
    """
    from analysis.compare import runs_from_args, write_comparison

    panel = runs_from_args(a.runs, a.panel, a.names, a.humans, a.attributes)
    paths = write_comparison(
        panel, Path(a.out), n_boot=a.n_boot, seed=a.seed, asym_model=a.asym_model, decision=a.decision
    )
    summary = Path(a.out) / "summary.md"
    if summary.exists() and not a.quiet:
        print(summary.read_text())
    print(f"comparison of {len(panel.runs)} runs written to {a.out}: {', '.join(p.name for p in paths)}")
    return 0


def cmd_tiny(a: argparse.Namespace) -> int:
    """build the built-in tiny models (done automatically on first use)

    Build the locally trained tiny test models into the cache ($PROBE_CACHE or ~/.cache/probe).
    """
    from probe import tiny

    for name in a.names or tiny.TINY_NAMES:
        print(f"{name}: {tiny.ensure_tiny(name, progress=True)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="probe",
        description="Measure what language models value, crossing the frames of the question.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    _add_run(sub)
    _add_readout(sub)
    _add_run_folder_verbs(sub)
    _add_compare(sub)
    t = add_verb(sub, "tiny", cmd_tiny)
    t.add_argument("names", nargs="*", help="tiny, tiny-hybrid (default: both)")
    from probe.app import coding  # imports pandas: loaded when the parser is built, not on `import probe.app.cli`

    coding.register(sub)
    serve.register(sub)
    importer.register(sub)
    from probe.app import viewserver  # probe view and probe show

    viewserver.register(sub)
    return p


def _add_run(sub: Any) -> None:
    """`probe run EXPERIMENT`: one subcommand per experiment, with its own options beside the engine's."""
    r = sub.add_parser(
        "run",
        help="run an experiment into a run directory (resumes if interrupted)",
        description="Expand an experiment into trials, read each answer slot (and/or sample answers), store the "
        "results, write the report. Re-running the same command resumes; a different spec in the same --out is "
        "refused. `probe run EXPERIMENT --help` lists the experiment's own options.",
    )
    exps = r.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for exp in all_experiments().values():
        e = add_verb(exps, exp.name, cmd_run, help=exp.summary, description=exp.summary)
        e.add_argument("--out", required=True, help="run directory (created; reused to resume)")
        add_engine_arguments(e)
        exp.add_arguments(e)
        g = e.add_argument_group("what to collect")
        g.add_argument("--samples", type=int, default=0, help="sampled answers per trial (default: 0)")
        g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0)")
        g.add_argument("--no-readout", action="store_true", help="sample only; do not read the answer slot")
        g.add_argument(
            "--sample-only",
            action="append",
            metavar="FACTOR=VALUE",
            help=(
                "sample only trials with this factor value (repeatable), e.g. instrument=binary; the free-text "
                "trials it leaves out get one greedy reply"
            ),
        )
        g = e.add_argument_group("execution")
        g.add_argument(
            "--shard", default=None, help="run only shard i/n (0-based) of the trials, into OUT/shard-i-of-n"
        )
        g.add_argument(
            "--chunk-size",
            type=int,
            default=None,
            help="trials per committed chunk (default: the engine's; 4096 for vLLM on a GPU, else 256)",
        )
        add_no_report(g, "at the end")
        g.add_argument("--quiet", action="store_true", help="no progress bar")
        g.add_argument(
            "--wait-for-lock",
            action="store_true",
            help="if another probe process is writing this --out, wait for it (default: exit 2 naming it)",
        )


def _add_readout(sub: Any) -> None:
    o = add_verb(sub, "readout", cmd_readout)
    o.add_argument("--prompt", required=True, help="the user message")
    o.add_argument("--options", required=True, help="the options, separated by --sep (default ',')")
    o.add_argument("--sep", default=",", help="separator of --options (default ',')")
    o.add_argument("--assistant-prefix", default="", help="text the reply starts with before the slot, e.g. 'Answer:'")
    o.add_argument("--json", action="store_true", help="machine-readable output with token ids")
    o.set_defaults(no_readout=False)  # an openai-compatible: model is read through its server (engines.server)
    add_engine_arguments(o)


def _add_run_folder_verbs(sub: Any) -> None:
    """The verbs on one run folder: merge, analyze, check."""
    m = add_verb(sub, "merge", cmd_merge)
    m.add_argument("run", help="the --out folder the shards were written under")
    add_no_report(m, "after merging")

    n = add_verb(sub, "analyze", cmd_analyze)
    n.add_argument("run", help="run directory")
    n.add_argument(
        "--allow-partial",
        action="store_true",
        help="report on the verified chunks of an incomplete or damaged run (the summary says so); "
        "default: refuse, saying how to repair",
    )

    k = add_verb(sub, "check", cmd_check)
    k.add_argument("run", help="run directory (or a folder of shard-i-of-n runs)")


def _add_compare(sub: Any) -> None:
    c = add_verb(
        sub,
        "compare",
        cmd_compare,
        epilog="panel file (YAML; paths relative to the file):\n"
        "  runs:\n"
        "    - {run: runs/q8, name: Qwen3-8B, model: Qwen3-8B, reasoning: false}\n"
        "    - {run: runs/q8-think, name: Qwen3-8B think, model: Qwen3-8B, reasoning: true}\n"
        "  humans: humans.csv        # optional, per-item human rates (battery)\n"
        "  attributes: attrs.csv     # optional, one row per model (cue visibility)\n\n"
        "example:\n  probe compare runs/q8 runs/q8-think --out runs/compare-q8\n"
        "  probe compare --panel panel.yaml --out runs/panel",
    )
    c.add_argument("runs", nargs="*", help="run folders (the --out of `probe run`)")
    c.add_argument("--panel", help="a panel file listing runs with names and reasoning flags (instead of RUNS)")
    c.add_argument("--names", help="display names for RUNS, comma-separated, in order (default: from the manifests)")
    c.add_argument("--humans", help="CSV of per-item human choice rates or ratings, shown beside the models")
    c.add_argument("--attributes", help="CSV with one row per model (column `model` + numeric attributes)")
    c.add_argument("--out", required=True, help="folder for the comparison report (created)")
    c.add_argument(
        "--n-boot",
        type=int,
        default=None,
        help="bootstrap resamples of every CI (default: the experiment's, 1000-2000)",
    )
    c.add_argument("--seed", type=int, default=None, help="seed of the bootstrap (default: 0)")
    c.add_argument(
        "--asym-model",
        choices=("crossed", "nested"),
        default=None,
        help="influence panels: headline random-effect structure of the |Asym| fit (default: crossed; both are "
        "reported)",
    )
    c.add_argument(
        "--decision",
        choices=("greedy", "expected"),
        default=None,
        help="cue panels: greedy decisions (default, the paper's temperature 0) or expected decisions",
    )
    c.add_argument("--quiet", action="store_true", help="do not print the summary")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ReportError as e:  # a bug in a report section, not in the arguments: status 1, not 2
        note = "; the run's results are stored: `probe analyze` on its folder writes the report again" * (
            args.verb == "run"
        )
        print(escape_controls(f"probe {args.verb}: error: {e}{note}"), file=sys.stderr)
        return 1
    # ProbeError: every error of the project; ValueError / FileNotFoundError: bad arguments and missing files
    # caught where the standard library or a dependency raises them (a malformed --options, an absent --out)
    except (ProbeError, ValueError, FileNotFoundError) as e:
        print(escape_controls(f"probe {args.verb}: error: {e}"), file=sys.stderr)  # messages quote untrusted text
        return 2
    except BrokenPipeError:  # e.g. `probe readout ... | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(
            f"probe {args.verb}: interrupted; committed chunks are kept, re-run the same command to resume",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
