"""vLLM (``vllm serve``): Prometheus ``/metrics``, ``/health``, KV events over ZMQ.

Source: ``vllm/v1/metrics/loggers.py`` (engines.md 4.1). Labels: ``model_name`` and ``engine`` (data-parallel
rank); series are summed over ranks, except KV usage (the fullest rank). Counters are declared here without
``_total``, as vLLM declares them; lookups accept both spellings. The per-request histograms (queue, prefill,
inference time) are observed when a request finishes; TTFT and the token counters at its first
token (``kvstate.rates.finish_observed``).

| constant | metric | type |
|---|---|---|
| RUNNING | ``vllm:num_requests_running`` | gauge |
| WAITING | ``vllm:num_requests_waiting`` | gauge |
| KV_USAGE | ``vllm:kv_cache_usage_perc`` (0..1; ``vllm:gpu_cache_usage_perc`` before ~v0.11) | gauge |
| PROMPT_TOKENS | ``vllm:prompt_tokens`` | counter |
| GENERATION_TOKENS | ``vllm:generation_tokens`` | counter |
| PREFIX_CACHE_HITS / QUERIES | ``vllm:prefix_cache_hits`` / ``_queries`` (tokens; older: ``gpu_``...) | counter |
| TTFT | ``vllm:time_to_first_token_seconds`` | histogram |
| QUEUE_TIME | ``vllm:request_queue_time_seconds`` | histogram |
| PREFILL_TIME | ``vllm:request_prefill_time_seconds`` | histogram |
| ITL | ``vllm:inter_token_latency_seconds`` (``vllm:time_per_output_token_seconds`` when older) | histogram |
| REQUEST_SUCCESS | ``vllm:request_success`` (labelled by ``finished_reason``; summed) | counter |
| INFERENCE_TIME | ``vllm:request_inference_time_seconds`` (scheduled to finished: time in a slot) | histogram |
| REQUEST_PROMPT_TOKENS | ``vllm:request_prompt_tokens`` (per finished request, cached included) | histogram |
| CACHE_CONFIG_INFO | ``vllm:cache_config_info{block_size=..., num_gpu_blocks=...}`` | info gauge |
"""

from __future__ import annotations

from kvstate.engines import dcgm
from kvstate.engines.base import EngineLoad, EngineSpec, int_label
from kvstate.engines.prom import MetricSamples

__all__ = ["SPEC", "load_from"]

KIND = "vllm"
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
DEFAULT_BLOCK_SIZE = 16

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_DEPRECATED = "vllm:gpu_cache_usage_perc"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS_DEPRECATED = "vllm:gpu_prefix_cache_hits"
PREFIX_CACHE_QUERIES_DEPRECATED = "vllm:gpu_prefix_cache_queries"
TTFT = "vllm:time_to_first_token_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
ITL = "vllm:inter_token_latency_seconds"
ITL_DEPRECATED = "vllm:time_per_output_token_seconds"
REQUEST_SUCCESS = "vllm:request_success"
INFERENCE_TIME = "vllm:request_inference_time_seconds"
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
BLOCK_SIZE_LABEL = "block_size"
NUM_BLOCKS_LABEL = "num_gpu_blocks"


def load_from(samples: MetricSamples) -> EngineLoad:
    ttft = samples.histogram(TTFT)
    queue = samples.histogram(QUEUE_TIME)
    prefill = samples.histogram(PREFILL_TIME)
    itl = samples.histogram(ITL, ITL_DEPRECATED)
    inference = samples.histogram(INFERENCE_TIME)
    request_prompt = samples.histogram(REQUEST_PROMPT_TOKENS)
    return EngineLoad(
        running=samples.gauge_sum(RUNNING),
        waiting=samples.gauge_sum(WAITING),
        kv_usage=samples.gauge_max(KV_USAGE, KV_USAGE_DEPRECATED),
        prompt_tokens_total=samples.counter(PROMPT_TOKENS),
        generation_tokens_total=samples.counter(GENERATION_TOKENS),
        prefix_cache_hits_total=samples.counter(PREFIX_CACHE_HITS, PREFIX_CACHE_HITS_DEPRECATED),
        prefix_cache_queries_total=samples.counter(PREFIX_CACHE_QUERIES, PREFIX_CACHE_QUERIES_DEPRECATED),
        ttft_seconds_sum=None if ttft is None else ttft.sum,
        ttft_count=None if ttft is None else ttft.count,
        queue_seconds_sum=None if queue is None else queue.sum,
        prefill_seconds_sum=None if prefill is None else prefill.sum,
        finished_prompt_tokens_sum=None if request_prompt is None else request_prompt.sum,
        finish_count=prefill.count if prefill is not None else None if queue is None else queue.count,
        itl_seconds_sum=None if itl is None else itl.sum,
        itl_count=None if itl is None else itl.count,
        requests_finished_total=samples.counter(REQUEST_SUCCESS),
        service_seconds_sum=None if inference is None else inference.sum,
        service_count=None if inference is None else inference.count,
        block_size=int_label(samples, CACHE_CONFIG_INFO, BLOCK_SIZE_LABEL),
        kv_blocks=int_label(samples, CACHE_CONFIG_INFO, NUM_BLOCKS_LABEL),
        power_watts=dcgm.power_watts(samples),
        energy_joules=dcgm.energy_joules(samples),
    )


SPEC = EngineSpec(
    kind=KIND,
    health_path=HEALTH_PATH,
    metrics_path=METRICS_PATH,
    load_from=load_from,
    known_metrics=frozenset({RUNNING, WAITING, KV_USAGE, KV_USAGE_DEPRECATED, PROMPT_TOKENS, TTFT}),
    publishes_kv_events=True,
    default_block_size=DEFAULT_BLOCK_SIZE,
)
