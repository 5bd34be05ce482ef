"""Applying decoded events to a store: our keys, parent chains, what is skipped and counted, batched writes."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

import msgpack
import pytest

from cognitora_sim.block_hash import BlockHasher
from cognitora_sim.kv_cache import PrefixCache
from cognitora_sim.kv_events import encode_event
from cognitora_sim.scheduler import Scheduler, SimRequest
from kvstate.events.ingest import EventIngestor
from kvstate.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEvent
from kvstate.events.vllm import decode_batch
from kvstate.keys import BlockKey, chain_block_keys, root_key
from kvstate.memory_store import MemoryStore
from kvstate.store import Store, Tier
from tests.support.events_fake_engine import blocks_of

M, E = "test-model", "10.0.0.1:8000"
BS = 16
A = blocks_of(100, 4)


def batch(*events: KVEvent, rank: int | None = 0) -> EventBatch:
    return EventBatch(ts=1.0, events=tuple(events), dp_rank=rank)


def stored(hashes: Sequence[int], parent: int | None, tokens: Sequence[int], **kw: object) -> BlockStored:
    fields: dict[str, object] = {"block_size": BS, "lora_name": None, "medium": "GPU", **kw}
    return BlockStored(tuple(hashes), parent, tuple(tokens), **fields)  # type: ignore[arg-type]


async def held(store: Store, tokens: Sequence[int], endpoint: str = E) -> int:
    match = await store.match_prefix(M, chain_block_keys(root_key(M), tokens, BS), [endpoint])
    return match[endpoint].blocks if endpoint in match else 0


async def test_keys_are_ours_and_chain_from_the_parents_key(store: Store) -> None:
    ingest = EventIngestor(store, M, BS)
    await ingest.apply(E, batch(stored([0xAAA, 0xBBB], None, A[:32])))
    await ingest.apply(E, batch(stored([0xCCC], 0xBBB, A[32:48])))
    assert await held(store, A) == 3
    assert ingest.stats.blocks_stored == 3


async def test_an_unknown_parent_is_skipped_with_its_descendants_and_never_guessed(store: Store) -> None:
    ingest = EventIngestor(store, M, BS)
    result = await ingest.apply(E, batch(stored([2], 1, A[16:32]), stored([3], 2, A[32:48])))
    assert (result.stored, result.skipped) == (0, 2)
    assert ingest.stats.unknown_parent == 2
    await ingest.apply(E, batch(stored([1], None, A[:16])))
    assert await held(store, A) == 1


async def test_a_block_size_mismatch_is_counted_skipped_and_logged_once(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    ingest = EventIngestor(store, M, BS)
    with caplog.at_level(logging.ERROR, logger="kvstate.events.ingest"):
        for i in range(3):
            await ingest.apply(E, batch(stored([i + 1], None, A[:32], block_size=32)))
    assert ingest.stats.block_size_mismatch == 3
    assert await held(store, A) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "block_size=32" in lines[0] and "block_size=16" in lines[0]


async def test_a_token_count_that_does_not_fit_the_hashes_is_skipped(store: Store) -> None:
    ingest = EventIngestor(store, M, BS)
    await ingest.apply(E, batch(stored([1, 2], None, A[:20])))
    assert ingest.stats.inconsistent == 1 and await held(store, A) == 0


async def test_one_key_held_through_two_engine_hashes_leaves_only_with_the_last(store: Store) -> None:
    """Same tokens, different engine hashes (e.g. two cache salts): the engine holds two copies."""
    ingest = EventIngestor(store, M, BS)
    await ingest.apply(E, batch(stored([1], None, A[:16]), stored([2], None, A[:16])))
    await ingest.apply(E, batch(BlockRemoved((1,), "GPU")))
    assert await held(store, A) == 1
    await ingest.apply(E, batch(BlockRemoved((2,), "GPU")))
    assert await held(store, A) == 0


async def test_the_net_effect_of_a_batch_is_written(store: Store) -> None:
    ingest = EventIngestor(store, M, BS)
    await ingest.apply(
        E,
        batch(
            stored([1, 2], None, A[:32]),
            BlockRemoved((2,), "GPU"),
            stored([3], 1, A[16:32]),  # re-cached under a new hash
            BlockRemoved((99,), "GPU"),  # never seen: counted
        ),
    )
    assert await held(store, A) == 2
    assert ingest.stats.unknown_blocks == 1


async def test_all_blocks_cleared_purges_the_endpoint_only(store: Store) -> None:
    other = "10.0.0.2:8000"
    ingest = EventIngestor(store, M, BS)
    await ingest.apply(E, batch(stored([1], None, A[:16])))
    await ingest.apply(other, batch(stored([1], None, A[:16])))
    result = await ingest.apply(E, batch(stored([2], 1, A[16:32]), AllBlocksCleared(), stored([5], None, A[:16])))
    assert result.cleared
    assert await held(store, A) == 1  # only the block stored after the clear
    assert await held(store, A, other) == 1
    await ingest.apply(E, batch(stored([3], 2, A[32:48])))  # hash 2 was stored before the clear: forgotten
    assert ingest.stats.unknown_parent == 1


async def test_purge_forgets_the_store_entries_and_the_hash_map(store: Store) -> None:
    ingest = EventIngestor(store, M, BS)
    await ingest.apply(E, batch(stored([1], None, A[:16])))
    await ingest.purge(E)
    assert await held(store, A) == 0 and ingest.tracked_blocks(E) == 0
    await ingest.apply(E, batch(stored([2], 1, A[16:32])))
    assert ingest.stats.unknown_parent == 1


async def test_dp_ranks_keep_separate_hash_maps(store: Store) -> None:
    ingest = EventIngestor(store, M, BS)
    await ingest.apply(E, batch(stored([1], None, A[:16]), rank=0))
    await ingest.apply(E, batch(stored([2], 1, A[16:32]), rank=1))  # rank 1 never stored hash 1
    assert ingest.stats.unknown_parent == 1


async def test_tiers_are_tracked_apart(store: Store) -> None:
    ingest = EventIngestor(store, M, BS)
    await ingest.apply(E, batch(stored([1, 2], None, A[:32])))
    await ingest.apply(E, batch(BlockStored((1, 2), None, (), 0, None, "CPU")))  # offloaded copy, no tokens
    await ingest.apply(E, batch(BlockRemoved((1, 2), "GPU")))
    match = await store.match_prefix(M, chain_block_keys(root_key(M), A, BS), [E])
    assert match[E].blocks == 2 and match[E].weighted_blocks == pytest.approx(2 * 0.8)
    await ingest.apply(E, batch(BlockRemoved((1, 2), "CPU")))
    assert await held(store, A) == 0 and ingest.tracked_blocks(E) == 0


async def test_the_hash_map_is_bounded_and_what_it_drops_leaves_the_store(store: Store) -> None:
    ingest = EventIngestor(store, M, BS, max_blocks_per_endpoint=3)
    await ingest.apply(E, batch(stored([1, 2, 3, 4], None, A)))
    assert ingest.tracked_blocks(E) == 3 and ingest.stats.map_overflow == 1
    assert await held(store, A) == 0  # block 0 could no longer be removed on eviction, so it is not claimed


class CountingStore(MemoryStore):
    """A real MemoryStore that counts its write calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[tuple[str, Tier | None]] = Counter()

    async def add_blocks(self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier = Tier.GPU) -> None:
        self.calls["add", tier] += 1
        await super().add_blocks(model, endpoint, keys, tier)

    async def remove_blocks(
        self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier | None = None
    ) -> None:
        self.calls["remove", tier] += 1
        await super().remove_blocks(model, endpoint, keys, tier)


async def test_one_write_per_tier_per_batch() -> None:
    store = CountingStore()
    ingest = EventIngestor(store, M, BS)
    chains = [blocks_of(1000 * c, 2) for c in range(8)]
    events: list[KVEvent] = [stored([c * 10, c * 10 + 1], None, t) for c, t in enumerate(chains)]
    events += [BlockStored((0, 10), None, (), 0, None, "CPU"), BlockRemoved((1, 11), "GPU")]
    await ingest.apply(E, batch(*events))
    assert store.calls == {("add", Tier.GPU): 1, ("add", Tier.CPU): 1, ("remove", Tier.GPU): 1}


async def test_a_hash_announced_again_for_other_tokens_replaces_its_old_block(store: Store) -> None:
    other = blocks_of(7000, 1)
    ingest = EventIngestor(store, M, BS)
    await ingest.apply(E, batch(stored([1], None, A[:16])))
    await ingest.apply(E, batch(stored([1], None, other)))
    assert await held(store, A) == 0 and await held(store, other) == 1
    await ingest.apply(E, batch(BlockRemoved((1,), "GPU")))
    assert await held(store, other) == 0


# -- memory: the hash map follows the engine's cache, it does not grow with traffic -----------------------------------
def _serve(s: Scheduler, req: SimRequest) -> None:
    s.add(req)
    t = 0.0
    while not req.finished:
        t += 1
        s.commit(s.schedule(), t)


async def test_the_hash_map_stays_at_the_engines_cache_size_under_endless_new_prompts() -> None:
    """A soak's collector grew for 30 minutes because its engines never filled their caches (nothing evicted); once
    an engine evicts, every block it drops leaves the map, so the map is bounded by the engine's block count."""
    capacity = 32
    cache = PrefixCache(num_blocks=capacity, block_size=BS)
    engine = Scheduler(cache, BlockHasher(BS), [(900, " x")], max_num_seqs=4, max_num_batched_tokens=256)
    ingest = EventIngestor(MemoryStore(), M, BS)
    shared = list(range(1000, 1000 + 3 * BS))  # a system prompt every request repeats
    sizes = []
    for i in range(400):  # 400 prompts, each with 2 blocks of its own: 800 distinct blocks in a 32-block cache
        tail = list(range(10_000 + i * 2 * BS, 10_000 + (i + 1) * 2 * BS))
        _serve(engine, SimRequest(rid=f"r{i}", tokens=shared + tail + [7], prompt_len=5 * BS + 1, max_tokens=1,
                                  arrival=0.0))  # fmt: skip
        wire = [encode_event(e, legacy=False) for e in cache.drain()]
        await ingest.apply(E, decode_batch(msgpack.packb([float(i), wire, 0])))
        sizes.append(ingest.tracked_total())
    assert ingest.stats.blocks_removed > 700  # the engine evicted, and said so
    assert max(sizes) <= capacity
    assert ingest.tracked_total() == ingest.tracked_blocks(E) == cache.cached_blocks
