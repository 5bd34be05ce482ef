"""What the gateway queue hands back, and what it asks of the core.

- ``Placer``: the core's side. ``place(ticket)`` places the ticket's request on the fleet as it is now and, when it
  fits, commits it (counts it, takes its lease), in one step on the loop; or answers ``Held`` (still saturated:
  it stays at the head; ``Held.only_this``: another flow's smaller request may still fit). Cancelled while it
  awaits (the gateway shutting down), it must have committed nothing.
  ``unclaimed(result)`` undoes a commit whose waiter left meanwhile (its client went away, or its wait ran out
  while it was being placed): the core finishes that attempt as cancelled, which settles its budget hold.
- ``QueueRefusal``: the request leaves without being placed: it waited ``max_wait_s`` (``TIMEOUT``), the queue was
  full (``FULL``), or the gateway is shutting down (``CLOSED``). It carries the ``Rejection`` (429 or 503 with
  Retry-After) the core returns unless the burst policy takes the request to a cloud target.
- ``Departure``: one per request that leaves the queue, for metrics and logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeVar

from cognitora.decision import Rejection

__all__ = ["Departure", "Held", "Left", "Placer", "QueueRefusal", "WakeReason"]

T = TypeVar("T")
R = TypeVar("R")
T_contra = TypeVar("T_contra", contravariant=True)


class WakeReason(StrEnum):
    """What made the queue try to dispatch."""

    ARRIVAL = "arrival"
    """A request queued behind others while the fleet may have room."""
    FINISHED = "finished"
    """An attempt finished in this process: a seat and its KV are free."""
    FIRST_TOKEN = "first_token"
    """An attempt's prefill finished in this process: its engine's prefill queue is shorter."""
    CAPACITY = "capacity"
    """Anything else the core knows frees capacity (an engine back to health, a lease released)."""
    RECHECK = "recheck"
    """The periodic re-check while requests wait (``recheck_interval_s``): what other replicas and scrapes freed."""


class Left(StrEnum):
    """How a request left the queue."""

    DISPATCHED = "dispatched"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    """Its client went away."""
    FULL = "full"
    CLOSED = "closed"


@dataclass(frozen=True)
class Held:
    """The placer's answer when the request still cannot go: the fleet is saturated for it."""

    reason: str
    only_this: bool = False
    """True: the hold is about this request (its KV, its prompt against its objective), a smaller one may fit: the
    dispatcher tries the next flow's head of the band (each flow once per wake-up). False (every seat is taken):
    nothing else would be placed either, and the dispatcher stops until the next wake-up."""
    needs_s: float | None = None
    """Gateway seconds this request takes once placed: the chosen engine's predicted TTFT x the prediction margin,
    over the engine's clock rate. With ``only_this``, the dispatcher gives the turn to a waiter of the same flow
    whose deadline leaves at least that (``FlowController``); None: unknown, its newest waiter gets it."""


@dataclass(frozen=True)
class QueueRefusal:
    how: Left
    rejection: Rejection
    waited_s: float

    @property
    def burst_may_take(self) -> bool:
        """The fleet could not take it in time (or had no room to queue it): a cloud target may, if the burst
        policy allows the team and class. Not on shutdown."""
        return self.how is not Left.CLOSED


@dataclass(frozen=True)
class Departure:
    band: str
    flow: str
    how: Left
    waited_s: float
    aged: bool = False
    """Dispatched ahead of a higher band by the anti-starvation rule."""
    wake: WakeReason | None = None
    """What woke the dispatch (``DISPATCHED`` only)."""


class Placer(Protocol[T_contra, R]):
    async def place(self, ticket: T_contra) -> R | Held: ...

    def unclaimed(self, result: R) -> None: ...
