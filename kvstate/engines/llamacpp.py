"""llama.cpp ``llama-server --metrics``: Prometheus ``/metrics`` (prefix ``llamacpp:``, no labels), ``/health``.

Source: ggml-org/llama.cpp ``tools/server`` (engines.md 4.2). No KV events: prefix reuse is per slot, so the
router can only approximate it (its own routing history, ``placement.routing_history_ttl_s``). llama.cpp measures
its own busy time, which makes its rates exact. ``GET /slots`` (on by default in recent builds, ``--no-slots``
turns it off) lists the ``-np`` slots: ``slots_load`` reads how many are busy and how many there are.

| constant | metric | type |
|---|---|---|
| RUNNING | ``llamacpp:requests_processing`` (busy slots) | gauge |
| WAITING | ``llamacpp:requests_deferred`` | gauge |
| KV_USAGE | ``llamacpp:kv_cache_usage_ratio`` (older builds only) | gauge |
| PROMPT_TOKENS | ``llamacpp:prompt_tokens`` (EXCLUDES cached tokens) | counter |
| PROMPT_TOKENS_CACHED | ``llamacpp:prompt_tokens_cached`` | counter |
| PROMPT_SECONDS | ``llamacpp:prompt_seconds`` (time spent in prefill) | counter |
| TOKENS_PREDICTED | ``llamacpp:tokens_predicted`` | counter |
| TOKENS_PREDICTED_SECONDS | ``llamacpp:tokens_predicted_seconds`` (time spent decoding) | counter |
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from kvstate.engines import dcgm
from kvstate.engines.base import EngineLoad, EngineSpec
from kvstate.engines.prom import MetricSamples

__all__ = ["SPEC", "SlotsLoad", "load_from", "slots_load"]

KIND = "llamacpp"
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
SLOTS_PATH = "/slots"

RUNNING = "llamacpp:requests_processing"
WAITING = "llamacpp:requests_deferred"
KV_USAGE = "llamacpp:kv_cache_usage_ratio"
PROMPT_TOKENS = "llamacpp:prompt_tokens"
PROMPT_TOKENS_CACHED = "llamacpp:prompt_tokens_cached"
PROMPT_SECONDS = "llamacpp:prompt_seconds"
TOKENS_PREDICTED = "llamacpp:tokens_predicted"
TOKENS_PREDICTED_SECONDS = "llamacpp:tokens_predicted_seconds"


def load_from(samples: MetricSamples) -> EngineLoad:
    uncached = samples.counter(PROMPT_TOKENS)
    cached = samples.counter(PROMPT_TOKENS_CACHED)
    # Normalize to "all prompt tokens, cached included", as the other engines count them.
    prompt_total = None if uncached is None else uncached + (cached or 0.0)
    predicted = samples.counter(TOKENS_PREDICTED)
    return EngineLoad(
        running=samples.gauge_sum(RUNNING),
        waiting=samples.gauge_sum(WAITING),
        kv_usage=samples.gauge_max(KV_USAGE),
        prompt_tokens_total=prompt_total,
        generation_tokens_total=predicted,
        prefix_cache_hits_total=cached,
        prefix_cache_queries_total=prompt_total if cached is not None else None,
        prefill_seconds_sum=samples.counter(PROMPT_SECONDS),
        # Decode time over decoded tokens is the mean inter-token latency.
        itl_seconds_sum=samples.counter(TOKENS_PREDICTED_SECONDS),
        itl_count=predicted,
        power_watts=dcgm.power_watts(samples),
        energy_joules=dcgm.energy_joules(samples),
    )


@dataclass(frozen=True)
class SlotsLoad:
    """What ``/slots`` says: the server's ``-np`` slots and how many hold a request."""

    slots: int
    busy: int
    n_ctx: int = 0
    """The largest slot's ``n_ctx`` (0 when the body does not say): a lower bound of the KV the server holds. With
    a split cache each slot reports its share of ``--ctx-size`` (the sum would be exact); with ``--kv-unified``
    every slot reports the whole shared cache (the sum would count it ``-np`` times). /slots does not say which,
    so the bound that never promises room the server lacks."""

    @property
    def free(self) -> int:
        return self.slots - self.busy


def slots_load(body: bytes | str) -> SlotsLoad:
    """Read a ``/slots`` body (a JSON list of slot objects with ``id`` and ``is_processing``). Raises
    ``ValueError`` naming what is wrong with a body of another shape."""
    try:
        slots = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"llama.cpp /slots is not JSON: {exc}") from exc
    if not isinstance(slots, list):
        raise ValueError(f"llama.cpp /slots: expected a JSON list of slots, got {type(slots).__name__}")
    busy = 0
    n_ctx = 0
    for i, slot in enumerate(slots):
        if not isinstance(slot, Mapping) or not isinstance(slot.get("is_processing"), bool):
            raise ValueError(f"llama.cpp /slots: slot {i} has no boolean 'is_processing'")
        busy += slot["is_processing"]
        ctx = slot.get("n_ctx")
        if isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > 0:
            n_ctx = max(n_ctx, ctx)
    return SlotsLoad(slots=len(slots), busy=busy, n_ctx=n_ctx)


SPEC = EngineSpec(
    kind=KIND,
    health_path=HEALTH_PATH,
    metrics_path=METRICS_PATH,
    load_from=load_from,
    known_metrics=frozenset({RUNNING, WAITING, PROMPT_TOKENS, TOKENS_PREDICTED}),
    publishes_kv_events=False,
    slots_path=SLOTS_PATH,
)
