"""The drain's wait for the health checker (cognitora.ops.drain with envoy_extproc.health): how long a replica
waits before it refuses streams depends on what it has seen of the checker."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from grpc_health.v1 import health_pb2

from cognitora.ops.drain import DrainBounds, drain
from envoy_extproc.health import ExtprocHealth

BOUNDS = DrainBounds(announce_s=0.6, settle_s=0.0, grace_s=0.1)


async def check(health: ExtprocHealth) -> int:
    context: Any = None  # the servicer reads the context only for an unknown service name
    response = await health.Check(health_pb2.HealthCheckRequest(service=""), context)
    return int(response.status)


async def drained_after(health: ExtprocHealth) -> float:
    """Seconds from the announcement to the stop of accepting, no checker coming back."""
    stopped: list[float] = []

    async def stop_accepting(grace_s: float) -> None:
        stopped.append(time.monotonic())

    started = time.monotonic()
    await drain(
        BOUNDS,
        announce=health.start_draining,
        seen=health.seen_not_serving,
        stop_accepting=stop_accepting,
        next_check_within=health.next_check_within(),
    )
    return stopped[0] - started


async def test_never_checked_stops_at_once() -> None:
    health = ExtprocHealth()
    await health.serving()
    assert health.next_check_within() is None
    assert await drained_after(health) < BOUNDS.announce_s / 2


async def test_checked_once_waits_its_whole_announce_bound() -> None:
    # The e2e drain failed 3 of 3 on a fresh stack this way: Envoy had checked the replica once, the drain did not
    # wait, and Envoy's next streams were refused.
    health = ExtprocHealth()
    await health.serving()
    assert await check(health) == health_pb2.HealthCheckResponse.SERVING
    assert await drained_after(health) >= BOUNDS.announce_s


async def test_checked_twice_waits_twice_the_interval_seen() -> None:
    health = ExtprocHealth()
    await health.serving()
    await check(health)
    await asyncio.sleep(0.1)
    await check(health)
    within = health.next_check_within()
    assert within is not None and 0.2 <= within < BOUNDS.announce_s
    assert within <= await drained_after(health) < BOUNDS.announce_s


async def test_a_checker_reading_not_serving_ends_the_wait() -> None:
    health = ExtprocHealth()
    await health.serving()
    await check(health)

    async def checker_comes_back() -> None:
        await asyncio.sleep(0.1)
        assert await check(health) == health_pb2.HealthCheckResponse.NOT_SERVING

    back = asyncio.create_task(checker_comes_back())
    took = await drained_after(health)
    await back
    assert health.seen_not_serving.is_set()
    assert took == pytest.approx(0.1, abs=0.3) and took < BOUNDS.announce_s
