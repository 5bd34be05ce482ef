"""Scale-out over a real Redis Cluster that fails over: three ``cognitora extproc`` replicas behind the real Envoy,
one collector, a 3-master/3-replica Redis Cluster, budgets on. Under steady load: the master holding the fleet slot
is killed (its replica is promoted), then a replica process, then the collector is restarted. Requests keep
flowing (every one answered 200), placement on the store comes back (the test reports how long it was degraded),
and the budget ledger, read back from the Cluster by ``cognitora budgets report``, matches the engines' own token
counters: no count lost, none doubled (docs/store.md, "Redis Cluster and failover")."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.crc import key_slot

from bench.harness.redis_cluster import cluster_nodes
from cognitora import api_keys
from cognitora_sim.harness.envoy_launch import EXAMPLE_CONFIG, render_config, start_envoy, wait_listening
from cognitora_sim.harness.process import ManagedProcess, free_port
from cognitora_sim.launch import start_fleet
from tests.support.cluster_failover import (
    NODE_TIMEOUT_MS,
    Collector,
    Load,
    check_ledger,
    fail_over_under_load,
    prefix_off,
)

pytestmark = pytest.mark.e2e

ROOT = EXAMPLE_CONFIG.parent.parent
REPLICAS = 3
DEGRADED_BOUND_S = 10.0
"""Placement reads the store again at most this long after the replica was promoted (2 node timeouts, with room
for a busy host), and after the last step's answers."""


@dataclass(frozen=True)
class EnvoyGateway:
    """``REPLICAS`` extproc replicas behind Envoy: where to post, as team ``ops`` (an API key Envoy verifies)."""

    url: str
    headers: dict[str, str]
    logs: list[Path]
    """The replicas' logs (their "store unavailable" / "store reachable again" lines)."""


@contextmanager
def envoy_replicas(config_path: Path, engines: Sequence[str], workdir: Path) -> Iterator[EnvoyGateway]:
    """``REPLICAS`` ``cognitora extproc`` on ``config_path`` behind the real Envoy on the example (all of them in its
    ``cognitora_extproc`` cluster) listing ``engines``, the example's auth on with a fresh signing key."""
    cli = [sys.executable, "-m", "cognitora.cli"]
    ports = [free_port() for _ in range(REPLICAS)]
    replicas = [
        ManagedProcess(
            [*cli, "extproc", "--config", str(config_path), "--listen", f"127.0.0.1:{port}"],
            workdir / f"extproc{i}.log",
            cwd=ROOT,
        )
        for i, port in enumerate(ports)
    ]
    envoy = None
    try:
        for port, replica in zip(ports, replicas, strict=True):
            wait_listening(port, replica)
        secret = api_keys.new_jwks()
        listen, admin = free_port(), free_port()

        def all_replicas(envoy_config: dict[str, Any]) -> None:
            for c in envoy_config["static_resources"]["clusters"]:
                if c["name"] == "cognitora_extproc":
                    eps = [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": p}}}}
                           for p in ports]  # fmt: skip
                    c["load_assignment"]["endpoints"] = [{"lb_endpoints": eps}]

        rendered = render_config(
            listen_port=listen,
            admin_port=admin,
            extproc_port=ports[0],
            engines=engines,
            edit=all_replicas,
            jwks=secret,
        )
        envoy = start_envoy(rendered, workdir / "envoy", admin)
        token = api_keys.mint(secret, team="ops", key_id="ops-key", user="op", expires_in_s=600)
        yield EnvoyGateway(
            f"http://127.0.0.1:{listen}/v1/chat/completions",
            {"Authorization": f"Bearer {token}"},
            [r.log_path for r in replicas],
        )
    finally:
        if envoy is not None:
            envoy.stop()
        for replica in replicas:
            replica.stop()


def envoy_body(model: str) -> Callable[[int, int], dict[str, Any]]:
    """The Envoy leg's requests (client, number) -> body: each its own prompt, a short answer."""
    return lambda w, i: {
        "model": model,
        "messages": [{"role": "user", "content": f"failover {w} {i} " + "context " * 30}],
        "max_tokens": 12,
    }


@pytest.mark.cluster_failover
@pytest.mark.timeout(300)
def test_a_master_fails_over_under_load_and_no_request_or_budget_count_is_lost(
    tmp_path: Path, smollm2_dir: Path
) -> None:
    with (
        cluster_nodes(replicas=1, node_timeout_ms=NODE_TIMEOUT_MS) as cluster,
        start_fleet(2, time_scale=10.0, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path) as fleet,
    ):
        entry = int(cluster.url.rsplit(":", 1)[1])
        prefix = prefix_off(cluster, entry)
        config: dict[str, Any] = {
            "redis_url": cluster.url,
            "redis_cluster": True,
            "key_prefix": prefix,
            "models": [fleet.model_config(smollm2_dir / "tokenizer.json")],
            "budgets": {"teams": {"ops": {"limits": [{"window": "day", "total_tokens": 10_000_000}]}}},
            "placement": {"store_timeout_s": 1.0},
        }
        config_path = tmp_path / "cognitora.yaml"
        config_path.write_text(yaml.safe_dump(config))
        collector = Collector.from_config(config_path, tmp_path / "collector.log", ROOT)
        try:
            with envoy_replicas(config_path, fleet.endpoint_ids, tmp_path) as gateway:
                load = Load(gateway.url, gateway.headers, envoy_body(fleet.model))
                logs = gateway.logs
                scenario = fail_over_under_load(
                    cluster, key_slot(prefix.encode()), [load], collector, logs, DEGRADED_BOUND_S
                )
                failover = asyncio.run(asyncio.wait_for(scenario, 240))
                timings = failover.timings
                degraded_s, later_s = failover.degraded(logs)
                print(
                    f"cluster failover: {dict(load.statuses)}, {timings}, degraded placement {degraded_s:.1f} s "
                    f"by the failover, {later_s:.1f} s after it (the replica kill, the collector restart)"
                )
                assert load.errors == [] and set(load.statuses) == {200}, f"{dict(load.statuses)}: {load.errors[:5]}"
                assert degraded_s <= timings["promoted_after_s"] + DEGRADED_BOUND_S, (degraded_s, timings)
                # Budgets: what the Cluster's ledger holds is what the engines counted and the clients were told.
                check_ledger([load], fleet.urls, config_path, cwd=tmp_path)
        finally:
            collector.stop()
