"""``FlowController``: requests wait here, on the gateway's event loop, while the fleet is saturated for them, and
are placed when they leave, on the fleet as it is then (no regret: nothing is committed to an engine's queue
while it waits). docs/flow_control.md has the whole design; ``cognitora.flow.fair_queue`` the order.

**Waiting costs memory, not CPU.** A waiter is its request's own task suspended on one future, with one timer
(its deadline) in the loop's heap: nothing polls it. One dispatcher task per controller does the work, and only
when woken:

- by the core, when this process frees capacity: an attempt finished (a seat, its KV), a first token (the
  engine's prefill queue), an engine back to health (``wake``);
- by a request that queued behind others while the fleet may have room (``WakeReason.ARRIVAL``);
- every ``recheck_interval_s`` while anyone waits: what other replicas, scrapes and expiring leases freed.

Woken, it takes the queue's next entry and asks the core's ``Placer`` to place it now. Placed: the waiter's
future gets the result and the next entry is tried, and so on while the fleet takes them. Held for that request
only (``Held.only_this``: its prompt is too long for the load now, or too little of its objective is left): its
flow's waiter with the earliest deadline that can still make it goes in its place (else its newest), and the
next, while they are placed (``_turn``); then its flow sits out this wake-up and the next flow's head of the band
is tried (each flow's head at most once), so one team's long request does not block another team's short one.
Held for all (every seat taken), or every flow of the band held: it stops, and tries again on the next wake-up,
not sooner than ``retry_spacing_s`` later. Wake-ups that arrive meanwhile are
merged into one. So a storm of finishes costs at most one placement per dispatch plus one per spacing and per
flow held for itself, whatever the number of waiters; and the queue's own work per dispatch is O(log flows), plus
O(the flow's waiters) for a held head's turn (a scan of their deadlines, no placement tries).

**Leaving.** A waiter leaves without being placed when its wait bound runs out (its class's ``max_wait_s``, else
what its TTFT objective leaves after its own predicted TTFT: ``Band.wait_bound_s``; a ``QueueRefusal``
with 429 and Retry-After: how long the requests ahead take to drain at the recent rate), when its client goes
away (its task is cancelled: the entry is removed at once, O(1)), or when the queue was full on arrival. Each
time the budget hold it brought is given back (``give_back``, called once). A waiter that leaves while the
dispatcher is placing it: the placement finishes, and a placed result goes to ``Placer.unclaimed``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar, cast

from cognitora.decision import Rejection
from cognitora.flow.bands import Band
from cognitora.flow.config import FlowControlConfig
from cognitora.flow.drain_rate import DrainRate, retry_after_s
from cognitora.flow.fair_queue import Choice, Entry, FairQueue
from cognitora.flow.outcome import Departure, Held, Left, Placer, QueueRefusal, WakeReason
from cognitora.flow.saturation import Saturation
from cognitora.flow.shared_served import SharedServed
from cognitora.flow.snapshot import BandView, FlowCounters, FlowView, QueueSnapshot, wait_explanation

__all__ = ["FlowController", "Ticket", "timeout_message"]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

YIELD_EVERY = 32
"""Dispatches in a row before the dispatcher yields to the loop, when the placer answered without suspending:
a burst that drains at once never holds the loop for more than this many placements."""


EDF_CUSHION = 1.2
"""A held head's turn goes to a waiter whose deadline leaves at least this many times what the head needs. Earliest
deadline first serves the waiter with the least slack, so a prediction a little short turns its placement into a
miss (and the waiter's own prompt may be longer than the head's): the cushion keeps such near misses for later
waiters, which have the slack."""


def timeout_message(band: Band, waited_s: float) -> str:
    """The 429's message for a request of ``band`` that waited ``waited_s`` (its bound) unplaced."""
    if band.max_wait_s is not None:
        return (
            f"waited {waited_s:g} s (flow_control max_wait_s of class {band.name!r}) and the fleet is still "
            "saturated; retry later"
        )
    return (
        f"waited {waited_s:.3g} s and the fleet is still saturated: placed any later, this request would miss class "
        f"{band.name!r}'s {band.ttft_slo_s:g} s TTFT objective (the wait follows it; flow_control max_wait_s "
        "overrides); retry later"
    )


class _Tried(Enum):
    """What one placement try of the dispatcher came to."""

    PLACED = 1
    HELD_ALL = 2
    """Held for every request (every seat taken): the wake-up stops."""
    HELD_ITSELF = 3
    """Held for its own sake (``Held.only_this``): another request may go."""
    GONE = 4
    """Left meanwhile, or its placement raised."""


class _State(Enum):
    QUEUED = 1
    PLACING = 2
    DONE = 3
    """Dispatched, or left and given back."""


@dataclass(eq=False, slots=True)
class Ticket(Generic[T]):
    """One waiting request, as the ``Placer`` sees it."""

    item: T
    """The core's request (a ``RouteRequest``)."""
    request_id: str
    band: str
    flow: str
    cost: float
    saturation: Saturation | None
    give_back: Callable[[], None] | None
    future: asyncio.Future[Any]
    queued_at: float
    entry: Entry[Ticket[T]] | None = None
    """Its place in the queue; None once it left (no cycle outlives the wait)."""
    state: _State = _State.QUEUED
    leaving: bool = False
    """Its waiter left while the dispatcher was placing it."""
    held_itself: bool = False
    """Its last try held it for its own sake (``Held.only_this``): the dispatcher's, else its admission's
    (``wait(held_itself=...)``). A newcomer of another flow may go past it while it is its flow's head
    (``must_queue``)."""
    needs_s: float | None = None
    """What its last hold said it takes once placed (``Held.needs_s``, gateway seconds)."""
    aged: bool = False
    """Being placed by the anti-starvation rule (ahead of a higher band, or waited its band's ``aged_after_s``):
    the placer must not hold it for the higher bands' sake (``cognitora.flow.priority``)."""


class FlowController(Generic[T, R]):
    """One per gateway process, on its event loop (see the module doc)."""

    def __init__(
        self,
        config: FlowControlConfig,
        bands: Sequence[Band],
        placer: Placer[Ticket[T], R],
        *,
        observer: Callable[[Departure], None] | None = None,
    ) -> None:
        self.config = config
        self._queue: FairQueue[Ticket[T]] = FairQueue(bands, aged_share=config.aged_share, weight=config.weight)
        self._placer = placer
        self._observer = observer
        self._kick = asyncio.Event()
        self._wake: WakeReason | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._rate = DrainRate()
        self._per_flow = config.max_queued_per_flow or config.max_queued
        self._shared = SharedServed()
        self.counters = FlowCounters()

    # -- the core's calls ----------------------------------------------------------------------------------------
    def must_queue(self, band: str, flow: str | None = None) -> bool:
        """Requests of ``band`` or a higher one are waiting: a new request of ``band`` joins the queue even if the
        fleet has room for it (it would overtake them). Raises ``KeyError`` for a class that is not a band.

        Except past heads held for themselves: when nothing waits in a higher band and every flow waiting in
        ``band`` has its head where the last try held it for its own sake (``Held.only_this``: its prompt against
        the load, its team's isolation), a request of another ``flow`` that the fleet takes now is placed at
        once, as the dispatcher would place it after trying them (it skips such heads), without the queue's round
        trip and its retry spacing. Not past its own flow's waiters (it is its flow's newest then, tried at the
        next wake-up), nor a higher band's (strict bands: the dispatcher does not try a lower band while a higher
        one waits). A head that could fit
        since its last try (capacity freed meanwhile) is tried at the next wake-up, which that freeing
        triggered: the newcomer may go first by that much. A head that has not been tried since it became the head
        (its flow's previous head timed out, or it is its flow's first waiter) counts as held for itself when its
        admission was: that placement is its last try. O(flows waiting in ``band``)."""
        index = self._queue.band_index(band)
        here = self._queue.depth(index)
        if self._queue.waiting_at_or_above(index) > here:
            return True
        if here == 0:
            return False
        if flow is None or self._queue.waiting_from(index, flow):
            return True
        for other in self._queue.waiting_flows(index):
            head = self._queue.head(index, other)
            if head is None or not head.payload.held_itself:
                return True
        return False

    async def wait(
        self,
        item: T,
        *,
        request_id: str,
        band: str,
        flow: str,
        cost: float,
        saturation: Saturation | None,
        give_back: Callable[[], None] | None = None,
        max_wait_s: float | None = None,
        held_itself: bool = False,
        objective_s: float | None = None,
    ) -> R | QueueRefusal:
        """Queue ``item`` and wait until the ``Placer`` places it (its result), or it leaves unplaced (a
        ``QueueRefusal``). ``saturation``: why it waits (None: only because others wait ahead, ``must_queue``).
        ``max_wait_s``: how long it may wait (``Band.wait_bound_s`` of its own predicted TTFT); None: its band's
        longest wait. ``held_itself``: its admission held it for its own sake, as ``Held.only_this`` says (until
        the dispatcher tries it, a newcomer of another flow may go past it: ``must_queue``).
        ``objective_s``: its TTFT objective in this loop's seconds (its deadline is now + that); None: its band's
        ``ttft_slo_s``, else no deadline. ``give_back``: called once if it leaves unplaced (its budget hold).
        Cancelling the caller's task removes it at once (and re-raises). Raises what the placer raised for it."""
        loop = asyncio.get_running_loop()
        index = self._queue.band_index(band)
        limits = self._queue.bands[index]
        limit = limits.longest_wait_s if max_wait_s is None else max_wait_s
        now = loop.time()
        refused = self._refused_at_door(index, flow, limit, now)
        if refused is not None:
            if give_back is not None:
                give_back()
            self._observe(Departure(band, flow, refused.how, 0.0))
            return refused
        ticket: Ticket[T] = Ticket(
            item, request_id, band, flow, cost, saturation, give_back, loop.create_future(), queued_at=now
        )
        ticket.held_itself = held_itself
        objective = limits.ttft_slo_s if objective_s is None else objective_s
        due = None if objective is None else now + objective
        ticket.entry = self._queue.push(ticket, index, flow, cost, now, due)
        self.counters.queued[band] += 1
        self._start()
        if saturation is None:
            self.wake(WakeReason.ARRIVAL)
        future = ticket.future
        deadline = asyncio.timeout_at(now + limit)
        try:
            async with deadline:
                return cast("R | QueueRefusal", await future)
        except TimeoutError:
            if not deadline.expired():
                raise  # the placer's own TimeoutError (a slow store), not the wait's
            if future.done() and not future.cancelled():
                return cast("R | QueueRefusal", future.result())  # placed just as its time ran out
            self._leave(ticket, Left.TIMEOUT, loop.time())
            ahead = self._queue.waiting_at_or_above(index)
            retry = retry_after_s(ahead, self._rate.per_s(loop.time()), limit)
            return QueueRefusal(Left.TIMEOUT, Rejection(429, timeout_message(limits, limit), retry), limit)
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                result = future.result()
                if not isinstance(result, QueueRefusal):
                    self._placer.unclaimed(result)  # placed, but its client is gone
            else:
                self._leave(ticket, Left.CANCELLED, loop.time())
            raise

    def wake(self, why: WakeReason) -> None:
        """Capacity may have freed: try the queue (merged with other wake-ups; nothing happens if nobody waits)."""
        if self._wake is None:
            self._wake = why
        self._kick.set()

    def absorb_served(self, band: str, served: Mapping[str, float], charged: str | None, cost: float) -> None:
        """The shared fairness counters of ``band`` just read (``LeaseGrant.served``, ``Leases.charge``), after
        this replica charged ``cost`` to ``charged``: what other replicas served counts here too."""
        elsewhere = self._shared.elsewhere(band, served, charged, cost)
        if elsewhere:
            self._queue.add_served(self._queue.band_index(band), elsewhere)

    def waiting_flows(self, band: str, limit: int = 64) -> tuple[str, ...]:
        """Up to ``limit`` flows of ``band`` with waiters here: whose shared counters to read back."""
        return tuple(self._queue.waiting_flows(self._queue.band_index(band))[:limit])

    def waiting_by_band(self) -> dict[str, int]:
        """Requests waiting here per band: what ``Leases.publish_depth`` shares with the other replicas."""
        return {b.name: self._queue.depth(i) for i, b in enumerate(self._queue.bands)}

    def explain_wait(self, band: str, flow: str, saturation: Saturation | None) -> str:
        """``cognitora explain``'s line for a request of ``flow`` that would wait now in ``band``."""
        index = self._queue.band_index(band)
        above = self._queue.waiting_at_or_above(index) - self._queue.depth(index)
        ahead = self._queue.ahead_in_band(index, flow)
        return wait_explanation(band, ahead, above, saturation, self._queue.bands[index].longest_wait_s)

    def snapshot(self) -> QueueSnapshot:
        now = asyncio.get_running_loop().time()
        views = []
        for i, band in enumerate(self._queue.bands):
            oldest = self._queue.oldest_at(i)
            flows = tuple(FlowView(f.flow, f.waiting, now - f.oldest_at) for f in self._queue.flows(i))
            c = self.counters
            views.append(
                BandView(
                    band=band.name,
                    waiting=self._queue.depth(i),
                    oldest_wait_s=0.0 if oldest is None else now - oldest,
                    max_wait_s=band.longest_wait_s,
                    flows=flows,
                    queued=c.queued[band.name],
                    left={how: n for (b, how), n in c.left.items() if b == band.name},
                    dispatched={why: n for (b, why), n in c.dispatched.items() if b == band.name},
                    aged=c.aged[band.name],
                    waited_s_sum=c.waited_s[band.name],
                )
            )
        return QueueSnapshot(tuple(views), self._rate.per_s(now), self.counters.held_tries, self.counters.placer_errors)

    async def close(self) -> None:
        """Stop dispatching; every waiter leaves with 503 (its hold given back)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        message = "the gateway is shutting down; retry on another replica"
        now = asyncio.get_running_loop().time()
        while (choice := self._queue.next(now)) is not None:
            ticket, waited = choice.entry.payload, now - choice.entry.at
            self._give_back(ticket)
            if not ticket.future.done():
                ticket.future.set_result(QueueRefusal(Left.CLOSED, Rejection(503, message, 1), waited))
                self._observe(Departure(ticket.band, ticket.flow, Left.CLOSED, waited))

    # -- inside ---------------------------------------------------------------------------------------------------
    def _refused_at_door(self, band: int, flow: str, limit_s: float, now: float) -> QueueRefusal | None:
        if self._closed:
            message = "the gateway is shutting down; retry on another replica"
            return QueueRefusal(Left.CLOSED, Rejection(503, message, 1), 0.0)
        if len(self._queue) >= self.config.max_queued:
            what = f"the gateway queue is full ({self.config.max_queued} waiting, flow_control max_queued)"
        elif self._queue.waiting_from(band, flow) >= self._per_flow:
            what = f"{flow} already has {self._per_flow} requests waiting (flow_control max_queued_per_flow)"
        else:
            return None
        retry = retry_after_s(self._queue.waiting_at_or_above(band), self._rate.per_s(now), limit_s)
        return QueueRefusal(Left.FULL, Rejection(429, f"{what}; retry later", retry), 0.0)

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="cognitora-flow-dispatcher")

    async def _run(self) -> None:
        interval = self.config.recheck_interval_s
        while True:
            if len(self._queue):
                try:
                    async with asyncio.timeout(interval):
                        await self._kick.wait()
                except TimeoutError:
                    pass
            else:
                await self._kick.wait()
            why = self._wake or WakeReason.RECHECK
            self._wake = None
            self._kick.clear()
            try:
                held = await self._drain(why)
            except Exception:  # a bug must not stop the queue: the waiters would all time out
                log.exception("flow control: the dispatcher failed; trying again at the next wake-up")
                held = True
            if held and self.config.retry_spacing_s:
                await asyncio.sleep(self.config.retry_spacing_s)

    async def _drain(self, why: WakeReason) -> bool:
        """Dispatch while the fleet takes them; True when it stopped on a ``Held``. A head held for itself
        (``Held.only_this``: a long prompt over its objective) does not block the other flows of its band: its
        flow's other waiters get its turns (``_turns``), then it sits out this wake-up (``FairQueue.skip``) and the
        next flow's head is tried."""
        try:
            return await self._drain_once(why)
        finally:
            self._queue.unskip()

    async def _drain_once(self, why: WakeReason) -> bool:
        loop = asyncio.get_running_loop()
        placed = 0
        skipped = False
        while (choice := self._queue.next(loop.time())) is not None:
            tried = await self._try(choice, why)
            if tried is _Tried.HELD_ALL:
                return True
            if tried is _Tried.HELD_ITSELF:
                self._queue.skip(choice.entry)
                skipped = True
                held_all, placed = await self._turns(choice, why, placed)
                if held_all:
                    return True
            elif tried is _Tried.PLACED:
                placed += 1
                if placed % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        return skipped

    async def _turns(self, held: Choice[Ticket[T]], why: WakeReason, placed: int) -> tuple[bool, int]:
        """The turns of a flow whose head ``held`` was held for itself, before it sits out the wake-up: its
        waiters are tried one by one (``_turn``) while they are placed, each at most once (bounded by the waiters
        behind the head), so seats that freed together are filled together. Stops at the first held. Returns
        (held for all: the wake-up stops, ``placed`` plus what it placed)."""
        loop = asyncio.get_running_loop()
        head = held.entry
        for _ in range(self._queue.waiting_from(head.band, head.flow) - 1):
            entry = self._turn(head, loop.time())
            if entry is None:
                break
            tried = await self._try(Choice(entry, held.aged), why)
            if tried is _Tried.HELD_ALL:
                return True, placed
            if tried is _Tried.HELD_ITSELF:
                break
            if tried is _Tried.PLACED:
                placed += 1
                if placed % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        return False, placed

    def _turn(self, head: Entry[Ticket[T]], now: float) -> Entry[Ticket[T]] | None:
        """Who goes in the place of ``head``, held for itself: its flow's waiter with the earliest deadline among
        those whose deadline leaves what the head needs (``Held.needs_s``) x ``EDF_CUSHION``, the oldest that can
        still make its objective; else (none can, or the need is unknown) its newest. Under overload the head is
        the flow's oldest waiter, held for having too little of its objective left; the newest alone skipped the
        ones just behind it that could still make it: at 200 rps on the 32 x 32 ladder, seats freed at 12.4-14
        engine s went to 300-rps arrivals while 200-rps waiters with 0.5-1.9 s left timed out. The newest stays the
        fallback: in deep overload (the 300-rps stage) nobody's deadline is far enough, and a FIFO of deadlines
        served nobody there (docs/flow_control.md, "A held head does not block the band")."""
        needs = head.payload.needs_s
        if needs is not None:
            entry = self._queue.earliest_deadline(head.band, head.flow, now + needs * EDF_CUSHION, head)
            if entry is not None:
                return entry
        return self._queue.newest(head.band, head.flow)

    async def _try(self, choice: Choice[Ticket[T]], why: WakeReason) -> _Tried:
        """Ask the placer to place ``choice``'s request now; dispatch it if placed."""
        loop = asyncio.get_running_loop()
        ticket = choice.entry.payload
        if ticket.future.done():  # its deadline or its client's cancel fired; its own code has not run yet
            self._give_back(ticket)
            return _Tried.GONE
        ticket.state = _State.PLACING
        after = self._queue.bands[choice.entry.band].aged_after_s
        ticket.aged = choice.aged or (after is not None and loop.time() - choice.entry.at >= after)
        try:
            result = await self._placer.place(ticket)
        except Exception as exc:
            self.counters.placer_errors += 1
            self._give_back(ticket)
            if not ticket.future.done():
                ticket.future.set_exception(exc)
            return _Tried.GONE
        if isinstance(result, Held):
            if ticket.leaving or ticket.future.done():
                self._give_back(ticket)
                return _Tried.GONE
            ticket.state = _State.QUEUED
            self.counters.held_tries += 1
            ticket.held_itself = result.only_this
            ticket.needs_s = result.needs_s
            return _Tried.HELD_ITSELF if result.only_this else _Tried.HELD_ALL
        self._dispatched(ticket, choice, result, why, loop.time())
        return _Tried.PLACED

    def _dispatched(self, ticket: Ticket[T], choice: Choice[Ticket[T]], result: R, why: WakeReason, now: float) -> None:
        entry = choice.entry
        if ticket.leaving or ticket.future.done():
            self._queue.remove(entry)
            ticket.state, ticket.entry = _State.DONE, None
            self._placer.unclaimed(result)
            return
        self._queue.commit(choice)
        ticket.state, ticket.entry = _State.DONE, None
        ticket.future.set_result(result)
        self._rate.tick(now)
        self._observe(Departure(ticket.band, ticket.flow, Left.DISPATCHED, now - entry.at, choice.aged, why))

    def _leave(self, ticket: Ticket[T], how: Left, now: float) -> None:
        """Its waiter leaves unplaced (timeout, cancelled)."""
        self._observe(Departure(ticket.band, ticket.flow, how, now - ticket.queued_at))
        if ticket.state is _State.PLACING:
            ticket.leaving = True  # the dispatcher gives it back or hands the placed result to ``unclaimed``
        else:
            self._give_back(ticket)

    def _give_back(self, ticket: Ticket[T]) -> None:
        """Out of the queue, its hold given back: once."""
        if ticket.state is _State.DONE:
            return
        ticket.state = _State.DONE
        if ticket.entry is not None:
            self._queue.remove(ticket.entry)
            ticket.entry = None
        if ticket.give_back is not None:
            try:
                ticket.give_back()
            except Exception:
                log.exception("flow control: giving back a queued request's hold failed")

    def _observe(self, departure: Departure) -> None:
        self.counters.record(departure)
        if self._observer is not None:
            self._observer(departure)
