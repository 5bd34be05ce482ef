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
        for key in keys:
            slot = (model, key)
            holders = entries.get(slot)
            if holders is None:
                entries[slot] = {endpoint: expires}
            else:
                holders[endpoint] = expires
                entries.move_to_end(slot)
        while len(entries) > self._max_keys:
            entries.popitem(last=False)

    def match(self, model: str, keys: Sequence[BlockKey], now: float) -> dict[str, PrefixMatch]:
        """Longest consecutive prefix of ``keys`` each endpoint was just sent (speculative weight)."""
        self._prune(now)
        entries = self._entries
        if not entries:
            return {}
        alive: dict[str, int] | None = None
        for i, key in enumerate(keys):
            holders = entries.get((model, key))
            if holders is None:
                break
            held = [e for e, expiry in holders.items() if expiry > now]
            if alive is None:
                alive = dict.fromkeys(held, 0)
            for endpoint in held:
                if endpoint in alive and alive[endpoint] == i:
                    alive[endpoint] = i + 1
            if not any(n == i + 1 for n in alive.values()):
                break
        if not alive:
            return {}
        return {e: PrefixMatch(n, n * SPECULATIVE_WEIGHT) for e, n in alive.items() if n > 0}

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
