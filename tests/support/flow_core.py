"""Driving a Router's flow control in-process (tests/core, tests/metrics): its seats taken by the router's own
dispatches, and waits with a deadline, never a bare sleep."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from cognitora.core.lifecycle import Attempt
from cognitora.core.router import Router
from cognitora.request import RouteRequest


async def until(condition: Any, timeout_s: float = 10.0) -> None:
    """Wait on the loop for ``condition()`` (a bool, or an awaitable of one), up to a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.01)


def waiting(router: Router) -> int:
    """Requests waiting in ``router``'s flow-control queue now."""
    assert router.flow is not None
    return router.flow.controller.snapshot().waiting


async def take_seats(router: Router, count: int, model: str = "m") -> list[Attempt]:
    """``count`` requests the router admits and dispatches (each must be placed): they hold their engines' seats
    until a test finishes them."""
    holders = []
    for i in range(count):
        decision, attempt = await router.admit(RouteRequest(model=model, prompt=f"holder {i}", request_id=f"h{i}"))
        assert attempt is not None, decision.explain()
        holders.append(attempt)
    return holders
