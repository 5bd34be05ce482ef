"""Whether an endpoint's cache is known from its own KV events, pushed or pulled.

Pushed: ``kv_events:`` names a ZMQ stream (vLLM, SGLang, TRT-LLM's ``kv_events_config``). Pulled: an
``engine: trtllm`` endpoint without one has its ``POST /kv_cache_events`` drained by the collector
(``engine_pulls.trtllm_kv_events``, on by default). The collector, the router's routing-history TTL and
``cognitora explain`` must agree on this, so it is decided here once.
"""

from __future__ import annotations

from cognitora.config import EndpointConfig, EngineKind


def pulls_trtllm_events(endpoint: EndpointConfig, pull_enabled: bool = True) -> bool:
    """A TRT-LLM endpoint without a ZMQ stream has its events pulled over HTTP, unless pulling is turned off."""
    return endpoint.engine == EngineKind.TRTLLM and endpoint.kv_events is None and pull_enabled


def reports_kv_events(endpoint: EndpointConfig, pull_enabled: bool = True) -> bool:
    """The engine tells what it caches (pushed or pulled events); otherwise routing history is all there is."""
    return endpoint.kv_events is not None or pulls_trtllm_events(endpoint, pull_enabled)
