"""What placement reads: the fleet's state at decision time, fetched by the Router and passed in.

Placement is a pure function of a ``FleetState`` and the config, so every rule is table-testable without I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvstate.store import EndpointSnapshot, InFlight, PrefixMatch

SNAPSHOT_JOULES_PER_TOKEN = "joules_per_token"
"""Key in ``EndpointSnapshot.extra`` where the scraper puts a learned marginal energy per prompt token (J)."""

SNAPSHOT_MARKED_UNHEALTHY_AT = "marked_unhealthy_at"
"""Key in ``EndpointSnapshot.extra``: set on the unhealthy snapshot a gateway writes in ``Router.mark_unhealthy`` (Unix
time), so that mark expires like a local one even where no scraper ever overwrites it."""


@dataclass(frozen=True)
class HealthMark:
    """A gateway saw the endpoint fail (connection refused, 5xx storm): it is skipped until a newer healthy scrape."""

    since: float
    """Unix time the failure was seen."""
    reason: str


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
    """Endpoints a gateway marked dead, and when."""
    learned_joules_per_token: Mapping[str, float] = field(default_factory=dict)
    """Marginal energy per token learned from the endpoints' power meters (``placement.energy``)."""
    degraded: bool = False
    """The store could not be read; ``matches``/``inflight``/``snapshots`` are what the router had locally."""
