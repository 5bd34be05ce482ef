"""The ZMQ subscriber over real sockets: replay on start, gaps, purges, restarts, malformed messages."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import msgpack
import pytest
import zmq.asyncio

from kvstate.events.ingest import EventIngestor
from kvstate.events.subscriber import END_SEQ, MAX_STAGED_BATCHES, KVEventSubscriber, parse_replay_frames
from kvstate.keys import BlockKey
from kvstate.memory_store import MemoryStore
from kvstate.store import Store, StoreUnavailable, Tier
from tests.support.events_fake_engine import (
    FakeEngine,
    ReplayLayout,
    blocks_of,
    envelope,
    eventually,
    running,
    vllm_removed_map,
    vllm_stored_map,
)


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


def stored(hashes: list[int], parent: int | None, tokens: list[int]) -> bytes:
    return envelope([vllm_stored_map(hashes, parent, tokens)])


A = blocks_of(100, 4)
"""A 4-block prompt; the engine stores it over 4 batches, block i with hash i + 1."""


def block_batch(i: int) -> bytes:
    return stored([i + 1], i if i else None, A[i * 16 : (i + 1) * 16])


@pytest.mark.parametrize("layout", ["topic", "plain"])
async def test_blocks_stored_before_we_connected_are_learned_by_replay_from_zero(
    store: Store, ctx: zmq.asyncio.Context, layout: ReplayLayout
) -> None:
    engine = FakeEngine(ctx, replay=layout)
    try:
        for i in range(3):
            await engine.publish(block_batch(i), deliver=False)  # nobody listening yet
        async with running(store, engine) as h:
            assert engine.replay_requests == [0]
            assert await h.held(A) == 3
            await engine.publish(block_batch(3))
            await h.until_held(A, 4)
            assert h.subscriber.stats.replayed == 3 and h.subscriber.stats.gaps == 0
    finally:
        await engine.close()


async def test_live_batches_the_start_up_replay_already_applied_are_dropped_as_duplicates(
    store: Store, ctx: zmq.asyncio.Context
) -> None:
    engine = FakeEngine(ctx, replay="topic")
    try:
        for i in range(2):
            await engine.publish(block_batch(i), deliver=False)
        async with running(store, engine) as h:
            # seq 1 arrives live after the replay delivered it (published while the subscription was forming)
            await engine.send_raw([engine.topic, (1).to_bytes(8, "big"), engine.buffer[1][1]])
            await engine.publish(block_batch(2))
            await h.until_held(A, 3)
            assert h.subscriber.stats.duplicates == 1 and h.subscriber.stats.purges == 0
    finally:
        await engine.close()


@pytest.mark.parametrize("layout", ["topic", "plain"])
async def test_a_gap_is_filled_by_replay(store: Store, ctx: zmq.asyncio.Context, layout: ReplayLayout) -> None:
    engine = FakeEngine(ctx, replay=layout)
    try:
        async with running(store, engine) as h:
            await engine.publish(block_batch(0))
            await h.until_held(A, 1)
            await engine.publish(block_batch(1), deliver=False)  # lost on the way
            await engine.publish(block_batch(2), deliver=False)  # lost on the way
            await engine.publish(block_batch(3))
            await h.until_held(A, 4)
            stats = h.subscriber.stats
            assert (stats.gaps, stats.replayed, stats.purges) == (1, 2, 0), stats
            assert engine.replay_requests == [0, 1]
            assert h.ingestor.stats.unknown_parent == 0
    finally:
        await engine.close()


@pytest.mark.parametrize("why", ["buffer moved on", "no replay address", "replay never answers"])
async def test_a_gap_replay_cannot_close_purges_the_endpoint(store: Store, ctx: zmq.asyncio.Context, why: str) -> None:
    other = blocks_of(9000, 2)
    engine = FakeEngine(ctx, replay="topic")
    try:
        async with running(store, engine, use_replay=why != "no replay address", replay_timeout_s=0.3) as h:
            await engine.publish(block_batch(0))
            await engine.publish(stored([50, 51], None, other))
            await h.until_held(other, 2)
            await engine.publish(block_batch(1), deliver=False)
            await engine.publish(block_batch(2), deliver=False)
            if why == "buffer moved on":
                engine.replay_floor = 3  # seq 2 (block 1) and older are gone from the engine's buffer
            if why == "replay never answers":
                engine.replay_answers = False
            await engine.publish(stored([60], None, blocks_of(7000, 1)))
            await h.until_stat("purges", 1)
            await h.until_held(blocks_of(7000, 1), 1)  # the live batch after the gap is applied on a clean slate
            assert await h.held(other) == 0  # what we knew before the gap is gone, not left stale
            assert await h.held(A) == 0
            assert h.subscriber.stats.gaps == 1
            # tracking goes on from the new sequence: the next batch applies normally
            await engine.publish(stored([61], 60, blocks_of(7000, 2)[16:]))
            await h.until_held(blocks_of(7000, 2), 2)
            assert h.subscriber.stats.purges == 1
    finally:
        await engine.close()


async def test_a_replay_that_starts_later_purges_then_applies_what_it_did_deliver(
    store: Store, ctx: zmq.asyncio.Context
) -> None:
    fresh = blocks_of(4000, 1)
    engine = FakeEngine(ctx, replay="plain")
    try:
        async with running(store, engine) as h:
            await engine.publish(block_batch(0))
            await h.until_held(A, 1)
            await engine.publish(block_batch(1), deliver=False)  # seq 1: lost and no longer buffered
            await engine.publish(stored([77], None, fresh), deliver=False)  # seq 2: lost, still buffered
            engine.replay_floor = 2
            await engine.publish(block_batch(2))
            await h.until_held(fresh, 1)
            stats = h.subscriber.stats
            assert (stats.purges, stats.replayed) == (1, 1), stats
            assert await h.held(A) == 0
            assert h.ingestor.stats.unknown_parent == 1  # block 2's parent was lost: skipped, never guessed
    finally:
        await engine.close()


async def test_an_engine_restart_resets_the_sequence_and_purges(store: Store, ctx: zmq.asyncio.Context) -> None:
    engine = FakeEngine(ctx, replay="topic")
    try:
        async with running(store, engine) as h:
            for i in range(3):
                await engine.publish(block_batch(i))
            await h.until_held(A, 3)
            # The engine process dies and a new one binds the same ports; its sequence starts again at 0.
            await engine.close()
            engine = FakeEngine(ctx, replay="topic", pub_port=engine.pub_port, replay_port=engine.replay_port)
            await engine.wait_subscribed()  # ZMQ reconnected by itself
            new = blocks_of(5000, 1)
            await engine.publish(stored([1], None, new))
            await h.until_held(new, 1)
            assert await h.held(A) == 0
            assert h.subscriber.stats.purges >= 1
            await engine.publish(stored([2], 1, blocks_of(5000, 2)[16:]))
            await h.until_held(blocks_of(5000, 2), 2)
    finally:
        await engine.close()


async def test_a_restart_noticed_only_as_a_reconnect_still_purges(store: Store, ctx: zmq.asyncio.Context) -> None:
    """The new instance published more batches before we reconnected than the old one ever did, so its sequence
    does not visibly go back; the reconnect itself makes us resync."""
    engine = FakeEngine(ctx, replay="topic")
    try:
        async with running(store, engine) as h:
            for i in range(3):
                await engine.publish(block_batch(i))
            await h.until_held(A, 3)
            await engine.close()
            engine = FakeEngine(ctx, replay="topic", pub_port=engine.pub_port, replay_port=engine.replay_port)
            new = blocks_of(5000, 6)
            for i in range(5):  # seq 0..4, before our SUB is back
                await engine.publish(
                    stored([1000 + i], 999 + i if i else None, new[i * 16 : (i + 1) * 16]), deliver=False
                )
            await engine.wait_subscribed()
            await engine.publish(stored([1005], 1004, new[80:]))  # seq 5
            await h.until_held(new, 6)
            assert await h.held(A) == 0
            assert h.subscriber.stats.purges == 1
    finally:
        await engine.close()


async def test_a_sequence_going_backwards_purges(store: Store, ctx: zmq.asyncio.Context) -> None:
    engine = FakeEngine(ctx, replay=None)
    try:
        async with running(store, engine) as h:
            for i in range(3):
                await engine.publish(block_batch(i))
            await h.until_held(A, 3)
            new = blocks_of(6000, 1)
            await engine.publish(stored([1], None, new), seq=0)
            await h.until_held(new, 1)
            assert await h.held(A) == 0
            assert h.subscriber.stats.purges == 1
    finally:
        await engine.close()


async def test_all_blocks_cleared_purges_then_the_rest_of_the_batch_applies(
    store: Store, ctx: zmq.asyncio.Context
) -> None:
    after = blocks_of(8000, 1)
    engine = FakeEngine(ctx, replay="topic")
    try:
        async with running(store, engine) as h:
            await engine.publish(block_batch(0))
            await engine.publish(block_batch(1))
            await h.until_held(A, 2)
            await engine.publish(
                envelope([{"type": "AllBlocksCleared"}, vllm_stored_map([90], None, after)]),
            )
            await h.until_held(after, 1)
            assert await h.held(A) == 0
            assert h.subscriber.stats.purges == 1
            # the engine's old hashes are forgotten too: a child of a pre-clear block cannot be keyed
            await engine.publish(block_batch(2))
            await h.until_stat("applied", 4)
            assert h.ingestor.stats.unknown_parent == 1
    finally:
        await engine.close()


async def test_malformed_messages_are_counted_and_skipped_and_the_next_good_one_applies(
    store: Store, ctx: zmq.asyncio.Context
) -> None:
    engine = FakeEngine(ctx, replay="topic")
    try:
        async with running(store, engine) as h:
            await engine.publish(block_batch(0))
            await engine.publish(b"\x93\xcb not msgpack at all")  # seq 1: undecodable payload
            await engine.send_raw([engine.topic, b"\x00\x01"])  # two frames, short seq
            await engine.publish(msgpack.packb([1.0, [["BlockStored", "not-a-list"]], 0]))  # seq 2
            await engine.publish(block_batch(1))  # seq 3
            await h.until_held(A, 2)
            stats = h.subscriber.stats
            assert (stats.malformed, stats.gaps, stats.purges, stats.received) == (3, 0, 0, 5), stats
    finally:
        await engine.close()


async def test_block_removed_removes(store: Store, ctx: zmq.asyncio.Context) -> None:
    engine = FakeEngine(ctx, replay="topic")
    try:
        async with running(store, engine) as h:
            await engine.publish(envelope([vllm_stored_map([1, 2, 3, 4], None, A)]))
            await h.until_held(A, 4)
            await engine.publish(envelope([vllm_removed_map([2])]))
            await h.until_held(A, 1)
    finally:
        await engine.close()


@pytest.mark.parametrize(
    "frames,expected",
    [
        ([b"", b"\x00" * 7 + b"\x05", b"P"], (b"\x00" * 7 + b"\x05", b"P")),  # delimiter, [seq, payload]
        ([b"", b"kv@x", b"\x00" * 7 + b"\x05", b"P"], (b"\x00" * 7 + b"\x05", b"P")),  # delimiter, with topic
        ([b"", b"", END_SEQ, b""], (END_SEQ, b"")),  # vLLM v0.26 end marker
        ([b"", END_SEQ, b""], (END_SEQ, b"")),  # SGLang / older vLLM end marker
        ([b"\x00" * 7 + b"\x05", b"P"], (b"\x00" * 7 + b"\x05", b"P")),  # REQ-style, no delimiter
        ([b"", b"\x05", b"P"], None),  # seq not 8 bytes
        ([b"x"], None),
    ],
)
def test_replay_frames_in_every_layout(frames: list[bytes], expected: tuple[bytes, bytes] | None) -> None:
    assert parse_replay_frames(frames) == expected


class FlakyStore(MemoryStore):
    """A real MemoryStore whose writes fail with ``StoreUnavailable`` while ``down`` (a Redis outage)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("store down (test)")

    async def add_blocks(self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier = Tier.GPU) -> None:
        self._check()
        await super().add_blocks(model, endpoint, keys, tier)

    async def clear_endpoint(self, endpoint: str, model: str | None = None) -> None:
        self._check()
        await super().clear_endpoint(endpoint, model)


async def test_a_store_outage_is_survived_and_followed_by_a_resync(ctx: zmq.asyncio.Context) -> None:
    store = FlakyStore()
    engine = FakeEngine(ctx, replay="topic")
    try:
        async with running(store, engine) as h:
            await engine.publish(block_batch(0))
            await h.until_held(A, 1)
            store.down = True
            await engine.publish(block_batch(1))  # cannot be written
            await h.until_stat("store_errors", 1)
            await engine.publish(block_batch(2))  # the store is still down: dropped, replay will bring it back
            await h.until_stat("received", 3)
            store.down = False
            await engine.publish(block_batch(3))  # store back: purge, replay 0..3, go on
            await h.until_held(A, 4)
            assert h.subscriber.stats.purges == 1
    finally:
        await engine.close()


async def test_a_store_outage_logs_one_error_not_one_per_message(
    ctx: zmq.asyncio.Context, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="kvstate.events.subscriber")
    store = FlakyStore()
    engine = FakeEngine(ctx, replay="topic")
    try:
        async with running(store, engine) as h:
            await engine.publish(block_batch(0))
            await h.until_held(A, 1)
            store.down = True
            for seq in (1, 2):  # the engine keeps publishing through a Redis outage: each one fails in the store
                await engine.publish(block_batch(seq))
                await h.until_stat("store_errors", seq)
            store.down = False
            await engine.publish(block_batch(3))
            await h.until_held(A, 4)
    finally:
        await engine.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]


async def test_a_bad_pub_address_fails_at_once_saying_what_to_give(ctx: zmq.asyncio.Context) -> None:
    ingestor = EventIngestor(MemoryStore(), "test-model", 16)
    subscriber = KVEventSubscriber("127.0.0.1:8000", "localhost:5557", ingestor, context=ctx)
    with pytest.raises(ValueError, match=r"tcp://host:port"):
        await subscriber.run()


LONG = 1000
"""Batches in a long replay: many times what the subscriber may hold at once."""
WINDOW = 2 * MAX_STAGED_BATCHES
"""The most batches the engine below lets be sent and not yet applied."""


@pytest.mark.parametrize("when", ["start-up", "gap"])
async def test_a_long_replay_is_applied_as_it_arrives_not_collected_first(
    store: Store, ctx: zmq.asyncio.Context, when: str
) -> None:
    """The engine sends the n-th batch of an answer only once all but WINDOW of those before it were applied: a
    subscriber that listed the whole replay before applying it would wait for the end marker forever (and time
    out with nothing learned); one that applies as it goes finishes, holding at most WINDOW at any time."""
    chain = blocks_of(100, LONG + 1)

    def batch(i: int) -> bytes:
        return stored([i + 1], i if i else None, chain[i * 16 : (i + 1) * 16])

    engine = FakeEngine(ctx, replay="topic")
    ingestor = EventIngestor(store, "test-model", 16)
    most_held = before = 0

    async def pace(n: int) -> None:
        nonlocal most_held, before
        if n == 0:
            before = ingestor.stats.batches  # those applied before this answer

        async def caught_up() -> bool:
            return n - (ingestor.stats.batches - before) <= WINDOW

        await eventually(caught_up, f"the subscriber to apply replayed batches before the {n}th is sent")
        most_held = max(most_held, n - (ingestor.stats.batches - before))

    try:
        if when == "start-up":
            for i in range(LONG):
                await engine.publish(batch(i), deliver=False)
            engine.replay_pace = pace
        async with running(store, engine, ingestor=ingestor) as h:
            if when == "gap":
                engine.replay_pace = pace
                await engine.publish(batch(0))
                await h.until_held(chain, 1)
                for i in range(1, LONG):
                    await engine.publish(batch(i), deliver=False)
            await engine.publish(batch(LONG))
            await h.until_held(chain, LONG + 1)
            stats = h.subscriber.stats
            assert (stats.replayed, stats.purges, stats.duplicates) == (LONG - (when == "gap"), 0, 0), stats
            assert stats.gaps == (when == "gap"), stats
            assert 0 < most_held <= WINDOW
    finally:
        await engine.close()


async def test_a_hole_midway_through_a_gap_replay_purges_then_applies_all_it_delivered(
    store: Store, ctx: zmq.asyncio.Context
) -> None:
    """As when the whole answer was read before deciding: purge, then every delivered batch on the clean slate
    (fetched again, since those applied before the hole went with the purge)."""
    first, second, third = blocks_of(4000, 1), blocks_of(5000, 1), blocks_of(6000, 1)
    engine = FakeEngine(ctx, replay="plain")
    try:
        async with running(store, engine) as h:
            await engine.publish(block_batch(0))
            await h.until_held(A, 1)
            await engine.publish(stored([77], None, first), deliver=False)  # seq 1
            await engine.publish(stored([78], None, second), deliver=False)  # seq 2
            await engine.publish(block_batch(1), deliver=False)  # seq 3: lost from the buffer too
            engine.buffer.pop()
            await engine.publish(stored([79], None, third), deliver=False)  # seq 4
            await engine.publish(block_batch(2))  # seq 5: the gap 1..4 is not replayable whole
            await h.until_held(third, 1)
            stats = h.subscriber.stats
            assert (stats.gaps, stats.purges, stats.replayed) == (1, 1, 3), stats
            assert engine.replay_requests == [0, 1, 1]
            assert (await h.held(first), await h.held(second), await h.held(A)) == (1, 1, 0)
    finally:
        await engine.close()


@pytest.mark.parametrize("when", ["start-up", "gap"])
async def test_a_replay_that_stops_answering_midway_leaves_nothing_of_it(
    store: Store, ctx: zmq.asyncio.Context, when: str
) -> None:
    """As when no answer came at all (the old, read-it-all-first behaviour): the two batches that did arrive are
    not kept; after a gap the endpoint is purged, and the live batch applies on the clean slate."""
    fresh = [blocks_of(4000 + 1000 * i, 1) for i in range(4)]
    engine = FakeEngine(ctx, replay="topic")

    release = asyncio.Event()

    async def stall_after_two(n: int) -> None:
        if n == 2:
            await release.wait()  # the engine hangs mid-answer

    try:
        if when == "start-up":
            for i in range(3):
                await engine.publish(stored([70 + i], None, fresh[i]), deliver=False)
            engine.replay_pace = stall_after_two
        async with running(store, engine, replay_timeout_s=0.3) as h:
            assert h.subscriber.stats.purges == 0
            if when == "gap":
                await engine.publish(stored([70], None, fresh[0]))
                await h.until_held(fresh[0], 1)
                engine.replay_pace = stall_after_two
                for i in range(1, 3):
                    await engine.publish(stored([70 + i], None, fresh[i]), deliver=False)
                await engine.publish(stored([73], None, fresh[3]))
                await h.until_held(fresh[3], 1)
                assert h.subscriber.stats.purges == 1, h.subscriber.stats
            else:
                assert [await h.held(f) for f in fresh[:3]] == [0, 0, 0]
                engine.replay_pace = None
                release.set()  # the engine finishes that answer (to nobody) and serves the next
                await engine.publish(stored([73], None, fresh[3]))  # seq 3: nothing known, learn 0..2 by replay
                await h.until_held(fresh[3], 1)
            held = [await h.held(f) for f in fresh]
            assert held == ([0, 0, 0, 1] if when == "gap" else [1, 1, 1, 1]), held
    finally:
        await engine.close()
