"""TRT-LLM's KV-cache event buffer, as ``trtllm-serve`` serves it at ``POST /kv_cache_events`` (pull, drained).

Wire format (engines.md 4.3; ``tensorrt_llm/_utils.py`` ``KVCacheEventSerializer``): a JSON list of
``{"event_id", "data", "window_size"}``, ``data`` one of ``created`` (once, when the cache exists),
``stored`` (``parent_hash`` and ``blocks`` of ``stored_block`` with ``unique_token`` tokens, ``cache_level``,
``priority``), ``removed`` (``block_hashes``) and ``updated`` (a block moving between cache levels, as an
``event_diff``). A call returns what happened since the previous one; a second call returns ``[]`` until the engine
runs again. The buffer holds ``max_size`` events, oldest dropped first (``event_buffer_max_size``).

The simulated engine's cache speaks vLLM's events (``cognitora_sim.kv_cache``); this module re-tells them as
TRT-LLM would: a block offloaded to host memory is an ``updated`` cache level 0 -> 1 (the block keeps its id),
not a store plus a removal. Block ids are the simulator's own 64-bit numbers, opaque like TRT-LLM's
(``v1_block_key``): a reader must recompute keys from the tokens, as it must for the real engine. There is no
"cleared" event in TRT-LLM's vocabulary: a reset is told as the removal of every block it dropped.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

from cognitora_sim.kv_cache import MEDIUM_CPU, AllBlocksCleared, BlockRemoved, BlockStored, CacheEvent

GPU_LEVEL = 0
CPU_LEVEL = 1
DEFAULT_MAX_SIZE = 10_000
PRIORITY = 35
"""TRT-LLM's default retention priority of a block."""


class TrtllmEventBuffer:
    """One engine's ``/kv_cache_events`` buffer."""

    def __init__(self, num_blocks: int, cpu_blocks: int, window_size: int, max_size: int = DEFAULT_MAX_SIZE) -> None:
        self.window_size = window_size
        self._events: deque[dict[str, Any]] = deque(maxlen=max_size)
        self._ids = itertools.count()
        self._cached: set[int] = set()
        """Hashes the engine holds (any level): what a reset removes."""
        self._append({"type": "created", "num_blocks_per_cache_level": [num_blocks, cpu_blocks]})

    def add(self, events: list[CacheEvent]) -> None:
        """Re-tell one step's cache events."""
        offloaded: set[int] = set()
        for event in events:
            if isinstance(event, BlockStored) and event.medium == MEDIUM_CPU:
                for h in event.block_hashes:
                    offloaded.add(h)
                    self._append(_level_change(h, GPU_LEVEL, CPU_LEVEL))
            elif isinstance(event, BlockStored):
                self._stored(event)
            elif isinstance(event, BlockRemoved):
                # vLLM's GPU removal of a block it just offloaded is TRT-LLM's level change, already told.
                gone = [h for h in event.block_hashes if event.medium == MEDIUM_CPU or h not in offloaded]
                if gone:
                    self._cached.difference_update(gone)
                    self._append({"type": "removed", "block_hashes": gone})
            elif isinstance(event, AllBlocksCleared) and self._cached:
                self._append({"type": "removed", "block_hashes": sorted(self._cached)})
                self._cached.clear()

    def _stored(self, event: BlockStored) -> None:
        size = event.block_size
        blocks = []
        for i, h in enumerate(event.block_hashes):
            tokens = event.token_ids[i * size : (i + 1) * size]
            blocks.append(
                {
                    "type": "stored_block",
                    "block_hash": h,
                    "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in tokens],
                    "lora_id": None,
                    "cache_level": GPU_LEVEL,
                    "priority": PRIORITY,
                }
            )
            self._cached.add(h)
        self._append({"type": "stored", "parent_hash": event.parent_block_hash, "blocks": blocks})

    def _append(self, data: dict[str, Any]) -> None:
        self._events.append({"event_id": next(self._ids), "data": data, "window_size": self.window_size})

    def drain(self) -> list[dict[str, Any]]:
        """What ``POST /kv_cache_events`` answers: every buffered event, oldest first; the buffer is then empty."""
        out = list(self._events)
        self._events.clear()
        return out


def _level_change(block_hash: int, old: int, new: int) -> dict[str, Any]:
    return {
        "type": "updated",
        "block_hash": block_hash,
        "cache_level": {"type": "event_diff", "new_value": new, "old_value": old},
        "priority": None,
    }
