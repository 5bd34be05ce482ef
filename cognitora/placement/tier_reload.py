"""Reusing a prefix held off the GPU, priced in seconds: how much of it is cached, and how long loading it back takes.

Engines with KV offloading (vLLM's CPU OffloadingConnector, LMCache) announce blocks in host memory or on disk with
their ``medium``; the store keeps each block's tiers and a match says how many of its blocks are held only in CPU
memory or only on disk (``PrefixMatch.cpu_blocks``/``disk_blocks``). Such a block is not recomputed: the engine
loads it back, which takes

    reload_s = cpu_blocks x tokens_per_block x kv_bytes_per_token / cpu_bandwidth
             + disk_blocks x tokens_per_block x kv_bytes_per_token / disk_bandwidth

so it counts as cached (weight 1, not the store's tier weight) and its reload time is added to the predicted TTFT.
Whether a reload beats recomputing then depends on the engine: 1,000 tokens of an 8B model (131 MB) load in 5 ms
from host memory at 25 GB/s or 44 ms from an NVMe disk at 3 GB/s, and recompute in 33 ms on an H100 but ~0.8 s on
a Mac. A fixed weight could not say both.
"""

from __future__ import annotations

from cognitora.config import KvTiersConfig
from kvstate.store import DEFAULT_TIER_WEIGHTS, PrefixMatch, Tier

__all__ = ["priced_prefix"]

GB = 1e9


def priced_prefix(
    match: PrefixMatch | None, prompt_tokens: int, tokens_per_key: int, tiers: KvTiersConfig | None
) -> tuple[float, float]:
    """(cached tokens, reload seconds) of ``match`` for a prompt of ``prompt_tokens``.

    Without ``tiers``, the store's tier weights stand (off-GPU blocks count part-cached, no reload time)."""
    if match is None:
        return 0.0, 0.0
    weighted = match.weighted_blocks
    off_gpu = match.cpu_blocks + match.disk_blocks
    if tiers is None or off_gpu == 0:
        return min(float(prompt_tokens), weighted * tokens_per_key), 0.0
    # The store discounted these blocks by their tier weight; their cost is the reload below instead.
    weighted += match.cpu_blocks * (1.0 - DEFAULT_TIER_WEIGHTS[Tier.CPU])
    weighted += match.disk_blocks * (1.0 - DEFAULT_TIER_WEIGHTS[Tier.DISK])
    held = weighted * tokens_per_key
    cached = min(float(prompt_tokens), held)
    share = cached / held if held > 0 else 0.0  # a prompt shorter than the held prefix reloads only its own part
    token_bytes = tokens_per_key * tiers.kv_bytes_per_token * share
    reload_s = match.cpu_blocks * token_bytes / (tiers.cpu_gb_per_s * GB) + match.disk_blocks * token_bytes / (
        tiers.disk_gb_per_s * GB
    )
    return cached, reload_s
