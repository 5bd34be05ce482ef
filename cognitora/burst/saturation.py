"""When a (model, priority class) bursts: hysteresis between two thresholds, and a minimum dwell in burst.

The input is one number per decision: the best local endpoint's *load ratio* for the request, its predicted TTFT
over the class's TTFT SLO, or its predicted inter-token latency over the class's ITL SLO when that is larger
(``cognitora.burst.policy.LocalLoad``); infinite when no local endpoint is eligible.

- Out of burst, a decision whose ratio exceeds ``enter_ratio`` enters burst at once (waiting would pile requests
  onto an engine that already cannot meet the SLO).
- In burst, each request whose ratio exceeds ``exit_ratio`` (lower) goes to the cloud; the others are placed
  locally. So the local fleet is kept at about ``exit_ratio`` of its objectives while the load lasts and the
  overflow goes out.
- The class leaves burst only once every decision for ``min_dwell_s`` has had its ratio under the exit threshold:
  a single quiet moment in a load step does not end it, and a fleet hovering at the SLO does not switch back and
  forth request by request.
- Or at once, when a local probe measured the fleet serving the class within the exit threshold
  (``release``; ``cognitora.burst.probes``). For ``min_dwell_s`` after that, a decision whose best endpoint is
  measured idle does not enter burst again on its prediction alone: the probe just measured what that prediction
  claims, and the figures it rests on are still the stale ones the probe disproved. A busy fleet enters as ever.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SaturationDetector", "Verdict"]


@dataclass
class _ClassState:
    bursting: bool = False
    calm_since: float | None = None
    """In burst: when the current run of decisions under the exit threshold began (None: the last was over)."""
    released_at: float | None = None
    """When a local probe last ended the burst."""


@dataclass(frozen=True)
class Verdict:
    """What the detector says of one decision."""

    burst: bool
    """The request should go to the cloud (if it may)."""
    bursting: bool
    """The class is in burst after this decision."""
    threshold: float
    """The load ratio the request was compared with (``enter_ratio`` or ``exit_ratio``)."""


class SaturationDetector:
    """Per (model, class) burst state. Not thread-safe: the Router calls it on its loop."""

    def __init__(self, enter_ratio: float, exit_ratio: float, min_dwell_s: float) -> None:
        self.enter_ratio = enter_ratio
        self.exit_ratio = exit_ratio
        self.min_dwell_s = min_dwell_s
        self._states: dict[tuple[str, str], _ClassState] = {}

    def states(self) -> dict[tuple[str, str], bool]:
        """(model, class) -> whether it is in burst, for every pair seen."""
        return {key: state.bursting for key, state in self._states.items()}

    def release(self, model: str, priority: str, now: float) -> None:
        """A local probe measured the fleet serving the class within the exit threshold: out of burst now."""
        state = self._states.setdefault((model, priority), _ClassState())
        state.bursting, state.calm_since, state.released_at = False, None, now

    def observe(self, model: str, priority: str, load_ratio: float, now: float, *, idle: bool = False) -> Verdict:
        """One decision's best local load ratio (``inf`` when no local endpoint is eligible); ``idle``: that endpoint
        is measured idle."""
        state = self._states.setdefault((model, priority), _ClassState())
        if not state.bursting:
            if load_ratio <= self.enter_ratio:
                return Verdict(burst=False, bursting=False, threshold=self.enter_ratio)
            released = state.released_at
            if idle and released is not None and now - released < self.min_dwell_s:
                return Verdict(burst=False, bursting=False, threshold=self.enter_ratio)
            state.bursting, state.calm_since = True, None
            return Verdict(burst=True, bursting=True, threshold=self.enter_ratio)
        if load_ratio > self.exit_ratio:
            state.calm_since = None
            return Verdict(burst=True, bursting=True, threshold=self.exit_ratio)
        if state.calm_since is None:
            state.calm_since = now
        if now - state.calm_since >= self.min_dwell_s:
            state.bursting, state.calm_since = False, None
            return Verdict(burst=False, bursting=False, threshold=self.exit_ratio)
        return Verdict(burst=False, bursting=True, threshold=self.exit_ratio)
