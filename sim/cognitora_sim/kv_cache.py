"""A paged prefix cache like vLLM v1's block pool: fixed capacity in blocks, ref counts, LRU eviction.

- A request holds one block per ``block_size`` tokens it has computed or is computing. A block whose tokens are all
  computed is *full*: it gets its chained hash and joins the cache (``BlockStored``), or, when another request
  already cached the same hash, the request shares that block and its own copy goes back to the free pool.
- Blocks nobody references stay cached and evictable, least recently freed first; a request frees its blocks tail
  first, so the end of a sequence is evicted before its shared prefix (as vLLM's free queue does).
- Allocation takes never-used free blocks first, then evicts (``BlockRemoved``).
- ``reset()`` drops every hash (``AllBlocksCleared``); blocks still in use stay allocated, unhashed.
- A CPU offload tier (``cpu_blocks`` > 0, like vLLM's CPU OffloadingConnector): a block evicted from the GPU is
  kept in host memory (``BlockStored`` with ``medium="CPU"`` and no token ids, then ``BlockRemoved`` ``GPU``), in
  LRU order, evicted from there in turn (``BlockRemoved`` ``CPU``). ``cpu_prefix`` says how many blocks after a GPU
  hit a request can load back instead of recomputing.

The cache records events in ``pending``; the engine drains them once per step and publishes them as one batch.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
"""vLLM's ``medium`` of its prefix cache and of its CPU offloading tier."""


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    medium: str = MEDIUM_GPU
    """``CPU``: a copy in host memory, announced without token ids (engines.md 1.3, "KV offloading")."""


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[int]
    medium: str = MEDIUM_GPU


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


CacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass
class BlockTable:
    """The blocks one request holds: ``held[i]`` is the cached hash it references, or None for an unhashed block."""

    held: list[int | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.held)


class OutOfBlocks(Exception):
    pass


class PrefixCache:
    def __init__(self, num_blocks: int, block_size: int, cpu_blocks: int = 0) -> None:
        if num_blocks <= 0:
            raise ValueError(f"KV capacity must be at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.refs: dict[int, int] = {}
        """Cached hash -> number of requests referencing it."""
        self.evictable: OrderedDict[int, None] = OrderedDict()
        """Cached hashes nobody references, least recently freed first."""
        self.unhashed_in_use = 0
        self.pending: list[CacheEvent] = []
        self.cpu_blocks = cpu_blocks
        self.cpu: OrderedDict[int, None] = OrderedDict()
        """Hashes held in host memory, least recently offloaded or loaded first."""

    # ---- capacity -------------------------------------------------------------------------------------------
    @property
    def cached_blocks(self) -> int:
        return len(self.refs)

    @property
    def free_blocks(self) -> int:
        """Blocks an allocation can take now: never-used ones plus evictable cached ones."""
        return self.num_blocks - len(self.refs) - self.unhashed_in_use + len(self.evictable)

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks

    def usage(self) -> float:
        return self.used_blocks / self.num_blocks

    # ---- lookups --------------------------------------------------------------------------------------------
    def longest_prefix(self, hashes: list[int]) -> int:
        """How many leading blocks of a sequence are cached."""
        n = 0
        for h in hashes:
            if h not in self.refs:
                break
            n += 1
        return n

    def cpu_prefix(self, hashes: list[int]) -> int:
        """How many leading blocks of ``hashes`` host memory holds (refreshing them: a load is a use)."""
        n = 0
        for h in hashes:
            if h not in self.cpu:
                break
            self.cpu.move_to_end(h)
            n += 1
        return n

    def touch(self, table: BlockTable, hashes: list[int]) -> None:
        """Reference cached blocks (a prefix hit) for ``table``."""
        for h in hashes:
            if self.refs[h] == 0:
                del self.evictable[h]
            self.refs[h] += 1
            table.held.append(h)

    # ---- allocation -----------------------------------------------------------------------------------------
    def allocate(self, table: BlockTable, count: int) -> None:
        """Give ``table`` ``count`` new (unhashed) blocks, evicting LRU cached blocks if needed."""
        if count <= 0:
            return
        if count > self.free_blocks:
            raise OutOfBlocks(f"need {count} blocks, {self.free_blocks} free")
        never_used = self.num_blocks - len(self.refs) - self.unhashed_in_use
        to_evict = max(0, count - never_used)
        if to_evict:
            evicted = []
            for _ in range(to_evict):
                h, _ = self.evictable.popitem(last=False)
                del self.refs[h]
                evicted.append(h)
            self._offload(evicted)
            self.pending.append(BlockRemoved(evicted))
        self.unhashed_in_use += count
        table.held.extend([None] * count)

    def commit_full(
        self, table: BlockTable, first: int, hashes: list[int], token_ids: list[int], parent: int | None
    ) -> None:
        """Blocks ``first .. first+len(hashes)-1`` of ``table`` just became full: cache them, announce new ones.

        ``token_ids`` are the tokens of exactly those blocks; ``parent`` is the hash of block ``first - 1``.
        """
        bs = self.block_size
        run: list[int] = []
        run_tokens: list[int] = []
        run_parent = parent
        for j, h in enumerate(hashes):
            i = first + j
            if table.held[i] is not None:  # already referenced (a hit); nothing to do
                self._flush(run, run_tokens, run_parent)
                run, run_tokens, run_parent = [], [], h
                continue
            self.unhashed_in_use -= 1
            count = self.refs.get(h)
            if count is None:
                self.refs[h] = 1
                run.append(h)
                run_tokens.extend(token_ids[j * bs : (j + 1) * bs])
            else:
                if count == 0:
                    del self.evictable[h]
                self.refs[h] = count + 1
                self._flush(run, run_tokens, run_parent)
                run, run_tokens, run_parent = [], [], h
            table.held[i] = h
        self._flush(run, run_tokens, run_parent)

    def _offload(self, evicted: list[int]) -> None:
        """Copy blocks leaving the GPU to host memory first (the connector stores them before the GPU frees them)."""
        if self.cpu_blocks <= 0:
            return
        new = [h for h in evicted if h not in self.cpu]
        for h in evicted:
            self.cpu[h] = None
            self.cpu.move_to_end(h)
        if new:
            self.pending.append(BlockStored(new, None, [], self.block_size, MEDIUM_CPU))
        dropped = []
        while len(self.cpu) > self.cpu_blocks:
            h, _ = self.cpu.popitem(last=False)
            dropped.append(h)
        if dropped:
            self.pending.append(BlockRemoved(dropped, MEDIUM_CPU))

    def _flush(self, run: list[int], tokens: list[int], parent: int | None) -> None:
        if run:
            self.pending.append(BlockStored(list(run), parent, list(tokens), self.block_size))

    def free(self, table: BlockTable) -> None:
        """Release every block of ``table``, tail first."""
        for h in reversed(table.held):
            if h is None:
                self.unhashed_in_use -= 1
                continue
            count = self.refs.get(h)
            if count is None:  # dropped by reset() while we held it
                continue
            if count <= 1:
                self.refs[h] = 0
                self.evictable[h] = None
            else:
                self.refs[h] = count - 1
        table.held.clear()

    def reset(self, tables: list[BlockTable], announce: bool = True) -> None:
        """Forget every hash (vLLM ``reset_prefix_cache``); blocks in use stay allocated but unhashed."""
        self.refs.clear()
        self.evictable.clear()
        self.cpu.clear()
        in_use = 0
        for t in tables:
            t.held = [None] * len(t.held)
            in_use += len(t.held)
        self.unhashed_in_use = in_use
        if announce:
            self.pending.append(AllBlocksCleared())

    def drain(self) -> list[CacheEvent]:
        out, self.pending = self.pending, []
        return out
