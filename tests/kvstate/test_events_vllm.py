"""vLLM KV events: payload decoding (both generations, both envelopes) and real ZMQ streams into the store."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator

import msgpack
import pytest
import zmq.asyncio

from kvstate.events import vllm
from kvstate.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, EventDecodeError
from kvstate.keys import chain_block_keys, root_key
from kvstate.store import Store, Tier
from tests.support.events_fake_engine import (
    ENDPOINT,
    MODEL,
    FakeEngine,
    blocks_of,
    envelope,
    running,
    vllm_removed_map,
    vllm_stored_legacy,
    vllm_stored_map,
)

# The kthena#1535 capture from vLLM v0.26.0 (engines.md 1.3), with its 16 token ids spelled out.
CAPTURE_TOKENS = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 9707, 11]
CAPTURE = msgpack.packb(
    [
        1789095808.8378847,
        [vllm_stored_map([15760518052499183552], None, CAPTURE_TOKENS)],
        0,
    ]
)


# -- decoding ----------------------------------------------------------------------------------------------


def test_v0_26_capture_decodes_map_events_in_a_three_element_envelope() -> None:
    batch = vllm.decode_batch(CAPTURE)
    assert batch == EventBatch(
        ts=1789095808.8378847,
        events=(
            BlockStored(
                block_hashes=(15760518052499183552,),
                parent_block_hash=None,
                token_ids=tuple(CAPTURE_TOKENS),
                block_size=16,
                lora_name=None,
                medium="GPU",
            ),
        ),
        dp_rank=0,
    )


def test_bytes_match_the_hex_engines_md_reproduced_for_both_generations() -> None:
    new = envelope([vllm_stored_map([11], None, range(16))], ts=1.5)
    assert new.hex().startswith("93cb3ff8000000000000918ba474797065")  # [1.5, [ {11 keys, "type": ...
    legacy = envelope([vllm_stored_legacy([11], None, range(16), length=10)], ts=1.5)
    assert legacy.hex().startswith("93cb3ff8000000000000919aab426c6f636b53746f726564")  # [1.5, [ [10, "BlockStored"
    assert vllm.decode_batch(new).events == vllm.decode_batch(legacy).events


@pytest.mark.parametrize("length", [5, 6, 7, 8, 12, 14])
def test_legacy_arrays_of_any_length_decode_the_same_block(length: int) -> None:
    event = vllm.decode_batch(envelope([vllm_stored_legacy([7, 8], 3, range(32), length=length)])).events[0]
    assert isinstance(event, BlockStored)
    assert (event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size) == (
        (7, 8),
        3,
        tuple(range(32)),
        16,
    )
    assert event.medium == ("GPU" if length >= 7 else None)
    assert event.tier is Tier.GPU


def test_legacy_removed_and_cleared_short_and_long() -> None:
    batch = vllm.decode_batch(
        envelope([["BlockRemoved", [5]], ["BlockRemoved", [6], "CPU", None, "future"], ["AllBlocksCleared", "x"]])
    )
    assert batch.events == (BlockRemoved((5,), None), BlockRemoved((6,), "CPU"), AllBlocksCleared())
    assert [e.tier for e in batch.events[:2]] == [Tier.GPU, Tier.CPU]  # type: ignore[union-attr]


@pytest.mark.parametrize("form,rank", [("array2", None), ("array3", None), ("array3", 3), ("map", 2)])
def test_envelope_forms(form: str, rank: int | None) -> None:
    batch = vllm.decode_batch(envelope([["AllBlocksCleared"]], rank=rank, form=form, ts=12.5))
    assert (batch.ts, batch.events, batch.dp_rank) == (12.5, (AllBlocksCleared(),), rank)


def test_bytes_hashes_read_as_their_last_eight_bytes_big_endian() -> None:
    digest = bytes(range(24)) + (0xFEDCBA9876543210).to_bytes(8, "big")
    parent = bytes(16)[:8] + (42).to_bytes(8, "big")
    event = vllm.decode_batch(envelope([vllm_stored_map([digest], parent, range(16))])).events[0]
    assert isinstance(event, BlockStored)
    assert event.block_hashes == (0xFEDCBA9876543210,)
    assert event.parent_block_hash == 42


def test_hashes_above_two_to_the_63_stay_unsigned() -> None:
    event = vllm.decode_batch(envelope([vllm_stored_map([2**64 - 1, 2**63], 2**63 + 5, range(32))])).events[0]
    assert isinstance(event, BlockStored)
    assert event.block_hashes == (2**64 - 1, 2**63)
    assert event.parent_block_hash == 2**63 + 5


def test_unknown_keys_and_event_types_are_ignored() -> None:
    stored = {**vllm_stored_map([1], None, range(16)), "locality": "local", "event_version": 1}
    batch = vllm.decode_batch(envelope([{"type": "SomethingNew", "x": 1}, stored, ["LoadStat", 1, 2]]))
    assert len(batch.events) == 1 and isinstance(batch.events[0], BlockStored)


@pytest.mark.parametrize(
    "medium,tier",
    [
        (None, Tier.GPU),
        ("GPU", Tier.GPU),
        ("CPU", Tier.CPU),
        ("cpu", Tier.CPU),
        ("STORAGE", Tier.DISK),
        ("NVMe?", Tier.DISK),
    ],
)
def test_medium_maps_to_a_tier(medium: str | None, tier: Tier) -> None:
    event = vllm.decode_batch(envelope([vllm_stored_map([1], None, range(16), medium=medium)])).events[0]
    assert isinstance(event, BlockStored) and event.tier is tier


def test_lora_id_without_a_name_gets_a_name_no_request_can_produce() -> None:
    raw = ["BlockStored", [1], None, list(range(16)), 16, 7, "GPU"]
    event = vllm.decode_batch(envelope([raw])).events[0]
    assert isinstance(event, BlockStored) and event.lora_name == "<lora-id:7>"


@pytest.mark.parametrize(
    "payload,says",
    [
        (b"", "not valid msgpack"),
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([1.0, []]) + b"\x00", "not valid msgpack"),
        (msgpack.packb(5), "must be [ts, events, rank]"),
        (msgpack.packb([1.0]), "must be [ts, events, rank]"),
        (msgpack.packb({"events": []}), "lacks ['ts']"),
        (msgpack.packb(["now", []]), "ts must be a number"),
        (msgpack.packb([1.0, {}]), "events must be an array"),
        (msgpack.packb([1.0, [], "rank0"]), "rank must be an int"),
        (msgpack.packb([1.0, [7]]), "tagged array or map"),
        (msgpack.packb([1.0, [[]]]), "tagged array or map"),
        (msgpack.packb([1.0, [[3, [1]]]]), "string type tag"),
        (msgpack.packb([1.0, [["BlockStored"]]]), "block_hashes must be an array"),
        (msgpack.packb([1.0, [["BlockStored", [1.5], None, list(range(16)), 16]]]), "int or bytes"),
        (msgpack.packb([1.0, [["BlockStored", [b""], None, list(range(16)), 16]]]), "int or bytes"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, [-1] * 16, 16]]]), "token ids"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, [2**40] * 16, 16]]]), "token ids"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, ["a"] * 16, 16]]]), "token ids"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, list(range(16))]]]), "block_size"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, list(range(16)), 0]]]), "block_size"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, list(range(16)), 16, None, 5]]]), "medium"),
        (msgpack.packb([1.0, [["BlockRemoved", 5]]]), "block_hashes must be an array"),
    ],
)
def test_malformed_payloads_raise_a_typed_error_saying_what_is_wrong(payload: bytes, says: str) -> None:
    with pytest.raises(EventDecodeError) as err:
        vllm.decode_batch(payload)
    assert says in str(err.value)


def test_random_bytes_never_raise_anything_but_the_typed_error() -> None:
    rng = random.Random(7)
    outcomes: Counter[str] = Counter()
    for _ in range(3000):
        data = bytearray(CAPTURE)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        for payload in (bytes(data), bytes(data[: rng.randrange(len(data))]), rng.randbytes(rng.randint(0, 40))):
            try:
                vllm.decode_batch(payload)
                outcomes["decoded"] += 1
            except EventDecodeError:
                outcomes["rejected"] += 1
    assert outcomes["decoded"] > 0 and outcomes["rejected"] > 0, outcomes


# -- real ZMQ streams into the store -----------------------------------------------------------------------


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


async def test_v0_26_capture_over_zmq_lands_in_the_store_under_our_keys(store: Store, ctx: zmq.asyncio.Context) -> None:
    engine = FakeEngine(ctx, replay="topic")
    try:
        async with running(store, engine) as h:
            assert await h.held(CAPTURE_TOKENS) == 0
            await engine.publish(CAPTURE)
            await h.until_held(CAPTURE_TOKENS, 1)
            assert h.subscriber.stats.applied == 1 and h.subscriber.stats.malformed == 0
    finally:
        await engine.close()


async def test_mixed_generations_chain_parents_across_batches_and_removals_apply(
    store: Store, ctx: zmq.asyncio.Context
) -> None:
    tokens = blocks_of(1000, 6)
    digests = [bytes([i]) * 32 for i in range(1, 7)]  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: raw sha256 digests
    engine = FakeEngine(ctx, replay="topic")
    try:
        async with running(store, engine) as h:
            # batch 1: legacy short array (vLLM 0.9 era), blocks 0-1 from the root
            await engine.publish(envelope([vllm_stored_legacy(digests[:2], None, tokens[:32], length=5)]))
            # batch 2: legacy long array with a future trailing field, continuing from block 1's hash
            await engine.publish(envelope([vllm_stored_legacy(digests[2:4], digests[1], tokens[32:64], length=13)]))
            # batch 3: map events, continuing from block 3
            await engine.publish(envelope([vllm_stored_map(digests[4:], digests[3], tokens[64:])]))
            await h.until_held(tokens, 6)
            # the engine evicts block 4 (the hash as an int this time: the same last-8-bytes value)
            await engine.publish(envelope([vllm_removed_map([int.from_bytes(digests[4][-8:], "big")])]))
            await h.until_held(tokens, 4)
            assert h.ingestor.stats.unknown_parent == 0
    finally:
        await engine.close()


async def test_an_old_engine_stream_with_two_element_envelopes(store: Store, ctx: zmq.asyncio.Context) -> None:
    tokens = blocks_of(300, 3)
    engine = FakeEngine(ctx, replay="plain")
    try:
        async with running(store, engine) as h:
            await engine.publish(envelope([vllm_stored_legacy([1, 2], None, tokens[:32], length=5)], form="array2"))
            await engine.publish(envelope([vllm_stored_legacy([3], 2, tokens[32:], length=5)], form="array2"))
            await h.until_held(tokens, 3)
    finally:
        await engine.close()


async def test_lora_blocks_are_rooted_at_the_adapter_name(store: Store, ctx: zmq.asyncio.Context) -> None:
    tokens = blocks_of(5, 2)
    engine = FakeEngine(ctx, replay="topic")
    try:
        async with running(store, engine) as h:
            await engine.publish(envelope([vllm_stored_map([1, 2], None, tokens, lora_name="sql-adapter")]))
            await h.until_held(tokens, 2, lora="sql-adapter")
            assert await h.held(tokens) == 0  # the base model's prefix cache does not hold them
    finally:
        await engine.close()


async def test_offloaded_copy_without_tokens_adds_the_cpu_tier(store: Store, ctx: zmq.asyncio.Context) -> None:
    tokens = blocks_of(9, 2)
    engine = FakeEngine(ctx, replay="topic")
    try:
        async with running(store, engine) as h:
            await engine.publish(envelope([vllm_stored_map([1, 2], None, tokens)]))
            await engine.publish(
                envelope(
                    [
                        {
                            "type": "BlockStored",
                            "block_hashes": [1, 2],
                            "parent_block_hash": None,
                            "token_ids": [],
                            "block_size": 16,
                            "medium": "CPU",
                        }
                    ]
                )
            )
            await engine.publish(envelope([vllm_removed_map([1, 2], medium="GPU")]))
            # evicted from the GPU, still held on the CPU: the prefix still matches, at the CPU weight
            await h.until_stat("applied", 3)
            await h.until_held(tokens, 2)
            match = await h.store.match_prefix(MODEL, chain_block_keys(root_key(MODEL), tokens, 16), [ENDPOINT])
            assert match[ENDPOINT].weighted_blocks < 2.0
    finally:
        await engine.close()
