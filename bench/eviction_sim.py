"""Would sparing an engine's hot LRU tail raise the hit rate? An offline replay of a Mooncake trace on LRU caches.

    .venv/bin/python -m bench.eviction_sim --trace TRACE.jsonl [--max-requests 1000] [--engines 8]

The issue asks that a placement which would evict a prefix hotter than the one it brings be charged for it. Before
the store tracks hotness for that (a write per dispatch, and more reads on the hot path), this measures what the
charge could buy at best. No timing, no engines: ``--engines`` LRU caches of ``--kv-tokens`` each (the trace's
512-token blocks, a finished request's blocks touched tail first as vLLM frees them). Each request goes to the
longest cached prefix among the engines whose token load over the last ``--window-s`` seconds of arrivals stays
within ``(1 + slack)`` of the mean (the stand-in for queueing cost); among equal matches:

- ``least-loaded``: the least loaded (what a cost model without an eviction term does);
- ``coldest-tail``: the one whose blocks to be evicted were used longest ago (a recency charge: what the store's
  last-hit times would give);
- ``reused-tail``: the one whose blocks to be evicted were hit least often before (a frequency charge);
- ``oracle``: the one whose blocks to be evicted recur least within the next ``--horizon`` requests (knows the
  future: the ceiling of any eviction charge under this placement).

Prints the hit rate (hit tokens / prompt tokens) per policy and slack.
"""

from __future__ import annotations

import argparse
import bisect
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from bench.workloads import MOONCAKE_BLOCK_TOKENS as BLOCK_TOKENS
from bench.workloads import read_mooncake

POLICIES = ("least-loaded", "coldest-tail", "reused-tail", "oracle")


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    blocks: tuple[int, ...]
    tokens: int


def read_trace(path: Path, max_requests: int) -> list[TraceRequest]:
    """The trace's first ``max_requests`` requests (``bench.workloads.read_mooncake`` checks each line)."""
    return [
        TraceRequest(rec.timestamp_ms / 1000, rec.hash_ids, rec.input_length)
        for rec in islice(read_mooncake(path), max_requests)
    ]


class _Engine:
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.cache: OrderedDict[int, None] = OrderedDict()  # LRU first
        self.last_use: dict[int, float] = {}

    def match(self, blocks: Sequence[int]) -> int:
        n = 0
        for b in blocks:
            if b not in self.cache:
                break
            n += 1
        return n

    def victims(self, new: int) -> list[int]:
        """The blocks ``new`` more would push out, LRU first."""
        over = len(self.cache) + new - self.slots
        out: list[int] = []
        for b in self.cache:
            if len(out) >= over:
                break
            out.append(b)
        return out

    def store(self, blocks: Sequence[int], now: float) -> None:
        for b in reversed(blocks):  # the head touched last: most recent, evicted last
            self.cache[b] = None
            self.cache.move_to_end(b)
            self.last_use[b] = now
        while len(self.cache) > self.slots:
            b, _ = self.cache.popitem(last=False)
            self.last_use.pop(b, None)


def replay(
    reqs: Sequence[TraceRequest], policy: str, engines: int, kv_tokens: int, slack: float, window_s: float, horizon: int
) -> float:
    """The hit rate of ``policy`` over ``reqs``."""
    uses: dict[int, list[int]] = {}
    for i, r in enumerate(reqs):
        for b in r.blocks:
            uses.setdefault(b, []).append(i)
    fleet = [_Engine(kv_tokens // BLOCK_TOKENS) for _ in range(engines)]
    recent: deque[tuple[float, int, int]] = deque()  # (arrival, engine, new tokens)
    load = [0] * engines
    hit_count: dict[int, int] = {}
    hits = total = 0
    for i, r in enumerate(reqs):
        while recent and recent[0][0] < r.arrival_s - window_s:
            _, e, tokens = recent.popleft()
            load[e] -= tokens
        matched = [eng.match(r.blocks) for eng in fleet]
        ceiling = (1 + slack) * (sum(load) + r.tokens) / engines
        allowed = [e for e in range(engines) if load[e] + (len(r.blocks) - matched[e]) * BLOCK_TOKENS <= ceiling]
        allowed = allowed or list(range(engines))
        best = max(matched[e] for e in allowed)
        tied = [e for e in allowed if matched[e] == best]
        new = len(r.blocks) - best
        charges = {
            e: _charge(policy, fleet[e], fleet[e].victims(new), r.arrival_s, i, hit_count, uses, horizon) for e in tied
        }
        chosen = min(tied, key=lambda e: (charges[e], load[e]))
        hits += matched[chosen] * BLOCK_TOKENS
        total += r.tokens
        for b in r.blocks[: matched[chosen]]:
            hit_count[b] = hit_count.get(b, 0) + 1
        load[chosen] += new * BLOCK_TOKENS
        recent.append((r.arrival_s, chosen, new * BLOCK_TOKENS))
        fleet[chosen].store(r.blocks, r.arrival_s)
    return min(1.0, hits / total) if total else 0.0


def _charge(
    policy: str,
    engine: _Engine,
    victims: Sequence[int],
    now: float,
    index: int,
    hit_count: dict[int, int],
    uses: dict[int, list[int]],
    horizon: int,
) -> float:
    """What evicting ``victims`` costs by ``policy`` (0 for least-loaded: no eviction term)."""
    if policy == "coldest-tail":
        return sum(1.0 / max(1.0, now - engine.last_use[b]) for b in victims)
    if policy == "reused-tail":
        return sum(1 for b in victims if hit_count.get(b, 0) > 0)
    if policy == "oracle":
        return sum(1 for b in victims if _recurs(uses[b], index, horizon))
    return 0.0


def _recurs(indices: list[int], now: int, horizon: int) -> bool:
    k = bisect.bisect_right(indices, now)
    return k < len(indices) and indices[k] - now <= horizon


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--trace", type=Path, required=True)
    p.add_argument("--max-requests", type=int, default=1000)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--kv-tokens", type=int, default=300_000, help="KV tokens per engine")
    p.add_argument("--slacks", default="0.15,0.5,1,3", help="load slack above the mean, a comma list")
    p.add_argument("--window-s", type=float, default=60.0)
    p.add_argument("--horizon", type=int, default=300, help="requests ahead the oracle looks")
    args = p.parse_args(argv)
    reqs = read_trace(args.trace, args.max_requests)
    print(f"{len(reqs)} requests, {args.engines} engines x {args.kv_tokens:,} KV tokens")
    print("| load slack | " + " | ".join(POLICIES) + " |")
    print("|---|" + "---|" * len(POLICIES))
    for slack in (float(s) for s in args.slacks.split(",")):
        rates = [
            replay(reqs, policy, args.engines, args.kv_tokens, slack, args.window_s, args.horizon)
            for policy in POLICIES
        ]
        print(f"| {slack:g} | " + " | ".join(f"{x:.4f}" for x in rates) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
