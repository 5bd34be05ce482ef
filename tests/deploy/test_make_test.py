"""``make test`` is the only command: it finds or installs the programs its tests need, and runs the LiteLLM tests
on both ends of the supported LiteLLM range.

``.ci/system-deps`` is run as ``make test`` runs it, with PATH narrowed to a folder holding what each case needs:
``apt-get`` there is a recorder (installing packages for real would change the machine the tests run on), and ``id``
a stand-in where the case is "not root" (the tests run as whoever runs them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from litellm_plugin.register import SUPPORTED_LITELLM

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "system-deps"
SH = shutil.which("sh") or "/bin/sh"


def run_script(bin_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SH, str(SCRIPT)], env={"PATH": str(bin_dir), **env}, capture_output=True, text=True, timeout=60
    )


def tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!{SH}\n{body}\n")
    path.chmod(0o755)


def link(bin_dir: Path, *names: str) -> None:
    for name in names:
        found = shutil.which(name)
        assert found, f"this machine has no {name}"
        (bin_dir / name).symlink_to(found)


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    return d


def recorder(bin_dir: Path, log: Path) -> None:
    tool(bin_dir, "apt-get", f'echo "$*" >> {log}')


def test_nothing_happens_when_everything_is_there() -> None:
    done = subprocess.run([SH, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_root_with_apt_installs_exactly_what_is_missing(bin_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "apt.log"
    recorder(bin_dir, log)
    tool(bin_dir, "id", "echo 0")
    done = run_script(bin_dir)
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == ["update -qq", "install -y -qq redis-server redis-tools chromium"]
    assert "missing: redis-server redis-cli chromium" in done.stderr


def test_a_chromium_already_there_is_not_installed_again(bin_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "apt.log"
    recorder(bin_dir, log)
    tool(bin_dir, "id", "echo 0")
    link(bin_dir, "redis-server", "redis-cli")
    tool(bin_dir, "my-chrome", "exit 0")
    done = run_script(bin_dir, CHROMIUM="my-chrome")
    assert (done.returncode, done.stderr) == (0, "")
    assert not log.exists()
    done = run_script(bin_dir)  # without $CHROMIUM: only chromium is missing
    assert log.read_text().splitlines() == ["update -qq", "install -y -qq chromium"]


def test_not_root_stops_at_once_with_the_one_command_to_run(bin_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "apt.log"
    recorder(bin_dir, log)
    tool(bin_dir, "id", "echo 1000")
    link(bin_dir, "redis-server")
    done = run_script(bin_dir)
    assert done.returncode == 1
    assert "  sudo apt-get install -y redis-tools chromium\n" in done.stderr
    assert "needs redis-cli chromium" in done.stderr
    assert not log.exists(), "apt-get must not run without root"


def test_without_apt_it_says_what_to_install(bin_dir: Path) -> None:
    tool(bin_dir, "id", "echo 0")
    done = run_script(bin_dir)
    assert done.returncode == 1
    assert "needs redis-server redis-cli chromium" in done.stderr
    assert "no apt-get here" in done.stderr and "CHROMIUM" in done.stderr


def litellm_bounds() -> tuple[str, str]:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["litellm"]
    assert len(spec) == 1
    oldest = re.search(r">=\s*([0-9.]+)", spec[0])
    newest = re.search(r"<=\s*([0-9.]+)", spec[0])
    assert oldest and newest, f"the litellm extra {spec[0]!r} must say >=OLDEST,<=NEWEST: make test installs both"
    return oldest[1], newest[1]


def test_make_test_checks_the_machine_first_then_tests_both_litellm_bounds() -> None:
    """What ``make test`` runs (``make -n -B``: every step printed, nothing run), in order."""
    oldest, newest = litellm_bounds()
    assert f">={oldest},<={newest}" == SUPPORTED_LITELLM, "litellm_plugin.register.SUPPORTED_LITELLM vs pyproject"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    done = subprocess.run(
        ["make", "-n", "-B", "test"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    steps = done.stdout.splitlines()
    assert steps[0] == ".ci/system-deps", steps[:3]

    def index(pattern: str) -> int:
        found = [i for i, line in enumerate(steps) if re.search(pattern, line)]
        assert found, f"make test no longer runs {pattern!r}:\n{done.stdout}"
        return found[0]

    new_install = index(rf"^\.venv/bin/python -m pip install .*-e '\.\[litellm,.*'litellm\[proxy\]=={newest}'")
    old_install = index(rf"^\.venv-litellm-oldest/bin/python -m pip install .*'litellm\[proxy\]=={oldest}'")
    # Everything not marked `alone` on two workers (the real-engine builds started beside it), then the `alone` ones.
    builds = index(r"nice -n 19 \.venv/bin/python -m cognitora_sim\.harness\.real_engines\.provision")
    everything = index(r"^\.venv/bin/python -m pytest -q -n 2 .*-m \"not alone\"")
    real_engines = index(r"^\.venv/bin/python -m pytest -q .*-m alone\s*$")
    litellm_only = index(r"^\.venv-litellm-oldest/bin/python -m pytest -q -n 2 tests/\w+/test_\w*litellm")
    assert new_install < builds < everything < real_engines and old_install < litellm_only
    ran = steps[litellm_only].split()[6:]
    for must in ("tests/litellm/test_litellm_contract.py", "tests/e2e/test_litellm_e2e.py"):
        assert must in ran
