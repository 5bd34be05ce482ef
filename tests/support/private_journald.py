"""A real ``systemd-journald``, private to one test, and a service's command logging into it as systemd connects a
unit with ``StandardOutput=journal`` and ``StandardError=journal``; ``journalctl -o json`` reads the journal back.

There is no systemd (PID 1) here, but journald runs standalone as root. Everything it writes must stay private, so
``run_under_journald`` runs this file as a driver under ``unshare -m`` (a mount namespace of its own): it mounts a
tmpfs over ``/run`` (journald's sockets in ``/run/systemd/journal``, its volatile journal in ``/run/log/journal``:
nothing is created on the host's ``/run``, not even an empty directory) and one over ``/var/log/journal`` when the
host has one, configures ``Storage=volatile`` through ``/run/systemd/journald.conf.d``, starts journald, connects
to its stdout-stream socket with the header systemd's ``connect_logging`` sends (identifier, unit, priority with
its facility, level prefix), passes that socket as the command's stdout and stderr (one stream, as systemd does
when both go to the journal) with ``JOURNAL_STREAM`` and ``NOTIFY_SOCKET`` set, waits for ``READY=1`` and for a
line, sends SIGTERM, waits for the exit, ``journalctl --sync`` and prints what ``journalctl -o json`` holds. When
the driver's processes are gone, so are the namespace and its mounts.

The driver's side (``main``) uses only the standard library: it runs in the venv's python but imports nothing of the
tests. A test that cannot have the namespace (not root, ``unshare`` refused) fails saying why; it never skips.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOURNALD = Path("/lib/systemd/systemd-journald")
STDOUT_SOCKET = "/run/systemd/journal/stdout"
LOG_DAEMON = 3
LOG_INFO = 6
DAEMON_INFO = LOG_DAEMON << 3 | LOG_INFO
"""A unit's default ``SyslogFacility=daemon`` and ``SyslogLevel=info``, as systemd sends them in the header."""
PRIVATE_CONF = """[Journal]
Storage=volatile
ReadKMsg=no
ForwardToSyslog=no
ForwardToKMsg=no
ForwardToConsole=no
ForwardToWall=no
"""


@dataclass(frozen=True)
class JournaldRun:
    entries: list[dict[str, Any]]
    """Every entry the journal held at the end, as ``journalctl -o json`` prints them (journald's own included)."""
    exit_status: int
    """The command's, after SIGTERM."""
    stopped_at_us: int
    """``CLOCK_REALTIME`` in microseconds when the driver sent SIGTERM (compare ``__REALTIME_TIMESTAMP``)."""
    journald_log: str

    def stream_entries(self) -> list[dict[str, Any]]:
        """The entries that came in over a stdout stream: what the service wrote."""
        return [e for e in self.entries if e.get("_TRANSPORT") == "stdout"]


def run_under_journald(
    argv: list[str],
    env: dict[str, str],
    *,
    identifier: str,
    unit: str,
    until: str,
    timeout_s: float = 90.0,
) -> JournaldRun:
    """Run ``argv`` with ``env`` logging into a private journald under ``identifier`` (a unit's
    ``SyslogIdentifier``) for ``unit``, until its journal holds a line containing ``until`` after ``READY=1``;
    then SIGTERM, and the journal as ``journalctl -o json`` reads it."""
    unshare = shutil.which("unshare")
    problems = []
    if os.geteuid() != 0:
        problems.append(f"not root (euid {os.geteuid()}): a mount namespace and journald's sockets need root")
    if unshare is None:
        problems.append("no unshare command (util-linux)")
    if not JOURNALD.exists():
        problems.append(f"no {JOURNALD} (Debian: the systemd package)")
    if shutil.which("journalctl") is None:
        problems.append("no journalctl (Debian: the systemd package)")
    if problems:
        raise AssertionError("a private journald cannot run here: " + "; ".join(problems))
    assert unshare is not None
    spec = {"argv": argv, "env": env, "identifier": identifier, "unit": unit, "until": until, "timeout_s": timeout_s}
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="journald-spec-") as file:
        json.dump(spec, file)
        file.flush()
        driver = subprocess.Popen(
            [unshare, "--mount", "--propagation", "private", sys.executable, __file__, file.name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # on a timeout the whole group goes: journald must not outlive the test
        )
        try:
            out, err = driver.communicate(timeout=timeout_s * 2 + 60)
        except subprocess.TimeoutExpired:
            os.killpg(driver.pid, signal.SIGKILL)
            out, err = driver.communicate()
            raise AssertionError(f"the journald driver ran past its time:\n{err}") from None
    if driver.returncode != 0:
        if "unshare failed" in err:
            raise AssertionError(f"unshare refused a mount namespace, so no private journald can run: {err.strip()}")
        raise AssertionError(f"the journald driver exited {driver.returncode}:\n{err}")
    data = json.loads(out)
    return JournaldRun(data["entries"], data["exit_status"], data["stopped_at_us"], data["journald_log"])


# -- the driver, inside the namespace -------------------------------------------------------------------------------


def _mount_tmpfs(where: str) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", where], check=True)


def _journal(*args: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        ["journalctl", "-o", "json", "--no-pager", *args], capture_output=True, text=True, check=True, timeout=30
    )
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def _wait(condition: Any, deadline: float, what: str) -> None:
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _stream_to_journald(identifier: str, unit: str) -> socket.socket:
    """Connected as systemd's ``connect_logging`` does for ``StandardOutput=journal``: write-only, and a header of
    identifier, unit id, priority (facility and level), level prefix, syslog/kmsg/console forwarding."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(STDOUT_SOCKET)
    sock.shutdown(socket.SHUT_RD)
    sock.sendall(f"{identifier}\n{unit}\n{DAEMON_INFO}\n1\n0\n0\n0\n".encode())
    return sock


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    deadline = time.monotonic() + spec["timeout_s"]
    _mount_tmpfs("/run")  # this namespace's own /run: the host's stays as it was
    if Path("/var/log/journal").is_dir():
        _mount_tmpfs("/var/log/journal")  # journald never reaches the host's persistent journal
    Path("/run/systemd/journald.conf.d").mkdir(parents=True)
    Path("/run/systemd/journald.conf.d/private.conf").write_text(PRIVATE_CONF)
    Path("/run/systemd/journal").mkdir(parents=True)
    journald_log = Path("/run/journald.log")
    with journald_log.open("w") as log:
        journald = subprocess.Popen([str(JOURNALD)], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    service: subprocess.Popen[bytes] | None = None
    try:
        _wait(lambda: Path(STDOUT_SOCKET).is_socket() or journald.poll() is not None, deadline, "journald's socket")
        if journald.poll() is not None:
            raise AssertionError(f"journald exited {journald.returncode}: {journald_log.read_text()}")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind("/run/notify")
        stream = _stream_to_journald(spec["identifier"], spec["unit"])
        fd = stream.fileno()
        stat = os.fstat(fd)
        env = {**spec["env"], "NOTIFY_SOCKET": "/run/notify", "JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino}"}
        service = subprocess.Popen(spec["argv"], env=env, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd)
        stream.close()  # the service holds the stream now: journald sees its end when the service exits
        notify.settimeout(max(1.0, deadline - time.monotonic()))
        try:
            message = notify.recv(4096)
        except TimeoutError:
            lines = _journal(f"SYSLOG_IDENTIFIER={spec['identifier']}")
            raise AssertionError(f"no READY=1 (service exit: {service.poll()}); its journal: {lines}") from None
        if not message.startswith(b"READY=1"):
            raise AssertionError(f"the first notification was {message!r}, not READY=1")
        identifier = f"SYSLOG_IDENTIFIER={spec['identifier']}"
        running = service

        def logged() -> bool:
            return any(spec["until"] in e.get("MESSAGE", "") for e in _journal(identifier))

        _wait(lambda: running.poll() is not None or logged(), deadline, f"a journal line with {spec['until']!r}")
        if running.poll() is not None:
            raise AssertionError(f"the service exited {running.returncode}: {_journal(identifier)}")
        stopped_at_us = time.clock_gettime_ns(time.CLOCK_REALTIME) // 1000
        service.terminate()  # what systemctl stop sends
        exit_status = service.wait(timeout=max(1.0, deadline - time.monotonic()))
        # journald has read the stream to its end once it has processed everything sent before this call.
        subprocess.run(["journalctl", "--sync"], check=True, timeout=30)
        entries = _journal()
    finally:
        if service is not None and service.poll() is None:
            service.kill()
            service.wait()
        journald.terminate()
        journald.wait(timeout=30)
    result = {
        "entries": entries,
        "exit_status": exit_status,
        "stopped_at_us": stopped_at_us,
        "journald_log": journald_log.read_text(),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
