"""``RoutedPrefixes``: the prompts this router just sent somewhere, known the instant it sends them.

The store learns a dispatch's speculative keys a moment later (a write that may cross the network), and an
engine's KV events later still. A request placed in that gap would see the first request's queue but not its cache
and leave for a cold engine: a burst of one cold prefix would scatter. This process-local index closes the gap for
requests placed by the same gateway; the store's speculative entries cover the other replicas.

Per (model, endpoint), two generations of ``key -> expiry`` dicts: a dispatch writes its whole chain into the
current one with one C-level ``dict.update`` (a Python loop over an 8k-token prompt's ~520 keys took ~0.2 ms of the
decision), and a generation is dropped whole once everything in it has expired, so nothing walks the keys to
expire them. A generation stays current for one TTL; the one before it then holds only entries that expire within
that TTL, and is dropped when the next rotation comes.

Bounded: past ``max_keys`` the oldest generations are dropped (a lost entry only costs a cache-affinity hint,
never correctness).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvstate.keys import BlockKey
from kvstate.store import SPECULATIVE_WEIGHT, PrefixMatch

__all__ = ["RoutedPrefixes", "merge_matches"]

DEFAULT_MAX_KEYS = 500_000
"""About 25 MB at most (~50 bytes a key routed to one endpoint: its dict slot; the key's int is the decision's and
the expiry is one float per dispatch); a 32k-token prompt is 2,048 keys, so this holds hundreds of recent long
prompts. A prompt's keys are bounded too (``limits.exact_prompt_max_chars``)."""


@dataclass
class _Generations:
    """What one endpoint was sent, in two generations: ``current`` takes adds until ``rotate_at``."""

    current: dict[BlockKey, float] = field(default_factory=dict)
    previous: dict[BlockKey, float] = field(default_factory=dict)
    rotate_at: float = float("-inf")
    span: float = 0.0
    """The longest TTL added so far: how long a generation stays current."""
    current_latest: float = float("-inf")
    """The latest expiry in ``current``: an add that expires no earlier may overwrite blindly."""
    previous_latest: float = float("-inf")

    def __len__(self) -> int:
        return len(self.current) + len(self.previous)

    def alive(self, key: BlockKey, now: float) -> bool:
        return self.current.get(key, now) > now or self.previous.get(key, now) > now


class RoutedPrefixes:
    def __init__(self, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self._max_keys = max_keys
        self._held: dict[str, dict[str, _Generations]] = {}
        """model -> endpoint -> what it was sent."""
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, model: str, endpoint: str, keys: Sequence[BlockKey], now: float, expires: float) -> None:
        """``endpoint`` was sent ``keys`` (a whole chain) at ``now``; they count as held until ``expires``."""
        if not keys:
            return
        held = self._held.setdefault(model, {}).setdefault(endpoint, _Generations())
        held.span = max(held.span, expires - now)
        if now >= held.rotate_at:
            # Everything in ``previous`` was added before the last rotation, and a generation lasts the longest TTL
            # added before it opened: all of ``previous`` has expired. Drop it; ``current`` becomes ``previous``.
            self._size -= len(held.previous)
            held.previous, held.previous_latest = held.current, held.current_latest
            held.current, held.current_latest = {}, float("-inf")
            held.rotate_at = now + held.span
        if len(keys) > self._max_keys:
            keys = keys[: self._max_keys]  # the head: what is kept must stay a prefix (``match`` relies on it)
        current = held.current
        before = len(current)
        if expires >= held.current_latest:
            current.update(dict.fromkeys(keys, expires))
            held.current_latest = expires
        else:
            # An earlier expiry than some entry's (a shorter TTL than before): the later one wins, key by key, or a
            # prefix's head could end before its tail.
            for key in keys:
                if current.get(key, expires) <= expires:
                    current[key] = expires
        self._size += len(current) - before
        if self._size > self._max_keys:
            self._shrink(held, keys, expires)

    def match(self, model: str, keys: Sequence[BlockKey], now: float) -> dict[str, PrefixMatch]:
        """Longest consecutive prefix of ``keys`` each endpoint was just sent (speculative weight).

        A binary search per endpoint, not a walk: block keys are chained (a key fixes every block before it), and
        every add writes a whole chain with one expiry, so an endpoint that holds key ``i`` alive holds every key
        before it alive: ~9 lookups for an 8k-token prompt instead of 500."""
        endpoints = self._held.get(model)
        if not endpoints or not keys:
            return {}
        out: dict[str, PrefixMatch] = {}
        first = keys[0]
        for endpoint, held in endpoints.items():
            self._expire(held, now)
            if not held.alive(first, now):
                continue
            have, unknown = 1, len(keys)  # keys[:have] are held; keys[unknown:] are not
            while have < unknown:
                mid = (have + unknown + 1) // 2
                if held.alive(keys[mid - 1], now):
                    have = mid
                else:
                    unknown = mid - 1
            out[endpoint] = PrefixMatch(have, have * SPECULATIVE_WEIGHT)
        return out

    def _expire(self, held: _Generations, now: float) -> None:
        """Drop the generations of ``held`` in which everything has expired."""
        if held.previous and held.previous_latest <= now:
            self._size -= len(held.previous)
            held.previous, held.previous_latest = {}, float("-inf")
        if held.current and held.current_latest <= now:
            self._size -= len(held.current)
            held.current, held.current_latest = {}, float("-inf")

    def _shrink(self, newest: _Generations, keys: Sequence[BlockKey], expires: float) -> None:
        """Back under ``max_keys``: older generations first, then other endpoints' current ones; last, ``newest``
        keeps only the chain just added to it (``keys``)."""
        gens = [g for m in self._held.values() for g in m.values()]
        for g in gens:
            if self._size <= self._max_keys:
                return
            self._size -= len(g.previous)
            g.previous, g.previous_latest = {}, float("-inf")
        for g in gens:
            if self._size <= self._max_keys:
                return
            if g is not newest:
                self._size -= len(g.current)
                g.current, g.current_latest = {}, float("-inf")
        if self._size > self._max_keys:
            self._size -= len(newest.current)
            newest.current, newest.current_latest = dict.fromkeys(keys, expires), expires
            self._size += len(newest.current)


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
