"""SGLang KV events: payload decoding (signed hashes, attn_dp_rank, both event shapes) and a real ZMQ stream."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgpack
import pytest
import zmq.asyncio

from kvstate.events import sglang
from kvstate.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EventDecodeError
from kvstate.store import Store, Tier
from tests.support.events_fake_engine import FakeEngine, blocks_of, running, sglang_stored_legacy

PAGE = 16


def sglang_hash(i: int) -> int:
    """A signed int64 like SGLang's ``hash_str_to_int64``: half of them negative."""
    value = (0x9E3779B97F4A7C15 * (i + 1)) & (2**64 - 1)
    return value - 2**64 if value >= 2**63 else value


def test_signed_negative_hashes_become_their_unsigned_twin() -> None:
    payload = msgpack.packb([2.0, [sglang_stored_legacy([-1, -(2**63)], -2, range(32), PAGE)], 0])
    event = sglang.decode_batch(payload).events[0]
    assert isinstance(event, BlockStored)
    assert event.block_hashes == (2**64 - 1, 2**63)
    assert event.parent_block_hash == 2**64 - 2


def test_bytes_hashes_read_as_their_first_eight_bytes() -> None:
    digest = (0x8000000000000001).to_bytes(8, "big") + bytes(24)
    payload = msgpack.packb([2.0, [["BlockRemoved", [digest], "GPU"]], 0])
    assert sglang.decode_batch(payload).events == (BlockRemoved((0x8000000000000001,), "GPU"),)


@pytest.mark.parametrize(
    "raw,rank",
    [
        ([1.0, [["AllBlocksCleared"]], 3], 3),  # [ts, events, attn_dp_rank]
        ([1.0, [["AllBlocksCleared"]]], None),  # the oldest two-element envelope
        ({"ts": 1.0, "events": [["AllBlocksCleared"]], "attn_dp_rank": 5}, 5),
    ],
)
def test_attn_dp_rank_in_every_envelope(raw: object, rank: int | None) -> None:
    batch = sglang.decode_batch(msgpack.packb(raw))
    assert batch.events == (AllBlocksCleared(),) and batch.dp_rank == rank


def test_legacy_arrays_and_maps_decode_alike_with_storage_media() -> None:
    legacy = ["BlockStored", [-3], None, list(range(PAGE)), PAGE, None, "CPU_PINNED"]
    as_map = {
        "type": "BlockStored",
        "block_hashes": [-3],
        "parent_block_hash": None,
        "token_ids": list(range(PAGE)),
        "block_size": PAGE,
        "lora_id": None,
        "medium": "CPU_PINNED",
        "metadata": {"cache_salt": "x"},  # BlockStoredWithMetadata shares the tag
    }
    short = ["BlockStored", [-3], None, list(range(PAGE)), PAGE]  # before medium existed
    events = sglang.decode_batch(msgpack.packb([1.0, [legacy, as_map, short, ["LoadStat", 1, 2, 3, 4, 0]], 0])).events
    assert len(events) == 3  # LoadStat is not a KV event
    assert events[0] == events[1]
    assert [e.tier for e in events] == [Tier.CPU, Tier.CPU, Tier.GPU]  # type: ignore[union-attr]
    assert sglang.decode_batch(msgpack.packb([1.0, [["BlockRemoved", [1], "DISK", "x"]]])).events[0].tier is Tier.DISK  # type: ignore[union-attr]


def test_malformed_sglang_payload_raises_the_typed_error() -> None:
    with pytest.raises(EventDecodeError, match="SGLang"):
        sglang.decode_batch(msgpack.packb([1.0, [["BlockStored", [-1], None, [1, 2], "sixteen"]], 0]))


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


async def test_an_sglang_stream_one_page_per_event_with_negative_hashes(store: Store, ctx: zmq.asyncio.Context) -> None:
    """SGLang sends AllBlocksCleared at start-up, then one BlockStored per page, chained by signed hashes; its
    replay answers in the 2-frame layout."""
    tokens = blocks_of(20, 5, PAGE)
    engine = FakeEngine(ctx, replay="plain")
    try:
        await engine.publish(msgpack.packb([1.0, [["AllBlocksCleared"]], 1]), deliver=False)  # seq 0, at start-up
        pages = [
            sglang_stored_legacy(
                [sglang_hash(i)], sglang_hash(i - 1) if i else None, tokens[i * PAGE : (i + 1) * PAGE], PAGE
            )
            for i in range(5)
        ]
        await engine.publish(msgpack.packb([1.5, pages[:2], 1]), deliver=False)  # seq 1, before we connect
        async with running(store, engine, decode=sglang.decode_batch, block_size=PAGE) as h:
            assert await h.held(tokens) == 2  # learned from the replay
            await engine.publish(msgpack.packb([2.0, pages[2:4], 1]), deliver=False)  # seq 2: lost
            await engine.publish(msgpack.packb([2.5, pages[4:], 1]))  # seq 3
            await h.until_held(tokens, 5)
            assert any(sglang_hash(i) < 0 for i in range(5))
            await engine.publish(msgpack.packb([3.0, [["BlockRemoved", [sglang_hash(3)], "GPU"]], 1]))
            await h.until_held(tokens, 3)
            stats = h.subscriber.stats
            assert (stats.gaps, stats.purges, stats.malformed) == (1, 1, 0), stats  # the start-up AllBlocksCleared
    finally:
        await engine.close()
