"""The Redis Cluster failover scenario the gateways' tests run (tests/e2e/test_cluster_failover*_e2e.py): steady
load through a gateway, or both at once over one Cluster, while the master of the fleet slot is killed (its replica
is promoted), then a replica process, then the collector is restarted; and what the tests read back afterwards (how
long placement was degraded, the budget ledger against the engines' own token counters). docs/store.md, "Redis
Cluster and failover"."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import redis
from redis.crc import key_slot

from bench.harness.redis_cluster import Cluster
from cognitora_sim.harness.process import ManagedProcess, wait_until
from tests.support import budgets_e2e

NODE_TIMEOUT_MS = 2000
"""Redis' cluster-node-timeout: a silent master is failed over about this long after it died."""
PROMOTION_BOUND_S = 60.0
"""How long the replica may take to be promoted: measured 3-8 s here (2 node timeouts, the election's random
delay, and a failed election retried after 2 more), with room for a host whose 2 cores the rest of the suite
keeps busy. Past it the test fails with the replica's own log, which says why it did not take over."""
STALL_S = 60.0
"""How long the load may go without the requests a step waits for before the test calls it stalled."""
COLLECTOR_STOP_S = 30.0
"""A collector given SIGTERM exits within this (it drains its event streams first)."""
CLIENTS = 6


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


def store_events(log: Path) -> list[tuple[float, bool]]:
    """(time, reachable) for each "store unavailable" (False) and "store reachable again" (True) a gateway logged."""
    events: list[tuple[float, bool]] = []
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:  # (a proxy's log holds its host's lines too)
            record = json.loads(line)
        except ValueError:
            continue
        if "ts" not in record:
            continue
        at = datetime.fromisoformat(str(record["ts"]).replace("Z", "+00:00")).timestamp()
        if str(record.get("msg", "")).startswith("store unavailable"):
            events.append((at, False))
        elif record.get("msg") == "store reachable again":
            events.append((at, True))
    return events


def degraded_window(logs: Sequence[Path], since: float = 0.0, until: float = math.inf) -> float:
    """Seconds from the first "store unavailable" to the last "store reachable again" over the gateways' logs, of
    the lines logged between ``since`` and ``until`` (Unix times)."""
    events = [e for log in logs for e in store_events(log) if since <= e[0] <= until]
    down = [at for at, up in events if not up]
    up = [at for at, up in events if up]
    return max(up) - min(down) if down and up else 0.0


def placement_back(logs: Sequence[Path]) -> bool:
    """Every placing process that said "store unavailable" has said "store reachable again" since. A process logs
    only the changes (cognitora.core.fleet_view), so its lines alternate, starting with "unavailable": all are back
    when the two counts are equal, which holds in a log shared by several workers (the LiteLLM proxy's) too."""
    events = [e for log in logs for e in store_events(log)]
    return sum(1 if up else -1 for _, up in events) == 0


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


@dataclass
class Load:
    """``CLIENTS`` clients posting to ``url`` until stopped; what they were answered and told they used."""

    url: str
    headers: Mapping[str, str]
    body: Callable[[int, int], dict[str, Any]]
    """(client, request number) -> the request body; ``stream: true`` ones are read as server-sent events."""
    keepalive: bool = True
    statuses: Counter[int] = field(default_factory=Counter)
    usage: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "completion": 0})
    errors: list[str] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        async def client_loop(client: httpx.AsyncClient, w: int) -> None:
            i = 0
            while not stop.is_set():
                i += 1
                body = self.body(w, i)
                try:
                    r = await client.post(self.url, json=body, headers=dict(self.headers))
                except httpx.HTTPError as exc:
                    self.statuses[-1] += 1
                    self.errors.append(repr(exc))
                    continue
                self.statuses[r.status_code] += 1
                if r.status_code != 200:
                    self.errors.append(r.text[:300])
                    continue
                u = stream_usage(r.text) if body.get("stream") else r.json()["usage"]
                self.usage["prompt"] += u["prompt_tokens"]
                self.usage["completion"] += u["completion_tokens"]

        limits = httpx.Limits() if self.keepalive else httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            await asyncio.gather(*(client_loop(client, w) for w in range(CLIENTS)))

    async def until_ok(self, n: int) -> None:
        """Wait for ``n`` more answers 200; fail if they do not come within ``STALL_S``."""
        target = self.statuses[200] + n
        deadline = time.monotonic() + STALL_S
        while self.statuses[200] < target:
            assert time.monotonic() < deadline, f"load stalled: {dict(self.statuses)} {self.errors[:3]}"
            await asyncio.sleep(0.05)


@dataclass
class Collector:
    """The collector beside the gateways: ``start`` makes a new process (a restart appends to ``processes``)."""

    start: Callable[[], ManagedProcess]
    processes: list[ManagedProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.processes.append(self.start())

    @classmethod
    def from_config(cls, config_path: Path, log_path: Path, root: Path) -> Collector:
        """``cognitora collector --config config_path`` run from the checkout ``root``, logging to ``log_path``."""
        return cls(
            lambda: ManagedProcess(
                [sys.executable, "-m", "cognitora.cli", "collector", "--config", str(config_path)],
                log_path,
                env={"PYTHONPATH": str(root)},
                cwd=root,
            )
        )

    @property
    def current(self) -> ManagedProcess:
        return self.processes[-1]

    async def restart(self) -> None:
        """SIGTERM, wait for the exit, start a new one and wait until it says it started."""
        old = self.current
        old.signal(signal.SIGTERM)
        deadline = time.monotonic() + COLLECTOR_STOP_S
        while old.alive():
            assert time.monotonic() < deadline, f"the collector did not exit on SIGTERM: {old.log_tail()}"
            await asyncio.sleep(0.05)
        self.processes.append(self.start())
        await self.started()

    async def started(self) -> None:
        new = self.current
        deadline = time.monotonic() + 30
        while "collector started" not in new.log_tail(200):
            assert new.alive() and time.monotonic() < deadline, f"the collector did not start: {new.log_tail()}"
            await asyncio.sleep(0.1)

    def stop(self) -> None:
        for process in self.processes:
            process.stop()


@dataclass(frozen=True)
class Failover:
    """What ``fail_over_under_load`` measured: the printed timings, and when (Unix time) placement was back after
    the failover, which splits the gateways' logs into the failover's degradation and any the later steps caused."""

    timings: dict[str, float]
    back_at: float

    def degraded(self, logs: Sequence[Path]) -> tuple[float, float]:
        """(seconds placement was degraded by the failover, seconds by the replica kill and collector restart)."""
        return degraded_window(logs, until=self.back_at), degraded_window(logs, since=self.back_at)


async def fail_over_under_load(
    cluster: Cluster,
    slot: int,
    loads: Sequence[Load],
    collector: Collector,
    gateway_logs: Sequence[Path],
    bound_s: float,
) -> Failover:
    """Under ``loads`` (one per gateway, all at once): kill the master of ``slot``, wait for its replica's promotion
    and for placement to read the store again in every gateway (``gateway_logs``; at most ``bound_s`` after the
    promotion), then kill a replica process, then restart the collector, with requests answered 200 after each step
    in every load, and placement back on the store at the end (at most ``bound_s`` after the last step's answers).
    The timings it returns are in seconds from the master's kill: ``promoted_after_s``, ``placement_back_at_s``,
    ``replica_killed_at_s``, ``collector_restarted_at_s`` and ``load_after_kill_s`` (the last step's requests
    served)."""
    timings: dict[str, float] = {}
    back_at = 0.0
    fleet_master = owner(cluster, slot)
    assert fleet_master is not None
    stop = asyncio.Event()
    running = [asyncio.create_task(load.run(stop)) for load in loads]

    async def until_ok(n: int) -> None:
        await asyncio.gather(*(load.until_ok(n) for load in loads))

    try:
        await until_ok(30)
        # 1. The master of the fleet slot dies; its replica must take over.
        killed = time.monotonic()
        cluster.nodes[fleet_master].kill()
        timings["promoted_after_s"] = await wait_promoted(cluster, slot, fleet_master)
        await until_ok(30)
        # The next steps start on a recovered placement, so the tests can tell a degradation they cause apart.
        await placement_recovered(gateway_logs, killed + timings["promoted_after_s"] + bound_s)
        timings["placement_back_at_s"] = time.monotonic() - killed
        back_at = time.time()
        # 2. A replica process dies (no master loses its slots).
        live = set(masters(cluster))
        replica = next(p for p, proc in cluster.nodes.items() if p not in live and proc.poll() is None)
        cluster.nodes[replica].kill()
        timings["replica_killed_at_s"] = time.monotonic() - killed
        await until_ok(20)
        # 3. The collector restarts.
        await collector.restart()
        timings["collector_restarted_at_s"] = time.monotonic() - killed
        await until_ok(30)
        # Whatever the later steps degraded is back too, within the same bound from the restart.
        await placement_recovered(gateway_logs, time.monotonic() + bound_s)
        timings["load_after_kill_s"] = time.monotonic() - killed
    finally:
        stop.set()
        await asyncio.gather(*running)
    return Failover({k: round(v, 1) for k, v in timings.items()}, back_at)


async def placement_recovered(logs: Sequence[Path], deadline: float) -> None:
    """Wait until ``placement_back(logs)``; fail at ``deadline`` (monotonic)."""
    while not placement_back(logs):
        assert time.monotonic() < deadline, "placement did not read the store again within the bound"
        await asyncio.sleep(0.1)


def check_ledger(loads: Sequence[Load], engine_urls: Sequence[str], config: Path, cwd: Path, team: str = "ops") -> None:
    """The engines' own token counters equal what the clients (of every load) were told, and the Cluster's budget
    ledger (read by ``cognitora budgets report``) comes to equal them too: no count lost, none doubled."""
    prompt, generated = budgets_e2e.engine_tokens(engine_urls)
    told = (sum(load.usage["prompt"] for load in loads), sum(load.usage["completion"] for load in loads))
    assert (prompt, generated) == told, ((prompt, generated), told)

    def ledger_settled() -> bool:
        report = budgets_e2e.budgets_cli("report", "--config", str(config), cwd=cwd)
        totals = budgets_e2e.team_totals(report).get(team, {})
        return totals.get("input_tokens") == prompt and totals.get("output_tokens") == generated

    try:
        wait_until(ledger_settled, 30, "the budget ledger to match the engines' counters")
    except TimeoutError:
        report = budgets_e2e.budgets_cli("report", "--config", str(config), cwd=cwd)
        raise AssertionError(
            f"ledger {budgets_e2e.team_totals(report)} vs engines {(prompt, generated)}, "
            f"served {[load.statuses[200] for load in loads]}"
        ) from None
