"""Marginal energy per token, learned per endpoint from its own power meter and token counters.

Between two snapshots of one endpoint:

    joules_per_token = (d_energy_joules - idle_watts * dt) / d(prompt_tokens_total + generation_tokens_total)

``idle_watts`` is the lowest power reading seen while the endpoint had nothing running or waiting (0 until one is
seen, which makes the estimate an average rather than marginal until then). Windows span at least ``min_tokens``
tokens, and estimates are smoothed exponentially. A counter that goes backwards (engine restart) restarts the
window.

The scraper (``kvstate.scrape``) keeps one estimator per endpoint and writes what it learned into the endpoint's
snapshot (``EndpointSnapshot.joules_per_token``): learned once per fleet, where the other rates are learned, and
read by every gateway replica from the store.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstate.store import EndpointSnapshot


@dataclass
class _Anchor:
    t: float
    joules: float
    tokens: float


class EnergyEstimator:
    """Learns one endpoint's marginal J/token from its consecutive snapshots (see the module docstring)."""

    def __init__(self, min_tokens: float = 256.0, smoothing: float = 0.3) -> None:
        self.min_tokens = min_tokens
        self.smoothing = smoothing
        self._anchor: _Anchor | None = None
        self._idle_watts: float | None = None
        self.joules_per_token: float | None = None
        """The current estimate; None until a window of at least ``min_tokens`` closed."""

    def observe(self, snap: EndpointSnapshot) -> None:
        """Feed one snapshot; a snapshot no newer than the last one used (same ``last_seen``) changes nothing."""
        if snap.running == 0 and snap.waiting == 0 and snap.power_watts > 0:
            idle = self._idle_watts if self._idle_watts is not None else snap.power_watts
            self._idle_watts = min(snap.power_watts, idle)
        tokens = (snap.prompt_tokens_total or 0.0) + (snap.generation_tokens_total or 0.0)
        if snap.energy_joules <= 0 or tokens <= 0:
            return
        anchor = self._anchor
        here = _Anchor(snap.last_seen, snap.energy_joules, tokens)
        if anchor is None or snap.energy_joules < anchor.joules or tokens < anchor.tokens:
            self._anchor = here
            return
        d_tokens = tokens - anchor.tokens
        if snap.last_seen <= anchor.t or d_tokens < self.min_tokens:
            return
        idle = self._idle_watts or 0.0
        marginal = max(0.0, snap.energy_joules - anchor.joules - idle * (snap.last_seen - anchor.t)) / d_tokens
        previous = self.joules_per_token
        self.joules_per_token = marginal if previous is None else previous + self.smoothing * (marginal - previous)
        self._anchor = here
