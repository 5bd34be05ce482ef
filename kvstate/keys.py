"""Block keys: Cognitora's own key space for KV-cache blocks.

A key is a chained 64-bit hash: ``key(i) = H(key(i-1), tokens of block i)``, with the chain rooted at the model
(or LoRA adapter) name. Engines name blocks with their own hashes (vLLM: sha256 over CBOR, last 8 bytes; SGLang:
first 8 bytes, signed); we never compare those across engines. Instead, keys are recomputed from token ids, so the
same tokens give the same keys whether they come from a request or from a ``BlockStored`` event's ``token_ids``.

Only full blocks are keyed: the engine never caches a partial last block either.

Text-approximate keys (no tokenizer configured, or an engine that publishes no events) hash fixed-size chunks of
UTF-8 text instead of token blocks, in a separate key space (the root differs), so they never collide with
token-exact keys.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections.abc import Callable, Sequence

__all__ = [
    "APPROX_CHARS_PER_TOKEN",
    "PAUSE_EVERY_BLOCKS",
    "BlockKey",
    "approx_root_key",
    "chain_block_keys",
    "chain_packed_keys",
    "root_key",
    "text_block_keys",
]

BlockKey = int
"""An unsigned 64-bit block key."""

APPROX_CHARS_PER_TOKEN = 4
"""Text-approximate keys assume this many characters per token, the usual figure for English BPE vocabularies."""


def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def root_key(model: str, lora: str | None = None) -> BlockKey:
    """The parent of a sequence's first block: distinct per model and per LoRA adapter."""
    return _h64(b"cognitora-root\x00" + model.encode() + b"\x00" + (lora or "").encode())


def approx_root_key(model: str, lora: str | None = None) -> BlockKey:
    """Root of the text-approximate key space for ``model``."""
    return _h64(b"cognitora-text-root\x00" + model.encode() + b"\x00" + (lora or "").encode())


def chain_block_keys(parent: BlockKey, token_ids: Sequence[int], block_size: int) -> list[BlockKey]:
    """Keys of the full blocks of ``token_ids``, chained from ``parent``. A partial last block gets no key."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    n_full = len(token_ids) // block_size
    return chain_packed_keys(parent, array("I", token_ids[: n_full * block_size]).tobytes(), n_full)


PAUSE_EVERY_BLOCKS = 256
"""With a ``pause``, the blocks ``chain_packed_keys`` hashes between two calls to it: ~0.2 ms holding the GIL."""


def chain_packed_keys(
    parent: BlockKey, packed: bytes, blocks: int, pause: Callable[[], None] | None = None
) -> list[BlockKey]:
    """``chain_block_keys`` of token ids already packed (``array("I", ids).tobytes()``): ``blocks`` blocks of
    ``len(packed) // blocks`` bytes each, chained from ``parent``. ``pause``, when given, is called before every
    ``PAUSE_EVERY_BLOCKS`` blocks: a worker thread lets the event loop take the GIL there (``core.keying``)."""
    if blocks <= 0:
        return []
    width = len(packed) // blocks
    step = blocks if pause is None else PAUSE_EVERY_BLOCKS
    blake = hashlib.blake2b
    # Each block hashes its parent's key as 8 big-endian bytes, which is the parent's digest itself: the chain is
    # carried as digests and read as ints in one call at the end. Per block one slice, one join and one hash, all
    # holding the GIL (hashlib keeps it for inputs under 2 KiB): half the Python steps of converting each key on
    # the way, ~0.5 us a block less (bench/results/keying_gil.md).
    digest = parent.to_bytes(8, "big")
    digests: list[bytes] = []
    for first in range(0, blocks * width, step * width):
        if pause is not None:
            pause()
        digests += [
            digest := blake(digest + packed[start : start + width], digest_size=8).digest()
            for start in range(first, min(blocks * width, first + step * width), width)
        ]
    return list(struct.unpack(f">{blocks}Q", b"".join(digests)))


def text_block_keys(parent: BlockKey, text: str, chars_per_block: int) -> list[BlockKey]:
    """Text-approximate keys: chained hashes of ``chars_per_block``-character chunks; a partial chunk gets none."""
    if chars_per_block <= 0:
        raise ValueError(f"chars_per_block must be positive, got {chars_per_block}")
    keys: list[BlockKey] = []
    for start in range(0, len(text) - chars_per_block + 1, chars_per_block):
        chunk = text[start : start + chars_per_block].encode()
        parent = _h64(parent.to_bytes(8, "big") + chunk)
        keys.append(parent)
    return keys
