"""The import layers of the project, read from the source (AST), so they cannot decay unseen.

probe core <- engines, experiments <- analysis <- probe.app: nothing imports what is
above it, and no module imports one that imports it back. Every import counts, at
module level and inside functions alike (a function-level import still ties the two
modules together). Experiments import no analysis code: their reports and comparisons
are registered by experiment name in :mod:`analysis.registry`, and every experiment
has its report there, so a new experiment without one fails here, not in a user's run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("probe", "engines", "experiments", "analysis")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for top in TOPS for p in sorted((ROOT / top).rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The project module ``name`` denotes: itself, or the package/module that defines it (``a.b.func`` -> ``a.b``)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> Iterator[tuple[str, int]]:
    """(imported project module, line) for every import statement of ``module``, wherever it stands."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import sub` imports the submodule pkg.sub when there is one, else a name of pkg
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            if t.split(".")[0] in TOPS and (r := _resolve(t)) is not None and r != module:
                yield r, node.lineno


GRAPH: dict[str, dict[str, int]] = {m: {} for m in MODULES}
for _m in MODULES:
    for _t, _line in _imports(_m):
        GRAPH[_m].setdefault(_t, _line)


def _layer(module: str) -> str:
    if module in ("probe.app", "probe.__main__") or module.startswith("probe.app."):
        return "app"
    return module.split(".")[0]


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in MODULES:
        if v not in index:
            visit(v)
    return sorted(out)


def _arrows(sources: set[str], forbidden: set[str]) -> list[str]:
    return [
        f"{m} -> {t} ({MODULES[m].relative_to(ROOT)}:{line})"
        for m in sorted(MODULES)
        if _layer(m) in sources
        for t, line in sorted(GRAPH[m].items())
        if _layer(t) in forbidden
    ]


def test_the_graph_sees_the_project() -> None:
    """A sanity check of the reader itself: known arrows are found, relative imports resolved."""
    assert "probe.types" in GRAPH["probe.store"]
    assert "probe.app.runner" in GRAPH["probe.app.cli"]  # imported inside a function
    assert len(MODULES) > 50


def test_no_import_cycle() -> None:
    assert _cycles() == []


def test_probe_core_imports_nothing_above_it() -> None:
    assert _arrows({"probe"}, {"engines", "experiments", "analysis", "app"}) == []


def test_engines_and_experiments_import_neither_analysis_nor_the_app() -> None:
    """Not even the follow-up probe, which designs its trials from its source run's influence effects: those are
    computed in :mod:`experiments.influence.effects`, which the audit's analysis imports too."""
    assert _arrows({"engines", "experiments"}, {"analysis", "app"}) == []


def test_analysis_does_not_import_the_app() -> None:
    assert _arrows({"analysis"}, {"app"}) == []


def test_every_experiment_has_its_report_and_the_comparable_ones_a_comparison() -> None:
    from analysis.registry import COMPARISONS, REPORTS
    from experiments import all_experiments

    names = set(all_experiments())
    assert set(REPORTS) == names
    assert set(COMPARISONS) == names - {"followup"}


def test_the_registry_is_the_only_wiring() -> None:
    """No experiment names a function of analysis, not even as a string: the registry imports them plainly."""
    quoted = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for name, path in MODULES.items()
        if _layer(name) in ("engines", "experiments")
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("analysis.")
    ]
    assert quoted == []


HF_PARTS = (
    "placement",
    "sampling",
    "refill",
    "graphs",
    "settings",
    "tokens",
    "weights",
    "lens",
    "readout",
    "reasoning",
    "draws",
    "engine",
)
"""The modules of the Transformers engine (docs/engines.md), each importing only those before it: the helpers only
it uses (where the model goes, the sampling kernels, the refill schedule, CUDA graphs), then its parts."""


def test_the_transformers_engines_parts_import_only_those_before_them() -> None:
    """A part of ``engines/hf/`` imports only the parts before it and never the package itself, so the facade
    (``engine``) composes the parts and no part reaches back into it or into a later one."""
    order = {f"engines.hf.{p}": k for k, p in enumerate(HF_PARTS)}
    assert {m for m in MODULES if m.startswith("engines.hf.")} == set(order)
    upward = [f"{m} -> {t}" for m, k in order.items() for t in GRAPH[m] if t == "engines.hf" or order.get(t, -1) >= k]
    assert upward == []


BACKENDS = ("hf", "vllm", "server", "api", "sim")
"""One package a backend (docs/engines.md); the shared contract is the rest of ``engines/``."""
BACKEND_USES = {"server": {"api"}}
"""The one backend built on another: readouts through a server sample, retry and journal as the API engine does."""


def _backend(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "engines" and parts[1] in BACKENDS else None


def test_each_backend_is_a_package_that_imports_no_other_backend() -> None:
    """The shared contract imports no backend, and a backend imports no other (but the server engine the API's)."""
    assert {m for m in MODULES if m.startswith("engines.") and _backend(m) is None} <= {
        f"engines.{n}" for n in ("base", "flags", "render", "local", "trie", "batching")
    }
    crossing = [
        f"{m} -> {t}"
        for m in sorted(MODULES)
        if m.startswith("engines.") and m != "engines"
        for t in GRAPH[m]
        if (b := _backend(t)) is not None and b != _backend(m) and b not in BACKEND_USES.get(_backend(m) or "", set())
    ]
    assert crossing == []


def test_no_engine_reads_the_run_store() -> None:
    """The runner hands an engine what it needs of the run (:class:`engines.base.RunFolder`)."""
    arrows = [
        f"{m} -> {t}"
        for m in MODULES
        if _layer(m) == "engines"
        for t in GRAPH[m]
        if t in ("probe.store", "probe.record")
    ]
    assert arrows == []


def test_engine_packages_export_public_names_only() -> None:
    """No ``__all__`` of ``engines/`` lists a private name, and no module keeps a public alias of a private one."""
    private, aliases = [], []
    for m, path in MODULES.items():
        if _layer(m) != "engines":
            continue
        for node in ast.parse(path.read_text(), str(path)).body:
            if not isinstance(node, ast.Assign) or len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
                continue
            target = node.targets[0].id
            if target == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                private += [
                    f"{m}: {e.value}"
                    for e in node.value.elts
                    if isinstance(e, ast.Constant) and str(e.value).startswith("_")
                ]
            elif isinstance(node.value, ast.Name) and node.value.id.startswith("_") and not target.startswith("_"):
                aliases.append(f"{m}: {target} = {node.value.id}")
    assert private == [] and aliases == []
