"""Block keys of prefixes already keyed, reused: a shared system prompt is hashed once, not on every request.

A block's key is ``H(parent key, the block's token ids)`` (``kvstate.keys``). Requests that share a system prompt
share the first few hundred blocks of that chain, and hashing them was most of a decision's time for an 8k-token
prompt (blake2b, ~1 us a block with its Python plumbing: ~0.5 ms of the ~0.8 ms the core spends; the piece cache
already made tokenizing the shared text nearly free). ``BlockKeyMemo`` maps the exact bytes hashed for one block
(parent key + token ids) to the key they give, so a prefix seen before costs a dict lookup per block.

The memo is bounded by entries (``limits.block_key_memo_entries``); when full it is emptied and refills with
what traffic reuses (no LRU bookkeeping on the hot path; the shared prefixes are back after one request each).
A hit returns exactly what hashing would: the key is a pure function of the bytes it is stored under.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from kvstate.keys import BlockKey, chain_block_keys

__all__ = ["BlockKeyMemo"]


class BlockKeyMemo:
    """Chained block keys with a bounded memo of (parent, block) -> key. Not thread-safe by design: a lost update
    under a race only costs a recomputation (dict operations themselves are atomic in CPython)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._memo: dict[bytes, tuple[bytes, BlockKey]] = {}
        """Hashed bytes -> (digest, key): the digest is the next block's parent, the key the int it spells."""
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._memo)

    def chain(self, parent: BlockKey, token_ids: Sequence[int], block_size: int) -> list[BlockKey]:
        """``chain_block_keys(parent, token_ids, block_size)``, from the memo where the prefix was seen."""
        if self.max_entries <= 0:
            return chain_block_keys(parent, token_ids, block_size)
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        n_full = len(token_ids) // block_size
        tokens = array("I", token_ids[: n_full * block_size])
        raw = tokens.tobytes()
        width = block_size * tokens.itemsize
        memo = self._memo
        blake = hashlib.blake2b
        keys: list[BlockKey] = []
        pb = parent.to_bytes(8, "big")
        hits = 0
        for i in range(n_full):
            data = pb + raw[i * width : (i + 1) * width]
            hit = memo.get(data)
            if hit is None:
                digest = blake(data, digest_size=8).digest()
                hit = (digest, int.from_bytes(digest, "big"))
                if len(memo) >= self.max_entries:
                    memo.clear()
                memo[data] = hit
            else:
                hits += 1
            pb, key = hit
            keys.append(key)
        self.hits += hits
        self.misses += n_full - hits
        return keys
