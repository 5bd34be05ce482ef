"""The ext_proc service's parts that follow a config reload (``cognitora.ops.reload``): the engines' literal
addresses handed to Envoy, the embedded collector (``--collector``) and the metrics page, each rebuilt on the new
config once the new Router is in force. Checked before: every endpoint's host must resolve (Envoy takes literal
addresses), or the reload is refused and the old config stays."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, cast

from cognitora.config import CognitoraConfig
from cognitora.metrics.serve import MetricsServer
from cognitora.ops.reload import Commit, LiveRouter
from cognitora.preflight import EngineAddress, resolve_engines
from envoy_extproc.addresses import AddressBook
from envoy_extproc.metrics import start_worker_metrics
from envoy_extproc.settings import ExtprocSettings

if TYPE_CHECKING:
    from cognitora.router import Router

    from cognitora.collector import Collector, CollectorThread

__all__ = ["LiveParts"]

log = logging.getLogger("cognitora.extproc")


class LiveParts:
    """Built once at start; ``prepare`` is the ``LiveRouter``'s adapter check."""

    def __init__(
        self,
        settings: ExtprocSettings,
        live: LiveRouter,
        addresses: AddressBook,
        collector: Collector | CollectorThread | None,
        errors: Callable[[], int],
        make_book: Callable[[Mapping[str, EngineAddress]], AddressBook],
    ) -> None:
        self._settings = settings
        self._live = live
        self._addresses = addresses
        self.collector = collector
        self.metrics: MetricsServer | None = None
        self._errors = errors
        self._make_book = make_book
        """``addresses.address_book``: a ``ConfigError`` naming each endpoint whose host does not resolve."""
        self._pending: set[asyncio.Task[object]] = set()

    async def start_metrics(self) -> None:
        # The Router in force, read through the LiveRouter: counters keep counting across reloads.
        router = cast("Router", self._live)
        self.metrics = await start_worker_metrics(
            self._settings, self._live.current.config, router, self.collector, self._errors
        )

    async def prepare(self, config: CognitoraConfig) -> Commit:
        from cognitora.burst.credentials import cloud_api_keys

        book = self._make_book(await asyncio.to_thread(resolve_engines, config))  # ConfigError: refused
        book.cloud_keys = cloud_api_keys(config.burst)

        async def commit() -> None:
            self._addresses.update(book)
            await self._restart(config)

        return commit

    async def _restart(self, config: CognitoraConfig) -> None:
        """The collector and the metrics page are built on a config: stop them, start them on the new one."""
        from cognitora.collector import Collector, CollectorThread

        if self.collector is not None:
            await self.collector.stop()
            store = self._live.current.store
            threaded = isinstance(self.collector, CollectorThread)
            self.collector = CollectorThread(config, store) if threaded else Collector(config, store)
            await self.collector.start()
        if self.metrics is not None:
            await self.metrics.stop()
            await self.start_metrics()

    def on_sighup(self) -> None:
        task = asyncio.ensure_future(self._live.reload("SIGHUP"))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def stop(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self.metrics is not None:
            await self.metrics.stop()
        if self.collector is not None:
            await self.collector.stop()
