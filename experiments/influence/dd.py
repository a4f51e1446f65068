"""The DailyDilemmas adapter of the influence audit (paper 000, section 3.4 and appendix G).

Reads the upstream files: the per-action file (two rows per dilemma,
``action_type`` to_do / not_to_do, list columns written as Python literals that
may contain ``nan``) and, when present, the aggregated ``dilemma.csv`` (one row
per dilemma) for the situation text. Each option's *primary value* is the
first entry of its ``values_names`` list (``values_direct`` if that is empty);
cues name values, not groups ("prioritize honesty over self").

The paper's iterative filter keeps dilemmas whose two primary values both
occur at least ``min_count`` times among the kept options, repeating until
nothing changes (the paper: 20, leaving 358 dilemmas and 10 values). Dilemmas
whose two options share a primary value are dropped first: no cue could tell
them apart. Side A is the to_do option, side B the not_to_do option; the
analysis re-keys conditions by value (see :mod:`experiments.influence.effects`). Printed
order is balanced (both orders) or drawn per trial, never fixed per dilemma.
"""

from __future__ import annotations

import argparse
import ast
import csv
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from experiments.influence.build import (
    ORDERS,
    Arm,
    AuditedSpec,
    AuditSpec,
    DataFileError,
    Demo,
    DemoFn,
    Loaded,
    OrderFn,
    Scenario,
    Side,
    demo,
    expand_scenarios,
    split_list,
    stable_hash,
)
from experiments.influence.design import Design, DesignError, article, load_design
from probe.errors import at_least
from probe.types import Trial

NAME = "influence-dd"
PER_ACTION = "dilemmas_with_detail_by_action.csv"
AGGREGATED = "dilemma.csv"
_NAN = re.compile(r"(?<=[\[,\s])nan(?=\s*[,\]])")


class DDError(DataFileError):
    """A DailyDilemmas file that cannot be read as the upstream format; the message names the file and field."""


@dataclass(frozen=True)
class DDSpec(AuditedSpec):
    """What the DailyDilemmas audit asks. Serialized into the run manifest."""

    experiment_name: ClassVar[str] = NAME

    dd: str
    """The DailyDilemmas data folder (or its per-action CSV file)."""
    min_count: int = 20
    """The iterative value filter's threshold (the paper: 20)."""
    exclude: tuple[str, ...] = ()
    """Primary values whose dilemmas are dropped after the filter (the paper drops 'dishonesty')."""
    limit: int = 16
    """Dilemmas kept after filtering, drawn with ``seed``; 0 = all."""
    order: str = "balanced"
    """``balanced``: both printed orders; ``random``: one order drawn per trial."""
    seed: int = 0
    """Seed of the dilemma draw, the few-shot draws and the random printed orders."""

    def __post_init__(self) -> None:
        at_least("--dd-min-count", self.min_count, 1)
        at_least("--dd-limit", self.limit, 0, " (0 = all)")
        if self.order not in ("balanced", "random"):
            raise ValueError(f"--dd-order must be balanced or random, got {self.order!r}")


@dataclass(frozen=True)
class DDItem:
    """One dilemma with its two actions and their primary values."""

    idx: str
    """The upstream dilemma id (``idx``)."""
    situation: str
    action_a: str
    """The to_do action (side A)."""
    value_a: str
    """Its primary value, lowercased."""
    action_b: str
    """The not_to_do action (side B)."""
    value_b: str
    """Its primary value, lowercased."""

    @property
    def item_id(self) -> str:
        return f"dd:{self.idx}"


DDLoad = Loaded[DDItem]
"""Every usable dilemma, in file order (before the value filter), and the skipped ones by reason."""


def literal_list(text: str, where: str) -> list[str]:
    """A list column as written upstream (``"['a', nan]"``) -> its string entries (nan dropped)."""
    if text is None or not str(text).strip():
        return []
    try:
        value = ast.literal_eval(_NAN.sub("None", str(text)))
    except (ValueError, SyntaxError):
        raise DDError(f"{where}: not a Python list literal: {str(text)[:80]!r}") from None
    if not isinstance(value, list):
        raise DDError(f"{where}: expected a list, got {type(value).__name__}")
    return [str(v).strip() for v in value if isinstance(v, str) and v.strip()]


def dd_files(path: str | Path) -> tuple[Path, Path | None]:
    """(per-action file, aggregated file or None) of a DailyDilemmas folder, or of a per-action file."""
    p = Path(path)
    if p.is_file():
        agg = p.parent / AGGREGATED
        return p, (agg if agg.is_file() and agg != p else None)
    if not p.is_dir():
        raise DDError(f"{p}: no such file or folder; pass --dd with the DailyDilemmas data folder")
    agg = p / AGGREGATED
    if (p / PER_ACTION).is_file():
        return p / PER_ACTION, agg if agg.is_file() else None
    cands = sorted(p.glob("dilemmas_with_detail_by_action*.csv"))
    if len(cands) != 1:
        raise DDError(
            f"{p}: expected {PER_ACTION} (or exactly one dilemmas_with_detail_by_action*.csv), found "
            f"{[c.name for c in cands]}; pass the per-action file itself"
        )
    return cands[0], agg if agg.is_file() else None


def _read_csv(path: Path) -> list[dict[str, str]]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    with open(path, newline="", encoding="utf-8-sig") as f:
        return list(csv.DictReader(f))


def load_dd(path: str | Path) -> DDLoad:
    """Read the per-action file (and the aggregated one if present) into dilemmas with two primary values."""
    per_action, aggregated = dd_files(path)
    rows = _read_csv(per_action)
    cols = set(rows[0]) if rows else set()
    need = {"idx", "action_type", "action"}
    if not need <= cols or not ({"values_names", "values_direct"} & cols):
        raise DDError(
            f"{per_action}: missing column(s) {sorted(need - cols) or ['values_names or values_direct']}; "
            "is this the upstream per-action file?"
        )
    situations: dict[str, str] = {}
    if aggregated is not None:
        agg = _read_csv(aggregated)
        if agg and not {"idx", "dilemma_situation"} <= set(agg[0]):
            raise DDError(f"{aggregated}: needs the columns idx and dilemma_situation")
        situations = {r["idx"].strip(): r["dilemma_situation"].strip() for r in agg}
    by_idx: dict[str, list[tuple[int, dict[str, str]]]] = {}
    for line, r in enumerate(rows, start=2):
        by_idx.setdefault(r["idx"].strip(), []).append((line, r))
    items: list[DDItem] = []
    skipped: Counter[str] = Counter()
    for idx, group in by_idx.items():
        kinds = {r["action_type"].strip(): (line, r) for line, r in group}
        if len(group) != 2 or set(kinds) != {"to_do", "not_to_do"}:
            skipped["not exactly one to_do and one not_to_do action"] += 1
            continue
        values = []
        for kind in ("to_do", "not_to_do"):
            line, r = kinds[kind]
            where = f"{per_action}: line {line}"
            names = literal_list(r.get("values_names", ""), f"{where} (values_names)")
            names = names or literal_list(r.get("values_direct", ""), f"{where} (values_direct)")
            values.append(names[0].lower() if names else "")
        if not all(values):
            skipped["an action without a value"] += 1
            continue
        if values[0] == values[1]:
            skipped["both actions share the primary value"] += 1
            continue
        situation = situations.get(idx) or kinds["to_do"][1].get("dilemma_situation", "").strip()
        if not situation:
            raise DDError(f"{per_action}: dilemma idx {idx} has no dilemma_situation (nor a row in {AGGREGATED})")
        items.append(
            DDItem(
                idx=idx,
                situation=situation,
                action_a=kinds["to_do"][1]["action"].strip(),
                value_a=values[0],
                action_b=kinds["not_to_do"][1]["action"].strip(),
                value_b=values[1],
            )
        )
    files = (str(per_action),) + ((str(aggregated),) if aggregated else ())
    return Loaded(tuple(items), dict(sorted(skipped.items())), files)


def value_filter(items: Sequence[DDItem], min_count: int) -> list[DDItem]:
    """The paper's iterative filter: drop dilemmas with a rare primary value until every kept value is frequent."""
    keep = list(items)
    while True:
        counts = Counter(v for i in keep for v in (i.value_a, i.value_b))
        nxt = [i for i in keep if counts[i.value_a] >= min_count and counts[i.value_b] >= min_count]
        if len(nxt) == len(keep):
            return keep
        keep = nxt


def select(items: Sequence[DDItem], spec: DDSpec) -> list[DDItem]:
    """Filter, exclude, and draw at most ``limit`` dilemmas (kept in file order)."""
    kept = value_filter(items, spec.min_count)
    excl = {v.lower() for v in spec.exclude}
    kept = [i for i in kept if i.value_a not in excl and i.value_b not in excl]
    if spec.limit and len(kept) > spec.limit:
        drawn = set(sorted((i.idx for i in kept), key=lambda x: stable_hash(spec.seed, x))[: spec.limit])
        kept = [i for i in kept if i.idx in drawn]
    return kept


def value_counts(items: Sequence[DDItem]) -> dict[str, int]:
    """How often each primary value occurs among the options (the paper's Table 3)."""
    return dict(Counter(v for i in items for v in (i.value_a, i.value_b)).most_common())


def load_dd_design(path: str | Path | None) -> tuple[Design, Callable[[str], str]]:
    """The DailyDilemmas design and its value -> role-play persona function."""
    d = load_design(path, "dd", user_fields=("situation",), extra_keys=("roles", "fallback_role"))
    roles = {str(k).lower(): str(v) for k, v in (d.extra["roles"] or {}).items()}
    fallback = d.extra["fallback_role"]
    if not isinstance(fallback, str) or "{value}" not in fallback:
        raise DesignError(f"{d.source}: fallback_role must be a template using {{value}} (and optionally {{article}})")

    def role(value: str) -> str:
        return roles.get(value.lower()) or fallback.format(value=value, article=article(value))

    return d, role


def scenario(item: DDItem, role: Callable[[str], str]) -> Scenario:
    return Scenario(
        item_id=item.item_id,
        pair=f"{item.value_a}|{item.value_b}",
        a=Side(item.value_a, item.action_a, item.value_a, role(item.value_a)),
        b=Side(item.value_b, item.action_b, item.value_b, role(item.value_b)),
        fields={"situation": item.situation},
    )


def few_shot_demos(design: Design, pool: Sequence[DDItem], seed: int, k: int = 3) -> DemoFn:
    """Up to three other dilemmas in which the option whose primary value is the target's is chosen.

    The pool is every readable dilemma (before the value filter), so rare
    values still find demonstrations; a value that no other dilemma has gets
    none, and its few-shot arm is not asked for that dilemma.
    """

    def demos(sc: Scenario, target: Side, other: Side) -> Sequence[Demo]:
        v = target.key
        cands = [i for i in pool if i.item_id != sc.item_id and (i.value_a == v) != (i.value_b == v)]
        cands.sort(key=lambda i: stable_hash(seed, sc.item_id, v, i.item_id))
        out = []
        for d in cands[:k]:
            t, o = (d.action_a, d.action_b) if d.value_a == v else (d.action_b, d.action_a)
            first = stable_hash(seed, sc.item_id, v, d.item_id, "order") % 2 == 0
            out.append(demo(design, {"situation": d.situation}, t, o, first))
        return out

    return demos


def order_fn(spec: DDSpec) -> OrderFn:
    if spec.order == "balanced":
        return lambda sc, arm: ORDERS

    def one(sc: Scenario, arm: Arm) -> Sequence[str]:
        return (ORDERS[stable_hash(spec.seed, sc.item_id, *asdict(arm).values()) % 2],)

    return one


def expand(spec: DDSpec, count_tokens: Callable[[str], int] | None = None) -> list[Trial]:
    """All trials: dilemma x arm x printed order(s)."""
    design, role = load_dd_design(spec.audit.design)
    loaded = load_dd(spec.dd)
    chosen = select(loaded.items, spec)
    if not chosen:
        counts = value_counts(loaded.items)
        top = max(counts.values()) if counts else 0
        raise ValueError(
            f"{spec.dd}: the value filter (min count {spec.min_count}) leaves no dilemmas of {len(loaded.items)} "
            f"(the most frequent primary value occurs {top} times); lower --dd-min-count"
        )
    return expand_scenarios(
        NAME,
        design,
        spec.audit,
        [scenario(i, role) for i in chosen],
        few_shot_demos(design, loaded.items, spec.seed),
        orders=order_fn(spec),
        count_tokens=count_tokens,
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("DailyDilemmas")
    g.add_argument("--dd", required=True, help="the DailyDilemmas data folder (or its per-action CSV)")
    g.add_argument(
        "--dd-min-count",
        type=int,
        default=20,
        help="keep dilemmas whose primary values occur at least this often, iteratively (default: 20, the paper's)",
    )
    g.add_argument(
        "--dd-exclude", default=None, help="comma-separated values to drop after the filter (e.g. dishonesty)"
    )
    g.add_argument("--dd-limit", type=int, default=16, help="dilemmas kept after filtering, 0 = all (default: 16)")
    g.add_argument(
        "--dd-order",
        default="balanced",
        choices=["balanced", "random"],
        help="printed order: both orders, or one drawn per trial (default: balanced)",
    )
    g.add_argument("--dd-seed", type=int, default=0, help="seed of the dilemma draw, few-shot and order draws")


def spec_from_args(a: argparse.Namespace, audit: AuditSpec) -> DDSpec:
    return DDSpec(
        dd=str(Path(a.dd).resolve()),
        audit=audit,
        min_count=a.dd_min_count,
        exclude=split_list(a.dd_exclude),
        limit=a.dd_limit,
        order=a.dd_order,
        seed=a.dd_seed,
    )
