"""What each engine kind of the simulated fleet shows the outside: its routes, metric pages and event stream.

One simulated engine (scheduler, paged prefix cache, step-time model) sits behind every kind; ``--engine-kind``
changes only what a router or a scraper can see of it, as the real engine would show it (engines.md section 4):

| kind | Prometheus page | other routes | KV events |
|---|---|---|---|
| ``vllm`` | ``/metrics`` (``vllm:`` names) | ``/load``, ``/tokenize``, render, ``/reset_prefix_cache`` | ZMQ |
| ``sglang`` | ``/metrics`` (``sglang:`` names) | | ZMQ |
| ``llamacpp`` | ``/metrics`` (``llamacpp:`` names, no labels; prompt count without cached) | ``/slots`` | none |
| ``mlx`` | none (404) | | none |
| ``trtllm`` | ``/prometheus/metrics`` (``trtllm_`` names) | ``/metrics``: JSON iteration stats, drained | pulled |

Every kind serves ``/health``, ``/v1/models`` and the two OpenAI completion routes, with
``usage.prompt_tokens_details.cached_tokens`` in responses (MLX-LM's only cache signal). DCGM power series are
appended to a kind's Prometheus page, standing in for the node's DCGM exporter (docs/sim.md).

This module is the table of kinds, which the engine reads (``SimEngine`` publishes events only for a kind that
does); the pages, llama.cpp's ``/slots`` and TRT-LLM's iteration stats, which read the engine, are
``cognitora_sim.kind_pages``. TRT-LLM's events are pulled, not published: ``POST /kv_cache_events`` drains a
buffer in TRT-LLM's JSON (``cognitora_sim.trtllm_events``).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("vllm", "sglang", "llamacpp", "mlx", "trtllm")
"""Values of ``--engine-kind``."""


class UnknownEngineKindError(ValueError):
    """``--engine-kind`` names a kind the simulator does not speak."""


@dataclass(frozen=True)
class KindSurface:
    kind: str
    prometheus_path: str | None
    """Where the Prometheus text page is served; None: the engine has none."""
    publishes_events: bool
    """Whether the engine publishes vLLM-format KV events over ZMQ (when given an events port)."""
    vllm_routes: bool = False
    """``/load``, ``/tokenize``, ``/detokenize``, render routes and ``/reset_prefix_cache`` (vLLM's server)."""
    slots_route: bool = False
    """``GET /slots`` (llama.cpp)."""
    iteration_stats_path: str | None = None
    """Where TRT-LLM's drained JSON iteration stats are served."""
    kv_events_route: bool = False
    """``POST /kv_cache_events``: TRT-LLM's drained JSON KV-cache events (``cognitora_sim.trtllm_events``)."""
    owned_by: str = "vllm"
    """``owned_by`` of the ``/v1/models`` card."""


SURFACES: dict[str, KindSurface] = {
    "vllm": KindSurface("vllm", "/metrics", publishes_events=True, vllm_routes=True),
    "sglang": KindSurface("sglang", "/metrics", publishes_events=True, owned_by="sglang"),
    "llamacpp": KindSurface("llamacpp", "/metrics", publishes_events=False, slots_route=True, owned_by="llamacpp"),
    "mlx": KindSurface("mlx", None, publishes_events=False, owned_by="system"),
    "trtllm": KindSurface(
        "trtllm",
        "/prometheus/metrics",
        publishes_events=False,
        iteration_stats_path="/metrics",
        kv_events_route=True,
        owned_by="tensorrt_llm",
    ),
}


def surface(kind: str) -> KindSurface:
    try:
        return SURFACES[kind]
    except KeyError:
        raise UnknownEngineKindError(f"unknown engine kind {kind!r}; choose one of {', '.join(KINDS)}") from None


def kinds_for_fleet(spec: str, engines: int) -> list[str]:
    """``"vllm,vllm,mlx"`` cycled over ``engines`` engines (as ``--profile`` is)."""
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if not names:
        raise UnknownEngineKindError(f"--engine-kind is empty; choose from {', '.join(KINDS)}")
    for name in names:
        surface(name)
    return [names[i % len(names)] for i in range(engines)]
