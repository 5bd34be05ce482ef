"""The real-engine harness's ``nice``: an engine that is ready runs below the launcher's CPU priority, every process
and thread of it, so a benchmark's routers are not queued behind the engines on shared cores (bench/real_engines.py).

A stand-in engine (no vLLM needed): a server answering ``/health`` with 200 that, like vLLM's API server, has a
child process (vLLM's engine core and worker) and a second thread by the time it answers."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until
from cognitora_sim.harness.real_engines.launch import RealEngine, RealEngineFleet
from cognitora_sim.harness.real_engines.provision import RealEngineInstall

STAND_IN = """
import http.server, multiprocessing, os, sys, threading, time
def idle():
    time.sleep(600)
if __name__ == "__main__":
    child = multiprocessing.Process(target=idle, daemon=True)
    child.start()
    threading.Thread(target=idle, daemon=True).start()
    with open(sys.argv[2], "w") as fh:
        fh.write(str(child.pid))
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def _nice_of_every_thread(pid: int) -> set[int]:
    # /proc/PID/task/TID/stat: field 19 (1-based) is the nice value; fields counted after "pid (comm)".
    values = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        values.add(int(fields[16]))
    return values


def test_a_ready_engine_runs_below_the_launcher_every_process_and_thread(tmp_path: Path) -> None:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    child_pid_file = tmp_path / "child.pid"
    port = free_port()
    proc = ManagedProcess([sys.executable, str(script), str(port), str(child_pid_file)], tmp_path / "engine.log")
    install = RealEngineInstall(tmp_path, Path(sys.executable), tmp_path, tmp_path, {})
    fleet = RealEngineFleet(install, tmp_path, nice=5)
    fleet.engines.append(RealEngine(0, port, free_port(), free_port(), proc, started_s=time.monotonic()))
    try:
        fleet.wait_ready([0], timeout_s=60)
        wait_until(lambda: child_pid_file.exists() and child_pid_file.read_text() != "", 10, "the child's pid")
        launcher = os.getpriority(os.PRIO_PROCESS, 0)
        expected = min(19, launcher + 5)
        assert fleet.nice_of(0) == expected
        child = int(child_pid_file.read_text())
        assert _nice_of_every_thread(proc.pid) == {expected}  # the API server's main thread and its other thread
        assert _nice_of_every_thread(child) == {expected}  # the engine core / worker processes
    finally:
        fleet.stop()


def test_without_nice_an_engine_keeps_the_launchers_priority(tmp_path: Path) -> None:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port = free_port()
    proc = ManagedProcess([sys.executable, str(script), str(port), str(tmp_path / "child.pid")], tmp_path / "e.log")
    install = RealEngineInstall(tmp_path, Path(sys.executable), tmp_path, tmp_path, {})
    fleet = RealEngineFleet(install, tmp_path)
    fleet.engines.append(RealEngine(0, port, free_port(), free_port(), proc, started_s=time.monotonic()))
    try:
        fleet.wait_ready([0], timeout_s=60)
        assert fleet.nice_of(0) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        fleet.stop()
