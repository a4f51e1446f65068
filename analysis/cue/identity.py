"""Identity recovery in a ``cue`` run: the puzzle-solving checks, the correct-only reading and the could-be bias.

:func:`check_frame` and :func:`json_check_frame` read whether each puzzled answer named the hidden
identity (from the check probe or the JSON reply, :data:`IDENTITY_SOURCES`; :func:`parse_identity` parses
a reply), :func:`identity_checks` picks the source a run has; :func:`solved_pairs` and :func:`solve_rates`
give who solved the puzzle, :func:`correct_only_keep` keeps the answers of solved puzzles, and
:func:`status_bias` is the could-be "yes" rate per group and portrayed status.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.cue.cell_stats import cell_sums, cluster_bootstrap, ratio
from analysis.cue.decisions import Decision, arm_of, by_group, first_meaning, greedy_is, option_prob

if TYPE_CHECKING:
    from probe.runs import Run


# =========================================================================== puzzle solving and correct-only


PAIR = ["item_id", "combo", "arm", "consequences", "individual", "replicate"]


def check_frame(options: pd.DataFrame, per_trial: pd.DataFrame) -> pd.DataFrame:
    """One row per check trial: attr, the true label, P(true label) and whether the greedy answer is the truth."""
    df = per_trial[per_trial["probe"].astype(str).str.startswith("check_")].copy()
    if df.empty:
        return df.assign(arm=[], attr=[], truth=[], p_true=[], correct=[])
    df["arm"] = arm_of(df)
    df["attr"] = df["probe"].str.removeprefix("check_")
    df["truth"] = [row[f"x_{a}"] for a, (_, row) in zip(df["attr"], df.iterrows(), strict=True)]
    opts = options[options["trial_id"].isin(df["trial_id"])]
    truth = opts["trial_id"].map(df.set_index("trial_id")["truth"])
    is_true = opts["meaning"] == truth
    p_true = opts["prob"].where(is_true, 0.0).groupby(opts["trial_id"]).sum(min_count=1)
    p_true = p_true.where(opts.groupby("trial_id")["prob"].apply(lambda s: s.notna().all()))
    # greedy: highest probability, ties to the first printed (stable sort on position)
    ranked = opts.sort_values(["trial_id", "prob", "option_index"], ascending=[True, False, True], kind="stable")
    top = ranked.groupby("trial_id").head(1).set_index("trial_id")
    answered = top["prob"].notna()
    df["p_true"] = df["trial_id"].map(p_true)
    df["answer"] = df["trial_id"].map(top["meaning"].where(answered))
    df["correct"] = (df["answer"] == df["truth"]).astype(float).where(df["answer"].notna())
    return df.reset_index(drop=True)


IDENTITY_SOURCES = ("json", "check")
"""Where identity recovery is read: the JSON of the could-be reply (the paper's, the default when the run has
``could_be_json``), or the separate check probe."""


def parse_identity(text: str, labels: Mapping[str, Sequence[str]]) -> dict[str, str] | None:
    """The first JSON object in ``text``, reduced to ``{attr: label}`` for the attributes in ``labels``.

    Keys and values match case-insensitively (``"Gender": "WOMAN"`` reads as
    gender = woman); a value outside the labels reads as no answer for that
    attribute (key absent). None when no JSON object parses.
    """
    for m in re.finditer(r"\{[^{}]*\}", text or ""):
        try:
            doc = json.loads(m.group(0))
        except json.JSONDecodeError:
            continue
        if not isinstance(doc, dict):
            continue
        keys = {str(k).strip().lower(): v for k, v in doc.items()}
        out = {}
        for attr, allowed in labels.items():
            value = str(keys.get(attr, "")).strip().lower()
            hit = next((lab for lab in allowed if lab.lower() == value), None)
            if hit is not None:
                out[attr] = hit
        return out
    return None


def json_check_frame(
    generations: pd.DataFrame, meta: pd.DataFrame, labels: Mapping[str, Sequence[str]]
) -> pd.DataFrame:
    """Identity recovery from the JSON of the could-be replies, in the shape of :func:`check_frame`.

    One row per (could_be_json trial, attribute) of the first draw (the greedy
    reply): ``truth``, ``answer`` (NaN when the reply has no parsable JSON or no
    valid label for the attribute: an abstention), ``correct``; ``p_true`` is
    NaN (a generated reply has no probability). :func:`solved_pairs`,
    :func:`solve_rates` and :func:`correct_only_keep` take it as they take the
    check probe's frame.
    """
    cols = [*PAIR, "trial_id", "attr", "truth", "answer", "correct", "p_true", "parsable"]
    if generations.empty or "probe" not in meta.columns:
        return pd.DataFrame(columns=cols)
    jt = meta[meta["probe"] == "could_be_json"].copy()
    if jt.empty:
        return pd.DataFrame(columns=cols)
    jt["arm"] = arm_of(jt)
    first = generations.sort_values(["trial_id", "draw"]).drop_duplicates("trial_id").set_index("trial_id")["text"]
    rows = []
    for r in jt.itertuples():
        parsed = parse_identity(str(first.get(r.trial_id, "")), labels)
        for attr in labels:
            truth = getattr(r, f"x_{attr}")
            answer = parsed.get(attr) if parsed is not None else None
            rows.append(
                {
                    **{k: getattr(r, k) for k in PAIR},
                    "trial_id": r.trial_id,
                    "attr": attr,
                    "truth": truth,
                    "answer": answer,
                    "correct": float(answer == truth) if answer is not None else np.nan,
                    "p_true": np.nan,
                    "parsable": parsed is not None,
                }
            )
    return pd.DataFrame(rows, columns=cols)


def identity_checks(
    run: Run,
    options: pd.DataFrame,
    per_trial: pd.DataFrame,
    labels: Mapping[str, Sequence[str]],
    source: str = "json",
) -> tuple[pd.DataFrame, str]:
    """(identity-recovery frame, its source): the JSON replies when ``source="json"`` and the run has them, else the check probe."""
    if source not in IDENTITY_SOURCES:
        raise ValueError(f"identity source must be one of {', '.join(IDENTITY_SOURCES)}, got {source!r}")
    if source == "json":
        frame = json_check_frame(run.load("generations"), run.trial_meta(), labels)
        if not frame.empty:
            return frame, "json"
    return check_frame(options, per_trial), "check"


def solved_pairs(checks: pd.DataFrame) -> pd.DataFrame:
    """Per (item, combination, arm, consequences, individual, replicate): correct per attribute and ``joint``.

    ``joint`` is 1 when every checked attribute was answered correctly, 0 when one was
    answered wrongly, NaN when one was not answered (an abstention).
    """
    wide = checks.pivot_table(index=PAIR, columns="attr", values="correct", aggfunc="first", dropna=False)
    wide.columns = [f"correct_{c}" for c in wide.columns]
    cols = list(wide.columns)
    joint = wide[cols].min(axis=1, skipna=False)
    return wide.assign(joint=joint).reset_index()


def solve_rates(checks: pd.DataFrame) -> pd.DataFrame:
    """Check accuracy per (arm, consequences): per attribute, joint, share answered, and the mean P(true label).

    Accuracies are over the answered checks (an abstention is neither right nor wrong).
    """
    pairs = solved_pairs(checks)
    attrs = sorted(set(checks["attr"]))
    keys = ["arm", "consequences"]
    acc = pairs.groupby(keys)[[f"correct_{a}" for a in attrs] + ["joint"]].mean()
    acc["n_pairs"] = pairs.groupby(keys).size()
    acc["answered"] = pairs.groupby(keys)["joint"].apply(lambda s: s.notna().mean())
    p = checks.groupby([*keys, "attr"])["p_true"].mean().unstack("attr").reindex(columns=attrs)
    p.columns = [f"p_true_{c}" for c in p.columns]
    return acc.join(p).reset_index()


def correct_only_keep(per_trial: pd.DataFrame, checks: pd.DataFrame) -> pd.Series:
    """Per what-if trial_id: keep it unless its (item, individual, arm, ...) pair was checked and not solved.

    Arms without a check (Direct) are kept whole; a pair with an unanswered check is dropped,
    as the paper keeps only items whose solution was verified.
    """
    wf = per_trial[per_trial["probe"] == "what_if"].copy()
    wf["arm"] = arm_of(wf)
    pairs = solved_pairs(checks).set_index(PAIR)["joint"]
    joined = wf.join(pairs, on=PAIR, how="left")
    checked_arms = set(checks["arm"])
    keep = ~joined["arm"].isin(checked_arms) | (joined["joint"] == 1)
    return pd.Series(keep.to_numpy(), index=joined["trial_id"].to_numpy())


# =========================================================================== status bias (could-be)


def status_bias(
    options: pd.DataFrame,
    per_trial: pd.DataFrame,
    *,
    decision: Decision = "greedy",
    n_boot: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """Could-be "yes" rate per (arm, consequences, status, attr, group), with a bootstrap SD over dilemmas.

    The rate at which individuals of a group are taken to be the described person, split by
    how the dilemma portrays that person (good / neutral / bad; unannotated dilemmas are
    left out). Expected: mean P(yes); greedy: share of greedy yes answers.
    """
    df = per_trial[(per_trial["probe"] == "could_be") & (per_trial["status"].fillna("") != "")].copy()
    if df.empty:
        return pd.DataFrame(columns=["arm", "consequences", "status", "attr", "group", "rate", "n", "sd_rate"])
    df["arm"] = arm_of(df)
    df["p"] = df["trial_id"].map(option_prob(options, "yes"))
    df["yes_first"] = df["trial_id"].map(first_meaning(options)) == "yes"
    df = df[df["p"].notna()]
    df["num"] = greedy_is(df["p"], df["yes_first"]) if decision == "greedy" else df["p"]
    df["den"] = 1.0
    keys = ["arm", "consequences", "status", "attr", "group"]
    sums = cell_sums(by_group(df), keys=keys, terms=["num", "den"])
    rate = ratio(sums.values.sum(0)[:, 0], sums.values.sum(0)[:, 1])
    sd = (
        cluster_bootstrap(sums, lambda t: ratio(t[..., 0], t[..., 1]), n_boot=n_boot, seed=seed)
        if n_boot
        else np.full(len(rate), np.nan)
    )
    return sums.cells.assign(rate=rate, n=sums.n, sd_rate=sd)
