"""SGLang KV-cache events: the msgpack payload (frame 3 of each ZMQ message) -> ``EventBatch``.

Source: ``python/sglang/srt/disaggregation/kv_events.py`` (see ``shared/reference/engines.md`` section 3.1). Same
transport as vLLM (3-frame PUB, ROUTER replay answering in the older 2-frame ``[seq, payload]`` layout).

Envelope (positional array; a map is accepted defensively):

==========  ======================  ===============================================================
position    map key                 meaning
==========  ======================  ===============================================================
[0]         ``ts``                  float
[1]         ``events``              array of events (below)
[2]         ``attn_dp_rank``        int or nil (NOT ``data_parallel_rank``); absent in the oldest releases
==========  ======================  ===============================================================

Events: older releases send tagged positional arrays, newer ones tagged maps (``"type"``); both decode, unknown
keys and extra trailing fields are ignored. ``BlockStoredWithMetadata`` shares the ``"BlockStored"`` tag (its
``metadata`` is ignored).

=====  ======================  ==============================================================  ===============
pos    BlockStored field       type                                                            used
=====  ======================  ==============================================================  ===============
[1]    ``block_hashes``        array of signed int64 (may be negative), or bytes               yes
[2]    ``parent_block_hash``   signed int64, bytes or nil                                      yes
[3]    ``token_ids``           array of int                                                    yes
[4]    ``block_size``          int (the page size)                                             yes
[5]    ``lora_id``             always nil in the radix cache                                   if no lora_name
[6]    ``medium``              ``"GPU"``, ``"CPU_PINNED"``, ``"DISK"``, ``"EXTERNAL"`` or nil  yes -> Tier
(map)  ``lora_name``           str or nil, when present                                        yes
=====  ======================  ==============================================================  ===============

=====  ======================  ==========================  ====
pos    BlockRemoved field      type                        used
=====  ======================  ==========================  ====
[1]    ``block_hashes``        array of int64 or bytes     yes
[2]    ``medium``              str or nil                  yes
=====  ======================  ==========================  ====

``AllBlocksCleared`` (no fields) is also sent at every cache reset, including startup. Unknown event types (for
example ``LoadStat``) are skipped.

Hashes: SGLang publishes the FIRST 8 bytes of a sha256 digest as a SIGNED int64. Ints are masked to 64 bits
(``h & (2**64-1)``) so negative values become their unsigned twin; raw ``bytes`` digests -> their first 8 bytes,
big-endian, which is the same unsigned value.
"""

from __future__ import annotations

from kvstate.events.decoding import WireLayout, decode_payload
from kvstate.events.model import EventBatch

__all__ = ["LAYOUT", "decode_batch", "hash_from_bytes"]

STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
REMOVED_FIELDS = ("block_hashes", "medium")


def hash_from_bytes(digest: bytes) -> int:
    """SGLang's ``hash_str_to_int64`` reads the first 8 bytes big-endian (signed); we keep them unsigned."""
    return int.from_bytes(digest[:8], "big")


LAYOUT = WireLayout(
    engine="SGLang",
    stored_fields=STORED_FIELDS,
    removed_fields=REMOVED_FIELDS,
    rank_keys=("attn_dp_rank", "data_parallel_rank"),
    hash_from_bytes=hash_from_bytes,
)


def decode_batch(payload: bytes) -> EventBatch:
    """Decode an SGLang ``EventBatch`` payload (either generation). Raises ``EventDecodeError`` when malformed."""
    return decode_payload(payload, LAYOUT)
