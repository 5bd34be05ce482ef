"""Draining a gateway service at SIGTERM: stop being picked, finish what is in flight, then exit.

The order matters to a client behind a proxy with several replicas (Envoy in front of ``cognitora extproc``):

1. announce: the health service answers NOT_SERVING from now on, while the server keeps accepting streams;
2. wait until a health checker has read that answer (or ``announce_s`` passes: nobody is checking), then
   ``settle_s`` more for the checker's verdict to reach every worker of the proxy;
3. stop accepting: new streams are refused (they now go to the other replicas anyway), the open ones get up to
   ``grace_s`` to finish, then are cancelled.

Stopping at once instead refuses the streams the proxy still sends here during its next health-check interval, and
those fail at the client: the proxy's route retries cover the engines, not the ext_proc stream in front of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["DrainBounds", "DrainReport", "drain"]

log = logging.getLogger("cognitora.ops.drain")

DEFAULT_ANNOUNCE_S = 5.0
"""Longest wait for a health checker to read NOT_SERVING: above the example's 1 s check interval with room for a
busy host, and well inside the systemd unit's TimeoutStopSec with ``grace_s`` added."""
DEFAULT_SETTLE_S = 0.5
"""After the checker has read it: Envoy's main thread hands the host's new health to its workers asynchronously."""
DEFAULT_GRACE_S = 10.0
"""In-flight streams' bound: a placed request's stream lasts until its response's first body chunk (or its end,
with usage reading): long generations past this are cut, and their clients see the engine's stream end early."""


@dataclass(frozen=True)
class DrainBounds:
    announce_s: float = DEFAULT_ANNOUNCE_S
    settle_s: float = DEFAULT_SETTLE_S
    grace_s: float = DEFAULT_GRACE_S


@dataclass(frozen=True)
class DrainReport:
    """What the drain saw, for its log line."""

    checker_saw_it: bool
    """A health checker read NOT_SERVING before the server stopped accepting (else ``announce_s`` ran out)."""
    announce_s: float
    """Seconds from the announcement to the stop of accepting."""
    stop_s: float
    """Seconds the server took to finish (or cut) the open streams."""


async def drain(
    bounds: DrainBounds,
    *,
    announce: Callable[[], Awaitable[None]],
    seen: asyncio.Event,
    stop_accepting: Callable[[float], Awaitable[None]],
    next_check_within: float | None = None,
) -> DrainReport:
    """Run the three steps above. ``announce`` flips the health service to NOT_SERVING; ``seen`` is set by it once
    a checker has read that; ``stop_accepting(grace_s)`` refuses new streams and returns once the open ones ended.
    ``next_check_within``: when a checker is expected to ask again (twice its observed interval), which shortens
    the wait below ``announce_s`` (a checker that went away first, as a proxy stopped before its backends, is not
    waited for long); ``math.inf``: a checker asked once, interval unknown, wait up to ``announce_s``; None: no
    checker is known, nothing to wait for."""
    started = time.monotonic()
    await announce()
    patience = 0.0 if next_check_within is None else min(bounds.announce_s, next_check_within)
    try:
        if patience > 0:
            await asyncio.wait_for(seen.wait(), patience)
            await asyncio.sleep(bounds.settle_s)
    except TimeoutError:
        log.warning(
            "drain: no health checker read NOT_SERVING within %.1f s; stopping anyway (a proxy that does not check "
            "this service's health keeps sending streams until the port closes: see docs/operations.md)",
            patience,
        )
    announced = time.monotonic()
    await stop_accepting(bounds.grace_s)
    report = DrainReport(seen.is_set(), announced - started, time.monotonic() - announced)
    log.info(
        "drained",
        extra={
            "checker_saw_not_serving": report.checker_saw_it,
            "announce_s": round(report.announce_s, 3),
            "stop_s": round(report.stop_s, 3),
        },
    )
    return report
