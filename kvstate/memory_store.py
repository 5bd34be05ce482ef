"""``MemoryStore``: the ``Store`` in one process (a single gateway, embedded collector, tests, the simulator).

Layout: per (model, endpoint) one ``OrderedDict`` block key -> tier bitmask, kept in LRU order (storing or matching a
block moves it to the young end), so the cap per endpoint forgets the least recently stored/matched blocks in O(1).
A prefix match walks each candidate endpoint's dict along the key chain and stops at its first hole, so its cost is
the sum of the matched lengths, not the index size.

Every method is synchronous underneath (no awaits), hence atomic on the event loop.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from kvstate.keys import BlockKey
from kvstate.store import (
    DEFAULT_TIER_WEIGHTS,
    SPECULATIVE_WEIGHT,
    EndpointSnapshot,
    InFlight,
    PrefixMatch,
    Tier,
)


def tier_bit(tier: Tier) -> int:
    return 1 << int(tier)


def mask_weights(tier_weights: dict[Tier, float] | None) -> list[float]:
    """Weight of each tier bitmask 0..7: the best (largest) weight among the tiers it holds."""
    weights = {**DEFAULT_TIER_WEIGHTS, **(tier_weights or {})}
    out = [0.0] * 8
    for mask in range(1, 8):
        out[mask] = max(weights[t] for t in Tier if mask & tier_bit(t))
    return out


@dataclass
class _EndpointBlocks:
    held: OrderedDict[BlockKey, int] = field(default_factory=OrderedDict)
    """block key -> tier bitmask, oldest first."""
    speculative: dict[BlockKey, float] = field(default_factory=dict)
    """block key -> expiry (clock seconds)."""


@dataclass
class _Request:
    expires: float
    prefill_tokens: int
    decode_tokens: int


class MemoryStore:
    """In-process ``Store``. Bounded: at most ``max_blocks_per_endpoint`` confirmed and as many speculative blocks
    per (model, endpoint)."""

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
        self._blocks: dict[str, dict[str, _EndpointBlocks]] = {}
        """model -> endpoint -> its blocks."""
        self._inflight: dict[str, dict[str, _Request]] = {}
        self._snapshots: dict[str, EndpointSnapshot] = {}

    def _endpoint_blocks(self, model: str, endpoint: str) -> _EndpointBlocks:
        per_model = self._blocks.setdefault(model, {})
        blocks = per_model.get(endpoint)
        if blocks is None:
            blocks = per_model[endpoint] = _EndpointBlocks()
        return blocks

    # -- KV block index -------------------------------------------------------------------------------------
    async def add_blocks(self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier = Tier.GPU) -> None:
        if not keys:
            return
        blocks = self._endpoint_blocks(model, endpoint)
        held, spec = blocks.held, blocks.speculative
        bit = tier_bit(tier)
        # Stored in reverse so a chain's head is the youngest: like the engines, we forget tails first.
        for key in reversed(keys):
            held[key] = held.pop(key, 0) | bit
            if spec:
                spec.pop(key, None)
        overflow = len(held) - self._cap
        for _ in range(overflow):
            held.popitem(last=False)

    async def remove_blocks(
        self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier | None = None
    ) -> None:
        blocks = self._blocks.get(model, {}).get(endpoint)
        if blocks is None:
            return
        held, spec = blocks.held, blocks.speculative
        keep = 0 if tier is None else ~tier_bit(tier)
        for key in keys:
            mask = held.get(key)
            if mask is None:
                continue
            mask &= keep
            if mask:
                held[key] = mask
            else:
                del held[key]
                spec.pop(key, None)

    async def clear_endpoint(self, endpoint: str, model: str | None = None) -> None:
        models = [model] if model is not None else list(self._blocks)
        for m in models:
            per_model = self._blocks.get(m)
            if per_model is not None:
                per_model.pop(endpoint, None)
                if not per_model:
                    del self._blocks[m]

    async def match_prefix(
        self, model: str, keys: Sequence[BlockKey], endpoints: Sequence[str] | None = None
    ) -> dict[str, PrefixMatch]:
        per_model = self._blocks.get(model)
        if not keys or not per_model:
            return {}
        candidates = per_model.items() if endpoints is None else [(e, per_model.get(e)) for e in endpoints]
        now = self._clock()
        weight = self._mask_weight
        out: dict[str, PrefixMatch] = {}
        for endpoint, blocks in candidates:
            if blocks is None:
                continue
            held, spec = blocks.held, blocks.speculative
            n = 0
            weighted = 0.0
            if spec:
                for key in keys:
                    mask = held.get(key)
                    if mask is not None:
                        weighted += weight[mask]
                    elif spec.get(key, 0.0) > now:
                        weighted += SPECULATIVE_WEIGHT
                    else:
                        break
                    n += 1
            else:
                for key in keys:
                    mask = held.get(key)
                    if mask is None:
                        break
                    weighted += weight[mask]
                    n += 1
            if n:
                out[endpoint] = PrefixMatch(n, weighted)
                self._touch(held, keys, n)
        return out

    @staticmethod
    def _touch(held: OrderedDict[BlockKey, int], keys: Sequence[BlockKey], n: int) -> None:
        """A matched prefix is about to be reused: make it the youngest, head last (tails go first)."""
        move = held.move_to_end
        for i in range(n - 1, -1, -1):
            key = keys[i]
            if key in held:
                move(key)

    async def add_speculative(self, model: str, endpoint: str, keys: Sequence[BlockKey], ttl_s: float) -> None:
        if not keys:
            return
        blocks = self._endpoint_blocks(model, endpoint)
        now = self._clock()
        spec = blocks.speculative
        # Forget expired guesses first, so speculative memory is bounded by what is live.
        expired = [k for k, exp in spec.items() if exp <= now]
        for k in expired:
            del spec[k]
        expires = now + ttl_s
        for key in keys:
            if key not in blocks.held:
                spec.pop(key, None)
                spec[key] = expires
        while len(spec) > self._cap:
            del spec[next(iter(spec))]

    # -- in-flight work -------------------------------------------------------------------------------------
    async def inflight_add(
        self, endpoint: str, request_id: str, prefill_tokens: int, decode_tokens: int, ttl_s: float
    ) -> None:
        requests = self._inflight.setdefault(endpoint, {})
        requests[request_id] = _Request(self._clock() + ttl_s, prefill_tokens, decode_tokens)

    async def inflight_prefill_done(self, endpoint: str, request_id: str) -> None:
        request = self._inflight.get(endpoint, {}).get(request_id)
        if request is not None:
            request.prefill_tokens = 0

    async def inflight_release(self, endpoint: str, request_id: str) -> None:
        requests = self._inflight.get(endpoint)
        if requests is not None:
            requests.pop(request_id, None)
            if not requests:
                del self._inflight[endpoint]

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
    async def put_snapshot(self, snapshot: EndpointSnapshot) -> None:
        self._snapshots[snapshot.endpoint] = replace(snapshot, extra=dict(snapshot.extra))

    async def snapshots(self, endpoints: Sequence[str] | None = None) -> dict[str, EndpointSnapshot]:
        wanted = self._snapshots.keys() if endpoints is None else endpoints
        out: dict[str, EndpointSnapshot] = {}
        for endpoint in wanted:
            snap = self._snapshots.get(endpoint)
            if snap is not None:
                out[endpoint] = replace(snap, extra=dict(snap.extra))
        return out

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
