"""The LiteLLM leg of the Redis Cluster failover: the real LiteLLM proxy with two workers (``--num_workers 2``)
placing over a 3-master/3-replica Redis Cluster, one ``cognitora collector`` beside it, budgets on, a team key
authenticated by the proxy, a third of the requests streamed. Under steady load, the same steps as the Envoy leg
(tests/support/cluster_failover.py): the master holding the fleet slot is killed (its replica is promoted), then a
replica process, then the collector is restarted. Every request is answered 200, placement reads the store again
within a bound (the test prints how long it was degraded), and the team's budget ledger, read back from the Cluster
by ``cognitora budgets report``, matches the engines' own token counters and what the clients were told: no count
lost, none doubled (docs/store.md, "Redis Cluster and failover")."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.crc import key_slot

from bench.harness.redis_cluster import cluster_nodes
from cognitora_sim.harness.process import ManagedProcess
from cognitora_sim.launch import start_fleet
from tests.e2e.test_litellm_e2e import N_ENGINES, ROOT, write_config
from tests.support.cluster_failover import (
    NODE_TIMEOUT_MS,
    Collector,
    Load,
    check_ledger,
    fail_over_under_load,
    prefix_off,
)
from tests.support.litellm_proxy import LiteLLMProxy

pytestmark = pytest.mark.e2e

TEAM_KEY = "sk-ops"
AUTH_MODULE = """
import os
from fastapi import HTTPException
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

async def user_api_key_auth(request, api_key: str) -> UserAPIKeyAuth:
    key = api_key.removeprefix("Bearer ").strip()
    if key == os.environ["LITELLM_MASTER_KEY"]:
        return UserAPIKeyAuth(api_key=key, user_role=LitellmUserRoles.PROXY_ADMIN)
    if key == "sk-ops":
        return UserAPIKeyAuth(api_key=key, team_id="ops", user_id="op", key_alias="ops-key")
    raise HTTPException(status_code=401, detail="unknown key")
"""
DEGRADED_BOUND_S = 15.0
"""Placement reads the store again at most this long after the replica was promoted: a worker retries the store on
its next decision, so the window ends with the first request after the promotion (room for 2 busy cores); and
after the last step's answers."""


def cluster_config(tmp_path: Path, fleet: Any, smollm2_dir: Path, url: str, prefix: str) -> Path:
    """The example proxy config over the Cluster, budgets for team ``ops``, the team key authenticated by the proxy."""
    path = write_config(tmp_path, fleet, smollm2_dir, redis_url=url, key_prefix=prefix)
    config = yaml.safe_load(path.read_text())
    args = config["router_settings"]["routing_strategy_args"]
    args["redis_cluster"] = True
    args["budgets"] = {"teams": {"ops": {"limits": [{"window": "day", "total_tokens": 10_000_000}]}}}
    # A read stuck on the dead master must not hold a request long: it is placed on local state after 1 s.
    args["placement"]["store_timeout_s"] = 1.0
    (tmp_path / "ops_auth.py").write_text(AUTH_MODULE)
    config["general_settings"]["custom_auth"] = "ops_auth.user_api_key_auth"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def export(config: Path, tmp_path: Path) -> Path:
    """The proxy config's Cognitora settings as the ``cognitora.yaml`` a collector reads (``litellm_plugin.export``)."""
    cognitora_yaml = tmp_path / "cognitora.yaml"
    exporting = ManagedProcess(
        [sys.executable, "-m", "litellm_plugin.export", str(config), "-o", str(cognitora_yaml)],
        tmp_path / "export.log",
        env={"PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
    )
    assert exporting.proc.wait(timeout=60) == 0, exporting.log_tail()
    return cognitora_yaml


def proxy_body(w: int, i: int) -> dict[str, Any]:
    """The LiteLLM leg's requests (client, number) -> body: a third streamed (their usage is counted when they end)."""
    stream = i % 3 == 0
    return {
        "model": "chat",
        "messages": [{"role": "user", "content": f"failover {w} {i} " + "context " * 30}],
        "max_tokens": 12,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }


@pytest.mark.cluster_failover
@pytest.mark.timeout(480)
def test_litellm_with_two_workers_keeps_serving_and_counting_through_master_and_replica_deaths_and_a_collector_restart(
    tmp_path: Path, smollm2_dir: Path
) -> None:
    with (
        cluster_nodes(replicas=1, node_timeout_ms=NODE_TIMEOUT_MS) as cluster,
        start_fleet(
            N_ENGINES, time_scale=10.0, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path / "sim"
        ) as fleet,
    ):
        entry = int(cluster.url.rsplit(":", 1)[1])
        prefix = prefix_off(cluster, entry)
        slot = key_slot(prefix.encode())
        config = cluster_config(tmp_path, fleet, smollm2_dir, cluster.url, prefix)
        cognitora_yaml = export(config, tmp_path)
        collector = Collector.from_config(cognitora_yaml, tmp_path / "collector.log", ROOT)
        proxy: LiteLLMProxy | None = None
        try:
            asyncio.run(collector.started())
            # (two workers importing the proxy on 2 cores the rest of the suite keeps busy: up to minutes)
            proxy = LiteLLMProxy(config, tmp_path, salt="failover", workers=2, ready_s=240)
            # A new connection for each request: kept-alive ones would all stay on whichever worker accepted them.
            load = Load(f"{proxy.url}/v1/chat/completions", {"Authorization": f"Bearer {TEAM_KEY}"}, proxy_body, False)
            logs = [proxy.process.log_path]
            scenario = fail_over_under_load(cluster, slot, [load], collector, logs, DEGRADED_BOUND_S)
            failover = asyncio.run(asyncio.wait_for(scenario, 240))
            timings = failover.timings
            degraded_s, later_s = failover.degraded(logs)
            placing = proxy.log().count("cognitora core started (redis mode)")
            print(
                f"litellm cluster failover: {dict(load.statuses)}, {timings}, degraded placement {degraded_s:.1f} s "
                f"by the failover, {later_s:.1f} s after it (the replica kill, the collector restart)"
            )
            assert load.errors == [] and set(load.statuses) == {200}, f"{dict(load.statuses)}: {load.errors[:5]}"
            assert placing == 2, f"{placing} of the 2 workers placed requests"
            # Placement read the store again soon after the promotion.
            assert degraded_s <= timings["promoted_after_s"] + DEGRADED_BOUND_S, (degraded_s, timings)
            # Budgets: the Cluster's ledger holds what the engines counted and the clients were told.
            check_ledger([load], fleet.urls, cognitora_yaml, cwd=tmp_path)
        except BaseException:
            if proxy is not None:
                print(proxy.process.log_tail(60))
            raise
        finally:
            if proxy is not None:
                # The proxy's workers ignore SIGTERM (uvicorn's supervisor waits on them): kill the group at once.
                proxy.process.signal(signal.SIGKILL)
                proxy.stop()
            collector.stop()
