"""Energy per token and cache hit rate over a sliding window of endpoint snapshots.

The engines' and meters' counters are cumulative from different origins (a DCGM energy counter from the driver's
load, an engine's token counter from its own start), so their cumulative ratio means nothing. What is measured is
the ratio of their *deltas* over the same span of time:

    joules_per_token(e) = (energy(now) - energy(then)) / (prompt + generated tokens(now) - (then))
    fleet joules_per_token = sum over metered endpoints of the energy delta / sum of their token deltas

``then`` is the oldest snapshot seen within ``WINDOW_S`` before the newest, kept with one older one so that a
window spans at least ``WINDOW_S`` when snapshots are sparse (snapshots are observed when a metrics page is
rendered, so the page's scrape interval sets how fine the window is). A counter going backwards (the engine or
meter restarted) restarts the endpoint's window. The idle draw is included: an idle engine's joules count toward the
fleet's energy per token, as they count toward its bill. (The marginal figure placement uses, idle draw removed, is
learned by the scraper: ``kvstate.energy``.)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvstate.store import EndpointSnapshot

__all__ = ["CounterWindow", "FleetEnergy", "WindowDelta", "fleet_energy"]

WINDOW_S = 60.0
"""Span (seconds) of the energy and hit-rate window."""


@dataclass(frozen=True)
class _Point:
    t: float
    energy: float | None
    prompt: float
    generated: float
    hits: float | None
    queries: float | None


@dataclass(frozen=True)
class WindowDelta:
    """What one endpoint's counters did over its window."""

    seconds: float
    energy_joules: float | None
    """None without an energy counter."""
    prompt_tokens: float
    generated_tokens: float
    cache_hits: float | None
    cache_queries: float | None

    @property
    def tokens(self) -> float:
        return self.prompt_tokens + self.generated_tokens

    @property
    def joules_per_token(self) -> float | None:
        if self.energy_joules is None or self.tokens <= 0:
            return None
        return self.energy_joules / self.tokens

    @property
    def cache_hit_ratio(self) -> float | None:
        if self.cache_hits is None or not self.cache_queries:
            return None
        return self.cache_hits / self.cache_queries


class CounterWindow:
    """One endpoint's recent snapshots (see the module docstring)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._points: deque[_Point] = deque()

    def observe(self, snap: EndpointSnapshot) -> None:
        """Add a snapshot; the same snapshot (same ``last_seen``) twice counts once."""
        point = _Point(
            t=snap.last_seen,
            energy=snap.energy_joules if snap.energy_joules > 0 else None,
            prompt=snap.prompt_tokens_total or 0.0,
            generated=snap.generation_tokens_total or 0.0,
            hits=snap.prefix_cache_hits_total,
            queries=snap.prefix_cache_queries_total,
        )
        points = self._points
        if points and point.t <= points[-1].t:
            return
        if points and _went_back(points[-1], point):
            points.clear()
        points.append(point)
        while len(points) > 2 and points[1].t <= point.t - self.window_s:
            points.popleft()

    def delta(self) -> WindowDelta | None:
        """The window's deltas; None until two snapshots were seen."""
        if len(self._points) < 2:
            return None
        first, last = self._points[0], self._points[-1]
        energy = None if first.energy is None or last.energy is None else last.energy - first.energy
        hits = None if first.hits is None or last.hits is None else last.hits - first.hits
        queries = None if first.queries is None or last.queries is None else last.queries - first.queries
        return WindowDelta(
            seconds=last.t - first.t,
            energy_joules=energy,
            prompt_tokens=last.prompt - first.prompt,
            generated_tokens=last.generated - first.generated,
            cache_hits=hits,
            cache_queries=queries,
        )


def _went_back(old: _Point, new: _Point) -> bool:
    pairs = ((old.energy, new.energy), (old.hits, new.hits), (old.queries, new.queries))
    if any(a is not None and b is not None and b < a for a, b in pairs):
        return True
    return new.prompt < old.prompt or new.generated < old.generated


@dataclass(frozen=True)
class FleetEnergy:
    """The fleet's figures over its endpoints' windows."""

    joules_per_token: float | None
    joules_per_output_token: float | None
    seconds: float


def fleet_energy(deltas: list[WindowDelta]) -> FleetEnergy | None:
    """Sum of energy deltas over sum of token deltas, over the metered endpoints; None when none is metered."""
    metered = [d for d in deltas if d.energy_joules is not None]
    if not metered:
        return None
    joules = sum(d.energy_joules or 0.0 for d in metered)
    tokens = sum(d.tokens for d in metered)
    generated = sum(d.generated_tokens for d in metered)
    return FleetEnergy(
        joules_per_token=joules / tokens if tokens > 0 else None,
        joules_per_output_token=joules / generated if generated > 0 else None,
        seconds=max(d.seconds for d in metered),
    )
