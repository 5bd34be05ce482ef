"""``BudgetLedger``: where budget counters live. Two backends (``MemoryLedger``, ``RedisLedger``), one contract
(tests/budgets/test_budgets_ledger.py runs it against both).

- ``reserve`` checks every counter of a reservation and, only if all fit, adds the estimate to all of them, in one
  atomic step; it also settles, at their estimate, reservations whose lease expired (their gateway died).
  ``reserve_many`` does that for a batch, in order, in one call (each reservation still all-or-nothing).
- ``settle`` replaces a reservation's estimate with the actual usage, once per request id: a second settle, or a
  settle after the lease expired, changes nothing. A settle for a reservation the store never saw (made while it
  was unreachable, ``fail_open``) adds the actual usage in full, once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from cognitora.budgets.plan import CounterPlan, Reservation, Usage

__all__ = ["BudgetLedger", "CounterValue", "Refusal", "SettleResult", "StoreSlow"]

DONE_TTL_S = 7 * 86400
"""How long a settled request id is remembered (a late or repeated settle within it is a no-op)."""
REAP_BATCH = 32
"""Expired reservations settled per reserve call (the rest by the next calls)."""


class StoreSlow(TimeoutError):
    """The store is connected but has not answered in time (a loaded gateway, a busy server): NOT unreachable.
    A reservation is never admitted past its budget because of this (``BudgetGate`` waits, up to
    ``budgets.reserve_timeout_s``); only an unreachable store (``kvstate.store.StoreUnavailable``) is fail-open."""


@dataclass(frozen=True)
class Refusal:
    counter: CounterPlan
    used: int
    """The counter's value when the request was refused (settled usage plus open reservations)."""
    resets_at_ms: int
    """When the window frees room: its end, or (rolling) when its oldest usage leaves it."""


class SettleResult(StrEnum):
    SETTLED = "settled"
    """The estimate was replaced by the actual usage."""
    ADDED = "added"
    """The store had no reservation (made while it was unreachable): the usage was added in full."""
    ALREADY = "already"
    """Settled before, or its lease expired and it was settled at its estimate: nothing changed."""
    DUPLICATE = "duplicate"
    """(reserve) The request id was reserved before."""


@dataclass(frozen=True)
class CounterValue:
    name: str
    value: int


class BudgetLedger(Protocol):
    async def reserve(self, reservation: Reservation, now_ms: int) -> Refusal | None: ...

    async def reserve_many(self, reservations: Sequence[Reservation], now_ms: int) -> list[Refusal | None]:
        """``reserve`` for each, in order, in one call: the verdicts in the same order."""
        ...

    async def settle(self, reservation: Reservation, actual: Usage, requests: int = 1) -> SettleResult:
        """``requests``: 1 for a request that was served, 0 for a reservation given back (not dispatched)."""
        ...

    async def settle_many(self, settles: Sequence[tuple[Reservation, Usage, int]]) -> list[SettleResult]:
        """``settle`` for each ``(reservation, actual, requests)``, in order, in one call."""
        ...

    async def counter_values(self, counters: Sequence[CounterPlan], now_ms: int) -> list[int]:
        """Each counter's current value (rolling: the sum of the buckets in its window)."""
        ...

    async def days(self, days: Sequence[str]) -> dict[str, dict[str, int]]:
        """Per report day, its usage hash (``plan.row_field`` -> value); days without usage are absent."""
        ...

    async def open_reservations(self) -> int: ...

    async def reset(self, counter_prefix: str) -> int:
        """Delete the counters whose name starts with ``counter_prefix`` (``team:alpha:``); how many."""
        ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
