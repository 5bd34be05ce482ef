"""Group commit for the budget ledger: the reservations (and, apart, the settles) that arrive while a call is out go
together in the next call, one script run for the whole batch (``BudgetLedger.reserve_many``/``settle_many``).

Why: under load a gateway admits hundreds of requests at once. One script call each means hundreds of round trips
queued behind each other (and behind the event loop's other work), and the last of them waits for all; a batch
costs one round trip and one script run whatever its size, so the wait stays about two calls long however many
requests arrive (``bench/budget_concurrency.py``). Each reservation in a batch is still all-or-nothing against
every one of its limits, in arrival order: batching changes the number of calls, not what is counted.

Errors: an unreachable store fails the batch's waiters (``StoreUnavailable``: the gate decides fail-open or
fail-closed); a slow one (``StoreSlow``: connected, no answer within the socket timeout) sends the batch again
(reserves and settles are idempotent by request id) until each waiter's own deadline, which the gate enforces by
cancelling its future. A waiter that gave up is left out of later batches.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from cognitora.budgets.ledger import BudgetLedger, Refusal, SettleResult, StoreSlow
from cognitora.budgets.plan import Reservation, Usage

__all__ = ["LedgerBatcher"]

_Item = TypeVar("_Item")
_Result = TypeVar("_Result")

MAX_IN_FLIGHT = 2
"""Calls of one kind out at once: while one is out, arrivals gather for the next."""
SLOW_RETRY_S = 0.05
"""Pause before sending a batch again after the store was slow (its waiters' deadlines bound the retries)."""


@dataclass
class _Waiting(Generic[_Item, _Result]):
    item: _Item
    future: asyncio.Future[_Result]


class _Queue(Generic[_Item, _Result]):
    """Items waiting for the next call of ``send``; at most ``MAX_IN_FLIGHT`` calls out, ``max_batch`` each."""

    def __init__(self, send: Callable[[list[_Item]], Awaitable[Sequence[_Result]]], max_batch: int) -> None:
        self._send = send
        self._max_batch = max_batch
        self._waiting: deque[_Waiting[_Item, _Result]] = deque()
        self._out = 0
        self._scheduled = False
        self.calls = 0
        self.largest = 0

    def submit(self, item: _Item) -> asyncio.Future[_Result]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Result] = loop.create_future()
        self._waiting.append(_Waiting(item, future))
        if not self._scheduled and self._out < MAX_IN_FLIGHT:
            # Next turn of the loop, not now: the other arrivals of this turn join the same call.
            self._scheduled = True
            loop.call_soon(self._start)
        return future

    def _start(self) -> None:
        self._scheduled = False
        while self._waiting and self._out < MAX_IN_FLIGHT:
            batch: list[_Waiting[_Item, _Result]] = []
            while self._waiting and len(batch) < self._max_batch:
                waiting = self._waiting.popleft()
                if not waiting.future.done():  # (a waiter that gave up is not sent)
                    batch.append(waiting)
            if not batch:
                return
            self._out += 1
            asyncio.get_running_loop().create_task(self._call(batch))

    async def _call(self, batch: list[_Waiting[_Item, _Result]]) -> None:
        self.calls += 1
        self.largest = max(self.largest, len(batch))
        try:
            results = await self._send([w.item for w in batch])
        except StoreSlow:
            await asyncio.sleep(SLOW_RETRY_S)
            # Again, ahead of later arrivals (in order); the gate's deadline cancels a waiter that cannot wait.
            self._waiting.extendleft(reversed([w for w in batch if not w.future.done()]))
        except asyncio.CancelledError:  # the loop is closing
            for w in batch:
                w.future.cancel()
            raise
        except Exception as exc:  # unreachable, refused, or a bug: each waiter gets it
            for w in batch:
                if not w.future.done():
                    w.future.set_exception(exc)
        else:
            for w, result in zip(batch, results, strict=True):
                if not w.future.done():
                    w.future.set_result(result)
        finally:
            self._out -= 1
            if self._waiting and not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._start)


class LedgerBatcher:
    """Reserves and settles of one process, batched per kind (``budgets.reserve_batch`` at most per call)."""

    def __init__(self, ledger: BudgetLedger, max_batch: int) -> None:
        self._ledger = ledger
        self.reserves: _Queue[tuple[Reservation, int], Refusal | None] = _Queue(self._reserve_many, max_batch)
        self.settles: _Queue[tuple[Reservation, Usage, int], SettleResult] = _Queue(self._settle_many, max_batch)

    def reserve(self, reservation: Reservation, now_ms: int) -> asyncio.Future[Refusal | None]:
        """The verdict, when the batch it joined has run; cancel the future to give up waiting (the reservation
        may still be made: the caller releases it)."""
        return self.reserves.submit((reservation, now_ms))

    def settle(self, reservation: Reservation, actual: Usage, requests: int) -> asyncio.Future[SettleResult]:
        return self.settles.submit((reservation, actual, requests))

    async def _reserve_many(self, batch: list[tuple[Reservation, int]]) -> list[Refusal | None]:
        # One "now" for the batch (the lease expiry of dead gateways' reservations): the latest of its arrivals.
        return await self._ledger.reserve_many([r for r, _ in batch], max(now for _, now in batch))

    async def _settle_many(self, settles: list[tuple[Reservation, Usage, int]]) -> list[SettleResult]:
        return await self._ledger.settle_many(settles)
