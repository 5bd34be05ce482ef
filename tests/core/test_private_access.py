"""No private name of another file is used: the project's style gives every name that crosses a file a public name
that says what it is (a method or property on its owner), so a ``_name`` stays free to change inside its file.

Checked in the same packages as the import graph (``tests/core/test_import_graph.py``), from the source (``ast``):

- ``x._name`` where ``x`` is not ``self``/``cls`` and the file defines no ``_name`` of its own (no ``def``/``class``
  of that name, no ``self._name =``/``cls._name =``, no module or class-level ``_name =``): an object of another
  file's private. A file reading its own classes' privates (``other._endpoints`` in ``__eq__``) is its own business;
- ``m._name`` where ``m`` is a name this file imports, whatever the file defines: another module's private;
- ``self._name``/``cls._name`` where the file defines no ``_name``: a base class's private, inherited from another
  file (the base gives it a public name);
- ``from m import _name`` and ``import m._name``;
- ``getattr``/``setattr``/``hasattr``/``delattr`` of ``x`` and a literal ``"_name"``, ``x`` not ``self``/``cls``.

Dunder names (``__init__``, ``__dict__``) are not private. The one way in is ``THIRD_PARTY``: a private of a
library outside this repository with no public alternative, each with its reason. A stale entry fails too.

Without types, "another file's" is read from names: a file that reads a foreign object's ``_name`` while it defines
a ``_name`` of the same spelling itself is not seen (each such read today is of the file's own classes).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.core.test_import_graph import EXCLUDED, PACKAGES, ROOT

THIRD_PARTY: dict[tuple[str, str], str] = {
    # namedtuple's documented method (``urlsplit``'s ``SplitResult``): the underscore only avoids a field's name.
    ("cognitora/redaction.py", "_replace"): "stdlib namedtuple API",
    # ``observe_many`` adds ``count`` observations at the cost of one; prometheus_client has no public bulk
    # observe. It reads these through getattr and falls back to a loop of ``observe`` should they move.
    ("sim/cognitora_sim/metrics.py", "_buckets"): "prometheus_client Histogram internals",
    ("sim/cognitora_sim/metrics.py", "_upper_bounds"): "prometheus_client Histogram internals",
    ("sim/cognitora_sim/metrics.py", "_sum"): "prometheus_client Histogram internals",
    # The hop diagnostic samples every thread's stack while the proxy's loop stalls: ``sys._current_frames`` is the
    # stdlib's only way to read another thread's frame (documented, and what faulthandler and py-spy's peers use).
    ("bench/litellm_hop_callback.py", "_current_frames"): "stdlib sys._current_frames: no public alternative",
}
"""(repository-relative file, private name) -> why: the only privates of others a checked file may use, and only
a third-party library's."""

_OWN = ("self", "cls")
_REFLECTION = ("getattr", "setattr", "hasattr", "delattr")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _files() -> list[str]:
    out: list[str] = []
    for source, package in PACKAGES:
        for path in sorted((ROOT / source / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not any(rel == e or rel.startswith(f"{e}/") for e in EXCLUDED):
                out.append(rel)
    return out


def _own_names(tree: ast.AST) -> set[str]:
    """The names this file defines: functions, classes, attributes it sets on ``self``/``cls``, names it binds."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in _OWN
        ):
            names.add(node.attr)
    return names


def _imported_names(tree: ast.AST) -> set[str]:
    """The names an import binds in this file (``import a.b`` binds ``a``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.asname or alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _is_own(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in _OWN


def _accesses(source: str, rel: str) -> Iterator[tuple[int, str, str]]:
    """(line, private name, the code) for each use of another file's private in ``source``."""
    tree = ast.parse(source, filename=rel)
    own = _own_names(tree)
    imported = _imported_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            of_a_module = isinstance(node.value, ast.Name) and node.value.id in imported
            if of_a_module or node.attr not in own:
                yield node.lineno, node.attr, ast.unparse(node)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _private(alias.name):
                    yield node.lineno, alias.name, f"from {'.' * node.level}{node.module or ''} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                for part in alias.name.split("."):
                    if _private(part):
                        yield node.lineno, part, f"import {alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _REFLECTION
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and not _is_own(node.args[0])
        ):
            yield node.lineno, node.args[1].value, ast.unparse(node)


def _all_accesses() -> list[tuple[str, int, str, str]]:
    return [
        (rel, line, name, code)
        for rel in _files()
        for line, name, code in _accesses((ROOT / rel).read_text(encoding="utf-8"), rel)
    ]


def test_no_file_uses_another_files_private() -> None:
    found = [a for a in _all_accesses() if (a[0], a[2]) not in THIRD_PARTY]
    assert not found, (
        "private names used across files (give the owner a public method or property, or move the code to it):\n"
        + "\n".join(f"  {rel}:{line}: {code}" for rel, line, _, code in found)
    )


def test_every_allowed_private_is_still_used() -> None:
    """The allowlist stays the list of what is there: an entry whose use is gone goes too."""
    used = {(rel, name) for rel, _, name, _ in _all_accesses()}
    assert not set(THIRD_PARTY) - used, f"stale THIRD_PARTY entries: {sorted(set(THIRD_PARTY) - used)}"


def test_the_check_finds_each_kind_of_access() -> None:
    """The check is not vacuous: each form is caught, and a file's own privates and dunders are not."""
    source = """
from other import _helper
import pkg._inner
import mod

class Mine:
    def __init__(self, peer):
        self._state = 1
        self.peer = peer

    def __eq__(self, other):
        return self._state == other._state and self.__dict__ == other.__dict__

    def reads(self):
        return self.peer._theirs, mod._table, getattr(self.peer, "_hidden"), getattr(self, "_state")

class Derived(Base):
    def inherited(self):
        return self._from_base(), self._state
"""
    found = {(name, code) for _, name, code in _accesses(source, "x.py")}
    assert found == {
        ("_helper", "from other import _helper"),
        ("_inner", "import pkg._inner"),
        ("_theirs", "self.peer._theirs"),
        ("_table", "mod._table"),
        ("_hidden", "getattr(self.peer, '_hidden')"),
        ("_from_base", "self._from_base"),
    }


def test_a_module_private_is_caught_even_when_the_file_has_one_of_that_name() -> None:
    found = [code for _, _, code in _accesses("import mod\n_table = 1\nx = mod._table\n", "x.py")]
    assert found == ["mod._table"]


def test_the_checked_files_include_each_package() -> None:
    files = set(_files())
    for rel in ("cognitora/redaction.py", "kvstate/store.py", "litellm_plugin/register.py"):
        assert rel in files
    for rel in ("envoy_extproc/addresses.py", "sim/cognitora_sim/kind_pages.py", "bench/intent_bench.py"):
        assert rel in files
