"""A KV-event publisher for tests, built byte for byte from ``shared/reference/engines.md`` (sections 1.2-1.4, 3.1).

It is NOT the product's code: payloads are plain ``msgpack.packb`` of the shapes the engines send, frames are
assembled by hand, and the replay ROUTER answers in either layout:

- ``"topic"``: vLLM v0.26+ (vllm#45177): ``[id, b"", topic, seq, payload]``, end ``[id, b"", b"", END_SEQ, b""]``
- ``"plain"``: SGLang and older vLLM: ``[id, b"", seq, payload]``, end ``[id, b"", END_SEQ, b""]``

The PUB side is an XPUB (on the wire a PUB) so a test can wait until the subscriber's subscription has arrived
instead of sleeping and hoping.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack
import zmq
import zmq.asyncio

from kvstate.events import vllm
from kvstate.events.ingest import EventIngestor
from kvstate.events.model import EventBatch
from kvstate.events.subscriber import KVEventSubscriber
from kvstate.keys import chain_block_keys, root_key
from kvstate.store import Store

END_SEQ = b"\xff" * 8
ReplayLayout = Literal["topic", "plain"]


async def eventually(condition: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 10.0) -> None:
    """Await ``condition`` until it is true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.02)


# -- payloads (engines.md 1.3 and 3.1) ---------------------------------------------------------------------


def vllm_stored_map(
    hashes: Sequence[Any],
    parent: Any,
    tokens: Sequence[int],
    block_size: int = 16,
    medium: str | None = "GPU",
    lora_name: str | None = None,
) -> dict[str, Any]:
    """A vLLM v0.26.0 ``BlockStored`` map, keys in declaration order as in the kthena#1535 capture."""
    return {
        "type": "BlockStored",
        "block_hashes": list(hashes),
        "parent_block_hash": parent,
        "token_ids": list(tokens),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": lora_name,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def vllm_stored_legacy(
    hashes: Sequence[Any], parent: Any, tokens: Sequence[int], block_size: int = 16, length: int = 12
) -> list[Any]:
    """A legacy tagged array cut to ``length`` elements (5 = vLLM 0.9 era, 12 = every field, >12 = future)."""
    full: list[Any] = [
        "BlockStored",
        list(hashes),
        parent,
        list(tokens),
        block_size,
        None,  # lora_id
        "GPU",  # medium
        None,  # lora_name
        [None] * len(hashes),  # extra_keys
        0,  # group_idx
        "full_attention",  # kv_cache_spec_kind
        None,  # kv_cache_spec_sliding_window
    ]
    return (full + ["a-future-field"] * max(0, length - len(full)))[:length]


def vllm_removed_map(hashes: Sequence[Any], medium: str | None = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium}


def sglang_stored_legacy(hashes: Sequence[int], parent: int | None, tokens: Sequence[int], page: int) -> list[Any]:
    """SGLang's positional ``BlockStored``: ``[tag, hashes, parent, tokens, block_size, lora_id, medium]``."""
    return ["BlockStored", list(hashes), parent, list(tokens), page, None, "GPU"]


def envelope(
    events: Sequence[Any], rank: int | None = 0, form: str = "array3", ts: float = 1789095808.8378847
) -> bytes:
    """An ``EventBatch`` payload: ``array3`` = [ts, events, rank], ``array2`` = [ts, events], or a map."""
    if form == "array3":
        return msgpack.packb([ts, list(events), rank])
    if form == "array2":
        return msgpack.packb([ts, list(events)])
    if form == "map":
        return msgpack.packb({"ts": ts, "events": list(events), "data_parallel_rank": rank})
    raise ValueError(form)


# -- the engine side of the wire ---------------------------------------------------------------------------


class FakeEngine:
    """An engine's KV-event sockets: XPUB for the live stream, ROUTER for replay (or none)."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        replay: ReplayLayout | None = "topic",
        topic: bytes = b"kv@127.0.0.1:8000@test-model",
        pub_port: int = 0,
        replay_port: int = 0,
    ) -> None:
        self.ctx = ctx
        self.topic = topic
        self.layout = replay
        self.buffer: list[tuple[int, bytes]] = []
        self.next_seq = 0
        self.replay_requests: list[int] = []
        self.replay_floor = 0
        """Only buffered batches with seq >= this are replayed: the engine's deque moved on."""
        self.replay_answers = True
        """False: requests are read and never answered (the subscriber must time out)."""
        self.replay_pace: Callable[[int], Awaitable[None]] | None = None
        """Awaited with n before an answer's n-th batch (from 0) goes out: lets a test hold the engine back."""
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub_port = _bind(self.pub, pub_port)
        self.router: zmq.asyncio.Socket | None = None
        self.replay_port = 0
        self._server: asyncio.Task[None] | None = None
        if replay is not None:
            self.router = ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.replay_port = _bind(self.router, replay_port)
            self._server = asyncio.create_task(self._serve_replay())

    @property
    def pub_address(self) -> str:
        return f"tcp://127.0.0.1:{self.pub_port}"

    @property
    def replay_address(self) -> str | None:
        return f"tcp://127.0.0.1:{self.replay_port}" if self.router is not None else None

    async def wait_subscribed(self, timeout_s: float = 10.0) -> None:
        """Until a subscriber's subscription message (``b"\\x01"`` + topic filter) reaches the XPUB."""
        if not await self.pub.poll(int(timeout_s * 1000)):
            raise AssertionError(f"no subscriber subscribed to {self.pub_address} within {timeout_s:.0f}s")
        frame = await self.pub.recv()
        assert frame[:1] == b"\x01", frame

    async def publish(self, payload: bytes, *, deliver: bool = True, seq: int | None = None) -> int:
        """Buffer ``payload`` under the next sequence number and send it; ``deliver=False`` loses it on the way
        (it stays replayable), as a dropped message would."""
        if seq is None:
            seq = self.next_seq
        self.next_seq = seq + 1
        self.buffer.append((seq, payload))
        if deliver:
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    async def send_raw(self, frames: list[bytes]) -> None:
        await self.pub.send_multipart(frames)

    async def _serve_replay(self) -> None:
        assert self.router is not None
        while True:
            frames = await self.router.recv_multipart()
            identity, delimiter, start_frame = frames  # vLLM's ROUTER expects exactly these 3 frames
            assert delimiter == b"" and len(start_frame) == 8, frames
            start = int.from_bytes(start_frame, "big")
            self.replay_requests.append(start)
            if not self.replay_answers:
                continue
            sent = 0
            for seq, payload in self.buffer:
                if seq >= max(start, self.replay_floor):
                    if self.replay_pace is not None:
                        await self.replay_pace(sent)
                    sent += 1
                    seq_frame = seq.to_bytes(8, "big")
                    if self.layout == "topic":
                        await self.router.send_multipart([identity, b"", self.topic, seq_frame, payload])
                    else:
                        await self.router.send_multipart([identity, b"", seq_frame, payload])
            if self.layout == "topic":
                await self.router.send_multipart([identity, b"", b"", END_SEQ, b""])
            else:
                await self.router.send_multipart([identity, b"", END_SEQ, b""])

    async def close(self) -> None:
        if self._server is not None:
            self._server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._server
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)


def _bind(socket: zmq.asyncio.Socket, port: int) -> int:
    """Bind to ``port`` (0: a free one). A just-closed engine's port can take a moment to be released."""
    if port == 0:
        chosen: int = socket.bind_to_random_port("tcp://127.0.0.1")
        return chosen
    deadline = time.monotonic() + 5.0
    while True:
        try:
            socket.bind(f"tcp://127.0.0.1:{port}")
            return port
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# -- a running subscriber over a fake engine ---------------------------------------------------------------

ENDPOINT = "127.0.0.1:8000"
MODEL = "test-model"


def blocks_of(start: int, n: int, block_size: int = 16) -> list[int]:
    """``n`` blocks of distinct, recognisable token ids."""
    return [start + i for i in range(n * block_size)]


@dataclass
class Harness:
    store: Store
    engine: FakeEngine
    ingestor: EventIngestor
    subscriber: KVEventSubscriber
    block_size: int

    async def held(self, tokens: Sequence[int], lora: str | None = None) -> int:
        """How many leading blocks of ``tokens`` the store says the endpoint holds, in OUR keys."""
        keys = chain_block_keys(root_key(MODEL, lora), tokens, self.block_size)
        match = await self.store.match_prefix(MODEL, keys, [ENDPOINT])
        return match[ENDPOINT].blocks if ENDPOINT in match else 0

    async def until_held(self, tokens: Sequence[int], blocks: int, lora: str | None = None) -> None:
        async def check() -> bool:
            return await self.held(tokens, lora) == blocks

        await eventually(check, f"the store to show {blocks} blocks held")

    async def until_stat(self, name: str, value: int) -> None:
        async def check() -> bool:
            return bool(getattr(self.subscriber.stats, name) >= value)

        await eventually(check, f"stats.{name} >= {value} (stats: {self.subscriber.stats})")


@contextlib.asynccontextmanager
async def running(
    store: Store,
    engine: FakeEngine,
    decode: Callable[[bytes], EventBatch] = vllm.decode_batch,
    block_size: int = 16,
    use_replay: bool = True,
    replay_timeout_s: float = 5.0,
    ingestor: EventIngestor | None = None,
) -> AsyncIterator[Harness]:
    """A subscriber following ``engine`` into ``store`` (through ``ingestor`` when given), started and subscribed."""
    ingestor = ingestor or EventIngestor(store, MODEL, block_size)
    subscriber = KVEventSubscriber(
        ENDPOINT,
        engine.pub_address,
        ingestor,
        decode,
        replay_address=engine.replay_address if use_replay else None,
        replay_timeout_s=replay_timeout_s,
        context=engine.ctx,
    )
    task = subscriber.start()
    try:
        ready = asyncio.ensure_future(subscriber.ready.wait())
        await asyncio.wait([ready, task], timeout=10.0, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # re-raise what killed it
        assert subscriber.ready.is_set(), "subscriber not ready within 10s"
        await engine.wait_subscribed()
        yield Harness(store, engine, ingestor, subscriber, block_size)
        assert not task.done(), "the subscriber stopped on its own"
    finally:
        await subscriber.stop()
