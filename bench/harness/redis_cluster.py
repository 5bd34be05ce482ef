"""Start a real 3-master Redis Cluster for tests and benchmarks: three ``redis-server --cluster-enabled yes`` on
free ports in a temporary directory, joined by ``redis-cli --cluster create``, stopped and removed when the context
exits.

No fallback and no skip: a machine without ``redis-server`` and ``redis-cli`` fails the cluster tests with a
message saying what to install (on Debian the ``redis-server`` package brings both; ``make test`` installs it).
"""

from __future__ import annotations

import functools
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

__all__ = ["MASTERS", "ClusterUnavailable", "redis_cluster"]

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


@dataclass
class Cluster:
    """A running cluster: ``url`` of one master, and every node's process by port (``kill`` one to fail it over)."""

    url: str
    nodes: dict[int, subprocess.Popen[bytes]]
    workdir: Path


@contextmanager
def redis_cluster() -> Iterator[str]:
    """Yields ``redis://127.0.0.1:<port>`` of one master (a cluster client discovers the others from it)."""
    with cluster_nodes() as cluster:
        yield cluster.url


@contextmanager
def cluster_nodes(
    replicas: int = 0, node_timeout_ms: int = 5000, replica_validity_factor: int = 0
) -> Iterator[Cluster]:
    """``MASTERS`` masters, each with ``replicas`` replicas; ``node_timeout_ms``: how long a master may be silent
    before its replica takes over (Redis' ``cluster-node-timeout``).

    ``replica_validity_factor`` is Redis' ``cluster-replica-validity-factor``; 0 (Redis' default is 10): a replica
    always tries to take over, however long it has been cut from its master. With the default, a replica whose
    master link has been down longer than ``repl-ping-replica-period`` (10 s) + ``node_timeout_ms`` x 10 never
    fails over at all (its log says "Disconnected from master for longer than allowed"): with a 2 s node timeout
    that is 30 s, which a failure detection and election slowed by a CPU-starved host (each failed election waits
    2 node timeouts before the next) can pass, and the cluster then stays without a master for those slots.

    Yields once every slot is served and every replica has finished its first sync (``master_link_status:up``): a
    replica still loading its master's snapshot has no data age and would refuse to take over."""
    server, cli = _binaries()
    workdir = Path(tempfile.mkdtemp(prefix="cognitora-redis-cluster-"))
    count = MASTERS * (1 + replicas)
    picked = distinct_ports(2 * count)
    ports, bus_ports = picked[:count], picked[count:]
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        procs: list[subprocess.Popen[bytes]] = []
        stack.callback(_stop, procs)  # before the first start: a failure while starting the others stops it too
        for port, bus_port in zip(ports, bus_ports, strict=True):
            node_dir = workdir / str(port)
            node_dir.mkdir()
            # The bus port is given explicitly: the default (port + 10000) may be taken or past 65535.
            argv = [server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes"]
            argv += ["--cluster-port", str(bus_port), "--cluster-config-file", str(node_dir / "nodes.conf")]
            argv += ["--cluster-node-timeout", str(node_timeout_ms), "--appendonly", "no", "--save", ""]
            argv += ["--cluster-replica-validity-factor", str(replica_validity_factor)]
            # A replica's first sync starts at once rather than after the 5 s a diskless master waits for others.
            argv += ["--repl-diskless-sync-delay", "0", "--dir", str(node_dir)]
            log = stack.enter_context((node_dir / "redis.log").open("wb"))
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + START_TIMEOUT_S
        for port, proc in zip(ports, procs, strict=True):
            _until(functools.partial(_answers, port), deadline, proc, f"redis-server on port {port} to answer", workdir)
        nodes = [f"127.0.0.1:{p}" for p in ports]
        created = subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", str(replicas), "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
        if created.returncode != 0:
            raise ClusterUnavailable(f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}")
        for port, proc in zip(ports, procs, strict=True):
            _until(functools.partial(_cluster_ok, port), deadline, proc, f"cluster_state:ok on port {port}", workdir)
        for port, proc in zip(ports, procs, strict=True):
            _until(functools.partial(_synced, port), deadline, proc, f"port {port}'s replication in sync", workdir)
        yield Cluster(f"redis://{nodes[0]}", dict(zip(ports, procs, strict=True)), workdir)


def distinct_ports(n: int) -> list[int]:
    """``n`` free ports, all different: each socket is held until all are picked (``free_port()`` called in a row
    may hand out one port twice, which failed a run with two nodes in one directory)."""
    with ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(n)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def _synced(port: int) -> bool:
    """A master, or a replica whose link to its master is up (its first full sync done)."""
    try:
        with redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5) as client:
            info = client.info("replication")
    except (redis.RedisError, OSError):
        return False
    return info.get("role") == "master" or info.get("master_link_status") == "up"


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
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
