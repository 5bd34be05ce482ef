"""Engine KV-cache event ingestion, in three steps kept apart:

1. transport, ``subscriber``: ZMQ SUB per engine endpoint, sequence tracking, replay over DEALER, purge on doubt;
2. parsing, ``vllm`` / ``sglang``: msgpack payload -> ``EventBatch`` of frozen events (``model``);
3. applying state, ``ingest``: events -> the ``Store``, in our own block keys.

See ``docs/events.md``.
"""

from kvstate.events.ingest import ApplyResult, EventIngestor, IngestStats
from kvstate.events.model import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventDecodeError,
    KVEvent,
    tier_of_medium,
)
from kvstate.events.subscriber import KVEventSubscriber, SubscriberStats

__all__ = [
    "AllBlocksCleared",
    "ApplyResult",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "EventDecodeError",
    "EventIngestor",
    "IngestStats",
    "KVEvent",
    "KVEventSubscriber",
    "SubscriberStats",
    "tier_of_medium",
]
