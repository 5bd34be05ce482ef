"""Marginal energy per token, learned per endpoint from its own power meter and token counters.

Between two snapshots of one endpoint (a *window*):

    window joules  = d_energy_joules - idle_watts * dt
    window tokens  = d(prompt_tokens_total - prefix_cache_hits_total + generation_tokens_total)
    joules_per_token = sum of window joules / sum of window tokens, over about the last ``horizon_tokens`` tokens

- **Tokens computed, not tokens served.** vLLM's prompt counter (and SGLang's, and the simulator's) counts a
  prompt's cached tokens too, which cost no prefill. Placement charges ``joules_per_token x (uncached prompt +
  decode tokens)`` (``cognitora.placement.cost``), so the rate is learned in that unit: cache hits come off. An
  engine without a hit counter is learned per token served, as before.
- **A ratio of sums, not an average of ratios.** The prompt counter moves in whole prompts, when their first token
  is out, while the energy of their prefill was spent over the steps before. A short window can hold the energy
  of a prefill and not its tokens, or the reverse: 256-token windows of identical simulated engines at the same
  load read 0.014 and 0.11 J/token (32 x 32, 2026-12-05). Summing joules and tokens over many windows before
  dividing weighs each window by its tokens, and lets a prompt's energy and its count meet. The sums decay by
  ``exp(-window tokens / horizon_tokens)`` per window, so the estimate follows a change of hardware or of model
  within a few horizons.
- ``idle_watts`` is the lowest power reading seen while the endpoint had nothing running or waiting, over the
  last ``IDLE_HORIZON_S`` of such readings (0 until one is seen, which makes the estimate an average rather than
  marginal until then). The lowest, because a reading just after work can still hold its draw (a meter averages);
  of late, because the lowest ever is one-way: one reading of a GPU in its deepest idle state, or a meter's dip,
  stayed the baseline for good, and the engine's real idle draw above it was charged to its tokens (0.87 J/token
  against 0.05 in ``tests/kvstate/test_energy.py``). A busy engine takes no idle reading and keeps its baseline.
- A window closes once it spans at least ``min_tokens`` computed tokens; nothing is learned before the first one
  closes. A counter that goes backwards (engine or meter restart) restarts the window.

The scraper (``kvstate.scrape``) keeps one estimator per endpoint and writes what it learned into the endpoint's
snapshot (``EndpointSnapshot.joules_per_token``): learned once per fleet, where the other rates are learned, and
read by every gateway replica from the store. Placement then pools it within a hardware class
(``cognitora.placement.rate_pooling``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from kvstate.store import EndpointSnapshot

__all__ = ["IDLE_HORIZON_S", "EnergyEstimator"]

IDLE_HORIZON_S = 300.0
"""The idle draw is the lowest idle reading within this many seconds of the newest one."""


@dataclass(frozen=True)
class _Anchor:
    t: float
    joules: float
    served: float
    """Prompt + generated tokens (the raw counters: they only go back on a restart)."""
    computed: float
    """Served minus prefix-cache hits. It can step back a little between scrapes (an engine counts a hit when it
    schedules a prompt and the prompt when its first token is out), so it is not used to detect a restart."""


def _anchor(snap: EndpointSnapshot) -> _Anchor | None:
    served = (snap.prompt_tokens_total or 0.0) + (snap.generation_tokens_total or 0.0)
    if snap.energy_joules <= 0 or served <= 0:
        return None
    return _Anchor(snap.last_seen, snap.energy_joules, served, served - (snap.prefix_cache_hits_total or 0.0))


class EnergyEstimator:
    """Learns one endpoint's marginal J/token from its consecutive snapshots (see the module docstring)."""

    def __init__(self, min_tokens: float = 256.0, horizon_tokens: float = 32_768.0) -> None:
        self.min_tokens = min_tokens
        self.horizon_tokens = horizon_tokens
        self._anchor: _Anchor | None = None
        self._idle: deque[tuple[float, float]] = deque()
        """Idle readings (time, watts) of the last ``IDLE_HORIZON_S``, watts rising: the first is the lowest."""
        self._joules = 0.0
        self._tokens = 0.0

    @property
    def joules_per_token(self) -> float | None:
        """The current estimate; None until a window of at least ``min_tokens`` closed."""
        return self._joules / self._tokens if self._tokens > 0 else None

    @property
    def idle_watts(self) -> float:
        """The idle draw: the lowest idle reading of the last ``IDLE_HORIZON_S`` of them (0: none seen)."""
        return self._idle[0][1] if self._idle else 0.0

    def _idle_reading(self, t: float, watts: float) -> None:
        """A sliding minimum: a reading makes every older, higher one irrelevant; readings age out of the window."""
        while self._idle and self._idle[-1][1] >= watts:
            self._idle.pop()
        self._idle.append((t, watts))
        while self._idle[0][0] < t - IDLE_HORIZON_S:
            self._idle.popleft()

    def observe(self, snap: EndpointSnapshot) -> None:
        """Feed one snapshot; a snapshot no newer than the last one used (same ``last_seen``) changes nothing."""
        if snap.running == 0 and snap.waiting == 0 and snap.power_watts > 0:
            self._idle_reading(snap.last_seen, snap.power_watts)
        here = _anchor(snap)
        if here is None:
            return
        anchor = self._anchor
        if anchor is None or here.joules < anchor.joules or here.served < anchor.served:
            self._anchor = here
            return
        tokens = here.computed - anchor.computed
        if here.t <= anchor.t or tokens < self.min_tokens:
            return
        joules = max(0.0, here.joules - anchor.joules - self.idle_watts * (here.t - anchor.t))
        keep = math.exp(-tokens / self.horizon_tokens)
        self._joules = self._joules * keep + joules
        self._tokens = self._tokens * keep + tokens
        self._anchor = here
