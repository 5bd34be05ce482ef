"""Filter stages: which configured endpoints may take a request at all.

Each filter returns the endpoints it excludes, with a reason a user can read in ``cognitora explain``. Filters run
in order; a *soft* filter (KV nearly full) is skipped when it would leave nothing, because a full cache is a cost,
not a failure. A hard filter (unhealthy, wrong role, not a gateway candidate) never is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cognitora.config import CostModelConfig, EndpointConfig, PlacementConfig, Role
from cognitora.placement.state import FleetState
from cognitora.request import RouteRequest

__all__ = ["Filter", "FilterContext", "FilterResult", "run_filters"]


@dataclass(frozen=True)
class FilterContext:
    """What a filter may look at."""

    request: RouteRequest
    role: Role
    state: FleetState
    params: PlacementConfig
    cost_model: CostModelConfig | None = None
    """The long-context cost terms; when they price an endpoint's KV capacity, its KV usage is not a filter."""


FilterFn = Callable[[EndpointConfig, FilterContext], str | None]
"""Returns why ``endpoint`` is excluded, or None to keep it."""


@dataclass(frozen=True)
class Filter:
    name: str
    check: FilterFn
    soft: bool = False
    """Skipped when it would exclude every endpoint left."""


def _candidates(endpoint: EndpointConfig, ctx: FilterContext) -> str | None:
    allowed = ctx.request.candidates
    if allowed is not None and endpoint.id not in allowed:
        return "not among the gateway's candidates"
    return None


def _role(endpoint: EndpointConfig, ctx: FilterContext) -> str | None:
    if endpoint.role is Role.BOTH or endpoint.role is ctx.role:
        return None
    return f"role {endpoint.role.value} (request needs {ctx.role.value})"


def _reachable(endpoint: EndpointConfig, ctx: FilterContext) -> str | None:
    """A gateway saw a connection to it fail (``Router.mark_unhealthy``), this one or another through the store,
    within ``unhealthy_mark_ttl_s``, and no healthy snapshot newer than that mark has arrived."""
    mark = ctx.state.health_marks.get(endpoint.id)
    if mark is None or ctx.state.now - mark.since >= ctx.params.unhealthy_mark_ttl_s:
        return None
    snap = ctx.state.snapshots.get(endpoint.id)
    if snap is not None and snap.healthy and snap.last_seen > mark.since:
        return None
    return f"marked unhealthy: {mark.reason}"


def _scrape_healthy(endpoint: EndpointConfig, ctx: FilterContext) -> str | None:
    """The scraper's health checks fail. Soft: when every endpoint left fails them, the checks are more likely
    wrong (an overloaded scraper, a network blip between it and the fleet) than the whole fleet dead, so the
    request is tried anyway, as Envoy's panic threshold does; a truly dead engine then fails the connection and
    gets marked by ``_reachable``."""
    snap = ctx.state.snapshots.get(endpoint.id)
    if snap is not None and not snap.healthy:
        return "unhealthy (metrics scrape failing)"
    return None


def _kv_headroom(endpoint: EndpointConfig, ctx: FilterContext) -> str | None:
    snap = ctx.state.snapshots.get(endpoint.id)
    if snap is None or ctx.state.now - snap.last_seen > ctx.params.snapshot_max_age_s:
        return None
    cost = ctx.cost_model
    if (
        cost is not None
        and cost.kv_pressure_weight > 0
        and (snap.kv_capacity_tokens or endpoint.cost.kv_capacity_tokens)
    ):
        # Priced in seconds instead (the wait for KV room, placement.long_context). As a filter, a KV-bound fleet
        # hovering at 95-100% sent every request to whichever engine read under the limit at its last scrape.
        return None
    if snap.kv_usage > ctx.params.kv_usage_limit:
        return f"KV cache {snap.kv_usage:.0%} full (limit {ctx.params.kv_usage_limit:.0%})"
    return None


FILTERS: tuple[Filter, ...] = (
    Filter("candidates", _candidates),
    Filter("role", _role),
    Filter("reachable", _reachable),
    Filter("scrape_healthy", _scrape_healthy, soft=True),
    Filter("kv_headroom", _kv_headroom, soft=True),
)
"""The filter pipeline, in order."""


@dataclass(frozen=True)
class FilterResult:
    kept: list[EndpointConfig]
    excluded: dict[str, str]
    """Endpoint id -> why it was excluded."""
    notes: list[str]
    """Soft filters that were skipped, said in words."""


def run_filters(endpoints: Sequence[EndpointConfig], ctx: FilterContext) -> FilterResult:
    kept = list(endpoints)
    excluded: dict[str, str] = {}
    notes: list[str] = []
    for f in FILTERS:
        verdicts = {e.id: f.check(e, ctx) for e in kept}
        survivors = [e for e in kept if verdicts[e.id] is None]
        if f.soft and not survivors and kept:
            notes.append(f"every candidate failed {f.name} ({verdicts[kept[0].id]}); kept them all")
            continue
        for e in kept:
            reason = verdicts[e.id]
            if reason is not None:
                excluded[e.id] = reason
        kept = survivors
    return FilterResult(kept, excluded, notes)
