"""Python's garbage collections run from an event-loop callback, never at an arbitrary allocation.

Why: CPython can crash with a segfault when a collection starts inside ``ContextVar.set`` (the context's HAMT
allocates a node, the allocation starts a collection) and a finalizer of the collected garbage sets a variable of the
same context: the HAMT being copied is freed under it (python/cpython#148891, reported on 3.12; the same crash on 3.9
in #122529; its fix, #148928, was still under review). The LiteLLM proxy sets context variables on every request
(``litellm._internal_context``, hundreds of call sites) and its abandoned coroutines reset them when collected.
Under load, a LiteLLM proxy running Cognitora died in ``ContextVar.set`` about once in 20 runs of
``tests/e2e/test_litellm_e2e.py::test_proxy_embedded_mode`` (``-11``; the faulthandler's stack: the event loop's
thread in ``service_target`` -> ``ContextVar.set``), and once in a benchmark.

A collection started from a loop callback is never inside ``ContextVar.set`` on any thread (``_PyHamt_Assoc`` holds the
GIL from start to end), so ``GcPacer`` turns the automatic collector off and, every ``interval_s``, runs the
collection the automatic one would have run by then: the same thresholds, the oldest generation due first, and a full
collection only once the objects that reached the oldest generation since the last one grew by a quarter (CPython's own
rule, so that a large heap is not walked every few seconds). Garbage lives at most ``interval_s`` longer; a loop
blocked for longer collects nothing until it runs again, like every other callback of that loop.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

__all__ = ["GcPacer"]

log = logging.getLogger("cognitora.gc")

FULL_GROWTH = 0.25
"""A full collection is due once the oldest generation holds this fraction more objects than the last full one left
(CPython's ``long_lived_pending > long_lived_total / 4``)."""

FULL_CHECK_S = 1.0
"""How often, at most, the oldest generation is counted to see whether a full collection is due. Counting walks the
generation (a LiteLLM proxy holds ~700k objects there: tens of ms), where CPython keeps a counter it does not expose,
so the next count also waits ``FULL_CHECK_COST`` times as long as this one took: counting costs the loop at most 1%."""
FULL_CHECK_COST = 100


class GcPacer:
    """Collects garbage on ``loop`` every ``interval_s`` instead of at allocations; ``stop()`` gives the collector back.

    One per process: a second ``start`` while one runs (or while the host turned the collector off itself) does
    nothing and says so, so that ``stop`` never turns on a collector its host meant to keep off."""

    _running: GcPacer | None = None

    def __init__(self, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, not {interval_s}")
        self.interval_s = interval_s
        self.collections = [0, 0, 0]
        """Collections this pacer ran, per generation."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._long_lived = 0
        self._next_full_check = 0.0

    def start(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Take over the collections on ``loop``; False (and nothing changed) when the process's collector is
        already off or another pacer runs."""
        if GcPacer._running is not None or not gc.isenabled():
            log.info("garbage collection left as it is: %s", "paced already" if GcPacer._running else "turned off")
            return False
        GcPacer._running = self
        self._loop = loop
        self._long_lived = len(gc.get_objects(generation=2))
        gc.disable()
        self._timer = loop.call_later(self.interval_s, self._tick)
        log.info(
            "garbage collection paced by the event loop every %.0f ms (python/cpython#148891)", self.interval_s * 1e3
        )
        return True

    def stop(self) -> None:
        """Turn the automatic collector back on. Safe to call twice, and from another thread than the loop's."""
        if self._loop is None:
            return
        timer, self._timer, self._loop = self._timer, None, None
        if timer is not None:
            timer.cancel()  # a tick already running finds _loop gone and does not reschedule
        if GcPacer._running is self:
            GcPacer._running = None
            gc.enable()

    def collect_due(self) -> int | None:
        """Run the collection the automatic collector would have run by now; returns its generation, or None."""
        counts = gc.get_count()
        thresholds = gc.get_threshold()
        if counts[0] <= thresholds[0]:
            return None  # CPython looks at the older generations only when the youngest is due
        for generation in (2, 1, 0):
            if counts[generation] <= thresholds[generation]:
                continue
            if generation == 2:
                now = time.monotonic()
                if now < self._next_full_check:
                    continue
                grown = len(gc.get_objects(generation=2)) - self._long_lived
                self._next_full_check = now + max(FULL_CHECK_S, FULL_CHECK_COST * (time.monotonic() - now))
                if grown <= self._long_lived * FULL_GROWTH:
                    continue
            gc.collect(generation)
            self.collections[generation] += 1
            if generation == 2:
                self._long_lived = len(gc.get_objects(generation=2))
            return generation
        return None

    def _tick(self) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            self.collect_due()
        finally:
            if self._loop is loop and not loop.is_closed():
                self._timer = loop.call_later(self.interval_s, self._tick)
