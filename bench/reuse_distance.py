"""How far apart a trace's prefix reuses are, in prompt tokens of traffic, next to the fleet's KV capacity.

    .venv/bin/python -m bench.reuse_distance --trace TRACE.jsonl [--max-requests 1000] [--kv-tokens 2400000]

A Mooncake-format trace (``hash_ids``: one id per block of ``--block-tokens`` prompt tokens). For every block that
recurs, the distance is the prompt tokens the fleet was sent between its last use and this one. A reuse farther
apart than the fleet's KV capacity (engines x ``kv_capacity_tokens``) is evicted under any placement that keeps
the caches full, so the benchmark's reuse bound (an unlimited cache) cannot be reached by any router on such a
trace. Prints the percentiles and the share of reuses within the capacity.
"""

from __future__ import annotations

import argparse
from itertools import islice
from pathlib import Path

from bench.workloads import MOONCAKE_BLOCK_TOKENS, read_mooncake


def reuse_distances(trace: Path, max_requests: int, block_tokens: int) -> tuple[list[int], int]:
    """The sorted reuse distances (tokens) of the trace's first ``max_requests`` requests, and their prompt tokens."""
    last_seen: dict[int, int] = {}
    distances: list[int] = []
    position = 0
    total = 0
    for request in islice(read_mooncake(trace), max_requests):
        total += request.input_length
        for block in request.hash_ids:
            if block in last_seen:
                distances.append((position - last_seen[block]) * block_tokens)
            last_seen[block] = position
            position += 1
    return sorted(distances), total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--max-requests", type=int, default=1000)
    parser.add_argument(
        "--block-tokens", type=int, default=MOONCAKE_BLOCK_TOKENS, help="tokens per hash id (Mooncake: 512)"
    )
    parser.add_argument("--kv-tokens", type=int, default=8 * 300_000, help="the fleet's KV capacity in tokens")
    args = parser.parse_args()
    distances, total = reuse_distances(args.trace, args.max_requests, args.block_tokens)
    if not distances:
        print(f"{args.trace}: no block recurs in the first {args.max_requests} requests")
        return 0

    def at(q: float) -> float:
        return distances[min(len(distances) - 1, int(q * len(distances)))] / 1e6

    within = sum(1 for d in distances if d <= args.kv_tokens) / len(distances)
    print(f"{len(distances)} block reuses over {total / 1e6:.1f}M prompt tokens")
    print(f"reuse distance, M tokens of traffic: p25 {at(0.25):.2f}, median {at(0.5):.2f}, p75 {at(0.75):.2f}")
    print(f"within the fleet's {args.kv_tokens / 1e6:.1f}M KV tokens: {within:.0%} of reuses")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
