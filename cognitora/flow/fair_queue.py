"""The gateway queue's order: strict priority bands, fair shares across flows within a band, FIFO within a flow while
its head can go (else the waiter that can still make it soonest), and a bounded anti-starvation rule between bands.
Plain data structure: no clock of its own, no asyncio (the controller, ``cognitora.flow.controller``, drives it).

**Within a band: deficit round robin in its virtual-time form.** Each flow (a team, else an API key) has a counter
of the service it received: the cost of each request dispatched from it (its uncached prompt tokens, by default),
divided by the flow's weight. The next dispatch goes to the waiting flow with the smallest counter (ties: the
flow whose head came first). A flow that starts waiting has its counter raised to the band's virtual time (the
counter the last dispatch was charged from), so time spent idle is not banked as credit. That is DRR with a
quantum as small as you like, which is what Start-time Fair Queueing and the Virtual Token Counter of "Fairness
in Serving Large Language Models" (Sheng et al., OSDI 2024) compute: over any interval in which two flows both
wait, the service they receive differs by at most one request's cost each. Unlike DRR with a fixed quantum, a
request of any size is dispatched in O(log flows) (a heap), with no rounds that find no flow able to pay; and the
order does not depend on a quantum to tune. bench/flow_fairness.py measures it against FIFO and DRR by requests.

**Between bands: strict, with an aged share.** The highest band with a waiter goes first. A lower band whose
oldest waiter has waited ``aged_after_s`` (``Band``) may go ahead: the queue keeps a credit that grows by
``aged_share`` with every dispatch (up to 1) and pays 1 for a dispatch of an aged band. So:

- a band that has aged gets at least one dispatch in every ``ceil(1 / aged_share)``, however busy the bands above;
- the bands above lose at most ``aged_share`` of the dispatches to it (and never while no lower band has aged).

Among several aged bands, the one whose oldest waiter is most overdue goes first.

**A held head skips its turn.** When the placer cannot place a flow's head now for that request's own sake (a long
prompt over its objective, or too little of its objective left), the controller ``skip``s the flow for the rest
of the wake-up: the next flow's head of the band is offered, the skipped flow is not charged and keeps its counter
(its deficit), so it is first again after ``unskip``. Before that, the controller offers the head's turns to the
flow's waiter with the ``earliest_deadline`` that can still make it, else its ``newest`` (committed like a head,
charged to the flow): FIFO within a flow holds while its head can go. With every flow of the band skipped,
``next`` answers None rather than a lower band's head.

Entries are removed in O(1) wherever they are (a client that disconnects leaves at once); each entry is in two
ordered dicts (its flow's, for FIFO; its band's, for the oldest waiter), each flow at most once in its band's
heap while it waits (stale heap items are skipped, by a per-flow token).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from cognitora.flow.bands import Band

__all__ = ["Choice", "Entry", "FairQueue", "FlowDepth"]

_EPSILON = 1e-9
"""Ten additions of 0.1 make 0.9999999999999999: the credit is whole within this."""

P = TypeVar("P")

_SWEEP_EVERY = 1024
"""Dispatches per band between sweeps of idle flows whose counters the virtual time has passed (they would be
raised to it anyway on their next request, so forgetting them changes nothing): memory stays with the flows that
wait or were served lately."""


@dataclass(eq=False, slots=True)
class Entry(Generic[P]):
    """One waiting request."""

    payload: P
    band: int
    """Index in the queue's bands, 0 highest."""
    flow: str
    cost: float
    seq: int
    at: float
    """When it was queued (the controller's clock)."""
    deadline: float | None = None
    """When its TTFT objective runs out (the controller's clock); None: unknown. What ``earliest_deadline`` reads."""


@dataclass(frozen=True, slots=True)
class Choice(Generic[P]):
    """What the queue would dispatch next; ``commit`` it once it is placed."""

    entry: Entry[P]
    aged: bool
    """Chosen ahead of a higher band by the anti-starvation rule."""


@dataclass(frozen=True)
class FlowDepth:
    flow: str
    waiting: int
    oldest_at: float
    served: float
    """The flow's counter (cost served / weight, or the virtual time it joined at)."""


@dataclass(slots=True)
class _Flow:
    counter: float = 0.0
    token: int = 0
    queue: OrderedDict[int, Entry[Any]] = field(default_factory=OrderedDict)


@dataclass(slots=True)
class _BandState:
    band: Band
    flows: dict[str, _Flow] = field(default_factory=dict)
    heap: list[tuple[float, int, str, int]] = field(default_factory=list)
    """(counter, head seq, flow, token); an item is current iff its token is the flow's and the flow waits."""
    entries: OrderedDict[int, Entry[Any]] = field(default_factory=OrderedDict)
    skipped: set[str] = field(default_factory=set)
    """Flows whose head the placer held in this wake-up (``skip``): out of the heap until ``unskip``."""
    vtime: float = 0.0
    dispatched: int = 0


class FairQueue(Generic[P]):
    def __init__(
        self, bands: Sequence[Band], *, aged_share: float = 0.1, weight: Callable[[str], float] = lambda _: 1.0
    ) -> None:
        if not bands:
            raise ValueError("a queue needs at least one band")
        self._bands = [_BandState(b) for b in bands]
        self._index = {b.name: i for i, b in enumerate(bands)}
        self._aged_share = aged_share
        self._credit = 1.0
        self._weight = weight
        self._seq = itertools.count()
        self._tokens = itertools.count(1)
        self._len = 0

    # -- reading ------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def band_index(self, name: str) -> int:
        """Raises ``KeyError`` for a class that is not a band."""
        return self._index[name]

    @property
    def bands(self) -> tuple[Band, ...]:
        return tuple(s.band for s in self._bands)

    def depth(self, band: int) -> int:
        return len(self._bands[band].entries)

    def waiting_from(self, band: int, flow: str) -> int:
        f = self._bands[band].flows.get(flow)
        return 0 if f is None else len(f.queue)

    def waiting_at_or_above(self, band: int) -> int:
        return sum(len(s.entries) for s in self._bands[: band + 1])

    def oldest_at(self, band: int) -> float | None:
        entries = self._bands[band].entries
        return next(iter(entries.values())).at if entries else None

    def flows(self, band: int) -> Iterator[FlowDepth]:
        for name, f in self._bands[band].flows.items():
            if f.queue:
                yield FlowDepth(name, len(f.queue), next(iter(f.queue.values())).at, f.counter)

    def waiting_flows(self, band: int) -> list[str]:
        return [name for name, f in self._bands[band].flows.items() if f.queue]

    def head(self, band: int, flow: str) -> Entry[P] | None:
        """``flow``'s first waiter in ``band`` (FIFO within a flow), or None."""
        f = self._bands[band].flows.get(flow)
        return None if f is None or not f.queue else next(iter(f.queue.values()))

    def newest(self, band: int, flow: str) -> Entry[P] | None:
        """``flow``'s last waiter in ``band`` when it has more than one, else None: the one a held head gives its
        turn to (the controller's ``_drain_once``)."""
        f = self._bands[band].flows.get(flow)
        return None if f is None or len(f.queue) < 2 else next(reversed(f.queue.values()))

    def earliest_deadline(self, band: int, flow: str, not_before: float, besides: Entry[P]) -> Entry[P] | None:
        """``flow``'s waiter in ``band`` with the earliest ``deadline`` at or after ``not_before`` (ties: the
        oldest), other than ``besides``; None if none (an unknown deadline never counts): the one a held head
        gives its turn to when it can still make its objective (the controller's ``_turn``). Reads only the
        entries, O(the flow's waiters)."""
        f = self._bands[band].flows.get(flow)
        if f is None:
            return None
        best: Entry[P] | None = None
        earliest = float("inf")
        for e in f.queue.values():
            if e is not besides and e.deadline is not None and not_before <= e.deadline < earliest:
                best, earliest = e, e.deadline
        return best

    def vtime(self, band: int) -> float:
        return self._bands[band].vtime

    def ahead_in_band(self, band: int, flow: str) -> int:
        """How many of ``band``'s waiters a new request of ``flow`` would follow if nothing else arrived: its own
        flow's, and each other flow's whose turns (counter before each of its requests) come no later than the new
        request's. O(waiters in the band): for ``cognitora explain``, not the hot path."""
        state = self._bands[band]
        own = state.flows.get(flow)
        start = state.vtime
        ahead = 0
        if own is not None and own.queue:
            start = own.counter + sum(e.cost for e in own.queue.values()) / self._weight(flow)
            ahead = len(own.queue)
        for name, f in state.flows.items():
            if name == flow:
                continue
            counter, weight = f.counter, self._weight(name)
            for e in f.queue.values():
                if counter > start:
                    break
                ahead += 1
                counter += e.cost / weight
        return ahead

    # -- changing -----------------------------------------------------------------------------------------------
    def push(
        self, payload: P, band: int, flow: str, cost: float, now: float, deadline: float | None = None
    ) -> Entry[P]:
        state = self._bands[band]
        entry = Entry(payload, band, flow, cost, next(self._seq), now, deadline)
        f = state.flows.get(flow)
        if f is None:
            f = state.flows[flow] = _Flow(counter=state.vtime)
        f.queue[entry.seq] = entry
        state.entries[entry.seq] = entry
        if len(f.queue) == 1:
            # It starts waiting: no credit for the time it did not.
            f.counter = max(f.counter, state.vtime)
            self._schedule(state, flow, f)
        self._len += 1
        return entry

    def remove(self, entry: Entry[P]) -> bool:
        """Take ``entry`` out without dispatching it (its waiter left). False if it was not queued."""
        state = self._bands[entry.band]
        if state.entries.pop(entry.seq, None) is None:
            return False
        f = state.flows[entry.flow]
        was_head = next(iter(f.queue)) == entry.seq
        del f.queue[entry.seq]
        self._len -= 1
        if was_head and f.queue:
            self._schedule(state, entry.flow, f)  # the tie-break is the new head's arrival
        return True

    def next(self, now: float) -> Choice[P] | None:
        """The entry to dispatch next, without taking it out. None when nobody waits, or when every waiting flow
        of the band whose turn it is was skipped (``skip``): a lower band does not go instead (strict bands)."""
        top = next((i for i, s in enumerate(self._bands) if s.entries), None)
        if top is None:
            return None
        band, aged = top, False
        if self._credit >= 1.0 - _EPSILON:
            overdue = self._most_overdue(top, now)
            if overdue is not None:
                band, aged = overdue, True
        head = self._head(self._bands[band])
        return None if head is None else Choice(head, aged)

    def skip(self, entry: Entry[P]) -> None:
        """``entry``, its flow's head, cannot be placed now (the fleet may take a smaller request): its flow sits
        out until ``unskip``, so the next flow's head of the band is offered. The flow is not charged and keeps
        its counter (its deficit): it is first again when it is back, and FIFO within it is kept."""
        state = self._bands[entry.band]
        f = state.flows.get(entry.flow)
        if f is None or entry.flow in state.skipped:
            return
        state.skipped.add(entry.flow)
        f.token = next(self._tokens)  # its heap item is stale now: ``_head`` drops it

    def unskip(self) -> None:
        """Every skipped flow takes its turn again (the controller calls it at the end of each wake-up)."""
        for state in self._bands:
            skipped, state.skipped = state.skipped, set()
            for name in skipped:
                f = state.flows.get(name)
                if f is not None and f.queue:
                    self._schedule(state, name, f)

    def commit(self, choice: Choice[P]) -> None:
        """``choice`` was dispatched: take it out and charge its flow."""
        entry = choice.entry
        state = self._bands[entry.band]
        f = state.flows[entry.flow]
        if state.entries.pop(entry.seq, None) is None:
            raise ValueError("commit of an entry that is not queued")
        del f.queue[entry.seq]
        self._len -= 1
        state.vtime = max(state.vtime, f.counter)
        f.counter += entry.cost / self._weight(entry.flow)
        if f.queue:
            self._schedule(state, entry.flow, f)
        # this dispatch earns its share before an aged one pays: one aged dispatch in every 1 / aged_share
        self._credit = min(1.0, self._credit + self._aged_share - (1.0 if choice.aged else 0.0))
        state.dispatched += 1
        if state.dispatched % _SWEEP_EVERY == 0:
            self._sweep(state)

    def add_served(self, band: int, served: Mapping[str, float]) -> None:
        """Add cost that flows of ``band`` were served elsewhere (other gateway replicas,
        ``cognitora.flow.shared_served``) to their counters, as if served here."""
        state = self._bands[band]
        for name, cost in served.items():
            f = state.flows.get(name)
            if f is None or cost <= 0:
                continue
            f.counter += cost / self._weight(name)
            if f.queue:
                self._schedule(state, name, f)

    # -- inside -------------------------------------------------------------------------------------------------
    def _schedule(self, state: _BandState, name: str, f: _Flow) -> None:
        if name in state.skipped:
            return  # ``unskip`` schedules it with its counter as it is then
        f.token = next(self._tokens)  # unique across flows: a flow forgotten and made again never matches old items
        heapq.heappush(state.heap, (f.counter, next(iter(f.queue)), name, f.token))

    def _head(self, state: _BandState) -> Entry[P] | None:
        heap = state.heap
        while heap:
            _, _, name, token = heap[0]
            f = state.flows.get(name)
            if f is not None and f.token == token and f.queue:
                return next(iter(f.queue.values()))
            heapq.heappop(heap)
        return None  # every waiting flow of the band was skipped

    def _most_overdue(self, top: int, now: float) -> int | None:
        best, most = None, 0.0
        for i in range(top + 1, len(self._bands)):
            state = self._bands[i]
            after = state.band.aged_after_s
            if after is None or not state.entries:
                continue
            overdue = now - next(iter(state.entries.values())).at - after
            if overdue >= 0 and (best is None or overdue > most):
                best, most = i, overdue
        return best

    def _sweep(self, state: _BandState) -> None:
        idle = [name for name, f in state.flows.items() if not f.queue and f.counter <= state.vtime]
        for name in idle:
            del state.flows[name]
