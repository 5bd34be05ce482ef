"""vLLM's KV-event publisher (vLLM >= 0.26): ZMQ PUB stream plus a ROUTER replay socket.

Wire format (engines.md section 1):

- live stream, three frames: ``[topic, seq (8 bytes, unsigned big-endian, from 0), msgpack(EventBatch)]``;
- ``EventBatch = [ts (float, time.time()), [event, ...], data_parallel_rank]``;
- event (vLLM >= 0.26, map encoding): ``{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids",
  "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind"}`` (vLLM writes
  fields without a declared default always and the others when they differ from it; a v0.26 capture, kthena#1535,
  shows ``extra_keys`` with one None per block, ``group_idx`` 0 and ``kv_cache_spec_kind`` "full_attention"),
  ``{"type": "BlockRemoved", "block_hashes", "medium"}``, ``{"type": "AllBlocksCleared"}``;
- legacy encoding (``legacy=True``, before vllm#42892): tagged positional arrays
  ``["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium, lora_name]``,
  ``["BlockRemoved", hashes, medium]``, ``["AllBlocksCleared"]``;
- replay: the ROUTER gets ``[identity, b"", start_seq (8 bytes BE)]`` and answers, for every buffered batch with
  ``seq >= start_seq`` oldest first, ``[identity, b"", topic, seq, payload]`` (the v0.26 layout with the topic;
  ``legacy=True`` drops the topic frame), then the end marker ``[identity, b"", b"", END_SEQ, b""]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from cognitora_sim.kv_cache import AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM_GPU = "GPU"


def topic_for(host: str, port: int, model: str) -> str:
    """llm-d's topic convention: ``kv@<host>:<port>@<model>``."""
    return f"kv@{host}:{port}@{model}"


def encode_event(event: CacheEvent, legacy: bool) -> Any:
    if isinstance(event, BlockStored):
        if legacy:
            return [
                "BlockStored",
                event.block_hashes,
                event.parent_block_hash,
                event.token_ids,
                event.block_size,
                None,
                event.medium,
                None,
            ]
        return {
            "type": "BlockStored",
            "block_hashes": event.block_hashes,
            "parent_block_hash": event.parent_block_hash,
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": None,
            "medium": event.medium,
            "lora_name": None,
            # as captured from vLLM v0.26.0 (kthena#1535): one extra_keys entry per block, group 0, full attention
            "extra_keys": [None] * len(event.block_hashes),
            "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        }
    if isinstance(event, BlockRemoved):
        if legacy:
            return ["BlockRemoved", event.block_hashes, event.medium]
        return {"type": "BlockRemoved", "block_hashes": event.block_hashes, "medium": event.medium}
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"] if legacy else {"type": "AllBlocksCleared"}
    raise TypeError(f"not a cache event: {event!r}")


def encode_batch(ts: float, events: list[CacheEvent], dp_rank: int | None, legacy: bool) -> bytes:
    payload: bytes = msgpack.packb([ts, [encode_event(e, legacy) for e in events], dp_rank], use_bin_type=True)
    return payload


class KvEventPublisher:
    """One engine's PUB socket, replay buffer and ROUTER replay service."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        replay_endpoint: str,
        topic: str,
        *,
        legacy: bool = False,
        buffer_steps: int = 10_000,
        dp_rank: int = 0,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.legacy = legacy
        self.dp_rank = dp_rank
        self._ctx = ctx
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.published = 0

    @property
    def next_seq(self) -> int:
        return self._seq

    def start(self) -> None:
        pub = self._ctx.socket(zmq.PUB)
        router = self._ctx.socket(zmq.ROUTER)
        try:
            pub.setsockopt(zmq.LINGER, 0)
            pub.setsockopt(zmq.SNDHWM, 100_000)
            pub.bind(self.endpoint)
            router.setsockopt(zmq.LINGER, 0)
            router.bind(self.replay_endpoint)
        except zmq.ZMQError:
            pub.close(linger=0)  # a socket left open would block the context's termination forever
            router.close(linger=0)
            raise
        self._pub, self._router = pub, router
        self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay(router))

    def publish(self, events: list[CacheEvent], ts: float | None = None) -> None:
        if not events or self._pub is None:
            return
        payload = encode_batch(time.time() if ts is None else ts, events, self.dp_rank, self.legacy)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        seq_bytes = seq.to_bytes(8, "big")
        with contextlib.suppress(zmq.Again):  # PUB drops past its high-water mark, as vLLM's does
            self._pub.send_multipart([self.topic, seq_bytes, payload], flags=zmq.NOBLOCK)
        self.published += 1

    def restart(self) -> None:
        """A restarted engine: sequence numbers start again at 0 and the replay buffer is empty."""
        self._seq = 0
        self._buffer.clear()

    async def _serve_replay(self, router: zmq.asyncio.Socket) -> None:
        while True:
            try:
                frames = await router.recv_multipart()
            except (asyncio.CancelledError, zmq.ContextTerminated):
                return
            except zmq.ZMQError as exc:
                if exc.errno == zmq.ENOTSOCK:
                    return
                log.warning("replay socket error on %s: %s", self.replay_endpoint, exc)
                continue
            if len(frames) != 3 or len(frames[2]) != 8:
                # vLLM logs and drops malformed requests; so do we (never crash on one bad message)
                log.warning(
                    "replay request on %s: expected [identity, b'', seq(8 bytes)], got %d frames",
                    self.replay_endpoint,
                    len(frames),
                )
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            try:
                for seq, payload in list(self._buffer):
                    if seq < start:
                        continue
                    if self.legacy:
                        reply = [identity, b"", seq.to_bytes(8, "big"), payload]
                    else:
                        reply = [identity, b"", self.topic, seq.to_bytes(8, "big"), payload]
                    await router.send_multipart(reply)
                end = [identity, b"", END_SEQ, b""] if self.legacy else [identity, b"", b"", END_SEQ, b""]
                await router.send_multipart(end)
            except zmq.ZMQError as exc:
                log.warning("replay reply on %s failed: %s", self.replay_endpoint, exc)

    def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            self._replay_task = None
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None
