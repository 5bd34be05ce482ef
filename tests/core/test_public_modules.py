"""Every public module of the product says what it offers: an ``__all__`` list naming only what it has.

Public means no part of the dotted name starts with an underscore (``cognitora/config/__main__.py`` is not public; a
package's ``__init__.py`` is, under the package's name). The four import packages of the product wheel are walked
from the source tree, so a new module without ``__all__`` fails here the day it is added. (tests/test_kvstate_layout.py
checks the same for kvstate/ and cognitora/metrics/, a subset of this, beside its import-circle checks.)
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kvstate", "cognitora", "litellm_plugin", "envoy_extproc")


def public_modules() -> list[str]:
    """The dotted names of the product's public modules, a package by its own name."""
    out: list[str] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if not any(part.startswith("_") for part in parts):
                out.append(".".join(parts))
    return out


def all_problems(module: ModuleType) -> list[str]:
    """What is wrong with ``module.__all__``: missing, not a list, naming what the module lacks, or repeating."""
    names = getattr(module, "__all__", None)
    if names is None:
        return [f"{module.__name__} has no __all__: add one listing the names other modules import or users call"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return [f"{module.__name__}.__all__ is not a list of names: {names!r}"]
    problems = [f"{module.__name__}.__all__ names {n!r}, which the module does not have" for n in names]
    problems = [p for p, n in zip(problems, names, strict=True) if not hasattr(module, n)]
    if len(set(names)) != len(names):
        problems.append(f"{module.__name__}.__all__ repeats a name")
    return problems


def test_the_walk_finds_every_package_and_skips_private_modules() -> None:
    """The parametrized check below covers what it should: each package, nested modules, no ``__main__``."""
    modules = public_modules()
    assert set(PACKAGES) <= set(modules)
    assert {"cognitora.core.router", "cognitora.tracing", "litellm_plugin.strategy", "envoy_extproc.server"} <= set(
        modules
    )
    assert "cognitora.config.__main__" not in modules
    assert not [m for m in modules if any(part.startswith("_") for part in m.split("."))]


def test_the_check_can_fail() -> None:
    """A module without ``__all__``, one naming a missing name, one repeating a name: each is reported."""
    bare = ModuleType("bare")
    assert all_problems(bare) == ["bare has no __all__: add one listing the names other modules import or users call"]
    lying = ModuleType("lying")
    vars(lying).update(here=1, __all__=["here", "gone", "here"])
    assert all_problems(lying) == [
        "lying.__all__ names 'gone', which the module does not have",
        "lying.__all__ repeats a name",
    ]
    honest = ModuleType("honest")
    vars(honest).update(here=1, __all__=["here"])
    assert all_problems(honest) == []


@pytest.mark.parametrize("module", public_modules())
def test_each_public_module_says_what_it_offers(module: str) -> None:
    assert all_problems(importlib.import_module(module)) == []
