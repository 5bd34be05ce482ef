"""Waiting on a Router's flow control in-process (tests/core, tests/metrics): a deadline, never a bare sleep."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from cognitora.core.router import Router


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
