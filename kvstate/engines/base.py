"""What every engine module provides: an ``EngineSpec``, and the normalized ``EngineLoad`` it reads from /metrics.

Field meanings are engine-independent; each engine module maps its own metric names onto them. ``None`` means the
engine does not expose the quantity (never "zero"), so the scraper can fall back instead of learning nonsense.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvstate.engines.prom import MetricSamples

__all__ = ["EngineLoad", "EngineSpec", "accepts_2xx", "int_label", "no_metrics"]


@dataclass(frozen=True)
class EngineLoad:
    """One scrape of one engine, normalized. Cumulative fields (``*_total``, ``*_sum``, ``*_count``) are counters."""

    running: float | None = None
    """Requests in the running batch."""
    waiting: float | None = None
    """Requests queued, not yet scheduled."""
    kv_usage: float | None = None
    """0..1 share of the KV cache in use (the fullest data-parallel rank when there are several)."""
    prompt_tokens_total: float | None = None
    """All prompt tokens processed, cached ones included."""
    generation_tokens_total: float | None = None
    prefix_cache_hits_total: float | None = None
    """Prompt tokens served from the prefix cache."""
    prefix_cache_queries_total: float | None = None
    """Prompt tokens looked up in the prefix cache."""
    ttft_seconds_sum: float | None = None
    """Sum of time-to-first-token observations (includes queueing on every engine that exposes it)."""
    ttft_count: float | None = None
    queue_seconds_sum: float | None = None
    """Sum of per-request queueing time, when exposed: subtracted from TTFT to approximate busy prefill time."""
    prefill_seconds_sum: float | None = None
    """Sum of per-request time spent in prefill, when the engine measures it directly."""
    finished_prompt_tokens_sum: float | None = None
    """Prompt tokens (cached included) of the requests that finished: vLLM's ``request_prompt_tokens`` histogram,
    observed at finish like its prefill time, so the two cover the same requests."""
    finish_count: float | None = None
    """Requests counted by the figures the engine observes when a request FINISHES, where some of what the prefill
    rate divides is counted then and the rest at the first token (``kvstate.rates.finish_observed``): vLLM's
    prefill-time (else queue-time) histogram count, TRT-LLM's queue-time count, SGLang's finished requests (its
    token counters). None: everything the rate uses is counted at the first token (llama.cpp)."""
    itl_seconds_sum: float | None = None
    """Sum of inter-token latencies (or per-request time per output token)."""
    itl_count: float | None = None
    requests_finished_total: float | None = None
    """Requests the engine completed (vLLM ``request_success``, every finish reason): departures from its batch."""
    service_seconds_sum: float | None = None
    """Sum of per-request time spent holding a batch slot (scheduled to finished, queueing excluded; vLLM
    ``request_inference_time_seconds``): with ``service_count``, the mean service time of Little's law."""
    service_count: float | None = None
    block_size: int | None = None
    """Tokens per KV block, from the engine's cache config."""
    kv_blocks: int | None = None
    """KV blocks the engine's cache holds (vLLM ``num_gpu_blocks``, SGLang ``num_pages``), from its cache config."""
    power_watts: float | None = None
    """Current draw of the engine's accelerators (DCGM ``DCGM_FI_DEV_POWER_USAGE``, summed over GPUs)."""
    energy_joules: float | None = None
    """Cumulative energy (DCGM ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, mJ converted to J, summed over GPUs)."""
    clock_rate: float | None = None
    """Engine seconds per wall second, as the engine declares it (``kvstate.engines.declared_clock``: only the
    time-scaled simulator does; a real engine's clock is the gateway's, and the scraper learns it otherwise)."""


def accepts_2xx(status: int) -> bool:
    return 200 <= status < 300


@dataclass(frozen=True)
class EngineSpec:
    """One engine kind, as the scraper and the collector need to know it."""

    kind: str
    """The name used in configuration (``engine: vllm``)."""
    health_path: str
    """GET path that tells whether the engine serves requests."""
    metrics_path: str | None
    """GET path of Prometheus text metrics; None when the engine exposes none (load then comes from the router)."""
    load_from: Callable[[MetricSamples], EngineLoad]
    """Metric samples -> normalized load (every field the engine does not expose stays None)."""
    known_metrics: frozenset[str]
    """Metric names this engine is read by: a scrape that parses but contains none of them is reported."""
    healthy_status: Callable[[int], bool] = accepts_2xx
    """Whether a health-check HTTP status means "up"."""
    publishes_kv_events: bool = False
    """Whether the engine can publish KV-cache events (vLLM-format ZMQ) for the collector to subscribe to."""
    default_block_size: int | None = None
    """Tokens per KV block when the engine does not report it."""
    slots_path: str | None = None
    """GET path of a per-slot state page (llama.cpp ``/slots``), polled beside the metrics (``kvstate.slots``)."""

    def recognizes(self, samples: MetricSamples) -> bool:
        """True when ``samples`` contains at least one of this engine's metrics (with or without ``_total``)."""
        names = samples.names()
        return any(name in names or name + "_total" in names or name + "_sum" in names for name in self.known_metrics)


def no_metrics(samples: MetricSamples) -> EngineLoad:
    """``load_from`` of engines without /metrics: nothing is known from scraping."""
    return EngineLoad()


def int_label(samples: MetricSamples, name: str, label: str) -> int | None:
    """An integer carried as a label of an info-style gauge (``block_size="16"``); None when absent or malformed."""
    raw = samples.label(name, label)
    if raw is None:
        return None
    try:
        value = int(float(raw))
    except ValueError:
        return None
    return value if value > 0 else None
