"""Transport: one engine's KV-event stream over ZMQ, with gap replay and purge-on-doubt.

Wire (vLLM and SGLang alike; ``shared/reference/engines.md`` 1.2, 1.4):

- live: a SUB socket (topic filter ``""``) connected to the engine's PUB; each message is 3 frames
  ``[topic, seq (8 bytes, big-endian, unsigned), msgpack payload]``; ``seq`` counts batches from 0 per publisher.
- replay: a DEALER connected to the engine's ROUTER sends ``[b"", start_seq (8 bytes BE)]`` and reads one
  multipart message per buffered batch with ``seq >= start_seq``, oldest first, then an end marker whose seq is
  ``END_SEQ`` (8 x 0xff). Frames after the DEALER's empty delimiter: ``[seq, payload]`` (SGLang, vLLM before
  #45177) or ``[topic, seq, payload]`` (vLLM v0.26+); both are read.

Sequence rules, per (endpoint, dp rank):

- next expected seq: apply.
- a gap: replay the missing range; if the replay cannot close it (no replay address, no answer within
  ``replay_timeout_s``, or the replay starts later than asked because the engine's buffer moved on), the endpoint
  is PURGED and the batches that did arrive, then the live one, are applied on a clean slate.
- seq going backwards: the engine restarted. PURGE, then learn the new instance from seq 0 (replay if possible).
- right after a full replay (start-up, reconnect), live batches the replay already delivered are dropped as
  duplicates until the live stream passes the replay's last seq.
- ``AllBlocksCleared`` purges too (inside ``EventIngestor.apply``).

Start-up and reconnect (the SUB saw the engine go away and come back) both resync: purge the endpoint, replay
from 0, apply everything the engine still buffers. A fresh process cannot translate evictions of blocks it never
saw, so whatever the store held for the endpoint before is dropped rather than trusted.

Nothing a peer sends kills the subscriber: undecodable messages are counted in ``stats.malformed`` and skipped;
store outages are counted in ``stats.store_errors`` and followed by a resync once the store answers again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from kvstate.events import vllm
from kvstate.events.ingest import EventIngestor
from kvstate.events.model import EventBatch, EventDecodeError
from kvstate.task_stop import cancel_and_wait

__all__ = ["END_SEQ", "SEQ_BYTES", "Decoder", "KVEventSubscriber", "SubscriberStats", "parse_replay_frames"]

log = logging.getLogger(__name__)

END_SEQ = b"\xff" * 8
"""Sequence frame of the replay end marker: ``(-1).to_bytes(8, "big", signed=True)``."""

SEQ_BYTES = 8
SUB_RCVHWM = 100_000
"""Live batches queued while a replay runs; vLLM's own PUB high-water mark."""

MAX_STAGED_BATCHES = 64
"""At most this many batches are staged before their store writes go out (about 3,000 blocks at vLLM's pace)."""

Decoder = Callable[[bytes], EventBatch]


@dataclass
class SubscriberStats:
    """Counters over the subscriber's life."""

    received: int = 0
    """Live messages received."""
    applied: int = 0
    """Batches written to the store (live and replayed)."""
    malformed: int = 0
    """Messages (live or replayed) that could not be decoded; skipped."""
    gaps: int = 0
    """Sequence gaps seen on the live stream."""
    replayed: int = 0
    """Batches applied from a replay."""
    purges: int = 0
    """Times the endpoint was purged: unclosable gap, restart, reconnect, AllBlocksCleared, store outage."""
    duplicates: int = 0
    """Live batches dropped because a replay had already applied them."""
    store_errors: int = 0
    """Store writes that failed (each followed by a resync)."""
    writes: int = 0
    """Store flushes: ``applied / writes`` is how many batches each store round trip carried."""


@dataclass
class _Track:
    """Sequence state of one (endpoint, dp rank)."""

    last: int | None = None
    """Last seq applied (or skipped as malformed); None = nothing yet, take whatever comes."""
    replay_floor: int | None = None
    """While set, live seqs in [replay_floor, last] were already applied by a replay."""


class KVEventSubscriber:
    """Follows one engine endpoint's KV events into an ``EventIngestor``. Run it as a task: ``start()``/``stop()``.

    ``endpoint`` is the id the store knows the engine by (``host:port`` of its HTTP server); ``pub_address`` and
    ``replay_address`` are its ZMQ addresses (``tcp://host:5557``, ``tcp://host:5558``); ``decode`` is
    ``kvstate.events.vllm.decode_batch`` or ``kvstate.events.sglang.decode_batch``.
    """

    def __init__(
        self,
        endpoint: str,
        pub_address: str,
        ingestor: EventIngestor,
        decode: Decoder = vllm.decode_batch,
        replay_address: str | None = None,
        replay_timeout_s: float = 2.0,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        if replay_timeout_s <= 0:
            raise ValueError(f"replay_timeout_s must be positive, got {replay_timeout_s}")
        self.endpoint = endpoint
        self.pub_address = pub_address
        self.replay_address = replay_address
        self.replay_timeout_s = replay_timeout_s
        self.ingestor = ingestor
        self.decode = decode
        self.stats = SubscriberStats()
        self.ready = asyncio.Event()
        """Set once the SUB socket is connecting and the start-up resync is done."""
        self._ctx = context or zmq.asyncio.Context.instance()
        self._tracks: dict[int | None, _Track] = {}
        self._last_rank: int | None = None
        self._resync_needed = False
        self._unflushed = 0
        self._unflushed_replayed = 0
        self._disconnected = False
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=f"kv-events {self.endpoint}")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def run(self) -> None:
        """Receive until cancelled. Raises ``ValueError`` at once if ``pub_address`` is not a ZMQ address."""
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, SUB_RCVHWM)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            try:
                sub.connect(self.pub_address)
            except zmq.ZMQError as exc:
                raise ValueError(
                    f"KV events of {self.endpoint}: cannot connect to {self.pub_address!r} ({exc}); "
                    "give the engine's KV-event PUB address as tcp://host:port"
                ) from exc
            await self._resync(reason=None)
            self.ready.set()
            while True:
                try:
                    await self._step(poller, sub, monitor)
                except Exception:  # a bug must not end the stream: log it, start over from a clean slate
                    log.exception("KV events of %s: unexpected error; resyncing", self.endpoint)
                    self._resync_needed = True
                    await asyncio.sleep(0.1)
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _step(self, poller: zmq.asyncio.Poller, sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket) -> None:
        ready = dict(await poller.poll())
        if monitor in ready:
            event = parse_monitor_message(await monitor.recv_multipart())["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self._disconnected = True
                log.info("KV events of %s: publisher %s went away", self.endpoint, self.pub_address)
            elif event == zmq.EVENT_CONNECTED and self._disconnected:
                self._disconnected = False
                await self._resync(reason="publisher reconnected (engine restart or network loss)")
        if sub in ready:
            # Batches already queued are staged and written together: one store round trip per burst.
            # Order is kept: the staged writes are the net effect of the batches, in stream order.
            await self._on_live(await sub.recv_multipart())
            while self._unflushed < MAX_STAGED_BATCHES and _readable(sub):
                await self._on_live(await sub.recv_multipart())
            await self._flush()

    # -- live stream ---------------------------------------------------------------------------------------

    async def _on_live(self, frames: list[bytes]) -> None:
        self.stats.received += 1
        if len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
            self.stats.malformed += 1
            log.warning(
                "KV events of %s: skipped a message of %d frames (want [topic, 8-byte seq, payload])",
                self.endpoint,
                len(frames),
            )
            return
        if self._resync_needed:
            await self._resync(reason="store came back after an outage")
            if self._resync_needed:
                return  # still down; the replay after it recovers will bring this batch back if buffered
        seq = int.from_bytes(frames[1], "big")
        batch = self._decode(frames[2], seq)
        rank = batch.dp_rank if batch is not None else self._last_rank
        track = self._tracks.setdefault(rank, _Track())

        if track.last is None:
            if seq > 0:
                # Nothing known yet on this rank (start-up replay was empty or failed): learn what is buffered.
                await self._fill(track, 0, seq, on_failure=None)
        elif seq <= track.last:
            if track.replay_floor is not None and seq >= track.replay_floor:
                self.stats.duplicates += 1
                return
            await self._purge(f"sequence went back from {track.last} to {seq} (engine restarted)")
            track.last = track.replay_floor = None
            if seq > 0:
                await self._fill(track, 0, seq, on_failure=None)
        elif seq > track.last + 1:
            self.stats.gaps += 1
            await self._fill(track, track.last + 1, seq, on_failure="gap")
        track.replay_floor = None
        if batch is not None:
            self._stage(batch)
        track.last = seq

    def _decode(self, payload: bytes, seq: int) -> EventBatch | None:
        try:
            batch = self.decode(payload)
        except EventDecodeError as exc:
            self.stats.malformed += 1
            log.warning("KV events of %s: skipped batch seq=%d: %s", self.endpoint, seq, exc)
            return None
        self._last_rank = batch.dp_rank
        return batch

    def _stage(self, batch: EventBatch, replayed: bool = False) -> None:
        """Hand a batch to the ingestor; its store writes go out at the next ``_flush``."""
        if self._resync_needed:
            return
        try:
            result = self.ingestor.stage(self.endpoint, batch)
        except Exception:  # a bug, not a peer's fault; the maps may be half-updated, so start over
            log.exception("KV events of %s: could not apply a batch; resyncing", self.endpoint)
            self._resync_needed = True
            return
        self._unflushed += 1
        self._unflushed_replayed += replayed
        if result.cleared:
            self.stats.purges += 1
            log.info("KV events of %s: engine cleared its cache (AllBlocksCleared); endpoint purged", self.endpoint)

    async def _flush(self) -> None:
        """Write the staged batches in one go."""
        if self._resync_needed:
            return
        try:
            await self.ingestor.flush(self.endpoint)
        except Exception as exc:  # the store failed (StoreUnavailable or a driver error): never kill the loop
            self._store_failed("store write failed (%s); will resync when it answers", exc)
            return
        finally:
            applied, replayed = self._unflushed, self._unflushed_replayed
            self._unflushed = self._unflushed_replayed = 0
        self.stats.applied += applied
        self.stats.replayed += replayed
        self.stats.writes += applied > 0

    async def _flush_if_full(self) -> None:
        if self._unflushed >= MAX_STAGED_BATCHES:
            await self._flush()

    # -- gaps, replay, purge -------------------------------------------------------------------------------

    async def _fill(self, track: _Track, start: int, stop: int, on_failure: str | None) -> None:
        """Apply the replayed batches ``start <= seq < stop``. If they do not cover that range exactly and
        ``on_failure`` is given, purge first (naming it in the log), then apply what did arrive.

        Batches are applied as they arrive, never listed: a replay can be the engine's whole buffer (10,000
        batches). The failures real engines show come before anything is applied (no address, no answer, a
        replay that starts later: the buffer moved on) and purge there. One that shows midway (a hole, an early
        end, an answer that stops) purges then, and what the replay delivered is fetched once more to apply on
        the clean slate (nothing when it stopped answering): the store ends as if the whole answer had been read
        first. Only ``stats.applied``/``replayed`` differ: they also count what was flushed before that purge.
        (A replay without ``on_failure`` that stops answering midway purges too, uncounted: none came, as before.)"""
        expect = start
        """The next seq that keeps the range closed."""
        purged_early = False

        async def take(seq: int, payload: bytes) -> None:
            nonlocal expect, purged_early
            if not start <= seq < stop:
                return
            if seq != expect and on_failure is not None and not purged_early:
                if expect != start:
                    raise _ReplayBroken(f"replay goes from {expect - 1} to {seq}")
                purged_early = True
                await self._purge(f"{on_failure} {start}..{stop - 1} not replayable (replay starts at {seq})")
            self._apply_replayed(seq, payload)
            await self._flush_if_full()
            track.last = seq
            expect = seq + 1

        why: str | None = None
        try:
            answered = await self._replay(start, take)
        except _ReplayBroken as exc:
            answered, why = True, str(exc)
        if not answered and expect != start and (on_failure is None or purged_early):
            # It stopped answering after part of it was applied: keep nothing of it, as when none came.
            await self._purge(f"replay from {start} stopped answering midway", count=False)
            return
        if on_failure is None or (answered and why is None and (purged_early or expect == stop)):
            return
        if why is None:
            why = (
                "no replay address"
                if self.replay_address is None
                else "replay timed out"
                if not answered
                else "replay starts at nothing"
                if expect == start
                else f"replay ends at {expect - 1}"
            )
        await self._purge(f"{on_failure} {start}..{stop - 1} not replayable ({why})")
        if answered and expect != start:  # it broke midway: what it applied went with the purge; fetch it again
            await self._fill(track, start, stop, on_failure=None)

    def _apply_replayed(self, seq: int, payload: bytes) -> EventBatch | None:
        batch = self._decode(payload, seq)
        if batch is not None:
            self._stage(batch, replayed=True)
        return batch

    async def _resync(self, reason: str | None) -> None:
        """Purge the endpoint, then apply everything the engine's replay buffer still holds."""
        self._tracks.clear()
        self._unflushed = self._unflushed_replayed = 0  # the purge drops them
        try:
            await self.ingestor.purge(self.endpoint)
        except Exception as exc:
            self._store_failed("cannot purge (%s); will retry on the next message", exc)
            return
        self._resync_needed = False
        if reason is not None:
            self.stats.purges += 1
            log.warning("KV events of %s: purged, resyncing from replay: %s", self.endpoint, reason)

        async def take(seq: int, payload: bytes) -> None:
            batch = self._apply_replayed(seq, payload)
            await self._flush_if_full()
            rank = batch.dp_rank if batch is not None else self._last_rank
            track = self._tracks.setdefault(rank, _Track())
            if track.replay_floor is None:
                track.replay_floor = seq
            track.last = seq

        if not await self._replay(0, take) and self._tracks:
            # The answer stopped midway: keep nothing of it, as when none came (the live stream fills in).
            self._tracks.clear()
            await self._purge("start-up or reconnect replay timed out midway", count=False)
            return
        await self._flush()

    def _store_failed(self, what: str, exc: Exception) -> None:
        """Count a store failure; log it once per outage (the first failure since the last good resync), not once
        per message: an engine publishes many batches a second, and a Redis outage must not flood the log."""
        self.stats.store_errors += 1
        first = not self._resync_needed
        self._resync_needed = True
        if first:
            log.error("KV events of %s: " + what, self.endpoint, exc)
        else:
            log.debug("KV events of %s: (store still down) " + what, self.endpoint, exc)

    async def _purge(self, reason: str, count: bool = True) -> None:
        """Purge the endpoint's state. Sequence tracking goes on: the caller decides where it resumes.
        ``count=False``: a purge that only undoes a partial replay, within a purge already counted."""
        self.stats.purges += count
        self._unflushed = self._unflushed_replayed = 0  # the purge drops them
        log.log(logging.WARNING if count else logging.INFO, "KV events of %s: purged: %s", self.endpoint, reason)
        try:
            await self.ingestor.purge(self.endpoint)
        except Exception as exc:
            self._store_failed("cannot purge (%s); will resync when the store answers", exc)

    async def _replay(self, start: int, take: Callable[[int, bytes], Awaitable[None]]) -> bool:
        """Hand the engine's buffered batches from ``start`` on to ``take`` as they arrive, oldest first: one at
        a time, so memory does not grow with the replay. True when the end marker came; False without a replay
        address or when the engine stops answering (``take`` may have had part of the replay by then)."""
        if self.replay_address is None:
            return False
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        # The engine's ROUTER drops what does not fit its pipe to us; applying is slower than sending, so let
        # libzmq queue the difference rather than lose batches (it holds only what is not yet applied).
        dealer.setsockopt(zmq.RCVHWM, 0)
        timeout_ms = int(self.replay_timeout_s * 1000)
        try:
            try:
                dealer.connect(self.replay_address)
            except zmq.ZMQError as exc:
                log.error("KV events of %s: bad replay address %r (%s)", self.endpoint, self.replay_address, exc)
                return False
            await dealer.send_multipart([b"", start.to_bytes(SEQ_BYTES, "big")])
            while True:
                if not await dealer.poll(timeout_ms):
                    log.warning(
                        "KV events of %s: replay from seq %d at %s: no answer within %.1fs",
                        self.endpoint,
                        start,
                        self.replay_address,
                        self.replay_timeout_s,
                    )
                    return False
                reply = parse_replay_frames(await dealer.recv_multipart())
                if reply is None:
                    self.stats.malformed += 1
                    continue
                seq_bytes, payload = reply
                if seq_bytes == END_SEQ:
                    return True
                await take(int.from_bytes(seq_bytes, "big"), payload)
        finally:
            dealer.close(linger=0)


class _ReplayBroken(Exception):
    """A gap's replay broke its sequence after part of it was applied; the message says where."""


def _readable(socket: zmq.asyncio.Socket) -> bool:
    """A message is already queued (no wait)."""
    events: int = socket.get(zmq.EVENTS)  # type: ignore[assignment]
    return bool(events & zmq.POLLIN)


def parse_replay_frames(frames: list[bytes]) -> tuple[bytes, bytes] | None:
    """(seq frame, payload) of one replay reply, in any of its layouts, or None when it is none of them.

    As a DEALER sees them: ``[b"", seq, payload]`` or ``[b"", topic, seq, payload]`` (end markers carry
    ``END_SEQ`` and an empty payload). Without the delimiter (a REQ-style reader) the same rules apply, since
    ``[b"", seq, payload]`` reads as ``[topic="", seq, payload]``.
    """
    if len(frames) == 4 and frames[0] == b"":
        frames = frames[1:]
    if len(frames) == 3:
        seq, payload = frames[1], frames[2]
    elif len(frames) == 2:
        seq, payload = frames[0], frames[1]
    else:
        return None
    if len(seq) != SEQ_BYTES:
        return None
    return seq, payload
