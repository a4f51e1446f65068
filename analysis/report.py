"""Write a run's report: CSV tables and a Markdown summary under ``RUN/report/``."""

from __future__ import annotations

from pathlib import Path

from analysis.battery import yesno
from analysis.common.frames import choice_probs, open_run
from analysis.common.report import report_files, write_summary
from analysis.common.tables import md_table
from probe.errors import StoreError
from probe.files import atomic_write_text
from probe.store import RunStore


def yesno_report(store: RunStore, out: Path) -> list[Path]:
    """Per-dilemma P(CBR) cells and the lexical / order decomposition, as CSV and Markdown."""
    man = store.manifest()
    opts, per_trial, source = choice_probs(store)
    pc = yesno.p_cbr(opts)
    with_verb = yesno.with_cbr_verb(per_trial, opts)
    cells = yesno.cell_table(with_verb, pc)
    dropped = yesno.dropped_stories(with_verb, pc)
    dec = yesno.decompose(cells)
    table = cells.join(dec)
    table.loc["mean"] = table.mean(numeric_only=True)
    cov = per_trial.groupby("item_id")["coverage"].mean()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "yesno_by_item.csv", table.to_csv(float_format="%.6f"))
    short = table[
        [
            "p_cbr_approve_yes_first",
            "p_cbr_approve_no_first",
            "p_cbr_oppose_yes_first",
            "p_cbr_oppose_no_first",
            "z",
            "lexical",
            "order",
            "apparent",
        ]
    ]
    short.columns = ["P approve yf", "P approve nf", "P oppose yf", "P oppose nf", "z", "lexical", "order", "apparent"]
    short.index.name = "dilemma"
    eng = man.get("engine", {})
    lines = [
        f"# yes/no battery: {eng.get('settings', {}).get('model', '?')}",
        "",
        f"- run: `{store.root}`, {man.get('n_trials')} trials, run key `{man.get('run_key')}`",
        f"- engine {eng.get('engine', '?')}, model `{eng.get('model_path')}`"
        + "".join(f", {eng[k]}" for k in ("model_class", "dtype", "device") if eng.get(k)),
        f"- think mode: {eng.get('settings', {}).get('think')}; forms: {', '.join(man['spec'].get('forms', []))}",
        f"- probabilities from: {source}"
        + (
            f" ({man['plan']['samples']} samples per trial at T = {man['plan']['temperature']})"
            if source == "samples"
            else ""
        ),
        f"- mean option coverage ({'option mass at the answer slot' if source == 'readout' else 'share of parsed answers'}): "
        f"{cov.mean():.3f} (min over dilemmas {cov.min():.3f})",
        "",
        "P = P(cost-benefit answer) per verb x printed order cell, averaged over wording forms; approve:",
        "yes endorses the cost-benefit pole, oppose: yes rejects it; yf / nf: yes / no printed first.",
        "z = mean(2P - 1) is the story's stance; lexical = pull toward the",
        "word yes (negative: toward no); order = pull toward the first-printed option; apparent = lexical + order.",
        "",
        md_table(short, "{:+.3f}", nan=None, index=True, iterrows=True),
        "",
    ]
    if dropped:
        lines += [
            f"Dropped stories ({len(dropped)}): a cell with no usable answer has no P(CBR), so the story has no "
            "balanced split.",
            "",
            *(f"- {d.item_id}: {d.reason}" for d in dropped),
            "",
        ]
    if per_trial["replicate"].nunique() > 1:
        sd = yesno.salt_noise(per_trial, pc)
        lines += [
            f"Salt noise floor: median within-form SD of P(CBR) over {per_trial['replicate'].nunique()} "
            f"replicates = {sd.median():.4f} (max {sd.max():.4f}).",
            "",
        ]
        atomic_write_text(out / "yesno_salt_noise.csv", sd.to_frame().to_csv(float_format="%.6f"))
    write_summary(out, "\n".join(lines))
    return report_files(out)


def write_report(run: str | Path, *, allow_partial: bool = False) -> list[Path]:
    """Write ``RUN/report/`` for whatever experiment the run holds; returns the files written.

    A store with a damaged or missing chunk is refused (``StoreError``) unless
    ``allow_partial``; then the report covers the verified chunks and its
    summary starts by saying so.
    """
    from experiments import get_experiment

    store = open_run(run)
    integrity = store.integrity()
    if not integrity.complete and not allow_partial:
        raise StoreError(integrity.refusal())
    store = RunStore(store.root, allow_partial=allow_partial)
    experiment = store.manifest().get("experiment")
    out = store.root / "report"
    paths = get_experiment(str(experiment)).report(store, out)
    paths = paths + append_checks(store, out)
    summary = out / "summary.md"
    if not integrity.complete and summary.exists():
        atomic_write_text(summary, "\n".join(integrity.partial_header()) + "\n" + summary.read_text())
    return paths


def append_checks(store: RunStore, out: Path) -> list[Path]:
    """Append "What the numbers rest on" (:mod:`analysis.common.checks`) to ``summary.md``; write its CSV tables."""
    from analysis.common import checks
    from analysis.common.frames import trial_meta

    trials = store.trials()
    lines, tables = checks.checks_section(
        store.manifest(),
        store.load("readout_trials"),
        trial_meta(trials),
        store.load("samples"),
        store.load("generations"),
        {t.trial_id: t.options for t in trials},
        store.load("readout_options"),
    )
    summary = out / "summary.md"
    head = summary.read_text().rstrip("\n") + "\n\n" if summary.exists() else ""
    atomic_write_text(summary, head + "\n".join(lines))
    written = []
    for stem, table in tables.items():
        atomic_write_text(out / f"{stem}.csv", table.to_csv(float_format="%.6f"))
        written.append(out / f"{stem}.csv")
    return written
