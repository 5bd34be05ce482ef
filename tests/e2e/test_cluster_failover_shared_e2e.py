"""Both gateways over one Redis Cluster that fails over: three ``cognitora extproc`` replicas behind the real Envoy
and the LiteLLM proxy with two workers (``--num_workers 2``), one ``cognitora collector``, one 3-master/3-replica
Cluster, one fleet and one key prefix, so that both gateways place on the same fleet state and count team ``ops``
into the same budget ledger. Under both loads at once, the steps of tests/support/cluster_failover.py: the master
holding the fleet slot is killed (its replica is promoted), then a replica process, then the collector is restarted.
Every request through either gateway is answered 200, each gateway's placement reads the store again within its
bound (the test prints how long each was degraded), and the ledger both wrote, read back from the Cluster by
``cognitora budgets report``, matches the engines' own token counters and what both gateways' clients were told: no
count lost, none doubled (docs/store.md, "Redis Cluster and failover"). The gateways' own legs
(test_cluster_failover_e2e.py, test_cluster_failover_litellm_e2e.py) keep each failure's diagnostics apart."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from redis.crc import key_slot

from bench.harness.redis_cluster import cluster_nodes
from cognitora_sim.launch import start_fleet
from tests.e2e.test_cluster_failover_e2e import DEGRADED_BOUND_S as ENVOY_BOUND_S
from tests.e2e.test_cluster_failover_e2e import envoy_body, envoy_replicas
from tests.e2e.test_cluster_failover_litellm_e2e import DEGRADED_BOUND_S as PROXY_BOUND_S
from tests.e2e.test_cluster_failover_litellm_e2e import TEAM_KEY, cluster_config, export, proxy_body
from tests.e2e.test_litellm_e2e import N_ENGINES, ROOT
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


@pytest.mark.cluster_failover
@pytest.mark.alone  # two gateways and a Cluster under load at once: another worker's load failed it twice (load 13-14)
@pytest.mark.timeout(480)
def test_envoy_and_litellm_over_one_cluster_keep_serving_and_counting_through_a_failover_under_both_loads(
    tmp_path: Path, smollm2_dir: Path
) -> None:
    with (
        cluster_nodes(replicas=1, node_timeout_ms=NODE_TIMEOUT_MS) as cluster,
        # Envoy forwards the body as its client wrote it: its clients name the proxy's model group ("chat", the
        # model of the config both gateways read), which the engines accept beside their own name.
        start_fleet(
            N_ENGINES,
            time_scale=10.0,
            tokenizer=smollm2_dir / "tokenizer.json",
            log_dir=tmp_path / "sim",
            extra_args=["--accept-any-model"],
        ) as fleet,
    ):
        entry = int(cluster.url.rsplit(":", 1)[1])
        prefix = prefix_off(cluster, entry)
        slot = key_slot(prefix.encode())
        config = cluster_config(tmp_path, fleet, smollm2_dir, cluster.url, prefix)
        cognitora_yaml = export(config, tmp_path)  # what the collector and the extproc replicas read
        collector = Collector.from_config(cognitora_yaml, tmp_path / "collector.log", ROOT)
        proxy: LiteLLMProxy | None = None
        try:
            asyncio.run(collector.started())
            proxy = LiteLLMProxy(config, tmp_path, salt="shared-failover", workers=2, ready_s=240)
            with envoy_replicas(cognitora_yaml, fleet.endpoint_ids, tmp_path / "envoy-leg") as gateway:
                through_envoy = Load(gateway.url, gateway.headers, envoy_body("chat"))
                # A new connection for each request: kept-alive ones would all stay on one worker.
                through_proxy = Load(
                    f"{proxy.url}/v1/chat/completions", {"Authorization": f"Bearer {TEAM_KEY}"}, proxy_body, False
                )
                logs = [*gateway.logs, proxy.process.log_path]
                # The wait for placement to be back takes the larger of the two gateways' bounds; each gateway's
                # window is held to its own below.
                bound_s = max(ENVOY_BOUND_S, PROXY_BOUND_S)
                scenario = fail_over_under_load(cluster, slot, [through_envoy, through_proxy], collector, logs, bound_s)
                failover = asyncio.run(asyncio.wait_for(scenario, 300))
                timings = failover.timings
                envoy_s, envoy_later_s = failover.degraded(gateway.logs)
                proxy_s, proxy_later_s = failover.degraded([proxy.process.log_path])
                placing = proxy.log().count("cognitora core started (redis mode)")
                print(
                    f"shared cluster failover: Envoy {dict(through_envoy.statuses)}, LiteLLM "
                    f"{dict(through_proxy.statuses)}, {timings}, degraded placement by the failover {envoy_s:.1f} s "
                    f"(Envoy) and {proxy_s:.1f} s (LiteLLM), after it {envoy_later_s:.1f} s and {proxy_later_s:.1f} s"
                )
                for load in (through_envoy, through_proxy):
                    assert load.errors == [] and set(load.statuses) == {200}, (
                        f"{dict(load.statuses)}: {load.errors[:5]}"
                    )
                assert placing == 2, f"{placing} of the 2 workers placed requests"
                # Budgets: one ledger, written by both gateways, holds what the engines counted and every client
                # was told.
                check_ledger([through_envoy, through_proxy], fleet.urls, cognitora_yaml, cwd=tmp_path)
                # Placement read the store again soon after the promotion, in each gateway within its own bound.
                assert envoy_s <= timings["promoted_after_s"] + ENVOY_BOUND_S, (envoy_s, timings)
                assert proxy_s <= timings["promoted_after_s"] + PROXY_BOUND_S, (proxy_s, timings)
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
