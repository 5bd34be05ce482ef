"""What each candidate's estimates rest on, in words, for ``cognitora explain`` and the decision log.

A mixed fleet mixes sources: a vLLM engine's prefill rate is learned from its ``/metrics`` and its prefix from its
KV events; an MLX-LM engine has neither, so its rate comes from the router's own timed attempts (or a prior) and
its prefix from the router's routing history. The explanation says which, per candidate, so a surprising pick can
be traced to the estimate behind it.
"""

from __future__ import annotations

from cognitora.config import EndpointConfig, PlacementConfig
from cognitora.kv_event_sources import reports_kv_events
from kvstate.engines import ENGINES
from kvstate.store import EndpointSnapshot

__all__ = ["estimate_basis"]


def estimate_basis(endpoint: EndpointConfig, snap: EndpointSnapshot | None, params: PlacementConfig) -> str:
    """``rate: ...; prefix: ...; load: ...`` for one candidate (``snap``: its fresh snapshot, or None)."""
    spec = ENGINES.get(endpoint.engine.value)
    scraped = spec.metrics_path is not None
    if snap is not None and snap.prefill_tokens_per_s > 0:
        rate = f"learned from {spec.metrics_path}" if scraped else "learned from this router's timed responses"
        if snap.prefill_rate_from_short_prompts:
            rate += " on short prompts only (priced like its class's engines measured on long ones, if any)"
    elif endpoint.prefill_tokens_per_s is not None:
        rate = "configured prior"
    else:
        rate = "placement default"
    if endpoint.kv_events is not None:
        prefix = "KV events"
    elif reports_kv_events(endpoint):  # engine_pulls.trtllm_kv_events is not seen here; it is on by default
        prefix = "KV events pulled from /kv_cache_events"
    else:
        prefix = f"routing history ({params.routing_history_ttl_s:g} s)"
        if not scraped:
            prefix += " scaled by responses' cached_tokens"
    if not scraped:
        load = "router in-flight count (no metrics)"
    elif snap is not None:
        load = f"{spec.metrics_path} + router in-flight count"
    else:
        load = "router in-flight count (no fresh scrape)"
    return f"{spec.kind}: rate {rate}; prefix {prefix}; load {load}"
