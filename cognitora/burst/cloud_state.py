"""Each cloud target's state as this gateway process saw it: its requests in flight (one slot each, by request id)
and a circuit breaker, learned from the outcomes of the requests sent there (no probe traffic to a paid API beyond
the one half-open request).

The breaker, per target:

- **closed**: requests go there. ``burst.breaker_failures`` consecutive failures (a 5xx, a refused or reset
  connection, a timeout, a 401/403/404: the target cannot serve) open it; a success resets the count. A slow answer
  is an answer: a cloud slower than the SLO may still be faster than the saturated fleet it relieves.
- **open** for a hold-off: nothing goes there. A failure opens it for ``burst.unhealthy_s``; a 429 for its
  ``Retry-After`` (``burst.retry_after_s`` without one).
- **half-open** once the hold-off is over: ONE request goes there (the probe), the others wait as if open. The
  probe's success closes the breaker; its failure opens it again for twice the last hold-off, at most
  ``burst.unhealthy_max_s`` (a 429 for its Retry-After). A probe that ends neither way (the client went away)
  lets the next request probe.

Slots are taken when the policy decides (``reserve``), before anything awaits, so concurrent decisions never pass
``max_concurrency`` together; they are given back on every end of the attempt (``finished``) or when the decision
was not carried out (``withdraw``). The Router ends a cloud attempt itself after ``targets[].timeout_s``, so no slot
outlives that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from cognitora.core.outcome import Outcome, OutcomeKind

__all__ = ["Breaker", "BreakerSettings", "CloudState", "TargetState", "Verdict"]

TARGET_REFUSES = frozenset({401, 403, 404})
"""4xx a target answers every request with when it cannot serve us (a key it refuses, a model it lacks): failures
of the target, not of the request (unlike a 400)."""


class Breaker(StrEnum):
    """A target's breaker state (``cognitora_cloud_breaker{state}``)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Verdict(StrEnum):
    """What one finished cloud attempt says of its target (``cognitora_cloud_attempts_total{result}``)."""

    OK = "ok"
    RATE_LIMITED = "rate_limited"
    FAILED = "failed"
    NEUTRAL = "neutral"
    """Says nothing of the target: the client went away, the request itself was bad, the gateway gave up on it."""


def verdict_of(outcome: Outcome) -> Verdict:
    if outcome.ok:
        return Verdict.OK
    if outcome.status == 429:
        return Verdict.RATE_LIMITED
    kind = outcome.kind
    if kind in (OutcomeKind.CONNECT_FAILED, OutcomeKind.TIMEOUT, OutcomeKind.UPSTREAM_ERROR):
        return Verdict.FAILED
    if outcome.status is not None and (outcome.status >= 500 or outcome.status in TARGET_REFUSES):
        return Verdict.FAILED
    if kind in (OutcomeKind.FAILED, OutcomeKind.REROUTED):
        return Verdict.FAILED
    return Verdict.NEUTRAL


@dataclass
class TargetState:
    slots: set[str] = field(default_factory=set)
    """Request ids holding a slot (reserved or in flight)."""
    breaker: Breaker = Breaker.CLOSED
    open_until: float = float("-inf")
    open_why: str = "cloud_unhealthy"
    """The denial reason while open: ``cloud_unhealthy`` or ``cloud_rate_limited``."""
    hold_s: float = 0.0
    """The last failure hold-off (doubled by each failed probe)."""
    failures: int = 0
    """Consecutive failures while closed."""
    probe: str | None = None
    """The half-open request in flight."""
    last_problem: str = ""
    probes: int = 0
    """Half-open requests sent (each one cloud call made during a hold-off)."""
    opened: int = 0
    """Times the breaker opened."""


@dataclass(frozen=True)
class BreakerSettings:
    failures_to_open: int
    unhealthy_s: float
    unhealthy_max_s: float
    default_retry_after_s: float


class CloudState:
    """Targets by name. The Router calls it on its loop (no lock)."""

    def __init__(self, settings: BreakerSettings) -> None:
        self.settings = settings
        self._targets: dict[str, TargetState] = {}
        self.results: dict[tuple[str, str], int] = {}
        """(target, Verdict) -> finished cloud attempts."""

    def _of(self, target: str) -> TargetState:
        state = self._targets.get(target)
        if state is None:
            state = self._targets[target] = TargetState()
        return state

    def state(self, target: str, now: float) -> Breaker:
        """The breaker's state now (an open breaker whose hold-off is over is half-open)."""
        s = self._of(target)
        if s.breaker is Breaker.OPEN and now >= s.open_until:
            s.breaker, s.probe = Breaker.HALF_OPEN, None
        return s.breaker

    def unavailable(self, target: str, max_concurrency: int, now: float) -> str | None:
        """Why ``target`` may not take a request now (a short reason for decisions and metrics), or None."""
        s = self._of(target)
        breaker = self.state(target, now)
        if breaker is Breaker.OPEN or (breaker is Breaker.HALF_OPEN and s.probe is not None):
            return s.open_why
        if len(s.slots) >= max_concurrency:
            return "cloud_at_capacity"
        return None

    def inflight(self, target: str) -> int:
        state = self._targets.get(target)
        return 0 if state is None else len(state.slots)

    def summary(self, now: float) -> dict[str, TargetState]:
        """Every target seen, its state brought up to ``now`` (for metrics)."""
        for name in self._targets:
            self.state(name, now)
        return dict(self._targets)

    def reserve(self, target: str, request_id: str, now: float) -> None:
        """A request was decided for ``target`` (``unavailable`` said None): it holds a slot, and is the half-open
        probe when the breaker is half-open."""
        s = self._of(target)
        s.slots.add(request_id)
        if self.state(target, now) is Breaker.HALF_OPEN and s.probe is None:
            s.probe = request_id
            s.probes += 1

    def withdraw(self, target: str, request_id: str) -> None:
        """The decision was not carried out (refused after it was made): its slot (and probe turn) is given back."""
        s = self._of(target)
        s.slots.discard(request_id)
        if s.probe == request_id:
            s.probe = None

    def finished(self, target: str, request_id: str, outcome: Outcome, now: float) -> Verdict:
        """A request sent to ``target`` ended with ``outcome``: its slot is given back and the breaker learns."""
        s = self._of(target)
        s.slots.discard(request_id)
        verdict = verdict_of(outcome)
        key = (target, verdict.value)
        self.results[key] = self.results.get(key, 0) + 1
        was_probe = s.probe == request_id
        if was_probe:
            s.probe = None
        if verdict is Verdict.OK:
            s.failures = 0
            if was_probe:
                s.breaker, s.hold_s = Breaker.CLOSED, 0.0
        elif verdict is Verdict.RATE_LIMITED:
            wait = outcome.retry_after_s if outcome.retry_after_s is not None else self.settings.default_retry_after_s
            self._open(s, now, wait, "cloud_rate_limited", f"429 (retry after {wait:g} s)", extend=not was_probe)
        elif verdict is Verdict.FAILED:
            s.last_problem = outcome.detail or outcome.kind.value
            s.failures += 1
            if was_probe:
                hold = min(self.settings.unhealthy_max_s, max(s.hold_s, self.settings.unhealthy_s) * 2)
                self._open(s, now, hold, "cloud_unhealthy", s.last_problem)
            elif s.breaker is Breaker.CLOSED and s.failures >= self.settings.failures_to_open:
                self._open(s, now, self.settings.unhealthy_s, "cloud_unhealthy", s.last_problem)
        return verdict

    def _open(self, s: TargetState, now: float, hold_s: float, why: str, problem: str, *, extend: bool = False) -> None:
        if s.breaker is not Breaker.OPEN:
            s.opened += 1
        until = now + hold_s
        # A late answer of a request sent before the breaker opened never shortens the hold-off in force.
        s.open_until = max(s.open_until, until) if extend and s.breaker is Breaker.OPEN else until
        s.breaker, s.open_why, s.last_problem = Breaker.OPEN, why, problem
        if why == "cloud_unhealthy":
            s.hold_s = hold_s
        s.failures = 0
