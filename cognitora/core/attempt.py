"""One placed request's life on its endpoint: ``Attempt``, the same in every gateway.

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
- **no lost first token**: a first token that is never reported stops counting as queued prefill after a deadline
  derived from the predicted TTFT (``watch_prefill``).

What the attempt's first token and end mean (counts, learning, budgets, health) is its owner's, the lifecycle's
(``cognitora.core.lifecycle``): the attempt tells it through ``AttemptOwner``, and never imports it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from cognitora.core.fleet_view import FleetView
from cognitora.core.outcome import Outcome
from cognitora.decision import Decision

if TYPE_CHECKING:
    from cognitora.budgets.gate import Hold

__all__ = ["Attempt", "AttemptOwner"]


class AttemptOwner(Protocol):
    """What an attempt tells the registry that made it (``cognitora.core.lifecycle.Lifecycle``), on the router's
    loop. Only attempts call these; the prefill's end and the finish come once each (the attempt's guards)."""

    fleet: FleetView
    """Its ``guarded`` bounds each of the attempt's store writes by the store timeout."""

    def attempt_prefill_done(self, attempt: Attempt) -> None:
        """The attempt's prefill is over: its first token, or the deadline ``watch_prefill`` set."""
        ...

    def attempt_finished(self, attempt: Attempt, outcome: Outcome) -> None:
        """The attempt is over (``Attempt.finish``'s first call)."""
        ...

    def redispatch(self, attempt: Attempt, endpoint: str) -> Attempt:
        """The gateway moved the attempt's request to ``endpoint``: the new attempt there."""
        ...

    def track_writer(self, task: asyncio.Task[None]) -> None:
        """The attempt's background chain of store writes, which closing the owner waits for."""
        ...


class Attempt:
    """One dispatch of a placed request to ``decision.endpoint``. Made by ``Lifecycle.dispatch`` (through
    ``Router.admit``) only: its ``owner``."""

    def __init__(
        self, owner: AttemptOwner, decision: Decision, group: str | None, loop: asyncio.AbstractEventLoop
    ) -> None:
        assert decision.endpoint is not None, "only a placed decision is dispatched"
        self.decision = decision
        self.endpoint: str = decision.endpoint
        self.group = group
        """The gateway's id for the logical request (LiteLLM's trace id): its attempts are retries of one another."""
        self.dispatched_at = time.monotonic()
        self.first_token_at: float | None = None
        self.outcome: Outcome | None = None
        self._owner = owner
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
        self._on_loop(lambda: self._owner.attempt_finished(self, outcome))

    def rerouted(self, endpoint: str, outcome: Outcome) -> Attempt:
        """The gateway served this request on ``endpoint`` instead (Envoy retried on a fallback): this attempt ends
        with ``outcome`` (``CONNECT_FAILED`` when the pick could not be reached), and a new one, on ``endpoint``, is
        counted in its place. Call on the core's loop."""
        hold, self.budget_hold = self.budget_hold, None  # the request goes on: its reservation moves with it
        self.finish(outcome)
        new = self._owner.redispatch(self, endpoint)
        new.budget_hold = hold
        return new

    async def settled(self) -> None:
        """On the router's loop: wait until every store write this attempt made so far has landed (or failed)."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    # -- the lifecycle's side (on the router's loop) ---------------------------------------------------------
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
        self.cancel_overdue()
        self._owner.attempt_prefill_done(self)

    def cancel_overdue(self) -> None:
        """Drop the prefill's deadline: the attempt ended before its first token (the lifecycle, at its end)."""
        if self._overdue is not None:
            self._overdue.cancel()
            self._overdue = None

    def watch_prefill(self, deadline_s: float) -> None:
        """Take the prefill as done after ``deadline_s`` unless a first token comes first (at dispatch)."""
        self._overdue = self._loop.call_later(deadline_s, self._prefill_finished)

    def queue_write(self, call: Callable[[], Awaitable[object]], what: str) -> None:
        """Queue a store write; writes of one attempt run in order, in the background."""
        self._writes.append((call, what))
        if self._writer is None or self._writer.done():
            self._writer = self._loop.create_task(self._drain())
            self._owner.track_writer(self._writer)

    async def _drain(self) -> None:
        while self._writes:
            call, what = self._writes.pop(0)
            await self._owner.fleet.guarded(call(), what)

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
