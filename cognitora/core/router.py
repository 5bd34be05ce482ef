"""``Router``: the one seam both gateway adapters call.

    decision, attempt = await router.admit(request)   # placed, and (when placed) counted as dispatched at once
    attempt.first_token()                             # its prefill is done
    attempt.finish(outcome)                           # released; what was achieved beside what was predicted

``place`` alone decides without side effects (``cognitora explain``). The router only decides: the prompt's keys
come from ``cognitora.core.keying``, the fleet's state from ``cognitora.core.fleet_view``, the pick from the pure
``cognitora.placement``, and the dispatched attempt is a ``cognitora.core.attempt.Attempt`` (order, once, any
thread) that ``cognitora.core.lifecycle`` counts, learns from (``cognitora.core.learning``) and settles. Build one
with ``cognitora.core.core.Core.open`` (the deployment rules, the collector) or directly over a store (tests,
``cognitora explain``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

from cognitora.budgets.gate import BudgetGate, Hold, gate_for
from cognitora.burst.ledger_spend import ledger_spend_for
from cognitora.burst.policy import BurstPolicy
from cognitora.config import DEFAULT_PRIORITY, CognitoraConfig
from cognitora.core.attempt import Attempt
from cognitora.core.fleet_view import FleetView
from cognitora.core.flow_gate import FlowGate, Placed, Waiting
from cognitora.core.keying import Keying, PromptTooLarge, invalid_unicode
from cognitora.core.lifecycle import Lifecycle
from cognitora.core.outcome import AttemptRecord
from cognitora.decision import Decision, Rejection
from cognitora.disagg import place_with_pairs, uses_pairs
from cognitora.failsafe import RateLimitedLog, fallback_decision
from cognitora.flow.leases import Leases
from cognitora.flow.outcome import QueueRefusal
from cognitora.intent import IntentSource, Rewrite
from cognitora.placement import place, reject, unknown_model
from cognitora.preflight import prompt_keyers
from cognitora.request import RouteRequest
from cognitora.surface_entry import SurfaceReader
from cognitora.telemetry import RouterStats, Telemetry
from cognitora.token_agreement import TokenAgreement
from kvstate.open import open_store
from kvstate.prompt import PromptError, PromptKeyer
from kvstate.store import Store

__all__ = ["RECENT_DECISIONS", "Router", "same_labels"]

log = logging.getLogger("cognitora.router")

RECENT_DECISIONS = 256
"""How many recent decisions the router keeps for ``cognitora explain`` and metrics."""
RECENT_DECISION_MAX_KEYS = 1024
"""A recent decision keeps its block keys only up to this many (a 16k-token prompt); a longer prompt's are dropped
from the record (~40 bytes a key: 256 records of a prompt at ``limits.exact_prompt_max_chars`` held up to 400 MB)."""


class Router:
    """Admission and placement over one ``Store``. One per gateway process; safe for concurrent use on its loop."""

    def __init__(
        self,
        config: CognitoraConfig,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        keyers: Mapping[str, PromptKeyer] | None = None,
        intent: IntentSource | None = None,
        counts: Router | None = None,
        leases: Leases | None = None,
    ) -> None:
        """``keyers``: each model's prompt keyer, loaded already (``cognitora.preflight.prompt_keyers``); absent,
        they are loaded here, and a bad tokenizer or chat template raises ``ConfigError`` naming its key.
        ``intent``: the model-rewrite source already opened (``Core.open``); absent, opened here from
        ``config.intent``. ``counts``: the Router a config reload replaces (``cognitora.ops.reload``): its
        decision counters (while the model names and priorities, their labels, are the same) and its token
        agreement go on here instead of restarting. ``leases``: the flow-control leases shared by replicas
        (``Core.open`` opens them on Redis); absent, in process when ``flow_control.leases`` is on."""
        self.config = config
        self.store = store
        self._clock = clock
        self._keyers = dict(keyers) if keyers is not None else prompt_keyers(config)
        for m in config.models:
            if m.tokenizer is None and any(e.kv_events for e in m.endpoints):
                log.warning(
                    "model %r has endpoints publishing KV events but no tokenizer: events carry token ids, so "
                    "the router's text-approximate keys cannot match them; set models[].tokenizer",
                    m.name,
                )
        if intent is None and config.intent is not None:
            intent = IntentSource(config.intent, set(config.model_names()))
        self.intent = intent
        """The model-rewrite policy in force (``cognitora.intent``), reloaded when its file changes."""
        self.telemetry = Telemetry.for_names(config.model_names(), config.placement.priorities)
        if counts is not None and same_labels(counts.config, config):
            self.telemetry = counts.telemetry
        """Decisions, attempts and store reads, by label, for ``cognitora.metrics`` and the decision log."""
        self.stats: RouterStats = self.telemetry.stats
        if self.intent is not None:
            self.telemetry.names = self.intent.label_names()
        self.keying = Keying(config, self._keyers, self.stats)
        self.surfaces = SurfaceReader(self._keyers)
        """Reads each surface's bodies (``cognitora.surface_entry``): the adapters' one entry point."""
        if counts is not None:
            self.surfaces.history = counts.surfaces.history  # a reload keeps the Responses conversations seen
        self.fleet = FleetView(config, store, clock, self.stats, self.telemetry)
        self.budgets: BudgetGate | None = gate_for(config, store, clock)
        """Token budgets (``cognitora.budgets``): reserved in ``admit``, settled at the attempt's finish."""
        self.lifecycle = Lifecycle(
            config,
            store,
            self.fleet,
            clock=clock,
            stats=self.stats,
            telemetry=self.telemetry,
            budgets=self.budgets,
            burst=BurstPolicy(config, spend=ledger_spend_for(config, self.budgets)),
        )
        if counts is not None:
            self.lifecycle.token_agreement = counts.lifecycle.token_agreement
        self.token_agreement: TokenAgreement = self.lifecycle.token_agreement
        """The router's prompt-token counts against the engines' own (``usage.prompt_tokens``)."""
        self._recent: deque[Decision] = deque(maxlen=RECENT_DECISIONS)
        self._error_log = RateLimitedLog(log)
        self._reserving: dict[str, asyncio.Future[Hold | Rejection]] = {}
        """Budget reservations ``place`` started for ``admit`` (by request id), picked up there."""
        self.flow: FlowGate | None = None
        """The gateway queue (``flow_control:``, docs/flow_control.md); None when the section is absent."""
        if leases is None and counts is not None and counts.flow is not None:
            leases = counts.flow.leases  # a reload: this replica's leases (and its heartbeat) go on
        if config.flow_control is not None:
            self.flow = FlowGate(
                config,
                config.flow_control,
                place=self._place_quietly,
                record=self._record,
                dispatch=lambda decision, group: self.lifecycle.dispatch(decision, group=group),
                budgets=self.budgets,
                leases=leases,
            )
            self.lifecycle.on_freed = self.flow.freed

    @property
    def burst(self) -> BurstPolicy:
        """Burst to a cloud target when the fleet is saturated (``cognitora.burst``); inert without ``burst:``. Its
        cloud spend is in the budgets ledger when ``budgets:`` is configured (shared by replicas), else in process.
        Admission consults it and the lifecycle settles with it: one policy, held by the lifecycle."""
        return self.lifecycle.burst

    @burst.setter
    def burst(self, policy: BurstPolicy) -> None:
        self.lifecycle.burst = policy

    @classmethod
    def from_config(cls, config: CognitoraConfig, *, keyers: Mapping[str, PromptKeyer] | None = None) -> Router:
        """A router over the store the config names: Redis (or a Redis Cluster) at ``redis_url``, else an
        in-process store."""
        return cls(config, open_store(config.redis_url, config.key_prefix, config.redis_cluster), keyers=keyers)

    # -- deciding -------------------------------------------------------------------------------------------
    async def place(self, req: RouteRequest, *, reserve: bool = False) -> Decision:
        """Where ``req`` should go, and why. Reads the store; writes nothing (``reserve``: ``admit``'s budget
        reservation is sent alongside the fleet read, once the prompt's token count is known). The model rewrite
        (``intent``) comes first, once: placement then runs among the chosen model's endpoints."""
        rewrite = req.rewrite if req.rewrite is not None else await self.rewrite(req)
        if rewrite is not None and rewrite.model != req.model:
            req = replace(req, model=rewrite.model)
        decision = await self._place(req, reserve=reserve)
        return self._record(decision if rewrite is None else replace(decision, rewrite=rewrite))

    async def rewrite(self, req: RouteRequest) -> Rewrite | None:
        """Which model serves ``req`` (``cognitora.intent``); None when the config has no ``intent`` section.
        Pure: nothing is counted (``admit`` counts the decision that carries it). Awaited: an ``embeddings``
        classifier calls its endpoint (within its budget)."""
        return None if self.intent is None else await self.intent.current().decide_async(req)

    async def _place_quietly(self, req: RouteRequest) -> Decision:
        """``place`` for a queued request tried again: its rewrite is decided already, nothing is recorded (the
        queue records the decision it finally makes)."""
        rewrite = req.rewrite
        if rewrite is not None and rewrite.model != req.model:
            req = replace(req, model=rewrite.model)
        decision = await self._place(req, reserve=False)
        return decision if rewrite is None else replace(decision, rewrite=rewrite)

    async def _place(self, req: RouteRequest, *, reserve: bool) -> Decision:
        if req.pinned_endpoint is not None and req.may_pin:
            req = replace(req, candidates=(req.pinned_endpoint,))
        model = self.config.model(req.model)
        if model is None:
            return unknown_model(req, self.config)
        bad_text = invalid_unicode(req)
        if bad_text is not None:
            return reject(req, 400, f"{bad_text} is not valid Unicode (a lone surrogate): fix the client")
        try:
            prompt = await self.keying.keys(model, req)
        except PromptTooLarge as exc:
            return reject(req, 413, str(exc))
        except PromptError as exc:
            return reject(req, 400, f"cannot read the prompt: {exc}")
        except UnicodeError as exc:
            return reject(req, 400, f"the prompt is not valid Unicode: {exc}")
        except RecursionError:
            return reject(req, 400, "the prompt is nested too deeply to read")
        if reserve and self.budgets is not None:
            # One round trip's wait for both: the reserve runs while the fleet state is read.
            self._reserving[req.request_id] = asyncio.ensure_future(
                self.budgets.reserve(req, req.model, prompt.prompt_tokens)
            )
        state, age, stale = await self.fleet.state(model, prompt, self._reserving.get(req.request_id))
        if uses_pairs(model):
            decision = place_with_pairs(req, prompt, self.config, state)
        else:
            decision = place(req, prompt, self.config, state)
        if stale is not None:
            self.stats.stale_state += 1
            reason = f"{decision.reason}; {stale}" if decision.reason else stale
            decision = replace(decision, stale_state=True, state_age_s=age, reason=reason)
        elif age is not None:
            decision = replace(decision, state_age_s=age)
        if req.pinned_endpoint is not None and not req.may_pin:
            note = f"the request named {req.pinned_endpoint}: placed like its model (this key may not pin an engine)"
            decision = replace(decision, reason=f"{decision.reason}; {note}" if decision.reason else note)
        return decision

    def _record(self, decision: Decision) -> Decision:
        if len(decision.keys) > RECENT_DECISION_MAX_KEYS:
            self._recent.append(replace(decision, keys=()))
        else:
            self._recent.append(decision)
        if decision.rejection is None:
            self.stats.placed += 1
        else:
            self.stats.rejected += 1
        if decision.degraded:
            self.stats.degraded += 1
        return decision

    # -- admitting: placed, then (when placed) counted as dispatched -------------------------------------------
    async def admit(
        self,
        request: RouteRequest,
        *,
        group: str | None = None,
        on_wait: Callable[[float], Awaitable[None]] | None = None,
    ) -> tuple[Decision, Attempt | None]:
        """Place ``request`` and, when it is placed, dispatch it, in one step on this loop: nothing else is placed
        between the pick and its count. ``group`` names the logical request (LiteLLM's trace id): a new attempt of
        a group means its earlier attempts are over, so those still open are finished as ``ABANDONED`` first.
        With ``flow_control``, a request the saturated fleet cannot take waits here first (docs/flow_control.md);
        ``on_wait(max_wait_s)`` is awaited as it starts waiting (Envoy extends its message timeout by it)."""
        if group is not None:
            self.lifecycle.abandon_group(group, "the gateway started another attempt of this request")
        gate = self.budgets
        who = request.identity
        if gate is not None and who.priority == DEFAULT_PRIORITY:
            team_class = gate.priority_for(who.team)
            if team_class is not None:
                request = replace(request, identity=replace(who, priority=team_class))
        started = time.perf_counter()
        waiting: Waiting | None = None
        try:
            try:
                decision = await self.place(request, reserve=gate is not None)
                failed = False
            except Exception as exc:
                decision = self._placement_failed(request, exc)
                failed = True
            else:
                waiting = None if self.flow is None else self.flow.should_wait(request, decision)
                if waiting is None:
                    decision = await self._burst(request, decision, group)
        except BaseException:  # cancelled (the client went away): a reservation made meanwhile is given back
            pending = self._reserving.pop(request.request_id, None)
            if gate is not None and pending is not None:
                gate.release_later(pending)
            raise
        hold = None
        if gate is not None:
            pending = self._reserving.pop(request.request_id, None)
            if decision.endpoint is not None or waiting is not None:
                # Done by now (``FleetView.state`` waited for it before reading the in-flight counts): awaiting a done
                # future does not suspend, so nothing is placed between this pick and its count.
                verdict = await (pending or gate.reserve(request, decision.model, decision.prompt_tokens))
                if isinstance(verdict, Rejection):
                    if waiting is None:
                        self.burst.withdraw(decision)  # a cloud slot, spend hold or probe turn it took: given back
                    decision, waiting = self._refused_by_budget(decision, verdict), None
                else:
                    hold = verdict
            elif pending is not None:
                gate.release_later(pending)  # placement refused it: the reservation is given back
        if waiting is not None:
            return await self._queued(request, decision, waiting, hold, group, started, on_wait)
        self.telemetry.decided(request, decision, time.perf_counter() - started, fallback=failed)
        if decision.endpoint is None:
            return decision, None
        attempt = self.lifecycle.dispatch(decision, group=group)
        attempt.budget_hold = hold
        if self.flow is not None:
            self.flow.committed(request, attempt)  # team isolation counts its prefill on that engine
        return decision, attempt

    def _refused_by_budget(self, placed: Decision, rejection: Rejection) -> Decision:
        """A placed decision the budget refused: a rejection whose reason is the budget's (which limit, window,
        used and cap), not placement's (its pick stays in the explanation's candidates)."""
        refused = replace(placed, endpoint=None, url=None, rejection=rejection, fallbacks=(), reason=rejection.message)
        if self._recent and self._recent[-1].request_id == placed.request_id:
            self._recent[-1] = replace(refused, keys=())
        if placed.rejection is None:
            self.stats.placed -= 1
            self.stats.rejected += 1
        return refused

    async def _queued(
        self,
        request: RouteRequest,
        decision: Decision,
        waiting: Waiting,
        hold: Hold | None,
        group: str | None,
        started: float,
        on_wait: Callable[[float], Awaitable[None]] | None,
    ) -> tuple[Decision, Attempt | None]:
        """The fleet is saturated for ``request`` (or its band queues already): it waits in the gateway queue and
        is placed when it leaves it; refused (its wait bound, ``Waiting.max_wait_s``; a full queue), the burst
        policy may take it, else the queue's 429 with Retry-After. The first decision is counted once, as the final
        one."""
        assert self.flow is not None
        if decision.rejection is None:
            self.stats.placed -= 1
        else:
            self.stats.rejected -= 1
        if on_wait is not None:
            try:
                await on_wait(waiting.max_wait_s)
            except BaseException:
                if hold is not None and self.budgets is not None:
                    self.budgets.give_back_later(hold)
                raise
        result = await self.flow.wait(request, decision, waiting, hold=hold, group=group)
        if isinstance(result, Placed):
            self.telemetry.decided(request, result.decision, time.perf_counter() - started, fallback=False)
            return result.decision, result.attempt
        final, attempt = await self._after_queue(request, decision, result, group)
        self.telemetry.decided(request, final, time.perf_counter() - started, fallback=False)
        return final, attempt

    async def _after_queue(
        self, request: RouteRequest, decision: Decision, refusal: QueueRefusal, group: str | None
    ) -> tuple[Decision, Attempt | None]:
        """A queued request refused by the queue (its hold given back already): a cloud target where the burst
        policy allows (with a new budget reservation), else the queue's rejection."""
        refused = replace(
            decision,
            endpoint=None,
            url=None,
            rejection=refusal.rejection,
            fallbacks=(),
            reason=refusal.rejection.message,
            saturated=True,
        )
        if refusal.burst_may_take:
            burst = self.burst.consider(request, decision, group)
            if burst.cloud is not None:
                burst = await self.burst.spend_checked(decision, burst)
            if burst.cloud is not None and burst.endpoint is not None:
                hold: Hold | None = None
                if self.budgets is not None:
                    verdict = await self.budgets.reserve(request, burst.model, burst.prompt_tokens)
                    if isinstance(verdict, Rejection):
                        self.burst.withdraw(burst)
                        return self._record(replace(refused, rejection=verdict, reason=verdict.message)), None
                    hold = verdict
                attempt = self.lifecycle.dispatch(self._record(burst), group=group)
                attempt.budget_hold = hold
                return burst, attempt
        return self._record(refused), None

    async def _burst(self, request: RouteRequest, decision: Decision, group: str | None) -> Decision:
        """The local decision, or the burst decision that replaces it (``cognitora.burst.policy``)."""
        burst = self.burst.consider(request, decision, group)
        if burst.cloud is not None:
            burst = await self.burst.spend_checked(decision, burst)
        if burst is not decision and self._recent and self._recent[-1] is decision:
            self._recent[-1] = burst  # explain and the decision log show what was done
            if decision.rejection is not None and burst.rejection is None:
                self.stats.rejected -= 1
                self.stats.placed += 1
        return burst

    def _placement_failed(self, request: RouteRequest, exc: Exception) -> Decision:
        """Placement raised (a bug): ``placement.on_error`` decides (cognitora.failsafe); counted, logged rarely."""
        self.stats.internal_errors += 1
        self._error_log.error(f"placement of a request for model {request.model!r} failed", exc)
        local = self.fleet.local_totals(request.model)
        return self._record(fallback_decision(request, self.config, exc, local, self.fleet.health_marks))

    # -- the lifecycle's and the fleet view's, for the adapters ----------------------------------------------
    def dispatch(self, decision: Decision, *, group: str | None = None) -> Attempt:
        """Start an attempt for a decision made earlier (``Lifecycle.dispatch``)."""
        return self.lifecycle.dispatch(decision, group=group)

    def attempt(self, request_id: str) -> Attempt | None:
        """The open attempt of a placed request, by ``Decision.request_id`` (None once it finished)."""
        return self.lifecycle.attempt(request_id)

    def open_attempts(self) -> list[Attempt]:
        """Attempts dispatched and not finished yet."""
        return self.lifecycle.open_attempts()

    def expire_attempts(self) -> None:
        """Finish the attempts whose end no gateway reported within ``placement.inflight_ttl_s`` (as a dispatch
        does): a Router a reload retired dispatches nothing, and waits for its last attempt to end."""
        self.lifecycle.prune_attempts(self._clock())

    def recent_outcomes(self) -> list[AttemptRecord]:
        """The last finished attempts, prediction beside achievement, oldest first."""
        return self.lifecycle.recent_outcomes()

    def ttft_bias_factors(self) -> dict[str, float]:
        """Each endpoint's learned TTFT feedback factor (those with enough samples), for metrics."""
        return self.lifecycle.ttft_bias_factors()

    def note_unhealthy(self, endpoint: str, reason: str) -> None:
        """A gateway saw ``endpoint`` fail: stop picking it in this process at once (see ``mark_unhealthy``)."""
        self.fleet.note_unhealthy(endpoint, reason)

    async def mark_unhealthy(self, endpoint: str, reason: str) -> None:
        """A gateway saw ``endpoint`` fail: stop picking it now, until a scrape newer than this says it is healthy
        or ``unhealthy_mark_ttl_s`` passes (then it is tried again; a new failure marks it again).

        The mark takes effect in this process at once; it is also written to the store as a health mark with the
        same time to live, so other gateway replicas stop picking it at their next decision. The endpoint's
        snapshot is left alone: its load figures stay as old as they are. Attempts whose outcome means the endpoint
        is gone do this themselves (``OutcomeKind.marks_unhealthy``).
        """
        self.fleet.note_unhealthy(endpoint, reason)
        await self.fleet.guarded(self.fleet.share_unhealthy(endpoint, reason), "share an unhealthy mark")

    # -- lookups --------------------------------------------------------------------------------------------
    def prompt_keyer(self, model: str) -> PromptKeyer:
        """The keyer of a configured model (its tokenizer, piece cache and block-key memo)."""
        return self._keyers[model]

    def endpoint_url(self, endpoint_id: str) -> str | None:
        """Base URL of a configured endpoint (``http://host:port``), or None for an unknown id."""
        endpoint = self.config.endpoint(endpoint_id)
        return None if endpoint is None else endpoint.url

    def recent_decisions(self) -> list[Decision]:
        """The last ``RECENT_DECISIONS`` decisions, oldest first."""
        return list(self._recent)

    async def close(self) -> None:
        """Answer every queued request 503, let every attempt's store writes land, then close the store (and stop
        the keying thread)."""
        if self.flow is not None:
            await self.flow.close()
        await self.lifecycle.close()
        self.keying.close()
        if self.intent is not None:
            self.intent.close()
        if self.budgets is not None:
            await self.budgets.close()
        await self.store.close()


def same_labels(old: CognitoraConfig, new: CognitoraConfig) -> bool:
    """Whether two configs label the metrics alike (model names and priorities): a reload keeps the counters then."""
    return old.model_names() == new.model_names() and old.placement.priorities == new.placement.priorities
