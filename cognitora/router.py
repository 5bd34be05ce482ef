"""``Router``: the one seam both gateway adapters call.

    decision, attempt = await router.admit(request)   # placed, and (when placed) counted as dispatched at once
    attempt.first_token()                             # its prefill is done
    attempt.finish(outcome)                           # released; what was achieved beside what was predicted

``place`` alone decides without side effects (``cognitora explain``); ``dispatch`` starts an attempt for a decision
made earlier. The attempt (``cognitora.attempt``) owns the request's lifecycle: order, once, any thread, health.

The Router fetches the fleet's state from the store in one call (``Store.fleet_view``: prefix matches, in-flight
counts, snapshots; one round trip on Redis), hands it to the pure ``placement.place`` and keeps a little of its
own: in-flight counts for what it dispatched, the last snapshots it read, the endpoints a gateway saw die, and
recent decisions. When the store fails (``StoreUnavailable``, or slower than ``placement.store_timeout_s``),
``place`` still answers from that local state, with ``Decision.degraded=True``; feedback calls log and carry on.
Nothing here raises because Redis is down.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from cognitora.attempt import Attempt, AttemptRecord, Outcome, OutcomeKind
from cognitora.budgets.gate import BudgetGate, Hold, gate_for
from cognitora.burst.ledger_spend import ledger_spend_for
from cognitora.burst.policy import BurstPolicy
from cognitora.config import DEFAULT_PRIORITY, CognitoraConfig, ModelConfig
from cognitora.decision import Decision, Rejection
from cognitora.disagg import place_with_pairs, uses_pairs
from cognitora.failsafe import RateLimitedLog, fallback_decision
from cognitora.intent import IntentSource, Rewrite
from cognitora.kv_event_sources import reports_kv_events
from cognitora.match_checkpoints import MatchCheckpoints
from cognitora.outcome_rates import OutcomeRates
from cognitora.placement import FleetState, HealthMark, place, reject, unknown_model
from cognitora.preflight import prompt_keyers
from cognitora.request import RouteRequest
from cognitora.routed_prefixes import RoutedPrefixes, merge_matches
from cognitora.seat_tenure import SeatTenure
from cognitora.telemetry import Telemetry
from cognitora.token_agreement import TokenAgreement
from cognitora.ttft_feedback import TtftFeedback, raw_ttft_s
from kvstate.engines import ENGINES
from kvstate.memory_store import MemoryStore
from kvstate.prompt import Prompt, PromptError, PromptKeyer, PromptKeys, prompt_chars, read_prompt
from kvstate.store import EndpointSnapshot, Heartbeat, InFlight, MatchCheckpoint, Store, StoreUnavailable, open_store

__all__ = ["RECENT_DECISIONS", "Router", "RouterStats"]

log = logging.getLogger(__name__)

RECENT_DECISIONS = 256
"""How many recent decisions the router keeps for ``cognitora explain`` and metrics."""
RECENT_DECISION_MAX_KEYS = 1024
"""A recent decision keeps its block keys only up to this many (a 16k-token prompt); a longer prompt's are dropped
from the record (~40 bytes a key: 256 records of a prompt at ``limits.exact_prompt_max_chars`` held up to 400 MB)."""

_T = TypeVar("_T")
_NO_WORK = InFlight()
_STORE_ERRORS = (StoreUnavailable, TimeoutError, ConnectionError, OSError)


@dataclass
class RouterStats:
    """Counters for telemetry. Cumulative since the router started."""

    placed: int = 0
    rejected: int = 0
    degraded: int = 0
    """Decisions made without the store."""
    stale_state: int = 0
    """Decisions made on stale fleet state: the store answered, but its newest collector heartbeat was older than
    ``placement.state_max_age_s`` (or no collector ever wrote one)."""
    internal_errors: int = 0
    """Placements that raised (a bug): answered by ``placement.on_error`` (cognitora.failsafe)."""
    store_errors: int = 0
    """Store calls that failed or timed out (reads and writes)."""
    dispatched: int = 0
    finished_ok: int = 0
    finished_error: int = 0
    marked_unhealthy: int = 0
    finished_by_kind: dict[str, int] = field(default_factory=dict)
    """Finished attempts by ``OutcomeKind`` value."""
    hit_reports: int = 0
    """Finished requests whose response reported ``cached_tokens``: the two sums below cover exactly these."""
    predicted_cached_tokens: float = 0.0
    achieved_cached_tokens: int = 0
    ttft_reports: int = 0
    """Finished requests whose first token was timed: the two sums below cover exactly these."""
    predicted_ttft_s: float = 0.0
    achieved_ttft_s: float = 0.0
    oversized_prompts: int = 0
    """Prompts over ``limits.exact_prompt_max_chars``: placed on approximate keys or refused (``limits.over_limit``)."""
    offloaded_prompts: int = 0
    """Prompts keyed on the worker thread (too much to tokenize on the event loop)."""
    offload_queue_full: int = 0
    """Prompts given approximate keys because the keying thread had ``limits.offload_queue_max_chars`` queued."""


@dataclass
class _LocalRequest:
    endpoint: str
    prefill_tokens: int
    decode_tokens: int
    expires: float
    prefill_done: bool = False
    context_tokens: float = 0.0
    """Its prompt plus half its ``max_tokens``: the KV it holds on average over its life."""
    dispatched_at: float = 0.0
    seat_since: float | None = None
    """When its first token came back (router clock): from then it holds a seat (``cognitora.seat_tenure``)."""


class _LocalInflight:
    """What this router dispatched and has not seen finish: the in-flight floor when the store is behind or down."""

    def __init__(self) -> None:
        self._requests: dict[str, _LocalRequest] = {}

    def add(self, request_id: str, entry: _LocalRequest, now: float) -> None:
        self._prune(now)
        self._requests[request_id] = entry

    def has(self, request_id: str) -> bool:
        return request_id in self._requests

    def prefill_done(self, request_id: str, now: float) -> None:
        entry = self._requests.get(request_id)
        if entry is not None:
            entry.prefill_done = True
            if entry.seat_since is None:
                entry.seat_since = now

    def seat_since(self, request_id: str) -> float | None:
        entry = self._requests.get(request_id)
        return None if entry is None else entry.seat_since

    def seat_ages(self, endpoints: Sequence[str], now: float) -> dict[str, list[float]]:
        """Seconds since the first token of each request holding a seat, per endpoint of ``endpoints`` with any."""
        ages: dict[str, list[float]] = {}
        for entry in self._requests.values():
            if entry.seat_since is not None and entry.endpoint in endpoints:
                ages.setdefault(entry.endpoint, []).append(now - entry.seat_since)
        return ages

    def release(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def totals(self, endpoints: Sequence[str], now: float) -> dict[str, InFlight]:
        """Work per endpoint of ``endpoints`` that has any (the others are absent: usually all of them)."""
        self._prune(now)
        acc: dict[str, list[int]] = {}
        for entry in self._requests.values():
            row = acc.get(entry.endpoint)
            if row is None:
                row = acc[entry.endpoint] = [0, 0, 0]
            row[0] += 1
            row[1] += 0 if entry.prefill_done else entry.prefill_tokens
            row[2] += entry.decode_tokens
        return {e: InFlight(*row) for e, row in acc.items() if e in endpoints}

    def context(
        self, endpoints: Sequence[str], since: Mapping[str, float]
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Context tokens of the requests in flight per endpoint of ``endpoints`` that has any, and of those
        dispatched after ``since[endpoint]`` (its snapshot's time: what the snapshot cannot show yet)."""
        total: dict[str, float] = {}
        recent: dict[str, float] = {}
        for entry in self._requests.values():
            e = entry.endpoint
            if e in endpoints:
                total[e] = total.get(e, 0.0) + entry.context_tokens
                if entry.dispatched_at > since.get(e, float("inf")):
                    recent[e] = recent.get(e, 0.0) + entry.context_tokens
        return total, recent

    def _prune(self, now: float) -> None:
        expired = [rid for rid, entry in self._requests.items() if entry.expires <= now]
        for rid in expired:
            del self._requests[rid]


def _at_least(store_view: InFlight | None, local: InFlight | None) -> InFlight:
    """The store counts every gateway's work, ours included, unless a write of ours was lost: take the larger."""
    if local is None:
        return store_view or _NO_WORK
    if store_view is None:
        return local
    return InFlight(
        max(store_view.requests, local.requests),
        max(store_view.prefill_tokens, local.prefill_tokens),
        max(store_view.decode_tokens, local.decode_tokens),
    )


class Router:
    """Placement plus the request lifecycle, over one ``Store``. One per gateway process; safe for concurrent use."""

    def __init__(
        self,
        config: CognitoraConfig,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        keyers: Mapping[str, PromptKeyer] | None = None,
    ) -> None:
        """``keyers``: each model's prompt keyer, loaded already (``cognitora.preflight.prompt_keyers``); absent,
        they are loaded here, and a bad tokenizer or chat template raises ``ConfigError`` naming its key."""
        self.config = config
        self.store = store
        self._clock = clock
        self._keyers = dict(keyers) if keyers is not None else prompt_keyers(config)
        self._endpoint_ids = {m.name: [e.id for e in m.endpoints] for m in config.models}
        for m in config.models:
            if m.tokenizer is None and any(e.kv_events for e in m.endpoints):
                log.warning(
                    "model %r has endpoints publishing KV events but no tokenizer: events carry token ids, so "
                    "the router's text-approximate keys cannot match them; set models[].tokenizer",
                    m.name,
                )
        self.intent = None if config.intent is None else IntentSource.shared(config.intent, set(config.model_names()))
        """The model-rewrite policy in force (``cognitora.intent``), reloaded when its file changes."""
        self._local = _LocalInflight()
        self._seat_tenure = SeatTenure()
        """How long requests hold a seat per endpoint, on this router's clock: the seat wait's schedule."""
        self._feedback = TtftFeedback(config.cost_model.feedback)
        self._routed = RoutedPrefixes()
        self._checkpoints = MatchCheckpoints(
            config.limits.match_checkpoint_ttl_s if getattr(store, "takes_match_checkpoints", False) else 0.0
        )
        """Where the store's prefix match stood after shared system prompts (stores that take checkpoints)."""
        self._outcome_rates = OutcomeRates(
            e.id for m in config.models for e in m.endpoints if ENGINES.get(e.engine.value).metrics_path is None
        )
        """Rates and cache reuse learned from finished attempts, for engines without metrics (MLX-LM, openai)."""
        self._snapshots: dict[str, EndpointSnapshot] = {}
        self._health_marks: dict[str, HealthMark] = {}
        self._shared_marks: dict[str, HealthMark] = {}
        """Other gateways' marks as of the last store read: still honoured while the store cannot be read."""
        self._recent: deque[Decision] = deque(maxlen=RECENT_DECISIONS)
        self._store_ok = True
        # The in-process store's methods never suspend (kvstate/memory_store.py): a timeout around them cannot
        # fire and running its writes concurrently gains nothing, so its calls skip both (asyncio.timeout and
        # gather's tasks: ~65 of ~90 us of dispatched + finished). The exact class only: a subclass may suspend.
        self._store_suspends = type(store) is not MemoryStore
        self.stats = RouterStats()
        self._attempts: dict[str, Attempt] = {}
        self._groups: dict[str, set[str]] = {}
        self._outcomes: deque[AttemptRecord] = deque(maxlen=RECENT_DECISIONS)
        self._writers: set[asyncio.Task[None]] = set()
        self._next_attempt_prune = 0.0
        self._error_log = RateLimitedLog(log)
        self._stale_log = RateLimitedLog(log)
        self._started = clock()
        self._stale = False
        self._seen_heartbeat = False
        self.telemetry = Telemetry.for_names(config.model_names(), config.placement.priorities)
        self.token_agreement = TokenAgreement()
        """The router's prompt-token counts against the engines' own (``usage.prompt_tokens``)."""
        if self.intent is not None:
            self.telemetry.names = self.intent.label_names()
        """Decisions, attempts and store reads, by label, for ``cognitora.metrics`` and the decision log."""
        self._key_thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._offloaded_chars = 0
        """Characters of prompts submitted to the keying thread and not done yet (running or queued)."""
        self.budgets: BudgetGate | None = gate_for(config, store, clock)
        """Token budgets (``cognitora.budgets``): reserved in ``admit``, settled at the attempt's finish."""
        self.burst = BurstPolicy(config, spend=ledger_spend_for(config, self.budgets))
        """Burst to a cloud target when the fleet is saturated (``cognitora.burst``); inert without ``burst:``. Its
        cloud spend is in the budgets ledger when ``budgets:`` is configured (shared by replicas), else in process."""
        self._cloud_deadlines: dict[str, asyncio.TimerHandle] = {}
        """Open cloud attempts' ends by their target's ``timeout_s`` (``_count``), by request id."""
        self._reserving: dict[str, asyncio.Future[Hold | Rejection]] = {}
        """Budget reservations ``place`` started for ``admit`` (by request id), picked up there."""

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

    async def _place(self, req: RouteRequest, *, reserve: bool) -> Decision:
        if req.pinned_endpoint is not None and req.may_pin:
            req = replace(req, candidates=(req.pinned_endpoint,))
        model = self.config.model(req.model)
        if model is None:
            return unknown_model(req, self.config)
        bad_text = _invalid_unicode(req)
        if bad_text is not None:
            return reject(req, 400, f"{bad_text} is not valid Unicode (a lone surrogate): fix the client")
        try:
            prompt = await self._prompt_keys(model, req)
        except _PromptTooLarge as exc:
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
        state, age, stale = await self._fleet_state(model, prompt, self._reserving.get(req.request_id))
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

    async def _prompt_keys(self, model: ModelConfig, req: RouteRequest) -> PromptKeys:
        """The one prompt normalizer (``kvstate.prompt``), rooted at the LoRA adapter when ``req.model`` names one.

        Never blocks the event loop for long (``limits``): a prompt over ``exact_prompt_max_chars`` is not tokenized
        (approximate keys, or ``_PromptTooLarge``); one with more than ``inline_tokenize_max_chars`` the piece
        cache lacks is tokenized on the keying thread; the rest, nearly every request, right here."""
        prompt = read_prompt(
            messages=req.messages,
            prompt=req.prompt,
            tools=req.tools,
            add_special_tokens=req.add_special_tokens,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            chat_template_kwargs=req.chat_template_kwargs,
        )
        lora = req.model if req.model in model.loras else None
        keyer = self._keyers[model.name]
        limits = self.config.limits
        size = prompt_chars(prompt)
        if size > limits.exact_prompt_max_chars:
            self.stats.oversized_prompts += 1
            if limits.over_limit == "reject":
                raise _PromptTooLarge(
                    f"the prompt is too large for this gateway: {size:,} characters, the limit is "
                    f"{limits.exact_prompt_max_chars:,}; shorten it or split it over several requests"
                )
            return keyer.approximate_keys(prompt, lora, limits.exact_prompt_max_chars, size)
        if size <= limits.inline_tokenize_max_chars:
            return keyer.keys(prompt, lora)
        keys = keyer.keys_inline(prompt, lora, limits.inline_tokenize_max_chars)
        if keys is not None:
            return keys
        return await self._keys_on_thread(keyer, prompt, lora, size)

    async def _keys_on_thread(self, keyer: PromptKeyer, prompt: Prompt, lora: str | None, size: int) -> PromptKeys:
        """``keyer.keys`` on the keying thread, unless ``limits.offload_queue_max_chars`` are already waiting there:
        then approximate keys at once (the request is not refused: only a burst of long prompts put it here)."""
        limits = self.config.limits
        if self._offloaded_chars and self._offloaded_chars + size > limits.offload_queue_max_chars:
            self.stats.offload_queue_full += 1
            return keyer.approximate_keys(prompt, lora, limits.exact_prompt_max_chars, size)
        if self._key_thread is None:
            # One thread: tokenizing is CPU-bound, and one core is all it may take from the gateway's own work.
            self._key_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cognitora-keys")
        self.stats.offloaded_prompts += 1
        self._offloaded_chars += size
        loop = asyncio.get_running_loop()
        job = self._key_thread.submit(keyer.keys, prompt, lora)

        def done(_: concurrent.futures.Future[PromptKeys]) -> None:
            # When the job ends, not when this request stops waiting for it (a client gone): it still holds the
            # thread until then.
            self._offloaded_chars -= size

        def report(j: concurrent.futures.Future[PromptKeys]) -> None:
            # On the thread; the count is the loop's. A loop already closed has nobody left to count for.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(done, j)

        job.add_done_callback(report)
        return await asyncio.wrap_future(job)

    async def _fleet_state(
        self, model: ModelConfig, prompt: PromptKeys, also: asyncio.Future[Hold | Rejection] | None = None
    ) -> tuple[FleetState, float | None, str | None]:
        """The state to place on, its age (the newest collector heartbeat's; None: none read) and, when it is
        stale, a note saying so. ``also``: a store call sent beside the read (the budget reservation) that must be
        over before this process's own in-flight counts are read: from there to the dispatch nothing may await,
        or requests placed meanwhile would all see the same load and pile onto one engine."""
        ids = self._endpoint_ids[model.name]
        now = self._clock()
        read_started = time.perf_counter()
        # Prefix-match checkpoints (cognitora.match_checkpoints): resume from the deepest one this prompt begins
        # with, and ask for one where it parts from the latest prompt that began the same way.
        checkpoints = self._checkpoints.enabled and bool(prompt.keys)
        resume: MatchCheckpoint | None = None
        asked: tuple[str, ...] = ()
        if checkpoints:
            asked = tuple(ids)
            resume = self._checkpoints.find(model.name, prompt.keys, asked, now)
            at = prompt.reused_blocks
            read = self.store.fleet_view(model.name, prompt.keys, ids, checkpoint=at, resume=resume)
        else:
            read = self.store.fleet_view(model.name, prompt.keys, ids)
        view = await self._guarded(read, "read the fleet state")
        self.telemetry.store_read(time.perf_counter() - read_started, ok=view is not None)
        if checkpoints and view is not None:
            self._checkpoints.outcome(resume, view.resumed)
            if view.checkpoint is not None:
                self._checkpoints.keep(model.name, prompt.keys, view.checkpoint, asked, now)
        if also is not None and not also.done():
            await asyncio.wait([also])
        local = self._local.totals(ids, now)
        seats = self._seat_tenure.progress(self._local.seat_ages(ids, now)) if local else {}
        bias = self._feedback.factors(ids, now)
        routed = self._routed.match(model.name, prompt.keys, now)
        if view is None:
            context, recent = self._context(ids, local, self._snapshots)
            degraded = FleetState(
                now=now,
                matches=self._outcome_rates.discount(routed),
                inflight={e: local.get(e, _NO_WORK) for e in ids},
                snapshots=self._outcome_rates.overlay({e: s for e, s in self._snapshots.items() if e in ids}, ids, now),
                health_marks=_newest_marks(self._shared_marks, self._health_marks),
                context_tokens=context,
                context_since_snapshot=recent,
                seat_progress=seats,
                ttft_bias=bias,
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
        if self._health_marks:
            self._forget_healed(snapshots, now)
        inflight = view.inflight
        context, recent = self._context(ids, local, snapshots)
        if local:
            inflight = {e: _at_least(inflight.get(e), local.get(e)) for e in ids}
        state = FleetState(
            now=now,
            matches=self._outcome_rates.discount(merge_matches(view.matches, routed)),
            inflight=inflight,
            snapshots=self._outcome_rates.overlay(snapshots, ids, now),
            health_marks=_newest_marks(view.health_marks, self._health_marks),
            context_tokens=context,
            context_since_snapshot=recent,
            seat_progress=seats,
            ttft_bias=bias,
        )
        age = min((beat.age_s for beat in view.heartbeats.values()), default=None)
        return state, age, self._staleness(view.heartbeats, now)

    def _context(
        self, ids: Sequence[str], local: Mapping[str, InFlight], snapshots: Mapping[str, EndpointSnapshot]
    ) -> tuple[dict[str, float], dict[str, float]]:
        if not local:
            return {}, {}
        return self._local.context(ids, {e: s.last_seen for e, s in snapshots.items()})

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
        for endpoint, mark in list(self._health_marks.items()):
            snap = snapshots.get(endpoint)
            healed = snap is not None and snap.healthy and snap.last_seen > mark.since
            if healed or now - mark.since >= self.config.placement.unhealthy_mark_ttl_s:
                del self._health_marks[endpoint]

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

    # -- the request's lifecycle (cognitora.attempt) -------------------------------------------------------------
    async def admit(self, request: RouteRequest, *, group: str | None = None) -> tuple[Decision, Attempt | None]:
        """Place ``request`` and, when it is placed, dispatch it, in one step on this loop: nothing else is placed
        between the pick and its count. ``group`` names the logical request (LiteLLM's trace id): a new attempt of
        a group means its earlier attempts are over, so those still open are finished as ``ABANDONED`` first."""
        if group is not None:
            self._abandon_group(group, "the gateway started another attempt of this request")
        gate = self.budgets
        if gate is not None and request.priority == DEFAULT_PRIORITY:
            team_class = gate.priority_for(request.team)
            if team_class is not None:
                request = replace(request, priority=team_class)
        started = time.perf_counter()
        try:
            try:
                decision = await self.place(request, reserve=gate is not None)
                failed = False
            except Exception as exc:
                decision = self._placement_failed(request, exc)
                failed = True
            else:
                decision = await self._burst(request, decision, group)
        except BaseException:  # cancelled (the client went away): a reservation made meanwhile is given back
            pending = self._reserving.pop(request.request_id, None)
            if gate is not None and pending is not None:
                gate.release_later(pending)
            raise
        hold = None
        if gate is not None:
            pending = self._reserving.pop(request.request_id, None)
            if decision.endpoint is not None:
                # Done by now (``_fleet_state`` waited for it before reading the in-flight counts): awaiting a done
                # future does not suspend, so nothing is placed between this pick and its count.
                verdict = await (pending or gate.reserve(request, decision.model, decision.prompt_tokens))
                if isinstance(verdict, Rejection):
                    self.burst.withdraw(decision)  # a cloud slot, spend hold or probe turn it took: given back
                    decision = self._refused_by_budget(decision, verdict)
                else:
                    hold = verdict
            elif pending is not None:
                gate.release_later(pending)  # placement refused it: the reservation is given back
        self.telemetry.decided(request, decision, time.perf_counter() - started, fallback=failed)
        if decision.endpoint is None:
            return decision, None
        attempt = self.dispatch(decision, group=group)
        attempt.budget_hold = hold
        return decision, attempt

    def _refused_by_budget(self, placed: Decision, rejection: Rejection) -> Decision:
        """A placed decision the budget refused: a rejection whose reason is the budget's (which limit, window,
        used and cap), not placement's (its pick stays in the explanation's candidates)."""
        refused = replace(placed, endpoint=None, url=None, rejection=rejection, fallbacks=(), reason=rejection.message)
        if self._recent and self._recent[-1].request_id == placed.request_id:
            self._recent[-1] = replace(refused, keys=())
        self.stats.placed -= 1
        self.stats.rejected += 1
        return refused

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
        local = self._local.totals(self._endpoint_ids.get(request.model, []), self._clock())
        return self._record(fallback_decision(request, self.config, exc, local, self._health_marks))

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
        """The last ``RECENT_DECISIONS`` finished attempts, prediction beside achievement, oldest first."""
        return list(self._outcomes)

    def _count(self, attempt: Attempt) -> None:
        decision = attempt.decision
        endpoint = attempt.endpoint
        params = self.config.placement
        now = self._clock()
        self._prune_attempts(now)
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
        entry = _LocalRequest(
            endpoint,
            0 if leg else prefill,
            decision.expected_decode_tokens,
            expires,
            context_tokens=decision.prompt_tokens + decision.expected_decode_tokens / 2,
            dispatched_at=now,
        )
        self._local.add(decision.request_id, entry, now)
        if leg is not None:
            self._local.add(_prefill_leg_id(decision.request_id), _LocalRequest(leg.endpoint, prefill, 0, expires), now)
        self.stats.dispatched += 1
        ttl = self._history_ttl(endpoint)
        if decision.keys:
            self._routed.add(self._key_space(decision), endpoint, decision.keys, now, now + ttl)
        # Without a first-token report (LiteLLM's SDK streams have no per-chunk hook) the prefill would count as
        # queued until the stream ends: past a deadline well beyond the prediction, it is taken as done.
        attempt._watch_prefill(
            max(params.prefill_report_min_s, params.prefill_report_factor * decision.predicted_ttft_s)
        )
        attempt._write(lambda: self._share_dispatch(decision, endpoint, prefill, ttl), "record a dispatch")

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
        if self._store_suspends:
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

    def _prefill_done(self, attempt: Attempt) -> None:
        """From the attempt: its prefill is over (first token, or its deadline passed)."""
        if self._attempts.get(attempt.request_id) is not attempt or attempt.decision.cloud is not None:
            return
        self._local.prefill_done(attempt.request_id, self._clock())
        endpoint, rid = attempt.endpoint, attempt.request_id
        attempt._write(lambda: self.store.inflight_prefill_done(endpoint, rid), "record a first token")
        self._release_prefill_leg(attempt)

    def _release_prefill_leg(self, attempt: Attempt) -> None:
        """A pair's prefill endpoint is done with the request at its first token (or its end): release it there."""
        leg = attempt.decision.prefill
        leg_id = _prefill_leg_id(attempt.request_id)
        if leg is None or not self._local.has(leg_id):
            return
        self._local.release(leg_id)
        attempt._write(lambda: self.store.inflight_release(leg.endpoint, leg_id), "release a prefill leg")

    def _attempt_finished(self, attempt: Attempt, outcome: Outcome) -> None:
        """From the attempt, once: release its work, learn from it, and decide what it says of the endpoint."""
        if attempt.outcome is not None:
            return
        attempt.outcome = outcome
        attempt._cancel_overdue()
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
            self._learn(attempt, outcome)
            return
        if self.burst.probes.active:  # a local probe of a class in burst (cognitora.burst.probes)
            self.burst.local_finished(rid, _achieved_s(attempt, outcome))
        seated = self._local.seat_since(rid)
        if outcome.ok and seated is not None:
            self._seat_tenure.observe(endpoint, self._clock() - seated)
        self._local.release(rid)
        self._learn(attempt, outcome)
        if outcome.kind.marks_unhealthy(outcome.status):
            reason = f"{outcome.kind.value}: {outcome.detail}" if outcome.detail else outcome.kind.value
            self.note_unhealthy(endpoint, reason)
            attempt._write(lambda: self._share_unhealthy(endpoint, reason), "share an unhealthy mark")
        attempt._write(lambda: self.store.inflight_release(endpoint, rid), "release in-flight work")

    def _redispatch(self, attempt: Attempt, endpoint: str) -> Attempt:
        """The gateway moved ``attempt``'s request to ``endpoint``: a new attempt there, with what placement
        predicted for that endpoint, timed from the original dispatch (the client waited all along)."""
        decision = attempt.decision
        score = next((c for c in decision.candidates if c.endpoint == endpoint), None)
        others = decision.cloud.local_fallbacks if decision.cloud is not None else decision.fallbacks
        moved = replace(
            decision,
            request_id=f"{decision.request_id}.{endpoint}",
            endpoint=endpoint,
            url=self.endpoint_url(endpoint),
            predicted_cached_tokens=score.cached_tokens if score is not None else 0.0,
            predicted_ttft_s=score.predicted_ttft_s if score is not None else decision.predicted_ttft_s,
            fallbacks=tuple(e for e in others if e != endpoint),
            prefill=None,  # counted as whole where it landed: the prediction above is the whole placement's
            cloud=None,  # a burst request retried on a local engine is local from here on
        )
        new = self.dispatch(moved, group=attempt.group)
        new.dispatched_at = attempt.dispatched_at
        return new

    def _learn(self, attempt: Attempt, outcome: Outcome) -> None:
        decision = attempt.decision
        stats = self.stats
        if outcome.ok:
            stats.finished_ok += 1
        else:
            stats.finished_error += 1
        stats.finished_by_kind[outcome.kind.value] = stats.finished_by_kind.get(outcome.kind.value, 0) + 1
        if outcome.cached_tokens is not None:
            stats.hit_reports += 1
            stats.predicted_cached_tokens += decision.predicted_cached_tokens
            stats.achieved_cached_tokens += outcome.cached_tokens
        achieved_ttft = outcome.ttft_s
        if attempt.first_token_at is not None:
            achieved_ttft = attempt.first_token_at - attempt.dispatched_at
        if achieved_ttft is not None:
            stats.ttft_reports += 1
            stats.predicted_ttft_s += decision.predicted_ttft_s
            stats.achieved_ttft_s += achieved_ttft
            self._feed_back(attempt, achieved_ttft)
        if outcome.ok and attempt.endpoint in self._outcome_rates:
            self._learn_rates(attempt, outcome, achieved_ttft)
        engine_tokens, cloud = outcome.prompt_tokens, decision.cloud
        at_engine = cloud is None or cloud.target != attempt.endpoint  # a cloud's model counts its own way
        if engine_tokens is not None and decision.exact_keys and at_engine:
            self.token_agreement.observe(decision.model, attempt.endpoint, decision.prompt_tokens, engine_tokens)
        runner_up = decision.runner_up
        self._outcomes.append(
            AttemptRecord(
                request_id=decision.request_id,
                model=decision.model,
                endpoint=attempt.endpoint,
                kind=outcome.kind,
                status=outcome.status,
                prompt_tokens=outcome.prompt_tokens if outcome.prompt_tokens is not None else decision.prompt_tokens,
                completion_tokens=outcome.completion_tokens,
                predicted_cached_tokens=decision.predicted_cached_tokens,
                achieved_cached_tokens=outcome.cached_tokens,
                predicted_ttft_s=decision.predicted_ttft_s,
                achieved_ttft_s=achieved_ttft,
                runner_up=None if runner_up is None else runner_up.endpoint,
                runner_up_predicted_ttft_s=None if runner_up is None else runner_up.predicted_ttft_s,
                finished_at=self._clock(),
            )
        )
        self.telemetry.finished(self._outcomes[-1])
        if not outcome.ok and outcome.kind is not OutcomeKind.CLIENT_CANCELLED:
            log.info(
                "request %s on %s ended %s%s",
                decision.request_id,
                attempt.endpoint,
                outcome.kind.value,
                f": {outcome.detail}" if outcome.detail else "",
            )

    def _learn_rates(self, attempt: Attempt, outcome: Outcome, ttft_s: float | None) -> None:
        """An engine without metrics: its rates and cache reuse come from what its attempts achieved."""
        decision = attempt.decision
        score = next((c for c in decision.candidates if c.endpoint == attempt.endpoint), None)
        self._outcome_rates.observe(
            attempt.endpoint,
            queued_prefill_tokens=0.0 if score is None else score.queued_prefill_tokens,
            prompt_tokens=outcome.prompt_tokens if outcome.prompt_tokens is not None else decision.prompt_tokens,
            predicted_cached_tokens=decision.predicted_cached_tokens,
            cached_tokens=outcome.cached_tokens,
            ttft_s=ttft_s,
            completion_tokens=outcome.completion_tokens,
            e2e_s=time.monotonic() - attempt.dispatched_at,
        )

    def _feed_back(self, attempt: Attempt, achieved_ttft_s: float) -> None:
        """Teach the TTFT feedback what the model predicted for this endpoint before any correction."""
        decision = attempt.decision
        score = next((c for c in decision.candidates if c.endpoint == attempt.endpoint), None)
        factor = 1.0 if score is None else score.ttft_bias_factor
        raw = raw_ttft_s(decision.predicted_ttft_s, factor, self.config.cost_model.feedback.floor_s)
        self._feedback.observe(attempt.endpoint, raw, achieved_ttft_s, self._clock())

    def ttft_bias_factors(self) -> dict[str, float]:
        """Each endpoint's learned TTFT feedback factor (those with enough samples), for metrics."""
        return self._feedback.known()

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

    def _abandon_group(self, group: str, why: str) -> None:
        for rid in list(self._groups.get(group, ())):
            attempt = self._attempts.get(rid)
            if attempt is not None:
                attempt.finish(Outcome(OutcomeKind.ABANDONED, detail=why))

    def _prune_attempts(self, now: float) -> None:
        # An attempt whose end no gateway hook ever reported: its store lease expires after the same age, so
        # finishing it here loses nothing and keeps the registry bounded.
        if now < self._next_attempt_prune:
            return
        params = self.config.placement
        self._next_attempt_prune = now + min(60.0, params.inflight_ttl_s)
        oldest = time.monotonic() - params.inflight_ttl_s
        for attempt in [a for a in self._attempts.values() if a.dispatched_at < oldest]:
            attempt.finish(Outcome(OutcomeKind.ABANDONED, detail="no end reported within placement.inflight_ttl_s"))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._writers.add(task)
        task.add_done_callback(self._writers.discard)

    def note_unhealthy(self, endpoint: str, reason: str) -> None:
        """A gateway saw ``endpoint`` fail: stop picking it in this process at once (see ``mark_unhealthy``)."""
        now = self._clock()
        self._health_marks[endpoint] = HealthMark(since=now, reason=reason)
        self.stats.marked_unhealthy += 1
        log.warning("endpoint %s marked unhealthy: %s", endpoint, reason)

    async def _share_unhealthy(self, endpoint: str, reason: str) -> None:
        await self.store.mark_unhealthy(endpoint, reason, self.config.placement.unhealthy_mark_ttl_s)

    async def mark_unhealthy(self, endpoint: str, reason: str) -> None:
        """A gateway saw ``endpoint`` fail: stop picking it now, until a scrape newer than this says it is healthy
        or ``unhealthy_mark_ttl_s`` passes (then it is tried again; a new failure marks it again).

        The mark takes effect in this process at once; it is also written to the store as a health mark with the
        same time to live, so other gateway replicas stop picking it at their next decision. The endpoint's
        snapshot is left alone: its load figures stay as old as they are. Attempts whose outcome means the endpoint
        is gone do this themselves (``OutcomeKind.marks_unhealthy``).
        """
        self.note_unhealthy(endpoint, reason)
        await self._guarded(self._share_unhealthy(endpoint, reason), "share an unhealthy mark")

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
        """Let every attempt's store writes land, then close the store (and stop the keying thread)."""
        if self._writers:
            await asyncio.gather(*self._writers, return_exceptions=True)
        if self._key_thread is not None:
            self._key_thread.shutdown(wait=False, cancel_futures=True)
            self._key_thread = None
        if self.intent is not None:
            self.intent.close()
        if self.budgets is not None:
            await self.budgets.close()
        await self.store.close()

    # -- store access that degrades instead of failing ------------------------------------------------------
    async def _guarded(self, call: Awaitable[_T], what: str) -> _T | None:
        """Await a store call within the store timeout; None (logged, counted) if it fails or is too slow."""
        timeout_s = self.config.placement.store_timeout_s
        try:
            if self._store_suspends:
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
        self.stats.store_errors += 1
        if self._store_ok:
            log.warning("store unavailable (could not %s: %s); deciding on local state until it returns", what, why)
            self._store_ok = False


def _invalid_unicode(req: RouteRequest) -> str | None:
    """Where the request's text holds a lone surrogate (JSON's "\\ud800" decodes to one; no engine can tokenize it),
    or None. One pass over the values that builds no paths (a 10 MB body is up to ~1M values: giving each its path
    took a second of the event loop); the path is traced only in a body that has one."""
    for where, root in (("messages", req.messages), ("prompt", req.prompt)):
        if _has_lone_surrogate(root):
            return _surrogate_path(where, root)
    return None


_SCALARS = frozenset({int, float, bool, type(None)})


def _has_lone_surrogate(value: object) -> bool:
    todo = [value]
    while todo:  # iterative: a deeply nested body must not overflow the stack here
        item = todo.pop()
        if isinstance(item, str):
            # isascii() is O(1) in CPython (a flag of the string): no 10 MB copy to find nothing.
            if not item.isascii() and not _encodes(item):
                return True
        elif isinstance(item, list | tuple):
            if set(map(type, item)) <= _SCALARS:  # token ids: read at C speed
                continue
            todo.extend(item)
        elif isinstance(item, (dict, Mapping)):  # dict first: the ABC's check is slow, and JSON gives dicts
            todo.extend(item.values())
    return False


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _surrogate_path(where: str, value: object) -> str:
    todo: list[tuple[str, object]] = [(where, value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, str):
            if not _encodes(item):
                return path
        elif isinstance(item, Mapping):
            todo.extend((f"{path}.{k}", v) for k, v in item.items())
        elif isinstance(item, list | tuple):
            todo.extend((f"{path}[{i}]", v) for i, v in enumerate(item))
    return where


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


class _PromptTooLarge(Exception):
    """A prompt over ``limits.exact_prompt_max_chars`` with ``over_limit: reject``: the message is the client's."""
