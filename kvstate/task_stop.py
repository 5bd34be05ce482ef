"""``cancel_and_wait``: stop a task that talks to Redis, for sure.

One ``cancel()`` is not always enough on Python 3.11: ``asyncio.wait_for`` (redis-py sends every command under it)
returns the inner result instead of raising when the cancel lands just as the command completes (fixed in 3.12).
A loop that writes to the store then runs on, and a ``stop()`` that awaits it never returns: after SIGTERM the
collector logged "signal received; stopping" and ran on (1 stop in 30 with SIGTERM timed to a heartbeat write; 62
in 150 with a 4 ms heartbeat, none with this)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["cancel_and_wait"]

RECANCEL_S = 0.1
"""How often a task that is still running is cancelled again."""


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling it again every ``RECANCEL_S`` while it runs on; what it
    raised other than its cancellation is raised here."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=RECANCEL_S)
    with contextlib.suppress(asyncio.CancelledError):
        await task
