"""The lifecycle of dispatched requests: ``Lifecycle`` counts each ``Attempt`` (``cognitora.core.attempt``) it
makes, redispatches it, feeds the learners from its end, settles its budget and forgets it.

- **counted at once**: a dispatch is counted in this process before ``Router.admit`` returns (its in-flight work
  and its prefix, speculative), and in the shared store in the background, on the attempt's chain of writes;
- **health from the outcome**: the core, not the adapter, decides whether an outcome means the endpoint is gone
  (``OutcomeKind.marks_unhealthy``);
- **no lost end**: an attempt whose end is never reported is finished as ``ABANDONED`` after
  ``placement.inflight_ttl_s``; a cloud attempt, after its target's ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from cognitora.burst.policy import BurstPolicy
from cognitora.config import CognitoraConfig
from cognitora.core.attempt import Attempt
from cognitora.core.fleet_view import FleetView
from cognitora.core.learning import RECENT_OUTCOMES, OutcomeLearning
from cognitora.core.local_inflight import LocalRequest
from cognitora.core.outcome import AttemptRecord, Outcome, OutcomeKind
from cognitora.decision import Decision
from cognitora.flow.outcome import WakeReason
from cognitora.kv_event_sources import reports_kv_events
from cognitora.telemetry import RouterStats, Telemetry
from cognitora.token_agreement import TokenAgreement
from kvstate.store import Store

if TYPE_CHECKING:
    from cognitora.budgets.gate import BudgetGate

__all__ = ["RECENT_OUTCOMES", "Attempt", "Lifecycle"]


class Lifecycle:
    """Every open attempt of one core, and what their ends teach (``learning``). Call on the core's loop (an
    ``Attempt`` brings its adapters' calls there)."""

    def __init__(
        self,
        config: CognitoraConfig,
        store: Store,
        fleet: FleetView,
        *,
        clock: Callable[[], float],
        stats: RouterStats,
        telemetry: Telemetry,
        budgets: BudgetGate | None,
        burst: BurstPolicy,
    ) -> None:
        self.config = config
        self.store = store
        self.fleet = fleet
        self._clock = clock
        self.stats = stats
        self.telemetry = telemetry
        self.budgets = budgets
        self.burst = burst
        self.learning = OutcomeLearning(config, fleet, clock=clock, stats=stats, telemetry=telemetry)
        """What finished attempts teach: stats, records, TTFT feedback, outcome rates, token agreement."""
        self._attempts: dict[str, Attempt] = {}
        self._groups: dict[str, set[str]] = {}
        self._writers: set[asyncio.Task[None]] = set()
        self._next_attempt_prune = 0.0
        self._cloud_deadlines: dict[str, asyncio.TimerHandle] = {}
        """Open cloud attempts' ends by their target's ``timeout_s`` (``_count``), by request id."""
        self.on_freed: Callable[[Attempt, WakeReason], None] | None = None
        """Told when a local attempt's prefill or whole life ends here: the gateway queue tries again
        (``cognitora.core.flow_gate``)."""

    def dispatch(self, decision: Decision, *, group: str | None = None) -> Attempt:
        """The gateway is sending ``decision``'s request to its endpoint: count its work and mark its prefix
        speculative at once, in this process (so the next request placed sees it), and in the shared store in the
        background. Call on the router's loop. Idempotent: the same decision gives the same attempt."""
        known = self._attempts.get(decision.request_id)
        if known is not None:
            return known
        attempt = Attempt(self, decision, group, asyncio.get_running_loop())
        self._count(attempt)
        return attempt

    def attempt(self, request_id: str) -> Attempt | None:
        """The open attempt of a placed request, by ``Decision.request_id`` (None once it finished)."""
        return self._attempts.get(request_id)

    def open_attempts(self) -> list[Attempt]:
        """Attempts dispatched and not finished yet."""
        return list(self._attempts.values())

    def recent_outcomes(self) -> list[AttemptRecord]:
        """The last ``RECENT_OUTCOMES`` finished attempts, prediction beside achievement, oldest first."""
        return self.learning.recent_outcomes()

    def ttft_bias_factors(self) -> dict[str, float]:
        """Each endpoint's learned TTFT feedback factor (those with enough samples), for metrics."""
        return self.fleet.feedback.known()

    @property
    def token_agreement(self) -> TokenAgreement:
        """The router's prompt-token counts against the engines' own (``usage.prompt_tokens``); a reload's new
        Router takes its predecessor's (``Router``), so that they accumulate across configs."""
        return self.learning.token_agreement

    @token_agreement.setter
    def token_agreement(self, agreement: TokenAgreement) -> None:
        self.learning.token_agreement = agreement

    def _count(self, attempt: Attempt) -> None:
        decision = attempt.decision
        endpoint = attempt.endpoint
        params = self.config.placement
        now = self._clock()
        self.prune_attempts(now)
        self._attempts[decision.request_id] = attempt
        if attempt.group is not None:
            self._groups.setdefault(attempt.group, set()).add(decision.request_id)
        if decision.cloud is not None:  # not the fleet's work: no in-flight count, no cache, no store write
            self.stats.dispatched += 1
            lease_s = self.burst.dispatched(decision)
            # Whatever the gateway reports (or never does), the cloud attempt ends by its target's timeout_s: its
            # slot is never held longer (a hung cloud otherwise kept every slot, refusing each later burst).
            self._cloud_deadlines[decision.request_id] = asyncio.get_running_loop().call_later(
                lease_s, attempt.finish, Outcome(OutcomeKind.TIMEOUT, detail=f"no end within {lease_s:g} s (timeout_s)")
            )
            return
        prefill = _queued_prefill(decision)
        leg = decision.prefill
        expires = now + params.inflight_ttl_s
        # A pair's prefill queues on its prefill endpoint; the decode endpoint holds the decode only.
        entry = LocalRequest(
            endpoint,
            0 if leg else prefill,
            decision.expected_decode_tokens,
            expires,
            context_tokens=decision.prompt_tokens + decision.expected_decode_tokens / 2,
            kv_tokens=max(0.0, decision.prompt_tokens - decision.predicted_cached_tokens)
            + decision.expected_decode_tokens / 2,
            dispatched_at=now,
        )
        self.fleet.local.add(decision.request_id, entry, now)
        if leg is not None:
            self.fleet.local.add(
                _prefill_leg_id(decision.request_id), LocalRequest(leg.endpoint, prefill, 0, expires), now
            )
        self.stats.dispatched += 1
        if decision.shed_probe:  # the next probe there waits placement.shed_probe_interval_s (placement.shed_probe)
            self.fleet.shed_probes[endpoint] = now
        ttl = self._history_ttl(endpoint)
        if decision.keys:
            self.fleet.routed.add(self._key_space(decision), endpoint, decision.keys, now, now + ttl)
        # Without a first-token report (LiteLLM's SDK streams have no per-chunk hook) the prefill would count as
        # queued until the stream ends: past a deadline well beyond the prediction, it is taken as done.
        attempt.watch_prefill(
            max(params.prefill_report_min_s, params.prefill_report_factor * decision.predicted_ttft_s)
        )
        attempt.queue_write(lambda: self._share_dispatch(decision, endpoint, prefill, ttl), "record a dispatch")

    async def _share_dispatch(self, decision: Decision, endpoint: str, prefill: int, ttl: float) -> None:
        leg, lease = decision.prefill, self.config.placement.inflight_ttl_s
        calls: list[Awaitable[object]] = [
            self.store.inflight_add(
                endpoint, decision.request_id, 0 if leg else prefill, decision.expected_decode_tokens, lease
            )
        ]
        if leg is not None:
            calls.append(self.store.inflight_add(leg.endpoint, _prefill_leg_id(decision.request_id), prefill, 0, lease))
        if decision.keys:
            calls.append(self.store.add_speculative(self._key_space(decision), endpoint, decision.keys, ttl))
            if leg is not None:  # the prefill endpoint computes the prompt and keeps it cached
                calls.append(self.store.add_speculative(self._key_space(decision), leg.endpoint, decision.keys, ttl))
        if self.fleet.store_suspends:
            await asyncio.gather(*calls)
        else:
            await _one_after_another(calls)

    def _key_space(self, decision: Decision) -> str:
        """The model whose block index holds the decision's keys: the base model when the request named one of its
        LoRA adapters (``Decision.model`` stays the adapter's name: it is what the engine is asked for)."""
        model = self.config.model(decision.model)
        return decision.model if model is None else model.name

    def _history_ttl(self, endpoint_id: str) -> float:
        """Events confirm what an engine caches within moments; without events, routing history is all we have."""
        endpoint = self.config.endpoint(endpoint_id)
        params = self.config.placement
        if endpoint is not None and not reports_kv_events(endpoint, self.config.engine_pulls.trtllm_kv_events):
            return params.routing_history_ttl_s
        return params.speculative_ttl_s

    def attempt_prefill_done(self, attempt: Attempt) -> None:
        """From the attempt only: its prefill is over (first token, or its deadline passed)."""
        if self._attempts.get(attempt.request_id) is not attempt or attempt.decision.cloud is not None:
            return
        self.fleet.local.prefill_done(attempt.request_id, self._clock())
        endpoint, rid = attempt.endpoint, attempt.request_id
        attempt.queue_write(lambda: self.store.inflight_prefill_done(endpoint, rid), "record a first token")
        self._release_prefill_leg(attempt)
        if self.on_freed is not None:
            self.on_freed(attempt, WakeReason.FIRST_TOKEN)

    def _release_prefill_leg(self, attempt: Attempt) -> None:
        """A pair's prefill endpoint is done with the request at its first token (or its end): release it there."""
        leg = attempt.decision.prefill
        leg_id = _prefill_leg_id(attempt.request_id)
        if leg is None or not self.fleet.local.has(leg_id):
            return
        self.fleet.local.release(leg_id)
        attempt.queue_write(lambda: self.store.inflight_release(leg.endpoint, leg_id), "release a prefill leg")

    def attempt_finished(self, attempt: Attempt, outcome: Outcome) -> None:
        """From the attempt only, once: release its work, learn from it, and decide what it says of the endpoint."""
        if attempt.outcome is not None:
            return
        attempt.outcome = outcome
        attempt.cancel_overdue()
        rid, endpoint = attempt.request_id, attempt.endpoint
        hold, attempt.budget_hold = attempt.budget_hold, None
        if hold is not None and self.budgets is not None:
            if self.burst.charges_budgets and self.burst.charged(attempt.decision, outcome):
                self.budgets.give_back_later(hold)  # charged at the cloud target's prices instead (burst.finished)
            else:
                # Not on the attempt's write chain: that chain's per-write timeout could cut a settle short.
                self.budgets.settle_later(hold, outcome)
        self._forget(attempt)
        self._release_prefill_leg(attempt)
        if attempt.decision.cloud is not None:
            deadline = self._cloud_deadlines.pop(rid, None)
            if deadline is not None:
                deadline.cancel()
            first = None if attempt.first_token_at is None else attempt.first_token_at - attempt.dispatched_at
            who = None if hold is None else hold.reservation.identity
            self.burst.finished(attempt.decision, outcome, first_token_s=first, group=attempt.group, identity=who)
            self.learning.learn(attempt, outcome)
            return
        if self.burst.probes.active:  # a local probe of a class in burst (cognitora.burst.probes)
            self.burst.local_finished(rid, _achieved_s(attempt, outcome))
        seated = self.fleet.local.seat_since(rid)
        if outcome.ok and seated is not None:
            self.fleet.seat_tenure.observe(endpoint, self._clock() - seated)
        self.fleet.local.release(rid, self._clock())
        self.learning.learn(attempt, outcome)
        if outcome.kind.marks_unhealthy(outcome.status):
            reason = f"{outcome.kind.value}: {outcome.detail}" if outcome.detail else outcome.kind.value
            self.fleet.note_unhealthy(endpoint, reason)
            attempt.queue_write(lambda: self.fleet.share_unhealthy(endpoint, reason), "share an unhealthy mark")
        attempt.queue_write(lambda: self.store.inflight_release(endpoint, rid), "release in-flight work")
        if self.on_freed is not None:
            self.on_freed(attempt, WakeReason.FINISHED)

    def redispatch(self, attempt: Attempt, endpoint: str) -> Attempt:
        """The gateway moved ``attempt``'s request to ``endpoint``: a new attempt there, with what placement
        predicted for that endpoint, timed from the original dispatch (the client waited all along)."""
        decision = attempt.decision
        score = next((c for c in decision.candidates if c.endpoint == endpoint), None)
        others = decision.cloud.local_fallbacks if decision.cloud is not None else decision.fallbacks
        moved = replace(
            decision,
            request_id=f"{decision.request_id}.{endpoint}",
            endpoint=endpoint,
            url=self._endpoint_url(endpoint),
            predicted_cached_tokens=score.cached_tokens if score is not None else 0.0,
            predicted_ttft_s=score.predicted_ttft_s if score is not None else decision.predicted_ttft_s,
            fallbacks=tuple(e for e in others if e != endpoint),
            prefill=None,  # counted as whole where it landed: the prediction above is the whole placement's
            cloud=None,  # a burst request retried on a local engine is local from here on
        )
        new = self.dispatch(moved, group=attempt.group)
        new.dispatched_at = attempt.dispatched_at
        return new

    def _forget(self, attempt: Attempt) -> None:
        rid = attempt.request_id
        if self._attempts.get(rid) is attempt:
            del self._attempts[rid]
        if attempt.group is not None:
            ids = self._groups.get(attempt.group)
            if ids is not None:
                ids.discard(rid)
                if not ids:
                    del self._groups[attempt.group]

    def abandon_group(self, group: str, why: str) -> None:
        for rid in list(self._groups.get(group, ())):
            attempt = self._attempts.get(rid)
            if attempt is not None:
                attempt.finish(Outcome(OutcomeKind.ABANDONED, detail=why))

    def prune_attempts(self, now: float) -> None:
        """Finish (abandoned) every attempt open longer than ``placement.inflight_ttl_s``; at most once a minute.
        Each dispatch calls it; a Router a reload replaced gets no dispatch, and its retirement calls it instead
        (``cognitora.ops.reload``): one unreported attempt must not keep a retired Router alive for good."""
        # An attempt whose end no gateway hook ever reported: its store lease expires after the same age, so
        # finishing it here loses nothing and keeps the registry bounded.
        if now < self._next_attempt_prune:
            return
        params = self.config.placement
        self._next_attempt_prune = now + min(60.0, params.inflight_ttl_s)
        oldest = time.monotonic() - params.inflight_ttl_s
        for attempt in [a for a in self._attempts.values() if a.dispatched_at < oldest]:
            attempt.finish(Outcome(OutcomeKind.ABANDONED, detail="no end reported within placement.inflight_ttl_s"))

    def track_writer(self, task: asyncio.Task[None]) -> None:
        """From the attempt: a chain of its store writes, which ``close`` waits for."""
        self._writers.add(task)
        task.add_done_callback(self._writers.discard)

    async def close(self) -> None:
        """Let every attempt's store writes land."""
        if self._writers:
            await asyncio.gather(*self._writers, return_exceptions=True)

    def _endpoint_url(self, endpoint_id: str) -> str | None:
        endpoint = self.config.endpoint(endpoint_id)
        return None if endpoint is None else endpoint.url


def _prefill_leg_id(request_id: str) -> str:
    """The in-flight entry of a pair's prefill half, on its prefill endpoint."""
    return f"{request_id}.prefill"


def _achieved_s(attempt: Attempt, outcome: Outcome) -> float | None:
    """What a finished local attempt measured of its endpoint for a burst probe: its first token after dispatch, or
    its whole answer where the gateway saw no first token; None when it failed."""
    if attempt.first_token_at is not None:
        return attempt.first_token_at - attempt.dispatched_at
    return time.monotonic() - attempt.dispatched_at if outcome.ok else None


def _queued_prefill(decision: Decision) -> int:
    """The prompt tokens a dispatched request will prefill: what the placement did not expect to find cached."""
    return max(0, decision.prompt_tokens - round(decision.predicted_cached_tokens))


async def _one_after_another(calls: Sequence[Awaitable[object]]) -> None:
    """``gather`` for calls that never suspend, without a task each: every call runs; the first error is raised."""
    first_error: BaseException | None = None
    for call in calls:
        try:
            await call
        except Exception as exc:
            first_error = first_error or exc
    if first_error is not None:
        raise first_error
