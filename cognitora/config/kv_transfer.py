"""The ``kv_tiers`` and ``disaggregation`` sections: what moving KV costs, in seconds. A prefix held off the GPU
is loaded back over a host or disk link; a prefill/decode pair's KV crosses the link between its engines.
"""

from __future__ import annotations

from pydantic import Field

from cognitora.config.strict import StrictModel

__all__ = ["DisaggregationConfig", "KvTiersConfig"]


class KvTiersConfig(StrictModel):
    """What reusing a prefix held off the GPU costs: engines that offload KV to host memory or disk (vLLM's CPU
    offloading, LMCache) report those blocks with their ``medium``; placement counts them as cached and adds the
    time to load them back, in seconds (docs/tiers.md)."""

    kv_bytes_per_token: int = Field(default=131_072, gt=0)
    """KV-cache bytes of one token (all layers, K and V): ``2 x layers x kv_heads x head_dim x dtype bytes``.
    Default: Llama-3.1-8B in BF16 (2 x 32 x 8 x 128 x 2 bytes = 128 KiB)."""
    cpu_gb_per_s: float = Field(default=25.0, gt=0)
    """Host memory to GPU bandwidth (GB/s) a reload achieves; default: about 40% of PCIe 5.0 x16's 64 GB/s."""
    disk_gb_per_s: float = Field(default=3.0, gt=0)
    """Disk (or remote store) to GPU bandwidth (GB/s) a reload achieves; default: one NVMe SSD's sequential read."""


class DisaggregationConfig(StrictModel):
    """Prefill/decode disaggregation: how a pair's KV transfer is priced (docs/disaggregation.md). Used only by
    models with ``role: prefill`` endpoints; their ``role: decode`` endpoints are addressed at their
    ``cognitora pd-sidecar``."""

    link_gbps: float = Field(default=100.0, gt=0)
    """Bandwidth of the link a pair's KV crosses, gigabits per second (RDMA NIC, NVLink, or TCP)."""
    link_latency_s: float = Field(default=0.001, ge=0)
    """Fixed cost of one KV transfer (seconds): the handshake and the first bytes, whatever the size."""
    kv_bytes_per_token: int = Field(default=131072, gt=0)
    """KV bytes per token for a model that does not set ``models[].kv_bytes_per_token`` (Llama-3-8B, bf16)."""
    min_gain_s: float = Field(default=0.0, ge=0)
    """A pair is placed only when its predicted TTFT beats the best whole placement by more than this (seconds):
    a split costs two engines' capacity for one request."""
    whole_on_decode: bool = True
    """Decode endpoints may take a request whole (their sidecar prefills locally) when that is predicted faster.
    False keeps their batches for decoding (classic P/D): every request is split while a prefill endpoint is up,
    unless a ``role: both`` endpoint is faster."""
