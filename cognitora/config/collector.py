"""The ``scrape`` and ``engine_pulls`` sections: what the collector polls of each engine, and how often."""

from __future__ import annotations

from pydantic import Field

from cognitora.config.strict import StrictModel

__all__ = ["EnginePullsConfig", "ScrapeConfig"]


class ScrapeConfig(StrictModel):
    """How the collector polls engines' ``/metrics``."""

    interval_s: float = Field(default=1.0, gt=0)
    """Seconds between two scrapes of one endpoint."""
    timeout_s: float = Field(default=0.5, gt=0)
    """A scrape slower than this fails; repeated failures mark the endpoint unhealthy."""


class EnginePullsConfig(StrictModel):
    """What the collector asks engines for beside ``/metrics``, per kind (docs/mixed_fleets.md)."""

    llamacpp_slots: bool = True
    """Poll llama.cpp's ``GET /slots`` for busy slots and context size; a server answering 404 or 501
    (``--no-slots``) is asked once and then left alone."""
    trtllm_kv_events: bool = True
    """Drain TRT-LLM's ``POST /kv_cache_events`` on ``engine: trtllm`` endpoints without ``kv_events`` (ZMQ). It
    DRAINS the engine's buffer: turn it off when something else (Dynamo) reads those events."""
    trtllm_kv_events_interval_s: float = Field(default=0.25, gt=0)
    """Seconds between two drains of one TRT-LLM engine's events."""
    vllm_kv_event_sources: bool = True
    """Read ``GET /kv_event_sources`` of ``engine: vllm`` endpoints without ``kv_events`` and subscribe to every
    data-parallel rank's stream it names (``cognitora.kv_event_sources``)."""
    vllm_kv_event_sources_interval_s: float = Field(default=5.0, gt=0)
    """Seconds between two reads of one engine's ``/kv_event_sources`` (a restarted engine's new ports are followed)."""
