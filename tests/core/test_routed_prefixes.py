from __future__ import annotations

import random

from cognitora.routed_prefixes import RoutedPrefixes, merge_matches
from kvstate.store import PrefixMatch


def test_longest_consecutive_prefix_per_endpoint() -> None:
    routed = RoutedPrefixes()
    routed.add("m", "a", [1, 2, 3, 4], now=0.0, expires=100.0)
    routed.add("m", "b", [1, 2], now=0.0, expires=100.0)
    routed.add("m", "b", [9, 4], now=0.0, expires=100.0)  # b holds key 4, but not 3: its prefix stops at 2
    got = routed.match("m", [1, 2, 3, 4, 5], now=50.0)
    assert got == {"a": PrefixMatch(4, 4.0), "b": PrefixMatch(2, 2.0)}
    assert routed.match("other-model", [1, 2], now=50.0) == {}
    assert routed.match("m", [7, 1, 2], now=50.0) == {}


def test_entries_expire_and_the_index_stays_bounded() -> None:
    routed = RoutedPrefixes(max_keys=3)
    routed.add("m", "a", [1, 2], now=0.0, expires=10.0)
    assert routed.match("m", [1, 2], now=11.0) == {}
    assert len(routed) == 0  # expired entries are pruned, not just ignored
    routed.add("m", "a", [1, 2, 3, 4, 5], now=11.0, expires=100.0)
    assert len(routed) == 3
    # The chain's tail was left out: what is kept is still a prefix the next request can use.
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
        routed.add("m", endpoint, list(chain), 0.0, expires)
        sent.append((endpoint, chain, expires))
        if n % 20:
            continue
        for root in roots:
            query = root[: rng.randrange(1, 300)]
            now = rng.uniform(0, 50)
            assert routed.match("m", list(query), now) == walk(routed, query, now)


def test_matches_what_was_sent_and_is_still_alive_as_time_goes_on() -> None:
    """Against the ground truth (the dispatches themselves): as time moves on and generations rotate, an endpoint's
    match is the longest prefix of the query that a dispatch to it, not yet expired, began with."""
    rng = random.Random(11)
    routed = RoutedPrefixes()
    sent: list[tuple[str, tuple[int, ...], float]] = []
    roots = [tuple(rng.getrandbits(64) for _ in range(200)) for _ in range(4)]
    now = 0.0
    for n in range(600):
        now += rng.expovariate(2.0)
        chain = rng.choice(roots)[: rng.randrange(1, 200)] + tuple(rng.getrandbits(64) for _ in range(5))
        endpoint, ttl = rng.choice("abc"), rng.choice((10.0, 10.0, 10.0, 300.0))
        routed.add("m", endpoint, list(chain), now, now + ttl)
        sent.append((endpoint, chain, now + ttl))
        query = rng.choice(roots)[: rng.randrange(1, 200)]
        truth: dict[str, PrefixMatch] = {}
        for e, c, expires in sent:
            if expires <= now:
                continue
            pairs = enumerate(zip(query, c, strict=False))
            common = next((i for i, (x, y) in pairs if x != y), min(len(query), len(c)))
            if common and common > truth.get(e, PrefixMatch(0, 0.0)).blocks:
                truth[e] = PrefixMatch(common, float(common))
        assert routed.match("m", list(query), now) == truth, n


def walk(routed: RoutedPrefixes, keys: tuple[int, ...], now: float) -> dict[str, PrefixMatch]:
    """Per endpoint, how many leading keys it holds alive: one lookup per key (the reference)."""
    held = routed._held.get("m", {})
    out: dict[str, PrefixMatch] = {}
    for endpoint, gens in held.items():
        n = 0
        while n < len(keys) and gens.alive(keys[n], now):
            n += 1
        if n:
            out[endpoint] = PrefixMatch(n, float(n))
    return out


def test_a_dispatch_is_matched_until_its_own_expiry_across_generations() -> None:
    """A generation stays current for one TTL; what it holds is still matched after the next one opens, and only
    dropped once all of it has expired."""
    routed = RoutedPrefixes()
    routed.add("m", "a", [1, 2, 3], now=0.0, expires=10.0)  # opens a generation until t=10
    routed.add("m", "a", [7, 8], now=9.0, expires=19.0)
    routed.add("m", "a", [4, 5], now=10.0, expires=20.0)  # opens the next: [7, 8] is in the previous one
    assert routed.match("m", [7, 8, 9], now=15.0) == {"a": PrefixMatch(2, 2.0)}
    assert routed.match("m", [1, 2, 3], now=15.0) == {}  # expired at 10
    assert routed.match("m", [7, 8], now=18.9) == {"a": PrefixMatch(2, 2.0)}
    routed.add("m", "a", [4, 5, 6], now=20.0, expires=30.0)  # the generation holding [7, 8] is dropped
    assert routed.match("m", [7, 8], now=20.0) == {}
    assert routed.match("m", [4, 5, 6], now=25.0) == {"a": PrefixMatch(3, 3.0)}
    assert len(routed) == 3  # [4, 5, 6]: what expired is not kept


def test_a_long_ttl_entry_outlives_the_rotations_of_short_ones() -> None:
    """Endpoints without KV events keep routing history far longer than the speculative TTL: a generation lasts the
    longest TTL seen, so such an entry is never dropped with a short-lived generation."""
    routed = RoutedPrefixes()
    routed.add("m", "a", [1], now=0.0, expires=10.0)
    routed.add("m", "a", [2], now=10.0, expires=20.0)
    routed.add("m", "a", [3, 4], now=15.0, expires=315.0)
    for t in (20.0, 30.0, 40.0, 300.0):  # short dispatches keep coming
        routed.add("m", "a", [int(t) + 100], now=t, expires=t + 10.0)
    assert routed.match("m", [3, 4], now=310.0) == {"a": PrefixMatch(2, 2.0)}
    assert routed.match("m", [3, 4], now=316.0) == {}


def test_an_earlier_expiry_never_shortens_a_later_one() -> None:
    routed = RoutedPrefixes()
    routed.add("m", "a", [1, 2, 3], now=0.0, expires=100.0)
    routed.add("m", "a", [1, 2], now=1.0, expires=50.0)
    assert routed.match("m", [1, 2, 3], now=60.0) == {"a": PrefixMatch(3, 3.0)}


def test_merge_keeps_the_longer_view_per_endpoint() -> None:
    stored = {"a": PrefixMatch(10, 9.0), "b": PrefixMatch(2, 2.0)}
    routed = {"b": PrefixMatch(5, 5.0), "c": PrefixMatch(1, 1.0)}
    assert merge_matches(stored, routed) == {
        "a": PrefixMatch(10, 9.0),
        "b": PrefixMatch(5, 5.0),
        "c": PrefixMatch(1, 1.0),
    }
    assert merge_matches(stored, {}) is stored
