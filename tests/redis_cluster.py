"""Start a real 3-master Redis Cluster for tests: three ``redis-server --cluster-enabled yes`` on free ports in a
temporary directory, joined by ``redis-cli --cluster create``, stopped and removed when the context exits.

No fallback and no skip: a machine without ``redis-server`` and ``redis-cli`` fails the cluster tests with a
message saying what to install (on Debian the ``redis-server`` package brings both; ``make test`` installs it).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import redis

from tests.redis_server import free_port

MASTERS = 3
START_TIMEOUT_S = 30.0
"""Generous: three servers and a cluster handshake on a loaded 2-core machine."""


class ClusterUnavailable(RuntimeError):
    """The cluster could not be started; the message says why."""


def _binaries() -> tuple[str, str]:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    missing = [name for name, path in (("redis-server", server), ("redis-cli", cli)) if path is None]
    if server is None or cli is None:
        raise ClusterUnavailable(
            f"the Redis Cluster tests need {' and '.join(missing)} on PATH (Debian: apt-get install redis-server, "
            "which brings redis-cli); they start their own 3-master cluster and are never skipped"
        )
    return server, cli


def _cluster_ok(port: int) -> bool:
    """The node's ``CLUSTER INFO`` says ``cluster_state:ok`` (all slots served, the nodes agree)."""
    try:
        with redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5) as client:
            info = client.execute_command("CLUSTER INFO")
    except (redis.RedisError, OSError):
        return False
    if isinstance(info, dict):  # redis-py parses the reply into fields
        return bool(info.get("cluster_state") == "ok")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text


@contextmanager
def redis_cluster() -> Iterator[str]:
    """Yields ``redis://127.0.0.1:<port>`` of one master (a cluster client discovers the others from it)."""
    server, cli = _binaries()
    workdir = Path(tempfile.mkdtemp(prefix="cognitora-redis-cluster-"))
    ports = [free_port() for _ in range(MASTERS)]
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        procs: list[subprocess.Popen[bytes]] = []
        for port in ports:
            node_dir = workdir / str(port)
            node_dir.mkdir()
            # The bus port is given explicitly: the default (port + 10000) may be taken or past 65535.
            argv = [server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes"]
            argv += ["--cluster-port", str(free_port()), "--cluster-config-file", str(node_dir / "nodes.conf")]
            argv += ["--cluster-node-timeout", "5000", "--appendonly", "no", "--save", "", "--dir", str(node_dir)]
            log = stack.enter_context((node_dir / "redis.log").open("wb"))
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        stack.callback(_stop, procs)
        deadline = time.monotonic() + START_TIMEOUT_S
        for port, proc in zip(ports, procs, strict=True):
            _until(functools.partial(_answers, port), deadline, proc, f"redis-server on port {port} to answer", workdir)
        nodes = [f"127.0.0.1:{p}" for p in ports]
        created = subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
        if created.returncode != 0:
            raise ClusterUnavailable(f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}")
        for port, proc in zip(ports, procs, strict=True):
            _until(functools.partial(_cluster_ok, port), deadline, proc, f"cluster_state:ok on port {port}", workdir)
        yield f"redis://{nodes[0]}"


def _answers(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


def _until(
    condition: Callable[[], bool], deadline: float, proc: subprocess.Popen[bytes], what: str, workdir: Path
) -> None:
    """Poll ``condition`` until true; raise naming ``what`` (and the nodes' logs) at the deadline or if the node
    died."""
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in workdir.glob("*/redis.log"))
            state = f"exited with {proc.returncode}" if proc.returncode is not None else "timed out"
            raise ClusterUnavailable(f"Redis Cluster did not start: waiting for {what}, {state}\n{logs}")
        time.sleep(0.05)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
