"""Block keys of prefixes already keyed, reused: a shared system prompt is hashed once, not on every request.

A block's key is ``H(parent key, the block's token ids)`` (``kvstate.keys``), so two prompts that share their first
``n`` blocks of token ids share their first ``n`` keys. Requests that share a system prompt share hundreds of
blocks, and hashing them (blake2b, a few microseconds a block with its Python plumbing) had become most of a
decision for an 8k-token prompt once the tokenizer's piece cache made tokenizing the shared text nearly free.

``BlockKeyMemo`` keeps, per (parent key, first block), the token ids and keys of the latest prompt that started
with them. A new prompt with the same first block finds how many whole blocks it shares with that one by comparing
the raw token bytes (a binary search of C-speed comparisons), takes those keys as they are, and hashes only the
rest. The keys are exactly what hashing gives: equal bytes under an equal parent chain to equal keys.

Bounded in bytes (``limits.block_key_memo_bytes``: the token bytes and keys it holds); when full it is emptied and
refills with what traffic reuses, no bookkeeping on the hot path. A prompt whose first block is new costs one dict
lookup more than hashing alone.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence

from kvstate.keys import BlockKey, chain_packed_keys

__all__ = ["BlockKeyMemo"]

_KEY_BYTES = 40
"""What one kept key costs, as Python holds it (an int object above the small-int cache and its list slot)."""


class BlockKeyMemo:
    """Chained block keys, reusing the longest whole-block prefix shared with the latest prompt that began the same
    way. Safe to share between threads: a race only replaces one entry with another equally correct one."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._latest: dict[bytes, tuple[bytes, list[BlockKey]]] = {}
        """(parent, first block's token bytes) -> (the latest such prompt's token bytes, its keys)."""
        self._bytes = 0
        self.reused_blocks = 0
        self.hashed_blocks = 0

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def chain(self, parent: BlockKey, token_ids: Sequence[int], block_size: int) -> list[BlockKey]:
        """``chain_block_keys(parent, token_ids, block_size)`` (``kvstate.keys``), reusing a prefix seen before."""
        return self.chain_reusing(parent, token_ids, block_size)[0]

    def chain_reusing(
        self,
        parent: BlockKey,
        token_ids: Sequence[int],
        block_size: int,
        pause: Callable[[], None] | None = None,
    ) -> tuple[list[BlockKey], int]:
        """``chain`` and how many of its leading keys were the latest such prompt's: where the two part, which is
        where a prompt's own text begins after a shared system prompt (0: nothing reused). ``pause``: called between
        slices of the hashing (``kvstate.keys.chain_packed_keys``)."""
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        n_full = len(token_ids) // block_size
        if n_full == 0:
            return [], 0
        raw = array("I", token_ids[: n_full * block_size]).tobytes()
        if self.max_bytes <= 0:
            return chain_packed_keys(parent, raw, n_full, pause), 0
        width = len(raw) // n_full
        head = parent.to_bytes(8, "big") + raw[:width]
        seen = self._latest.get(head)
        shared = 0
        if seen is not None:
            old_raw, old_keys = seen
            shared = _common_blocks(raw, old_raw, width, min(n_full, len(old_keys)))
        if shared == n_full and seen is not None:
            keys = seen[1][:n_full]
        else:
            start = parent if shared == 0 or seen is None else seen[1][shared - 1]
            rest = chain_packed_keys(start, raw[shared * width :], n_full - shared, pause)  # packed once, above
            keys = rest if seen is None or shared == 0 else [*seen[1][:shared], *rest]
            self._keep(head, raw, keys)
        self.reused_blocks += shared
        self.hashed_blocks += n_full - shared
        return keys, shared

    def _keep(self, head: bytes, raw: bytes, keys: list[BlockKey]) -> None:
        size = len(head) + len(raw) + _KEY_BYTES * len(keys)
        if size > self.max_bytes // 4:
            return  # one huge prompt must not flush everyone's system prompts
        old = self._latest.get(head)
        if old is not None:
            self._bytes -= len(head) + len(old[0]) + _KEY_BYTES * len(old[1])
        if self._bytes + size > self.max_bytes:
            self._latest.clear()
            self._bytes = 0
        self._latest[head] = (raw, keys)
        self._bytes += size


def _common_blocks(a: bytes, b: bytes, width: int, limit: int) -> int:
    """How many leading ``width``-byte blocks ``a`` and ``b`` share (at most ``limit``): a binary search of slice
    comparisons, each at C speed."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        end = mid * width
        if a[:end] == b[:end]:
            lo = mid
        else:
            hi = mid - 1
    return lo
