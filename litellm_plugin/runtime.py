"""``CoreHost``: the decision core (``cognitora.router.Router``) and what feeds it, living on ONE event loop.

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
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from cognitora.attempt import Attempt
from cognitora.collector import Collector, CollectorThread
from cognitora.config import CognitoraConfig
from cognitora.router import Router
from kvstate.prompt import PromptKeyer

log = logging.getLogger("cognitora.litellm")

T = TypeVar("T")

SYNC_CALL_TIMEOUT_S = 60.0
"""A sync call waits this long for the core's loop before giving up with an error that says why."""


class HostClosed(RuntimeError):
    """The strategy was uninstalled; late callbacks about its attempts have nothing left to report to."""


class _Core:
    """The Router (on the host's loop) and, in embedded mode, the collector thread feeding its store."""

    def __init__(self, router: Router, collector: CollectorThread | Collector | None) -> None:
        self.router = router
        self.collector = collector

    @classmethod
    async def start(
        cls, config: CognitoraConfig, keyers: Mapping[str, PromptKeyer] | None = None, feed_redis: bool = False
    ) -> _Core:
        if config.redis_url is not None:
            router = Router.from_config(config, keyers=keyers)
            if not feed_redis:
                return cls(router, None)
            # collector: in_process over Redis, as `cognitora extproc --collector` does: a Redis client is bound to
            # its loop, so the collector shares the core's.
            feeder = Collector(config, router.store)
            await feeder.start()
            return cls(router, feeder)
        from kvstate.store import open_store

        store = open_store(None, config.key_prefix)
        # Its own thread: on the proxy's loop, scrapes and KV events would queue behind the responses it streams.
        collector = CollectorThread(config, store)
        await collector.start()
        return cls(Router(config, store, keyers=keyers), collector)

    async def stop(self) -> None:
        if self.collector is not None:
            await self.collector.stop()
        await self.router.close()


class CoreHost:
    """Runs coroutines against the core on the core's own loop; see the module docstring for which loop."""

    def __init__(
        self,
        config: CognitoraConfig,
        loop: asyncio.AbstractEventLoop | None = None,
        keyers: Mapping[str, PromptKeyer] | None = None,
        in_process_collector: bool = False,
    ) -> None:
        """``keyers``: the models' prompt keyers, loaded at install (``litellm_plugin.strategy.preflight``);
        absent, the Router loads them when the core starts."""
        self.config = config
        self.keyers = keyers
        self.in_process_collector = in_process_collector
        """With Redis: this process runs the collector too (``routing_strategy_args.collector: in_process``)."""
        self._loop = loop
        self._private = loop is None
        self._thread: threading.Thread | None = None
        self._core: _Core | None = None
        self._starting: asyncio.Future[_Core] | None = None
        self._guard = threading.Lock()
        self._closed = False

    @classmethod
    def for_current_context(
        cls,
        config: CognitoraConfig,
        keyers: Mapping[str, PromptKeyer] | None = None,
        in_process_collector: bool = False,
    ) -> CoreHost:
        """On the running loop if there is one (the proxy), else on a private loop thread (an SDK script)."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        return cls(config, loop, keyers, in_process_collector)

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

    async def _ensure_core(self) -> _Core:
        if self._core is not None:
            return self._core
        if self._closed:
            raise HostClosed("this Cognitora strategy was closed (the Router's routing strategy changed)")
        if self._starting is None:
            self._starting = asyncio.ensure_future(_Core.start(self.config, self.keyers, self.in_process_collector))
        try:
            core = await asyncio.shield(self._starting)
        except BaseException:
            if self._starting.done():
                self._starting = None  # let the next request try again, with the same clear error if it persists
            raise
        if self._core is None:  # the first of the requests that waited for the start says it, once
            self._core = core
            log.info("cognitora core started (%s mode)", self.mode)
        return core

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
        """Stop the collector and close the store. Never blocks the core's own loop."""
        self._closed = True
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        core, self._core = self._core, None
        if _running_loop() is loop:
            if core is not None:
                loop.create_task(core.stop())
            return
        if core is not None and loop.is_running():
            future = asyncio.run_coroutine_threadsafe(core.stop(), loop)
            try:
                future.result(timeout=10)
            except Exception as exc:  # closing is best effort: log, never raise into LiteLLM's settings path
                log.warning("cognitora core did not stop cleanly: %s", exc)
        if self._private and self._thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=10)
            loop.close()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
