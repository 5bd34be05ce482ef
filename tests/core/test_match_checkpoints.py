"""Prefix-match checkpoints: a match resumed after a shared system prompt is the match a whole walk gives, a change
at the edges of any holding is seen (the whole chain is walked again), and the router resumes for requests that
share a system prompt and places them exactly as without checkpoints.

Against a real Redis and a real 3-master Redis Cluster; the in-memory store is the reference the contract suite
holds both stores to."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from cognitora.core.router import Router
from cognitora.match_checkpoints import MatchCheckpoints
from kvstate.memory_store import MemoryStore
from kvstate.redis_store import RedisStore
from kvstate.store import MatchCheckpoint, PrefixMatch, Store, Tier
from tests.core.test_router import MODEL, SYSTEM, chat, make_config

M = "m"
ENDPOINTS = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"]
A, B, C, D = ENDPOINTS
SHARED = [0x5000 + i for i in range(40)]
"""A system prompt's 40 blocks; prompts below are SHARED + their own blocks."""


def prompt(tail: int, length: int = 8) -> list[int]:
    return SHARED + [0x9000_0000 + tail * 100 + i for i in range(length)]


@pytest.fixture(params=["redis", "cluster"])
async def both(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[tuple[RedisStore, MemoryStore]]:
    """A RedisStore (on Redis or a Redis Cluster) and the in-memory reference, fed the same writes."""
    cluster = request.param == "cluster"
    url = request.getfixturevalue("redis_cluster_url" if cluster else "redis_server_url")
    redis = RedisStore.from_url(url, key_prefix=key_prefix, socket_timeout_s=2.0, cluster=cluster)
    try:
        yield redis, MemoryStore()
    finally:
        await redis.delete_everything()
        await redis.close()


Write = Callable[[Store], Awaitable[None]]


def same(got: dict[str, PrefixMatch], want: dict[str, PrefixMatch]) -> bool:
    """Equal matches, weights to rounding (the stores sum tier weights in different orders)."""
    return got.keys() == want.keys() and all(
        (g.blocks, g.cpu_blocks, g.disk_blocks) == (w.blocks, w.cpu_blocks, w.disk_blocks)
        and g.weighted_blocks == pytest.approx(w.weighted_blocks)
        for g, w in ((got[e], want[e]) for e in got)
    )


async def write(stores: tuple[RedisStore, MemoryStore], change: Write) -> None:
    for store in stores:
        await change(store)


async def checkpoint_at(store: RedisStore, keys: list[int], blocks: int) -> MatchCheckpoint:
    view = await store.fleet_view(M, keys, ENDPOINTS, checkpoint=blocks)
    assert view.checkpoint is not None and view.checkpoint.blocks == blocks
    return view.checkpoint


async def test_a_resumed_match_is_what_a_whole_walk_finds(both: tuple[RedisStore, MemoryStore]) -> None:
    """Holdings of every shape (whole prompt, part of it, past it, off the GPU, nothing), many prompts: while they
    hold still, every resumed match equals the reference's, and resuming is what happened."""
    redis, memory = both
    rng = random.Random(3)
    for n in range(6):
        first = prompt(100 + n)
        holdings = {
            A: (first[: rng.randrange(41, 49)], Tier.GPU),
            B: (SHARED[: rng.randrange(1, 40)], Tier.GPU),
            C: (SHARED, rng.choice([Tier.CPU, Tier.DISK])),
        }
        for endpoint, (keys, tier) in holdings.items():
            await write(both, lambda s, e=endpoint, k=keys, t=tier: s.add_blocks(M, e, k, t))  # type: ignore[misc]
        cp = await checkpoint_at(redis, first, len(SHARED))
        assert set(cp.held) == {A, C} and set(cp.ended) == {B}
        for tail in range(5):
            keys = prompt(200 + 10 * n + tail)
            # A holder of the whole system prompt holds some of this prompt's own blocks: the walk goes on there.
            await write(both, lambda s, k=keys[40 : 40 + tail]: s.add_blocks(M, A, k))  # type: ignore[misc]
            await write(both, lambda s, k=keys: s.add_blocks(M, D, k[41:]))  # past a hole: no match
            view = await redis.fleet_view(M, keys, ENDPOINTS, resume=cp)
            assert view.resumed, f"prompt {n}/{tail}: the checkpoint was not resumed"
            assert same(view.matches, await memory.match_prefix(M, keys, ENDPOINTS))
            assert view.matches == (await redis.fleet_view(M, keys, ENDPOINTS)).matches
            assert view.matches[A].blocks == 40 + tail
        for endpoint in (A, B, C, D):
            await write(both, lambda s, e=endpoint: s.clear_endpoint(e, M))  # type: ignore[misc]


CHANGES: dict[str, Write] = {
    "an endpoint gains the whole prompt": lambda s: s.add_blocks(M, D, SHARED),
    "an endpoint gains the prompt's first block": lambda s: s.add_blocks(M, D, SHARED[:1]),
    "a holder loses the prompt's last block": lambda s: s.remove_blocks(M, A, SHARED[-1:]),
    "a shorter holder gains its next block": lambda s: s.add_blocks(M, B, SHARED[:21]),
    "a shorter holder loses its last block": lambda s: s.remove_blocks(M, B, SHARED[19:20]),
    "a holder's last block moves to the CPU": lambda s: s.add_blocks(M, A, SHARED[-1:], Tier.CPU),
}


@pytest.mark.parametrize("change", list(CHANGES), ids=list(CHANGES))
async def test_a_change_at_the_edge_of_a_holding_is_seen(both: tuple[RedisStore, MemoryStore], change: str) -> None:
    redis, memory = both
    await write(both, lambda s: s.add_blocks(M, A, prompt(1)))
    await write(both, lambda s: s.add_blocks(M, B, SHARED[:20]))
    cp = await checkpoint_at(redis, prompt(1), len(SHARED))
    if change == "a holder's last block moves to the CPU":
        await write(both, lambda s: s.remove_blocks(M, A, SHARED[-1:], Tier.GPU))
    await write(both, CHANGES[change])
    keys = prompt(2)
    view = await redis.fleet_view(M, keys, ENDPOINTS, resume=cp)
    assert not view.resumed, "a stale checkpoint was resumed"
    assert same(view.matches, await memory.match_prefix(M, keys, ENDPOINTS))
    assert view.checkpoint is not None, "the whole walk takes a new checkpoint at the same place"
    again = await redis.fleet_view(M, prompt(3), ENDPOINTS, resume=view.checkpoint)
    assert again.resumed and same(again.matches, await memory.match_prefix(M, prompt(3), ENDPOINTS))


async def test_nobody_holding_the_prompt_is_a_checkpoint_too(both: tuple[RedisStore, MemoryStore]) -> None:
    redis, memory = both
    cp = await checkpoint_at(redis, prompt(1), len(SHARED))
    assert cp.held == {} and cp.ended == {}
    view = await redis.fleet_view(M, prompt(2), ENDPOINTS, resume=cp)
    assert view.resumed and view.matches == {}
    await write(both, lambda s: s.add_blocks(M, C, SHARED[:5]))  # seen: the first block changed
    view = await redis.fleet_view(M, prompt(2), ENDPOINTS, resume=cp)
    assert not view.resumed and same(view.matches, await memory.match_prefix(M, prompt(2), ENDPOINTS))


async def test_a_speculative_entry_bounds_the_checkpoint_by_its_expiry(both: tuple[RedisStore, MemoryStore]) -> None:
    """A speculative entry counts only until it expires (read at match time): a checkpoint that counted one stands
    until then, and none is taken over one already expired (renewing it would change no block string)."""
    redis, _ = both
    await redis.add_blocks(M, A, SHARED)
    await redis.add_speculative(M, B, SHARED, ttl_s=0.6)
    cp = await checkpoint_at(redis, prompt(1), len(SHARED))
    assert cp.held[B] == PrefixMatch(40, 40.0) and cp.until_ms > 0
    assert (await redis.fleet_view(M, prompt(2), ENDPOINTS, resume=cp)).resumed
    deadline = time.monotonic() + 5.0
    while (await redis.match_prefix(M, SHARED, ENDPOINTS)).get(B) is not None:
        assert time.monotonic() < deadline, "the speculative entry never expired"
        await asyncio.sleep(0.05)
    view = await redis.fleet_view(M, prompt(2), ENDPOINTS, resume=cp)
    assert not view.resumed and B not in view.matches
    assert view.checkpoint is None, "a checkpoint over an expired speculative entry"


async def test_a_checkpoint_past_the_chain_or_from_a_memory_store_is_none(
    both: tuple[RedisStore, MemoryStore],
) -> None:
    redis, memory = both
    await write(both, lambda s: s.add_blocks(M, A, SHARED))
    assert (await redis.fleet_view(M, SHARED[:10], ENDPOINTS, checkpoint=11)).checkpoint is None
    assert (await memory.fleet_view(M, SHARED, ENDPOINTS, checkpoint=10)).checkpoint is None
    cp = await checkpoint_at(redis, SHARED, 40)
    resumed = await redis.fleet_view(M, SHARED[:39], ENDPOINTS, resume=cp)  # shorter than the checkpoint: not used
    assert not resumed.resumed and resumed.matches == {A: PrefixMatch(39, 39.0)}
    whole = await redis.fleet_view(M, SHARED, ENDPOINTS, resume=cp)  # the very prompt again: nothing left to walk
    assert whole.resumed and whole.matches == {A: PrefixMatch(40, 40.0)}


def test_the_deepest_checkpoint_a_prompt_begins_with_is_found_for_a_ttl() -> None:
    kept = MatchCheckpoints(ttl_s=1.0, max_entries=3)
    shallow = MatchCheckpoint(40, {}, {A: PrefixMatch(40, 40.0)}, ())
    deep = MatchCheckpoint(44, {}, {A: PrefixMatch(44, 44.0)}, ())
    ends = (A, B)
    kept.keep(M, prompt(1), shallow, ends, now=100.0)
    assert kept.find(M, prompt(2), ends, now=100.5) is shallow  # any prompt that begins with the 40 blocks
    kept.keep(M, prompt(1), deep, ends, now=100.5)
    assert kept.find(M, prompt(1), ends, now=100.6) is deep  # the deepest first
    assert kept.find(M, prompt(2), ends, now=100.6) is shallow  # prompt 2 parts from prompt 1 at block 40
    assert kept.find(M, prompt(1)[:42], ends, now=100.6) is shallow  # too short for the deep one
    assert kept.find(M, prompt(2), (A,), now=100.6) is None  # other endpoints asked for
    assert kept.find("other", prompt(2), ends, now=100.6) is None
    assert kept.find(M, prompt(2), ends, now=101.0) is None  # one TTL old
    assert kept.find(M, prompt(1), ends, now=101.2) is deep  # the deep one is younger
    assert kept.find(M, prompt(1), ends, now=101.6) is None
    for n in range(4):  # past max_entries the oldest go
        kept.keep(M, [n, *SHARED], replace(shallow, blocks=1), ends, now=200.0)
    assert kept.find(M, [0], ends, now=200.0) is None and kept.find(M, [3], ends, now=200.0) is not None


async def test_the_router_resumes_on_a_shared_system_prompt_and_places_as_without(
    smollm2_dir: Path, redis_server_url: str, key_prefix: str
) -> None:
    """Two routers on one Redis, one without checkpoints: the same decisions, and the one with them resumed."""
    store = RedisStore.from_url(redis_server_url, key_prefix=key_prefix, socket_timeout_s=2.0)
    try:
        with_cp = Router(make_config(smollm2_dir), store)
        without = Router(make_config(smollm2_dir, limits={"match_checkpoint_ttl_s": 0}), store)
        first = await with_cp.place(chat("warm-up"))
        endpoints = [c.endpoint for c in first.candidates]
        await store.add_blocks(MODEL, endpoints[0], first.keys[: len(first.keys) - 2])
        for n in range(6):
            request = chat(f"Question number {n}: what does the system prompt say about caches?")
            ours, theirs = await with_cp.place(request), await without.place(request)
            assert (ours.endpoint, ours.predicted_cached_tokens) == (theirs.endpoint, theirs.predicted_cached_tokens)
            assert ours.predicted_cached_tokens >= len(SYSTEM) // 8, ours.explain()
        assert with_cp.fleet.checkpoints.resumed >= 4 and with_cp.fleet.checkpoints.stale == 0
        assert without.fleet.checkpoints.resumed == 0
        await store.add_blocks(MODEL, endpoints[1], first.keys[:3])  # another engine now holds the prompt's head
        ours = await with_cp.place(chat("After the change?"))
        theirs = await without.place(chat("After the change?"))
        assert {c.endpoint: c.cached_tokens for c in ours.candidates} == {
            c.endpoint: c.cached_tokens for c in theirs.candidates
        }
        assert with_cp.fleet.checkpoints.stale == 1
    finally:
        await store.delete_everything()
        await store.close()
