"""Config edits for the reload end-to-end tests: one a file watch sees, and one only SIGHUP can (so that a test of
SIGHUP is not passed by the watch beside it).

``cognitora.ops.reload.ConfigWatch`` compares (modification time, size, inode). Every file written here is padded to
``SIZE`` bytes with a YAML comment, so an edit keeps the size; ``write_unseen`` rewrites the bytes in place (same
inode, one ``pwrite``) and puts the modification time back, so the watch's next look finds the file as it was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

__all__ = ["SIZE", "write_seen", "write_unseen"]

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
