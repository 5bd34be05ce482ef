"""One contract for every ``Store`` backend: ``MemoryStore``, and ``RedisStore`` against a real Redis and against
a real 3-master Redis Cluster that the tests start themselves (``bench/harness/redis_cluster.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kvstate.memory_store import MemoryStore
from kvstate.redis_store import RedisStore
from kvstate.store import (
    SPECULATIVE_WEIGHT,
    EndpointSnapshot,
    FleetView,
    InFlight,
    PrefixMatch,
    Store,
    Tier,
)

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
M = "meta-llama/Llama-3.1-8B-Instruct"
CHAIN = [0x1000 + i for i in range(12)]
TTL_S = 2.0
"""Short enough to keep the suite fast, long enough that a loaded machine still sees the entry before it expires."""
REDIS_TIMEOUT_S = 2.0
"""Not the 0.25 s default: these tests check behaviour, on a machine shared with other suites' load."""


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Backend:
    """A store under test plus how time passes for it: a fake clock in memory, the Redis server's own clock."""

    name: str
    make: Callable[..., Store]
    clock: FakeClock | None

    async def eventually(self, condition: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not await condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
            if self.clock is not None:
                self.clock.now += 0.1
            else:
                await asyncio.sleep(0.05)


@pytest.fixture(params=["memory", "redis", "cluster"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        clock = FakeClock()
        yield Backend("memory", lambda **kw: MemoryStore(clock=clock, **kw), clock)
        return
    cluster = request.param == "cluster"
    url = request.getfixturevalue("redis_cluster_url" if cluster else "redis_server_url")
    prefix = request.getfixturevalue("key_prefix")
    made: list[RedisStore] = []

    def make(**kw: Any) -> Store:
        store = RedisStore.from_url(url, key_prefix=prefix, socket_timeout_s=REDIS_TIMEOUT_S, cluster=cluster, **kw)
        made.append(store)
        return store

    yield Backend(request.param, make, None)
    for store in made:
        await store.delete_everything()
        await store.close()


@pytest.fixture
def store(backend: Backend) -> Store:
    return backend.make()


def only(result: dict[str, PrefixMatch], endpoint: str) -> PrefixMatch:
    assert endpoint in result, f"{endpoint} missing from {result}"
    return result[endpoint]


# -- KV block index ------------------------------------------------------------------------------------------


async def test_is_a_store(store: Store) -> None:
    assert isinstance(store, Store)
    assert await store.ping()


async def test_longest_prefix_per_endpoint(store: Store) -> None:
    await store.add_blocks(M, A, CHAIN)
    await store.add_blocks(M, B, CHAIN[:4])
    result = await store.match_prefix(M, CHAIN)
    assert result == {A: PrefixMatch(12, 12.0), B: PrefixMatch(4, 4.0)}


async def test_nothing_held_is_absent(store: Store) -> None:
    assert await store.match_prefix(M, CHAIN) == {}
    await store.add_blocks(M, A, CHAIN[1:])  # everything but the first block: no prefix at all
    assert await store.match_prefix(M, CHAIN) == {}
    assert await store.match_prefix(M, []) == {}


async def test_a_hole_stops_the_match(store: Store) -> None:
    await store.add_blocks(M, A, CHAIN[:3] + CHAIN[4:])
    assert await store.match_prefix(M, CHAIN) == {A: PrefixMatch(3, 3.0)}


async def test_models_are_separate_key_spaces(store: Store) -> None:
    await store.add_blocks("other-model", A, CHAIN)
    assert await store.match_prefix(M, CHAIN) == {}
    assert only(await store.match_prefix("other-model", CHAIN), A).blocks == 12


async def test_tier_weights_best_tier_wins_per_block(store: Store) -> None:
    await store.add_blocks(M, A, CHAIN[:4], Tier.CPU)
    await store.add_blocks(M, A, CHAIN[4:6], Tier.DISK)
    await store.add_blocks(M, A, CHAIN[:2], Tier.GPU)  # blocks 0-1 now in GPU and CPU: GPU counts
    match = only(await store.match_prefix(M, CHAIN), A)
    assert match.blocks == 6
    assert match.weighted_blocks == pytest.approx(2 * 1.0 + 2 * 0.8 + 2 * 0.5)
    # what a reload would cost: blocks 2-3 from host memory, 4-5 from disk (blocks 0-1 are on the GPU)
    assert (match.cpu_blocks, match.disk_blocks) == (2, 2)


async def test_off_gpu_counts_cover_the_matched_prefix_only(store: Store) -> None:
    await store.add_blocks(M, A, CHAIN[:3], Tier.CPU)
    await store.add_blocks(M, A, CHAIN[4:8], Tier.DISK)  # after the hole at block 3: not part of the match
    await store.add_blocks(M, B, CHAIN[:5], Tier.GPU)
    await store.add_blocks(M, B, CHAIN[5:7], Tier.DISK)
    got = await store.match_prefix(M, CHAIN)
    assert (got[A].blocks, got[A].cpu_blocks, got[A].disk_blocks) == (3, 3, 0)
    assert (got[B].blocks, got[B].cpu_blocks, got[B].disk_blocks) == (7, 0, 2)


async def test_custom_tier_weights(backend: Backend) -> None:
    store = backend.make(tier_weights={Tier.CPU: 0.25})
    await store.add_blocks(M, A, CHAIN[:4], Tier.CPU)
    assert only(await store.match_prefix(M, CHAIN), A).weighted_blocks == pytest.approx(1.0)


async def test_remove_one_tier_keeps_the_others(store: Store) -> None:
    await store.add_blocks(M, A, CHAIN[:4], Tier.GPU)
    await store.add_blocks(M, A, CHAIN[:4], Tier.CPU)
    await store.remove_blocks(M, A, CHAIN[:4], Tier.GPU)
    assert only(await store.match_prefix(M, CHAIN), A).weighted_blocks == pytest.approx(4 * 0.8)
    await store.remove_blocks(M, A, CHAIN[2:3], Tier.CPU)
    assert await store.match_prefix(M, CHAIN) == {A: PrefixMatch(2, pytest.approx(1.6))}  # type: ignore[arg-type]


async def test_remove_all_tiers_makes_a_hole(store: Store) -> None:
    await store.add_blocks(M, A, CHAIN, Tier.GPU)
    await store.add_blocks(M, A, CHAIN, Tier.DISK)
    await store.remove_blocks(M, A, [CHAIN[5]])
    assert await store.match_prefix(M, CHAIN) == {A: PrefixMatch(5, 5.0)}
    await store.remove_blocks(M, B, CHAIN)  # nothing held there: a no-op, not an error
    await store.remove_blocks(M, A, [])


async def test_endpoints_filter(store: Store) -> None:
    await store.add_blocks(M, A, CHAIN)
    await store.add_blocks(M, B, CHAIN[:5])
    assert await store.match_prefix(M, CHAIN, endpoints=[B, C]) == {B: PrefixMatch(5, 5.0)}
    assert await store.match_prefix(M, CHAIN, endpoints=[]) == {}
    assert await store.match_prefix(M, CHAIN, endpoints=[B, B]) == {B: PrefixMatch(5, 5.0)}


async def test_long_chain_in_one_call(store: Store) -> None:
    chain = list(range(1, 5001))  # longer than one script chunk
    await store.add_blocks(M, A, chain)
    await store.add_blocks(M, B, chain[:3001])
    result = await store.match_prefix(M, chain)
    assert result[A].blocks == 5000
    assert result[B].blocks == 3001


async def test_clear_endpoint_for_one_model(store: Store) -> None:
    await store.add_blocks(M, A, CHAIN)
    await store.add_blocks(M, B, CHAIN)
    await store.add_blocks("other-model", A, CHAIN)
    await store.clear_endpoint(A, M)
    assert set(await store.match_prefix(M, CHAIN)) == {B}
    assert set(await store.match_prefix("other-model", CHAIN)) == {A}


async def test_clear_endpoint_for_every_model(store: Store) -> None:
    await store.add_blocks(M, A, CHAIN)
    await store.add_speculative(M, A, [0x9999], ttl_s=60)
    await store.add_blocks("other-model", A, CHAIN, Tier.CPU)
    await store.add_blocks(M, B, CHAIN[:2])
    await store.clear_endpoint(A)
    assert await store.match_prefix(M, CHAIN) == {B: PrefixMatch(2, 2.0)}
    assert await store.match_prefix(M, [0x9999]) == {}
    assert await store.match_prefix("other-model", CHAIN) == {}
    await store.add_blocks(M, A, CHAIN[:1])  # usable again afterwards
    assert only(await store.match_prefix(M, CHAIN), A).blocks == 1


async def test_cached_blocks_counts_what_the_kv_events_confirmed_per_endpoint(store: Store) -> None:
    # What the tie-break's load bound reads (via the scraper's snapshot): every model and tier, never a guess.
    assert await store.cached_blocks(A) == 0
    await store.add_blocks(M, A, CHAIN)  # BlockStored
    await store.add_blocks(M, A, CHAIN[:4], Tier.CPU)  # the same blocks in another tier: no more blocks
    await store.add_blocks("other-model", A, CHAIN[:5], Tier.CPU)
    await store.add_blocks(M, B, CHAIN[:3])
    await store.add_speculative(M, A, [0x9999, 0x9998], ttl_s=60)  # routed, not confirmed: not counted
    assert (await store.cached_blocks(A), await store.cached_blocks(B)) == (12 + 5, 3)
    await store.remove_blocks(M, A, CHAIN[:2])  # BlockRemoved
    await store.remove_blocks(M, A, CHAIN[2:4], Tier.CPU)  # still on the GPU: still held
    assert await store.cached_blocks(A) == 10 + 5
    await store.clear_endpoint(A, "other-model")
    assert await store.cached_blocks(A) == 10
    await store.clear_endpoint(A)  # AllBlocksCleared, or a purge
    assert (await store.cached_blocks(A), await store.cached_blocks(B)) == (0, 3)
    assert await store.cached_blocks(C) == 0


async def test_a_purged_endpoints_place_is_reused_cleanly(store: Store) -> None:
    await store.add_blocks(M, A, CHAIN)
    await store.add_speculative(M, A, [0x7777], ttl_s=60)
    await store.add_blocks(M, B, CHAIN)
    await store.clear_endpoint(A)
    await store.add_blocks(M, C, CHAIN[:3])  # may take over A's internal slot: it must not inherit A's blocks
    assert await store.match_prefix(M, CHAIN) == {B: PrefixMatch(12, 12.0), C: PrefixMatch(3, 3.0)}
    assert await store.match_prefix(M, [0x7777]) == {}


async def test_many_endpoints(store: Store) -> None:
    fleet = [f"10.1.0.{i}:8000" for i in range(20)]
    for i, endpoint in enumerate(fleet):
        await store.add_blocks(M, endpoint, CHAIN[: 1 + i % 12], Tier.CPU if i % 2 else Tier.GPU)
    result = await store.match_prefix(M, CHAIN)
    assert {e: m.blocks for e, m in result.items()} == {e: 1 + i % 12 for i, e in enumerate(fleet)}
    assert result[fleet[3]].weighted_blocks == pytest.approx(4 * 0.8)
    picked = await store.match_prefix(M, CHAIN, endpoints=[fleet[19], fleet[4], "10.9.9.9:1"])
    assert picked == {fleet[19]: PrefixMatch(8, pytest.approx(6.4)), fleet[4]: PrefixMatch(5, 5.0)}  # type: ignore[arg-type]


async def test_speculative_entries_count_then_expire(backend: Backend) -> None:
    store = backend.make()
    await store.add_blocks(M, A, CHAIN[:3])
    await store.add_speculative(M, A, CHAIN[3:6], ttl_s=TTL_S)
    await store.add_speculative(M, B, CHAIN[:2], ttl_s=TTL_S)
    result = await store.match_prefix(M, CHAIN)
    assert result == {A: PrefixMatch(6, 3.0 + 3 * SPECULATIVE_WEIGHT), B: PrefixMatch(2, 2 * SPECULATIVE_WEIGHT)}

    async def expired() -> bool:
        return await store.match_prefix(M, CHAIN) == {A: PrefixMatch(3, 3.0)}

    await backend.eventually(expired, "speculative entries to expire")


async def test_a_speculative_entry_fills_a_hole(store: Store) -> None:
    await store.add_blocks(M, A, CHAIN[:3] + CHAIN[4:8], Tier.CPU)
    await store.add_speculative(M, A, CHAIN[3:4], ttl_s=60)
    assert await store.match_prefix(M, CHAIN) == {A: PrefixMatch(8, pytest.approx(7 * 0.8 + SPECULATIVE_WEIGHT))}  # type: ignore[arg-type]


async def test_confirmed_speculative_entry_takes_its_tier(backend: Backend) -> None:
    store = backend.make()
    await store.add_speculative(M, A, CHAIN[:4], ttl_s=60)
    await store.add_blocks(M, A, CHAIN[:4], Tier.DISK)
    assert await store.match_prefix(M, CHAIN) == {A: PrefixMatch(4, 2.0)}
    await store.remove_blocks(M, A, CHAIN[:4])  # the engine evicted them: the old guess must not come back
    assert await store.match_prefix(M, CHAIN) == {}


# -- bounded memory ------------------------------------------------------------------------------------------


async def test_cap_forgets_the_oldest_blocks_tails_first(backend: Backend) -> None:
    store = backend.make(max_blocks_per_endpoint=8)
    old, new = CHAIN[:6], [0x2000 + i for i in range(6)]
    await store.add_blocks(M, A, old)
    await store.add_blocks(M, A, new)
    # 12 blocks, cap 8: the older chain loses its 4 tail blocks, its head survives.
    assert (await store.match_prefix(M, old)) == {A: PrefixMatch(2, 2.0)}
    assert (await store.match_prefix(M, new)) == {A: PrefixMatch(6, 6.0)}
    await store.add_blocks(M, B, old)  # the cap is per endpoint
    assert only(await store.match_prefix(M, old), B).blocks == 6


async def test_routing_to_blocks_refreshes_them(backend: Backend) -> None:
    store = backend.make(max_blocks_per_endpoint=6)
    first, second = CHAIN[:3], CHAIN[3:6]
    await store.add_blocks(M, A, first)
    await store.add_blocks(M, A, second)
    await store.match_prefix(M, first)  # a read: changes nothing
    await store.add_speculative(M, A, first, ttl_s=60)  # routed there: reused, so the youngest now
    await store.add_blocks(M, A, [0x3000, 0x3001, 0x3002])
    assert await store.match_prefix(M, first) == {A: PrefixMatch(3, 3.0)}  # still confirmed (GPU), not guesses
    assert await store.match_prefix(M, second) == {}


# -- in-flight -----------------------------------------------------------------------------------------------


async def test_inflight_counts_and_release_is_idempotent(store: Store) -> None:
    await store.inflight_add(A, "r1", 1000, 200, ttl_s=60)
    await store.inflight_add(A, "r2", 500, 100, ttl_s=60)
    await store.inflight_add(B, "r3", 10, 1, ttl_s=60)
    assert await store.inflight([A, B, C]) == {A: InFlight(2, 1500, 300), B: InFlight(1, 10, 1), C: InFlight()}
    await store.inflight_prefill_done(A, "r1")
    assert (await store.inflight([A]))[A] == InFlight(2, 500, 300)
    await store.inflight_release(A, "r1")
    await store.inflight_release(A, "r1")
    await store.inflight_release(A, "never-added")
    await store.inflight_prefill_done(A, "never-added")
    assert await store.inflight([A, B]) == {A: InFlight(1, 500, 100), B: InFlight(1, 10, 1)}
    await store.inflight_add(A, "r2", 700, 100, ttl_s=60)  # re-adding the same id replaces, never double counts
    assert (await store.inflight([A]))[A] == InFlight(1, 700, 100)
    assert await store.inflight([]) == {}


async def test_inflight_heals_when_a_gateway_dies(backend: Backend) -> None:
    store = backend.make()
    await store.inflight_add(A, "lost", 4000, 100, ttl_s=TTL_S)  # its gateway never releases it
    await store.inflight_add(A, "alive", 100, 10, ttl_s=600)
    assert (await store.inflight([A]))[A] == InFlight(2, 4100, 110)

    async def healed() -> bool:
        return (await store.inflight([A]))[A] == InFlight(1, 100, 10)

    await backend.eventually(healed, "the abandoned in-flight request to expire")


# -- snapshots -----------------------------------------------------------------------------------------------


async def test_snapshots_round_trip(store: Store) -> None:
    a = EndpointSnapshot(
        endpoint=A,
        healthy=False,
        last_seen=1_700_000_123.25,
        running=3,
        waiting=7,
        kv_usage=0.625,
        prefill_tokens_per_s=12345.5,
        decode_tokens_per_s=321.0,
        power_watts=250.5,
        energy_joules=1e9 + 0.5,
        block_size=16,
        consecutive_failures=2,
        mean_service_s=12.5,
        joules_per_token=0.0625,
        prompt_tokens_total=1e12 + 3.0,
        generation_tokens_total=42.0,
        prefix_cache_hits_total=0.0,
        prefix_cache_queries_total=7.0,
        requests_finished_total=5.0,
        cached_blocks=4321,
    )
    b = EndpointSnapshot(endpoint=B)
    await store.put_snapshot(a)
    await store.put_snapshot(b)
    assert await store.snapshots() == {A: a, B: b}
    assert await store.snapshots([B, C]) == {B: b}
    newer = EndpointSnapshot(endpoint=B, running=9)
    await store.put_snapshot(newer)
    assert (await store.snapshots([B]))[B] == newer
    # a field the newer snapshot does not know (None) must not show the older one's value through
    await store.put_snapshot(
        EndpointSnapshot(endpoint=A, mean_service_s=None, joules_per_token=None, cached_blocks=None)
    )
    assert (await store.snapshots([A]))[A] == EndpointSnapshot(endpoint=A)


# -- gateway health marks ------------------------------------------------------------------------------------


async def test_health_marks_are_their_own_record_and_leave_snapshots_alone(store: Store) -> None:
    old = EndpointSnapshot(A, last_seen=1_000.0, running=5)
    await store.put_snapshot(old)
    before = time.time()
    await store.mark_unhealthy(A, "connection refused", ttl_s=60)
    await store.mark_unhealthy(B, "HTTP 503", ttl_s=60)
    marks = await store.health_marks([A, B, C])
    assert set(marks) == {A, B}
    assert (marks[A].reason, marks[B].reason) == ("connection refused", "HTTP 503")
    assert await store.health_marks() == marks
    assert await store.health_marks([C]) == {}
    assert await store.health_marks([]) == {}
    # the snapshot is what the scraper wrote: a mark does not make its load look fresh
    assert await store.snapshots([A]) == {A: old}
    if not isinstance(store, MemoryStore):  # the memory backend under test runs on a fake clock
        assert before - 1 <= marks[A].since <= time.time() + 1  # the Redis server's clock, on this machine


async def test_a_new_mark_replaces_the_previous_one_and_its_time_to_live(backend: Backend) -> None:
    store = backend.make()
    await store.mark_unhealthy(A, "connection refused", ttl_s=TTL_S)
    await store.mark_unhealthy(A, "reset", ttl_s=600)
    await store.mark_unhealthy(B, "witness", ttl_s=TTL_S)  # marked with A's first time to live, after it
    assert (await store.health_marks([A]))[A].reason == "reset"

    async def witness_expired() -> bool:
        return B not in await store.health_marks([B])

    await backend.eventually(witness_expired, "the short-lived mark to expire")
    assert (await store.health_marks([A]))[A].reason == "reset"  # A's first, shorter time to live is gone too


async def test_health_marks_expire(backend: Backend) -> None:
    store = backend.make()
    await store.mark_unhealthy(A, "connection refused", ttl_s=TTL_S)
    await store.mark_unhealthy(B, "reset", ttl_s=600)
    assert set(await store.health_marks([A, B])) == {A, B}

    async def expired() -> bool:
        return set(await store.health_marks([A, B])) == {B} and set(await store.health_marks()) == {B}

    await backend.eventually(expired, "the short-lived mark to expire")
    assert set((await store.fleet_view(M, CHAIN, [A, B])).health_marks) == {B}


# -- everything placement reads in one call ------------------------------------------------------------------


async def test_fleet_view_is_the_three_reads_together(store: Store) -> None:
    await store.add_blocks(M, A, CHAIN)
    await store.add_blocks(M, B, CHAIN[:4], Tier.CPU)
    await store.add_speculative(M, C, CHAIN[:2], ttl_s=60)
    await store.inflight_add(A, "r1", 1000, 200, ttl_s=60)
    await store.inflight_add(A, "r2", 500, 100, ttl_s=60)
    await store.inflight_prefill_done(A, "r2")
    await store.inflight_add(C, "r3", 10, 1, ttl_s=60)
    a, b = EndpointSnapshot(A, running=2, kv_usage=0.5, mean_service_s=1.5), EndpointSnapshot(B, healthy=False)
    await store.put_snapshot(a)
    await store.put_snapshot(b)
    await store.mark_unhealthy(C, "connection refused", ttl_s=60)
    await store.mark_unhealthy("10.9.9.9:1", "not asked for", ttl_s=60)
    marks = await store.health_marks([C])

    view = await store.fleet_view(M, CHAIN[:8], [A, B, C, A])  # a repeated endpoint is answered once
    assert view == FleetView(
        matches={A: PrefixMatch(8, 8.0), B: PrefixMatch(4, pytest.approx(3.2)), C: PrefixMatch(2, 2.0)},  # type: ignore[arg-type]
        inflight={A: InFlight(2, 1000, 300), B: InFlight(), C: InFlight(1, 10, 1)},
        snapshots={A: a, B: b},
        health_marks=marks,
    )
    assert set(marks) == {C} and marks[C].reason == "connection refused"
    assert view.matches == await store.match_prefix(M, CHAIN[:8], [A, B, C])
    assert view.inflight == await store.inflight([A, B, C])
    assert view.snapshots == await store.snapshots([A, B, C])
    assert view.health_marks == await store.health_marks([A, B, C])

    # only the endpoints asked for; no keys, no matches; a model nobody holds, no matches
    assert await store.fleet_view(M, CHAIN, [B]) == FleetView(
        {B: PrefixMatch(4, pytest.approx(3.2))},  # type: ignore[arg-type]
        {B: InFlight()},
        {B: b},
    )
    assert await store.fleet_view(M, [], [A, C]) == FleetView(
        {}, {A: InFlight(2, 1000, 300), C: InFlight(1, 10, 1)}, {A: a}, marks
    )
    assert (await store.fleet_view("other-model", CHAIN, [A])).matches == {}
    assert await store.fleet_view(M, CHAIN, []) == FleetView({}, {}, {})


async def test_fleet_view_sees_every_new_snapshot_at_once(backend: Backend) -> None:
    reader = backend.make()
    # on Redis another gateway replica writes, through its own store; in memory there is only one store
    writer = reader if backend.name == "memory" else backend.make()
    await writer.put_snapshot(EndpointSnapshot(A, running=1))
    assert (await reader.fleet_view(M, CHAIN, [A, B])).snapshots == {A: EndpointSnapshot(A, running=1)}
    assert (await reader.fleet_view(M, CHAIN, [A, B])).snapshots == {A: EndpointSnapshot(A, running=1)}

    await writer.put_snapshot(EndpointSnapshot(A, healthy=False, running=1))
    await writer.put_snapshot(EndpointSnapshot(B, running=4))
    expected = {A: EndpointSnapshot(A, healthy=False, running=1), B: EndpointSnapshot(B, running=4)}
    assert (await reader.fleet_view(M, CHAIN, [A, B])).snapshots == expected
    # an endpoint set not read before is read, not assumed absent
    await reader.put_snapshot(EndpointSnapshot(C, waiting=3))
    assert (await reader.fleet_view(M, CHAIN, [C])).snapshots == {C: EndpointSnapshot(C, waiting=3)}
    assert (await reader.fleet_view(M, CHAIN, [A, B, C])).snapshots == {**expected, C: EndpointSnapshot(C, waiting=3)}


async def test_fleet_view_after_concurrent_reads_and_writes_agrees_with_the_store(backend: Backend) -> None:
    reader = backend.make()
    writer = reader if backend.name == "memory" else backend.make()

    async def write(i: int) -> None:
        await writer.put_snapshot(EndpointSnapshot(A if i % 2 else B, running=i))

    await asyncio.gather(*(reader.fleet_view(M, CHAIN, [A, B]) for _ in range(20)), *(write(i) for i in range(10)))
    assert (await reader.fleet_view(M, CHAIN, [A, B])).snapshots == await writer.snapshots([A, B])


async def test_fleet_view_counts_only_live_inflight_work(backend: Backend) -> None:
    store = backend.make()
    await store.inflight_add(A, "lost", 4000, 100, ttl_s=TTL_S)  # its gateway never releases it
    await store.inflight_add(A, "alive", 100, 10, ttl_s=600)
    assert (await store.fleet_view(M, CHAIN, [A])).inflight == {A: InFlight(2, 4100, 110)}

    async def healed() -> bool:
        return (await store.fleet_view(M, CHAIN, [A])).inflight == {A: InFlight(1, 100, 10)}

    await backend.eventually(healed, "the abandoned in-flight request to stop counting")


# -- heartbeats -------------------------------------------------------------------------------------------------


async def test_a_heartbeat_ages_by_the_stores_clock_until_the_next_one(backend: Backend) -> None:
    store = backend.make()
    assert await store.heartbeats() == {}
    await store.put_heartbeat("collector host-a", ttl_s=600)
    first = (await store.heartbeats())["collector host-a"]
    now = backend.clock.now if backend.clock is not None else time.time()
    assert abs(first.at - now) < 5 and 0 <= first.age_s < 5

    async def aged() -> bool:
        return (await store.heartbeats())["collector host-a"].age_s >= 0.3

    await backend.eventually(aged, "the heartbeat to be 0.3 s old")
    assert (await store.heartbeats())["collector host-a"].at == first.at  # reading never refreshes a beat
    await store.put_heartbeat("collector host-a", ttl_s=600)
    again = (await store.heartbeats())["collector host-a"]
    assert again.at > first.at and again.age_s < 0.3


async def test_heartbeats_are_per_writer_and_expire(backend: Backend) -> None:
    store = backend.make()
    await store.put_heartbeat("short", ttl_s=TTL_S)
    await store.put_heartbeat("long", ttl_s=600)
    assert set(await store.heartbeats()) == {"short", "long"}

    async def expired() -> bool:
        return set(await store.heartbeats()) == {"long"}

    await backend.eventually(expired, "the short-lived heartbeat to expire")
    assert set((await store.fleet_view(M, CHAIN, [A])).heartbeats) == {"long"}
    await store.put_heartbeat("short", ttl_s=600)  # a writer that comes back is seen again
    assert set(await store.heartbeats()) == {"short", "long"}


async def test_fleet_view_carries_every_heartbeat(backend: Backend) -> None:
    reader = backend.make()
    # on Redis the collector writes through its own store; in memory there is only one store
    writer = reader if backend.name == "memory" else backend.make()
    assert (await reader.fleet_view(M, CHAIN, [A])).heartbeats == {}
    await writer.put_heartbeat("collector", ttl_s=600)
    view = await reader.fleet_view(M, CHAIN, [A, B])
    assert set(view.heartbeats) == {"collector"}
    assert view.heartbeats["collector"].at == (await reader.heartbeats())["collector"].at
    assert set((await reader.fleet_view(M, [], [A])).heartbeats) == {"collector"}  # no keys: still read
    assert await reader.fleet_view(M, CHAIN, []) == FleetView({}, {}, {})  # no endpoints: nothing is read


# -- lifecycle and failures ----------------------------------------------------------------------------------


async def test_ping_and_close(store: Store) -> None:
    assert await store.ping() is True
    await store.close()
