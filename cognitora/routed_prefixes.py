"""``RoutedPrefixes``: the prompts this router just sent somewhere, known the instant it sends them.

The store learns a dispatch's speculative keys a moment later (a write that may cross the network), and an
engine's KV events later still. A request placed in that gap would see the first request's queue but not its cache
and leave for a cold engine: a burst of one cold prefix would scatter. This process-local index closes the gap for
requests placed by the same gateway; the store's speculative entries cover the other replicas.

Bounded: entries expire after their TTL, and past ``max_keys`` the oldest are dropped (a lost entry only costs a
cache-affinity hint, never correctness).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from kvstate.keys import BlockKey
from kvstate.store import SPECULATIVE_WEIGHT, PrefixMatch

DEFAULT_MAX_KEYS = 500_000
"""About 190 MB at most (measured: ~370 bytes a key routed to one endpoint, the entry, its tuple and its holders);
a 32k-token prompt is 2,048 keys, so this holds hundreds of recent long prompts. A prompt's keys are bounded too
(``limits.exact_prompt_max_chars``), so no single request fills it."""


class RoutedPrefixes:
    def __init__(self, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self._max_keys = max_keys
        # (model, key) -> {endpoint: expiry}; insertion order approximates expiry order (TTLs are few and fixed)
        self._entries: OrderedDict[tuple[str, BlockKey], dict[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, model: str, endpoint: str, keys: Sequence[BlockKey], expires: float) -> None:
        entries = self._entries
        # Last key first, so a prompt's first keys are always the most recent: eviction (oldest first) then takes a
        # chain's tail before its head, and what an endpoint holds stays a prefix (``match`` relies on it).
        for key in reversed(keys):
            slot = (model, key)
            holders = entries.get(slot)
            if holders is None:
                entries[slot] = {endpoint: expires}
            else:
                # The later expiry wins: an earlier one would end a prefix's head before its tail.
                if holders.get(endpoint, expires) <= expires:
                    holders[endpoint] = expires
                entries.move_to_end(slot)
        while len(entries) > self._max_keys:
            entries.popitem(last=False)

    def match(self, model: str, keys: Sequence[BlockKey], now: float) -> dict[str, PrefixMatch]:
        """Longest consecutive prefix of ``keys`` each endpoint was just sent (speculative weight).

        A binary search per endpoint, not a walk: block keys are chained (a key fixes every block before it), so an
        add that holds key ``i`` holds every key before it, with the same expiry or a later one (``add``'s order
        keeps that true under eviction). What an endpoint holds alive is a prefix: ~9 lookups for an 8k-token
        prompt instead of 500, which took 0.8 ms of a 3 ms decision."""
        self._prune(now)
        entries = self._entries
        if not entries or not keys:
            return {}
        first = entries.get((model, keys[0]))
        if first is None:
            return {}
        out: dict[str, PrefixMatch] = {}
        for endpoint, expiry in first.items():
            if expiry <= now:
                continue
            held, unknown = 1, len(keys)  # keys[:held] are held; keys[unknown:] are not
            while held < unknown:
                mid = (held + unknown + 1) // 2
                holders = entries.get((model, keys[mid - 1]))
                if holders is not None and holders.get(endpoint, now) > now:
                    held = mid
                else:
                    unknown = mid - 1
            out[endpoint] = PrefixMatch(held, held * SPECULATIVE_WEIGHT)
        return out

    def _prune(self, now: float) -> None:
        entries = self._entries
        while entries:
            holders = next(iter(entries.values()))
            if any(expiry > now for expiry in holders.values()):
                return
            entries.popitem(last=False)


def merge_matches(stored: Mapping[str, PrefixMatch], routed: Mapping[str, PrefixMatch]) -> Mapping[str, PrefixMatch]:
    """Per endpoint, the longer of what the store and this router's recent dispatches say it holds."""
    if not routed:
        return stored
    merged = dict(stored)
    for endpoint, mine in routed.items():
        theirs = merged.get(endpoint)
        if theirs is None or mine.weighted_blocks > theirs.weighted_blocks:
            merged[endpoint] = mine
    return merged
