"""Why a Redis Cluster failover can never come: ``cluster-replica-validity-factor``, reproduced. Not a benchmark of
Cognitora; the evidence behind ``bench/harness/redis_cluster.py``'s setting (docs/store.md, "Redis Cluster and
failover").

    python -m bench.cluster_replica_validity --frozen-s 40

For Redis' default factor (10) and the harness's (0), on a fresh 3-master/3-replica cluster with the failover tests'
2 s node timeout: one master is killed while another is frozen (SIGSTOP) for ``--frozen-s``, as a CPU-starved host
delays the majority's FAIL vote; then the dead master's replica is watched for ``--watch-s``. A replica whose master
link has been down longer than ``repl-ping-replica-period`` (10 s) + node timeout x factor refuses to take over, for
good. Writes ``bench/results/cluster_replica_validity.md`` with each run's promotion time and the replica's log.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import time
from pathlib import Path

import redis

from bench.harness.redis_cluster import cluster_nodes

NODE_TIMEOUT_MS = 2000
OUT = Path(__file__).parent / "results" / "cluster_replica_validity.md"


def run(factor: int, frozen_s: float, watch_s: float) -> tuple[float | None, list[str]]:
    """Seconds from the kill to the replica's promotion (None: never, within ``frozen_s + watch_s``), and the
    replica's log lines about failing over."""
    with cluster_nodes(replicas=1, node_timeout_ms=NODE_TIMEOUT_MS, replica_validity_factor=factor) as cluster:
        info = {port: redis.Redis(port=port).info("replication") for port in cluster.nodes}
        masters = [port for port, i in info.items() if i["role"] == "master"]
        victim, frozen = masters[1], masters[2]
        replica = next(port for port, i in info.items() if i.get("master_port") == victim)
        cluster.nodes[victim].kill()
        cluster.nodes[frozen].send_signal(signal.SIGSTOP)
        killed = time.monotonic()
        time.sleep(frozen_s)
        cluster.nodes[frozen].send_signal(signal.SIGCONT)
        promoted: float | None = None
        while time.monotonic() - killed < frozen_s + watch_s:
            try:
                if redis.Redis(port=replica, socket_timeout=1).info("replication")["role"] == "master":
                    promoted = time.monotonic() - killed
                    break
            except redis.RedisError:
                pass
            time.sleep(0.2)
        log = (cluster.workdir / str(replica) / "redis.log").read_text(errors="replace").splitlines()
    words = ("failover", "election", "allowed")
    return promoted, [line for line in log if any(w in line.lower() for w in words)][-6:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frozen-s", type=float, default=40.0)
    parser.add_argument("--watch-s", type=float, default=30.0)
    args = parser.parse_args()
    rows = ["# Redis Cluster: a replica's validity factor and a slow failure detection", ""]
    rows += [f"Command: `python -m bench.cluster_replica_validity --frozen-s {args.frozen_s:g} --watch-s "]
    rows[-1] += f"{args.watch_s:g}` (redis-server {_server_version()}, node timeout 2 s)."
    rows += ["", "| cluster-replica-validity-factor | promoted after the kill |", "|---|---|"]
    logs: list[str] = []
    for factor in (10, 0):
        promoted, lines = run(factor, args.frozen_s, args.watch_s)
        shown = "never" if promoted is None else f"{promoted:.1f} s"
        rows.append(f"| {factor} | {shown} (watched {args.frozen_s + args.watch_s:g} s) |")
        logs += ["", f"Replica's log, factor {factor}:", "", "```", *lines, "```"]
        print(factor, shown)
    OUT.write_text("\n".join([*rows, *logs]) + "\n")


def _server_version() -> str:
    return subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]


if __name__ == "__main__":
    main()
