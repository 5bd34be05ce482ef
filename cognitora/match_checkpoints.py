"""``MatchCheckpoints``: where the store's prefix match stood after a shared system prompt, kept for a moment.

Requests that share a long system prompt make the store walk the same blocks for each of them: ~500 block strings
for an 8k-token prompt, most of the decision's time in Redis. The key memo (``kvstate.key_memo``) already tells
where a prompt parts from the latest one that began the same way (``PromptKeys.reused_blocks``); the router asks
the store for a checkpoint there, keeps it for ``limits.match_checkpoint_ttl_s``, and a later prompt that begins
with those blocks resumes from it: the store re-reads the checkpoint's proof (a few block strings) and walks only
the rest. A checkpoint is found by the chain's key at its depth (chained keys name their whole prefix) and the
endpoints asked for, so it is only ever resumed for the same prefix over the same endpoints; the deepest one a
prompt begins with is used.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstate.keys import BlockKey
from kvstate.store import MatchCheckpoint

__all__ = ["MatchCheckpoints"]

MAX_CHECKPOINTS = 4096
"""Checkpoints kept at most (one per distinct shared prefix and endpoint list); past it the oldest goes."""
DEPTHS_PER_HEAD = 8
"""Depths remembered per first block: a prompt is checked at each (a dict lookup apiece), the deepest first."""

_Slot = tuple[str, BlockKey, tuple[str, ...]]
"""(model, the chain's key at a depth, the endpoints asked for)."""


class MatchCheckpoints:
    def __init__(self, ttl_s: float, max_entries: int = MAX_CHECKPOINTS) -> None:
        self.ttl_s = ttl_s
        self._max = max_entries
        self._kept: dict[_Slot, tuple[MatchCheckpoint, float]] = {}
        self._depths: dict[_Slot, list[int]] = {}
        """(model, first key, endpoints) -> depths of checkpoints taken on chains that began with that key."""
        self.resumed = 0
        """Matches resumed from a checkpoint whose proof still read the same."""
        self.stale = 0
        """Checkpoints offered whose proof no longer read the same (a holder changed): the whole chain was walked."""

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def find(
        self, model: str, keys: Sequence[BlockKey], endpoints: tuple[str, ...], now: float
    ) -> MatchCheckpoint | None:
        """The deepest checkpoint kept on a prefix of ``keys`` over ``endpoints``, younger than the TTL."""
        if not keys:
            return None
        depths = self._depths.get((model, keys[0], endpoints))
        if not depths:
            return None
        for depth in sorted(depths, reverse=True):
            if depth > len(keys):
                continue
            slot = (model, keys[depth - 1], endpoints)
            kept = self._kept.get(slot)
            if kept is None:
                continue
            checkpoint, taken_at = kept
            if 0 <= now - taken_at < self.ttl_s:  # (a wall clock stepped back: as good as expired)
                return checkpoint
            del self._kept[slot]
        return None

    def keep(
        self, model: str, keys: Sequence[BlockKey], checkpoint: MatchCheckpoint, endpoints: tuple[str, ...], now: float
    ) -> None:
        depth = checkpoint.blocks
        slot = (model, keys[depth - 1], endpoints)
        self._kept.pop(slot, None)  # re-inserted last: the dict's order is the age order
        self._kept[slot] = (checkpoint, now)
        while len(self._kept) > self._max:
            del self._kept[next(iter(self._kept))]
        head = (model, keys[0], endpoints)
        depths = self._depths.get(head)
        if depths is None:
            if len(self._depths) >= self._max:
                self._depths.clear()  # (only finds less: a depth is re-learnt when a checkpoint is next taken)
            depths = self._depths[head] = []
        if depth in depths:
            depths.remove(depth)
        depths.append(depth)
        del depths[:-DEPTHS_PER_HEAD]

    def outcome(self, offered: MatchCheckpoint | None, resumed: bool) -> None:
        """Count what became of a checkpoint offered to the store."""
        if offered is None:
            return
        if resumed:
            self.resumed += 1
        else:
            self.stale += 1
