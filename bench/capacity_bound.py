"""The most prompt tokens any router could serve from cache when the fleet's KV cache is finite.

The reuse bound of ``bench.workloads.annotate_reuse`` counts every prefix token an earlier request sent, as if the
engines never evicted. On a trace whose reuses lie farther apart than the fleet holds (Mooncake: median 3.8M tokens
of traffic against 2.4M of KV, ``bench/reuse_distance.py``), no placement can come near it. This module computes the
bound that a finite fleet does allow, with the same blocks the engines cache:

- **capacity bound**: block hits of Belady's MIN policy (evict the block whose next use is farthest) on one cache of
  the whole fleet's KV tokens. It is an upper bound for any router: whatever the engines hold at a moment, their
  union is at most the fleet's KV, loaded on demand as one cache is, and MIN gets the most hits of any such cache.
  It counts every held block of a prompt, not only its leading run, and leaves the KV of running requests out, so
  it is generous.
- **pooled LRU**: the leading-run hits of one least-recently-used cache of that size, touched tail first as vLLM
  frees a finished request's blocks: what the fleet would reach if placement could make eight engines act as one
  cache, without knowing the future. A yardstick, not a bound.

Both count whole blocks of ``block_tokens`` content tokens (the chat template's few tokens are not modelled), so
each is exact to within a block per request.

    .venv/bin/python -m bench.capacity_bound -- <the bench.run_all arguments of a run>

prints, per stage, the reuse bound, the capacity bound and the pooled LRU figure for the schedule and fleet that
``bench.run_all`` would build from those arguments.
"""

from __future__ import annotations

import argparse
import heapq
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from bench import workloads as wl
from bench.run_args import BLOCK_SIZE, build_schedule, fleet_kv_tokens, parse_args
from bench.workloads import BenchRequest

__all__ = ["CapacityBound", "capacity_bounds"]

_NEVER = sys.maxsize


@dataclass(frozen=True)
class CapacityBound:
    """Per stage, the share of the stage's prompt tokens each cache model serves from cache."""

    capacity: dict[str, float]
    """Belady's MIN over one cache of the fleet's KV: an upper bound for any placement."""
    pooled_lru: dict[str, float]
    """One LRU cache of the fleet's KV, leading-run hits: a yardstick."""
    kv_tokens: int
    block_tokens: int


def request_blocks(req: BenchRequest, block_tokens: int) -> list[int]:
    """Ids of the prompt's whole blocks: two requests share a block id iff their content agrees through its end.

    The identity of a token position follows ``annotate_reuse``'s trie: the segments before it as (name, tokens),
    then the name of the segment it is in and its offset there (a shorter use of a name is a prefix of a longer).
    """
    blocks: list[int] = []
    prefix = 0
    start = 0
    next_end = block_tokens  # content tokens through the end of the next block
    for message in req.messages:
        for seg in message.segments:
            name = f"{message.role}/{seg.name}"
            stop = start + seg.tokens
            while next_end <= stop:
                blocks.append(hash((prefix, name, next_end - start)))
                next_end += block_tokens
            prefix = hash((prefix, name, seg.tokens))
            start = stop
    return blocks


def capacity_bounds(requests: Sequence[BenchRequest], kv_tokens: int, block_tokens: int = 16) -> CapacityBound:
    """Both cache models over ``requests`` in arrival order (every request, measured or not, warms the cache)."""
    if kv_tokens <= 0 or block_tokens <= 0:
        raise ValueError(f"kv_tokens and block_tokens must be positive, got {kv_tokens} and {block_tokens}")
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.index))
    chains = [request_blocks(r, block_tokens) for r in ordered]
    slots = kv_tokens // block_tokens
    min_hits = _belady_hits(chains, slots)
    lru_hits = lru_leading_hits(chains, slots)
    content: dict[str, int] = {}
    held_min: dict[str, int] = {}
    held_lru: dict[str, int] = {}
    for req, a, b in zip(ordered, min_hits, lru_hits, strict=True):
        content[req.stage] = content.get(req.stage, 0) + req.prompt_tokens
        held_min[req.stage] = held_min.get(req.stage, 0) + a * block_tokens
        held_lru[req.stage] = held_lru.get(req.stage, 0) + b * block_tokens
    return CapacityBound(
        capacity={s: held_min[s] / n if n else 0.0 for s, n in content.items()},
        pooled_lru={s: held_lru[s] / n if n else 0.0 for s, n in content.items()},
        kv_tokens=kv_tokens,
        block_tokens=block_tokens,
    )


def _belady_hits(chains: Sequence[Sequence[int]], slots: int) -> list[int]:
    """Per request, the blocks MIN finds cached. A block missed is loaded (demand paging, as an engine prefills
    it); when over capacity, the cached block used again farthest in the future (or never) leaves."""
    accesses = [b for chain in chains for b in chain]
    next_use = [_NEVER] * len(accesses)
    seen: dict[int, int] = {}
    for i in range(len(accesses) - 1, -1, -1):
        next_use[i] = seen.get(accesses[i], _NEVER)
        seen[accesses[i]] = i
    cached: dict[int, int] = {}  # block -> its next use (the heap holds stale entries too; they are skipped)
    heap: list[tuple[int, int]] = []  # (-next use, block)
    hits: list[int] = []
    i = 0
    for chain in chains:
        n = 0
        for block in chain:
            if block in cached:
                n += 1
            cached[block] = next_use[i]
            heapq.heappush(heap, (-next_use[i], block))
            i += 1
            while len(cached) > slots:
                far, victim = heapq.heappop(heap)
                if cached.get(victim) == -far:
                    del cached[victim]
        hits.append(n)
    return hits


def lru_leading_hits(chains: Sequence[Sequence[int]], slots: int) -> list[int]:
    """Per request, the leading run of its blocks one LRU cache holds; then its blocks are touched tail first, so a
    prompt's head is the most recent and its tail is evicted first (vLLM frees a request's blocks in reverse)."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits: list[int] = []
    for chain in chains:
        n = 0
        for block in chain:
            if block not in cache:
                break
            n += 1
        hits.append(n)
        for block in reversed(chain):
            cache[block] = None
            cache.move_to_end(block)
        while len(cache) > slots:
            cache.popitem(last=False)
    return hits


def fleet_capacity_bounds(schedule: wl.Schedule, args: argparse.Namespace) -> CapacityBound:
    """Both bounds for a run's schedule on the fleet its ``bench.run_all`` arguments describe (``bench.run_args``)."""
    return capacity_bounds(schedule.requests, fleet_kv_tokens(args), BLOCK_SIZE)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    schedule = build_schedule(args)
    bound = fleet_capacity_bounds(schedule, args)
    print(f"{schedule.description}: {len(schedule.requests)} requests; fleet KV {bound.kv_tokens:,} tokens")
    print("| stage | reuse bound | capacity bound (MIN) | pooled LRU |")
    print("|---|---|---|---|")
    for stage in schedule.stage_labels():
        print(
            f"| {stage} | {schedule.reuse_bound(stage):.3f} | {bound.capacity[stage]:.3f} | "
            f"{bound.pooled_lru[stage]:.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
