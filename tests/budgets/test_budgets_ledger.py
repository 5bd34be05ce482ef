"""The budget ledger's contract, run against the in-process ledger, a real Redis and a real Redis Cluster: one
atomic reserve for all of a request's limits, settles that count once, expired reservations settled at their
estimate, rolling windows, and the concurrency proof (many concurrent requests against a budget for a quarter of
them: admitted usage never exceeds the limit)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cognitora.budgets.config import BudgetsConfig
from cognitora.budgets.gate import BudgetGate, Hold
from cognitora.budgets.ledger import BudgetLedger, SettleResult
from cognitora.budgets.memory_ledger import MemoryLedger
from cognitora.budgets.plan import Planner, Usage
from cognitora.budgets.redis_ledger import RedisLedger
from cognitora.decision import Rejection
from cognitora.identity import Identity


def clear_of_midnight(now: float, span_s: int = 15 * 60) -> float:
    """``now``, or a minute past the next UTC midnight when the tests' span would cross it.

    Redis expires keys on its own clock, so the counters' TTLs must be real; but a day (or month) window
    that ends while a test runs splits its counts in two (CI started at 23:59 once: 300 != 320).
    """
    midnight = (int(now) // 86400 + 1) * 86400
    return float(midnight + 60 if midnight - now < span_s else int(now))


NOW = clear_of_midnight(time.time())
"""Now, for every test here: real (Redis's TTLs) and with no day boundary within the tests' span. Taken again as
each test starts (``_now``): a module imported at collection may run its tests many minutes later in a full run,
past the TTL of a window that began at import (the rolling window's 600 s failed so in CI)."""


@pytest.fixture(autouse=True)
def _now() -> None:
    global NOW
    NOW = clear_of_midnight(time.time())


def budgets(**teams: Any) -> BudgetsConfig:
    return BudgetsConfig.model_validate({"teams": teams, "reservation_ttl_s": 60})


@pytest.fixture(params=["memory", "redis", "cluster"])
async def ledger(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[BudgetLedger]:
    if request.param == "memory":
        yield MemoryLedger()
        return
    cluster = request.param == "cluster"
    url = request.getfixturevalue("redis_cluster_url" if cluster else "redis_server_url")
    ledger = RedisLedger.from_url(url, key_prefix, history_days=2, cluster=cluster)
    yield ledger
    await ledger.close()


def reservation(planner: Planner, team: str, prompt: int, max_tokens: int, now: float | None = None, **ids: str) -> Any:
    now = NOW if now is None else now
    estimate = planner.estimate("m", prompt, max_tokens)
    return planner.plan(uuid.uuid4().hex, Identity(team=team, **ids), "m", estimate, now)


async def test_concurrent_requests_never_overshoot(ledger: BudgetLedger) -> None:
    """N=200 concurrent requests of 100 tokens each against a limit for N/4 of them: exactly N/4 admitted."""
    n = 200
    planner = Planner(budgets(alpha={"limits": [{"window": "day", "total_tokens": 100 * n // 4}]}))
    plans = [reservation(planner, "alpha", 60, 40) for _ in range(n)]
    verdicts = await asyncio.gather(*(ledger.reserve(p, int(NOW * 1000)) for p in plans))
    admitted = [p for p, v in zip(plans, verdicts, strict=True) if v is None]
    assert len(admitted) == n // 4
    [counter] = plans[0].counters
    assert await ledger.counter_values([counter], int(NOW * 1000)) == [100 * n // 4]
    refusal = next(v for v in verdicts if v is not None)
    assert refusal.counter.limit_path == "budgets.teams.alpha.limits[0].total_tokens"
    assert refusal.used == 100 * n // 4


async def test_a_batch_counts_exactly_as_its_requests_one_by_one(ledger: BudgetLedger) -> None:
    """200 reservations in ONE call (what the gate's batcher sends under load) against a limit for 50: the first
    50 admitted, in order, the rest refused with the counter at the cap; two teams in the same batch each get their
    own cap; one settle call for the admitted ones leaves exactly their usage."""
    n = 200
    planner = Planner(
        budgets(
            alpha={"limits": [{"window": "day", "total_tokens": 100 * n // 4}]},
            beta={"limits": [{"window": "day", "total_tokens": 100 * 3}]},
        )
    )
    plans = [reservation(planner, "alpha" if i % 2 == 0 else "beta", 60, 40) for i in range(n)]
    verdicts = await ledger.reserve_many(plans, int(NOW * 1000))
    alpha = [v for p, v in zip(plans, verdicts, strict=True) if p.identity.team == "alpha"]
    beta = [v for p, v in zip(plans, verdicts, strict=True) if p.identity.team == "beta"]
    assert [v is None for v in alpha] == [True] * (n // 4) + [False] * (n // 4)
    assert [v is None for v in beta] == [True] * 3 + [False] * (n // 2 - 3)
    admitted = [p for p, v in zip(plans, verdicts, strict=True) if v is None]
    results = await ledger.settle_many([(p, Usage(50, 10), 1) for p in admitted])
    assert results == [SettleResult.SETTLED] * len(admitted)
    assert await ledger.settle_many([(admitted[0], Usage(50, 10), 1)]) == [SettleResult.ALREADY]
    values = await ledger.counter_values([plans[0].counters[0], plans[1].counters[0]], int(NOW * 1000))
    assert values == [60 * n // 4, 60 * 3]
    assert await ledger.open_reservations() == 0


async def test_settle_replaces_the_estimate_once(ledger: BudgetLedger) -> None:
    planner = Planner(budgets(alpha={"limits": [{"window": "month", "output_tokens": 1000, "input_tokens": 500}]}))
    r = reservation(planner, "alpha", 100, 400)
    assert await ledger.reserve(r, int(NOW * 1000)) is None
    assert await ledger.reserve(r, int(NOW * 1000)) is None  # the same id again: nothing more reserved
    actual = planner.usage("m", 90, 25, cached_tokens=64)
    assert await ledger.settle(r, actual) is SettleResult.SETTLED
    assert await ledger.settle(r, actual) is SettleResult.ALREADY
    values = await ledger.counter_values(list(r.counters), int(NOW * 1000))
    assert sorted(values) == [25, 90]
    day = (await ledger.days([r.day]))[r.day]
    assert day["team\talpha\tm\tinput_tokens"] == 90
    assert day["team\talpha\tm\toutput_tokens"] == 25
    assert day["team\talpha\tm\tcached_tokens"] == 64
    assert day["team\talpha\tm\trequests"] == 1
    assert await ledger.open_reservations() == 0


async def test_all_limits_in_one_step_team_key_user(ledger: BudgetLedger) -> None:
    """A request fits every limit or touches none: refused by the user's limit, the team's counter is unchanged."""
    config = BudgetsConfig.model_validate(
        {
            "teams": {"alpha": {"limits": [{"window": "hour", "total_tokens": 10_000}]}},
            "keys": {"k1": {"limits": [{"window": "minute", "total_tokens": 10_000}]}},
            "defaults": {"user": [{"window": "day", "total_tokens": 150}]},
        }
    )
    planner = Planner(config)
    first = reservation(planner, "alpha", 50, 50, key="k1", user="u1")
    assert len(first.counters) == 3
    assert await ledger.reserve(first, int(NOW * 1000)) is None
    second = reservation(planner, "alpha", 50, 50, key="k1", user="u1")
    refusal = await ledger.reserve(second, int(NOW * 1000))
    assert refusal is not None and refusal.counter.limit_path == "budgets.defaults.user.limits[0].total_tokens"
    assert await ledger.counter_values(list(first.counters), int(NOW * 1000)) == [100, 100, 100]
    other_user = reservation(planner, "alpha", 50, 50, key="k1", user="u2")  # the default is per user
    assert await ledger.reserve(other_user, int(NOW * 1000)) is None
    day = (await ledger.days([first.day]))[first.day]
    assert day["user\tu1\tm\trejections"] == 1 and day["team\talpha\tm\trejections"] == 1


async def test_expired_reservation_is_settled_at_its_estimate_never_twice(ledger: BudgetLedger) -> None:
    planner = Planner(budgets(alpha={"limits": [{"window": "day", "total_tokens": 1000}]}))
    dead = reservation(planner, "alpha", 100, 200)  # its gateway dies: never settled
    assert await ledger.reserve(dead, int(NOW * 1000)) is None
    later = int((NOW + 61) * 1000)  # past reservation_ttl_s: the next reserve settles it at its estimate
    assert await ledger.reserve(reservation(planner, "alpha", 10, 10, now=NOW + 61), later) is None
    assert await ledger.open_reservations() == 1
    assert await ledger.settle(dead, Usage(1, 1)) is SettleResult.ALREADY  # a late settle changes nothing
    assert await ledger.counter_values(list(dead.counters), later) == [320]


async def test_rolling_window_frees_room_as_usage_ages_out(ledger: BudgetLedger) -> None:
    planner = Planner(budgets(alpha={"limits": [{"window": "rolling", "rolling_s": 600, "total_tokens": 100}]}))
    assert await ledger.reserve(reservation(planner, "alpha", 50, 50), int(NOW * 1000)) is None
    refused = await ledger.reserve(reservation(planner, "alpha", 1, 1, now=NOW + 300), int((NOW + 300) * 1000))
    assert refused is not None
    assert refused.resets_at_ms / 1000 == pytest.approx(NOW + 600, abs=11)  # when the first usage leaves it
    after = NOW + 611
    assert await ledger.reserve(reservation(planner, "alpha", 50, 50, now=after), int(after * 1000)) is None


async def test_fail_open_counts_locally_and_flushes_when_back() -> None:
    """The store down at reserve and at settle: admitted (fail_open), counted, and written once it answers."""

    class Flaky(MemoryLedger):
        down = True

        async def reserve(self, *a: Any) -> Any:
            if self.down:
                raise ConnectionError("redis down")
            return await super().reserve(*a)

        async def settle(self, *a: Any) -> Any:
            if self.down:
                raise ConnectionError("redis down")
            return await super().settle(*a)

    from cognitora.core.outcome import Outcome, OutcomeKind
    from cognitora.request import RouteRequest

    config = budgets(alpha={"limits": [{"window": "day", "total_tokens": 1000}]})
    ledger = Flaky()
    gate = BudgetGate(config, ledger, clock=lambda: NOW)
    holds = [await gate.reserve(RouteRequest(model="m", team="alpha", max_tokens=50), "m", 50) for _ in range(3)]
    assert all(isinstance(h, Hold) and not h.in_store for h in holds)
    for h in holds:
        assert isinstance(h, Hold)
        await gate.settle(h, Outcome(OutcomeKind.COMPLETED, prompt_tokens=50, completion_tokens=30))
    assert gate.backlog == 3
    ledger.down = False
    assert await gate.flush() == 3
    assert await gate.flush() == 0
    first = holds[0]
    assert isinstance(first, Hold)
    assert await ledger.counter_values(list(first.reservation.counters), int(NOW * 1000)) == [240]

    closed = BudgetGate(config.model_copy(update={"on_store_error": "fail_closed"}), Flaky(), clock=lambda: NOW)
    refusal = await closed.reserve(RouteRequest(model="m", team="alpha", max_tokens=5), "m", 5)
    assert isinstance(refusal, Rejection) and refusal.status == 503 and "fail_closed" in refusal.message
