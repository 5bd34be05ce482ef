"""What placement reads: the fleet's state at decision time, fetched by the Router and passed in.

Placement is a pure function of a ``FleetState`` and the config, so every rule is table-testable without I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvstate.store import EndpointSnapshot, HealthMark, InFlight, PrefixMatch

__all__ = ["FleetState", "HealthMark", "SeatProgress"]


@dataclass(frozen=True)
class SeatProgress:
    """This gateway's requests holding a seat on one endpoint (first token seen, end not yet), and how long its
    requests hold one there, on the gateway's own clock (``cognitora.seat_tenure``): the departure schedule the
    seat wait reads (``placement.seat_wait``)."""

    ages_s: tuple[float, ...]
    """Seconds since each one's first token."""
    tenure_s: float | None
    """Mean seconds from first token to end, over this endpoint's recent requests; None before enough finished."""
    variability: float
    """The tenure's squared coefficient of variation, in [0, 1]: 0 when every request holds its seat as long (an
    age then says when it leaves), 1 when ages say nothing (exponential service); a prior until learned."""


@dataclass(frozen=True)
class FleetState:
    """Everything placement knows about the endpoints of one model at one instant."""

    now: float
    """Unix time of the decision (snapshot age is measured against it)."""
    matches: Mapping[str, PrefixMatch] = field(default_factory=dict)
    """Prefix held per endpoint (``Store.match_prefix``); absent endpoints hold nothing."""
    inflight: Mapping[str, InFlight] = field(default_factory=dict)
    """Router-counted work per endpoint (``Store.inflight``), shared across gateway replicas."""
    snapshots: Mapping[str, EndpointSnapshot] = field(default_factory=dict)
    """Latest scraped view per endpoint; absent: never scraped."""
    health_marks: Mapping[str, HealthMark] = field(default_factory=dict)
    """Endpoints a gateway marked dead, and when: this router's own marks and the store's, the newest per
    endpoint."""
    context_tokens: Mapping[str, float] = field(default_factory=dict)
    """Context tokens (prompt plus half of ``max_tokens``) of the requests this router has in flight per endpoint:
    the resident-context floor of the long-context terms (``placement.long_context``)."""
    context_since_snapshot: Mapping[str, float] = field(default_factory=dict)
    """Of ``context_tokens``: the requests dispatched after the endpoint's snapshot was taken, which its
    ``kv_usage`` cannot show yet."""
    kv_tokens: Mapping[str, float] = field(default_factory=dict)
    """The KV those requests add per endpoint (uncached prompt plus half of ``max_tokens`` each: a shared prefix is
    one copy): the KV-capacity floor of the long-context terms. Absent: ``context_tokens`` stands for it."""
    kv_since_snapshot: Mapping[str, float] = field(default_factory=dict)
    """Of ``kv_tokens``: the requests dispatched after the endpoint's snapshot was taken."""
    seat_progress: Mapping[str, SeatProgress] = field(default_factory=dict)
    """Per endpoint this router has requests holding a seat on and has learned a tenure for: their ages."""
    ttft_bias: Mapping[str, float] = field(default_factory=dict)
    """Per endpoint, the factor its predicted TTFT is corrected by (``cognitora.ttft_feedback``); absent: 1."""
    shed_probes: Mapping[str, float] = field(default_factory=dict)
    """Per endpoint, when this router last sent a probe there instead of shedding (``placement.shed_probe``, on the
    router's clock, as ``now``); absent: never."""
    degraded: bool = False
    """The store could not be read; ``matches``/``inflight``/``snapshots`` are what the router had locally."""
