"""bench/ never imports tests/: what both need (a real Redis, a real Redis Cluster, LiteLLM's custom auth module)
lives in ``bench.harness``, and tests import it from there."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imports_of_tests(path: Path) -> list[str]:
    """Each import in ``path`` (anywhere in it, functions included) of the ``tests`` package, as ``line: module``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            names = [node.module]
        else:
            continue
        found += [f"{node.lineno}: {n}" for n in names if n == "tests" or n.startswith("tests.")]
    return found


def test_the_check_sees_a_deferred_import(tmp_path: Path) -> None:
    source = tmp_path / "b.py"
    source.write_text("import os\n\ndef main():\n    from tests.redis_server import redis_url\n")
    assert imports_of_tests(source) == ["4: tests.redis_server"]


def test_bench_never_imports_tests() -> None:
    offenders = {
        str(p.relative_to(ROOT)): found
        for p in sorted((ROOT / "bench").rglob("*.py"))
        if "results" not in p.relative_to(ROOT).parts and (found := imports_of_tests(p))
    }
    assert offenders == {}, f"bench/ imports tests/ (move what both need to bench/harness/): {offenders}"
