"""``MatchCheckpoints``: where the store's prefix match stood after a shared system prompt, kept for a moment.

Requests that share a long system prompt make the store walk the same blocks for each of them: ~500 block strings
for an 8k-token prompt, most of the decision's time in Redis. The key memo (``kvstate.key_memo``) already tells
where a prompt parts from the latest one that began the same way (``PromptKeys.reused_blocks``); the router asks
the store for a checkpoint there, keeps it for ``limits.match_checkpoint_ttl_s``, and the next prompt that shares
those blocks resumes from it: the store re-reads the checkpoint's proof (a few block strings) and walks only the
rest. Keyed by the chain's key at the checkpoint (chained keys name their whole prefix) and the endpoints asked
for, so a checkpoint is only ever resumed for the same prefix over the same endpoints.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstate.keys import BlockKey
from kvstate.store import MatchCheckpoint

MAX_CHECKPOINTS = 4096
"""Checkpoints kept at most (one per distinct shared prefix and endpoint list); past it the oldest goes."""


class MatchCheckpoints:
    def __init__(self, ttl_s: float, max_entries: int = MAX_CHECKPOINTS) -> None:
        self.ttl_s = ttl_s
        self._max = max_entries
        self._kept: dict[tuple[str, BlockKey, tuple[str, ...]], tuple[MatchCheckpoint, float]] = {}
        self.resumed = 0
        """Matches resumed from a checkpoint whose proof still read the same."""
        self.stale = 0
        """Checkpoints offered whose proof no longer read the same (a holder changed): the whole chain was walked."""

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def find(
        self, model: str, keys: Sequence[BlockKey], at: int, endpoints: tuple[str, ...], now: float
    ) -> MatchCheckpoint | None:
        """The checkpoint kept for ``keys[:at]`` over ``endpoints``, if it is younger than the TTL."""
        if not 0 < at <= len(keys):
            return None
        slot = (model, keys[at - 1], endpoints)
        kept = self._kept.get(slot)
        if kept is None:
            return None
        checkpoint, taken_at = kept
        if not 0 <= now - taken_at < self.ttl_s:  # (a wall clock stepped back: as good as expired)
            del self._kept[slot]
            return None
        return checkpoint

    def keep(
        self, model: str, keys: Sequence[BlockKey], checkpoint: MatchCheckpoint, endpoints: tuple[str, ...], now: float
    ) -> None:
        slot = (model, keys[checkpoint.blocks - 1], endpoints)
        self._kept.pop(slot, None)  # re-inserted last: the dict's order is the age order
        self._kept[slot] = (checkpoint, now)
        while len(self._kept) > self._max:
            del self._kept[next(iter(self._kept))]

    def outcome(self, offered: MatchCheckpoint | None, resumed: bool) -> None:
        """Count what became of a checkpoint offered to the store."""
        if offered is None:
            return
        if resumed:
            self.resumed += 1
        else:
            self.stale += 1
