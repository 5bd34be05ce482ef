"""What is ``RedisStore``'s own beyond the contract: choosing the client, failing fast, script reloads, cleanup, and
the key layout that makes it work on a Redis Cluster (every call's keys in one slot, the slots on several nodes).

Each test runs against a real Redis and a real 3-master Redis Cluster started by the tests themselves."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from cognitora_sim.harness.process import free_port
from kvstate.memory_store import MemoryStore
from kvstate.open import open_store
from kvstate.redis_keys import RedisKeys
from kvstate.redis_store import RedisStore
from kvstate.store import EndpointSnapshot, InFlight, PrefixMatch, StoreRefused, StoreUnavailable, Tier
from tests.conftest import REDIS_PASSWORD

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
M = "meta-llama/Llama-3.1-8B-Instruct"
CHAIN = [0x1000 + i for i in range(12)]
REDIS_TIMEOUT_S = 2.0
"""Not the 0.25 s default: these tests check behaviour, on a machine shared with other suites' load."""


@dataclass(frozen=True)
class RedisTarget:
    """A real Redis to run ``RedisStore`` on: one server, or one node of a Redis Cluster."""

    url: str
    cluster: bool

    def store(self, key_prefix: str, **kw: Any) -> RedisStore:
        return RedisStore.from_url(
            self.url, key_prefix=key_prefix, socket_timeout_s=REDIS_TIMEOUT_S, cluster=self.cluster, **kw
        )

    def client(self, **kw: Any) -> aioredis.Redis | RedisCluster:
        """A plain client of the same kind, to look at the keys themselves."""
        return RedisCluster.from_url(self.url, **kw) if self.cluster else aioredis.Redis.from_url(self.url, **kw)


@pytest.fixture(params=["redis", "cluster"])
def redis_target(request: pytest.FixtureRequest) -> RedisTarget:
    if request.param == "cluster":
        return RedisTarget(request.getfixturevalue("redis_cluster_url"), cluster=True)
    return RedisTarget(request.getfixturevalue("redis_server_url"), cluster=False)


def only(result: dict[str, PrefixMatch], endpoint: str) -> PrefixMatch:
    assert endpoint in result, f"{endpoint} missing from {result}"
    return result[endpoint]


async def test_open_store_picks_the_backend(redis_target: RedisTarget, key_prefix: str) -> None:
    assert isinstance(open_store(None), MemoryStore)
    store = open_store(redis_target.url, key_prefix, cluster=redis_target.cluster)
    try:
        assert isinstance(store, RedisStore) and store.cluster is redis_target.cluster
        await store.add_blocks(M, A, CHAIN[:2])
        assert only(await store.match_prefix(M, CHAIN), A).blocks == 2
    finally:
        assert isinstance(store, RedisStore)
        await store.delete_everything()
        await store.close()


@pytest.mark.parametrize("cluster", [False, True], ids=["redis", "cluster"])
async def test_dead_redis_is_store_unavailable_quickly(cluster: bool) -> None:
    port = free_port()
    store = RedisStore.from_url(
        f"redis://127.0.0.1:{port}/0" if not cluster else f"redis://127.0.0.1:{port}", cluster=cluster
    )
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}"):
        await store.match_prefix(M, CHAIN)
    with pytest.raises(StoreUnavailable, match="running"):
        await store.inflight_add(A, "r1", 1, 1, ttl_s=1)
    with pytest.raises(StoreUnavailable, match="Redis Cluster at" if cluster else "redis-server is running"):
        await store.fleet_view(M, CHAIN, [A])
    assert await store.ping() is False
    assert time.monotonic() - started < 3.0
    await store.close()


async def test_a_refused_password_says_so_rather_than_did_not_answer(redis_with_password_url: str) -> None:
    store = RedisStore.from_url(redis_with_password_url.replace(REDIS_PASSWORD, "wrong-pw"), key_prefix="pw-test")
    try:
        with pytest.raises(StoreRefused, match="refused the credentials") as err:
            await store.fleet_view(M, CHAIN, [A])
        assert "wrong-pw" not in str(err.value)
        assert await store.ping() is False
    finally:
        await store.close()


async def test_redis_store_on_a_caller_client_with_decoded_responses(
    redis_target: RedisTarget, key_prefix: str
) -> None:
    client = redis_target.client(decode_responses=True)
    store = RedisStore(client, key_prefix=key_prefix)
    try:
        assert store.cluster is redis_target.cluster
        await store.add_blocks(M, A, CHAIN[:5], Tier.CPU)
        assert await store.match_prefix(M, CHAIN) == {A: PrefixMatch(5, pytest.approx(4.0))}  # type: ignore[arg-type]
        await store.inflight_add(A, "r1", 10, 2, ttl_s=60)
        assert (await store.inflight([A]))[A] == InFlight(1, 10, 2)
        snap = EndpointSnapshot(endpoint=A, running=2, joules_per_token=1.5)
        await store.put_snapshot(snap)
        assert (await store.snapshots())[A] == snap
        await store.mark_unhealthy(A, "reset", ttl_s=60)
        assert (await store.health_marks([A]))[A].reason == "reset"
        view = await store.fleet_view(M, CHAIN, [A])
        assert (view.matches[A].blocks, view.inflight[A], view.snapshots, set(view.health_marks)) == (
            5,
            InFlight(1, 10, 2),
            {A: snap},
            {A},
        )
        await store.delete_everything()
        await store.close()  # the caller's client stays open
        assert await client.ping()
    finally:
        await client.aclose()


async def test_redis_rejects_keys_that_are_not_64_bit(redis_target: RedisTarget, key_prefix: str) -> None:
    store = redis_target.store(key_prefix)
    try:
        with pytest.raises(ValueError, match="unsigned 64-bit"):
            await store.add_blocks(M, A, [1, -5])
        with pytest.raises(ValueError, match="unsigned 64-bit"):
            await store.match_prefix(M, [2**64])
    finally:
        await store.delete_everything()
        await store.close()


async def test_scripts_the_server_forgot_are_loaded_again(redis_target: RedisTarget, key_prefix: str) -> None:
    # A restarted Redis (or a new Cluster node after a failover) knows none of the store's scripts.
    store = redis_target.store(key_prefix)
    raw = redis_target.client()
    try:
        await store.add_blocks(M, A, CHAIN)
        await store.inflight_add(A, "r1", 10, 2, ttl_s=60)
        await raw.script_flush()  # on a Cluster: every node's
        view = await store.fleet_view(M, CHAIN, [A])  # two scripts in one pipeline
        assert (view.matches, view.inflight) == ({A: PrefixMatch(12, 12.0)}, {A: InFlight(1, 10, 2)})
        await raw.script_flush()
        await store.add_blocks(M, B, CHAIN[:3])  # one script alone
        assert only(await store.match_prefix(M, CHAIN), B).blocks == 3
    finally:
        await store.delete_everything()
        await store.close()
        await raw.aclose()


async def test_delete_everything_leaves_no_key_behind(redis_target: RedisTarget, key_prefix: str) -> None:
    store = redis_target.store(key_prefix)
    await store.add_blocks(M, A, CHAIN)
    await store.add_blocks("other-model", B, CHAIN, Tier.CPU)
    await store.add_speculative(M, C, CHAIN, ttl_s=60)
    await store.inflight_add(A, "r1", 1, 1, ttl_s=60)
    await store.put_snapshot(EndpointSnapshot(endpoint=C))
    await store.mark_unhealthy(B, "reset", ttl_s=60)
    await store.put_heartbeat("collector", ttl_s=60)
    raw = redis_target.client()  # on a Cluster, SCAN walks every node
    try:
        assert [k async for k in raw.scan_iter(match=f"{key_prefix}:*", count=10_000)]
        await store.delete_everything()
        assert [k async for k in raw.scan_iter(match=f"{key_prefix}:*", count=10_000)] == []
    finally:
        await raw.aclose()
        await store.close()


# -- the key layout on a Redis Cluster -----------------------------------------------------------------------


def test_every_script_calls_keys_share_one_slot() -> None:
    # Braces in a model name are escaped, so its hash tag stays whole; endpoint names follow the tag, so they
    # never move a key. The cluster tests below prove the same on real nodes; this says which call broke it.
    store = RedisStore(aioredis.Redis(), key_prefix="cog")
    for model in (M, "lora{adapter}", "a}b{c"):
        calls = store.fleet_view_script_calls(model, CHAIN, [A, "h{x}:1", B], snapshots_held=False)
        assert len(calls) == 2  # the match in the model's slot, the rest in the fleet slot
        match_slots = {key_slot(k.encode()) for k in calls[0][1]}
        assert match_slots == {key_slot(RedisKeys("cog").endpoint_ids(model).encode())}, model
        assert len({key_slot(k.encode()) for k in calls[1][1]}) == 1
        k = RedisKeys("cog")
        index = [k.block(model, 7), k.endpoint_blocks(model, "h{x}:1"), k.endpoint_speculative(model, "h{x}:1")]
        index += [k.endpoint_ids(model), k.endpoint_names(model), k.free_ids(model)]
        assert len({key_slot(key.encode()) for key in index}) == 1, model
    keys = RedisKeys("cog")
    fleet = [keys.inflight(A), keys.inflight_tokens("h{x}:1"), keys.snapshot(B), keys.snapshot_endpoints()]
    fleet += [keys.snapshot_version(), keys.health(), keys.heartbeats(), keys.models()]
    assert len({key_slot(k.encode()) for k in fleet}) == 1


def _node_of(client: RedisCluster, key: str) -> str:
    node = client.get_node_from_key(key)
    assert node is not None
    return str(node.name)


async def test_the_store_works_with_its_slots_on_different_cluster_nodes(redis_cluster_url: str) -> None:
    raw = RedisCluster.from_url(redis_cluster_url)
    await raw.initialize()
    # A prefix whose fleet slot and a second model whose index are each on another node than M's index, so every
    # call below that reads or writes two kinds of slot crosses nodes.
    model_node = _node_of(raw, RedisKeys("x").endpoint_ids(M))
    prefix = next(
        p
        for p in (f"cogtest-{uuid.uuid4().hex[:8]}" for _ in range(1000))
        if _node_of(raw, RedisKeys(p).health()) != model_node
    )
    keys = RedisKeys(prefix)
    fleet_node = _node_of(raw, keys.health())
    other = next(
        m
        for m in (f"other-{i}" for i in range(1000))
        if _node_of(raw, keys.endpoint_ids(m)) not in {model_node, fleet_node}
    )
    store = RedisStore.from_url(redis_cluster_url, key_prefix=prefix, socket_timeout_s=REDIS_TIMEOUT_S, cluster=True)
    try:
        await store.add_blocks(M, A, CHAIN)
        await store.add_blocks(other, A, CHAIN[:4], Tier.CPU)
        await store.add_blocks(M, B, CHAIN[:6])
        await store.remove_blocks(M, B, CHAIN[3:4])
        await store.add_speculative(M, C, CHAIN[:2], ttl_s=60)
        await store.inflight_add(A, "r1", 100, 10, ttl_s=60)
        await store.inflight_add(B, "r2", 50, 5, ttl_s=60)
        await store.inflight_release(B, "r2")
        snap = EndpointSnapshot(A, running=3, mean_service_s=2.0)
        await store.put_snapshot(snap)
        await store.mark_unhealthy(B, "connection refused", ttl_s=60)

        view = await store.fleet_view(M, CHAIN, [A, B, C])
        assert view.matches == {A: PrefixMatch(12, 12.0), B: PrefixMatch(3, 3.0), C: PrefixMatch(2, 2.0)}
        assert view.inflight == {A: InFlight(1, 100, 10), B: InFlight(), C: InFlight()}
        assert view.snapshots == {A: snap} and set(view.health_marks) == {B}
        assert await store.snapshots() == {A: snap}  # every endpoint: the registry is in the fleet slot
        assert await store.match_prefix(other, CHAIN) == {A: PrefixMatch(4, pytest.approx(3.2))}  # type: ignore[arg-type]

        # the data really is spread: each of the three nodes holds some of this store's keys
        holders = set()
        for node in raw.get_primaries():
            plain = aioredis.Redis(host=node.host, port=int(node.port))
            if [k async for k in plain.scan_iter(match=f"{prefix}:*", count=10_000)]:
                holders.add(node.name)
            await plain.aclose()
        assert holders == {model_node, fleet_node, _node_of(raw, keys.endpoint_ids(other))}

        await store.clear_endpoint(A)  # every model: walks the registry in the fleet slot, purges on two nodes
        assert await store.match_prefix(M, CHAIN) == {B: PrefixMatch(3, 3.0), C: PrefixMatch(2, 2.0)}
        assert await store.match_prefix(other, CHAIN) == {}
    finally:
        await store.delete_everything()
        await store.close()
    try:
        assert [k async for k in raw.scan_iter(match=f"{prefix}:*", count=10_000)] == []
    finally:
        await raw.aclose()


async def _moved_replies(client: RedisCluster) -> int:
    """How many MOVED redirections the cluster's primaries have answered (their ``INFO errorstats``)."""
    total = 0
    for node in client.get_primaries():
        plain = aioredis.Redis(host=node.host, port=int(node.port))
        try:
            stats = await plain.info("errorstats")
        finally:
            await plain.aclose()
        total += int(stats.get("errorstat_MOVED", {}).get("count", 0))
    return total


async def test_concurrent_calls_on_a_new_cluster_store_go_straight_to_their_nodes(
    redis_cluster_url: str, key_prefix: str
) -> None:
    # redis-py's asyncio RedisCluster picks a command's node before it learns the topology, so concurrent calls on
    # a new client went to random primaries; the MOVED replies made it close every connection, other calls' in
    # flight ones too, and a gateway saw StoreUnavailable ("Connection closed by server") on a healthy cluster.
    raw = RedisCluster.from_url(redis_cluster_url)
    await raw.initialize()
    store = RedisTarget(redis_cluster_url, cluster=True).store(key_prefix)  # a new client, never used before
    try:
        moved_before = await _moved_replies(raw)
        await asyncio.gather(
            *(store.put_snapshot(EndpointSnapshot(A if i % 2 else B, running=i)) for i in range(10)),
            *(store.inflight_add(C, f"r{i}", 10, 1, ttl_s=60) for i in range(10)),
            *(store.mark_unhealthy(C, "reset", ttl_s=60) for _ in range(5)),
            *(store.fleet_view(M, CHAIN, [A, B, C]) for _ in range(10)),
            *(store.match_prefix(M, CHAIN) for _ in range(5)),
        )
        assert await _moved_replies(raw) == moved_before  # every command went to the node serving its keys
        assert (await store.inflight([C]))[C] == InFlight(10, 100, 10)
        assert set(await store.snapshots()) == {A, B}
    finally:
        await store.delete_everything()
        await store.close()
        await raw.aclose()


async def test_more_concurrent_reads_than_a_default_pool_holds_all_succeed(
    redis_target: RedisTarget, key_prefix: str
) -> None:
    # redis-py's default asyncio pool raises once its connections are all in use: a gateway with 300 requests in
    # flight then placed most of them on local state (StoreUnavailable). The store's pool waits for a connection.
    store = redis_target.store(key_prefix)
    try:
        await store.add_blocks(M, A, CHAIN)
        await store.put_snapshot(EndpointSnapshot(endpoint=A, last_seen=time.time(), running=1))
        views = await asyncio.gather(*(store.fleet_view(M, CHAIN, [A, B]) for _ in range(300)), return_exceptions=True)
        failed = [v for v in views if isinstance(v, BaseException)]
        assert not failed, f"{len(failed)} of 300 reads failed, e.g. {failed[0]!r}"
        assert all(only(v.matches, A).blocks == len(CHAIN) for v in views if not isinstance(v, BaseException))
    finally:
        await store.delete_everything()
        await store.close()
