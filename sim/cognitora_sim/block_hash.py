"""vLLM's prefix-cache block hashes (``--prefix-caching-hash-algo sha256_cbor``), the simulated engine's own names.

Each full block of ``block_size`` tokens is named ``sha256(cbor([parent32, [tokens...], extra_keys]))``, where
``parent32`` is the previous block's 32-byte digest, or ``NONE_HASH`` for the first block of a sequence.
``NONE_HASH = sha256(cbor(seed))`` with the seed ``"vllm-none-hash"`` (vllm#51875) unless ``PYTHONHASHSEED`` was
given. Events publish the last 8 bytes of a digest as an unsigned big-endian int
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the default). A partial last block never gets a hash.

Only the CBOR subset these tuples use is implemented (canonical = shortest-form heads, definite lengths), so the
module needs no ``cbor2``. Golden values from engines.md section 2.1 pin it in the tests.

The router never relies on these numbers: it recomputes its own keys from ``BlockStored.token_ids``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


def _head(major: int, value: int) -> bytes:
    if value < 24:
        return bytes([(major << 5) | value])
    for extra, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if value < (1 << (8 * width)):
            return bytes([(major << 5) | extra]) + value.to_bytes(width, "big")
    raise ValueError(f"CBOR integer too large: {value}")


def cbor_encode(obj: object) -> bytes:
    """Canonical CBOR of None, bool, int, str, bytes and sequences (tuples/lists) of them."""
    if obj is None:
        return b"\xf6"
    if obj is True:
        return b"\xf5"
    if obj is False:
        return b"\xf4"
    if isinstance(obj, int):
        return _head(0, obj) if obj >= 0 else _head(1, -1 - obj)
    if isinstance(obj, bytes):
        return _head(2, len(obj)) + obj
    if isinstance(obj, str):
        raw = obj.encode()
        return _head(3, len(raw)) + raw
    if isinstance(obj, (tuple, list)):
        return _head(4, len(obj)) + b"".join(cbor_encode(x) for x in obj)
    raise TypeError(f"cannot CBOR-encode {type(obj).__name__}")


def none_hash(seed: str = DEFAULT_NONE_HASH_SEED) -> bytes:
    """The parent digest of a sequence's first block."""
    return hashlib.sha256(cbor_encode(seed)).digest()


_UINT16 = [_head(0, i) for i in range(1 << 16)]
"""CBOR of every token id below 65536 (every id of most vocabularies): hashing is the simulator's hot path."""


def hash_block(parent: bytes, tokens: Sequence[int], extra_keys: tuple[object, ...] | None = None) -> bytes:
    """The 32-byte digest of one full block, chained on ``parent``: ``sha256(cbor([parent, tokens, extra]))``."""
    if extra_keys is None and len(parent) == 32 and all(0 <= t < 65536 for t in tokens):
        table = _UINT16
        # [bstr(32) parent, [uint...], null], byte for byte what cbor_encode writes
        encoded = b"\x83\x58\x20" + parent + _head(4, len(tokens)) + b"".join([table[t] for t in tokens]) + b"\xf6"
        return hashlib.sha256(encoded).digest()
    return hashlib.sha256(cbor_encode((parent, tuple(tokens), extra_keys))).digest()


def event_hash(digest: bytes) -> int:
    """How a digest appears in KV events: its last 8 bytes as an unsigned big-endian int."""
    return int.from_bytes(digest[-8:], "big")


class BlockHasher:
    """Chained block digests for one engine (one ``NONE_HASH``, one block size)."""

    def __init__(self, block_size: int, seed: str = DEFAULT_NONE_HASH_SEED) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.root = none_hash(seed)

    def extend(self, digests: list[bytes], token_ids: Sequence[int]) -> None:
        """Append to ``digests`` the digests of every full block of ``token_ids`` it does not cover yet."""
        bs = self.block_size
        n_full = len(token_ids) // bs
        parent = digests[-1] if digests else self.root
        for i in range(len(digests), n_full):
            parent = hash_block(parent, token_ids[i * bs : (i + 1) * bs])
            digests.append(parent)
