from __future__ import annotations

import random

from cognitora.routed_prefixes import RoutedPrefixes, merge_matches
from kvstate.store import PrefixMatch


def test_longest_consecutive_prefix_per_endpoint() -> None:
    routed = RoutedPrefixes()
    routed.add("m", "a", [1, 2, 3, 4], expires=100.0)
    routed.add("m", "b", [1, 2], expires=100.0)
    routed.add("m", "b", [9, 4], expires=100.0)  # b holds key 4, but not 3: its prefix stops at 2
    got = routed.match("m", [1, 2, 3, 4, 5], now=50.0)
    assert got == {"a": PrefixMatch(4, 4.0), "b": PrefixMatch(2, 2.0)}
    assert routed.match("other-model", [1, 2], now=50.0) == {}
    assert routed.match("m", [7, 1, 2], now=50.0) == {}


def test_entries_expire_and_the_index_stays_bounded() -> None:
    routed = RoutedPrefixes(max_keys=3)
    routed.add("m", "a", [1, 2], expires=10.0)
    assert routed.match("m", [1, 2], now=11.0) == {}
    assert len(routed) == 0  # expired entries are pruned, not just ignored
    routed.add("m", "a", [1, 2, 3, 4, 5], expires=100.0)
    assert len(routed) == 3
    # The chain's tail went first: what is left is still a prefix the next request can use.
    assert routed.match("m", [1, 2, 3, 4, 5], now=50.0) == {"a": PrefixMatch(3, 3.0)}


def test_matches_what_a_walk_over_every_key_finds_on_chained_keys() -> None:
    """The binary search against the plain walk, on prompts that share prefixes of every length (chained keys:
    a key names its whole prefix), sent to random endpoints at random expiries, with eviction."""
    rng = random.Random(5)
    routed = RoutedPrefixes(max_keys=3_000)
    sent: list[tuple[str, tuple[int, ...], float]] = []
    roots = [tuple(rng.getrandbits(64) for _ in range(300)) for _ in range(6)]
    for n in range(400):
        root = rng.choice(roots)
        chain = root[: rng.randrange(1, 300)] + tuple(rng.getrandbits(64) for _ in range(rng.randrange(0, 40)))
        endpoint, expires = rng.choice("abcd"), rng.uniform(0, 100)
        routed.add("m", endpoint, list(chain), expires)
        sent.append((endpoint, chain, expires))
        if n % 20:
            continue
        for root in roots:
            query = root[: rng.randrange(1, 300)]
            now = rng.uniform(0, 50)
            assert routed.match("m", list(query), now) == walk(routed, query, now)


def walk(routed: RoutedPrefixes, keys: tuple[int, ...], now: float) -> dict[str, PrefixMatch]:
    """Per endpoint, how many leading keys it holds alive: one lookup per key (the reference)."""
    entries = routed._entries
    out: dict[str, PrefixMatch] = {}
    for endpoint in "abcd":
        n = 0
        while n < len(keys) and entries.get(("m", keys[n]), {}).get(endpoint, now) > now:
            n += 1
        if n:
            out[endpoint] = PrefixMatch(n, float(n))
    return out


def test_merge_keeps_the_longer_view_per_endpoint() -> None:
    stored = {"a": PrefixMatch(10, 9.0), "b": PrefixMatch(2, 2.0)}
    routed = {"b": PrefixMatch(5, 5.0), "c": PrefixMatch(1, 1.0)}
    assert merge_matches(stored, routed) == {
        "a": PrefixMatch(10, 9.0),
        "b": PrefixMatch(5, 5.0),
        "c": PrefixMatch(1, 1.0),
    }
    assert merge_matches(stored, {}) is stored
