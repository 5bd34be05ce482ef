"""``cognitora extproc`` at start: ``--workers N`` (N processes on one port, only over a shared store), and the
setups that would place blind (in-process store, no collector), refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cognitora_sim.harness.envoy_launch import wait_listening
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]


def write_config(path: Path, redis_url: str | None) -> Path:
    text = "models:\n- name: m\n  endpoints: [{url: 'http://127.0.0.1:9', engine: openai}]\n"
    if redis_url is not None:
        text += f"redis_url: {redis_url}\nkey_prefix: workers-test\n"
    path.write_text(text)
    return path


def extproc(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "cognitora.cli", "extproc", *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def test_workers_are_refused_with_the_in_process_store(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", None)
    done = extproc("--config", str(config), "--workers", "2", "--listen", f"127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert "--workers needs a shared store" in done.stderr


def test_in_process_store_without_a_collector_is_refused_and_says_what_to_do(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", None)
    done = extproc("--config", str(config), "--listen", f"127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert "has no redis_url (in-process store) and --collector is off" in done.stderr
    assert "Add --collector" in done.stderr and f"cognitora collector --config {config}" in done.stderr


def test_without_collector_starts_blind_on_purpose(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", None)
    port = free_port()
    argv = [sys.executable, "-m", "cognitora.cli", "extproc", "--config", str(config), "--listen", f"127.0.0.1:{port}"]
    with ManagedProcess([*argv, "--without-collector"], tmp_path / "extproc.log", cwd=ROOT) as service:
        wait_listening(port, service)
        assert "no engine state reaches placement" in service.log_tail()


def test_workers_are_refused_with_the_embedded_collector(tmp_path: Path, redis_server_url: str) -> None:
    config = write_config(tmp_path / "c.yaml", redis_server_url)
    done = extproc("--config", str(config), "--workers", "2", "--collector")
    assert done.returncode != 0
    assert "--collector runs in one process only" in done.stderr


@pytest.mark.alone
@pytest.mark.timeout(60)
def test_workers_share_the_port_and_stop_cleanly(tmp_path: Path, redis_server_url: str) -> None:
    config = write_config(tmp_path / "c.yaml", redis_server_url)
    port = free_port()
    argv = [sys.executable, "-m", "cognitora.cli", "extproc", "--config", str(config), "--listen", f"127.0.0.1:{port}"]
    service = ManagedProcess([*argv, "--workers", "2"], tmp_path / "workers.log", cwd=ROOT)
    try:
        wait_listening(port, service)
        wait_until(lambda: service.log_tail().count("ext_proc listening") == 2, 30.0, "both workers listening")
        assert len(children(service.pid)) >= 2
        # A plain instance never joins the group: it fails to bind instead of taking half the streams.
        intruder = extproc("--config", str(config), "--listen", f"127.0.0.1:{port}")
        assert intruder.returncode == 1
        assert "cannot listen" in intruder.stderr
        # SIGHUP to the supervisor alone, as `systemctl reload` sends it ($MAINPID): every worker reloads, once.
        os.kill(service.pid, signal.SIGHUP)
        wait_until(lambda: service.log_tail().count("config reloaded (SIGHUP)") == 2, 30.0, "both workers reloaded")
    finally:
        code = service.stop()
    assert code == 0, service.log_tail()
