"""Engine modules: each engine's real metric names read into the same normalized load."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvstate.engines import (
    ENGINES,
    DuplicateEngineError,
    EngineLoad,
    EngineRegistry,
    MetricsParseError,
    UnknownEngineError,
    builtin_engines,
    dcgm,
    llamacpp,
    mlx,
    openai,
    parse_prometheus_text,
    sglang,
    trtllm,
    vllm,
)


def load_of(kind: str, text: str) -> EngineLoad:
    return ENGINES.get(kind).load_from(parse_prometheus_text(text))


def vllm_page_from_prometheus_client() -> str:
    """A page exactly as vLLM's prometheus_client exposes it: counters declared without _total, two DP ranks."""
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    running = Gauge(vllm.RUNNING, "", labels, registry=reg)
    waiting = Gauge(vllm.WAITING, "", labels, registry=reg)
    usage = Gauge(vllm.KV_USAGE, "", labels, registry=reg)
    prompt = Counter(vllm.PROMPT_TOKENS, "", labels, registry=reg)
    gen = Counter(vllm.GENERATION_TOKENS, "", labels, registry=reg)
    hits = Counter(vllm.PREFIX_CACHE_HITS, "", labels, registry=reg)
    queries = Counter(vllm.PREFIX_CACHE_QUERIES, "", labels, registry=reg)
    ttft = Histogram(vllm.TTFT, "", labels, registry=reg)
    itl = Histogram(vllm.ITL, "", labels, registry=reg)
    info = Gauge(vllm.CACHE_CONFIG_INFO, "", ["block_size", "num_gpu_blocks"], registry=reg)
    info.labels("32", "1000").set(1)
    for rank, (r, w, u) in enumerate([(3, 1, 0.25), (2, 4, 0.75)]):
        lab = ("m", str(rank))
        running.labels(*lab).set(r)
        waiting.labels(*lab).set(w)
        usage.labels(*lab).set(u)
        prompt.labels(*lab).inc(1000)
        gen.labels(*lab).inc(50)
        hits.labels(*lab).inc(400)
        queries.labels(*lab).inc(1000)
        ttft.labels(*lab).observe(0.25)
        itl.labels(*lab).observe(0.02)
    power = Gauge(dcgm.POWER_USAGE, "", ["gpu"], registry=reg)
    energy = Counter(dcgm.TOTAL_ENERGY_CONSUMPTION, "", ["gpu"], registry=reg)
    for gpu in ("0", "1"):
        power.labels(gpu).set(150.5)
        energy.labels(gpu).inc(2_000_000)
    return generate_latest(reg).decode()


def test_vllm_page_as_prometheus_client_exposes_it() -> None:
    load = load_of("vllm", vllm_page_from_prometheus_client())
    assert load.running == 5 and load.waiting == 5
    assert load.kv_usage == 0.75  # the fullest data-parallel rank
    assert load.prompt_tokens_total == 2000 and load.generation_tokens_total == 100
    assert load.prefix_cache_hits_total == 800 and load.prefix_cache_queries_total == 2000
    assert load.ttft_seconds_sum == pytest.approx(0.5) and load.ttft_count == 2
    assert load.itl_seconds_sum == pytest.approx(0.04) and load.itl_count == 2
    assert load.block_size == 32
    assert load.power_watts == pytest.approx(301.0)
    assert load.energy_joules == pytest.approx(4000.0)  # 2 GPUs x 2,000,000 mJ


def test_vllm_departures_read_from_success_counter_and_inference_histogram() -> None:
    # As vLLM exposes them: request_success labelled by finish reason (summed), inference time per DP rank.
    reg = CollectorRegistry()
    success = Counter(vllm.REQUEST_SUCCESS, "", ["model_name", "finished_reason"], registry=reg)
    success.labels("m", "length").inc(7)
    success.labels("m", "stop").inc(3)
    inference = Histogram(vllm.INFERENCE_TIME, "", ["model_name", "engine"], registry=reg)
    for rank, seconds in enumerate([12.0, 20.0]):
        inference.labels("m", str(rank)).observe(seconds)
    load = load_of("vllm", generate_latest(reg).decode())
    assert load.requests_finished_total == 10
    assert load.service_seconds_sum == pytest.approx(32.0) and load.service_count == 2


def test_vllm_counters_read_with_or_without_total_suffix() -> None:
    with_suffix = "vllm:prompt_tokens_total 10\nvllm:prefix_cache_hits_total 4\nvllm:num_requests_running 1\n"
    without = "vllm:prompt_tokens 10\nvllm:prefix_cache_hits 4\nvllm:num_requests_running 1\n"
    for text in (with_suffix, without):
        load = load_of("vllm", text)
        assert (load.prompt_tokens_total, load.prefix_cache_hits_total) == (10, 4)


def test_vllm_deprecated_names_are_fallbacks() -> None:
    text = (
        "vllm:gpu_cache_usage_perc 0.4\n"
        "vllm:gpu_prefix_cache_hits_total 7\n"
        "vllm:gpu_prefix_cache_queries_total 9\n"
        "vllm:time_per_output_token_seconds_sum 1.5\n"
        "vllm:time_per_output_token_seconds_count 30\n"
    )
    load = load_of("vllm", text)
    assert load.kv_usage == 0.4
    assert (load.prefix_cache_hits_total, load.prefix_cache_queries_total) == (7, 9)
    assert (load.itl_seconds_sum, load.itl_count) == (1.5, 30)


def test_absent_metrics_are_none_not_zero() -> None:
    load = load_of("vllm", "vllm:num_requests_running 0\n")
    assert load.running == 0
    assert load.waiting is None and load.prompt_tokens_total is None and load.power_watts is None


def test_sglang_page() -> None:
    text = """
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 4
sglang:num_queue_reqs{model_name="m"} 6
sglang:token_usage{model_name="m"} 0.3
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{model_name="m"} 5000
sglang:generation_tokens_total{model_name="m"} 700
sglang:cached_tokens_total{model_name="m"} 1200
sglang:time_to_first_token_seconds_sum{model_name="m"} 2.5
sglang:time_to_first_token_seconds_count{model_name="m"} 10
sglang:inter_token_latency_seconds_sum{model_name="m"} 7.0
sglang:inter_token_latency_seconds_count{model_name="m"} 700
sglang:cache_config_info{model_name="m",page_size="64",num_pages="100"} 1
"""
    load = load_of("sglang", text)
    assert (load.running, load.waiting, load.kv_usage) == (4, 6, 0.3)
    assert (load.prompt_tokens_total, load.prefix_cache_hits_total, load.prefix_cache_queries_total) == (
        5000,
        1200,
        5000,
    )
    assert (load.ttft_seconds_sum, load.ttft_count, load.itl_count) == (2.5, 10, 700)
    assert load.block_size == 64


def test_llamacpp_prompt_tokens_normalized_to_include_cached() -> None:
    text = """
llamacpp:prompt_tokens_total 3000
llamacpp:prompt_tokens_cached_total 1000
llamacpp:prompt_seconds_total 1.5
llamacpp:tokens_predicted_total 400
llamacpp:tokens_predicted_seconds_total 8
llamacpp:requests_processing 2
llamacpp:requests_deferred 1
"""
    load = load_of("llamacpp", text)
    assert load.prompt_tokens_total == 4000  # llama.cpp's counter excludes cached tokens
    assert load.prefix_cache_hits_total == 1000
    assert load.prefill_seconds_sum == 1.5
    assert (load.itl_seconds_sum, load.itl_count) == (8, 400)
    assert (load.running, load.waiting) == (2, 1)


def test_trtllm_page_and_metrics_route() -> None:
    assert ENGINES.get("trtllm").metrics_path == "/prometheus/metrics"  # its /metrics is a draining JSON list
    text = """
trtllm_num_requests_running 8
trtllm_num_requests_waiting 3
trtllm_kv_cache_utilization 0.9
trtllm_kv_cache_tokens_per_block 32
trtllm_prompt_tokens_total 100
trtllm_time_to_first_token_seconds_sum 1
trtllm_time_to_first_token_seconds_count 4
"""
    load = load_of("trtllm", text)
    assert (load.running, load.waiting, load.kv_usage, load.block_size) == (8, 3, 0.9, 32)
    assert (load.prompt_tokens_total, load.ttft_count) == (100, 4)


@pytest.mark.parametrize(
    ("module", "health", "metrics", "events"),
    [
        (vllm, "/health", "/metrics", True),
        (sglang, "/health", "/metrics", True),
        (llamacpp, "/health", "/metrics", False),
        (trtllm, "/health", "/prometheus/metrics", True),
        (mlx, "/health", None, False),
        (openai, "/v1/models", None, False),
    ],
)
def test_each_engine_declares_its_routes(module: object, health: str, metrics: str | None, events: bool) -> None:
    spec = module.SPEC  # type: ignore[attr-defined]
    assert ENGINES.get(spec.kind) is spec
    assert (spec.health_path, spec.metrics_path, spec.publishes_kv_events) == (health, metrics, events)


def test_openai_health_accepts_an_auth_wall_but_not_a_server_error() -> None:
    spec = ENGINES.get("openai")
    assert spec.healthy_status(200) and spec.healthy_status(401)
    assert not spec.healthy_status(503)
    assert not ENGINES.get("vllm").healthy_status(503) and not ENGINES.get("vllm").healthy_status(401)


def test_registry_rejects_duplicates_and_names_known_kinds() -> None:
    registry = builtin_engines()
    with pytest.raises(DuplicateEngineError, match="vllm"):
        registry.register(vllm.SPEC)
    with pytest.raises(UnknownEngineError, match="known kinds: llamacpp, mlx, openai, sglang, trtllm, vllm"):
        registry.get("vlm")
    assert EngineRegistry().kinds() == []


@pytest.mark.parametrize("body", ["<html><body>502 Bad Gateway</body></html>", "hello world", "\x00\x01\x02"])
def test_garbage_is_a_parse_error(body: str) -> None:
    with pytest.raises(MetricsParseError, match="not Prometheus text"):
        parse_prometheus_text(body)


def test_recognizes_only_its_own_metric_names() -> None:
    samples = parse_prometheus_text("sglang:num_running_reqs 1\n")
    assert ENGINES.get("sglang").recognizes(samples)
    assert not ENGINES.get("vllm").recognizes(samples)


def test_non_finite_values_are_ignored() -> None:
    load = load_of("vllm", "vllm:kv_cache_usage_perc NaN\nvllm:num_requests_running +Inf\n")
    assert load.kv_usage is None and load.running is None


def test_skipping_buckets_and_comments_reads_the_same_load() -> None:
    page = vllm_page_from_prometheus_client()
    spec = ENGINES.get("vllm")
    fast = spec.load_from(parse_prometheus_text(page))
    full = spec.load_from(parse_prometheus_text(page, keep_buckets=True))
    assert fast == full
    assert "vllm:time_to_first_token_seconds_bucket" not in parse_prometheus_text(page).names()


def test_every_configurable_engine_kind_has_a_module() -> None:
    from cognitora.config import EngineKind

    assert {kind.value for kind in EngineKind} == set(ENGINES.kinds())
