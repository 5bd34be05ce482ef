"""One engine's ``/metrics``: vLLM's names and labels (engines.md 4.1) plus DCGM power and utilization (7.2).

vLLM declares counters without ``_total`` and prometheus_client appends it, so the exposed names are e.g.
``vllm:prompt_tokens_total``. Labels are ``model_name`` and ``engine`` (the DP rank, "0"). Every duration is in
engine time (time-scale independent). DCGM series carry one ``gpu`` label per accelerator; the energy counter keeps
DCGM's name, without ``_total``.

Checked against a real vLLM 0.32.0 (CPU) page (``tests/real_engines/test_vllm_metrics_e2e.py``): every name served
here is served there with the same labels; ``request_success`` has a series per finish reason from the start, as
there, and ``cache_config_info`` carries the ``engine`` label. What vLLM 0.32 serves besides (multimodal cache,
admission rejections, FLOPs estimates, per-parameter histograms) no router reads.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# The gauge of this engine's clock (engine seconds per wall second, its --time-scale): named where the scraper
# reads it, since only the simulator shows it and the gateway converts its own waits with it.
from kvstate.engines.declared_clock import CLOCK_RATE

_M = TypeVar("_M", Gauge, Counter, Histogram)

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
"""vLLM 0.32's ``request_success`` label values, each series present (at 0) from the start."""
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
"""vLLM 0.32's ``prompt_tokens_by_source`` label values."""
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class _DcgmPower:
    """DCGM exporter's power series, written as text: its counter has no ``_total`` suffix, which
    prometheus_client's own counters would add."""

    def __init__(
        self,
        gpus: int,
        gpu_name: str,
        power_w: Callable[[], float],
        energy_j: Callable[[], float],
        utilization: Callable[[], float],
    ) -> None:
        self.gpus = gpus
        self.gpu_name = gpu_name.replace('"', "")
        self.power_w = power_w
        self.energy_j = energy_j
        self.utilization = utilization

    def exposition(self) -> bytes:
        w, mj = self.power_w() / self.gpus, self.energy_j() * 1000.0 / self.gpus
        util = round(100 * self.utilization())
        lines = [
            "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        ]
        lines += [f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",modelName="{self.gpu_name}"}} {util}' for g in range(self.gpus)]
        lines += [
            "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).",
            "# TYPE DCGM_FI_DEV_POWER_USAGE gauge",
        ]
        lines += [f'DCGM_FI_DEV_POWER_USAGE{{gpu="{g}",modelName="{self.gpu_name}"}} {w:.3f}' for g in range(self.gpus)]
        lines += [
            "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).",
            "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
        ]
        lines += [
            f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="{g}",modelName="{self.gpu_name}"}} {int(mj)}'
            for g in range(self.gpus)
        ]
        return ("\n".join(lines) + "\n").encode()


class EngineMetrics:
    def __init__(self, model: str, engine_index: int = 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._children = {}
        r = self.registry
        names = ["model_name", "engine"]
        self._labels = (model, str(engine_index))
        lab = self._labels

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=r)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, names, registry=r)

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=r)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of tokens.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local prefix cache hits)."
        )
        self.prompt_tokens_by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [*names, "source"],
            registry=r,
        )
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemptions.")
        self.success = Counter(
            "vllm:request_success", "Count of successfully processed requests.", [*names, "finished_reason"], registry=r
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_BUCKETS
        )
        self.queue_time = hist(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQUEST_BUCKETS
        )
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_BUCKETS,
        )
        self.decode_time = hist(
            "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", REQUEST_BUCKETS
        )
        self.inference_time = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_BUCKETS,
        )
        self.request_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_BUCKETS
        )
        self.request_generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", TOKEN_BUCKETS
        )
        self.request_prefill_kv_computed_tokens = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            TOKEN_BUCKETS,
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", TOKEN_BUCKETS
        )
        # every series exists from the start, as in vLLM, so a scraper sees zeros rather than nothing
        for metric in (
            self.running,
            self.waiting,
            self.kv_usage,
            self.prefix_queries,
            self.prefix_hits,
            self.prompt_tokens,
            self.prompt_tokens_cached,
            self.generation_tokens,
            self.preemptions,
            self.ttft,
            self.itl,
            self.tpot,
            self.e2e,
            self.queue_time,
            self.prefill_time,
            self.decode_time,
            self.inference_time,
            self.request_prompt_tokens,
            self.request_generation_tokens,
            self.request_prefill_kv_computed_tokens,
            self.iteration_tokens,
        ):
            metric.labels(*lab)
        for reason in FINISHED_REASONS:
            self.success.labels(*lab, reason)
        for source in PROMPT_TOKEN_SOURCES:
            self.prompt_tokens_by_source.labels(*lab, source)

    def child(self, metric: _M) -> _M:
        """The series of this engine (its model_name and engine labels), looked up once."""
        key = id(metric)
        hit = self._children.get(key)
        if hit is None:
            hit = self._children[key] = metric.labels(*self._labels)
        return hit

    _children: dict[int, Any]

    def observe_prompt(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A request's prompt at its first token: how much of it came from the prefix cache, as vLLM counts it."""
        self.child(self.prompt_tokens).inc(prompt_tokens)
        self.child(self.prompt_tokens_cached).inc(cached_tokens)
        model, engine = self._labels
        self.prompt_tokens_by_source.labels(model, engine, "local_cache_hit").inc(cached_tokens)
        self.prompt_tokens_by_source.labels(model, engine, "local_compute").inc(prompt_tokens - cached_tokens)

    def set_cache_config(self, block_size: int, num_gpu_blocks: int, extra: dict[str, str]) -> None:
        labels = {"block_size": str(block_size), "num_gpu_blocks": str(num_gpu_blocks), "engine": self._labels[1]}
        labels |= extra
        info = Gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(labels), registry=self.registry
        )
        info.labels(**labels).set(1)

    def add_power(
        self,
        gpus: int,
        gpu_name: str,
        power_w: Callable[[], float],
        energy_j: Callable[[], float],
        utilization: Callable[[], float],
    ) -> None:
        self._dcgm = _DcgmPower(gpus, gpu_name, power_w, energy_j, utilization)

    _dcgm: _DcgmPower | None = None

    def declare_clock(self, rate: float) -> None:
        """Engine seconds per wall second (the engine's ``--time-scale``), shown as ``CLOCK_RATE``."""
        self._clock_rate = rate

    _clock_rate: float | None = None

    def power_exposition(self) -> bytes:
        """The DCGM exporter's power lines (after ``add_power``) and the declared clock (after ``declare_clock``),
        else nothing: every kind's page ends with them."""
        power = self._dcgm.exposition() if self._dcgm is not None else b""
        if self._clock_rate is None:
            return power
        return (
            power
            + (
                f"# HELP {CLOCK_RATE} Engine seconds per wall second: this simulated engine's time scale.\n"
                f"# TYPE {CLOCK_RATE} gauge\n{CLOCK_RATE} {self._clock_rate!r}\n"
            ).encode()
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry) + self.power_exposition()


def observe_many(histogram: Histogram, value: float, count: int) -> None:
    """``count`` observations of the same ``value`` at the cost of one (a decode step gives every sequence of the
    batch the same inter-token latency). Uses prometheus_client's histogram internals, with a plain loop as the
    fallback should they change."""
    buckets = getattr(histogram, "_buckets", None)
    bounds = getattr(histogram, "_upper_bounds", None)
    total = getattr(histogram, "_sum", None)
    if buckets is None or bounds is None or total is None or count <= 1:
        for _ in range(count):
            histogram.observe(value)
        return
    total.inc(value * count)
    buckets[bisect.bisect_left(bounds, value)].inc(count)
