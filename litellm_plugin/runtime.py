"""``CoreHost``: the decision core (``cognitora.core.core.Core``) and what feeds it, living on ONE event loop.

The core's store and collector hold sockets bound to the loop that opened them (redis.asyncio, zmq.asyncio), so
every call into the core runs on that loop, whoever makes it:

- a Router built inside a running loop (the LiteLLM proxy builds its Router in its startup coroutine) puts the core
  on that loop: in-process calls cost nothing extra;
- a Router built with no loop running (the usual SDK script) gets a private daemon thread running a loop of its own,
  started on first use; LiteLLM's sync ``Router.completion`` and ``acompletion`` from any loop reach the core there.

Embedded mode (no ``redis_url``): an in-process ``MemoryStore`` and an in-process collector (KV-event subscribers
and the /metrics scraper, on a thread and loop of their own: ``cognitora.collector.CollectorThread``) start with
the core, lazily, on the first request. Redis mode: the core reads the shared
store and ``cognitora collector`` runs beside the gateway.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar, cast

from cognitora.collector import Collector, CollectorThread
from cognitora.config import CognitoraConfig
from cognitora.core.attempt import Attempt
from cognitora.core.core import CollectorPlace, Core, Prepared
from cognitora.core.router import Router
from cognitora.ops.gc_pacing import GcPacer
from cognitora.ops.reload import ConfigSource, ConfigWatch, LiveRouter, Prepare
from litellm_plugin.live import WATCH_INTERVAL_S, sighup_reloads

__all__ = ["CoreHost", "HostClosed"]

log = logging.getLogger("cognitora.litellm")

T = TypeVar("T")

SYNC_CALL_TIMEOUT_S = 60.0
"""A sync call waits this long for the core's loop before giving up with an error that says why."""


class HostClosed(RuntimeError):
    """The strategy was uninstalled; late callbacks about its attempts have nothing left to report to."""


class CoreHost:
    """Runs coroutines against the core on the core's own loop; see the module docstring for which loop."""

    def __init__(
        self,
        config: CognitoraConfig,
        loop: asyncio.AbstractEventLoop | None = None,
        prepared: Prepared | None = None,
        in_process_collector: bool = False,
        *,
        pace_gc: bool = False,
    ) -> None:
        """``prepared``: the models' prompt keyers and the intent source, loaded at install
        (``litellm_plugin.strategy.preflight``); absent, the core loads them when it starts. ``pace_gc``: in a
        LiteLLM proxy, garbage collections run from the core's loop once it starts (``limits.gc_pacing_s``)."""
        self.config = config
        self.prepared = prepared
        self.in_process_collector = in_process_collector
        """With Redis: this process runs the collector too (``routing_strategy_args.collector: in_process``)."""
        self._loop = loop
        self._private = loop is None
        self._thread: threading.Thread | None = None
        self._core: Core | None = None
        self._starting: asyncio.Future[Core] | None = None
        self._guard = threading.Lock()
        self._closed = False
        self.reload: tuple[ConfigSource, Prepare | None] | None = None
        """Set by the strategy when the arguments name a ``config:`` file: the core then reloads on its change."""
        self._watch: _Reloading | None = None
        self.pace_gc = pace_gc
        self._gc_pacer: GcPacer | None = None
        self._closing: asyncio.Task[None] | None = None
        """``close`` called on the core's loop: the core's close, held so that it is not collected unfinished."""

    @classmethod
    def for_current_context(
        cls,
        config: CognitoraConfig,
        prepared: Prepared | None = None,
        in_process_collector: bool = False,
        *,
        pace_gc: bool = False,
    ) -> CoreHost:
        """On the running loop if there is one (the proxy), else on a private loop thread (an SDK script)."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        return cls(config, loop, prepared, in_process_collector, pace_gc=pace_gc)

    @property
    def mode(self) -> str:
        """``embedded`` (in-process store and collector) or ``redis`` (shared store, external collector)."""
        return "embedded" if self.config.redis_url is None else "redis"

    @property
    def started(self) -> bool:
        return self._core is not None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the core runs on (None until chosen: an SDK script's private thread starts on first use)."""
        return self._loop

    def collector(self) -> Collector | None:
        """The in-process collector feeding the core's store (None when an external one does, or before the core
        started)."""
        core = self._core
        if core is None or core.collector is None:
            return None
        feeder = core.collector
        return feeder if isinstance(feeder, Collector) else feeder.collector

    # -- calling the core -------------------------------------------------------------------------------------
    async def call(self, fn: Callable[[Router], Awaitable[T]]) -> T:
        """Await ``fn(router)`` on the core's loop, from any loop."""
        loop = self._ensure_loop()
        if _running_loop() is loop:
            return await fn((await self._ensure_core()).router)
        future = asyncio.run_coroutine_threadsafe(self._on_loop(fn), loop)
        return await asyncio.wrap_future(future)

    def call_sync(self, fn: Callable[[Router], Awaitable[T]]) -> T:
        """Run ``fn(router)`` on the core's loop and wait for it, from a thread that is not running that loop."""
        loop = self._ensure_loop()
        if _running_loop() is loop:
            raise RuntimeError(
                "a synchronous LiteLLM call was made on the event loop Cognitora runs on; it would wait for itself. "
                "Use the async API there (acompletion), or build the litellm.Router outside any event loop."
            )
        future = asyncio.run_coroutine_threadsafe(self._on_loop(fn), loop)
        try:
            return future.result(timeout=SYNC_CALL_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(
                f"Cognitora's event loop did not answer within {SYNC_CALL_TIMEOUT_S:.0f} s: is a synchronous "
                "Router.completion() blocking the loop the Router was built in? Use acompletion() there."
            ) from None

    def attempt(self, request_id: str) -> Attempt | None:
        """The core's open attempt ``request_id`` (None when it finished, or the core never started)."""
        core = self._core
        return None if core is None else core.router.attempt(request_id)

    def open_attempts(self) -> list[Attempt]:
        core = self._core
        return [] if core is None else core.router.open_attempts()

    async def _on_loop(self, fn: Callable[[Router], Awaitable[T]]) -> T:
        return await fn((await self._ensure_core()).router)

    async def _ensure_core(self) -> Core:
        if self._core is not None:
            return self._core
        if self._closed:
            raise HostClosed("this Cognitora strategy was closed (the Router's routing strategy changed)")
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._open())
        try:
            core = await asyncio.shield(self._starting)
        except BaseException:
            if self._starting.done():
                self._starting = None  # let the next request try again, with the same clear error if it persists
            raise
        if self._core is None:  # the first of the requests that waited for the start says it, once
            if self.reload is not None:
                self._watch = _go_live(core, *self.reload)
            self._core = core
            self._pace_gc()
            log.info("cognitora core started (%s mode)", self.mode)
        return core

    def _pace_gc(self) -> None:
        # LiteLLM's context variables and CPython's collector can crash the proxy (cognitora.ops.gc_pacing): from
        # here on, the proxy collects garbage only from the core's loop. Not in an SDK script: its process is not
        # ours to change.
        interval_s = self.config.limits.gc_pacing_s
        if self.pace_gc and interval_s > 0 and self._gc_pacer is None:
            pacer = GcPacer(interval_s)
            if pacer.start(asyncio.get_running_loop()):
                self._gc_pacer = pacer

    def _open(self) -> Awaitable[Core]:
        # Embedded mode always feeds its own store (the core's deployment rule: an in-process store needs this
        # process's collector); with Redis, only when routing_strategy_args.collector is in_process.
        feeds = self.config.redis_url is None or self.in_process_collector
        place = CollectorPlace.IN_PROCESS if feeds else CollectorPlace.EXTERNAL
        return Core.open(self.config, collector=place, prepared=self.prepared)

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise HostClosed("this Cognitora strategy was closed (the Router's routing strategy changed)")
        with self._guard:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="cognitora-core", daemon=True)
                self._thread.start()
            loop = self._loop
        if loop.is_closed():
            raise RuntimeError(
                "the event loop this litellm.Router was built in has closed, and Cognitora's store lives on it. "
                "Build the Router outside any event loop (Cognitora then runs on its own thread), or in the loop "
                "that serves the requests."
            )
        return loop

    # -- lifecycle --------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the collector and close the store. Blocks the core's own loop only to stop an in-process
        collector thread (milliseconds); the rest is a task there when called on that loop."""
        self._closed = True
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        core, self._core = self._core, None
        watch, self._watch = self._watch, None
        pacer, self._gc_pacer = self._gc_pacer, None
        if pacer is not None:
            if _running_loop() is loop or not loop.is_running():
                pacer.stop()
            else:
                loop.call_soon_threadsafe(pacer.stop)
        if _running_loop() is loop:
            if core is not None:
                # The rest cannot be awaited here; an in-process collector thread can be stopped, and is: else it
                # went on collecting and logging after the strategy was gone (CI's "--- Logging error ---": a
                # test's captured stream closed by then).
                if isinstance(core.collector, CollectorThread):
                    core.collector.stop_blocking()
                self._closing = loop.create_task(_close(core, watch))
            return
        if core is not None and loop.is_running():
            future = asyncio.run_coroutine_threadsafe(_close(core, watch), loop)
            try:
                future.result(timeout=10)
            except Exception as exc:  # closing is best effort: log, never raise into LiteLLM's settings path
                log.warning("cognitora core did not stop cleanly: %s", exc)
        if self._private and self._thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=10)
            loop.close()


@dataclass
class _Reloading:
    """What reloads the live core: the file watch, and the SIGHUP handler where there is one to take off."""

    watch: ConfigWatch
    sighup_off: Callable[[], None] | None

    async def stop(self) -> None:
        if self.sighup_off is not None:
            self.sighup_off()
        await self.watch.stop()


def _go_live(core: Core, source: ConfigSource, prepare: Prepare | None) -> _Reloading:
    """Reload the config when its file changes, or on SIGHUP where it is ours (``litellm_plugin.live``): the
    core's router becomes a ``LiveRouter``, which answers as the Router in force. Runs on the core's loop."""
    live = LiveRouter(core.router, source, prepare)
    core.router = cast(Router, live)
    watch = ConfigWatch(live, WATCH_INTERVAL_S)
    watch.start()
    return _Reloading(watch, sighup_reloads(live, asyncio.get_running_loop()))


async def _close(core: Core, reloading: _Reloading | None) -> None:
    if reloading is not None:
        await reloading.stop()
    await core.close()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
