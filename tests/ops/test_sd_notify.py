"""Readiness for systemd's ``Type=notify`` units (deploy/systemd/): each long-running command sends ``READY=1`` to
``$NOTIFY_SOCKET`` once it serves, and not before, and not at all when it fails to start.

The service manager here is the test: it binds the AF_UNIX datagram socket systemd would, sets ``NOTIFY_SOCKET`` for
a real process of each command, and checks, the moment ``READY=1`` arrives, that the command's port answers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from cognitora import sd_notify
from cognitora_sim.harness.process import ManagedProcess, free_port
from cognitora_sim.launch import SimFleet, start_fleet

ROOT = Path(__file__).resolve().parents[2]
FAKE_PYNVML = Path(__file__).resolve().parents[1] / "support" / "fake_pynvml"


@contextmanager
def notify_socket(abstract: bool = False) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket, as systemd makes one per service, and the ``NOTIFY_SOCKET`` value naming it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"@cognitora-test-{os.getpid()}-{time.monotonic_ns()}"
        sock.bind(b"\0" + name[1:].encode())
        yield sock, name
        sock.close()
        return
    folder = tempfile.mkdtemp(prefix="sdn-", dir="/tmp")  # AF_UNIX paths are limited to 107 bytes
    path = os.path.join(folder, "notify")
    sock.bind(path)
    try:
        yield sock, path
    finally:
        sock.close()
        os.unlink(path)
        os.rmdir(folder)


def receive(sock: socket.socket, proc: ManagedProcess, timeout_s: float = 60.0) -> dict[str, str]:
    """The first notification, as KEY -> VALUE; fails with the log if the process dies first."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            data = sock.recv(4096)
        except TimeoutError:
            assert proc.alive(), f"exited {proc.proc.returncode} before READY=1:\n{proc.log_tail()}"
            continue
        return dict(line.split("=", 1) for line in data.decode().splitlines())
    raise AssertionError(f"no notification in {timeout_s:.0f} s:\n{proc.log_tail()}")


def start(argv: list[str], env_socket: str, log: Path, extra_env: dict[str, str] | None = None) -> ManagedProcess:
    env = {"NOTIFY_SOCKET": env_socket, **(extra_env or {})}
    return ManagedProcess([sys.executable, "-m", "cognitora.cli", *argv], log, env=env, cwd=ROOT)


def accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with start_fleet(1, time_scale=20, log_dir=tmp_path_factory.mktemp("fleet")) as fleet:
        yield fleet


def config(tmp_path: Path, fleet: SimFleet, redis_url: str | None, key_prefix: str) -> Path:
    data: dict[str, object] = {
        "key_prefix": key_prefix,
        "models": [
            {"name": fleet.model, "endpoints": [{"url": fleet.urls[0], "kv_events": fleet.events_addresses[0]}]}
        ],
    }
    if redis_url is not None:
        data["redis_url"] = redis_url
    path = tmp_path / "cognitora.yaml"
    path.write_text(json.dumps(data))
    return path


# -- the protocol -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("abstract", [False, True])
def test_ready_sends_one_datagram_to_the_named_socket(monkeypatch: pytest.MonkeyPatch, abstract: bool) -> None:
    with notify_socket(abstract) as (sock, name):
        monkeypatch.setenv("NOTIFY_SOCKET", name)
        assert sd_notify.ready("serving on 9002")
        assert sock.recv(4096) == b"READY=1\nSTATUS=serving on 9002"


def test_without_notify_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sd_notify.ready() is False


def test_a_socket_nobody_listens_on_does_not_stop_the_caller(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert sd_notify.ready() is False


# -- each command, as a real process --------------------------------------------------------------------------


def test_collector_is_ready_when_its_metrics_page_answers(
    fleet: SimFleet, redis_server_url: str, key_prefix: str, tmp_path: Path
) -> None:
    port = free_port()
    argv = ["collector", "--config", str(config(tmp_path, fleet, redis_server_url, key_prefix))]
    with (
        notify_socket() as (sock, name),
        start([*argv, "--metrics-listen", f"127.0.0.1:{port}"], name, tmp_path / "c.log") as proc,
    ):
        message = receive(sock, proc)
        assert message["READY"] == "1" and message["STATUS"] == "collecting"
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200


def test_extproc_is_ready_when_its_grpc_port_accepts(fleet: SimFleet, key_prefix: str, tmp_path: Path) -> None:
    port = free_port()
    path = config(tmp_path, fleet, None, key_prefix)
    argv = ["extproc", "--config", str(path), "--collector", "--listen", f"127.0.0.1:{port}"]
    with notify_socket() as (sock, name), start(argv, name, tmp_path / "x.log") as proc:
        message = receive(sock, proc)
        assert message == {"READY": "1", "STATUS": f"serving ext_proc on port {port}"}
        assert accepts(port)


def test_extproc_that_cannot_start_never_says_ready(tmp_path: Path) -> None:
    bad = tmp_path / "cognitora.yaml"
    bad.write_text("models: []\n")
    with notify_socket() as (sock, name), start(["extproc", "--config", str(bad)], name, tmp_path / "x.log") as proc:
        assert proc.proc.wait(timeout=60) == 2
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(4096)  # anything queued would be read at once


def test_node_agent_is_ready_when_its_page_answers(tmp_path: Path) -> None:
    port = free_port()
    argv = ["node-agent", "--source", "nvml", "--listen", f"127.0.0.1:{port}"]
    with (
        notify_socket() as (sock, name),
        start(argv, name, tmp_path / "n.log", {"PYTHONPATH": str(FAKE_PYNVML)}) as proc,
    ):
        assert receive(sock, proc)["READY"] == "1"
        page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert page.status_code == 200 and "DCGM_FI_DEV_POWER_USAGE" in page.text


def test_pd_sidecar_is_ready_when_it_listens(fleet: SimFleet, tmp_path: Path) -> None:
    port = free_port()
    argv = ["pd-sidecar", "--listen", f"127.0.0.1:{port}", "--engine", fleet.urls[0]]
    with notify_socket() as (sock, name), start(argv, name, tmp_path / "p.log") as proc:
        assert receive(sock, proc) == {"READY": "1", "STATUS": "serving 1 decode engine(s)"}
        assert accepts(port)


def test_a_stop_right_after_ready_is_a_clean_stop(fleet: SimFleet, key_prefix: str, tmp_path: Path) -> None:
    """``systemctl stop`` may come the moment the unit is ready: the SIGTERM handler must already be in place (it
    drains and exits 0), not Python's default (killed by the signal, which systemd logs as a failure)."""
    path = config(tmp_path, fleet, None, key_prefix)
    for attempt in range(3):
        argv = ["extproc", "--config", str(path), "--collector", "--listen", f"127.0.0.1:{free_port()}"]
        with notify_socket() as (sock, name), start(argv, name, tmp_path / f"x{attempt}.log") as proc:
            assert receive(sock, proc)["READY"] == "1"
            proc.proc.send_signal(signal.SIGTERM)
            assert proc.proc.wait(timeout=60) == 0, proc.log_tail()
