"""The store's module layout: the protocol below both backends, and the names callers used before the split. (No
import circle anywhere in the product: tests/core/test_import_graph.py; ``__all__`` everywhere:
tests/core/test_public_modules.py.)

Read from the source (every ``import``, in functions and under ``TYPE_CHECKING`` too, since a deferred import is
still a dependency), not from ``sys.modules``: a circle hidden behind a function-level import is the one that breaks
a refactoring later.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kvstate", "cognitora", "litellm_plugin", "envoy_extproc")


def module_files() -> dict[str, Path]:
    """Every module of the product's packages, by dotted name (a package by its own name)."""
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``name`` imports anywhere in its source (``from p import m`` is module ``p.m``
    when that is a module, else ``p``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def owner(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(m for a in node.names if (m := owner(a.name)) is not None)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                target = full if full in known else owner(base)
                if target is not None:
                    out.add(target)
    out.discard(name)
    return out


def test_the_store_protocol_sits_below_both_backends() -> None:
    """``kvstate.store`` names neither backend (``kvstate.open`` picks one), and neither backend names the other."""
    files = module_files()
    imports = {
        m: imported_modules(m, files[m], files)
        for m in ("kvstate.store", "kvstate.memory_store", "kvstate.redis_store")
    }
    assert not imports["kvstate.store"] & {"kvstate.memory_store", "kvstate.redis_store", "kvstate.open"}
    assert "kvstate.redis_store" not in imports["kvstate.memory_store"]
    assert "kvstate.memory_store" not in imports["kvstate.redis_store"]


def test_the_public_store_names_still_import() -> None:
    """What callers spelled before the split still works: the types and tiers from ``kvstate.store``."""
    from kvstate import open as opening
    from kvstate import store, tiers

    assert store.Tier is tiers.Tier
    assert store.DEFAULT_TIER_WEIGHTS is tiers.DEFAULT_TIER_WEIGHTS
    assert store.SPECULATIVE_WEIGHT == tiers.SPECULATIVE_WEIGHT
    assert "open_store" in opening.__all__
    # A block held on CPU and on disk reloads from the faster of the two.
    both = tiers.tier_bit(tiers.Tier.CPU) | tiers.tier_bit(tiers.Tier.DISK)
    assert tiers.mask_weights(None)[both] == tiers.DEFAULT_TIER_WEIGHTS[tiers.Tier.CPU]


def test_the_redis_store_parts_sit_below_it() -> None:
    """``redis_store`` puts ``redis_client``, ``redis_index`` and ``redis_fleet`` together: no part imports it, and
    the two halves share only the client; the names callers imported from ``redis_store`` before the split still
    import from there."""
    files = module_files()
    parts = {"kvstate.redis_client", "kvstate.redis_index", "kvstate.redis_fleet"}
    for part in parts:
        imports = imported_modules(part, files[part], files)
        assert "kvstate.redis_store" not in imports, part
        assert not imports & (parts - {part, "kvstate.redis_client"}), part
    from kvstate import redis_client, redis_store

    assert redis_store.Client is redis_client.Client
    assert redis_store.ScriptCall is redis_client.ScriptCall
    assert redis_store.probe is redis_client.probe
