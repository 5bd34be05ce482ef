"""Child processes that serve HTTP: start, wait until ready (with a deadline), stop cleanly.

Used by the demo, the benchmark harness and the end-to-end tests to run real gateways, fleets and peers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_port_block(count: int, start: int = 20000, end: int = 60000) -> int:
    """The first port P such that P..P+count-1 are all free (for fleets that take consecutive ports)."""
    port = start
    while port + count < end:
        taken = None
        for p in range(port, port + count):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    taken = p
                    break
        if taken is None:
            return port
        port = taken + 1
    raise RuntimeError(f"no {count} consecutive free ports in {start}..{end}")


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Poll ``condition`` until it is true; raise ``TimeoutError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except Exception:  # a failing probe just means "not yet"
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    try:
        return httpx.get(url, timeout=timeout_s).status_code < 500
    except httpx.HTTPError:
        return False


class ManagedProcess:
    """A child process with its output in a log file; ``stop()`` sends SIGTERM, then SIGKILL after a grace time."""

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # A crash in native code prints every thread's Python stack into the log instead of dying silently.
            env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_http(self, url: str, timeout_s: float = 60.0) -> None:
        """Wait until ``url`` answers (any status below 500); fail early, with the log tail, if the process dies."""

        def ready() -> bool:
            if not self.alive():
                raise RuntimeError(f"{self.argv[0]} exited with {self.proc.returncode}:\n{self.log_tail()}")
            return http_ok(url)

        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not ready after {timeout_s:.0f}s; log tail:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` of the log; if the process has ended, a last line says how (a negative code is the
        signal that ended it: -11 is a segfault)."""
        ended = "" if self.alive() else f"\n[{Path(self.argv[0]).name} exited with {self.proc.returncode}]"
        if not self._log.closed:  # read after stop() too: a failed stop's assertion shows the log
            self._log.flush()
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:]) + ended
        except OSError:
            return ended

    def signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.proc.pid, sig)

    def stop(self, grace_s: float = 10.0) -> int | None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
            except ProcessLookupError:
                pass
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
