"""No import circle in the repository's packages: the product's (``cognitora/``, ``kvstate/``), its adapters
(``litellm_plugin/``, ``envoy_extproc/``), the simulator (``sim/cognitora_sim/``) and the benchmarks (``bench/``).

Read from the source (``ast``), not by importing: every import counts, at module level, inside a function and under
``TYPE_CHECKING`` alike (a type-only import is still an arrow a reader follows back). A circle is reported with
its files in order, so the failure says which arrow to cut.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    ("", "cognitora"),
    ("", "kvstate"),
    ("", "litellm_plugin"),
    ("", "envoy_extproc"),
    ("", "bench"),
    ("sim", "cognitora_sim"),
)
"""(the folder on the import path, relative to the root; the package in it)."""
EXCLUDED = ("cognitora/sim",)
"""The simulator, where a checkout still has it there: a harness, not the product (its own distribution: sim/)."""

KNOWN_CIRCLES: frozenset[frozenset[str]] = frozenset()
"""Circles tolerated while being cut on another branch (none now: the store and collector<->metrics circles were
cut on w40store, the core's on w40core)."""


def _module_files() -> dict[str, str]:
    """Dotted module name -> repository-relative path, for every module of the checked packages."""
    out: dict[str, str] = {}
    for source, package in PACKAGES:
        for path in sorted((ROOT / source / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if any(rel == e or rel.startswith(f"{e}/") for e in EXCLUDED):
                continue
            parts = path.relative_to(ROOT / source).as_posix()[: -len(".py")].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = rel
    return out


def _imported(tree: ast.AST, module: str, is_package: bool, known: dict[str, str]) -> Iterator[str]:
    """The checked modules ``module``'s source imports: ``from a import b`` names ``a.b`` when that is a module,
    else ``a``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    yield sub
                elif base in known:
                    yield base


def _graph() -> dict[str, set[str]]:
    known = _module_files()
    graph: dict[str, set[str]] = {}
    for module, rel in known.items():
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"), filename=rel)
        targets = {known[m] for m in _imported(tree, module, rel.endswith("__init__.py"), known)}
        graph[rel] = targets - {rel}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan's, iterative), each in a cycle's order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    arrows = [f"    {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return f"  {len(component)} files: {', '.join(component)}\n" + "\n".join(arrows)


def test_the_graph_sees_the_imports_it_checks() -> None:
    """The check is not vacuous: known arrows of today's code are found."""
    graph = _graph()
    assert "cognitora/budgets/gate.py" in graph["cognitora/burst/ledger_spend.py"]
    assert "kvstate/store.py" in graph["kvstate/memory_store.py"]
    assert "litellm_plugin/register.py" in graph["litellm_plugin/__init__.py"]
    assert "sim/cognitora_sim/engine_kinds.py" in graph["sim/cognitora_sim/engine.py"]
    assert "bench/workloads.py" in graph["bench/run_all.py"]  # ``from bench import workloads``: the module
    assert "kvstate/redis_client.py" in graph["cognitora/flow/redis_leases.py"]  # across packages too


def test_the_product_packages_have_no_import_circle() -> None:
    graph = _graph()
    circles = [c for c in _circles(graph) if frozenset(c) not in KNOWN_CIRCLES]
    assert not circles, "import circles (cut one arrow of each):\n" + "\n".join(_describe(c, graph) for c in circles)


def test_the_circle_check_finds_a_circle() -> None:
    graph = {"a.py": {"b.py"}, "b.py": {"c.py"}, "c.py": {"a.py"}, "d.py": {"a.py"}}
    assert _circles(graph) == [["a.py", "b.py", "c.py"]]
