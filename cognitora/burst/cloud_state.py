"""Each cloud target's state as this gateway process saw it: requests in flight, a 429's Retry-After still
running, a recent failure to reach it. Learned from the outcomes of the requests sent there, nothing else (no
probe traffic to a paid API)."""

from __future__ import annotations

from dataclasses import dataclass

from cognitora.attempt import Outcome, OutcomeKind

UNREACHABLE_STATUSES = frozenset({502, 503, 504})
"""A cloud answering these is not serving for now (an outage, its gateway overloaded): no requests for a while."""


@dataclass
class TargetState:
    inflight: int = 0
    rate_limited_until: float = float("-inf")
    unhealthy_until: float = float("-inf")
    last_problem: str = ""


class CloudState:
    """Targets by name. The Router calls it on its loop (no lock)."""

    def __init__(self, default_retry_after_s: float, unhealthy_s: float) -> None:
        self.default_retry_after_s = default_retry_after_s
        self.unhealthy_s = unhealthy_s
        self._targets: dict[str, TargetState] = {}

    def _of(self, target: str) -> TargetState:
        state = self._targets.get(target)
        if state is None:
            state = self._targets[target] = TargetState()
        return state

    def unavailable(self, target: str, max_concurrency: int, now: float) -> str | None:
        """Why ``target`` may not take a request now (a short reason for decisions and metrics), or None."""
        state = self._of(target)
        if now < state.unhealthy_until:
            return "cloud_unhealthy"
        if now < state.rate_limited_until:
            return "cloud_rate_limited"
        if state.inflight >= max_concurrency:
            return "cloud_at_capacity"
        return None

    def inflight(self, target: str) -> int:
        state = self._targets.get(target)
        return 0 if state is None else state.inflight

    def dispatched(self, target: str) -> None:
        self._of(target).inflight += 1

    def finished(self, target: str, outcome: Outcome, now: float) -> None:
        """A request sent to ``target`` ended with ``outcome``: a 429 holds the target off for its Retry-After (or
        the default); an unreachable target (or 502/503/504) for ``unhealthy_s``."""
        state = self._of(target)
        state.inflight = max(0, state.inflight - 1)
        if outcome.status == 429:
            wait = outcome.retry_after_s if outcome.retry_after_s is not None else self.default_retry_after_s
            state.rate_limited_until = max(state.rate_limited_until, now + wait)
            state.last_problem = f"429 (retry after {wait:g} s)"
        elif outcome.kind is OutcomeKind.CONNECT_FAILED or outcome.status in UNREACHABLE_STATUSES:
            state.unhealthy_until = now + self.unhealthy_s
            state.last_problem = outcome.detail or outcome.kind.value
        elif outcome.ok:
            state.unhealthy_until = float("-inf")
