"""TensorRT-LLM KV-cache events: the JSON body of ``POST /kv_cache_events`` -> ``EventBatch``.

Source: ``tensorrt_llm/_utils.py`` ``KVCacheEventSerializer`` and ``examples/llm-api/llm_inference_kv_events.py``
(``shared/reference/engines.md`` section 4.3). It is a pull model: each call drains the engine's buffer (enabled
with ``kv_cache_config: {enable_block_reuse: true, event_buffer_max_size: N}``) and returns a JSON list of

    {"event_id": int, "data": {...}, "window_size": int, ["attention_dp_rank": int]}

where ``data`` is one of

- ``{"type": "created", "num_blocks_per_cache_level": [...]}``: a new, empty cache (the engine started or
  restarted): ``AllBlocksCleared``, so what an earlier process held is forgotten;
- ``{"type": "stored", "parent_hash": h|null, "blocks": [{"type": "stored_block", "block_hash": h,
  "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": x}, ...], "cache_level": l,
  "priority": p}, ...]}``;
- ``{"type": "removed", "block_hashes": [h, ...]}``;
- ``{"type": "updated", "block_hash": h, "cache_level": {"type": "event_diff", "new_value": l, "old_value": l},
  "priority": {...}}``: a block moved between cache levels (0 is the GPU pool, 1 the secondary host-memory pool).

Block hashes are TRT-LLM's own ("v1_block_key"; not vLLM's), compared only with this endpoint's own hashes, like
every engine hash here: they are masked to unsigned 64 bits. Keys are recomputed from the tokens, as for vLLM.
A block's ``cache_level`` becomes the ``medium`` ``GPU`` (0) or ``CPU`` (1, host memory); a removal names no level,
so it removes the block from every tier (``medium`` None is GPU: the primary pool, where TRT-LLM evicts from).
Newer releases can instead push vLLM-format batches over ZMQ (``kv_events_config``): those decode with
``kvstate.events.vllm``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvstate.events.model import (
    MASK64,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventDecodeError,
    KVEvent,
)

__all__ = ["decode_events"]

CACHE_LEVEL_MEDIUM = {0: "GPU", 1: "CPU"}
"""TRT-LLM cache levels -> ``medium`` strings (``kvstate.events.model.MEDIUM_TIERS``)."""


def decode_events(body: bytes | str) -> EventBatch:
    """One drained response. Raises ``EventDecodeError`` saying what was wrong; unknown event types are skipped."""
    try:
        raw = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EventDecodeError(f"TRT-LLM /kv_cache_events: not JSON ({exc})") from exc
    if not isinstance(raw, list):
        raise EventDecodeError(f"TRT-LLM /kv_cache_events: expected a JSON list, got {type(raw).__name__}")
    events: list[KVEvent] = []
    dp_rank: int | None = None
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("data"), Mapping):
            raise EventDecodeError(f"TRT-LLM /kv_cache_events: entry {i} has no 'data' object")
        rank = entry.get("attention_dp_rank")
        if isinstance(rank, int):
            dp_rank = rank
        events.extend(_event(entry["data"], i))
    return EventBatch(ts=0.0, events=tuple(events), dp_rank=dp_rank)


def _event(data: Mapping[str, Any], i: int) -> list[KVEvent]:
    kind = data.get("type")
    if kind == "stored":
        return _stored(data, i)
    if kind == "removed":
        return [BlockRemoved(block_hashes=tuple(_hash(h, i) for h in _list(data, "block_hashes", i)), medium=None)]
    if kind == "updated":
        return _updated(data, i)
    if kind in ("created", "cleared"):
        return [AllBlocksCleared()]
    return []  # anything newer


def _stored(data: Mapping[str, Any], i: int) -> list[KVEvent]:
    parent_raw = data.get("parent_hash")
    parent = None if parent_raw is None else _hash(parent_raw, i)
    out: list[KVEvent] = []
    # One BlockStored per run of blocks on the same cache level, each continuing the chain of the one before.
    run: list[tuple[int, list[int]]] = []
    run_level: int | None = None
    for block in _list(data, "blocks", i):
        if not isinstance(block, Mapping):
            raise EventDecodeError(f"TRT-LLM /kv_cache_events: entry {i}: a block is not an object")
        level = block.get("cache_level", 0)
        if not isinstance(level, int):
            raise EventDecodeError(f"TRT-LLM /kv_cache_events: entry {i}: cache_level {level!r} is not an int")
        tokens = [_token(t, i) for t in _list(block, "tokens", i)]
        if run and (level != run_level or len(tokens) != len(run[0][1])):
            out.append(_run(run, parent, run_level))
            parent = run[-1][0]
            run = []
        run.append((_hash(block.get("block_hash"), i), tokens))
        run_level = level
    if run:
        out.append(_run(run, parent, run_level))
    return out


def _run(run: list[tuple[int, list[int]]], parent: int | None, level: int | None) -> BlockStored:
    return BlockStored(
        block_hashes=tuple(h for h, _ in run),
        parent_block_hash=parent,
        token_ids=tuple(t for _, tokens in run for t in tokens),
        block_size=len(run[0][1]),
        lora_name=None,
        medium=CACHE_LEVEL_MEDIUM.get(level or 0, "DISK"),
    )


def _updated(data: Mapping[str, Any], i: int) -> list[KVEvent]:
    diff = data.get("cache_level")
    if not isinstance(diff, Mapping):
        return []  # a priority update: where the block is did not change
    h = _hash(data.get("block_hash"), i)
    old, new = diff.get("old_value"), diff.get("new_value")
    if not isinstance(old, int) or not isinstance(new, int) or old == new:
        return []
    # The block keeps its identity: a token-less store in the new tier, a removal from the old one.
    return [
        BlockStored((h,), None, (), 0, None, CACHE_LEVEL_MEDIUM.get(new, "DISK")),
        BlockRemoved((h,), CACHE_LEVEL_MEDIUM.get(old, "DISK")),
    ]


def _list(obj: Mapping[str, Any], key: str, i: int) -> list[Any]:
    value = obj.get(key)
    if not isinstance(value, list):
        raise EventDecodeError(f"TRT-LLM /kv_cache_events: entry {i}: {key!r} is not a list")
    return value


def _token(raw: Any, i: int) -> int:
    if isinstance(raw, Mapping) and isinstance(raw.get("token_id"), int):
        return int(raw["token_id"])
    raise EventDecodeError(f"TRT-LLM /kv_cache_events: entry {i}: a token is not {{'token_id': int}}: {raw!r}")


def _hash(raw: Any, i: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise EventDecodeError(f"TRT-LLM /kv_cache_events: entry {i}: block hash {raw!r} is not an integer")
    return raw & MASK64
