"""``probe import``: per-condition influence-audit results from anywhere, as a run that analyze and compare read.

The schema (one CSV row per condition; column names as written, extra columns ignored):

=================  ==========================================================================
``model``          the model (any text)
``reasoning``      reasoning mode: true/false, on/off, yes/no, 1/0
``benchmark``      ``triage``, ``bbq`` or ``dd``
``factor``         the sub-experiment / scenario pair / value (this project's ``pair``)
``level_a``        side A (e.g. ``young``)
``level_b``        side B (e.g. ``old``)
``influence``      the influence type (e.g. ``survey``)
``variant``        optional: ``cue`` (default), ``placebo`` or ``negated``
``kind``           optional: ``sentence``, ``system``, ``turns``; default ``unspecified``
``position``       optional (default ``default``); ``bracket`` optional (default ``none``)
=================  ==========================================================================

and, per row, **either** the counts ``c_0_A, c_0_B, c_A_A, c_A_B, c_B_A, c_B_B``
(``c_<arm>_<side>``: answers choosing that side with no cue (0), with the cue
toward A and with the cue toward B) **or** the frequencies ``f_0_B, f_A_B,
f_B_B`` (share choosing B per arm) with the arm sizes ``n_0, n_A, n_B``, or
with bounds ``n_<arm>_min`` / ``n_<arm>_max`` where the exact sizes are not
published. A row may give both; then the counts must reproduce the
frequencies.

**Counts from frequencies.** A frequency printed with ``d`` decimals is the
rounding of ``k / n``; the candidates of an arm are every ``(n, k)`` with ``n``
in the given size (or bounds) and ``|k / n - f| <= 10^-d / 2``, computed with
exact fractions (``0.3333333333333333`` is 1/3 at 16 decimals). One candidate:
it is the count. None: the row is bad. Several: the row is **ambiguous**; it
is left out of the run, listed in ``ambiguous.csv`` and in the report, and
never guessed.

**Bad rows.** Every problem is one line ``FILE: line N: field F: problem;
fix`` (line N of the file, the header being line 1), all of them reported
before anything is written.

**The run.** ``probe import FILE --out RUN`` writes a run folder of experiment
``influence-import``: ``manifest.json`` with ``provenance.kind = "imported"``
(source path, its SHA-256, row counts), and one result table
``imported_conditions`` (the normalized counts). ``probe analyze RUN`` writes
the same condition table, effects, headline and per-model tables as a native
run, from counts (exact binomial, two-proportion z, Wald Asym with the
baseline counted four times, BH-FDR within benchmark x variant x family), and
the |Asym| ~ |baseline bias| fits. Condition-level data has no items, so no
item-level bootstrap is computed: the per-condition CI columns are absent and
the headline CIs are a cluster bootstrap over (model x reasoning, factor)
clusters, said so in the report.

:func:`export_conditions` writes a sampled run of this project in the schema
(counts), which is how the round trip is tested.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from probe.errors import ProbeError
from probe.record import Manifest
from probe.runs import Run, open_run

EXPERIMENT = "influence-import"
TABLE = "imported_conditions"
KEYS = ("model", "reasoning", "benchmark", "factor", "level_a", "level_b", "influence")
OPTIONAL = {"variant": "cue", "kind": "unspecified", "position": "default", "bracket": "none"}
COUNTS = ("c_0_A", "c_0_B", "c_A_A", "c_A_B", "c_B_A", "c_B_B")
FREQS = ("f_0_B", "f_A_B", "f_B_B")
ARM_NAMES = ("0", "A", "B")
VARIANTS = ("cue", "placebo", "negated")
_TRUE = {"true", "on", "yes", "1"}
_FALSE = {"false", "off", "no", "0"}
MAX_SIZE = 1_000_000
"""Largest arm size (or upper bound) accepted: the candidate search is linear in the bound."""


class ConditionImportError(ProbeError, ValueError):
    """Rows that cannot be imported; the message has one line per problem (file, line, field, fix)."""


@dataclass(frozen=True)
class Problem:
    """One bad field of one row."""

    line: int
    field: str
    message: str

    def text(self, source: str) -> str:
        return f"{source}: line {self.line}: field {self.field}: {self.message}"


@dataclass(frozen=True)
class Ambiguous:
    """A row whose frequencies more than one set of counts reproduces."""

    line: int
    arm: str
    candidates: tuple[tuple[int, int], ...]
    """(n, k) pairs that round to the printed frequency (the first few)."""
    count: int
    """How many candidates there are in all."""


@dataclass(frozen=True)
class Parsed:
    """The rows of an import: the normalized counts, the ambiguous rows and the bad fields."""

    table: pd.DataFrame
    ambiguous: tuple[Ambiguous, ...]
    problems: tuple[Problem, ...]


# ============================================================================ counts from frequencies
def decimals(text: str) -> int:
    """Decimals a frequency was printed with: ``0.25`` -> 2, ``1`` -> 0, ``2.5e-1`` -> 2."""
    exp = Decimal(text.strip()).as_tuple().exponent
    if not isinstance(exp, int):
        raise ValueError(f"{text!r} is not a finite number")
    return max(0, -exp)


def count_candidates(freq: str, n_min: int, n_max: int) -> list[tuple[int, int]]:
    """Every ``(n, k)``, ``n_min <= n <= n_max``, ``0 <= k <= n``, with ``k / n`` rounding to ``freq``.

    ``freq`` is the frequency as printed; it rounds ``k / n`` to its own number
    of decimals ``d`` when ``|k / n - f| <= 10^-d / 2`` (both halves included:
    the rounding rule of the publisher is unknown). Exact fractions, no floats.
    """
    if n_min < 1 or n_max < n_min:
        raise ValueError(f"arm size bounds must satisfy 1 <= min <= max, got [{n_min}, {n_max}]")
    f = Fraction(freq.strip())
    if not 0 <= f <= 1:
        raise ValueError(f"a frequency must lie in [0, 1], got {freq}")
    tol = Fraction(1, 2 * 10 ** decimals(freq))
    out: list[tuple[int, int]] = []
    for n in range(n_min, n_max + 1):
        lo = max(0, math.ceil((f - tol) * n))
        hi = min(n, math.floor((f + tol) * n))
        out.extend((n, k) for k in range(lo, hi + 1))
    return out


# ============================================================================ parsing
def _int(text: str) -> int:
    """A non-negative integer written as ``12`` or ``12.0``; ValueError otherwise."""
    try:
        d = Decimal(text.strip())
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a number") from None
    if not d.is_finite() or d != d.to_integral_value() or d < 0:
        raise ValueError(f"{text!r} is not a non-negative whole number")
    return int(d)


def _reasoning(text: str) -> bool:
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError(f"{text!r} is not a reasoning flag; write true/false, on/off, yes/no or 1/0")


def _given(row: Mapping[str, str], col: str) -> bool:
    return col in row and str(row[col]).strip() != ""


def _sizes(row: Mapping[str, str], arm: str) -> tuple[int, int] | None:
    """The arm's size bounds: ``n_<arm>`` (exact) or ``n_<arm>_min``/``n_<arm>_max``; None if neither."""
    if _given(row, f"n_{arm}"):
        n = _int(row[f"n_{arm}"])
        return n, n
    if _given(row, f"n_{arm}_min") and _given(row, f"n_{arm}_max"):
        return _int(row[f"n_{arm}_min"]), _int(row[f"n_{arm}_max"])
    return None


def _row_counts(row: Mapping[str, str], line: int) -> tuple[dict[str, int] | None, list[Problem], list[Ambiguous]]:
    """The six counts of one row (``n0, k0, nA, kA, nB, kB``, k = answers choosing B), or the reasons why not."""
    problems: list[Problem] = []
    has_counts = [c for c in COUNTS if _given(row, c)]
    has_freqs = [c for c in FREQS if _given(row, c)]
    if has_counts and len(has_counts) < len(COUNTS):
        missing = [c for c in COUNTS if c not in has_counts]
        return None, [Problem(line, missing[0], f"missing; a row with counts gives all of {', '.join(COUNTS)}")], []
    if not has_counts and len(has_freqs) < len(FREQS):
        missing = [c for c in FREQS if c not in has_freqs]
        what = "missing" if has_freqs else "missing (the row has neither counts nor frequencies)"
        fix = f"give all of {', '.join(COUNTS)}, or all of {', '.join(FREQS)} with n_0, n_A, n_B (or n_<arm>_min/max)"
        return None, [Problem(line, missing[0], f"{what}; {fix}")], []
    out: dict[str, int] = {}
    if has_counts:
        for arm in ARM_NAMES:
            try:
                a, b = _int(row[f"c_{arm}_A"]), _int(row[f"c_{arm}_B"])
            except ValueError as e:  # untrusted input: parsing a cell of the imported CSV
                bad = f"c_{arm}_A" if not _is_int(row[f"c_{arm}_A"]) else f"c_{arm}_B"
                problems.append(Problem(line, bad, f"{e}; counts are answers choosing that side"))
                continue
            if a + b == 0:
                problems.append(Problem(line, f"c_{arm}_A", f"arm {arm} has no answers (c_{arm}_A + c_{arm}_B = 0)"))
                continue
            out[f"n{arm}"], out[f"k{arm}"] = a + b, b
        for arm in ARM_NAMES if not problems else ():
            col = f"f_{arm}_B"
            if _given(row, col):  # both given: the counts must reproduce the printed frequency
                n, k = out[f"n{arm}"], out[f"k{arm}"]
                try:
                    ok = (n, k) in count_candidates(row[col], n, n)
                except (ValueError, ArithmeticError) as e:  # untrusted input: parsing a cell of the imported CSV
                    problems.append(Problem(line, col, str(e)))
                    continue
                if not ok:
                    problems.append(
                        Problem(line, col, f"{row[col]} is not what the counts give ({k}/{n}); fix one of them")
                    )
        return (out if not problems else None), problems, []
    ambiguous: list[Ambiguous] = []
    for arm in ARM_NAMES:
        col = f"f_{arm}_B"
        try:
            bounds = _sizes(row, arm)
        except ValueError as e:  # untrusted input: parsing a cell of the imported CSV
            problems.append(Problem(line, f"n_{arm}", str(e)))
            continue
        if bounds is None:
            problems.append(
                Problem(line, f"n_{arm}", f"missing; frequencies need n_{arm} or n_{arm}_min and n_{arm}_max")
            )
            continue
        if bounds[1] > MAX_SIZE:
            problems.append(Problem(line, f"n_{arm}", f"upper bound {bounds[1]} exceeds {MAX_SIZE}"))
            continue
        try:
            cands = count_candidates(row[col], *bounds)
        except (ValueError, ArithmeticError) as e:  # untrusted input: parsing a cell of the imported CSV
            problems.append(Problem(line, col, str(e)))
            continue
        if not cands:
            where = f"n = {bounds[0]}" if bounds[0] == bounds[1] else f"any n in [{bounds[0]}, {bounds[1]}]"
            problems.append(
                Problem(
                    line, col, f"{row[col]} is not k/n for {where} at {decimals(row[col])} decimals; check the sizes"
                )
            )
        elif len(cands) > 1:
            ambiguous.append(Ambiguous(line, arm, tuple(cands[:5]), len(cands)))
        else:
            out[f"n{arm}"], out[f"k{arm}"] = cands[0]
    if problems or ambiguous:
        return None, problems, ambiguous
    return out, [], []


def _is_int(text: str) -> bool:
    try:
        _int(text)
    except ValueError:  # untrusted input: parsing a cell of the imported CSV
        return False
    return True


def parse_rows(frame: pd.DataFrame) -> Parsed:
    """Normalize a schema frame (all columns as text, rows in file order) into counts; line N = row N - 2."""
    from experiments.influence.effects import BENCHMARKS

    missing = [c for c in KEYS if c not in frame.columns]
    if missing:
        return Parsed(
            pd.DataFrame(), (), (Problem(1, missing[0], f"column missing from the header; need {', '.join(KEYS)}"),)
        )
    rows, problems, ambiguous = [], [], []
    for i, raw in enumerate(frame.to_dict("records")):
        line = i + 2
        row = {k: ("" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)) for k, v in raw.items()}
        bad = False
        for col in KEYS:
            if not row[col].strip():
                problems.append(Problem(line, col, "empty; every row names its condition"))
                bad = True
        rec: dict[str, Any] = {c: row[c].strip() for c in KEYS}
        try:
            rec["reasoning"] = _reasoning(row["reasoning"]) if row["reasoning"].strip() else False
        except ValueError as e:  # untrusted input: parsing a cell of the imported CSV
            problems.append(Problem(line, "reasoning", str(e)))
            bad = True
        bench = rec["benchmark"].lower()
        if rec["benchmark"] and bench not in BENCHMARKS:
            problems.append(Problem(line, "benchmark", f"{rec['benchmark']!r} is not one of {', '.join(BENCHMARKS)}"))
            bad = True
        rec["benchmark"] = bench
        for col, default in OPTIONAL.items():
            rec[col] = row.get(col, "").strip() or default
        if rec["variant"] not in VARIANTS:
            problems.append(Problem(line, "variant", f"{rec['variant']!r} is not one of {', '.join(VARIANTS)}"))
            bad = True
        counts, probs, amb = _row_counts(row, line)
        problems.extend(probs)
        ambiguous.extend(amb)
        if counts is not None and not bad:
            rows.append({**rec, **counts, "line": line})
    table = pd.DataFrame(rows, columns=[*KEYS, *OPTIONAL, "n0", "k0", "nA", "kA", "nB", "kB", "line"])
    key = [*KEYS, *OPTIONAL]
    first_line: dict[tuple[Any, ...], int] = {}
    for cond, line in zip(table[key].itertuples(index=False, name=None), table["line"], strict=True):
        if cond in first_line:
            msg = f"repeats the condition of line {first_line[cond]}; one row per condition"
            problems.append(Problem(int(line), "factor", msg))
        else:
            first_line[cond] = int(line)
    return Parsed(table, tuple(ambiguous), tuple(sorted(problems, key=lambda p: p.line)))


def read_schema(path: str | Path) -> Parsed:
    """Read and normalize a schema CSV; raise :class:`ConditionImportError` listing every bad field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; give the CSV of per-condition results")
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    parsed = parse_rows(frame)
    if parsed.problems:
        raise ConditionImportError("\n".join(p.text(str(path)) for p in parsed.problems))
    return parsed


# ============================================================================ the run
def _label(model: str, think: bool) -> str:
    return f"{model} / reasoning {'on' if think else 'off'}"


def import_run(path: str | Path, out: str | Path) -> tuple[Any, Parsed]:
    """Write the imported run folder ``out`` from the schema CSV ``path``; returns (store, parsed)."""
    import datetime

    from probe.files import atomic_write_text
    from probe.store import RunStore, run_key

    path = Path(path)
    parsed = read_schema(path)
    if parsed.table.empty:
        raise ConditionImportError(
            f"{path}: no row could be imported ({len(parsed.ambiguous)} ambiguous); nothing to analyze"
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    identity = {"experiment": EXPERIMENT, "source_sha256": digest}
    t = parsed.table
    provenance = {
        "kind": "imported",
        "source": str(path.resolve()),
        "source_sha256": digest,
        "rows": int(len(t) + len({a.line for a in parsed.ambiguous})),
        "imported_rows": len(t),
        "ambiguous_rows": sorted({a.line for a in parsed.ambiguous}),
        "imported_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "models": sorted({_label(m, bool(r)) for m, r in zip(t["model"], t["reasoning"], strict=True)}),
        "benchmarks": sorted(set(t["benchmark"])),
    }
    models = sorted(set(t["model"]))
    modes = sorted(set(map(bool, t["reasoning"])))
    manifest = Manifest.build(
        run_key=run_key(identity),
        identity=identity,
        experiment=EXPERIMENT,
        spec={"source": str(path)},
        n_trials=0,
        provenance=provenance,
        engine={
            "engine": "imported",
            "settings": {
                "model": models[0] if len(models) == 1 else f"{len(models)} models (imported)",
                **({"think": modes[0]} if len(modes) == 1 else {}),  # the panel's reasoning flag, when one mode
            },
        },
    )
    store = RunStore.open(Path(out), manifest, [])
    store.update_manifest({"provenance": provenance})
    table = {TABLE: t.assign(reasoning=t["reasoning"].astype(bool))}
    store.write_chunk(0, table, trials=(0, 0))  # an imported run has no trials: its one chunk spans none
    atomic_write_text(store.root / "ambiguous.csv", ambiguous_frame(parsed.ambiguous).to_csv(index=False))
    return store, parsed


def ambiguous_frame(amb: Sequence[Ambiguous]) -> pd.DataFrame:
    """One row per ambiguous (line, arm): how many (n, k) candidates and the first few."""
    return pd.DataFrame(
        [
            {
                "line": a.line,
                "arm": a.arm,
                "candidates": a.count,
                "first": "; ".join(f"{k}/{n}" for n, k in a.candidates),
            }
            for a in amb
        ],
        columns=["line", "arm", "candidates", "first"],
    )


def is_imported(manifest: Manifest) -> bool:
    return manifest.experiment == EXPERIMENT and manifest.imported


def imported_conditions(run: Run, label: str | None = None) -> pd.DataFrame:
    """The per-condition table of an imported run, in the columns of a native ``conditions.csv`` (before FDR).

    ``label`` (default: the run folder) prefixes the cluster label; the ``run``
    column is ``<run>:<model> / reasoning on|off`` so the headline's cluster
    bootstrap resamples (model x reasoning, factor) clusters.
    """
    from experiments.influence import stats as st
    from experiments.influence.effects import metrics

    man = run.manifest
    if not is_imported(man):
        raise ValueError(f"{run.root} is not an imported run (experiment {man.experiment!r})")
    t = run.load(TABLE)
    if t.empty:
        raise ValueError(f"{run.root}: the imported table is empty; re-run `probe import`")
    n = np.stack([t[f"n{a}"].to_numpy(float) for a in ARM_NAMES])
    k = np.stack([t[f"k{a}"].to_numpy(float) for a in ARM_NAMES])
    est = metrics(n, k)
    out = pd.DataFrame(
        {
            "pair": t["factor"].astype(str),
            "group_a": t["level_a"].astype(str),
            "group_b": t["level_b"].astype(str),
            **{c: t[c].astype(str) for c in ("influence", "variant", "kind", "position", "bracket")},
            "n_items": np.nan,
        }
    )
    for c, name in enumerate(ARM_NAMES):
        out[f"n{name}"], out[f"k{name}"] = n[c], k[c]
    for key, v in est.items():
        out[key] = v
    _, var, _, p_wald = st.wald_asym(k[0], n[0], k[1], n[1], k[2], n[2])
    out["asym_var"] = var
    out["test_basis"] = "counts"
    out["p_baseline"] = st.binom_test_half(k[0], n[0])
    out["p_delta_A"] = st.two_proportion_z(n[1] - k[1], n[1], n[0] - k[0], n[0])[1]
    out["p_delta_B"] = st.two_proportion_z(k[2], n[2], k[0], n[0])[1]
    out["p_asym"] = p_wald
    # the reading that treats s(A) and s(B) as independent counts the baseline twice, not four times: shown for
    # comparison with analyses that used it (it rejects too often)
    var2 = var - 2.0 * st.log_odds_var(k[0], n[0])
    with np.errstate(invalid="ignore", divide="ignore"):
        out["p_asym_2x"] = st.z_pvalue(out["asym"].to_numpy() / np.sqrt(var2))
    out["f0_ci_lo"], out["f0_ci_hi"] = st.wilson_interval(k[0], n[0])
    prefix = label if label is not None else str(run.root)
    think = t["reasoning"].astype(bool).to_numpy()
    out["benchmark"] = t["benchmark"].astype(str)
    out["model"] = t["model"].astype(str)
    out["think"] = think
    out["run"] = [f"{prefix}:{_label(m, bool(r))}" for m, r in zip(t["model"], think, strict=True)]
    out["source"] = "imported"
    out["line"] = t["line"].to_numpy()
    return out


# ============================================================================ export (the round trip)
def export_frame(conditions: pd.DataFrame) -> pd.DataFrame:
    """A condition table with counts (``n0, k0, ...``, ``benchmark``, ``model``, ``think``) in the import schema."""
    if (conditions.get("test_basis") == "bootstrap").any():
        raise ValueError(
            "a logit (readout) run has probabilities, not counts; export a sampled run "
            "(probe run ... --samples N --no-readout)"
        )
    c = conditions
    out = pd.DataFrame(
        {
            "model": c["model"].astype(str),
            "reasoning": np.where(c["think"].astype(bool), "true", "false"),
            "benchmark": c["benchmark"].astype(str),
            "factor": c["pair"].astype(str),
            "level_a": c["group_a"].astype(str),
            "level_b": c["group_b"].astype(str),
            **{col: c[col].astype(str) for col in ("influence", "variant", "kind", "position", "bracket")},
        }
    )
    for arm in ARM_NAMES:
        n, k = c[f"n{arm}"].to_numpy(float), c[f"k{arm}"].to_numpy(float)
        if not (np.all(n == np.round(n)) and np.all(k == np.round(k))):
            raise ValueError(f"arm {arm} has non-integer counts; only sampled runs export to the counts schema")
        out[f"c_{arm}_A"], out[f"c_{arm}_B"] = (n - k).astype(int), k.astype(int)
    return out


def export_conditions(run: str | Path, path: str | Path) -> pd.DataFrame:
    """Write a sampled run's per-condition counts to ``path`` in the import schema; returns the frame."""
    from analysis.influence import audit as inf
    from probe.files import atomic_write_text

    source = open_run(run)
    experiment = source.manifest.experiment
    bench = {"influence-triage": "triage", "influence-bbq": "bbq", "influence-dd": "dd"}.get(experiment)
    if bench is None:
        raise ValueError(f"{source.root} is a {experiment!r} run; only influence runs export to the condition schema")
    frame = export_frame(inf.analyze(source, bench, n_boot=2).conditions)
    atomic_write_text(Path(path), frame.to_csv(index=False))
    return frame


# ============================================================================ report
