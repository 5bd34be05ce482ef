"""``FleetView``: the state placement reads, and the store guard every core store call goes through.

It fetches the fleet's state from the store in one call (``Store.fleet_view``: prefix matches, in-flight counts,
snapshots; one round trip on Redis) and keeps a little of its own: in-flight counts for what this process
dispatched, the last snapshots it read, the endpoints a gateway saw die, and what the learners
(``ttft_feedback``, ``outcome_rates``, ``seat_tenure``, ``routed_prefixes``) know. The lifecycle
(``cognitora.core.lifecycle``, ``cognitora.core.learning``) feeds those; this module only reads them.

When the store fails (``StoreUnavailable``, or slower than ``placement.store_timeout_s``), ``state`` still answers
from that local state, flagged ``degraded``; ``guarded`` logs and carries on. Nothing here raises because Redis is
down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from cognitora.config import CognitoraConfig, ModelConfig
from cognitora.core.local_inflight import LocalInflight, RouterContext
from cognitora.failsafe import RateLimitedLog
from cognitora.match_checkpoints import MatchCheckpoints
from cognitora.outcome_rates import OutcomeRates
from cognitora.placement import FleetState, HealthMark
from cognitora.routed_prefixes import RoutedPrefixes, merge_matches
from cognitora.seat_tenure import SeatTenure
from cognitora.telemetry import RouterStats, Telemetry
from cognitora.ttft_feedback import TtftFeedback
from kvstate.engines import ENGINES
from kvstate.memory_store import MemoryStore
from kvstate.prompt import PromptKeys
from kvstate.store import EndpointSnapshot, Heartbeat, InFlight, MatchCheckpoint, Store, StoreUnavailable

__all__ = ["NO_WORK", "FleetView"]

# The router's own logger: what this module logs (store down and back, stale state, an endpoint marked) is what an
# operator has always filtered on as the router's.
log = logging.getLogger("cognitora.router")

_T = TypeVar("_T")
NO_WORK = InFlight()
_STORE_ERRORS = (StoreUnavailable, TimeoutError, ConnectionError, OSError)


class FleetView:
    """The fleet as this process sees it: the store's view, this process's own floor under it, and the learners.
    One per core; safe for concurrent use on its loop."""

    def __init__(
        self,
        config: CognitoraConfig,
        store: Store,
        clock: Callable[[], float],
        stats: RouterStats,
        telemetry: Telemetry,
    ) -> None:
        self.config = config
        self.store = store
        self._clock = clock
        self._stats = stats
        self._telemetry = telemetry
        self.endpoint_ids = {m.name: [e.id for e in m.endpoints] for m in config.models}
        self.local = LocalInflight()
        self.seat_tenure = SeatTenure()
        """How long requests hold a seat per endpoint, on this router's clock: the seat wait's schedule."""
        self.feedback = TtftFeedback(config.cost_model.feedback)
        self.routed = RoutedPrefixes()
        self.checkpoints = MatchCheckpoints(
            config.limits.match_checkpoint_ttl_s if getattr(store, "takes_match_checkpoints", False) else 0.0
        )
        """Where the store's prefix match stood after shared system prompts (stores that take checkpoints)."""
        self.outcome_rates = OutcomeRates(
            e.id for m in config.models for e in m.endpoints if ENGINES.get(e.engine.value).metrics_path is None
        )
        """Rates and cache reuse learned from finished attempts, for engines without metrics (MLX-LM, openai)."""
        self.shed_probes: dict[str, float] = {}
        """Per endpoint, when this router last sent a probe there instead of shedding (``placement.shed_probe``):
        the lifecycle writes it at the dispatch, placement reads it for ``placement.shed_probe_interval_s``."""
        self._snapshots: dict[str, EndpointSnapshot] = {}
        self.health_marks: dict[str, HealthMark] = {}
        """This process's own marks (``note_unhealthy``)."""
        self._shared_marks: dict[str, HealthMark] = {}
        """Other gateways' marks as of the last store read: still honoured while the store cannot be read."""
        self._store_ok = True
        # The in-process store's methods never suspend (kvstate/memory_store.py): a timeout around them cannot
        # fire and running its writes concurrently gains nothing, so its calls skip both (asyncio.timeout and
        # gather's tasks: ~65 of ~90 us of dispatched + finished). The exact class only: a subclass may suspend.
        self.store_suspends = type(store) is not MemoryStore
        self._stale_log = RateLimitedLog(log)
        self._started = clock()
        self._stale = False
        self._seen_heartbeat = False

    async def state(
        self, model: ModelConfig, prompt: PromptKeys, also: asyncio.Future[Any] | None = None
    ) -> tuple[FleetState, float | None, str | None]:
        """The state to place on, its age (the newest collector heartbeat's; None: none read) and, when it is
        stale, a note saying so. ``also``: a store call sent beside the read (the budget reservation) that must be
        over before this process's own in-flight counts are read: from there to the dispatch nothing may await,
        or requests placed meanwhile would all see the same load and pile onto one engine."""
        ids = self.endpoint_ids[model.name]
        now = self._clock()
        read_started = time.perf_counter()
        # Prefix-match checkpoints (cognitora.match_checkpoints): resume from the deepest one this prompt begins
        # with, and ask for one where it parts from the latest prompt that began the same way.
        checkpoints = self.checkpoints.enabled and bool(prompt.keys)
        resume: MatchCheckpoint | None = None
        asked: tuple[str, ...] = ()
        if checkpoints:
            asked = tuple(ids)
            resume = self.checkpoints.find(model.name, prompt.keys, asked, now)
            at = prompt.reused_blocks
            read = self.store.fleet_view(model.name, prompt.keys, ids, checkpoint=at, resume=resume)
        else:
            read = self.store.fleet_view(model.name, prompt.keys, ids)
        view = await self.guarded(read, "read the fleet state")
        self._telemetry.store_read(time.perf_counter() - read_started, ok=view is not None)
        if checkpoints and view is not None:
            self.checkpoints.outcome(resume, view.resumed)
            if view.checkpoint is not None:
                self.checkpoints.keep(model.name, prompt.keys, view.checkpoint, asked, now)
        if also is not None and not also.done():
            await asyncio.wait([also])
        local = self.local.totals(ids, now)
        seats = self.seat_tenure.progress(self.local.seat_ages(ids, now)) if local else {}
        bias = self.feedback.factors(ids, now)
        routed = self.routed.match(model.name, prompt.keys, now)
        probes = {e: self.shed_probes[e] for e in ids if e in self.shed_probes} if self.shed_probes else {}
        if view is None:
            context = self._context(ids, local, self._snapshots)
            degraded = FleetState(
                now=now,
                matches=self.outcome_rates.discount(routed),
                inflight={e: local.get(e, NO_WORK) for e in ids},
                snapshots=self.outcome_rates.overlay(
                    self.local.unqueued({e: s for e, s in self._snapshots.items() if e in ids}), ids, now
                ),
                health_marks=_newest_marks(self._shared_marks, self.health_marks),
                context_tokens=context.tokens,
                context_since_snapshot=context.since_snapshot,
                kv_tokens=context.kv_tokens,
                kv_since_snapshot=context.kv_since_snapshot,
                seat_progress=seats,
                ttft_bias=bias,
                shed_probes=probes,
                degraded=True,
            )
            return degraded, None, None  # (already flagged: ``degraded``)
        snapshots = view.snapshots
        self._snapshots.update(snapshots)
        if view.health_marks or self._shared_marks:  # (nearly always neither: skip the loop)
            for endpoint in ids:
                mark = view.health_marks.get(endpoint)
                if mark is None:
                    self._shared_marks.pop(endpoint, None)
                else:
                    self._shared_marks[endpoint] = mark
        if self.health_marks:
            self._forget_healed(snapshots, now)
        inflight = view.inflight
        context = self._context(ids, local, snapshots)
        if local:
            inflight = {e: _at_least(inflight.get(e), local.get(e)) for e in ids}
        state = FleetState(
            now=now,
            matches=self.outcome_rates.discount(merge_matches(view.matches, routed)),
            inflight=inflight,
            snapshots=self.outcome_rates.overlay(self.local.unqueued(snapshots), ids, now),
            health_marks=_newest_marks(view.health_marks, self.health_marks),
            context_tokens=context.tokens,
            context_since_snapshot=context.since_snapshot,
            kv_tokens=context.kv_tokens,
            kv_since_snapshot=context.kv_since_snapshot,
            seat_progress=seats,
            ttft_bias=bias,
            shed_probes=probes,
        )
        age = min((beat.age_s for beat in view.heartbeats.values()), default=None)
        return state, age, self._staleness(view.heartbeats, now)

    def local_totals(self, model: str) -> dict[str, InFlight]:
        """This process's own in-flight work on ``model``'s endpoints (the failsafe's floor)."""
        return self.local.totals(self.endpoint_ids.get(model, []), self._clock())

    def _context(
        self, ids: Sequence[str], local: Mapping[str, InFlight], snapshots: Mapping[str, EndpointSnapshot]
    ) -> RouterContext:
        if not local:
            return RouterContext()
        return self.local.context(ids, {e: s.last_seen for e, s in snapshots.items()})

    def _staleness(self, beats: Mapping[str, Heartbeat], now: float) -> str | None:
        """None when the newest collector heartbeat is within ``placement.state_max_age_s``; else a note saying how
        stale the state is (also logged, at most once a minute)."""
        bound = self.config.placement.state_max_age_s
        if beats:
            self._seen_heartbeat = True
            name, newest = min(beats.items(), key=lambda item: item[1].age_s)
            age = newest.age_s
            if age <= bound:
                if self._stale:
                    self._stale = False
                    self._stale_log.reset()
                    log.warning("fleet state fresh again: collector heartbeat %.1f s old (%s)", age, name)
                return None
            note = (
                f"stale state: the newest collector heartbeat ({name}) is {age:.0f} s old, over "
                f"placement.state_max_age_s ({bound:g} s): cache and load state may be out of date"
            )
        elif self._seen_heartbeat:
            note = "stale state: the collector heartbeat is gone from the store: nothing feeds the fleet state"
        elif now - self._started > bound:
            note = (
                f"stale state: no collector heartbeat in the store {now - self._started:.0f} s after this router "
                "started: nothing feeds the fleet state"
            )
        else:
            return None  # just started: a collector starting beside it gets its chance to beat first
        self._stale = True
        self._stale_log.warning(f"{note}; is `cognitora collector` running and reaching the store?")
        return note

    def _forget_healed(self, snapshots: dict[str, EndpointSnapshot], now: float) -> None:
        for endpoint, mark in list(self.health_marks.items()):
            snap = snapshots.get(endpoint)
            healed = snap is not None and snap.healthy and snap.last_seen > mark.since
            if healed or now - mark.since >= self.config.placement.unhealthy_mark_ttl_s:
                del self.health_marks[endpoint]

    # -- health marks -------------------------------------------------------------------------------------------
    def note_unhealthy(self, endpoint: str, reason: str) -> None:
        """A gateway saw ``endpoint`` fail: stop picking it in this process at once."""
        now = self._clock()
        self.health_marks[endpoint] = HealthMark(since=now, reason=reason)
        self._stats.marked_unhealthy += 1
        log.warning("endpoint %s marked unhealthy: %s", endpoint, reason)

    async def share_unhealthy(self, endpoint: str, reason: str) -> None:
        """Write the mark to the store, so other gateway replicas stop picking it at their next decision."""
        await self.store.mark_unhealthy(endpoint, reason, self.config.placement.unhealthy_mark_ttl_s)

    # -- store access that degrades instead of failing ------------------------------------------------------
    async def guarded(self, call: Awaitable[_T], what: str) -> _T | None:
        """Await a store call within the store timeout; None (logged, counted) if it fails or is too slow."""
        timeout_s = self.config.placement.store_timeout_s
        try:
            if self.store_suspends:
                async with asyncio.timeout(timeout_s):
                    result = await call
            else:
                result = await call
        except TimeoutError:
            self._store_failed(what, f"no answer within {timeout_s} s")
            return None
        except _STORE_ERRORS as exc:
            self._store_failed(what, str(exc) or type(exc).__name__)
            return None
        if not self._store_ok:
            log.warning("store reachable again")
            self._store_ok = True
        return result

    def _store_failed(self, what: str, why: str) -> None:
        self._stats.store_errors += 1
        if self._store_ok:
            log.warning("store unavailable (could not %s: %s); deciding on local state until it returns", what, why)
            self._store_ok = False


def _at_least(store_view: InFlight | None, local: InFlight | None) -> InFlight:
    """The store counts every gateway's work, ours included, unless a write of ours was lost: take the larger."""
    if local is None:
        return store_view or NO_WORK
    if store_view is None:
        return local
    return InFlight(
        max(store_view.requests, local.requests),
        max(store_view.prefill_tokens, local.prefill_tokens),
        max(store_view.decode_tokens, local.decode_tokens),
    )


def _newest_marks(shared: Mapping[str, HealthMark], local: Mapping[str, HealthMark]) -> dict[str, HealthMark]:
    """The store's marks and this router's own, the newest per endpoint (ours may not have reached the store)."""
    if not local:
        return dict(shared)
    out = dict(shared)
    for endpoint, mark in local.items():
        other = out.get(endpoint)
        if other is None or mark.since > other.since:
            out[endpoint] = mark
    return out
