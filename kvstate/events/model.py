"""Engine-neutral KV events: what the wire decoders (``vllm``, ``sglang``) produce and the ingestor consumes.

Block hashes here are the ENGINE's hashes, normalised to unsigned 64-bit ints by the decoder. They are only ever
compared with other hashes from the same endpoint (parent links, removals); the store is keyed by our own keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstate.store import Tier

__all__ = [
    "MASK64",
    "MEDIUM_TIERS",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EngineHash",
    "EventBatch",
    "EventDecodeError",
    "KVEvent",
    "tier_of_medium",
]

EngineHash = int
"""An engine's block hash, normalised to an unsigned 64-bit int."""

MASK64 = (1 << 64) - 1

MEDIUM_TIERS: dict[str, Tier] = {
    "GPU": Tier.GPU,
    "CPU": Tier.CPU,
    "CPU_PINNED": Tier.CPU,
    "DISK": Tier.DISK,
    "STORAGE": Tier.DISK,
    "EXTERNAL": Tier.DISK,
}
"""Engine ``medium`` strings (vLLM, SGLang ``StorageMedium``) -> our tiers. Matched case-insensitively."""


def tier_of_medium(medium: str | None) -> Tier:
    """The tier a ``medium`` names. None means the GPU prefix cache (events from before ``medium`` existed).

    An unknown medium (a connector we have not seen) counts as DISK: the block is held somewhere off the GPU, and
    DISK is the tier whose reuse we value least, so we never overstate what it saves.
    """
    if medium is None:
        return Tier.GPU
    return MEDIUM_TIERS.get(medium.upper(), Tier.DISK)


class EventDecodeError(ValueError):
    """A payload that is not a KV-event batch of the expected engine format. The message says what was wrong."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """The engine now holds ``block_hashes`` (in order), which continue the chain after ``parent_block_hash``.

    ``token_ids`` are the tokens of exactly these blocks (``len(block_hashes) * block_size`` of them), or empty
    when the event only announces a copy to another tier (CPU offload) of blocks announced before.
    """

    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_name: str | None
    medium: str | None

    @property
    def tier(self) -> Tier:
        return tier_of_medium(self.medium)


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """The engine evicted ``block_hashes`` from ``medium``."""

    block_hashes: tuple[EngineHash, ...]
    medium: str | None

    @property
    def tier(self) -> Tier:
        return tier_of_medium(self.medium)


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (reset, weight sync, startup in SGLang)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One published message: the events of one engine step, in the order the engine produced them."""

    ts: float
    events: tuple[KVEvent, ...]
    dp_rank: int | None
