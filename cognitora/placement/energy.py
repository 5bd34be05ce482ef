"""Marginal energy per token, learned per endpoint from its own power meter and token counters.

Between two snapshots of one endpoint:

    joules_per_token = (d_energy_joules - idle_watts * dt) / d(prompt_tokens_total + generation_tokens_total)

``idle_watts`` is the lowest power reading seen while the endpoint had nothing running or waiting (0 until one is
seen, which makes the estimate an average rather than marginal until then). Windows span at least ``min_tokens``
tokens, and estimates are smoothed exponentially. A counter that goes backwards (engine restart) restarts the
window. This is state kept by the Router; placement reads the resulting numbers through ``FleetState``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstate.store import EndpointSnapshot

PROMPT_TOKENS_TOTAL = "prompt_tokens_total"
GENERATION_TOKENS_TOTAL = "generation_tokens_total"
"""Keys in ``EndpointSnapshot.extra`` where the scraper puts the engine's token counters."""


@dataclass
class _Anchor:
    t: float
    joules: float
    tokens: float


class EnergyEstimator:
    """Learns each endpoint's marginal J/token from consecutive snapshots (see the module docstring)."""

    def __init__(self, min_tokens: float = 256.0, smoothing: float = 0.3) -> None:
        self.min_tokens = min_tokens
        self.smoothing = smoothing
        self._anchors: dict[str, _Anchor] = {}
        self._idle_watts: dict[str, float] = {}
        self._estimates: dict[str, float] = {}

    def observe(self, snap: EndpointSnapshot) -> None:
        """Feed one snapshot; the same snapshot seen twice (same ``last_seen``) is ignored."""
        if snap.running == 0 and snap.waiting == 0 and snap.power_watts > 0:
            idle = self._idle_watts.get(snap.endpoint, snap.power_watts)
            self._idle_watts[snap.endpoint] = min(snap.power_watts, idle)
        tokens = snap.extra.get(PROMPT_TOKENS_TOTAL, 0.0) + snap.extra.get(GENERATION_TOKENS_TOTAL, 0.0)
        if snap.energy_joules <= 0 or tokens <= 0:
            return
        anchor = self._anchors.get(snap.endpoint)
        here = _Anchor(snap.last_seen, snap.energy_joules, tokens)
        if anchor is None or snap.energy_joules < anchor.joules or tokens < anchor.tokens:
            self._anchors[snap.endpoint] = here
            return
        d_tokens = tokens - anchor.tokens
        if snap.last_seen <= anchor.t or d_tokens < self.min_tokens:
            return
        idle = self._idle_watts.get(snap.endpoint, 0.0)
        marginal = max(0.0, snap.energy_joules - anchor.joules - idle * (snap.last_seen - anchor.t)) / d_tokens
        previous = self._estimates.get(snap.endpoint)
        self._estimates[snap.endpoint] = (
            marginal if previous is None else previous + self.smoothing * (marginal - previous)
        )
        self._anchors[snap.endpoint] = here

    def joules_per_token(self) -> dict[str, float]:
        """Current estimates, per endpoint (absent: not learned yet)."""
        return dict(self._estimates)
