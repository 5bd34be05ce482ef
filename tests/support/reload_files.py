"""Config edits for the reload end-to-end tests: one a file watch sees, and one only SIGHUP can (so that a test of
SIGHUP is not passed by the watch beside it); and ``reload_to``, which puts a config in force either way in the
processes of a gateway (``cognitora extproc`` replicas behind Envoy, or a LiteLLM proxy) and waits for their logs.

``cognitora.ops.reload.ConfigWatch`` compares (modification time, size, inode). Every file written here is padded to
``SIZE`` bytes with a YAML comment, so an edit keeps the size; ``write_unseen`` rewrites the bytes in place (same
inode, one ``pwrite``) and puts the modification time back, so the watch's next look finds the file as it was.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from cognitora_sim.harness.process import ManagedProcess, wait_until

__all__ = ["SIGHUP", "SIZE", "WATCHED", "reload_to", "write_seen", "write_unseen"]

SIZE = 8192


def _padded(config: dict[str, Any]) -> bytes:
    text = yaml.safe_dump(config).encode()
    if len(text) + 2 > SIZE:
        raise ValueError(f"config of {len(text)} bytes: over the padded size {SIZE}")
    return text + b"#" + b"x" * (SIZE - len(text) - 2) + b"\n"


def write_seen(path: Path, config: dict[str, Any]) -> None:
    """Write ``config`` so that the file watch reloads it (a new modification time)."""
    path.write_bytes(_padded(config))


def write_unseen(path: Path, config: dict[str, Any]) -> None:
    """Write ``config`` over a file ``write_seen`` wrote, leaving the watch's fingerprint as it was."""
    before = os.stat(path)
    data = _padded(config)
    if before.st_size != len(data):
        raise ValueError(f"{path} is {before.st_size} bytes, not {len(data)}: write it with write_seen first")
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


WATCHED = "config reloaded (the config file changed): changed"
"""What a gateway process logs when the file watch reloaded a config that changed something."""
SIGHUP = "config reloaded (SIGHUP): changed"
"""What it logs when SIGHUP did."""


def reload_to(
    path: Path, config: dict[str, Any], processes: Sequence[ManagedProcess], *, sighup: bool, timeout_s: float = 60.0
) -> None:
    """Put ``config`` in force in ``processes`` (each reading its config from ``path``): by the file watch, or by a
    write the watch cannot see and SIGHUP to each; wait until each one's log says a reload that way changed
    something, and fail at once, with its log, if one exits."""
    line = SIGHUP if sighup else WATCHED
    before = [_log(process).count(line) for process in processes]
    if sighup:
        write_unseen(path, config)
        for process in processes:
            process.signal(signal.SIGHUP)
    else:
        write_seen(path, config)
    for process, seen in zip(processes, before, strict=True):
        wait_until(lambda p=process, n=seen: _log(p).count(line) > n or not p.alive(), timeout_s, line)  # type: ignore[misc]
        assert process.alive(), f"{process.argv} exited ({process.proc.poll()}): {_log(process)[-2000:]}"


def _log(process: ManagedProcess) -> str:
    return process.log_path.read_text(errors="replace")
