"""No request can stall a gateway (issue 11, finding 1): what one huge prompt may cost, and that it costs no more.

Unit level: the store's speculative expiry is linear in what it forgets.
"""

from __future__ import annotations

import time

from kvstate.memory_store import MemoryStore

M, A = "m", "10.0.0.1:8000"


async def test_expiring_many_speculative_entries_is_linear() -> None:
    # Quadratic before (one next(iter(dict)) per purged entry, each skipping the slots already popped): 100k
    # entries took 3 to 7 s, with the event loop frozen. Linear, 200k take ~0.1 s; the bound leaves room for a
    # loaded machine and still fails the quadratic purge by an order of magnitude.
    now = [0.0]
    store = MemoryStore(clock=lambda: now[0])
    n = 200_000
    await store.add_speculative(M, A, list(range(1, n + 1)), ttl_s=10.0)
    now[0] = 20.0
    started = time.perf_counter()
    await store.add_speculative(M, A, [n + 1], ttl_s=10.0)
    assert time.perf_counter() - started < 2.0
    assert await store.match_prefix(M, [1]) == {}
    assert (await store.match_prefix(M, [n + 1]))[A].blocks == 1


async def test_speculative_entries_past_the_cap_are_dropped_oldest_first_in_linear_time() -> None:
    now = [0.0]
    cap = 100_000
    store = MemoryStore(max_blocks_per_endpoint=cap, clock=lambda: now[0])
    await store.add_speculative(M, A, list(range(1, cap + 1)), ttl_s=1000.0)
    started = time.perf_counter()
    for i in range(50):
        first = cap + 1 + i * 1000
        await store.add_speculative(M, A, list(range(first, first + 1000)), ttl_s=1000.0)
    assert time.perf_counter() - started < 3.0
    # The oldest 50k are gone: the first chain's tail (a chain is stored head last, so tails go first).
    assert await store.match_prefix(M, [cap]) == {}
    assert (await store.match_prefix(M, [1]))[A].blocks == 1
    assert (await store.match_prefix(M, [cap + 50_000]))[A].blocks == 1
