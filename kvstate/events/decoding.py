"""The msgpack KV-event grammar vLLM and SGLang share; each engine module supplies a ``WireLayout``.

Both engines publish an envelope ``[ts, events, rank]`` (or, defensively, a map) whose events are either tagged
positional arrays (``["BlockStored", ...]``, older releases) or tagged maps (``{"type": "BlockStored", ...}``).
Decoding is lenient where engines evolve (missing optional fields, extra trailing fields, unknown keys, unknown
event types) and strict where a wrong value would corrupt the index (hashes, token ids, block size): those raise
``EventDecodeError``. No other exception escapes ``decode_payload``.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from kvstate.events.model import (
    MASK64,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineHash,
    EventBatch,
    EventDecodeError,
    KVEvent,
)

__all__ = ["WireLayout", "decode_payload"]


@dataclass(frozen=True)
class WireLayout:
    """What differs between engines: legacy array positions, the envelope's rank key, how bytes hashes read."""

    engine: str
    stored_fields: tuple[str, ...]
    """Field names of a legacy ``BlockStored`` array, positions 1.. (position 0 is the tag)."""
    removed_fields: tuple[str, ...]
    """Field names of a legacy ``BlockRemoved`` array, positions 1.."""
    rank_keys: tuple[str, ...]
    """Keys of the rank in a map envelope, first found wins."""
    hash_from_bytes: Callable[[bytes], int]
    """An engine's raw ``bytes`` hash -> the same unsigned 64-bit value the engine would publish as an int."""


def decode_payload(payload: bytes, layout: WireLayout) -> EventBatch:
    """Decode one msgpack ``EventBatch`` payload. Raises ``EventDecodeError`` (only) when it is not one."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=False)
    except Exception as exc:  # msgpack raises several unrelated types (ExtraData, FormatError, ValueError, ...)
        raise EventDecodeError(
            f"{layout.engine} event payload is not valid msgpack ({type(exc).__name__}: {exc})"
        ) from exc
    try:
        return _batch(raw, layout)
    except EventDecodeError:
        raise
    except (TypeError, ValueError, OverflowError, AttributeError, IndexError, KeyError) as exc:
        raise EventDecodeError(f"{layout.engine} event batch is malformed: {exc}") from exc


def _batch(raw: Any, layout: WireLayout) -> EventBatch:
    if isinstance(raw, Mapping):
        missing = [k for k in ("ts", "events") if k not in raw]
        if missing:
            raise EventDecodeError(f"{layout.engine} map event batch lacks {missing}; keys: {sorted(map(str, raw))}")
        ts, events = raw["ts"], raw["events"]
        rank = next((raw[k] for k in layout.rank_keys if k in raw), None)
    elif isinstance(raw, tuple) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise EventDecodeError(
            f"{layout.engine} event batch must be [ts, events, rank] or a map with ts/events, got {_show(raw)}"
        )
    if type(ts) not in (float, int):
        raise EventDecodeError(f"{layout.engine} event batch ts must be a number, got {_show(ts)}")
    if not isinstance(events, tuple):
        raise EventDecodeError(f"{layout.engine} event batch events must be an array, got {_show(events)}")
    if rank is not None and type(rank) is not int:
        raise EventDecodeError(f"{layout.engine} event batch rank must be an int or nil, got {_show(rank)}")
    decoded: list[KVEvent] = []
    for i, raw_event in enumerate(events):
        event = _event(raw_event, layout, i)
        if event is not None:
            decoded.append(event)
    return EventBatch(ts=float(ts), events=tuple(decoded), dp_rank=rank)


def _event(raw: Any, layout: WireLayout, index: int) -> KVEvent | None:
    """One event, or None for an event type we do not use (engines add types; that is not an error)."""
    fields: Mapping[str, Any]
    if isinstance(raw, Mapping):
        tag = raw.get("type")
        fields = raw
    elif isinstance(raw, tuple) and raw:
        tag = raw[0]
        names = layout.stored_fields if tag == "BlockStored" else layout.removed_fields if tag == "BlockRemoved" else ()
        # zip stops at the shorter: missing trailing fields stay absent, extra trailing ones are ignored.
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise EventDecodeError(f"{layout.engine} event #{index} must be a tagged array or map, got {_show(raw)}")
    if tag == "BlockStored":
        return _stored(fields, layout, index)
    if tag == "BlockRemoved":
        return BlockRemoved(
            block_hashes=_hashes(fields.get("block_hashes"), layout, index),
            medium=_opt_str(fields.get("medium"), "medium", layout, index),
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if isinstance(tag, str):
        return None
    raise EventDecodeError(f"{layout.engine} event #{index} has no string type tag, got {_show(tag)}")


def _stored(fields: Mapping[str, Any], layout: WireLayout, index: int) -> BlockStored:
    hashes = _hashes(fields.get("block_hashes"), layout, index)
    parent_raw = fields.get("parent_block_hash")
    parent = None if parent_raw is None else _hash(parent_raw, layout, index)
    tokens = fields.get("token_ids")
    if tokens is None:
        tokens = ()
    if not isinstance(tokens, tuple):
        raise EventDecodeError(f"{layout.engine} BlockStored #{index} token_ids must be an array, got {_show(tokens)}")
    try:
        array("I", tokens)  # the C loop both type-checks and range-checks: uint32 is what keys are built from
    except (TypeError, OverflowError) as exc:
        raise EventDecodeError(
            f"{layout.engine} BlockStored #{index} token_ids must be token ids (0 <= id < 2**32): {exc}"
        ) from exc
    block_size = fields.get("block_size")
    if block_size is None and not tokens:
        block_size = 0  # a tier-copy event without tokens does not need a block size
    if type(block_size) is not int or (tokens and block_size <= 0):
        raise EventDecodeError(
            f"{layout.engine} BlockStored #{index} block_size must be a positive int, got {_show(block_size)}"
        )
    lora_name = _opt_str(fields.get("lora_name"), "lora_name", layout, index)
    lora_id = fields.get("lora_id")
    if lora_name is None and lora_id is not None:
        # Releases before lora_name published only the adapter's numeric id. A name no request can produce keeps
        # these blocks apart from the base model's (the engine never shares them) without guessing the adapter.
        lora_name = f"<lora-id:{lora_id}>"
    return BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=block_size,
        lora_name=lora_name,
        medium=_opt_str(fields.get("medium"), "medium", layout, index),
    )


def _hashes(raw: Any, layout: WireLayout, index: int) -> tuple[EngineHash, ...]:
    if not isinstance(raw, tuple):
        raise EventDecodeError(f"{layout.engine} event #{index} block_hashes must be an array, got {_show(raw)}")
    try:
        array("Q", raw)  # the usual case, checked in C: all unsigned 64-bit ints, nothing to normalise
    except (TypeError, OverflowError):
        return tuple(_hash(h, layout, index) for h in raw)
    return raw


def _hash(raw: Any, layout: WireLayout, index: int) -> EngineHash:
    if type(raw) is int:
        return raw & MASK64  # signed (SGLang) and unsigned (vLLM) 64-bit ints share one representation
    if isinstance(raw, bytes) and raw:
        return layout.hash_from_bytes(raw) & MASK64
    raise EventDecodeError(f"{layout.engine} event #{index} block hash must be an int or bytes, got {_show(raw)}")


def _opt_str(raw: Any, name: str, layout: WireLayout, index: int) -> str | None:
    if raw is None or isinstance(raw, str):
        return raw
    raise EventDecodeError(f"{layout.engine} event #{index} {name} must be a string or nil, got {_show(raw)}")


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"
