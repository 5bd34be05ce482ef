"""``Router``: the one seam both gateway adapters call.

    decision = await router.place(request)        # no side effects
    await router.dispatched(decision)             # the gateway sent it: count in-flight work, mark keys speculative
    await router.first_token(decision)            # its prefill is done
    await router.finished(decision, outcome)      # released; predicted vs achieved cache hit recorded

The Router fetches the fleet's state from the store in one call (``Store.fleet_view``: prefix matches, in-flight
counts, snapshots; one round trip on Redis), hands it to the pure ``placement.place`` and keeps a little of its
own: in-flight counts for what it dispatched, the last snapshots it read, the endpoints a gateway saw die, and
recent decisions. When the store fails (``StoreUnavailable``, or slower than ``placement.store_timeout_s``),
``place`` still answers from that local state, with ``Decision.degraded=True``; feedback calls log and carry on.
Nothing here raises because Redis is down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from cognitora.config import CognitoraConfig, ModelConfig
from cognitora.decision import Decision
from cognitora.placement import FleetState, HealthMark, place, reject, unknown_model
from cognitora.placement.energy import EnergyEstimator
from cognitora.placement.state import SNAPSHOT_MARKED_UNHEALTHY_AT
from cognitora.request import Outcome, RouteRequest
from cognitora.routed_prefixes import RoutedPrefixes, merge_matches
from kvstate.memory_store import MemoryStore
from kvstate.prompt import ChatTokenizer, PromptError, PromptKeyer, PromptKeys, read_prompt
from kvstate.store import EndpointSnapshot, InFlight, Store, StoreUnavailable, open_store

__all__ = ["RECENT_DECISIONS", "Router", "RouterStats"]

log = logging.getLogger(__name__)

RECENT_DECISIONS = 256
"""How many recent decisions the router keeps for ``cognitora explain`` and metrics."""

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
    store_errors: int = 0
    """Store calls that failed or timed out (reads and writes)."""
    dispatched: int = 0
    finished_ok: int = 0
    finished_error: int = 0
    marked_unhealthy: int = 0
    hit_reports: int = 0
    """Finished requests whose response reported ``cached_tokens``: the two sums below cover exactly these."""
    predicted_cached_tokens: float = 0.0
    achieved_cached_tokens: int = 0


@dataclass
class _LocalRequest:
    endpoint: str
    prefill_tokens: int
    decode_tokens: int
    expires: float
    prefill_done: bool = False


class _LocalInflight:
    """What this router dispatched and has not seen finish: the in-flight floor when the store is behind or down."""

    def __init__(self) -> None:
        self._requests: dict[str, _LocalRequest] = {}

    def add(self, request_id: str, entry: _LocalRequest, now: float) -> None:
        self._prune(now)
        self._requests[request_id] = entry

    def has(self, request_id: str) -> bool:
        return request_id in self._requests

    def prefill_done(self, request_id: str) -> None:
        entry = self._requests.get(request_id)
        if entry is not None:
            entry.prefill_done = True

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

    def __init__(self, config: CognitoraConfig, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store
        self._clock = clock
        self._keyers = {m.name: _keyer(m) for m in config.models}
        self._endpoint_ids = {m.name: [e.id for e in m.endpoints] for m in config.models}
        for m in config.models:
            if m.tokenizer is None and any(e.kv_events for e in m.endpoints):
                log.warning(
                    "model %r has endpoints publishing KV events but no tokenizer: events carry token ids, so "
                    "the router's text-approximate keys cannot match them; set models[].tokenizer",
                    m.name,
                )
        self._local = _LocalInflight()
        self._routed = RoutedPrefixes()
        self._snapshots: dict[str, EndpointSnapshot] = {}
        self._health_marks: dict[str, HealthMark] = {}
        self._recent: deque[Decision] = deque(maxlen=RECENT_DECISIONS)
        self._energy = EnergyEstimator()
        self._store_ok = True
        # The in-process store's methods never suspend (kvstate/memory_store.py): a timeout around them cannot
        # fire and running its writes concurrently gains nothing, so its calls skip both (asyncio.timeout and
        # gather's tasks: ~65 of ~90 us of dispatched + finished). The exact class only: a subclass may suspend.
        self._store_suspends = type(store) is not MemoryStore
        self.stats = RouterStats()

    @classmethod
    def from_config(cls, config: CognitoraConfig) -> Router:
        """A router over the store the config names: Redis at ``redis_url``, else an in-process store."""
        return cls(config, open_store(config.redis_url, config.key_prefix))

    # -- deciding -------------------------------------------------------------------------------------------
    async def place(self, req: RouteRequest) -> Decision:
        """Where ``req`` should go, and why. Reads the store; writes nothing."""
        model = self.config.model(req.model)
        if model is None:
            return self._record(unknown_model(req, self.config))
        try:
            prompt = self._prompt_keys(model, req)
        except PromptError as exc:
            return self._record(reject(req, 400, f"cannot read the prompt: {exc}"))
        state = await self._fleet_state(model, prompt)
        return self._record(place(req, prompt, self.config, state))

    def _prompt_keys(self, model: ModelConfig, req: RouteRequest) -> PromptKeys:
        """The one prompt normalizer (``kvstate.prompt``), rooted at the LoRA adapter when ``req.model`` names one."""
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
        return self._keyers[model.name].keys(prompt, lora)

    async def _fleet_state(self, model: ModelConfig, prompt: PromptKeys) -> FleetState:
        ids = self._endpoint_ids[model.name]
        now = self._clock()
        view = await self._guarded(self.store.fleet_view(model.name, prompt.keys, ids), "read the fleet state")
        local = self._local.totals(ids, now)
        routed = self._routed.match(model.name, prompt.keys, now)
        if view is None:
            return FleetState(
                now=now,
                matches=routed,
                inflight={e: local.get(e, _NO_WORK) for e in ids},
                snapshots={e: s for e, s in self._snapshots.items() if e in ids},
                health_marks=dict(self._health_marks),
                learned_joules_per_token=self._energy.joules_per_token(),
                degraded=True,
            )
        snapshots = view.snapshots
        known = self._snapshots
        for endpoint, snap in snapshots.items():
            if known.get(endpoint) is not snap:  # a store may hand back the same snapshot until a newer one comes
                known[endpoint] = snap
                self._energy.observe(snap)
        if self._health_marks:
            self._forget_healed(snapshots, now)
        inflight = view.inflight
        if local:
            inflight = {e: _at_least(inflight.get(e), local.get(e)) for e in ids}
        return FleetState(
            now=now,
            matches=merge_matches(view.matches, routed),
            inflight=inflight,
            snapshots=snapshots,
            health_marks=dict(self._health_marks),
            learned_joules_per_token=self._energy.joules_per_token(),
        )

    def _forget_healed(self, snapshots: dict[str, EndpointSnapshot], now: float) -> None:
        for endpoint, mark in list(self._health_marks.items()):
            snap = snapshots.get(endpoint)
            healed = snap is not None and snap.healthy and snap.last_seen > mark.since
            if healed or now - mark.since >= self.config.placement.unhealthy_mark_ttl_s:
                del self._health_marks[endpoint]

    def _record(self, decision: Decision) -> Decision:
        self._recent.append(decision)
        if decision.rejection is None:
            self.stats.placed += 1
        else:
            self.stats.rejected += 1
        if decision.degraded:
            self.stats.degraded += 1
        return decision

    # -- the request's lifecycle ----------------------------------------------------------------------------
    async def dispatched(self, decision: Decision) -> None:
        """The gateway sent the request to ``decision.endpoint``: count its work and mark its prefix speculative,
        here (``note_dispatch``) and in the shared store (``share_dispatch``)."""
        self.note_dispatch(decision)
        await self.share_dispatch(decision)

    def note_dispatch(self, decision: Decision) -> None:
        """Count a dispatch in this process at once. Adapters call it before they hand the pick to the gateway,
        so the next request placed sees this one's queue and prefix even when the store write, or the task that
        makes it, has not run yet (a busy gateway loop runs such tasks many requests later). Idempotent."""
        endpoint = decision.endpoint
        if endpoint is None or self._local.has(decision.request_id):
            return
        params = self.config.placement
        now = self._clock()
        entry = _LocalRequest(
            endpoint, _queued_prefill(decision), decision.expected_decode_tokens, now + params.inflight_ttl_s
        )
        self._local.add(decision.request_id, entry, now)
        self.stats.dispatched += 1
        if decision.keys:
            self._routed.add(decision.model, endpoint, decision.keys, now + self._history_ttl(endpoint))

    async def share_dispatch(self, decision: Decision) -> None:
        """Write a dispatch to the shared store: in-flight work and the speculative prefix."""
        endpoint = decision.endpoint
        if endpoint is None:
            return
        params = self.config.placement
        calls: list[Awaitable[object]] = [
            self.store.inflight_add(
                endpoint,
                decision.request_id,
                _queued_prefill(decision),
                decision.expected_decode_tokens,
                params.inflight_ttl_s,
            )
        ]
        if decision.keys:
            ttl = self._history_ttl(endpoint)
            calls.append(self.store.add_speculative(decision.model, endpoint, decision.keys, ttl))
        writes = asyncio.gather(*calls) if self._store_suspends else _one_after_another(calls)
        await self._guarded(writes, "record a dispatch")

    def _history_ttl(self, endpoint_id: str) -> float:
        """Events confirm what an engine caches within moments; without events, routing history is all we have."""
        endpoint = self.config.endpoint(endpoint_id)
        params = self.config.placement
        if endpoint is not None and endpoint.kv_events is None:
            return params.routing_history_ttl_s
        return params.speculative_ttl_s

    async def first_token(self, decision: Decision) -> None:
        """The first token came back: the request's prefill no longer queues ahead of others."""
        if decision.endpoint is None:
            return
        self._local.prefill_done(decision.request_id)
        await self._guarded(
            self.store.inflight_prefill_done(decision.endpoint, decision.request_id), "record a first token"
        )

    async def finished(self, decision: Decision, outcome: Outcome) -> None:
        """The request is over (success or failure): release its in-flight work; record the achieved cache hit."""
        if decision.endpoint is None:
            return
        self._local.release(decision.request_id)
        if outcome.ok:
            self.stats.finished_ok += 1
        else:
            self.stats.finished_error += 1
        if outcome.cached_tokens is not None:
            self.stats.hit_reports += 1
            self.stats.predicted_cached_tokens += decision.predicted_cached_tokens
            self.stats.achieved_cached_tokens += outcome.cached_tokens
        await self._guarded(
            self.store.inflight_release(decision.endpoint, decision.request_id), "release in-flight work"
        )

    async def mark_unhealthy(self, endpoint: str, reason: str) -> None:
        """A gateway saw ``endpoint`` fail: stop picking it now, until a scrape newer than this says it is healthy
        or ``unhealthy_mark_ttl_s`` passes (then it is tried again; a new failure marks it again).

        The mark takes effect in this process at once; it is also written to the store as an unhealthy snapshot,
        so other gateway replicas stop picking it at their next decision.
        """
        now = self._clock()
        self._health_marks[endpoint] = HealthMark(since=now, reason=reason)
        self.stats.marked_unhealthy += 1
        log.warning("endpoint %s marked unhealthy: %s", endpoint, reason)
        last = self._snapshots.get(endpoint) or EndpointSnapshot(endpoint=endpoint)
        dead = replace(last, healthy=False, last_seen=now, extra={**last.extra, SNAPSHOT_MARKED_UNHEALTHY_AT: now})
        self._snapshots[endpoint] = dead
        await self._guarded(self.store.put_snapshot(dead), "share an unhealthy mark")

    # -- lookups --------------------------------------------------------------------------------------------
    def endpoint_url(self, endpoint_id: str) -> str | None:
        """Base URL of a configured endpoint (``http://host:port``), or None for an unknown id."""
        endpoint = self.config.endpoint(endpoint_id)
        return None if endpoint is None else endpoint.url

    def recent_decisions(self) -> list[Decision]:
        """The last ``RECENT_DECISIONS`` decisions, oldest first."""
        return list(self._recent)

    async def close(self) -> None:
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


def _keyer(model: ModelConfig) -> PromptKeyer:
    tokenizer = None
    if model.tokenizer is not None:
        tokenizer = ChatTokenizer(model.tokenizer, model.chat_template)
    return PromptKeyer(model.name, model.block_size, tokenizer)
