"""The real-engine harness's ``nice``: an engine that is ready runs below the launcher's CPU priority, every process
and thread of it, so a benchmark's routers are not queued behind the engines on shared cores (bench/real_engines.py).

A stand-in engine (no vLLM needed): a server answering ``/health`` with 200 that, like vLLM's API server, has a
child process (vLLM's engine core and worker) and a second thread by the time it answers."""

from __future__ import annotations

import os
import sys
import time
from functools import partial
from pathlib import Path

from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until
from cognitora_sim.harness.real_engines.launch import RealEngine, RealEngineFleet, autogroup_nice
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


def test_nice_also_lowers_the_engines_autogroup_against_the_launchers(tmp_path: Path) -> None:
    # Each engine runs in a session of its own, so with the kernel's autogroups on it is a scheduling group of its
    # own, weighed against the router's group by the group's niceness, not the process's (issue 45). CI's runner sits
    # in a cgroup of its own: there the launcher has no autogroup (its /proc/PID/autogroup is empty although
    # kernel.sched_autogroup_enabled is 1) while the engine, a new session, may get one; wherever the engine has a
    # group, the group must be niced, and its threads always are.
    in_autogroup = autogroup_nice(os.getpid()) is not None
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port = free_port()
    proc = ManagedProcess([sys.executable, str(script), str(port), str(tmp_path / "child.pid")], tmp_path / "e.log")
    install = RealEngineInstall(tmp_path, Path(sys.executable), tmp_path, tmp_path, {})
    fleet = RealEngineFleet(install, tmp_path, nice=5)
    fleet.engines.append(RealEngine(0, port, free_port(), free_port(), proc, started_s=time.monotonic()))
    try:
        fleet.wait_ready([0], timeout_s=60)
        expected = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
        assert _nice_of_every_thread(proc.pid) == {expected}
        engine_group = Path(f"/proc/{proc.pid}/autogroup").read_text().split()
        if engine_group:  # a group of its own: niced like the engine, or the launcher's group would not outweigh it
            assert fleet.autogroup_nice_of(0) == expected
        else:
            assert fleet.autogroup_nice_of(0) is None
        if in_autogroup:
            launcher_group = Path("/proc/self/autogroup").read_text().split()[0]
            assert engine_group and engine_group[0] != launcher_group  # not the launcher's group
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


def _policy_of_every_thread(pid: int) -> set[int]:
    return {os.sched_getscheduler(int(task.name)) for task in Path(f"/proc/{pid}/task").iterdir()}


def test_sched_idle_puts_every_thread_of_a_ready_engine_in_the_idle_class(tmp_path: Path) -> None:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    child_pid_file = tmp_path / "child.pid"
    port = free_port()
    proc = ManagedProcess([sys.executable, str(script), str(port), str(child_pid_file)], tmp_path / "engine.log")
    install = RealEngineInstall(tmp_path, Path(sys.executable), tmp_path, tmp_path, {})
    fleet = RealEngineFleet(install, tmp_path, nice=5, sched_idle=True)
    fleet.engines.append(RealEngine(0, port, free_port(), free_port(), proc, started_s=time.monotonic()))
    try:
        fleet.wait_ready([0], timeout_s=60)
        wait_until(lambda: child_pid_file.exists() and child_pid_file.read_text() != "", 10, "the child's pid")
        child = int(child_pid_file.read_text())
        assert _policy_of_every_thread(proc.pid) == {os.SCHED_IDLE}  # the API server's threads
        assert _policy_of_every_thread(child) == {os.SCHED_IDLE}  # the engine core / worker processes
        # the kernel's own view: /proc/PID/sched's "policy" line (5 is SCHED_IDLE)
        sched = Path(f"/proc/{child}/sched").read_text()
        assert any(line.split() == ["policy", ":", str(os.SCHED_IDLE)] for line in sched.splitlines()), sched
        assert fleet.sched_of(0) == "idle"
        assert len(fleet.process_names(0)) >= 2  # the server and its child, by name
        assert fleet.nice_of(0) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)  # nice as well, not instead
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the launcher stays in the normal class
    finally:
        fleet.stop()


def test_without_sched_idle_an_engine_stays_in_the_normal_class(tmp_path: Path) -> None:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port = free_port()
    proc = ManagedProcess([sys.executable, str(script), str(port), str(tmp_path / "child.pid")], tmp_path / "e.log")
    install = RealEngineInstall(tmp_path, Path(sys.executable), tmp_path, tmp_path, {})
    fleet = RealEngineFleet(install, tmp_path, nice=5)
    fleet.engines.append(RealEngine(0, port, free_port(), free_port(), proc, started_s=time.monotonic()))
    try:
        fleet.wait_ready([0], timeout_s=60)
        assert fleet.sched_of(0) == "other"
    finally:
        fleet.stop()


def _execs(cmdline: Path, program: bytes) -> bool:
    return program in cmdline.read_bytes()


def test_uni_executor_starts_the_engine_with_vllm_multiprocessing_off(tmp_path: Path) -> None:
    # VLLM_ENABLE_V1_MULTIPROCESSING=0 is what keeps vLLM 0.32's CPU platform on its uni executor (no worker process
    # spinning between steps); without the option the engine's environment does not carry it.
    sleeper = tmp_path / "python"  # stands in for the engine venv's python: runs whatever it is given, for a while
    sleeper.write_text("#!/bin/sh\nexec sleep 60\n")
    sleeper.chmod(0o755)
    install = RealEngineInstall(tmp_path, sleeper, tmp_path, tmp_path, {})
    environs = {}
    for uni in (True, False):
        fleet = RealEngineFleet(install, tmp_path, uni_executor=uni)
        fleet.spawn(1)
        environ = Path(f"/proc/{fleet.engines[0].process.pid}/environ")
        try:
            exec_done = partial(_execs, environ.with_name("cmdline"), b"sleep")
            wait_until(exec_done, 10, "the stand-in to exec")
            environs[uni] = environ.read_bytes().split(b"\0")
        finally:
            fleet.stop()
    assert b"VLLM_ENABLE_V1_MULTIPROCESSING=0" in environs[True]
    assert not any(e.startswith(b"VLLM_ENABLE_V1_MULTIPROCESSING=") for e in environs[False])
