"""A fresh directory tree with Cognitora installed in it by the real ``deploy/install.sh --root``, once per test
process (it takes about a minute: a virtual environment and every dependency), shared by the install and unit tests.

Also: reading a systemd unit as systemd would start it (``[Service]`` entries in order, ``Environment=`` and
``EnvironmentFile=`` merged, ``ExecStart=`` expanded, the identifier its log lines get), for tests that run a unit's
command without a systemd.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "deploy" / "install.sh"


@dataclass(frozen=True)
class InstalledTree:
    root: Path
    output: str
    """What the script printed."""

    @property
    def venv(self) -> Path:
        return self.root / "opt" / "cognitora" / "venv"

    @property
    def command(self) -> Path:
        """``/usr/local/bin/cognitora`` inside the tree."""
        return self.root / "usr" / "local" / "bin" / "cognitora"

    @property
    def units(self) -> Path:
        return self.root / "usr" / "local" / "lib" / "systemd" / "system"

    @property
    def confdir(self) -> Path:
        return self.root / "etc" / "cognitora"


def run_install(root: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``sh deploy/install.sh --root ROOT ARGS`` (or the script fed on stdin to ``sh -s --``, as curl pipes it)."""
    argv = ["sh", "-s", "--"] if stdin is not None else ["sh", str(INSTALL)]
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    return subprocess.run(
        [*argv, "--root", str(root), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir() if stdin is not None else ROOT,
        timeout=600,
    )


@functools.cache
def installed_tree() -> InstalledTree:
    root = Path(tempfile.mkdtemp(prefix="cognitora-root-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # a whole environment: never left behind
    done = run_install(root)
    if done.returncode != 0:
        raise AssertionError(f"install.sh exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return InstalledTree(root, done.stdout)


# -- a unit, read as systemd would start it ---------------------------------------------------------------------------


@dataclass(frozen=True)
class UnitCommand:
    argv: list[str]
    env: dict[str, str]
    syslog_identifier: str
    """What journald files the lines under: ``SyslogIdentifier=``, else the name of the binary (systemd's default)."""


def service_entries(unit: Path) -> list[tuple[str, str]]:
    """``[Service]`` key/value pairs in file order (keys repeat: every one counts)."""
    entries, section = [], ""
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            entries.append((key.strip(), value.strip()))
    return entries


def _env_file(path: Path) -> dict[str, str]:
    env = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip().strip('"')
    return env


def unit_command(unit: Path, instance: str = "", specifiers: dict[str, str] | None = None) -> UnitCommand:
    """The command ``unit`` (instance ``instance`` of a template) starts, and the environment it gets."""
    marks = {"%i": instance, "%%": "%", **(specifiers or {})}

    def expand(text: str) -> str:
        return re.sub(r"%.", lambda m: marks.get(m.group(0), m.group(0)), text)

    env: dict[str, str] = {}
    exec_start = identifier = ""
    for key, value in service_entries(unit):
        value = expand(value)
        if key == "Environment":
            env.update(dict(item.split("=", 1) for item in shlex.split(value)))
        elif key == "EnvironmentFile":
            optional, path = value.startswith("-"), Path(value.lstrip("-"))
            if path.exists():
                env.update(_env_file(path))
            elif not optional:
                raise FileNotFoundError(f"{unit.name}: EnvironmentFile {path} is missing (systemd refuses to start)")
        elif key == "ExecStart":
            exec_start = value
        elif key == "SyslogIdentifier":
            identifier = value
    argv: list[str] = []
    for word in shlex.split(exec_start):
        if re.fullmatch(r"\$\w+", word):  # $VAR alone: split on whitespace into several arguments
            argv += env.get(word[1:], "").split()
        else:  # ${VAR}: one argument
            argv.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), word))
    return UnitCommand(argv, env, identifier or Path(argv[0]).name)
