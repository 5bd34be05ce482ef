"""``BudgetGate``: what the Router calls. ``reserve`` at placement (before dispatch), ``settle`` at the attempt's
finish, and the fail-open backlog that writes what was counted locally once the store answers again.

Reserving, by how the store answers (``docs/budgets.md``, "Admission under load"):

- it answers: admitted or refused, exactly (reservations are batched per call: ``cognitora.budgets.batcher``);
- it is connected but slow: the request waits, up to ``budgets.reserve_timeout_s``, then is refused with 503 and
  Retry-After; it is never admitted unchecked because a call was slow;
- it is unreachable (refused, reset, no connection): ``on_store_error`` decides (fail-open: admitted, counted in
  ``stats.fail_open``, its usage written to the store when it is back).

Every reservation that may have reached the store and is not used (refused for another reason, given up on,
placement refused the request) is given back, so a refused request is never charged.

Settling, by how the attempt ended (the actual usage replaces the estimate):

- completed: the response's usage (none reported: the estimate);
- client cancelled: the prompt, and the completion tokens streamed when the gateway counted them (else the
  estimate: a stream the gateway could not count is never counted short);
- abandoned (no end reported; the gateway restarted, or the lease ran out): the estimate;
- every failure before an answer (connect failed, 4xx/5xx, timeout): nothing was served, nothing is charged.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from cognitora.budgets.batcher import LedgerBatcher
from cognitora.budgets.config import ANONYMOUS_TEAM, BudgetsConfig, Metric, SubjectKind
from cognitora.budgets.ledger import BudgetLedger, Refusal, SettleResult
from cognitora.budgets.memory_ledger import MemoryLedger
from cognitora.budgets.plan import MICRO, CounterPlan, Planner, Reservation, Usage
from cognitora.core.outcome import Outcome, OutcomeKind
from cognitora.decision import Rejection
from cognitora.identity import Identity
from cognitora.request import RouteRequest
from cognitora.telemetry import Histogram
from kvstate.store import Store, StoreUnavailable

if TYPE_CHECKING:
    from cognitora.config import CognitoraConfig

__all__ = ["BudgetGate", "Hold", "open_ledger"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

USAGE_REFRESH_S = 5.0
BACKLOG_MAX = 1_000_000
"""Settles kept while the store is down (fail-open); past this the oldest are dropped, and logged."""
SETTLE_TIMEOUT_S = 30.0
"""A settle is written in the background: it may wait long for a slow store; past this it joins the backlog
(written again later: settles are idempotent by request id)."""
RESERVE_SECONDS_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0,
)  # fmt: skip
"""Upper bounds (s) of the reserve latency histogram (``cognitora_budget_reserve_duration_seconds``)."""
_UNREACHABLE = (StoreUnavailable, ConnectionError, OSError)
"""Errors that mean the store cannot be reached (``TimeoutError`` is an ``OSError`` too: told apart first)."""
_ERRORS = (StoreUnavailable, TimeoutError, ConnectionError, OSError)
_CHARGED_NOTHING = frozenset(
    {
        OutcomeKind.CONNECT_FAILED,
        OutcomeKind.TIMEOUT,
        OutcomeKind.UPSTREAM_ERROR,
        OutcomeKind.REJECTED,
        OutcomeKind.FAILED,
    }
)


@dataclass
class Hold:
    """A request's admitted reservation, kept by its attempt until it is settled."""

    reservation: Reservation
    in_store: bool
    """False: made while the store was unreachable (fail-open); the settle adds the usage in full, later."""
    settled: bool = False


@dataclass
class GateStats:
    reserved: int = 0
    refused: dict[tuple[str, str], int] = field(default_factory=dict)
    """(team label, reason) -> refusals; reason: the metric of the limit, or ``store_unavailable``."""
    settled: int = 0
    fail_open: int = 0
    """Requests admitted without the store (it was unreachable, ``on_store_error: fail_open``)."""
    released: int = 0
    """Reservations given back because they were not used (refused for another reason, given up on)."""
    flushed: int = 0
    dropped: int = 0
    reserve_seconds: Histogram = field(default_factory=lambda: Histogram(RESERVE_SECONDS_BUCKETS))
    """How long each reservation took to be decided (admitted, refused, or given up), in this process."""


def open_ledger(redis_url: str | None, prefix: str, history_days: int, cluster: bool = False) -> BudgetLedger:
    """The ledger a process should use: Redis (or a Redis Cluster) at ``redis_url``, else in process."""
    if redis_url is None:
        return MemoryLedger()
    from cognitora.budgets.redis_ledger import RedisLedger

    return RedisLedger.from_url(redis_url, prefix, history_days, cluster=cluster)


def gate_for(config: CognitoraConfig, store: Store, clock: Callable[[], float] = time.time) -> BudgetGate | None:
    """The Router's gate: None without a ``budgets`` section. The ledger lives where the store does: on
    ``redis_url`` (its own connection pool), on a RedisStore's client when the config names no URL, or in process
    beside a MemoryStore."""
    budgets = config.budgets
    if budgets is None:
        return None
    from kvstate.redis_store import RedisStore

    ledger: BudgetLedger
    if config.redis_url is not None and not _in_process(store):
        # Its own connections: a burst of admits must not take the store's (redis-py's pool raises when full).
        ledger = open_ledger(config.redis_url, config.key_prefix, budgets.history_days, config.redis_cluster)
    elif isinstance(store, RedisStore):
        from cognitora.budgets.redis_ledger import RedisLedger

        ledger = RedisLedger.beside(store.client, config.key_prefix, budgets.history_days)
    else:
        ledger = MemoryLedger()
    return BudgetGate(budgets, ledger, clock=clock)


def _in_process(store: Store) -> bool:
    from kvstate.memory_store import MemoryStore

    return isinstance(store, MemoryStore)


class BudgetGate:
    def __init__(
        self,
        config: BudgetsConfig,
        ledger: BudgetLedger,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.planner = Planner(config)
        self._clock = clock
        self._suspends = not isinstance(ledger, MemoryLedger)
        self._batcher = LedgerBatcher(ledger, config.reserve_batch)
        self._backlog: deque[tuple[Reservation, Usage, int]] = deque()
        self._flushing: asyncio.Task[int] | None = None
        self._down = False
        self._slow = False
        self._settling: set[asyncio.Task[None]] = set()
        self.stats = GateStats()
        self.last_usage: dict[tuple[str, str, str], float] = {}
        """``usage_gauges`` as last read (metrics), refreshed in the background every ``USAGE_REFRESH_S``."""
        self._usage_read_at = 0.0
        self._usage_task: asyncio.Task[None] | None = None

    # -- who and which class ------------------------------------------------------------------------------------
    def team_label(self, team: str | None) -> str:
        """The metrics label of a team: configured teams by name, any other as ``default`` (bounded cardinality)."""
        if team is None:
            return "none"
        return team if team in self.config.teams else "default"

    def priority_for(self, team: str | None) -> str | None:
        entry = self.config.teams.get(team) if team is not None else None
        return None if entry is None else entry.priority

    # -- reserve ------------------------------------------------------------------------------------------------
    async def reserve(self, request: RouteRequest, model: str, prompt_tokens: int) -> Hold | Rejection:
        identity = request.identity
        now = self._clock()
        estimate = self.planner.estimate_request(request, model, prompt_tokens)
        reservation = self.planner.plan(request.request_id, identity, model, estimate, now)
        for c in reservation.counters:
            if c.amount > c.cap:
                self._count_refusal(identity.team, c.metric.value)
                return Rejection(
                    400,
                    f"this request alone needs {_amount(c.metric, c.amount)} against {c.limit_path}, a limit of "
                    f"{_amount(c.metric, c.cap)} per {c.window}: it can never fit; lower max_tokens (or n, or the "
                    "prompts in the batch) or shorten the prompt",
                )
        started = time.perf_counter()
        try:
            refusal = await self._reserve(reservation, int(now * 1000))
        except TimeoutError:  # (StoreSlow included) connected but slow: never admitted unchecked
            return self._too_slow(reservation)
        except _UNREACHABLE as exc:
            return self._store_down(reservation, exc)
        finally:
            self.stats.reserve_seconds.observe(time.perf_counter() - started)
        self._store_back()
        if refusal is not None:
            self._count_refusal(identity.team, refusal.counter.metric.value)
            return self._rejection(refusal, now)
        self.stats.reserved += 1
        self._refresh_usage_soon(now)
        return Hold(reservation, in_store=True)

    async def _reserve(self, reservation: Reservation, now_ms: int) -> Refusal | None:
        """The store's verdict, within ``reserve_timeout_s`` (``TimeoutError`` past it). A waiter that gives up
        (the deadline, or its request cancelled) gives the reservation back: it may have been made meanwhile."""
        if not self._suspends:
            return await self.ledger.reserve(reservation, now_ms)
        verdict = self._batcher.reserve(reservation, now_ms)
        try:
            async with asyncio.timeout(self.config.reserve_timeout_s):
                return await asyncio.shield(verdict)
        except BaseException:
            if not verdict.done() or (not verdict.cancelled() and verdict.exception() is None):
                verdict.cancel()
                self._release(reservation)
            raise

    def _release(self, reservation: Reservation) -> None:
        """Give back a reservation that may have reached the store and will not be used: settled at nothing, the
        request not counted (a no-op when the store never made it; once per id, like every settle)."""
        self.stats.released += 1
        self._track(self._settle(reservation, Usage(), requests=0))

    def _too_slow(self, reservation: Reservation) -> Rejection:
        self._count_refusal(reservation.identity.team, "store_slow")
        if not self._slow:
            self._slow = True
            log.warning(
                "budget store connected but slower than budgets.reserve_timeout_s (%g s): requests refused with "
                "503 until it answers in time",
                self.config.reserve_timeout_s,
            )
        return Rejection(
            503,
            f"the budget store (Redis) did not answer within budgets.reserve_timeout_s "
            f"({self.config.reserve_timeout_s:g} s): the gateway or Redis is overloaded; retry shortly",
            retry_after_s=1,
        )

    def _refresh_usage_soon(self, now: float) -> None:
        if not self.config.teams or now - self._usage_read_at < USAGE_REFRESH_S:
            return
        if self._usage_task is not None and not self._usage_task.done():
            return
        self._usage_read_at = now
        self._usage_task = asyncio.get_running_loop().create_task(self._refresh_usage())

    async def _refresh_usage(self) -> None:
        try:
            self.last_usage = await self.usage_gauges()
        except _ERRORS as exc:
            log.debug("could not read budget usage for metrics: %s", exc)

    def _store_down(self, reservation: Reservation, exc: BaseException) -> Hold | Rejection:
        why = str(exc) or type(exc).__name__
        if not self._down:
            log.warning("budget store unavailable (%s): budgets.on_store_error is %s", why, self.config.on_store_error)
            self._down = True
        if self.config.on_store_error == "fail_closed":
            self._count_refusal(reservation.identity.team, "store_unavailable")
            # The call may have reached the store before it went (the connection reset after the script ran).
            self._release(reservation)
            return Rejection(
                503,
                "the budget store (Redis) is unreachable and budgets.on_store_error is fail_closed: requests are "
                "refused until it is back; retry shortly",
                retry_after_s=1,
            )
        self.stats.fail_open += 1
        return Hold(reservation, in_store=False)

    def _store_back(self) -> None:
        self._slow = False
        if self._down:
            log.warning("budget store reachable again; writing %d locally counted settles", len(self._backlog))
            self._down = False
        if self._backlog and (self._flushing is None or self._flushing.done()):
            self._flushing = asyncio.get_running_loop().create_task(self.flush())

    def _rejection(self, refusal: Refusal, now: float) -> Rejection:
        c = refusal.counter
        retry_after = max(1, math.ceil(refusal.resets_at_ms / 1000 - now))
        resets = dt.datetime.fromtimestamp(refusal.resets_at_ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        who = f"{c.subject_kind.value} {c.subject}"
        if c.subject_kind is SubjectKind.TEAM and c.subject == ANONYMOUS_TEAM:
            who += " (requests without a team)"
        return Rejection(
            429,
            f"token budget exhausted: {c.limit_path} ({who}: {_amount(c.metric, refusal.used)} of "
            f"{_amount(c.metric, c.cap)} used or reserved in the {c.window} window; this request needs "
            f"{_amount(c.metric, c.amount)}); the window resets at {resets}, retry after {retry_after} s",
            retry_after_s=retry_after,
        )

    def _count_refusal(self, team: str | None, reason: str) -> None:
        key = (self.team_label(team), reason)
        self.stats.refused[key] = self.stats.refused.get(key, 0) + 1

    # -- settle -------------------------------------------------------------------------------------------------
    def actual_usage(self, hold: Hold, outcome: Outcome) -> Usage:
        r = hold.reservation
        est = r.estimate
        if outcome.kind in _CHARGED_NOTHING:
            return Usage()
        prompt = outcome.prompt_tokens if outcome.prompt_tokens is not None else est.input_tokens
        completion = outcome.completion_tokens
        if outcome.kind is OutcomeKind.ABANDONED or completion is None:
            completion = est.output_tokens
        return self.planner.usage(r.model, prompt, completion, outcome.cached_tokens or 0)

    def release_later(self, pending: Awaitable[Hold | Rejection]) -> None:
        """A reservation made for a request that was then not dispatched (placement refused it, or the request
        was cancelled while it was placed): given back in full, and the request not counted as served."""

        async def release() -> None:
            try:
                verdict = await pending
            except BaseException:  # (it gave its reservation back itself when it gave up)
                return
            if isinstance(verdict, Hold) and not verdict.settled:
                verdict.settled = True
                await self._settle(verdict.reservation, Usage(), requests=0)

        self._track(release())

    def _track(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    def give_back_later(self, hold: Hold) -> None:
        """Give ``hold`` back in full, the request not counted as served: a cloud attempt whose usage is recorded
        as a charge instead (``cognitora.burst.ledger_spend``), at the target's prices, under ``model@target``."""
        if hold.settled:
            return
        hold.settled = True
        self._track(self._settle(hold.reservation, Usage(), requests=0))

    def charge_later(self, reservation: Reservation, usage: Usage) -> None:
        """Add a charge (``charges.charge_reservation``) in the background, kept in the backlog while the store is
        down, like a settle; counted once per id."""
        self._track(self._settle(reservation, usage))

    def settle_later(self, hold: Hold, outcome: Outcome) -> None:
        """Settle in the background (on the running loop): the finish never waits on the store."""
        self._track(self.settle(hold, outcome))

    async def drain(self) -> None:
        """Wait until every settle started so far has landed (or gone to the backlog)."""
        while self._settling:
            await asyncio.gather(*list(self._settling), return_exceptions=True)

    async def settle(self, hold: Hold, outcome: Outcome) -> None:
        """Settle once (the attempt calls this from its ordered background writes)."""
        if hold.settled:
            return
        hold.settled = True
        await self._settle(hold.reservation, self.actual_usage(hold, outcome))

    async def _settle(self, reservation: Reservation, actual: Usage, requests: int = 1) -> None:
        try:
            if self._suspends:
                # Batched with the other settles of the moment; a deadline cancels it (to the backlog instead).
                async with asyncio.timeout(SETTLE_TIMEOUT_S):
                    result = await self._batcher.settle(reservation, actual, requests)
            else:
                result = await self.ledger.settle(reservation, actual, requests)
        except _ERRORS as exc:
            if not self._down:
                log.warning("budget store unavailable at a settle (%s): kept to write when it is back", exc)
                self._down = True
            self._keep(reservation, actual, requests)
            return
        self.stats.settled += 1
        if result is SettleResult.ALREADY:
            log.debug("request %s was settled already (or at its estimate)", reservation.request_id)
        self._store_back()

    def _keep(self, reservation: Reservation, actual: Usage, requests: int) -> None:
        if len(self._backlog) >= BACKLOG_MAX:
            self._backlog.popleft()
            self.stats.dropped += 1
            log.error("budget backlog full (%d settles): dropped the oldest", BACKLOG_MAX)
        self._backlog.append((reservation, actual, requests))

    async def flush(self) -> int:
        """Write the backlog (settles counted while the store was down) in order; stops at the first failure.
        Each is idempotent by request id, so a flush that is cut short and repeated counts nothing twice."""
        written = 0
        while self._backlog:
            batch = [self._backlog[i] for i in range(min(len(self._backlog), self.config.reserve_batch))]
            try:
                async with asyncio.timeout(SETTLE_TIMEOUT_S):
                    await self.ledger.settle_many(batch)
            except _ERRORS:
                self._down = True
                break
            for _ in batch:
                self._backlog.popleft()
            written += len(batch)
            self.stats.flushed += len(batch)
        return written

    async def flushed(self) -> None:
        """Wait for the backlog write that is under way, if any (tests, shutdown)."""
        if self._flushing is not None:
            await asyncio.gather(self._flushing, return_exceptions=True)

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    async def _call(self, call: Awaitable[_T]) -> _T:
        """A read (counters for metrics and reports), within ``reserve_timeout_s``."""
        if self._suspends:
            async with asyncio.timeout(self.config.reserve_timeout_s):
                return await call
        return await call

    async def close(self) -> None:
        await self.drain()
        if self._usage_task is not None:
            await asyncio.gather(self._usage_task, return_exceptions=True)
        if self._backlog:
            await self.flush()
        await self.ledger.close()

    # -- limits, for metrics and the report ---------------------------------------------------------------------
    def limit_gauges(self) -> dict[tuple[str, str, str], float]:
        """(team, window, metric) -> cap, for the configured teams (cost in dollars)."""
        out: dict[tuple[str, str, str], float] = {}
        for team in self.config.teams:
            _, limits = self.config.limits_for(SubjectKind.TEAM, team)
            for limit in limits:
                window = limit.window.value if limit.rolling_s is None else f"rolling_{limit.rolling_s:g}s"
                for metric, cap in limit.caps():
                    out[(team, window, metric.value)] = cap
        return out

    async def counter_values(self, counters: list[CounterPlan]) -> list[int]:
        """Each counter's current value, read from the store (``StoreUnavailable``/``TimeoutError`` when down)."""
        return await self._call(self.ledger.counter_values(counters, int(self._clock() * 1000)))

    async def usage_gauges(self) -> dict[tuple[str, str, str], float]:
        """(team, window, metric) -> current usage (reserved + settled), read from the store."""
        now = self._clock()
        plans = []
        for team in self.config.teams:
            r = self.planner.plan("-", Identity(team=team), "-", Usage(), now)
            plans += [c for c in r.counters if c.subject_kind is SubjectKind.TEAM]
        values = await self._call(self.ledger.counter_values(plans, int(now * 1000)))
        out: dict[tuple[str, str, str], float] = {}
        for c, v in zip(plans, values, strict=True):
            window = c.window.split(" (")[0].replace("rolling ", "rolling_").replace(" s", "s")
            out[(c.subject, window, c.metric.value)] = v / MICRO if c.metric is Metric.COST else v
        return out


def _amount(metric: Metric, value: int) -> str:
    if metric is Metric.COST:
        return f"${value / MICRO:,.4f}"
    return f"{value:,} {metric.value}"
