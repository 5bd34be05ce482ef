"""``FlowGate``: the core's side of the gateway queue (``cognitora.flow``), between ``Router.admit`` and the fleet.

    wait = gate.should_wait(request, decision)     # the fleet is saturated for it, or its band already queues
    result = await gate.wait(request, decision, wait, hold=hold, group=group)   # placed when it leaves, or refused

A request that should wait is not committed: it waits in the ``FlowController`` (its own task suspended on one
future; no thread) and is placed again, on the fleet as it is then, when the queue's dispatcher picks it
(``place``: the ``Placer`` the controller calls). Placed, it is dispatched and leased in the same step, and its
budget hold moves into its attempt. Refused (timeout, full, shutdown), the controller has given its hold back;
``Router.admit`` then asks the burst policy, else answers the queue's 429 with Retry-After.

Capacity wake-ups come from the lifecycle (``freed``: a finish, a first token) and from lease releases. The same
calls end a request's in-flight prefill for team isolation (``cognitora.flow.isolation``), which ``committed``
starts (every local dispatch, queued or not). Leases (``flow_control.leases``) are taken only for requests
dispatched from the queue, on engines that declare ``max_num_seqs``: docs/flow_control.md, "Across gateway
replicas", says what that counts and its limits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from cognitora.config import CognitoraConfig
from cognitora.core.attempt import Attempt
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.decision import Decision
from cognitora.flow.bands import plan_bands
from cognitora.flow.config import FlowControlConfig, HoldReason
from cognitora.flow.controller import FlowController, Ticket
from cognitora.flow.isolation import TeamActivity, TeamPrefill, isolation_hold, prefill_endpoint
from cognitora.flow.leases import FairCharge, Leases, MemoryLeases, SharedMargin
from cognitora.flow.margin import PredictionMargin
from cognitora.flow.outcome import Held, QueueRefusal, WakeReason
from cognitora.flow.priority import BandActivity, depth_hold, priority_hold
from cognitora.flow.saturation import (
    Saturation,
    chosen_ttft_s,
    clock_known,
    clock_rate,
    own_ttft_s,
    request_cost,
    saturation_of,
)
from cognitora.flow.telemetry import FlowTelemetry
from cognitora.request import RouteRequest
from kvstate.store import StoreUnavailable

if TYPE_CHECKING:
    from cognitora.budgets.gate import BudgetGate, Hold

__all__ = ["FlowGate", "Placed", "Waiting", "configured_seats", "flow_of"]

log = logging.getLogger("cognitora.flow")


@dataclass(frozen=True)
class Waiting:
    """Why a request joins the queue: its band and flow, its cost, and the saturation (None: others wait ahead)."""

    band: str
    flow: str
    cost: float
    saturation: Saturation | None
    max_wait_s: float
    """How long it may wait (``Band.wait_bound_s``: its class's ``max_wait_s``, else what its objective leaves
    after its own predicted TTFT)."""
    objective_s: float | None = None
    """Its class's TTFT objective in gateway seconds: its deadline in the queue (``FlowController.wait``)."""


@dataclass(frozen=True)
class Placed:
    """A queued request the dispatcher placed: its decision on the fleet as it was then, and its attempt (None:
    refused by placement meanwhile for another reason than saturation, e.g. every engine went unhealthy)."""

    decision: Decision
    attempt: Attempt | None
    waited_s: float


@dataclass(frozen=True)
class _Queued:
    request: RouteRequest
    group: str | None
    hold: Hold | None


def configured_seats(config: CognitoraConfig, endpoint_id: str) -> int | None:
    """The endpoint's configured ``max_num_seqs`` (its own ``cost``, else ``cost_model.priors``): what a lease
    counts against. A learned seat count is not used: replicas must agree on the capacity."""
    endpoint = config.endpoint(endpoint_id)
    if endpoint is None:
        return None
    return endpoint.cost.max_num_seqs or config.cost_model.priors.max_num_seqs


def _held_for_itself(saturation: Saturation | None) -> bool:
    """Whether a request held at admission for ``saturation`` was held for its own sake, as ``FlowGate.place``
    answers ``Held.only_this`` for the same hold: its prompt against the load (``kv``, ``slo``) or its team's
    isolation; not every seat taken (nothing fits), nor a higher band's room (``priority``: the band's, not this
    request's). Until the dispatcher tries it, another team's newcomer may go past it
    (``FlowController.must_queue``)."""
    return saturation is not None and saturation.reason is not HoldReason.SEATS and saturation.kind != "priority"


def flow_of(request: RouteRequest) -> str:
    """The fairness flow of a request: its trusted team, else its key, else ``anonymous`` (never the body)."""
    who = request.identity
    if who.team:
        return f"team:{who.team}"
    if who.key:
        return f"key:{who.key}"
    return "anonymous"


class FlowGate:
    """One per Router. ``place``: a quiet placement (nothing recorded); ``record``: the router's record of the
    decision it finally made; ``dispatch``: the lifecycle's."""

    def __init__(
        self,
        config: CognitoraConfig,
        flow: FlowControlConfig,
        *,
        place: Callable[[RouteRequest], Awaitable[Decision]],
        record: Callable[[Decision], Decision],
        dispatch: Callable[[Decision, str | None], Attempt],
        budgets: BudgetGate | None,
        leases: Leases | None = None,
    ) -> None:
        self.config = config
        self.flow = flow
        self._place = place
        self._record = record
        self._dispatch = dispatch
        self._budgets = budgets
        self.telemetry = FlowTelemetry()
        """Waits by band, flow and how they ended (the controller's ``snapshot`` has the counters and depths)."""
        self.leases = leases if leases is not None else (MemoryLeases() if flow.leases.enabled else None)
        slos = {name: p.ttft_slo_s for name, p in config.placement.priorities.items()}
        bands = plan_bands(flow, slos)
        self.bands = {b.name: b for b in bands}
        self.controller: FlowController[_Queued, Placed] = FlowController(
            flow, bands, self, observer=self.telemetry.departed
        )
        self.margin = PredictionMargin(flow.margin)
        """How late this process's requests were against their predicted TTFT: what its predictions are multiplied
        by (``cognitora.flow.margin``)."""
        self.activity = BandActivity([(b.name, slos[b.name]) for b in bands], flow.priority_window_s)
        """Which higher bands' objectives cap what lower bands commit (``cognitora.flow.priority``)."""
        self.teams: TeamActivity | None = None
        """Which teams were seen lately per band (team isolation; None when ``flow_control.isolation`` is off)."""
        self.prefill: TeamPrefill | None = None
        """In-flight prefill per engine per team, as this process placed it (team isolation)."""
        if flow.isolation.enabled:
            self.teams = TeamActivity([b.name for b in bands], flow.isolation.window_s)
            self.prefill = TeamPrefill()
        self._leased: dict[str, str] = {}
        """Request id -> the engine its lease is on."""

    # -- Router.admit's calls ---------------------------------------------------------------------------------
    def should_wait(self, request: RouteRequest, decision: Decision, *, margin: float | None = None) -> Waiting | None:
        """Whether ``decision``'s request waits in the queue (docs/flow_control.md, "When a request waits").
        ``margin``: the prediction margin to decide with instead of this process's (``cognitora explain``, which
        times no request, passes the one the gateway replicas shared)."""
        if decision.cloud is not None or request.pinned_endpoint is not None:
            return None
        priority = request.identity.priority
        pclass = self.config.placement.priorities.get(priority)
        if pclass is None:
            return None
        flow = flow_of(request)
        own = own_ttft_s(decision)
        self.activity.saw(priority, own)
        if self.teams is not None:
            self.teams.saw(priority, flow)
        if margin is None:
            margin = self.margin.factor
        saturation = (
            self._saturation(decision, pclass.ttft_slo_s, margin)
            or self._below(priority, decision, margin)
            or self._isolated(priority, flow, decision)
        )
        if saturation is not None:
            self.telemetry.held("admission", saturation.kind)
        elif not (decision.endpoint is not None and self.controller.must_queue(priority, flow)):
            return None
        cost = request_cost(decision, self.flow.fairness, self.flow.min_cost_tokens)
        band = self.bands[priority]
        bound = band.wait_bound_s(None if own is None else own * margin)
        if band.max_wait_s is None:  # what the objective leaves, engine seconds: the queue waits on the gateway's
            bound /= clock_rate(decision)
        return Waiting(priority, flow, cost, saturation, bound, pclass.ttft_slo_s / clock_rate(decision))

    async def wait(
        self, request: RouteRequest, decision: Decision, why: Waiting, *, hold: Hold | None, group: str | None
    ) -> Placed | QueueRefusal:
        """Wait in the queue until placed, or refused. Cancelled (the client went away): it leaves at once, its hold
        given back, and the cancel goes on."""
        fixed = replace(request, rewrite=decision.rewrite) if decision.rewrite is not None else request
        budgets = self._budgets

        def give_back() -> None:
            if hold is not None and budgets is not None:
                budgets.give_back_later(hold)

        waiting = self.controller.wait(
            _Queued(fixed, group, hold),
            request_id=request.request_id,
            band=why.band,
            flow=why.flow,
            cost=why.cost,
            saturation=why.saturation,
            give_back=give_back,
            max_wait_s=why.max_wait_s,
            held_itself=_held_for_itself(why.saturation),
            objective_s=why.objective_s,
        )
        if self.leases is None:
            return await waiting
        task = asyncio.ensure_future(waiting)
        try:
            await asyncio.sleep(0)  # it is in the queue now: the depth the other replicas read includes it
            await self._publish_depth()
            return await task
        finally:
            if not task.done():
                task.cancel()  # our caller was cancelled: the queue's own cancel path gives the hold back
            await self._publish_depth()

    async def _publish_depth(self) -> None:
        """Sent with this replica's next heartbeat (no round trip now): ``cognitora explain`` and the dashboard."""
        if self.leases is not None:
            await self.leases.publish_depth(self.controller.waiting_by_band())

    def _below(self, band: str, decision: Decision, margin: float) -> Saturation | None:
        """Held for a higher band: its objective is the ceiling of what this band may commit while it is active
        (``cognitora.flow.priority``; part of the ``slo`` hold reason)."""
        if HoldReason.SLO not in self.flow.hold_on or decision.cloud is not None:
            return None
        ceiling = self.activity.ceiling(band, self.controller.waiting_by_band())
        if ceiling is not None:
            if ceiling.rate_per_s is not None:  # arrivals per gateway second, during engine seconds of work
                ceiling = replace(ceiling, rate_per_s=ceiling.rate_per_s / clock_rate(decision))
            return priority_hold(decision, ceiling, margin, self.flow.priority_arrivals_quantile)
        recent = self.activity.recent(band)
        return None if recent is None else depth_hold(decision, recent, margin)

    def _isolated(self, band: str, flow: str, decision: Decision) -> Saturation | None:
        """Held for team isolation: another team is active in ``band`` and could use the engine, and committing
        ``decision`` would leave no eligible engine free of ``flow``'s in-flight prefill
        (``cognitora.flow.isolation``)."""
        if self.teams is None or self.prefill is None or decision.endpoint is None or decision.cloud is not None:
            return None
        busy = self.prefill.busy(flow)
        if not busy:  # the common case below saturation: nothing of this team's in flight, nothing to look up
            return None
        rivals = self.teams.rivals(band, flow, self.controller.waiting_flows(band))
        return isolation_hold(decision, flow, busy, rivals, time.monotonic(), self.prefill.busy)

    def committed(self, request: RouteRequest, attempt: Attempt) -> None:
        """``attempt`` was dispatched to a local engine (placed at once or from the queue): its prefill is in flight
        there for its team until ``freed`` says otherwise, or ``prefill_margin`` x its predicted TTFT passes."""
        decision = attempt.decision
        endpoint = prefill_endpoint(decision)
        if self.prefill is None or decision.cloud is not None or endpoint is None:
            return
        duration = self.flow.isolation.prefill_margin * decision.predicted_ttft_s / clock_rate(decision)
        self.prefill.add(attempt.request_id, flow_of(request), endpoint, duration)

    def _saturation(
        self, decision: Decision, ttft_slo_s: float, margin: float, waited_s: float = 0.0
    ) -> Saturation | None:
        """The hold rule (``saturation_of``, with the prediction margin and the wait so far), and one more reading
        of ``seats``: every eligible engine runs as many requests as its configured ``max_num_seqs``. The seat
        wait placement predicts is 0 while the engine's service time is unknown (nothing finished there yet: a
        cold start, or a ramp of load), and the seats are no less taken then."""
        found = saturation_of(decision, ttft_slo_s, self.flow.hold_on, margin=margin, waited_s=waited_s)
        if found is not None or HoldReason.SEATS not in self.flow.hold_on or decision.cloud is not None:
            return found
        if decision.rejection is not None and not decision.saturated:
            return None
        eligible = [c for c in decision.candidates if c.excluded is None]
        if not eligible:
            return None
        for c in eligible:
            seats = configured_seats(self.config, c.endpoint)
            if seats is None or c.running < seats:
                return None
        return Saturation(
            HoldReason.SEATS,
            f"every engine's seats are taken ({eligible[0].running} running on "
            f"{eligible[0].endpoint}, max_num_seqs {configured_seats(self.config, eligible[0].endpoint)})",
        )

    # -- the lifecycle's ----------------------------------------------------------------------------------------
    def freed(self, attempt: Attempt, why: WakeReason) -> None:
        """An attempt's prefill or whole life ended here: its lease (if any) goes back, its team's in-flight prefill
        on its engine ends, its first token (if timed) tells the prediction margin how late it was, and the queue
        tries again."""
        first, decision = attempt.first_token_at, attempt.decision
        # Not on an unknown clock: a LiteLLM proxy's core starts at its first request, before its collector's first
        # scrape, and the burst placed then read 2x late on the simulator at time scale 0.5 (docs/flow_control.md)
        if why is WakeReason.FIRST_TOKEN and first is not None and decision.cloud is None and clock_known(decision):
            achieved = (first - attempt.dispatched_at) * clock_rate(decision)
            self._observe_margin(decision.predicted_ttft_s, achieved)
        if self.prefill is not None:
            self.prefill.done(attempt.request_id)
        if why is WakeReason.FINISHED:
            endpoint = self._leased.pop(attempt.request_id, None)
            if endpoint is not None and self.leases is not None:
                asyncio.get_running_loop().create_task(self._release(endpoint, attempt.request_id))
        self.controller.wake(why)

    def _observe_margin(self, predicted_s: float, achieved_s: float) -> None:
        """One first token for the prediction margin; a move of 0.05 or more is logged (what admission uses). The
        margin goes to the leases too, which send it with the replica's next heartbeat (``cognitora explain``)."""
        before = self.margin.factor
        self.margin.observe(predicted_s, achieved_s)
        after = self.margin.factor
        if self.leases is not None and self.margin.samples:
            self.leases.publish_margin(SharedMargin(after, self.margin.samples))
        if abs(after - before) >= 0.05:
            log.info(
                "flow control: prediction margin %.2f (was %.2f): the %g quantile of %d requests' achieved / "
                "predicted TTFT",
                after,
                before,
                self.flow.margin.quantile,
                self.margin.samples,
            )

    async def _release(self, endpoint: str, lease_id: str) -> None:
        assert self.leases is not None
        try:
            await self.leases.release(endpoint, lease_id)
        except StoreUnavailable as exc:  # the replica's TTL releases it (docs/flow_control.md)
            log.warning("flow control: could not release a lease on %s: %s", endpoint, exc)
        self.controller.wake(WakeReason.CAPACITY)

    # -- the Placer the controller calls ------------------------------------------------------------------------
    async def place(self, ticket: Ticket[_Queued]) -> Placed | Held:
        """Place the ticket's request on the fleet as it is now; commit it (lease, dispatch, budget hold), or
        answer ``Held``. No await between the pick and its count but the lease's round trip, which the hold
        rule's re-check after it covers."""
        queued = ticket.item
        decision = await self._place(queued.request)
        waited = asyncio.get_running_loop().time() - ticket.queued_at
        pclass = self.config.placement.priorities[ticket.band]
        margin = self.margin.factor
        # A wait that follows the objective counts against it; an operator's max_wait_s means "late, not shed".
        # The wait is gateway seconds, the objective engine seconds (``clock_rate``: 1 on real engines).
        late_after = waited * clock_rate(decision) if self.bands[ticket.band].max_wait_s is None else 0.0
        saturation = self._saturation(decision, pclass.ttft_slo_s, margin, late_after)
        ttft = chosen_ttft_s(decision)
        needs = None if ttft is None else ttft * margin / clock_rate(decision)  # what it takes, gateway seconds
        if saturation is not None:
            self.telemetry.held("queue", saturation.kind)
            # seats: nothing else fits either; kv, slo: a smaller request of another flow may
            return Held(saturation.detail, only_this=saturation.reason is not HoldReason.SEATS, needs_s=needs)
        if not ticket.aged:  # the anti-starvation rule's dispatch is not held for the bands above, nor for isolation
            below = self._below(ticket.band, decision, margin)
            if below is not None:
                self.telemetry.held("queue", below.kind)
                return Held(below.detail)
            isolated = self._isolated(ticket.band, ticket.flow, decision)
            if isolated is not None:  # about this team only: another team's head may go
                self.telemetry.held("queue", isolated.kind)
                return Held(isolated.detail, only_this=True, needs_s=needs)
        if decision.endpoint is None:  # refused meanwhile for another reason (every engine unhealthy): its hold back
            if queued.hold is not None and self._budgets is not None:
                self._budgets.give_back_later(queued.hold)
            return Placed(self._record(decision), None, waited)
        if decision.cloud is None and not await self._lease(decision, ticket):
            return Held(f"every lease on {decision.endpoint} is taken")
        decision = self._record(decision)
        attempt = self._dispatch(decision, queued.group)
        attempt.budget_hold = queued.hold
        self.committed(queued.request, attempt)
        return Placed(decision, attempt, waited)

    def unclaimed(self, result: Placed) -> None:
        """Placed as its waiter left: the attempt ends as cancelled (its hold settles, its lease goes back)."""
        if result.attempt is not None:
            result.attempt.finish(Outcome(OutcomeKind.CLIENT_CANCELLED, detail="left the gateway queue"))

    async def _lease(self, decision: Decision, ticket: Ticket[_Queued]) -> bool:
        leases, endpoint = self.leases, decision.endpoint
        assert endpoint is not None
        seats = configured_seats(self.config, endpoint)
        if leases is None or seats is None:
            return True
        capacity = max(1, int(seats * self.flow.leases.overcommit))
        peers = self.controller.waiting_flows(ticket.band)
        charge = FairCharge(ticket.band, ticket.flow, ticket.cost, peers)
        try:
            grant = await leases.acquire(endpoint, decision.request_id, capacity, charge)
        except StoreUnavailable as exc:
            log.warning("flow control: leases unavailable, dispatching without one: %s", exc)
            return True
        if not grant.granted:
            return False
        self._leased[decision.request_id] = endpoint
        if grant.served:
            self.controller.absorb_served(ticket.band, grant.served, ticket.flow, ticket.cost)
        return True

    async def close(self) -> None:
        """Every waiter leaves with 503 (holds given back); this replica's leases go back."""
        await self.controller.close()
        if self.leases is not None:
            await self.leases.close()
