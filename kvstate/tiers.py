"""Storage tiers and what reusing a block from each is worth: shared by the ``Store`` protocol and both backends.

A leaf (it imports nothing of ``kvstate``), so ``memory_store`` and ``redis_store`` weigh tiers the same way without
importing each other or the module that opens them (``kvstate.open``).
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["DEFAULT_TIER_WEIGHTS", "SPECULATIVE_WEIGHT", "Tier", "mask_weights", "tier_bit"]


class Tier(IntEnum):
    """Where an engine holds a block. Lower is faster to reuse."""

    GPU = 0
    CPU = 1
    DISK = 2


DEFAULT_TIER_WEIGHTS: dict[Tier, float] = {Tier.GPU: 1.0, Tier.CPU: 0.8, Tier.DISK: 0.5}
"""Share of a cached block's prefill saved when reused from each tier (reloading CPU/disk KV is not free)."""

SPECULATIVE_WEIGHT = 1.0
"""Weight of a speculative entry: a block we just routed there, whose BlockStored event has not arrived yet."""


def tier_bit(tier: Tier) -> int:
    """The tier's bit in a tier bitmask (a block held in several tiers at once sets several)."""
    return 1 << int(tier)


def mask_weights(tier_weights: dict[Tier, float] | None) -> list[float]:
    """Weight of each tier bitmask 0..7: the best (largest) weight among the tiers it holds."""
    weights = {**DEFAULT_TIER_WEIGHTS, **(tier_weights or {})}
    out = [0.0] * 8
    for mask in range(1, 8):
        out[mask] = max(weights[t] for t in Tier if mask & tier_bit(t))
    return out
