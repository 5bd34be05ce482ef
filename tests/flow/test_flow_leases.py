"""Leases per engine shared by gateway replicas (``cognitora.flow.leases``, ``cognitora.flow.redis_leases``): one
contract for the in-process and the Redis leases, run against a real Redis and a real 3-master Redis Cluster;
replicas are separate ``RedisLeases`` on separate clients, as separate gateway processes would be."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from cognitora.flow.config import LeaseConfig
from cognitora.flow.leases import LOCAL_REPLICA, FairCharge, Leases, MemoryLeases, SharedMargin
from cognitora.flow.redis_leases import RedisLeases
from cognitora.flow.shared_served import SharedServed
from kvstate.store import StoreUnavailable

Replicas = Callable[..., Awaitable[Leases]]


@pytest.fixture(params=["memory", "redis", "cluster"])
async def replicas(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[Replicas]:
    """Makes replicas sharing one lease space: in process (one object: the memory leases are one process's), or
    each a ``RedisLeases`` with a client of its own on the same Redis (Cluster)."""
    made: list[Any] = []
    shared = MemoryLeases()

    async def make(ttl_s: float = 10.0) -> Leases:
        if request.param == "memory":
            return shared
        if request.param == "cluster":
            client: Any = RedisCluster.from_url(request.getfixturevalue("redis_cluster_url"))
        else:
            client = aioredis.Redis.from_url(request.getfixturevalue("redis_server_url"))
        leases = RedisLeases(client, key_prefix, LeaseConfig(enabled=True, replica_ttl_s=ttl_s))
        made.append((leases, client))
        return leases

    make.kind = request.param  # type: ignore[attr-defined]
    yield make
    for leases, client in made:
        await leases.close()
        await client.aclose()


async def test_capacity_holds_across_replicas(replicas: Replicas) -> None:
    """Two replicas race 2 x 10 acquires for an engine of 8 seats: exactly 8 granted, whoever asked."""
    one, two = await replicas(), await replicas()
    grants = await asyncio.gather(
        *(r.acquire("e1", f"{name}-{i}", 8) for name, r in (("one", one), ("two", two)) for i in range(10))
    )
    assert sum(g.granted for g in grants) == 8
    assert max(g.held for g in grants) == 8 and all(g.held <= 8 for g in grants)
    assert (await one.held(["e1", "e2"])) == {"e1": 8, "e2": 0}


async def test_acquire_is_idempotent_and_release_frees_a_seat(replicas: Replicas) -> None:
    one = await replicas()
    assert (await one.acquire("e1", "r1", 2)).granted
    again = await one.acquire("e1", "r1", 2)
    assert again.granted and again.held == 1  # a retried acquire is not a second lease
    assert (await one.acquire("e1", "r2", 2)).granted
    refused = await one.acquire("e1", "r3", 2)
    assert not refused.granted and refused.held == 2 and refused.capacity == 2
    await one.release("e1", "r1")
    await one.release("e1", "r1")  # idempotent
    assert (await one.acquire("e1", "r3", 2)).granted
    assert (await one.held(["e1"])) == {"e1": 2}


async def test_fairness_counters_are_shared_and_charged_only_with_a_grant(replicas: Replicas) -> None:
    one, two = await replicas(), await replicas()
    g = await one.acquire("e1", "r1", 5, FairCharge("batch", "team:a", 1500.0, peers=("team:b",)))
    assert g.served == {"team:a": 1500.0, "team:b": 0.0}
    g = await two.acquire("e1", "r2", 5, FairCharge("batch", "team:a", 500.5, peers=("team:b",)))
    assert g.served == {"team:a": 2000.5, "team:b": 0.0}
    full = await two.acquire("e1", "r3", 2, FairCharge("batch", "team:a", 999.0))
    assert not full.granted and full.served == {}
    assert await one.charge(FairCharge("batch", "team:b", 10.0, peers=("team:a",))) == {
        "team:b": 10.0,
        "team:a": 2000.5,
    }
    assert await one.charge(FairCharge("default", "team:a", 1.0)) == {"team:a": 1.0}  # bands apart


@pytest.fixture(params=["redis", "cluster"])
async def redis_client(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    if request.param == "cluster":
        client: Any = RedisCluster.from_url(request.getfixturevalue("redis_cluster_url"))
    else:
        client = aioredis.Redis.from_url(request.getfixturevalue("redis_server_url"))
    yield client
    await client.aclose()


async def test_queue_depths_add_up_across_live_replicas(redis_client: Any, key_prefix: str) -> None:
    one, two = (RedisLeases(redis_client, key_prefix, LeaseConfig(enabled=True)) for _ in range(2))
    await one.publish_depth({"batch": 3, "default": 1})
    await two.publish_depth({"batch": 4})
    await one.heartbeat()
    await two.heartbeat()
    assert await one.queued() == {"batch": 7, "default": 1}
    await two.publish_depth({})  # its queue emptied: sent as 0 once, which removes it
    await two.heartbeat()
    assert await two.queued() == {"batch": 3, "default": 1}
    await one.close()  # a replica that leaves takes its depth with it
    assert await two.queued() == {}
    await two.close()


async def test_memory_leases_report_the_last_depth_published() -> None:
    leases = MemoryLeases()
    await leases.publish_depth({"batch": 2, "default": 0})
    assert await leases.queued() == {"batch": 2}


async def test_margins_go_with_the_heartbeat_and_leave_with_the_replica(redis_client: Any, key_prefix: str) -> None:
    """Each replica's prediction margin is read back by replica once its heartbeat sent it (publishing is no round
    trip); a replica that never learned one is not listed, and one that leaves takes its margin with it."""
    one, two, quiet = (RedisLeases(redis_client, key_prefix, LeaseConfig(enabled=True)) for _ in range(3))
    one.publish_margin(SharedMargin(1.25, 40))
    two.publish_margin(SharedMargin(1.0, 3))
    assert await one.margins() == {}  # not sent yet
    for replica in (one, two, quiet):
        await replica.heartbeat()
    assert await quiet.margins() == {one.replica: SharedMargin(1.25, 40), two.replica: SharedMargin(1.0, 3)}
    one.publish_margin(SharedMargin(1.4375, 41))  # each heartbeat replaces the last
    await one.heartbeat()
    assert (await quiet.margins())[one.replica] == SharedMargin(1.4375, 41)
    await one.close()
    assert await quiet.margins() == {two.replica: SharedMargin(1.0, 3)}
    await two.close()
    await quiet.close()


async def test_a_dead_replicas_margin_stops_counting_within_its_ttl(redis_client: Any, key_prefix: str) -> None:
    """A replica dies (no heartbeat, no clean close): its margin is no longer read back once its heartbeat expired
    (1 s), and a live replica's next heartbeat deletes it."""
    config = LeaseConfig(enabled=True, replica_ttl_s=1.0)
    dead = RedisLeases(redis_client, key_prefix, config, replica="dead-replica")
    live = RedisLeases(redis_client, key_prefix, config, replica="live-replica")
    dead.publish_margin(SharedMargin(1.5, 200))
    live.publish_margin(SharedMargin(1.1, 20))
    await dead.heartbeat()
    died_at = time.monotonic()
    live.start()
    deadline = died_at + 5.0
    while "dead-replica" in (seen := await live.margins()):
        assert time.monotonic() < deadline, "the dead replica's margin never stopped counting"
        await asyncio.sleep(0.05)
    assert time.monotonic() - died_at >= 0.9
    assert seen == {"live-replica": SharedMargin(1.1, 20)}

    async def deleted() -> bool:
        return not await redis_client.hexists(live.keys.margin(), "dead-replica")

    while not await deleted():
        assert time.monotonic() < deadline, "the dead replica's margin was never deleted"
        await asyncio.sleep(0.05)
    await live.close()


async def test_memory_leases_report_the_last_margin_published() -> None:
    leases = MemoryLeases()
    assert await leases.margins() == {}
    leases.publish_margin(SharedMargin(1.2, 10))
    leases.publish_margin(SharedMargin(1.3, 11))
    assert await leases.margins() == {LOCAL_REPLICA: SharedMargin(1.3, 11)}


async def test_a_dead_replicas_leases_are_released_within_its_ttl(redis_client: Any, key_prefix: str) -> None:
    """Replica A takes every seat and dies (stops its heartbeat, no clean close). B is refused until A's
    heartbeat expires (1 s), then granted; A's leases no longer count the moment it is dead."""
    config = LeaseConfig(enabled=True, replica_ttl_s=1.0)
    dead = RedisLeases(redis_client, key_prefix, config, replica="dead-replica")
    live = RedisLeases(redis_client, key_prefix, config, replica="live-replica")
    died_at = time.monotonic()
    for i in range(4):
        assert (await dead.acquire("e1", f"d{i}", 4)).granted
    await dead.publish_depth({"batch": 9})
    await dead.heartbeat()
    assert await live.queued() == {"batch": 9}
    assert not (await live.acquire("e1", "l0", 4)).granted
    deadline = time.monotonic() + 5.0
    while not (grant := await live.acquire("e1", "l0", 4)).granted:
        assert time.monotonic() < deadline, "the dead replica's leases were never released"
        await asyncio.sleep(0.05)
    waited = time.monotonic() - died_at
    assert 0.9 <= waited < 2.5, waited  # not before the TTL; soon after it (polled every 50 ms)
    assert grant.held == 1
    assert await live.held(["e1"]) == {"e1": 1}
    assert await live.queued() == {}
    # the dead replica's own release, should it come back, frees nothing it no longer holds
    await dead.release("e1", "d0")
    assert await live.held(["e1"]) == {"e1": 1}
    await live.close()


async def test_the_heartbeat_keeps_a_live_replicas_leases(redis_client: Any, key_prefix: str) -> None:
    config = LeaseConfig(enabled=True, replica_ttl_s=1.0)
    holder = RedisLeases(redis_client, key_prefix, config)
    other = RedisLeases(redis_client, key_prefix, config)
    holder.start()
    assert (await holder.acquire("e1", "h0", 1)).granted
    await asyncio.sleep(2.0)  # twice the TTL: only the heartbeat keeps the lease
    assert not (await other.acquire("e1", "o0", 1)).granted
    await holder.close()  # a clean shutdown releases at once
    assert (await other.acquire("e1", "o0", 1)).granted
    await other.close()


async def test_a_lease_never_outlives_max_lease_s(redis_client: Any, key_prefix: str) -> None:
    config = LeaseConfig(enabled=True, replica_ttl_s=30.0, max_lease_s=10.0)
    leases = RedisLeases(redis_client, key_prefix, config)
    assert (await leases.acquire("e1", "lost", 1)).granted
    # a lost release on a live replica: the hard expiry is 10 s; shorten it on the server to see it lapse
    key = leases.keys.leases("e1")
    await redis_client.zadd(key, {f"{leases.replica} lost": 1}, xx=True)
    assert (await leases.acquire("e1", "next", 1)).granted
    await leases.close()


async def test_shared_counters_turn_into_service_elsewhere(redis_client: Any, key_prefix: str) -> None:
    """What ``SharedServed`` hands the queue: only what the other replicas served since the last read."""
    config = LeaseConfig(enabled=True)
    here, there = RedisLeases(redis_client, key_prefix, config), RedisLeases(redis_client, key_prefix, config)
    shared = SharedServed()
    seen = await here.charge(FairCharge("batch", "team:a", 100.0, peers=("team:b",)))
    assert shared.elsewhere("batch", seen, "team:a", 100.0) == {}  # first sight: a baseline
    await there.charge(FairCharge("batch", "team:b", 700.0))
    await there.charge(FairCharge("batch", "team:a", 50.0))
    seen = await here.charge(FairCharge("batch", "team:a", 100.0, peers=("team:b",)))
    assert seen == {"team:a": 250.0, "team:b": 700.0}
    assert shared.elsewhere("batch", seen, "team:a", 100.0) == {"team:a": 50.0, "team:b": 700.0}
    seen = await here.charge(FairCharge("batch", "team:a", 100.0, peers=("team:b",)))
    assert shared.elsewhere("batch", seen, "team:a", 100.0) == {}
    await here.close()
    await there.close()


async def test_an_unreachable_redis_is_store_unavailable(key_prefix: str) -> None:
    from bench.harness.redis_server import free_port

    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2)
    leases = RedisLeases(client, key_prefix, LeaseConfig(enabled=True))
    with pytest.raises(StoreUnavailable, match="flow-control leases: Redis did not answer"):
        await leases.acquire("e1", "r1", 1)
    with pytest.raises(StoreUnavailable, match="flow-control leases: Redis did not answer"):
        await leases.margins()  # what cognitora explain catches, to say its own margin instead
    await client.aclose()
