"""Probes instead of shedding: which idle endpoints a sheddable class may be sent to although it misses its objective.

A sheddable class whose TTFT objective every endpoint misses is refused with 429 (``picker``, rule 4). On an idle
engine that prediction rests on learned figures alone (the prefill rate, the short-prompt floor, the TTFT feedback),
and where they were learned under a load that is gone, a class whose traffic is all sheddable sends nothing there
again, so nothing corrects them (docs/learned_figures.md, "Self-diverting").

An endpoint may be probed, and the picker then places the request there instead of shedding it, when:

- it is **measured idle**: a fresh snapshot shows nothing running and nothing waiting, and the routers count nothing
  in flight there. So at most one probe runs on an engine at a time: the probe itself makes it busy;
- the request's own uncached prefill (at least one token: an engine always computes the last) at the endpoint's
  **prior** rate (its configured ``prefill_tokens_per_s``, else
  ``placement.default_prefill_tokens_per_s``; never a learned or pooled one), plus its tier reload, **fits the
  class's objective**: then the learned figures are what made it miss, not the request. A 1e-9 s objective, or a
  prompt too long for its objective on any engine of that prior, is still refused;
- this router sent no probe there in the last ``placement.shed_probe_interval_s``: an engine that really is as slow
  as it was learned (its prior too optimistic) then serves the class at most one late request per interval, and is
  never flooded.

The probe's first token and the engine's own counters then teach the figures what the idle engine does: the
scraper's short-prompt floor drops at once to a window the rate explains (``kvstate.rates``), the TTFT feedback
learns from the achieved TTFT (``cognitora.ttft_feedback``), and ordinary placement takes over.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cognitora.config import EndpointConfig, PlacementConfig
from cognitora.decision import CandidateScore
from cognitora.placement.cost import fresh_snapshot
from cognitora.placement.state import FleetState
from kvstate.store import InFlight

__all__ = ["measured_idle", "prior_prefill_rate", "probe_prefills"]


def prior_prefill_rate(endpoint: EndpointConfig, params: PlacementConfig) -> float:
    """The prefill rate the config assumes for ``endpoint`` (tokens/s), whatever was learned: its own prior, else the
    fleet's default."""
    if endpoint.prefill_tokens_per_s is not None:
        return endpoint.prefill_tokens_per_s
    return params.default_prefill_tokens_per_s


def measured_idle(endpoint_id: str, state: FleetState, params: PlacementConfig) -> bool:
    """A fresh snapshot shows nothing running or waiting there, and no router has a request in flight there."""
    snap = fresh_snapshot(endpoint_id, state, params)
    if snap is None or snap.running > 0 or snap.waiting > 0:
        return False
    flight = state.inflight.get(endpoint_id, InFlight())
    return flight.requests <= 0 and flight.prefill_tokens <= 0


def probe_prefills(
    ranked: Sequence[CandidateScore],
    endpoints: Mapping[str, EndpointConfig],
    prompt_tokens: int,
    state: FleetState,
    params: PlacementConfig,
) -> dict[str, float]:
    """Endpoint id -> the request's own prefill there at the endpoint's prior rate plus its tier reload (seconds), for
    the ranked endpoints that may be probed now (measured idle, none probed within the interval). Empty when probes
    are off (``placement.shed_probe_interval_s`` null)."""
    interval = params.shed_probe_interval_s
    if interval is None:
        return {}
    due: dict[str, float] = {}
    for c in ranked:
        last = state.shed_probes.get(c.endpoint)
        if last is not None and state.now - last < interval:
            continue
        endpoint = endpoints.get(c.endpoint)
        if endpoint is None or not measured_idle(c.endpoint, state, params):
            continue
        # an engine computes at least the prompt's last token however much is cached (vLLM and SGLang recompute it
        # to sample from), so a fully cached prompt is never free and a 1e-9 s objective is never met by a probe
        uncached = max(1.0, prompt_tokens - c.cached_tokens)
        due[c.endpoint] = uncached / prior_prefill_rate(endpoint, params) + c.reload_s
    return due
