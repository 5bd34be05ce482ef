"""SGLang (``sglang.launch_server --enable-metrics``): Prometheus ``/metrics``, ``/health``, KV events over ZMQ.

Sources: sglang ``srt/metrics/collector.py`` (engines.md 3.2). Labels include ``model_name``.

| constant | metric | type |
|---|---|---|
| RUNNING | ``sglang:num_running_reqs`` | gauge |
| WAITING | ``sglang:num_queue_reqs`` | gauge |
| KV_USAGE | ``sglang:token_usage`` (0..1) | gauge |
| PROMPT_TOKENS | ``sglang:prompt_tokens`` | counter |
| GENERATION_TOKENS | ``sglang:generation_tokens`` | counter |
| CACHED_TOKENS | ``sglang:cached_tokens`` (prompt tokens served from the radix cache) | counter |
| TTFT | ``sglang:time_to_first_token_seconds`` (from request creation: includes queueing) | histogram |
| ITL | ``sglang:inter_token_latency_seconds`` | histogram |
| NUM_REQUESTS | ``sglang:num_requests`` (finished requests) | counter |
| CACHE_CONFIG_INFO | ``sglang:cache_config_info{page_size=..., num_pages=...}`` | info gauge |

SGLang has no separate prefix-cache query counter: every prompt token is looked up in the radix cache, so the
prompt-token counter stands in for queries. The token counters advance when a request FINISHES
(``observe_one_finished_request``), TTFT at its first token (``kvstate.rates.finish_observed``).
"""

from __future__ import annotations

from kvstate.engines import dcgm
from kvstate.engines.base import EngineLoad, EngineSpec, int_label
from kvstate.engines.prom import MetricSamples

__all__ = ["SPEC", "load_from"]

KIND = "sglang"
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
DEFAULT_BLOCK_SIZE = 1
"""SGLang's default ``--page-size``."""

RUNNING = "sglang:num_running_reqs"
WAITING = "sglang:num_queue_reqs"
KV_USAGE = "sglang:token_usage"
PROMPT_TOKENS = "sglang:prompt_tokens"
GENERATION_TOKENS = "sglang:generation_tokens"
CACHED_TOKENS = "sglang:cached_tokens"
TTFT = "sglang:time_to_first_token_seconds"
ITL = "sglang:inter_token_latency_seconds"
NUM_REQUESTS = "sglang:num_requests"
CACHE_CONFIG_INFO = "sglang:cache_config_info"
PAGE_SIZE_LABEL = "page_size"
NUM_PAGES_LABEL = "num_pages"


def load_from(samples: MetricSamples) -> EngineLoad:
    ttft = samples.histogram(TTFT)
    itl = samples.histogram(ITL)
    prompt_tokens = samples.counter(PROMPT_TOKENS)
    finished = samples.counter(NUM_REQUESTS)
    return EngineLoad(
        running=samples.gauge_sum(RUNNING),
        waiting=samples.gauge_sum(WAITING),
        kv_usage=samples.gauge_max(KV_USAGE),
        prompt_tokens_total=prompt_tokens,
        generation_tokens_total=samples.counter(GENERATION_TOKENS),
        prefix_cache_hits_total=samples.counter(CACHED_TOKENS),
        prefix_cache_queries_total=prompt_tokens,
        requests_finished_total=finished,
        finish_count=finished,
        ttft_seconds_sum=None if ttft is None else ttft.sum,
        ttft_count=None if ttft is None else ttft.count,
        itl_seconds_sum=None if itl is None else itl.sum,
        itl_count=None if itl is None else itl.count,
        block_size=int_label(samples, CACHE_CONFIG_INFO, PAGE_SIZE_LABEL),
        kv_blocks=int_label(samples, CACHE_CONFIG_INFO, NUM_PAGES_LABEL),
        power_watts=dcgm.power_watts(samples),
        energy_joules=dcgm.energy_joules(samples),
    )


SPEC = EngineSpec(
    kind=KIND,
    health_path=HEALTH_PATH,
    metrics_path=METRICS_PATH,
    load_from=load_from,
    known_metrics=frozenset({RUNNING, WAITING, KV_USAGE, PROMPT_TOKENS, TTFT}),
    publishes_kv_events=True,
    default_block_size=DEFAULT_BLOCK_SIZE,
)
