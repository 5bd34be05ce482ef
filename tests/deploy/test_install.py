"""``deploy/install.sh`` on a fresh directory tree (``--root``): the real script, a real virtual environment, the
real ``cognitora`` it installs, run from the tree (never from this checkout).

What an operator gets from the one line: an isolated environment, ``cognitora`` on the PATH, the units installed
and not enabled, a starter config that loads, and a second run that upgrades without touching the config.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.installed_tree import INSTALL, ROOT, installed_tree, run_install

pytestmark = pytest.mark.timeout(900)

UNITS = {
    "cognitora-collector.service",
    "cognitora-extproc@.service",
    "cognitora-node-agent.service",
    "cognitora-pd-sidecar@.service",
}


def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, timeout=120, cwd="/")


def test_the_tree_has_the_command_the_units_and_the_config_and_nothing_else() -> None:
    tree = installed_tree()
    assert sorted(p.name for p in tree.root.iterdir()) == ["etc", "opt", "usr"]
    # cognitora on the PATH: a relative link into the environment, so it works in the tree and on a real /
    assert tree.command.is_symlink() and not os.readlink(tree.command).startswith("/")
    assert tree.command.resolve() == (tree.venv / "bin" / "cognitora").resolve()
    assert {p.name for p in tree.units.iterdir()} == UNITS
    assert not list(tree.root.glob("etc/systemd/**/*.wants")), "units must be installed, not enabled"
    assert "not enabled, not started" in tree.output
    for name, mode in [("cognitora.yaml", 0o644), ("collector.env", 0o644), ("extproc-main.env", 0o644)]:
        assert stat.S_IMODE((tree.confdir / name).stat().st_mode) == mode, name
    assert stat.S_IMODE((tree.confdir / "secrets.env").stat().st_mode) == 0o600


def test_the_installed_command_runs_from_its_own_environment() -> None:
    tree = installed_tree()
    done = run(tree.command, "--help")
    assert done.returncode == 0, done.stderr
    assert "doctor" in done.stdout and "extproc" in done.stdout
    where = run(tree.venv / "bin" / "python", "-c", "import cognitora, grpc; print(cognitora.__file__)")
    assert where.returncode == 0, where.stderr  # the default extras are in: the ext_proc service can run
    installed = Path(where.stdout.strip()).resolve()
    assert installed.is_relative_to(tree.venv.resolve()), installed  # not this checkout: an installed copy
    assert not installed.is_relative_to(ROOT)


def test_doctor_with_the_starter_config() -> None:
    """The starter loads; its engine (127.0.0.1:8000) is a placeholder, so doctor's verdict is whatever this host
    has there, and its exit status follows its lines."""
    tree = installed_tree()
    done = run(tree.command, "doctor", "--config", tree.confdir / "cognitora.yaml", "--events-wait-s", "1")
    lines = done.stdout.splitlines()
    assert lines[0].startswith("OK    config") and "1 model(s), 1 engine(s), Redis" in lines[0], done.stdout
    assert all(line.split()[0] in {"OK", "WARN", "FAIL"} for line in lines[:-1]), done.stdout
    assert any("engine 127.0.0.1:8000" in line for line in lines)
    assert done.returncode == (1 if any(line.startswith("FAIL") for line in lines) else 0)


def test_a_second_run_upgrades_in_place_and_keeps_the_config(tmp_path: Path) -> None:
    tree = installed_tree()
    config = tree.confdir / "cognitora.yaml"
    edited = config.read_text() + "# the operator's edit\n"
    config.write_text(edited)
    (tree.units / "cognitora-collector.service").unlink()
    done = run_install(tree.root, "--extras", "envoy,nvml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert config.read_text() == edited
    assert f"kept {config} (it exists)" in done.stdout
    assert (tree.units / "cognitora-collector.service").exists()  # the units are ours: written again
    assert run(tree.command, "--help").returncode == 0


def test_the_piped_one_liner_clones_the_repository(tmp_path: Path) -> None:
    """``curl ... | sh -s -- --repo URL``: the script alone on stdin, so it clones the repository it installs."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(repo)], check=True, timeout=120)
    root = tmp_path / "root"
    done = run_install(root, "--repo", f"file://{repo}", "--extras", "", stdin=INSTALL.read_text())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cloning file://" in done.stdout
    assert run(root / "usr/local/bin/cognitora", "--help").returncode == 0
    assert {p.name for p in (root / "usr/local/lib/systemd/system").iterdir()} == UNITS


def test_piped_without_a_repository_says_what_to_pass(tmp_path: Path) -> None:
    done = run_install(tmp_path / "root", stdin=INSTALL.read_text())
    assert done.returncode == 1 and "pass --repo <git URL>" in done.stderr
    assert not (tmp_path / "root" / "opt").exists()


def test_a_python_too_old_is_refused_with_what_to_do(tmp_path: Path) -> None:
    old = tmp_path / "python3.10"
    old.write_text('#!/bin/sh\ncase "$1" in -V) echo "Python 3.10.12";; *) exit 1;; esac\n')
    old.chmod(0o755)
    done = run_install(tmp_path / "root", "--python", str(old))
    assert done.returncode == 1
    assert "Python 3.10.12 is too old" in done.stderr and "Python >= 3.11" in done.stderr
    assert not (tmp_path / "root" / "opt").exists()


def test_an_unknown_option_is_refused(tmp_path: Path) -> None:
    done = run_install(tmp_path / "root", "--prefx", "/x")
    assert done.returncode == 1 and "unknown option --prefx" in done.stderr


def test_help_prints_the_header() -> None:
    done = subprocess.run(["sh", str(INSTALL), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "--root DIR" in done.stdout and "curl -fsSL" in done.stdout
