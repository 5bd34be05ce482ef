"""``MemoryStore``: the ``Store`` in one process (a single gateway, embedded collector, tests, the simulator).

Layout, per model:

- each endpoint gets a small integer id, and each block key maps to a Python ``int`` used as a bitset of the
  endpoints holding it. A prefix match is then one dict lookup and one ``&`` per block, however many endpoints
  match: a walk touches ``len(keys)`` entries, not ``len(keys) * endpoints``, and stops when no endpoint is left;
- per endpoint, an ``OrderedDict`` block key -> tier bitmask in LRU order (the truth the bitsets are derived from).
  Storing a block, or routing a request that reuses it (``add_speculative``), makes it the youngest; past the cap
  the oldest are forgotten in O(1) each. A bare ``match_prefix`` is a pure read: most endpoints it scores are not
  chosen, and their engines will not refresh those blocks either;
- entries whose weight differs from a GPU block (other tiers) and speculative entries are flagged by two more
  bitsets, so the common case (GPU blocks only) never looks further.

Every method is synchronous underneath (no awaits), hence atomic on the event loop; a re-entrant lock makes each
one atomic across threads too, so a collector may feed the store from its own thread and event loop (a gateway
whose loop is busy serving requests must not delay scrapes and KV events, see ``cognitora.collector``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from kvstate.keys import BlockKey
from kvstate.store import (
    EndpointSnapshot,
    FleetView,
    HealthMark,
    Heartbeat,
    InFlight,
    MatchCheckpoint,
    PrefixMatch,
)
from kvstate.tiers import SPECULATIVE_WEIGHT, Tier, mask_weights, tier_bit

__all__ = ["MemoryStore"]

GPU_MASK = 1
"""Tier bitmask of a block held in GPU memory only: the common case, weighted without a lookup."""
CPU_MASK = 2


def _bits(bitset: int) -> list[int]:
    """Positions of the set bits."""
    out = []
    while bitset:
        low = bitset & -bitset
        out.append(low.bit_length() - 1)
        bitset ^= low
    return out


@dataclass
class _EndpointBlocks:
    endpoint: str
    bit: int
    held: OrderedDict[BlockKey, int] = field(default_factory=OrderedDict)
    """block key -> tier bitmask, oldest first."""
    speculative: OrderedDict[BlockKey, float] = field(default_factory=OrderedDict)
    """block key -> expiry (clock seconds), oldest first. An ``OrderedDict``, not a ``dict``: expiry and the cap
    pop the oldest entries one by one, and ``next(iter(dict))`` skips every slot already popped from the front
    (a purge of 100k entries was quadratic: seconds of a frozen event loop); the linked list finds it in O(1)."""


class _ModelIndex:
    """The blocks of one model on every endpoint."""

    def __init__(self) -> None:
        self.endpoints: dict[str, _EndpointBlocks] = {}
        self.by_id: dict[int, _EndpointBlocks] = {}
        self._free_ids: list[int] = []
        self.holders: dict[BlockKey, int] = {}
        """block key -> bitset of endpoint ids holding it confirmed, in any tier."""
        self.odd_tier: dict[BlockKey, int] = {}
        """block key -> bitset of endpoint ids whose tier mask is not ``GPU_MASK``."""
        self.spec_holders: dict[BlockKey, int] = {}
        """block key -> bitset of endpoint ids with a speculative entry (perhaps expired: check its expiry)."""

    def endpoint(self, name: str) -> _EndpointBlocks:
        blocks = self.endpoints.get(name)
        if blocks is None:
            eid = self._free_ids.pop() if self._free_ids else len(self.by_id)
            blocks = self.endpoints[name] = self.by_id[eid] = _EndpointBlocks(name, eid)
        return blocks

    def drop_endpoint(self, name: str) -> None:
        """Forget everything ``name`` holds: O(its blocks)."""
        blocks = self.endpoints.pop(name, None)
        if blocks is None:
            return
        clear = ~(1 << blocks.bit)
        for key in blocks.held:
            _and(self.holders, key, clear)
            _and(self.odd_tier, key, clear)
        for key in blocks.speculative:
            _and(self.spec_holders, key, clear)
        del self.by_id[blocks.bit]
        self._free_ids.append(blocks.bit)

    def set_mask(self, blocks: _EndpointBlocks, key: BlockKey, mask: int) -> None:
        """Record ``key`` on ``blocks`` with tier ``mask`` (0: forget it), keeping the bitsets in step."""
        b = 1 << blocks.bit
        if mask:
            blocks.held[key] = mask
            self.holders[key] = self.holders.get(key, 0) | b
            if mask != GPU_MASK:
                self.odd_tier[key] = self.odd_tier.get(key, 0) | b
            elif key in self.odd_tier:
                _and(self.odd_tier, key, ~b)
        else:
            blocks.held.pop(key, None)
            _and(self.holders, key, ~b)
            _and(self.odd_tier, key, ~b)

    def drop_speculative(self, blocks: _EndpointBlocks, key: BlockKey) -> None:
        if blocks.speculative.pop(key, None) is not None:
            _and(self.spec_holders, key, ~(1 << blocks.bit))


def _and(bitsets: dict[BlockKey, int], key: BlockKey, mask: int) -> None:
    value = bitsets.get(key)
    if value is not None:
        value &= mask
        if value:
            bitsets[key] = value
        else:
            del bitsets[key]


@dataclass
class _Request:
    expires: float
    prefill_tokens: int
    decode_tokens: int


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _exclusive(method: Callable[_P, Coroutine[Any, Any, _R]]) -> Callable[_P, Coroutine[Any, Any, _R]]:
    """Run a ``MemoryStore`` method under the store's lock. The body never suspends, so the lock is never held
    across a real await and never blocks the event loop for longer than the method's own work."""

    @functools.wraps(method)
    async def locked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        store: Any = args[0]
        with store._lock:
            return await method(*args, **kwargs)

    return locked


class MemoryStore:
    """In-process ``Store``. Bounded: at most ``max_blocks_per_endpoint`` confirmed and as many speculative blocks
    per (model, endpoint), least recently stored/routed forgotten first."""

    def __init__(
        self,
        tier_weights: dict[Tier, float] | None = None,
        max_blocks_per_endpoint: int = 2_000_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_blocks_per_endpoint <= 0:
            raise ValueError(f"max_blocks_per_endpoint must be positive, got {max_blocks_per_endpoint}")
        self._mask_weight = mask_weights(tier_weights)
        self._cap = max_blocks_per_endpoint
        self._clock = clock
        self._models: dict[str, _ModelIndex] = {}
        self._inflight: dict[str, dict[str, _Request]] = {}
        self._snapshots: dict[str, EndpointSnapshot] = {}
        self._health: dict[str, tuple[float, HealthMark]] = {}
        """endpoint -> (expiry, mark)."""
        self._heartbeats: dict[str, tuple[float, float]] = {}
        """name -> (expiry, at)."""
        self._lock = threading.RLock()

    def _index(self, model: str) -> _ModelIndex:
        index = self._models.get(model)
        if index is None:
            index = self._models[model] = _ModelIndex()
        return index

    # -- KV block index -------------------------------------------------------------------------------------
    @_exclusive
    async def add_blocks(self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier = Tier.GPU) -> None:
        if not keys:
            return
        index = self._index(model)
        blocks = index.endpoint(endpoint)
        held, spec = blocks.held, blocks.speculative
        bit = tier_bit(tier)
        # Stored in reverse so a chain's head is the youngest: like the engines, we forget tails first.
        for key in reversed(keys):
            index.set_mask(blocks, key, held.pop(key, 0) | bit)
            if spec:
                index.drop_speculative(blocks, key)
        for _ in range(len(held) - self._cap):
            oldest = next(iter(held))
            index.set_mask(blocks, oldest, 0)

    @_exclusive
    async def remove_blocks(
        self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier | None = None
    ) -> None:
        index = self._models.get(model)
        blocks = index.endpoints.get(endpoint) if index else None
        if index is None or blocks is None:
            return
        keep = 0 if tier is None else ~tier_bit(tier)
        for key in keys:
            mask = blocks.held.get(key)
            if mask is None:
                continue
            index.set_mask(blocks, key, mask & keep)
            if not mask & keep:
                # the engine told us about this block: our guess that it would be there is superseded
                index.drop_speculative(blocks, key)

    @_exclusive
    async def clear_endpoint(self, endpoint: str, model: str | None = None) -> None:
        for m in [model] if model is not None else list(self._models):
            index = self._models.get(m)
            if index is not None:
                index.drop_endpoint(endpoint)
                if not index.endpoints:
                    del self._models[m]

    @_exclusive
    async def cached_blocks(self, endpoint: str) -> int:
        total = 0
        for index in self._models.values():
            blocks = index.endpoints.get(endpoint)
            if blocks is not None:
                total += len(blocks.held)
        return total

    @_exclusive
    async def match_prefix(
        self, model: str, keys: Sequence[BlockKey], endpoints: Sequence[str] | None = None
    ) -> dict[str, PrefixMatch]:
        index = self._models.get(model)
        if not keys or index is None:
            return {}
        wanted = 0
        if endpoints is None:
            for eid in index.by_id:
                wanted |= 1 << eid
        else:
            for e in endpoints:
                blocks = index.endpoints.get(e)
                if blocks is not None:
                    wanted |= 1 << blocks.bit
        now = self._clock()
        lengths, weights, off_gpu = self._walk(index, keys, wanted, now)
        out: dict[str, PrefixMatch] = {}
        for eid, n in lengths.items():
            blocks = index.by_id[eid]
            cpu, disk = off_gpu.get(eid, (0, 0))
            out[blocks.endpoint] = PrefixMatch(n, weights[eid], cpu, disk)
        return out

    def _walk(
        self, index: _ModelIndex, keys: Sequence[BlockKey], wanted: int, now: float
    ) -> tuple[dict[int, int], dict[int, float], dict[int, tuple[int, int]]]:
        """Per endpoint id: held prefix length, its weight, and its (CPU-only, disk-only) block counts where not
        zero. One lookup and one ``&`` per block."""
        holders_get = index.holders.get
        spec_get = index.spec_holders.get if index.spec_holders else None
        odd_get = index.odd_tier.get if index.odd_tier else None
        by_id = index.by_id
        mask_weight = self._mask_weight
        gpu_weight = mask_weight[GPU_MASK]
        adjust: dict[int, float] = {}  # weight minus ``gpu_weight`` per matched block, summed, where they differ
        off_gpu: dict[int, list[int]] = {}  # blocks held only off the GPU: [CPU best, disk best]
        lengths: dict[int, int] = {}
        alive = wanted
        for i, key in enumerate(keys):
            bits = holders_get(key, 0)
            lost = alive & ~bits
            if lost:
                if spec_get is not None:
                    for eid in _bits(spec_get(key, 0) & lost):
                        if by_id[eid].speculative.get(key, 0.0) > now:
                            lost &= ~(1 << eid)
                            adjust[eid] = adjust.get(eid, 0.0) + SPECULATIVE_WEIGHT - gpu_weight
                if lost:
                    if i:
                        for eid in _bits(lost):
                            lengths[eid] = i
                    alive &= ~lost
                    if not alive:
                        break
            if odd_get is not None:
                odd = odd_get(key, 0) & alive & bits
                if odd:
                    for eid in _bits(odd):
                        mask = by_id[eid].held[key]
                        adjust[eid] = adjust.get(eid, 0.0) + mask_weight[mask] - gpu_weight
                        if not mask & GPU_MASK:
                            row = off_gpu.setdefault(eid, [0, 0])
                            row[0 if mask & CPU_MASK else 1] += 1
        else:
            for eid in _bits(alive):
                lengths[eid] = len(keys)
        weights = {eid: n * gpu_weight + adjust.get(eid, 0.0) for eid, n in lengths.items()}
        return lengths, weights, {eid: (row[0], row[1]) for eid, row in off_gpu.items() if eid in lengths}

    @_exclusive
    async def add_speculative(self, model: str, endpoint: str, keys: Sequence[BlockKey], ttl_s: float) -> None:
        """A request was routed to ``endpoint``: blocks it holds are used again (LRU refresh, as its engine will
        refresh them, once the endpoint holds half its cap), the others are expected soon (speculative entries)."""
        if not keys:
            return
        index = self._index(model)
        blocks = index.endpoint(endpoint)
        now = self._clock()
        held, spec = blocks.held, blocks.speculative
        # Forget expired guesses first (oldest first, up to the first live one), so speculative memory is bounded
        # by what is live; ``match_prefix`` checks expiry anyway. O(1) per entry forgotten (amortized: each entry
        # is forgotten once). Entries are in expiry order as long as one endpoint's TTL does not shrink (the
        # Router's is fixed per endpoint); one that outlives a younger entry only delays that entry's purge.
        while spec:
            oldest, expiry = next(iter(spec.items()))
            if expiry > now:
                break
            index.drop_speculative(blocks, oldest)
        expires = now + ttl_s
        b = 1 << blocks.bit
        spec_holders = index.spec_holders
        # Refreshing only orders what the cap will evict: skip it while less than half the cap is held (as Redis does,
        # where it is the costly part).
        refresh = 2 * len(held) >= self._cap
        move = held.move_to_end
        for key in reversed(keys):  # the head last, so it is the youngest: tails are forgotten first
            if key in held:
                if refresh:
                    move(key)
            else:
                if key in spec:
                    spec.move_to_end(key)
                spec[key] = expires
                spec_holders[key] = spec_holders.get(key, 0) | b
        while len(spec) > self._cap:
            oldest, _ = spec.popitem(last=False)
            _and(spec_holders, oldest, ~b)

    # -- in-flight work -------------------------------------------------------------------------------------
    @_exclusive
    async def inflight_add(
        self, endpoint: str, request_id: str, prefill_tokens: int, decode_tokens: int, ttl_s: float
    ) -> None:
        requests = self._inflight.setdefault(endpoint, {})
        requests[request_id] = _Request(self._clock() + ttl_s, prefill_tokens, decode_tokens)

    @_exclusive
    async def inflight_prefill_done(self, endpoint: str, request_id: str) -> None:
        request = self._inflight.get(endpoint, {}).get(request_id)
        if request is not None:
            request.prefill_tokens = 0

    @_exclusive
    async def inflight_release(self, endpoint: str, request_id: str) -> None:
        requests = self._inflight.get(endpoint)
        if requests is not None:
            requests.pop(request_id, None)
            if not requests:
                del self._inflight[endpoint]

    @_exclusive
    async def inflight(self, endpoints: Sequence[str]) -> dict[str, InFlight]:
        now = self._clock()
        out: dict[str, InFlight] = {}
        for endpoint in endpoints:
            requests = self._inflight.get(endpoint)
            if not requests:
                out[endpoint] = InFlight()
                continue
            for rid in [rid for rid, r in requests.items() if r.expires <= now]:
                del requests[rid]
            out[endpoint] = InFlight(
                requests=len(requests),
                prefill_tokens=sum(r.prefill_tokens for r in requests.values()),
                decode_tokens=sum(r.decode_tokens for r in requests.values()),
            )
        return out

    # -- endpoint snapshots ---------------------------------------------------------------------------------
    @_exclusive
    async def put_snapshot(self, snapshot: EndpointSnapshot) -> None:
        self._snapshots[snapshot.endpoint] = snapshot  # frozen, every field immutable: no copy needed

    @_exclusive
    async def snapshots(self, endpoints: Sequence[str] | None = None) -> dict[str, EndpointSnapshot]:
        wanted = self._snapshots.keys() if endpoints is None else endpoints
        out: dict[str, EndpointSnapshot] = {}
        for endpoint in wanted:
            snap = self._snapshots.get(endpoint)
            if snap is not None:
                out[endpoint] = snap
        return out

    # -- gateway health marks ---------------------------------------------------------------------------------
    @_exclusive
    async def mark_unhealthy(self, endpoint: str, reason: str, ttl_s: float) -> None:
        now = self._clock()
        self._health[endpoint] = (now + ttl_s, HealthMark(since=now, reason=reason))

    @_exclusive
    async def health_marks(self, endpoints: Sequence[str] | None = None) -> dict[str, HealthMark]:
        return self._live_marks(self._health.keys() if endpoints is None else endpoints)

    def _live_marks(self, endpoints: Iterable[str]) -> dict[str, HealthMark]:
        """The live marks of ``endpoints``; expired ones are forgotten on the way."""
        health = self._health
        if not health:
            return {}
        now = self._clock()
        out: dict[str, HealthMark] = {}
        for endpoint in list(endpoints):
            entry = health.get(endpoint)
            if entry is None:
                continue
            if entry[0] <= now:
                del health[endpoint]
            else:
                out[endpoint] = entry[1]
        return out

    # -- heartbeats ------------------------------------------------------------------------------------------
    @_exclusive
    async def put_heartbeat(self, name: str, ttl_s: float) -> None:
        now = self._clock()
        beats = self._heartbeats
        for expired in [n for n, (expiry, _) in beats.items() if expiry <= now]:  # a handful of writers at most
            del beats[expired]
        beats[name] = (now + ttl_s, now)

    @_exclusive
    async def heartbeats(self) -> dict[str, Heartbeat]:
        return self._live_heartbeats()

    def _live_heartbeats(self) -> dict[str, Heartbeat]:
        if not self._heartbeats:
            return {}
        now = self._clock()
        return {n: Heartbeat(at, max(0.0, now - at)) for n, (expiry, at) in self._heartbeats.items() if expiry > now}

    # -- everything placement reads ---------------------------------------------------------------------------
    @_exclusive
    async def fleet_view(
        self,
        model: str,
        keys: Sequence[BlockKey],
        endpoints: Sequence[str],
        *,
        checkpoint: int = 0,
        resume: MatchCheckpoint | None = None,
    ) -> FleetView:
        """The five reads in turn: they cost no round trip here, and since none of them suspends, nothing
        changes in between. Snapshots are the stored (frozen) objects, so a reader can tell an unchanged snapshot by
        identity. No checkpoints: a walk in memory costs less than keeping them (``checkpoint`` and ``resume`` are
        ignored)."""
        if not endpoints:
            return FleetView({}, {}, {})
        matches = await self.match_prefix(model, keys, endpoints) if keys else {}
        stored = self._snapshots
        snapshots = {e: stored[e] for e in endpoints if e in stored}
        return FleetView(
            matches, await self.inflight(endpoints), snapshots, self._live_marks(endpoints), self._live_heartbeats()
        )

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
