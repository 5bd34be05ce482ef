"""The LiteLLM leg of the Redis Cluster failover: the real LiteLLM proxy with two workers (``--num_workers 2``)
placing over a 3-master/3-replica Redis Cluster, one ``cognitora collector`` beside it, budgets on, a team key
authenticated by the proxy. Under steady load the master holding the fleet slot is killed: every request is still
answered 200, its replica is promoted, placement reads the store again within a bound (the test prints how long it
was degraded), and the team's budget ledger, read back from the Cluster by ``cognitora budgets report``, matches the
engines' own token counters and what the clients were told: no count lost, none doubled (docs/operations.md,
"Redis Cluster failover")."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from redis.crc import key_slot

from bench.harness.redis_cluster import cluster_nodes
from cognitora_sim.harness.process import ManagedProcess, wait_until
from cognitora_sim.launch import start_fleet
from tests.e2e.test_cluster_failover_e2e import NODE_TIMEOUT_MS, degraded_window, owner, prefix_off, wait_promoted
from tests.e2e.test_litellm_e2e import N_ENGINES, ROOT, write_config
from tests.support import budgets_e2e
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
its next decision, so the window ends with the first request after the promotion (room for 2 busy cores)."""


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


@pytest.mark.cluster_failover
@pytest.mark.timeout(480)
def test_litellm_with_two_workers_keeps_serving_and_counting_while_a_master_fails_over(
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
        cognitora_yaml = tmp_path / "cognitora.yaml"
        export = ManagedProcess(
            [sys.executable, "-m", "litellm_plugin.export", str(config), "-o", str(cognitora_yaml)],
            tmp_path / "export.log",
            env={"PYTHONPATH": str(ROOT)},
            cwd=tmp_path,
        )
        assert export.proc.wait(timeout=60) == 0, export.log_tail()
        collector = ManagedProcess(
            [sys.executable, "-m", "cognitora.cli", "collector", "--config", str(cognitora_yaml)],
            tmp_path / "collector.log",
            env={"PYTHONPATH": str(ROOT)},
        )
        proxy: LiteLLMProxy | None = None
        try:
            wait_until(lambda: "collector started" in collector.log_tail(200), 30, "the collector to start")
            # (two workers importing the proxy on 2 cores the rest of the suite keeps busy: up to minutes)
            proxy = LiteLLMProxy(config, tmp_path, salt="failover", workers=2, ready_s=240)
            url = f"{proxy.url}/v1/chat/completions"
            headers = {"Authorization": f"Bearer {TEAM_KEY}"}
            statuses: Counter[int] = Counter()
            usage = {"prompt": 0, "completion": 0}
            errors: list[str] = []

            async def load(stop: asyncio.Event) -> None:
                async def worker(client: httpx.AsyncClient, w: int) -> None:
                    i = 0
                    while not stop.is_set():
                        i += 1
                        body = {
                            "model": "chat",
                            "messages": [{"role": "user", "content": f"failover {w} {i} " + "context " * 30}],
                            "max_tokens": 12,
                            "stream": i % 3 == 0,  # streams too: their usage is counted when they end
                        }
                        if body["stream"]:
                            body["stream_options"] = {"include_usage": True}
                        try:
                            r = await client.post(url, json=body, headers=headers)
                        except httpx.HTTPError as exc:
                            statuses[-1] += 1
                            errors.append(repr(exc))
                            continue
                        statuses[r.status_code] += 1
                        if r.status_code != 200:
                            errors.append(r.text[:300])
                            continue
                        u = r.json()["usage"] if not body["stream"] else stream_usage(r.text)
                        usage["prompt"] += u["prompt_tokens"]
                        usage["completion"] += u["completion_tokens"]

                # A new connection for each request: kept-alive ones would all stay on whichever worker accepted them.
                no_keepalive = httpx.Limits(max_keepalive_connections=0)
                async with httpx.AsyncClient(timeout=60, limits=no_keepalive) as client:
                    await asyncio.gather(*(worker(client, w) for w in range(6)))

            async def until_ok(n: int) -> None:
                target = statuses[200] + n
                deadline = time.monotonic() + 60
                while statuses[200] < target:
                    assert time.monotonic() < deadline, f"load stalled: {dict(statuses)} {errors[:3]}"
                    await asyncio.sleep(0.05)

            fleet_master = owner(cluster, slot)
            assert fleet_master is not None
            timings: dict[str, float] = {}

            async def scenario() -> None:
                stop = asyncio.Event()
                running = asyncio.create_task(load(stop))
                try:
                    await until_ok(30)
                    killed = time.monotonic()
                    cluster.nodes[fleet_master].kill()
                    timings["promoted_after_s"] = await wait_promoted(cluster, slot, fleet_master)
                    await until_ok(40)
                    timings["load_after_kill_s"] = time.monotonic() - killed
                finally:
                    stop.set()
                    await running

            asyncio.run(asyncio.wait_for(scenario(), 240))
            degraded_s = degraded_window([proxy.process.log_path])
            placing = proxy.log().count("cognitora core started (redis mode)")
            print(f"litellm cluster failover: {dict(statuses)}, {timings}, degraded placement {degraded_s:.1f} s")
            assert errors == [] and set(statuses) == {200}, f"{dict(statuses)}: {errors[:5]}"
            assert placing == 2, f"{placing} of the 2 workers placed requests"
            # Placement read the store again soon after the promotion.
            assert degraded_s <= timings["promoted_after_s"] + DEGRADED_BOUND_S, (degraded_s, timings)

            # Budgets: the Cluster's ledger holds what the engines counted and the clients were told.
            prompt, generated = budgets_e2e.engine_tokens(fleet.urls)
            assert (prompt, generated) == (usage["prompt"], usage["completion"])

            def ledger_settled() -> bool:
                report = budgets_e2e.budgets_cli("report", "--config", str(cognitora_yaml), cwd=tmp_path)
                totals = budgets_e2e.team_totals(report).get("ops", {})
                return totals.get("input_tokens") == prompt and totals.get("output_tokens") == generated

            try:
                wait_until(ledger_settled, 30, "the budget ledger to match the engines' counters")
            except TimeoutError:
                report = budgets_e2e.budgets_cli("report", "--config", str(cognitora_yaml), cwd=tmp_path)
                raise AssertionError(
                    f"ledger {budgets_e2e.team_totals(report)} vs engines {(prompt, generated)}, served {statuses[200]}"
                ) from None
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


def stream_usage(text: str) -> dict[str, int]:
    """The ``usage`` of a streamed answer (its last chunk with one, ``stream_options.include_usage``)."""
    found: dict[str, int] | None = None
    for line in text.splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line.removeprefix("data: "))
            if chunk.get("usage"):
                found = chunk["usage"]
    assert found is not None, f"a streamed answer without usage: {text[-300:]}"
    return found
