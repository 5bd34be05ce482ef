from __future__ import annotations

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
    assert routed.match("m", [1, 2], now=50.0) == {}  # the oldest keys went first
    assert routed.match("m", [3, 4, 5], now=50.0) == {"a": PrefixMatch(3, 3.0)}


def test_merge_keeps_the_longer_view_per_endpoint() -> None:
    stored = {"a": PrefixMatch(10, 9.0), "b": PrefixMatch(2, 2.0)}
    routed = {"b": PrefixMatch(5, 5.0), "c": PrefixMatch(1, 1.0)}
    assert merge_matches(stored, routed) == {
        "a": PrefixMatch(10, 9.0),
        "b": PrefixMatch(5, 5.0),
        "c": PrefixMatch(1, 1.0),
    }
    assert merge_matches(stored, {}) is stored
