"""When a (model, priority class) bursts: hysteresis between two thresholds, and a minimum dwell in each state.

The input is one number per decision: the best local predicted TTFT (seconds) for the request, over its class's
SLO. Out of burst, a decision whose best local TTFT exceeds ``enter_ratio`` x SLO enters burst (once the class
has been out at least ``min_dwell_s``). In burst, each request whose best local TTFT still exceeds ``exit_ratio``
x SLO goes to the cloud; one below it leaves burst (once the class has been in at least ``min_dwell_s``). So the
local fleet is kept at about ``exit_ratio`` x SLO while the load lasts, the overflow goes out, and a fleet that
hovers at the SLO does not switch back and forth request by request.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _ClassState:
    bursting: bool = False
    since: float = float("-inf")
    """When the class last entered or left burst (the clock of ``SaturationDetector``)."""


@dataclass(frozen=True)
class Verdict:
    """What the detector says of one decision."""

    burst: bool
    """The request should go to the cloud (if it may)."""
    bursting: bool
    """The class is in burst after this decision."""
    threshold_s: float
    """The predicted TTFT the request was compared with (enter or exit threshold)."""
    held: bool = False
    """The state would have changed but the minimum dwell kept it."""


class SaturationDetector:
    """Per (model, class) burst state. Not thread-safe: the Router calls it on its loop."""

    def __init__(self, enter_ratio: float, exit_ratio: float, min_dwell_s: float) -> None:
        self.enter_ratio = enter_ratio
        self.exit_ratio = exit_ratio
        self.min_dwell_s = min_dwell_s
        self._states: dict[tuple[str, str], _ClassState] = {}

    def bursting(self, model: str, priority: str) -> bool:
        state = self._states.get((model, priority))
        return state is not None and state.bursting

    def states(self) -> dict[tuple[str, str], bool]:
        """(model, class) -> whether it is in burst, for every pair seen."""
        return {key: state.bursting for key, state in self._states.items()}

    def observe(self, model: str, priority: str, best_local_ttft_s: float, slo_s: float, now: float) -> Verdict:
        """One decision's best local predicted TTFT (``inf`` when no local endpoint is eligible)."""
        state = self._states.setdefault((model, priority), _ClassState())
        dwelt = now - state.since >= self.min_dwell_s
        if not state.bursting:
            threshold = self.enter_ratio * slo_s
            if best_local_ttft_s <= threshold:
                return Verdict(burst=False, bursting=False, threshold_s=threshold)
            if not dwelt:
                return Verdict(burst=False, bursting=False, threshold_s=threshold, held=True)
            state.bursting, state.since = True, now
            return Verdict(burst=True, bursting=True, threshold_s=threshold)
        threshold = self.exit_ratio * slo_s
        if best_local_ttft_s > threshold:
            return Verdict(burst=True, bursting=True, threshold_s=threshold)
        if not dwelt:
            return Verdict(burst=False, bursting=True, threshold_s=threshold, held=True)
        state.bursting, state.since = False, now
        return Verdict(burst=False, bursting=False, threshold_s=threshold)
