"""Scale-out over a real Redis Cluster that fails over: three ``cognitora extproc`` replicas behind the real Envoy,
one collector, a 3-master/3-replica Redis Cluster, budgets on. Under steady load: the master holding the fleet slot
is killed (its replica is promoted), then a replica process, then the collector is restarted. Requests keep
flowing (every one answered 200), placement on the store comes back (the test reports how long it was degraded),
and the budget ledger, read back from the Cluster by ``cognitora budgets report``, matches the engines' own token
counters: no count lost, none doubled (docs/store.md, "Redis Cluster and failover")."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from redis.crc import key_slot

from bench.harness.redis_cluster import Cluster, cluster_nodes
from cognitora import api_keys
from cognitora_sim.harness.envoy_launch import EXAMPLE_CONFIG, render_config, start_envoy, wait_listening
from cognitora_sim.harness.process import ManagedProcess, free_port, wait_until
from cognitora_sim.launch import start_fleet
from tests.support import budgets_e2e

pytestmark = pytest.mark.e2e

ROOT = EXAMPLE_CONFIG.parent.parent
REPLICAS = 3
NODE_TIMEOUT_MS = 2000
"""Redis' cluster-node-timeout: a silent master is failed over about this long after it died."""
PROMOTION_BOUND_S = 60.0
"""How long the replica may take to be promoted: measured 3-8 s here (2 node timeouts, the election's random
delay, and a failed election retried after 2 more), with room for a host whose 2 cores the rest of the suite
keeps busy. Past it the test fails with the replica's own log, which says why it did not take over."""


def masters(cluster: Cluster) -> dict[int, list[tuple[int, int]]]:
    """Master port -> its slot ranges, as a live node sees them."""
    for port, proc in cluster.nodes.items():
        if proc.poll() is not None:
            continue
        with redis.Redis(port=port, socket_timeout=2) as client:
            nodes = client.execute_command("CLUSTER NODES")
        return {
            int(addr.split(":")[1].split("@")[0]): [(int(a), int(b)) for a, b in node["slots"]]
            for addr, node in nodes.items()
            if "master" in node["flags"] and "fail" not in node["flags"] and node["connected"] is not False
        }
    raise AssertionError("no live node")


def owner(cluster: Cluster, slot: int) -> int | None:
    """The live master serving ``slot``; None while none does (a failover under way)."""
    for port, ranges in masters(cluster).items():
        if any(a <= slot <= b for a, b in ranges):
            return port
    return None


def prefix_off(cluster: Cluster, avoid: int) -> str:
    """A key prefix whose fleet slot (hash tag ``{prefix}``) is not on ``avoid`` (the URL the processes were given:
    a new process started after the kill must still reach the Cluster through it)."""
    for i in range(1000):
        prefix = f"failover{i}"
        if owner(cluster, key_slot(prefix.encode())) != avoid:
            return prefix
    raise AssertionError("no prefix")


async def wait_promoted(cluster: Cluster, slot: int, dead: int) -> float:
    """Seconds until a live master other than ``dead`` serves ``slot``; fails after ``PROMOTION_BOUND_S`` with the
    dead master's replicas' logs (Redis says there why a replica does not take over)."""
    start = time.monotonic()
    while owner(cluster, slot) in (dead, None):
        if time.monotonic() - start > PROMOTION_BOUND_S:
            logs = {
                port: "\n".join(
                    (cluster.workdir / str(port) / "redis.log").read_text(errors="replace").splitlines()[-15:]
                )
                for port, proc in cluster.nodes.items()
                if port != dead and proc.poll() is None
            }
            raise AssertionError(f"no replica promoted within {PROMOTION_BOUND_S:g} s of killing {dead}: {logs}")
        await asyncio.sleep(0.1)
    return time.monotonic() - start


def degraded_window(logs: list[Path]) -> float:
    """Seconds from the first "store unavailable" to the last "store reachable again" over the replicas' logs."""
    down: list[float] = []
    up: list[float] = []
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:  # (a proxy's log holds its host's lines too)
                record = json.loads(line)
            except ValueError:
                continue
            if "ts" not in record:
                continue
            at = datetime.fromisoformat(str(record.get("ts", "")).replace("Z", "+00:00")).timestamp()
            if str(record.get("msg", "")).startswith("store unavailable"):
                down.append(at)
            elif record.get("msg") == "store reachable again":
                up.append(at)
    return max(up) - min(down) if down and up else 0.0


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
        cli = [sys.executable, "-m", "cognitora.cli"]

        def collector() -> ManagedProcess:
            return ManagedProcess(
                [*cli, "collector", "--config", str(config_path)], tmp_path / "collector.log", cwd=ROOT
            )

        feeder = collector()
        ports = [free_port() for _ in range(REPLICAS)]
        replicas = [
            ManagedProcess(
                [*cli, "extproc", "--config", str(config_path), "--listen", f"127.0.0.1:{port}"],
                tmp_path / f"extproc{i}.log",
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
                engines=fleet.endpoint_ids,
                edit=all_replicas,
                jwks=secret,
            )
            envoy = start_envoy(rendered, tmp_path / "envoy", admin)
            token = api_keys.mint(secret, team="ops", key_id="ops-key", user="op", expires_in_s=600)
            headers = {"Authorization": f"Bearer {token}"}
            url = f"http://127.0.0.1:{listen}/v1/chat/completions"
            statuses: Counter[int] = Counter()
            usage = {"prompt": 0, "completion": 0}
            errors: list[str] = []

            async def load(stop: asyncio.Event) -> None:
                async def worker(client: httpx.AsyncClient, w: int) -> None:
                    i = 0
                    while not stop.is_set():
                        i += 1
                        body = {
                            "model": fleet.model,
                            "messages": [{"role": "user", "content": f"failover {w} {i} " + "context " * 30}],
                            "max_tokens": 12,
                        }
                        try:
                            r = await client.post(url, json=body, headers=headers)
                        except httpx.HTTPError as exc:
                            statuses[-1] += 1
                            errors.append(repr(exc))
                            continue
                        statuses[r.status_code] += 1
                        if r.status_code == 200:
                            u = r.json()["usage"]
                            usage["prompt"] += u["prompt_tokens"]
                            usage["completion"] += u["completion_tokens"]
                        else:
                            errors.append(r.text[:300])

                async with httpx.AsyncClient(timeout=60) as client:
                    await asyncio.gather(*(worker(client, w) for w in range(6)))

            async def until_ok(n: int) -> None:
                target = statuses[200] + n
                deadline = time.monotonic() + 60
                while statuses[200] < target:
                    assert time.monotonic() < deadline, f"load stalled: {dict(statuses)} {errors[:3]}"
                    await asyncio.sleep(0.05)

            fleet_master = owner(cluster, key_slot(prefix.encode()))
            assert fleet_master is not None
            timings: dict[str, float] = {}

            async def scenario() -> None:
                stop = asyncio.Event()
                running = asyncio.create_task(load(stop))
                await until_ok(30)
                # 1. The master of the fleet slot dies; its replica must take over.
                killed = time.monotonic()
                cluster.nodes[fleet_master].kill()
                timings["promoted_after_s"] = await wait_promoted(cluster, key_slot(prefix.encode()), fleet_master)
                await until_ok(30)
                # 2. A replica process dies (no master loses its slots).
                live = set(masters(cluster))
                replica = next(p for p, proc in cluster.nodes.items() if p not in live and proc.poll() is None)
                cluster.nodes[replica].kill()
                await until_ok(20)
                # 3. The collector restarts.
                feeder.signal(signal.SIGTERM)
                while feeder.alive():
                    await asyncio.sleep(0.05)
                timings["collector_restart_at_s"] = time.monotonic() - killed
                restarted.append(collector())
                await until_ok(30)
                stop.set()
                await running

            restarted: list[ManagedProcess] = []
            asyncio.run(asyncio.wait_for(scenario(), 240))
            degraded_s = degraded_window([tmp_path / f"extproc{i}.log" for i in range(REPLICAS)])
            print(f"cluster failover: {dict(statuses)}, {timings}, degraded placement {degraded_s:.1f} s")
            assert errors == [] and set(statuses) == {200}, f"{dict(statuses)}: {errors[:5]}"
            # Placement read the store again soon after the promotion (2 node timeouts, with room for a busy host).
            assert degraded_s <= timings["promoted_after_s"] + 10, (degraded_s, timings)

            # Budgets: what the Cluster's ledger holds is what the engines counted and the clients were told.
            prompt, generated = budgets_e2e.engine_tokens(fleet.urls)
            assert (prompt, generated) == (usage["prompt"], usage["completion"])

            def ledger_settled() -> bool:
                report = budgets_e2e.budgets_cli("report", "--config", str(config_path), cwd=tmp_path)
                totals = budgets_e2e.team_totals(report).get("ops", {})
                return totals.get("input_tokens") == prompt and totals.get("output_tokens") == generated

            try:
                wait_until(ledger_settled, 30, "the budget ledger to match the engines' counters")
            except TimeoutError:
                report = budgets_e2e.budgets_cli("report", "--config", str(config_path), cwd=tmp_path)
                raise AssertionError(
                    f"ledger {budgets_e2e.team_totals(report)} vs engines {(prompt, generated)}, served {statuses[200]}"
                ) from None
            for r in restarted:
                r.stop()
        finally:
            if envoy is not None:
                envoy.stop()
            for replica in replicas:
                replica.stop()
            feeder.stop()
