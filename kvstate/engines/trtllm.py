"""TensorRT-LLM ``trtllm-serve``: Prometheus at ``/prometheus/metrics`` (prefix ``trtllm_``), ``/health``.

Source: ``tensorrt_llm/metrics/collector.py`` (engines.md 4.3). Its plain ``/metrics`` is a JSON list of iteration
stats that is DRAINED on every read, so a scraper must not touch it (it would steal the stats from anyone else).
Newer releases publish vLLM-format KV events over ZMQ (``kv_cache_config.kv_events_config``).

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

from kvstate.engines import dcgm
from kvstate.engines.base import EngineLoad, EngineSpec
from kvstate.engines.prom import MetricSamples

KIND = "trtllm"
HEALTH_PATH = "/health"
METRICS_PATH = "/prometheus/metrics"
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
        itl_seconds_sum=None if tpot is None else tpot.sum,
        itl_count=None if tpot is None else tpot.count,
        block_size=int(tokens_per_block) if tokens_per_block and tokens_per_block >= 1 else None,
        power_watts=dcgm.power_watts(samples),
        energy_joules=dcgm.energy_joules(samples),
    )


SPEC = EngineSpec(
    kind=KIND,
    health_path=HEALTH_PATH,
    metrics_path=METRICS_PATH,
    load_from=load_from,
    known_metrics=frozenset({RUNNING, WAITING, KV_USAGE, PROMPT_TOKENS}),
    publishes_kv_events=True,
    default_block_size=DEFAULT_BLOCK_SIZE,
)
