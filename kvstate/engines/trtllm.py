"""TensorRT-LLM ``trtllm-serve``: Prometheus at ``/prometheus/metrics`` (prefix ``trtllm_``), ``/health``.

Source: ``tensorrt_llm/metrics/collector.py`` (engines.md 4.3). Its plain ``/metrics`` is a JSON list of iteration
stats that is DRAINED on every read, so the scraper does not poll it (it would steal the stats from anyone else,
Dynamo's publisher among them); ``load_from_iteration_stats`` reads such a body for whoever owns it (an engine
whose stats nobody else reads, older releases without the Prometheus page). KV events: ``POST /kv_cache_events``
(JSON, drained; ``kvstate.events.trtllm``), or vLLM-format batches over ZMQ in newer releases
(``kv_cache_config.kv_events_config``).

| constant | metric | type |
|---|---|---|
| RUNNING | ``trtllm_num_requests_running`` | gauge |
| WAITING | ``trtllm_num_requests_waiting`` | gauge |
| KV_USAGE | ``trtllm_kv_cache_utilization`` (0..1) | gauge |
| TOKENS_PER_BLOCK | ``trtllm_kv_cache_tokens_per_block`` | gauge |
| PROMPT_TOKENS | ``trtllm_prompt_tokens`` | counter |
| GENERATION_TOKENS | ``trtllm_generation_tokens`` | counter |
| TTFT | ``trtllm_time_to_first_token_seconds`` | histogram |
| QUEUE_TIME | ``trtllm_request_queue_time_seconds`` | histogram |
| TPOT | ``trtllm_time_per_output_token_seconds`` | histogram |
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kvstate.engines import dcgm
from kvstate.engines.base import EngineLoad, EngineSpec
from kvstate.engines.prom import MetricSamples

__all__ = ["KV_EVENTS_PATH", "SPEC", "load_from", "load_from_iteration_stats"]

KIND = "trtllm"
HEALTH_PATH = "/health"
METRICS_PATH = "/prometheus/metrics"
ITERATION_STATS_PATH = "/metrics"
"""JSON iteration stats, drained by every read."""
KV_EVENTS_PATH = "/kv_cache_events"
"""``POST``: the KV-cache events since the last call, drained (``kvstate.events.trtllm``)."""
DEFAULT_BLOCK_SIZE = 32

RUNNING = "trtllm_num_requests_running"
WAITING = "trtllm_num_requests_waiting"
KV_USAGE = "trtllm_kv_cache_utilization"
TOKENS_PER_BLOCK = "trtllm_kv_cache_tokens_per_block"
PROMPT_TOKENS = "trtllm_prompt_tokens"
GENERATION_TOKENS = "trtllm_generation_tokens"
TTFT = "trtllm_time_to_first_token_seconds"
QUEUE_TIME = "trtllm_request_queue_time_seconds"
TPOT = "trtllm_time_per_output_token_seconds"


def load_from(samples: MetricSamples) -> EngineLoad:
    ttft = samples.histogram(TTFT)
    queue = samples.histogram(QUEUE_TIME)
    tpot = samples.histogram(TPOT)
    tokens_per_block = samples.gauge_max(TOKENS_PER_BLOCK)
    return EngineLoad(
        running=samples.gauge_sum(RUNNING),
        waiting=samples.gauge_sum(WAITING),
        kv_usage=samples.gauge_max(KV_USAGE),
        prompt_tokens_total=samples.counter(PROMPT_TOKENS),
        generation_tokens_total=samples.counter(GENERATION_TOKENS),
        ttft_seconds_sum=None if ttft is None else ttft.sum,
        ttft_count=None if ttft is None else ttft.count,
        queue_seconds_sum=None if queue is None else queue.sum,
        finish_count=None if queue is None else queue.count,
        itl_seconds_sum=None if tpot is None else tpot.sum,
        itl_count=None if tpot is None else tpot.count,
        block_size=int(tokens_per_block) if tokens_per_block and tokens_per_block >= 1 else None,
        power_watts=dcgm.power_watts(samples),
        energy_joules=dcgm.energy_joules(samples),
    )


def load_from_iteration_stats(body: bytes | str) -> EngineLoad | None:
    """The newest entry of a ``/metrics`` JSON body as load; None for ``[]`` (no iteration since the last read).

    Waiting is ``numQueuedRequests + numPausedRequests`` and KV usage ``allocTotalBlocks / maxNumBlocks``, as
    Dynamo reads them (engines.md 4.3). Raises ``ValueError`` naming what is wrong with a body of another shape."""
    try:
        stats = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"TRT-LLM iteration stats are not JSON: {exc}") from exc
    if not isinstance(stats, list):
        raise ValueError(f"TRT-LLM iteration stats: expected a JSON list, got {type(stats).__name__}")
    if not stats:
        return None
    last = stats[-1]
    if not isinstance(last, Mapping):
        raise ValueError("TRT-LLM iteration stats: the last entry is not an object")
    kv = _object(last, "kvCacheStats")
    batching = _object(last, "inflightBatchingStats")
    max_blocks = _number(kv, "maxNumBlocks")
    alloc = _number(kv, "allocTotalBlocks")
    queued = _number(last, "numQueuedRequests")
    paused = _number(batching, "numPausedRequests")
    tokens_per_block = _number(kv, "tokensPerBlock")
    return EngineLoad(
        running=_number(last, "numActiveRequests"),
        waiting=None if queued is None else queued + (paused or 0.0),
        kv_usage=alloc / max_blocks if alloc is not None and max_blocks else None,
        block_size=int(tokens_per_block) if tokens_per_block and tokens_per_block >= 1 else None,
    )


def _object(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _number(obj: Mapping[str, Any], key: str) -> float | None:
    value = obj.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


SPEC = EngineSpec(
    kind=KIND,
    health_path=HEALTH_PATH,
    metrics_path=METRICS_PATH,
    load_from=load_from,
    known_metrics=frozenset({RUNNING, WAITING, KV_USAGE, PROMPT_TOKENS}),
    publishes_kv_events=True,
    default_block_size=DEFAULT_BLOCK_SIZE,
)
