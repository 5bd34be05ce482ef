"""``Attempt``: one placed request's life on its endpoint, owned by the core, the same in every gateway.

    decision, attempt = await router.admit(request)   # placed and counted as dispatched in one step
    attempt.first_token()                             # once: its prefill no longer queues ahead of others
    attempt.finish(Outcome(OutcomeKind.COMPLETED, prompt_tokens=..., cached_tokens=...))   # once

An adapter only translates its gateway's hooks onto these calls. The attempt guarantees the rest:

- **order and once**: the dispatch is counted before ``admit`` returns (no await between the pick and its count);
  ``first_token`` and ``finish`` take effect once each, whichever hook calls first, and a ``finish`` makes any later
  ``first_token`` a no-op. The shared store's writes for one attempt run in one background chain, in that order, so
  a release never overtakes its dispatch and no gateway waits on a store round trip.
- **any thread**: each method may be called from any thread (LiteLLM runs sync callbacks on worker threads); the
  work always runs on the router's loop.
- **health from the outcome**: the core, not the adapter, decides whether an outcome means the endpoint is gone
  (``OutcomeKind.marks_unhealthy``).
- **no lost end**: a first token that is never reported stops counting as queued prefill after a deadline derived
  from the predicted TTFT; an attempt whose end is never reported is finished as ``ABANDONED`` after
  ``placement.inflight_ttl_s``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from cognitora.decision import Decision

if TYPE_CHECKING:
    from cognitora.budgets.gate import Hold
    from cognitora.router import Router

__all__ = ["Attempt", "AttemptRecord", "Outcome", "OutcomeKind"]

UNHEALTHY_STATUSES = frozenset({502, 503})
"""An engine (or the proxy in front of it) answering these is not serving: the core stops picking it for a while.
Other 5xx are one request's failure on a live engine."""


class OutcomeKind(StrEnum):
    """How an attempt ended. Adapters map their gateway's signals onto these; the core decides what each means."""

    COMPLETED = "completed"
    """The whole response reached the gateway."""
    CLIENT_CANCELLED = "client_cancelled"
    """The client went away (or the gateway reset the stream) before the response was whole."""
    CONNECT_FAILED = "connect_failed"
    """The endpoint could not be reached: connection refused or reset before a response, no route."""
    TIMEOUT = "timeout"
    """No (complete) answer in time. A slow engine is alive: placement already prices its queue."""
    UPSTREAM_ERROR = "upstream_error"
    """The endpoint answered with a 5xx status."""
    REJECTED = "rejected"
    """The endpoint answered with a 4xx status (a bad request, a context too long): its fault is the request's."""
    REROUTED = "rerouted"
    """The gateway served the request on another endpoint than the pick; a new attempt there carries on."""
    ABANDONED = "abandoned"
    """The gateway never reported this attempt's end (a retry started, or the attempt outlived its lease)."""
    FAILED = "failed"
    """Any other failure the gateway reported."""

    def marks_unhealthy(self, status: int | None) -> bool:
        """Whether an attempt that ended so means its endpoint is gone (the core stops picking it)."""
        if self is OutcomeKind.CONNECT_FAILED:
            return True
        return self is OutcomeKind.UPSTREAM_ERROR and status in UNHEALTHY_STATUSES


@dataclass(frozen=True)
class Outcome:
    """What the gateway saw at an attempt's end. Token counts come from the response's ``usage`` when it had one."""

    kind: OutcomeKind
    status: int | None = None
    """The HTTP status the endpoint answered with, when one came."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """Achieved prefix-cache hit, from ``usage.prompt_tokens_details.cached_tokens``."""
    ttft_s: float | None = None
    """Time to first token as the gateway measured it; the attempt's own ``first_token`` timing wins when it has one."""
    detail: str = ""
    """What went wrong, for logs and the health mark's reason (empty when completed)."""
    retry_after_s: float | None = None
    """The answer's ``Retry-After`` (seconds) when it had one (a cloud target's 429: ``cognitora.burst``)."""

    @property
    def ok(self) -> bool:
        return self.kind is OutcomeKind.COMPLETED


@dataclass(frozen=True)
class AttemptRecord:
    """What the router learned from one finished attempt: the prediction beside what was achieved."""

    request_id: str
    model: str
    endpoint: str
    kind: OutcomeKind
    status: int | None
    prompt_tokens: int
    """The response's count when it had one, else the placement's."""
    completion_tokens: int | None
    predicted_cached_tokens: float
    achieved_cached_tokens: int | None
    predicted_ttft_s: float
    achieved_ttft_s: float | None
    runner_up: str | None
    runner_up_predicted_ttft_s: float | None
    finished_at: float
    """Unix time."""


class Attempt:
    """One dispatch of a placed request to ``decision.endpoint``. Made by ``Router.dispatch``/``Router.admit`` only."""

    def __init__(self, router: Router, decision: Decision, group: str | None, loop: asyncio.AbstractEventLoop) -> None:
        assert decision.endpoint is not None, "only a placed decision is dispatched"
        self.decision = decision
        self.endpoint: str = decision.endpoint
        self.group = group
        """The gateway's id for the logical request (LiteLLM's trace id): its attempts are retries of one another."""
        self.dispatched_at = time.monotonic()
        self.first_token_at: float | None = None
        self.outcome: Outcome | None = None
        self._router = router
        self._loop = loop
        self._prefill_pending = True
        self._overdue: asyncio.TimerHandle | None = None
        self._writes: list[tuple[Callable[[], Awaitable[object]], str]] = []
        self._writer: asyncio.Task[None] | None = None
        self._lock = threading.Lock()
        self._first_token_claimed = False
        self._finish_claimed = False
        self.budget_hold: Hold | None = None
        """The request's budget reservation (``cognitora.budgets``): settled by the finish, once."""

    @property
    def request_id(self) -> str:
        return self.decision.request_id

    # -- what adapters call (any thread) ----------------------------------------------------------------------
    def first_token(self) -> None:
        """The first token came back. Once; ignored after ``finish``."""
        now = time.monotonic()
        with self._lock:
            if self._first_token_claimed or self._finish_claimed:
                return
            self._first_token_claimed = True
        self._on_loop(lambda: self._record_first_token(now))

    def finish(self, outcome: Outcome) -> None:
        """The attempt is over, however it ended. Once: the first call wins, later ones are ignored."""
        with self._lock:
            if self._finish_claimed:
                return
            self._finish_claimed = True
        self._on_loop(lambda: self._router._attempt_finished(self, outcome))

    def rerouted(self, endpoint: str, outcome: Outcome) -> Attempt:
        """The gateway served this request on ``endpoint`` instead (Envoy retried on a fallback): this attempt ends
        with ``outcome`` (``CONNECT_FAILED`` when the pick could not be reached), and a new one, on ``endpoint``, is
        counted in its place. Call on the router's loop."""
        hold, self.budget_hold = self.budget_hold, None  # the request goes on: its reservation moves with it
        self.finish(outcome)
        new = self._router._redispatch(self, endpoint)
        new.budget_hold = hold
        return new

    async def settled(self) -> None:
        """On the router's loop: wait until every store write this attempt made so far has landed (or failed)."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    # -- the router's side -------------------------------------------------------------------------------------
    def _record_first_token(self, at: float) -> None:
        if self.outcome is not None:
            return
        self.first_token_at = at
        self._prefill_finished()

    def _prefill_finished(self) -> None:
        """The prefill is over (a first token, or its deadline): stop counting it as queued, once."""
        if not self._prefill_pending:
            return
        self._prefill_pending = False
        self._cancel_overdue()
        self._router._prefill_done(self)

    def _cancel_overdue(self) -> None:
        if self._overdue is not None:
            self._overdue.cancel()
            self._overdue = None

    def _watch_prefill(self, deadline_s: float) -> None:
        self._overdue = self._loop.call_later(deadline_s, self._prefill_finished)

    def _write(self, call: Callable[[], Awaitable[object]], what: str) -> None:
        """Queue a store write; writes of one attempt run in order, in the background."""
        self._writes.append((call, what))
        if self._writer is None or self._writer.done():
            self._writer = self._loop.create_task(self._drain())
            self._router._track(self._writer)

    async def _drain(self) -> None:
        while self._writes:
            call, what = self._writes.pop(0)
            await self._router._guarded(call(), what)

    def _on_loop(self, fn: Callable[[], None]) -> None:
        if _running_loop() is self._loop:
            fn()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
