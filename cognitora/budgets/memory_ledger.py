"""``MemoryLedger``: the budget ledger in this process (no ``redis_url``). Its methods never suspend, so each is
atomic on the event loop, as the Redis script is on the server."""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence

from cognitora.budgets.ledger import DONE_TTL_S, REAP_BATCH, Refusal, SettleResult
from cognitora.budgets.plan import CounterPlan, Reservation, Usage

__all__ = ["MemoryLedger"]


class MemoryLedger:
    def __init__(self) -> None:
        self._fixed: dict[str, int] = {}
        self._rolling: dict[str, dict[int, int]] = {}
        self._expiry: dict[str, float] = {}
        self._leases: dict[str, float] = {}
        self._lease_heap: list[tuple[float, str]] = []
        self._done: dict[str, float] = {}
        self._done_heap: list[tuple[float, str]] = []
        self._days: dict[str, dict[str, int]] = {}

    def _used(self, c: CounterPlan, now_ms: int) -> int:
        self._expire(c.name, now_ms)
        if c.rolling:
            buckets = self._rolling.get(c.name, {})
            assert c.min_bucket is not None
            for old in [b for b in buckets if b < c.min_bucket]:
                del buckets[old]
            return sum(buckets.values())
        return self._fixed.get(c.name, 0)

    def _expire(self, name: str, now_ms: int) -> None:
        at = self._expiry.get(name)
        if at is not None and at <= now_ms:
            self._fixed.pop(name, None)
            self._rolling.pop(name, None)
            del self._expiry[name]

    def _add(self, c: CounterPlan, amount: int) -> None:
        if c.rolling:
            assert c.bucket is not None
            buckets = self._rolling.setdefault(c.name, {})
            buckets[c.bucket] = buckets.get(c.bucket, 0) + amount
        else:
            self._fixed[c.name] = self._fixed.get(c.name, 0) + amount
        self._expiry[c.name] = c.expire_at_ms

    def _row(self, day: str, fields: list[tuple[str, int]]) -> None:
        table = self._days.setdefault(day, {})
        for name, value in fields:
            table[name] = table.get(name, 0) + value

    def _reap(self, now_ms: int) -> None:
        # Heaps of (expiry, id), so a reserve costs O(log n), not a scan of every open reservation; an entry
        # whose id has moved on (settled, or expiring later) is skipped when it surfaces.
        for _ in range(REAP_BATCH):
            if not self._lease_heap or self._lease_heap[0][0] > now_ms:
                break
            at, rid = heapq.heappop(self._lease_heap)
            if self._leases.get(rid) == at:
                del self._leases[rid]
                self._mark_done(rid, now_ms)
        for _ in range(REAP_BATCH):
            if not self._done_heap or self._done_heap[0][0] > now_ms:
                break
            at, rid = heapq.heappop(self._done_heap)
            if self._done.get(rid) == at:
                del self._done[rid]

    def _mark_done(self, rid: str, now_ms: float) -> None:
        at = now_ms + DONE_TTL_S * 1000
        self._done[rid] = at
        heapq.heappush(self._done_heap, (at, rid))

    async def reserve(self, reservation: Reservation, now_ms: int) -> Refusal | None:
        self._reap(now_ms)
        rid = reservation.request_id
        if rid in self._leases or rid in self._done:
            return None
        for c in reservation.counters:
            used = self._used(c, now_ms)
            if used + c.amount > c.cap:
                self._row(reservation.day, reservation.row_fields(Usage(), 0, rejections=1))
                return Refusal(c, used, self._resets_at(c))
        for c in reservation.counters:
            self._add(c, c.amount)
        self._row(reservation.day, reservation.row_fields(reservation.estimate, 1))
        self._leases[rid] = reservation.lease_expires_ms
        heapq.heappush(self._lease_heap, (reservation.lease_expires_ms, rid))
        return None

    async def reserve_many(self, reservations: Sequence[Reservation], now_ms: int) -> list[Refusal | None]:
        return [await self.reserve(r, now_ms) for r in reservations]

    def _resets_at(self, c: CounterPlan) -> int:
        if not c.rolling:
            return c.resets_at_ms
        assert c.bucket_ms is not None and c.min_bucket is not None
        buckets = self._rolling.get(c.name, {})
        oldest = min((b for b, v in buckets.items() if v > 0), default=c.min_bucket)
        return (oldest + (c.bucket or 0) - c.min_bucket + 1) * c.bucket_ms

    async def settle(self, reservation: Reservation, actual: Usage, requests: int = 1) -> SettleResult:
        rid = reservation.request_id
        if rid in self._done:
            return SettleResult.ALREADY
        held = self._leases.pop(rid, None) is not None
        for c in reservation.counters:
            self._add(c, actual.of(c.metric) - (c.amount if held else 0))
        if held:
            delta = Usage(
                actual.input_tokens - reservation.estimate.input_tokens,
                actual.output_tokens - reservation.estimate.output_tokens,
                actual.cached_tokens - reservation.estimate.cached_tokens,
                actual.cost_micro_usd - reservation.estimate.cost_micro_usd,
            )
            self._row(reservation.day, reservation.row_fields(delta, requests - 1))
        else:
            self._row(reservation.day, reservation.row_fields(actual, requests))
        self._mark_done(rid, time.time() * 1000)
        return SettleResult.SETTLED if held else SettleResult.ADDED

    async def settle_many(self, settles: Sequence[tuple[Reservation, Usage, int]]) -> list[SettleResult]:
        return [await self.settle(r, actual, requests) for r, actual, requests in settles]

    async def counter_values(self, counters: Sequence[CounterPlan], now_ms: int) -> list[int]:
        return [self._used(c, now_ms) for c in counters]

    async def days(self, days: Sequence[str]) -> dict[str, dict[str, int]]:
        return {d: dict(self._days[d]) for d in days if d in self._days}

    async def open_reservations(self) -> int:
        return len(self._leases)

    async def reset(self, counter_prefix: str) -> int:
        names = {n for n in (*self._fixed, *self._rolling) if n.startswith(counter_prefix)}
        for n in names:
            self._fixed.pop(n, None)
            self._rolling.pop(n, None)
            self._expiry.pop(n, None)
        return len(names)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None
