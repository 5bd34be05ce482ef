"""vLLM KV-cache events: the msgpack payload (frame 3 of each ZMQ message) -> ``EventBatch``.

Source: ``vllm/distributed/kv_events.py`` (see ``shared/reference/engines.md`` section 1). Fields are only ever
appended, so older engines send shorter arrays and newer ones longer arrays; both decode.

Envelope (``EventBatch``, a positional array in every release; a map is accepted defensively):

==========  =====================  ==================================================================
position    map key                meaning
==========  =====================  ==================================================================
[0]         ``ts``                 float, ``time.time()`` at publish
[1]         ``events``             array of events (below)
[2]         ``data_parallel_rank`` int or nil; absent before vllm#18925 (2-element envelope)
==========  =====================  ==================================================================

Events: legacy generation = tagged positional arrays (``[0]`` is the tag); current generation (vllm#42892) =
maps with the tag under ``"type"``, looked up by name, unknown keys ignored.

=====  ==================================  ===============================================  =================
pos    BlockStored field                   type                                             used
=====  ==================================  ===============================================  =================
[1]    ``block_hashes``                    array of uint64 or bytes                         yes
[2]    ``parent_block_hash``               uint64, bytes or nil (nil: first block)          yes
[3]    ``token_ids``                       array of int (tokens of these blocks only)       yes
[4]    ``block_size``                      int (16 by default)                              yes
[5]    ``lora_id``                         int or nil (deprecated)                          if no lora_name
[6]    ``medium``                          str or nil (``"GPU"``; connectors: ``"CPU"``..)  yes -> Tier
[7]    ``lora_name``                       str or nil                                       yes (chain root)
[8]    ``extra_keys``                      array (one entry per block) or nil               no
[9]    ``group_idx``                       int or nil                                       no
[10]   ``kv_cache_spec_kind``              str or nil                                       no
[11]   ``kv_cache_spec_sliding_window``    int or nil                                       no
=====  ==================================  ===============================================  =================

=====  ========================  ==========================  ====
pos    BlockRemoved field        type                        used
=====  ========================  ==========================  ====
[1]    ``block_hashes``          array of uint64 or bytes    yes
[2]    ``medium``                str or nil                  yes
[3]    ``group_idx``             int or nil                  no
=====  ========================  ==========================  ====

``AllBlocksCleared`` has no fields. Unknown event types are skipped.

Hashes: ints as published (already ``int.from_bytes(digest, "big") & (2**64-1)``); raw ``bytes`` (when
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``) -> their last 8 bytes, big-endian, the same value vLLM would publish.
"""

from __future__ import annotations

from kvstate.events.decoding import WireLayout, decode_payload
from kvstate.events.model import EventBatch

__all__ = ["LAYOUT", "decode_batch", "hash_from_bytes"]

STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


def hash_from_bytes(digest: bytes) -> int:
    """vLLM's ``maybe_convert_block_hash``: the last 8 bytes of the digest, big-endian, unsigned."""
    return int.from_bytes(digest[-8:], "big")


LAYOUT = WireLayout(
    engine="vLLM",
    stored_fields=STORED_FIELDS,
    removed_fields=REMOVED_FIELDS,
    rank_keys=("data_parallel_rank",),
    hash_from_bytes=hash_from_bytes,
)


def decode_batch(payload: bytes) -> EventBatch:
    """Decode a vLLM ``EventBatch`` payload (either generation). Raises ``EventDecodeError`` when malformed."""
    return decode_payload(payload, LAYOUT)
