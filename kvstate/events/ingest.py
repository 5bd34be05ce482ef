"""Apply decoded KV events to the ``Store``, in OUR key space.

Engine hashes are never stored. A ``BlockStored`` carries the token ids of its blocks, so we recompute our keys
(``kvstate.keys.chain_block_keys``) chained from the parent's key, or from ``root_key(model, lora_name)`` when the
blocks start a sequence, exactly as a request's keys are computed from its prompt. Per (endpoint, dp rank) we keep
a map engine hash -> (our key, tiers held) so later events can name their parent and removals can be translated.

Rules (each breach is counted in ``IngestStats``, never guessed around):

- parent hash not in the map (we missed its BlockStored): the event is skipped (``unknown_parent``); so are its
  descendants, whose parents we then do not know either.
- ``block_size`` differs from the configured one: skipped (``block_size_mismatch``), logged once per endpoint.
- token count is not ``len(block_hashes) * block_size``: skipped (``inconsistent``).
- a token-less ``BlockStored`` (a connector copying known blocks to another tier) adds that tier to the blocks
  we know; unknown ones are counted in ``unknown_blocks``.
- ``AllBlocksCleared``: the endpoint is purged (store and map), then the rest of the batch applies.

The map is bounded per endpoint: past ``max_blocks_per_endpoint`` the oldest entry is dropped AND its block
removed from the store, so the store never holds a block whose removal we could no longer translate.

Distinct engine hashes may map to one key (same tokens, different ``extra_keys`` such as a cache salt): a key
leaves a tier only when no engine hash holding it there remains.

Writes are batched. ``stage`` applies a batch to the maps and accumulates its store writes; ``flush`` writes what
an endpoint has staged: one ``clear_endpoint`` (if a staged batch cleared), then one ``add_blocks`` and one
``remove_blocks`` per tier, with the net effect of the staged batches (the last event on a (key, tier) wins).
``apply`` is both. A subscriber stages the batches already queued on its socket and flushes once, so a busy
engine's stream costs one store round trip per burst, not per batch.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from kvstate.events.model import AllBlocksCleared, BlockRemoved, BlockStored, EngineHash, EventBatch
from kvstate.keys import BlockKey, chain_block_keys, root_key
from kvstate.store import Store, Tier

__all__ = ["DEFAULT_MAX_BLOCKS_PER_ENDPOINT", "ApplyResult", "EventIngestor", "IngestStats"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BLOCKS_PER_ENDPOINT = 2_000_000


@dataclass
class IngestStats:
    """Counters over the ingestor's life (all endpoints)."""

    batches: int = 0
    blocks_stored: int = 0
    """Blocks recorded (per tier announcement)."""
    blocks_removed: int = 0
    """Block removals translated to our keys."""
    unknown_parent: int = 0
    """BlockStored events skipped because their parent hash was never seen (or was purged)."""
    unknown_blocks: int = 0
    """Hashes in a BlockRemoved or token-less BlockStored that we never learned."""
    block_size_mismatch: int = 0
    """BlockStored events skipped because the engine's block size is not the configured one."""
    inconsistent: int = 0
    """BlockStored events whose token count does not match their hash count."""
    clears: int = 0
    """AllBlocksCleared events applied."""
    map_overflow: int = 0
    """Engine-hash map entries dropped (and their blocks removed) because an endpoint exceeded the bound."""


@dataclass(frozen=True)
class ApplyResult:
    """What one batch did."""

    cleared: bool
    """The batch held AllBlocksCleared: the endpoint was purged."""
    stored: int
    removed: int
    skipped: int
    """BlockStored/BlockRemoved events (or hashes of them) that could not be applied; see ``IngestStats``."""


@dataclass
class _EndpointMap:
    """engine hash -> [our key, tier bitmask], oldest first; plus holders per (key, tier)."""

    blocks: OrderedDict[EngineHash, list[int]] = field(default_factory=OrderedDict)
    refs: dict[int, int] = field(default_factory=dict)
    """``key * 4 + tier`` -> how many engine hashes hold ``key`` in ``tier``."""


class _PendingWrites:
    """The net store effect of the batches staged since the last flush."""

    def __init__(self) -> None:
        self.clear = False
        self.batches = 0
        self.adds: dict[Tier, dict[BlockKey, None]] = {}
        self.removes: dict[Tier, dict[BlockKey, None]] = {}

    def add(self, key: BlockKey, tier: Tier) -> None:
        removes = self.removes.get(tier)
        if removes:
            removes.pop(key, None)
        self.adds.setdefault(tier, {})[key] = None

    def remove(self, key: BlockKey, tier: Tier) -> None:
        adds = self.adds.get(tier)
        if adds:
            adds.pop(key, None)
        self.removes.setdefault(tier, {})[key] = None

    def reset(self) -> None:
        """An AllBlocksCleared: whatever was staged before it is gone too."""
        self.clear = True
        self.adds.clear()
        self.removes.clear()


class EventIngestor:
    """Turns one model's engine events into store writes. One instance serves every endpoint of that model; each
    endpoint's batches must be applied in order (one subscriber per endpoint does that)."""

    def __init__(
        self,
        store: Store,
        model: str,
        block_size: int,
        max_blocks_per_endpoint: int = DEFAULT_MAX_BLOCKS_PER_ENDPOINT,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if max_blocks_per_endpoint <= 0:
            raise ValueError(f"max_blocks_per_endpoint must be positive, got {max_blocks_per_endpoint}")
        self.store = store
        self.model = model
        self.block_size = block_size
        self.max_blocks_per_endpoint = max_blocks_per_endpoint
        self.stats = IngestStats()
        self._maps: dict[tuple[str, int | None], _EndpointMap] = {}
        self._roots: dict[str | None, BlockKey] = {}
        self._size_warned: set[str] = set()
        self._pending: dict[str, _PendingWrites] = {}

    def tracked_blocks(self, endpoint: str) -> int:
        """Engine hashes currently mapped for ``endpoint`` (all dp ranks)."""
        return sum(len(m.blocks) for (ep, _), m in self._maps.items() if ep == endpoint)

    def tracked_total(self) -> int:
        """Engine hashes currently mapped, every endpoint: what this ingestor holds in memory. An engine that evicts
        (``BlockRemoved``) keeps it at its cache's block count; one that never fills its cache grows it until it
        does (docs/operations.md, "Soak")."""
        return sum(len(m.blocks) for m in self._maps.values())

    def staged(self, endpoint: str) -> int:
        """Batches staged for ``endpoint`` and not flushed yet."""
        pending = self._pending.get(endpoint)
        return pending.batches if pending is not None else 0

    async def purge(self, endpoint: str) -> None:
        """Forget everything about ``endpoint``: its store entries (every model), its engine-hash maps, and any
        staged writes."""
        self._drop_maps(endpoint)
        self._pending.pop(endpoint, None)
        await self.store.clear_endpoint(endpoint)

    async def apply(self, endpoint: str, batch: EventBatch) -> ApplyResult:
        """``stage`` then ``flush``: apply one batch from ``endpoint`` to the store now."""
        result = self.stage(endpoint, batch)
        await self.flush(endpoint)
        return result

    def stage(self, endpoint: str, batch: EventBatch) -> ApplyResult:
        """Apply one batch to the engine-hash maps and stage its store writes (``flush`` writes them)."""
        pending = self._pending.get(endpoint)
        if pending is None:
            pending = self._pending[endpoint] = _PendingWrites()
        stored = removed = skipped = 0
        cleared = False
        emap = self._map(endpoint, batch.dp_rank)
        for event in batch.events:
            if isinstance(event, BlockStored):
                n = self._stored(endpoint, emap, event, pending)
                if n < 0:
                    skipped += 1
                else:
                    stored += n
            elif isinstance(event, BlockRemoved):
                n, unknown = self._removed(emap, event, pending)
                removed += n
                skipped += unknown
            elif isinstance(event, AllBlocksCleared):
                cleared = True
                self.stats.clears += 1
                self._drop_maps(endpoint)
                emap = self._map(endpoint, batch.dp_rank)
                pending.reset()
        pending.batches += 1
        self.stats.batches += 1
        self.stats.blocks_stored += stored
        self.stats.blocks_removed += removed
        return ApplyResult(cleared=cleared, stored=stored, removed=removed, skipped=skipped)

    async def flush(self, endpoint: str) -> int:
        """Write what ``endpoint`` has staged; returns how many batches that was.

        Raises ``StoreUnavailable`` (or the driver's error) if the store cannot be written: the staged writes are
        then lost and the maps are ahead of the store, so the caller must ``purge`` before trusting this endpoint
        again.
        """
        pending = self._pending.pop(endpoint, None)
        if pending is None:
            return 0
        if pending.clear:
            # The store's entries for this endpoint under every model: a cleared engine holds nothing anywhere.
            await self.store.clear_endpoint(endpoint)
        for tier, keys in pending.adds.items():
            if keys:
                await self.store.add_blocks(self.model, endpoint, list(keys), tier)
        for tier, keys in pending.removes.items():
            if keys:
                await self.store.remove_blocks(self.model, endpoint, list(keys), tier)
        return pending.batches

    # -- events --------------------------------------------------------------------------------------------

    def _stored(self, endpoint: str, emap: _EndpointMap, event: BlockStored, pending: _PendingWrites) -> int:
        """Blocks recorded, or -1 when the event had to be skipped."""
        tier = event.tier
        hashes = event.block_hashes
        if not event.token_ids:
            return self._tier_copy(emap, hashes, tier, pending)
        if event.block_size != self.block_size:
            self.stats.block_size_mismatch += 1
            if endpoint not in self._size_warned:
                self._size_warned.add(endpoint)
                log.error(
                    "endpoint %s publishes KV events with block_size=%d but model %r is configured with "
                    "block_size=%d: its BlockStored events are skipped until the configured block size matches",
                    endpoint,
                    event.block_size,
                    self.model,
                    self.block_size,
                )
            return -1
        if len(event.token_ids) != len(hashes) * self.block_size:
            self.stats.inconsistent += 1
            return -1
        if event.parent_block_hash is None:
            parent = self._root(event.lora_name)
        else:
            parent_entry = emap.blocks.get(event.parent_block_hash)
            if parent_entry is None:
                self.stats.unknown_parent += 1
                return -1
            parent = parent_entry[0]
        keys = chain_block_keys(parent, event.token_ids, self.block_size)
        # The hot path, inlined: a hash never seen on this endpoint (every block of a busy engine's stream).
        blocks, refs, t = emap.blocks, emap.refs, int(tier)
        bit = 1 << t
        adds = pending.adds.setdefault(tier, {})
        removes = pending.removes.get(tier)
        for engine_hash, key in zip(hashes, keys, strict=True):
            if engine_hash in blocks:
                self._hold_again(emap, engine_hash, key, tier, pending)
                removes = pending.removes.get(tier)  # the slow path may have started one
                continue
            blocks[engine_hash] = [key, bit]
            ref = key * 4 + t
            refs[ref] = refs.get(ref, 0) + 1
            if removes:
                removes.pop(key, None)
            adds[key] = None
        self._trim(emap, pending)
        return len(keys)

    def _tier_copy(
        self, emap: _EndpointMap, hashes: tuple[EngineHash, ...], tier: Tier, pending: _PendingWrites
    ) -> int:
        n = 0
        for engine_hash in hashes:
            entry = emap.blocks.get(engine_hash)
            if entry is None:
                self.stats.unknown_blocks += 1
                continue
            self._hold_again(emap, engine_hash, entry[0], tier, pending)
            n += 1
        return n

    def _hold_again(
        self, emap: _EndpointMap, engine_hash: EngineHash, key: BlockKey, tier: Tier, pending: _PendingWrites
    ) -> None:
        """An engine hash already in the map is announced (again, or in another tier)."""
        bit = 1 << tier
        entry = emap.blocks[engine_hash]
        emap.blocks.move_to_end(engine_hash)
        if entry[0] != key:  # the engine reused a hash for other tokens: the old mapping is void
            self._release_all(emap, entry, pending)
            entry[0], entry[1] = key, bit
        elif entry[1] & bit:
            pending.add(key, tier)  # already counted; re-announcing still refreshes the store's recency
            return
        else:
            entry[1] |= bit
        ref = key * 4 + tier
        emap.refs[ref] = emap.refs.get(ref, 0) + 1
        pending.add(key, tier)

    def _trim(self, emap: _EndpointMap, pending: _PendingWrites) -> None:
        blocks = emap.blocks
        while len(blocks) > self.max_blocks_per_endpoint:
            _, oldest = blocks.popitem(last=False)
            self.stats.map_overflow += 1
            self._release_all(emap, oldest, pending)

    def _removed(self, emap: _EndpointMap, event: BlockRemoved, pending: _PendingWrites) -> tuple[int, int]:
        tier = event.tier
        bit = 1 << tier
        removed = unknown = 0
        for engine_hash in event.block_hashes:
            entry = emap.blocks.get(engine_hash)
            if entry is None or not entry[1] & bit:
                unknown += 1
                continue
            entry[1] &= ~bit
            self._unref(emap, entry[0], tier, pending)
            if not entry[1]:
                del emap.blocks[engine_hash]
            removed += 1
        self.stats.unknown_blocks += unknown
        return removed, unknown

    def _release_all(self, emap: _EndpointMap, entry: list[int], pending: _PendingWrites) -> None:
        key, mask = entry
        for tier in Tier:
            if mask & (1 << tier):
                self._unref(emap, key, tier, pending)

    @staticmethod
    def _unref(emap: _EndpointMap, key: BlockKey, tier: Tier, pending: _PendingWrites) -> None:
        ref = key * 4 + tier
        left = emap.refs.get(ref, 0) - 1
        if left > 0:
            emap.refs[ref] = left
        else:
            emap.refs.pop(ref, None)
            pending.remove(key, tier)

    # -- state ---------------------------------------------------------------------------------------------

    def _root(self, lora_name: str | None) -> BlockKey:
        root = self._roots.get(lora_name)
        if root is None:
            root = self._roots[lora_name] = root_key(self.model, lora_name)
        return root

    def _map(self, endpoint: str, dp_rank: int | None) -> _EndpointMap:
        emap = self._maps.get((endpoint, dp_rank))
        if emap is None:
            emap = self._maps[(endpoint, dp_rank)] = _EndpointMap()
        return emap

    def _drop_maps(self, endpoint: str) -> None:
        for map_key in [k for k in self._maps if k[0] == endpoint]:
            del self._maps[map_key]
