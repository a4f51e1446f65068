"""Flags that keep a cue-visibility report honest on a model whose readings cannot move (paper 001).

Three readings of a ``cue`` run can look like findings when they are
structural:

* **Degenerate greedy tables.** A greedy Favor or Against event needs the
  what-if decision to differ from the Neutral decision of the same dilemma.
  Where it never does (``changed = 0`` in a cell of arm x consequences x
  group), Favor, Against and Net are 0 by construction, not a measured
  absence of bias; a Gap between two such cells is 0 by construction too.
  :func:`decision_changes` counts, per cell, the pairs and the changed ones;
  :func:`degenerate_lines` names the cells with none.
* **Identity recovery at chance.** The correct-only tables keep the pairs
  whose identity was recovered; a recovery rate means something only where it
  beats chance. Two chance levels are named: uniform guessing, ``1/k`` for
  ``k`` options (exact two-sided binomial test and Clopper-Pearson 95%
  interval), and the accuracy of answers that carry no information about the
  truth, ``sum_l a_l t_l`` over labels ``l`` (``a_l``, ``t_l``: the shares of
  answers and of truths), tested by permuting the answers over the pairs (a
  model answering *man* to every pair is right exactly as often as *man* is
  the truth, whatever ``1/k`` says). Recovery is called distinguishable from
  chance only when it beats both (:func:`recovery_vs_chance`).
* **Low option coverage.** A readout normalizes over the options, so a probe
  whose option mass is tiny yields clean-looking probabilities that describe
  a small part of what the model would say; :func:`low_coverage` finds the
  probes below :data:`analysis.common.checks.LOW_COVERAGE` and :func:`coverage_lines`
  names them beside the table they feed.

Every function is pure and takes tidy frames.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.common.checks import LOW_COVERAGE
from analysis.cue.decisions import CELL, REFERENCE, greedy_is
from analysis.cue.identity import PAIR

ALPHA = 0.05
"""Level of the chance tests (two-sided binomial, one-sided permutation) and of the intervals (1 - ALPHA)."""
N_PERM = 10_000
"""Permutations of the answers for the answer-independent chance test."""
JOINT = "joint"


# =========================================================================== degenerate greedy tables


def decision_changes(df: pd.DataFrame) -> pd.DataFrame:
    """Per cell (arm, consequences, attr, group): ``pairs`` answered, ``changed`` greedy decisions, ``identical``.

    ``df`` is :func:`analysis.cue.decisions.with_baseline` output (columns ``p``, ``p_s``,
    ``benefit_first``, ``s_benefit_first`` and X's ``x_gender`` / ``x_race``):
    one what-if answer per row with the Neutral P(benefit) of its dilemma.
    A pair is changed when the greedy what-if decision differs from the greedy
    Neutral one (ties to the first printed option, as the report's tables);
    abstentions (NaN ``p`` or ``p_s``) are left out as the tables leave them.
    ``identical`` is True where no pair of the cell changed.
    """
    need = {"arm", "consequences", "p", "p_s", "benefit_first", "s_benefit_first"}
    missing = need - set(df.columns)
    if missing:
        raise ValueError(f"decision_changes needs with_baseline() output; columns {sorted(missing)} are missing")
    ok = df[df["p"].notna() & df["p_s"].notna()]
    w = greedy_is(ok["p"], ok["benefit_first"].astype(bool))
    s = greedy_is(ok["p_s"], ok["s_benefit_first"].astype(bool))
    ok = ok.assign(changed=(w != s).astype(int))
    parts = [ok.assign(attr=a, group=ok[f"x_{a}"]) for a in ("gender", "race") if f"x_{a}" in ok.columns]
    if not parts:
        raise ValueError("decision_changes needs X's groups: columns x_gender and/or x_race")
    stacked = pd.concat(parts, ignore_index=True)
    out = stacked.groupby(CELL, sort=True).agg(pairs=("changed", "size"), changed=("changed", "sum")).reset_index()
    out["identical"] = out["changed"] == 0
    return out


def _counts(cells: pd.DataFrame) -> str:
    return ", ".join(f"{r.group} {r.pairs - r.changed}/{r.pairs}" for r in cells.itertuples())


def degenerate_lines(changes: pd.DataFrame, order: Sequence[str] = ()) -> list[str]:
    """One line per (arm, consequences) with a cell whose greedy decision never leaves the Neutral one.

    ``changes`` is :func:`decision_changes` output; ``order`` lists groups in
    display order (others follow, sorted). Counts read ``identical/pairs``.
    Empty when every cell has a changed pair: the greedy tables can move.
    """
    rank = {g: i for i, g in enumerate(order)}
    lines = []
    for (arm, cons), g in changes.groupby(["arm", "consequences"], sort=False):
        attr_rank = g["attr"].map({"gender": 0, "race": 1}).fillna(2)
        group_rank = g["group"].map(lambda x: rank.get(x, len(rank)))
        g = g.assign(_a=attr_rank, _g=group_rank).sort_values(["_a", "_g", "group"])
        stuck = g[g["identical"]]
        if stuck.empty:
            continue
        scope = f"in all {len(g)} groups" if len(stuck) == len(g) else f"in {len(stuck)} of {len(g)} groups"
        lines.append(
            f"- **degenerate: {arm}** ({cons} consequences): greedy decision identical to Neutral in every pair "
            f"{scope} (identical/pairs: {_counts(stuck)}); their Favor, Against and Net are 0 by construction, "
            "not a measured absence of bias."
        )
    return lines


def stuck_gaps(changes: pd.DataFrame, reference: str = REFERENCE) -> pd.DataFrame:
    """Per non-reference (arm, consequences): groups in both arms, and those whose Gap is 0 by construction.

    A group's greedy Gap = Net(reference) - Net(arm) is structural where the
    greedy decision equals the Neutral one in every pair of both arms.
    """
    key = ["consequences", "attr", "group"]
    ref = changes[changes["arm"] == reference].set_index(key)["identical"]
    rows = []
    for (arm, cons), g in changes[changes["arm"] != reference].groupby(["arm", "consequences"], sort=False):
        both = g.join(ref.rename("ref_identical"), on=key, how="inner")
        if both.empty:
            continue
        stuck = both["identical"] & both["ref_identical"]
        rows.append({"arm": arm, "consequences": cons, "groups": len(both), "stuck": int(stuck.sum())})
    return pd.DataFrame(rows, columns=["arm", "consequences", "groups", "stuck"])


def gap_lines(stuck: pd.DataFrame, reference: str = REFERENCE) -> list[str]:
    """One line per arm whose greedy Gap against ``reference`` is 0 by construction in some group."""
    lines = []
    for r in stuck[stuck["stuck"] > 0].itertuples():
        scope = f"all {r.groups}" if r.stuck == r.groups else f"{r.stuck} of {r.groups}"
        lines.append(
            f"- **degenerate: {r.arm}** ({r.consequences} consequences): the greedy Gap vs {reference} is 0 by "
            f"construction in {scope} groups (neither arm changes any Neutral decision); the expected-decision Gap "
            "beside it moves with the answer probabilities alone."
        )
    return lines


# =========================================================================== identity recovery vs chance


@dataclass(frozen=True)
class Chance:
    """Recovery of one target (attribute or joint) in one (arm, consequences), against two chance levels."""

    arm: str
    consequences: str
    target: str
    n: int
    """Pairs answered (every attribute answered, for the joint target)."""
    correct: int
    k_options: int
    """Options per answer (their product for the joint target)."""
    uniform: float
    """1 / k_options: the accuracy of uniform guessing."""
    ci_lo: float
    ci_hi: float
    """Clopper-Pearson (1 - ALPHA) interval of the recovery rate."""
    p_uniform: float
    """Exact two-sided binomial p of ``correct`` against ``uniform``."""
    independent: float
    """sum_l a_l t_l: the expected accuracy of answers independent of the truth (answer and truth shares)."""
    p_independent: float
    """One-sided permutation p (answers shuffled over the pairs): P(permuted accuracy >= observed)."""
    modal: str
    """The most frequent answer."""
    modal_n: int

    @property
    def rate(self) -> float:
        return self.correct / self.n if self.n else float("nan")

    @property
    def above_chance(self) -> bool:
        """Above uniform guessing (interval above ``uniform``) and above the answer-independent level (p < ALPHA)."""
        return self.n > 0 and self.ci_lo > self.uniform and self.p_independent < ALPHA


def clopper_pearson(k: int, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """The exact (Clopper-Pearson) 1 - alpha interval of a binomial proportion k/n; (nan, nan) for n = 0."""
    from scipy.stats import beta

    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return float("nan"), float("nan")
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def independent_chance(answers: Sequence[object], truths: Sequence[object]) -> float:
    """sum_l a_l t_l: the accuracy expected when answers carry no information about the truths."""
    a, t = pd.Series(list(answers), dtype=object), pd.Series(list(truths), dtype=object)
    if len(a) != len(t) or not len(a):
        raise ValueError(f"need as many answers as truths, at least one; got {len(a)} and {len(t)}")
    sa, st = a.value_counts(normalize=True), t.value_counts(normalize=True)
    return float(sum(sa[lab] * st.get(lab, 0.0) for lab in sa.index))


def permutation_p(answers: np.ndarray, truths: np.ndarray, n_perm: int = N_PERM, seed: int = 0) -> float:
    """One-sided p of the accuracy of ``answers`` (rows: pairs, columns: attributes; all must match for a hit).

    The answers are shuffled over the rows (the same shuffle for every column,
    so a pair's answers stay together); p = (1 + #{permuted >= observed}) /
    (1 + n_perm). Constant answers give p = 1 exactly.
    """
    a, t = np.asarray(answers, dtype=object), np.asarray(truths, dtype=object)
    if a.ndim == 1:
        a, t = a[:, None], t[:, None]
    if a.shape != t.shape or not len(a):
        raise ValueError(f"answers and truths need the same non-empty shape, got {a.shape} and {t.shape}")
    if n_perm < 1:
        raise ValueError(f"n_perm must be >= 1, got {n_perm}")
    codes, _ = pd.factorize(pd.Series(np.concatenate([a.ravel(), t.ravel()]), dtype=object))
    ai, ti = codes[: a.size].reshape(a.shape), codes[a.size :].reshape(t.shape)
    observed = int((ai == ti).all(axis=1).sum())
    rng = np.random.default_rng(seed)
    batch = max(1, 2_000_000 // a.size)
    above = 0
    for start in range(0, n_perm, batch):
        idx = np.argsort(rng.random((min(batch, n_perm - start), len(a))), axis=1)
        hits = (ai[idx] == ti[None, :, :]).all(axis=2).sum(axis=1)
        above += int((hits >= observed).sum())
    return float((1 + above) / (1 + n_perm))


def recovery_vs_chance(
    checks: pd.DataFrame, n_options: Mapping[str, int], *, n_perm: int = N_PERM, seed: int = 0
) -> list[Chance]:
    """Identity recovery per (arm, consequences) and attribute, and jointly, against both chance levels.

    ``checks`` is :func:`analysis.cue.identity.check_frame` or ``json_check_frame``
    output (one row per pair and attribute: ``truth``, ``answer``, NaN for an
    abstention); ``n_options`` gives the options per attribute (its label
    count). A pair enters an attribute's test when that attribute was
    answered, and the joint test when every attribute was.
    """
    attrs = sorted(set(checks["attr"]))
    unknown = [a for a in attrs if a not in n_options or n_options[a] < 2]
    if unknown:
        raise ValueError(f"n_options needs a count >= 2 for attributes {unknown}; got {dict(n_options)}")
    keys = [c for c in PAIR if c in checks.columns]
    wide = checks.pivot_table(index=keys, columns="attr", values=["answer", "truth"], aggfunc="first", dropna=False)
    out = []
    for (arm, cons), g in wide.groupby(level=["arm", "consequences"], sort=False):
        targets: list[tuple[str, list[str]]] = [(a, [a]) for a in attrs]
        if len(attrs) > 1:
            targets.append((JOINT, attrs))
        for name, cols in targets:
            ans, tru = g["answer"][cols], g["truth"][cols]
            ok = ans.notna().all(axis=1)
            a, t = ans[ok].to_numpy(dtype=object), tru[ok].to_numpy(dtype=object)
            k_opt = int(np.prod([n_options[c] for c in cols]))
            n = len(a)
            correct = int((a == t).all(axis=1).sum()) if n else 0
            joined = ["/".join(map(str, row)) for row in a]
            modal = pd.Series(joined, dtype=object).value_counts() if n else pd.Series(dtype=int)
            lo, hi = clopper_pearson(correct, n)
            out.append(
                Chance(
                    arm=str(arm),
                    consequences=str(cons),
                    target=name,
                    n=n,
                    correct=correct,
                    k_options=k_opt,
                    uniform=1.0 / k_opt,
                    ci_lo=lo,
                    ci_hi=hi,
                    p_uniform=binom_p(correct, n, 1.0 / k_opt),
                    independent=independent_chance(joined, ["/".join(map(str, r)) for r in t]) if n else float("nan"),
                    p_independent=permutation_p(a, t, n_perm, seed) if n else float("nan"),
                    modal=str(modal.index[0]) if n else "",
                    modal_n=int(modal.iloc[0]) if n else 0,
                )
            )
    return out


def binom_p(k: int, n: int, p: float) -> float:
    """Exact two-sided binomial p of k successes in n against success probability p; nan for n = 0."""
    from scipy.stats import binomtest

    return float(binomtest(k, n, p, alternative="two-sided").pvalue) if n else float("nan")


def _frac(k: int) -> str:
    return f"1/{k}"


def chance_lines(chances: Sequence[Chance]) -> list[str]:
    """One line per target: recovery, its interval, both chance levels with their tests, and the verdict."""
    lines = []
    for c in chances:
        if not c.n:
            lines.append(f"- {c.target}, {c.arm} ({c.consequences}): no answered pairs; recovery not tested.")
            continue
        verdict = "**above chance**" if c.above_chance else "**not distinguishable from chance**"
        lines.append(
            f"- {c.target}, {c.arm} ({c.consequences}): {c.correct} of {c.n} recovered ({100 * c.rate:.1f}%, "
            f"{100 * (1 - ALPHA):.0f}% CI {100 * c.ci_lo:.1f}-{100 * c.ci_hi:.1f}%); chance {_frac(c.k_options)} "
            f"({100 * c.uniform:.1f}%) for {c.k_options} options, binomial p = {c.p_uniform:.3g}; answers carrying no "
            f"identity give {100 * c.independent:.1f}% (most frequent answer {c.modal}: {c.modal_n} of {c.n}), "
            f"permutation p = {c.p_independent:.3g}: {verdict}."
        )
    return lines


def chance_frame(chances: Sequence[Chance]) -> pd.DataFrame:
    """The chance comparisons as a table (for ``cue_solve_chance.csv``)."""
    rows = [{**c.__dict__, "rate": c.rate, "above_chance": c.above_chance} for c in chances]
    return pd.DataFrame(rows)


# =========================================================================== coverage beside its table


def low_coverage(per_trial: pd.DataFrame, probes: Sequence[str], low: float = LOW_COVERAGE) -> pd.DataFrame:
    """Each of ``probes`` whose mean option coverage is below ``low``: ``mean``, ``low`` (trials below) and ``n``
    (trials), indexed by probe; empty when no probe is low or absent.

    ``per_trial`` needs ``probe`` and ``coverage`` (option mass before
    normalization, one per readout).
    """
    sub = per_trial[per_trial["probe"].isin(list(probes))]
    if sub.empty or "coverage" not in sub.columns:
        return pd.DataFrame(columns=["mean", "low", "n"])
    g = sub.groupby("probe", sort=False)["coverage"]
    stats = pd.DataFrame({"mean": g.mean(), "low": g.apply(lambda s: int((s < low).sum())), "n": g.size()})
    return stats[stats["mean"] < low]


def coverage_lines(low_probes: pd.DataFrame, table: str, low: float = LOW_COVERAGE) -> list[str]:
    """A line naming the probes of ``low_probes`` (:func:`low_coverage` at ``low``) for the ``table`` they feed;
    empty when there are none."""
    if low_probes.empty:
        return []
    parts = ", ".join(
        f"{p} {r['mean']:.3f} ({int(r['low'])} of {int(r['n'])} below {low:g})" for p, r in low_probes.iterrows()
    )
    return [
        f"- **low option coverage** under {table}: mean option mass {parts}; the probabilities are normalized over "
        "the options, so these readings describe a small part of what the model would answer."
    ]
