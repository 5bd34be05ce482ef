"""What each engine kind serves from the engine's state: its Prometheus page, llama.cpp's ``/slots``, TRT-LLM's
drained iteration stats (the table of kinds, routes and names, is ``cognitora_sim.engine_kinds``).

The figures are read from the engine's own vLLM-named registry (``cognitora_sim.metrics``), so every kind counts the
same simulated work; only names, units and the pages they are on differ. Apart from the table because these read a
``SimEngine``, and the engine reads the table.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from cognitora_sim.engine import SimEngine


# ---- metric pages ---------------------------------------------------------------------------------------------
class _Reader:
    """The engine's vLLM-named samples (one engine: labels ``model_name``, ``engine="0"``)."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.labels = {"model_name": engine.config.model, "engine": "0"}

    def value(self, name: str) -> float:
        got = self.engine.metrics.registry.get_sample_value(name, self.labels)
        return 0.0 if got is None else got

    def success(self) -> float:
        got = self.engine.metrics.registry.get_sample_value(
            "vllm:request_success_total", {**self.labels, "finished_reason": "length"}
        )
        return 0.0 if got is None else got


class _Page:
    """Prometheus text exposition written by hand: each kind's names, units and label sets exactly."""

    def __init__(self, labels: str = "") -> None:
        self.labels = labels
        self.lines: list[str] = []

    def add(self, name: str, kind: str, value: float, help_: str) -> None:
        self.lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{self.labels} {value:.6g}"]

    def counter(self, name: str, value: float, help_: str) -> None:
        # The family is declared without ``_total``; the sample carries it (the exposition format's rule).
        base = name.removesuffix("_total")
        self.lines += [f"# HELP {base} {help_}", f"# TYPE {base} counter", f"{base}_total{self.labels} {value:.6g}"]

    def histogram(self, name: str, total: float, count: float, help_: str) -> None:
        inner = self.labels[1:-1] if self.labels else ""
        bucket_labels = "{" + (inner + "," if inner else "") + 'le="+Inf"}'
        self.lines += [
            f"# HELP {name} {help_}",
            f"# TYPE {name} histogram",
            f"{name}_bucket{bucket_labels} {count:.6g}",
            f"{name}_sum{self.labels} {total:.6g}",
            f"{name}_count{self.labels} {count:.6g}",
        ]

    def text(self) -> bytes:
        return ("\n".join(self.lines) + "\n").encode()


def _hist(r: _Reader, vllm_name: str) -> tuple[float, float]:
    return r.value(vllm_name + "_sum"), r.value(vllm_name + "_count")


def _with_power(engine: SimEngine, page: bytes) -> bytes:
    return page + engine.metrics.power_exposition()


def sglang_page(engine: SimEngine) -> bytes:
    """SGLang's ``/metrics`` (engines.md 3.2): ``sglang:`` names, label ``model_name``."""
    r = _Reader(engine)
    s = engine.scheduler
    p = _Page(f'{{model_name="{engine.config.model}"}}')
    p.add("sglang:num_running_reqs", "gauge", len(s.running), "The number of running requests.")
    p.add("sglang:num_queue_reqs", "gauge", len(s.waiting), "The number of requests in the waiting queue.")
    p.add("sglang:token_usage", "gauge", engine.cache.usage(), "The token usage.")
    p.counter("sglang:prompt_tokens_total", r.value("vllm:prompt_tokens_total"), "Number of prefill tokens.")
    p.counter("sglang:generation_tokens_total", r.value("vllm:generation_tokens_total"), "Number of generation tokens.")
    p.counter("sglang:cached_tokens_total", r.value("vllm:prefix_cache_hits_total"), "Number of cached tokens.")
    p.histogram(
        "sglang:time_to_first_token_seconds",
        *_hist(r, "vllm:time_to_first_token_seconds"),
        "Histogram of time to first token in seconds.",
    )
    p.histogram(
        "sglang:inter_token_latency_seconds",
        *_hist(r, "vllm:inter_token_latency_seconds"),
        "Histogram of inter-token latency in seconds.",
    )
    info = f'sglang:cache_config_info{{page_size="{engine.config.block_size}",num_pages="{engine.cache.num_blocks}"}} 1'
    p.lines += ["# HELP sglang:cache_config_info Cache config info.", "# TYPE sglang:cache_config_info gauge", info]
    return _with_power(engine, p.text())


def llamacpp_page(engine: SimEngine) -> bytes:
    """llama-server's ``/metrics`` (engines.md 4.2): ``llamacpp:`` names, no labels; its prompt counter excludes
    cached tokens, which it counts apart."""
    r = _Reader(engine)
    s = engine.scheduler
    p = _Page()
    prompt_all = r.value("vllm:prompt_tokens_total")
    cached = min(prompt_all, r.value("vllm:prefix_cache_hits_total"))
    prompt_s = r.value("vllm:request_prefill_time_seconds_sum")
    predicted = r.value("vllm:generation_tokens_total")
    predicted_s = r.value("vllm:request_decode_time_seconds_sum")
    p.counter("llamacpp:prompt_tokens_total", prompt_all - cached, "Number of prompt tokens processed.")
    p.counter("llamacpp:prompt_tokens_cached_total", cached, "Number of prompt tokens taken from the cache.")
    p.counter("llamacpp:prompt_seconds_total", prompt_s, "Prompt process time.")
    p.counter("llamacpp:tokens_predicted_total", predicted, "Number of generation tokens processed.")
    p.counter("llamacpp:tokens_predicted_seconds_total", predicted_s, "Predict process time.")
    p.counter("llamacpp:n_decode_total", float(engine.steps), "Total number of llama_decode() calls.")
    p.add(
        "llamacpp:prompt_tokens_seconds",
        "gauge",
        (prompt_all - cached) / prompt_s if prompt_s > 0 else 0.0,
        "Average prompt throughput in tokens/s.",
    )
    p.add(
        "llamacpp:predicted_tokens_seconds",
        "gauge",
        predicted / predicted_s if predicted_s > 0 else 0.0,
        "Average generation throughput in tokens/s.",
    )
    p.add("llamacpp:requests_processing", "gauge", len(s.running), "Number of requests processing.")
    p.add("llamacpp:requests_deferred", "gauge", len(s.waiting), "Number of requests deferred.")
    return _with_power(engine, p.text())


def trtllm_page(engine: SimEngine) -> bytes:
    """trtllm-serve's ``/prometheus/metrics`` (engines.md 4.3): ``trtllm_`` names, label ``model_name``."""
    r = _Reader(engine)
    s = engine.scheduler
    cache = engine.cache
    p = _Page(f'{{model_name="{engine.config.model}"}}')
    p.add("trtllm_num_requests_running", "gauge", len(s.running), "Number of requests running.")
    p.add("trtllm_num_requests_waiting", "gauge", len(s.waiting), "Number of requests waiting.")
    p.add("trtllm_kv_cache_utilization", "gauge", cache.usage(), "KV cache utilization (0..1).")
    p.add("trtllm_kv_cache_hit_rate", "gauge", _hit_rate(r), "KV cache hit rate.")
    p.add("trtllm_kv_cache_max_blocks", "gauge", cache.num_blocks, "KV cache blocks.")
    p.add("trtllm_kv_cache_free_blocks", "gauge", cache.free_blocks, "Free KV cache blocks.")
    p.add("trtllm_kv_cache_used_blocks", "gauge", cache.used_blocks, "Used KV cache blocks.")
    p.add("trtllm_kv_cache_tokens_per_block", "gauge", engine.config.block_size, "Tokens per KV cache block.")
    p.counter("trtllm_request_success_total", r.success(), "Requests finished.")
    p.counter("trtllm_prompt_tokens_total", r.value("vllm:prompt_tokens_total"), "Prompt tokens.")
    p.counter("trtllm_generation_tokens_total", r.value("vllm:generation_tokens_total"), "Generation tokens.")
    p.histogram(
        "trtllm_time_to_first_token_seconds", *_hist(r, "vllm:time_to_first_token_seconds"), "Time to first token."
    )
    p.histogram(
        "trtllm_time_per_output_token_seconds",
        *_hist(r, "vllm:request_time_per_output_token_seconds"),
        "Time per output token, per request.",
    )
    p.histogram(
        "trtllm_e2e_request_latency_seconds", *_hist(r, "vllm:e2e_request_latency_seconds"), "End-to-end latency."
    )
    p.histogram("trtllm_request_queue_time_seconds", *_hist(r, "vllm:request_queue_time_seconds"), "Queue time.")
    return _with_power(engine, p.text())


def _hit_rate(r: _Reader) -> float:
    queries = r.value("vllm:prefix_cache_queries_total")
    return r.value("vllm:prefix_cache_hits_total") / queries if queries > 0 else 0.0


PAGES: dict[str, Callable[[SimEngine], bytes]] = {
    "sglang": sglang_page,
    "llamacpp": llamacpp_page,
    "trtllm": trtllm_page,
}
"""Kinds whose Prometheus page is not vLLM's own registry."""


# ---- llama.cpp /slots, TRT-LLM iteration stats ----------------------------------------------------------------
def llamacpp_slots(engine: SimEngine) -> list[dict[str, object]]:
    """``GET /slots``: one object per slot (``-np``), ``is_processing`` for those holding a running request."""
    running = engine.scheduler.running
    n_slots = engine.scheduler.max_num_seqs
    n_ctx = engine.profile.max_model_len
    slots: list[dict[str, object]] = []
    for i in range(n_slots):
        busy = i < len(running)
        req = running[i] if busy else None
        slots.append(
            {
                "id": i,
                "id_task": -1 if req is None else i,
                "n_ctx": n_ctx,
                "speculative": False,
                "is_processing": busy,
                "params": {"n_predict": -1 if req is None else req.max_tokens, "cache_prompt": True},
                "next_token": {
                    "has_next_token": busy,
                    "has_new_line": False,
                    "n_remain": -1 if req is None else req.max_tokens - req.output_len,
                    "n_decoded": 0 if req is None else req.output_len,
                },
            }
        )
    return slots


class IterationStats:
    """TRT-LLM's ``GET /metrics``: the iteration stats since the last read, drained by the read (a second read
    returns ``[]`` until the engine runs another iteration). One object per read summarizes the iterations run
    since the previous one (``iter`` is the latest iteration's number)."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self._read_at_step = 0
        self._ids = itertools.count()

    def drain(self) -> list[dict[str, object]]:
        e = self.engine
        if e.steps == self._read_at_step:
            return []
        self._read_at_step = e.steps
        s, cache = e.scheduler, e.cache
        r = _Reader(e)
        return [
            {
                "iter": e.steps,
                "iterLatencyMS": 0.0,
                "timestamp": f"{e.clock.now():.3f}",
                "numActiveRequests": len(s.running),
                "numQueuedRequests": len(s.waiting),
                "numCompletedRequests": int(r.success()),
                "maxNumActiveRequests": s.max_num_seqs,
                "gpuMemUsage": 0,
                "cpuMemUsage": 0,
                "pinnedMemUsage": 0,
                "kvCacheStats": {
                    "maxNumBlocks": cache.num_blocks,
                    "freeNumBlocks": cache.free_blocks,
                    "usedNumBlocks": cache.used_blocks,
                    "tokensPerBlock": e.config.block_size,
                    "allocTotalBlocks": cache.used_blocks,
                    "allocNewBlocks": 0,
                    "reusedBlocks": int(r.value("vllm:prefix_cache_hits_total") // e.config.block_size),
                    "missedBlocks": 0,
                    "cacheHitRate": _hit_rate(r),
                },
                "inflightBatchingStats": {
                    "numContextRequests": sum(1 for q in s.running if q.first_token_at is None),
                    "numGenRequests": sum(1 for q in s.running if q.first_token_at is not None),
                    "numPausedRequests": 0,
                    "numScheduledRequests": len(s.running),
                    "numCtxTokens": 0,
                    "avgNumDecodedTokensPerIter": 1.0,
                },
            }
        ]
