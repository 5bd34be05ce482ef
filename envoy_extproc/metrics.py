"""``cognitora extproc --metrics-listen HOST:PORT``: the service's metrics page (docs/metrics.md).

- one process: the page is served on the service's own event loop, rendered from its Router (and its embedded
  collector with ``--collector``);
- ``--workers N``: the supervisor serves ``--metrics-listen`` and each worker serves its own page on a unix socket
  in a private folder; every GET of the supervisor's page merges the N pages (``cognitora.metrics.workers``), so
  counters are the service's totals and the fleet's gauges appear once.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from cognitora.config import CognitoraConfig
from cognitora.metrics.cors import CorsPolicy
from cognitora.metrics.exporter import Exporter
from cognitora.metrics.serve import MetricsServer, serve_page
from cognitora.metrics.workers import WorkerPages, worker_socket
from envoy_extproc.settings import ExtprocSettings

if TYPE_CHECKING:
    from cognitora.collector import Collector, CollectorThread
    from cognitora.core.router import Router

__all__ = ["SupervisorMetrics", "start_worker_metrics"]

log = logging.getLogger("cognitora.extproc")

PROCESS = "extproc"


async def start_worker_metrics(
    settings: ExtprocSettings,
    config: CognitoraConfig,
    router: Router,
    collector: Collector | CollectorThread | None,
    extproc_errors: Callable[[], int],
) -> MetricsServer | None:
    """This process's page, on ``--metrics-listen`` (one process) or on its worker socket; None when neither."""
    if settings.metrics_listen is None and settings.metrics_socket is None:
        return None

    def running_collector() -> Collector | None:
        from cognitora.collector import CollectorThread

        if isinstance(collector, CollectorThread):
            return collector.collector
        return collector

    exporter = Exporter(
        config,
        PROCESS,
        router=router,
        collector=running_collector if collector is not None else None,
        extproc_errors=extproc_errors,
    )
    if settings.metrics_socket is not None:
        server = MetricsServer(exporter.page)  # (a unix socket the supervisor reads: no browser asks it)
        await server.start_unix(settings.metrics_socket)
        return server
    assert settings.metrics_listen is not None
    return await serve_page(exporter.page, settings.metrics_listen, PROCESS, CorsPolicy.of(config.metrics))


class SupervisorMetrics:
    """The ``--workers N`` supervisor's page: a thread with its own loop serving the merged workers' pages."""

    def __init__(self, listen: str, workers: int, cors: CorsPolicy | None = None) -> None:
        self.listen = listen
        self.workers = workers
        self.cors = cors
        self.folder = Path(tempfile.mkdtemp(prefix="cognitora-extproc-metrics-"))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cognitora-metrics", daemon=True)
        self._server: MetricsServer | None = None

    def worker_settings(self, settings: ExtprocSettings, index: int) -> ExtprocSettings:
        """Worker ``index`` serves its page on its socket, not on ``--metrics-listen``."""
        return replace(settings, metrics_listen=None, metrics_socket=str(worker_socket(self.folder, index)))

    def start(self) -> None:
        """Bind ``--metrics-listen`` (``OSError`` when it cannot be bound: before any worker starts)."""
        self._thread.start()
        pages = WorkerPages(self.folder, self.workers)
        future = asyncio.run_coroutine_threadsafe(serve_page(pages.page, self.listen, PROCESS, self.cors), self._loop)
        try:
            self._server = future.result(timeout=30)
        except BaseException:
            self.stop()
            raise
        log.info("metrics: %d workers' pages merged from %s", self.workers, self.folder)

    def stop(self) -> None:
        if self._thread.is_alive():
            if self._server is not None:
                asyncio.run_coroutine_threadsafe(self._server.stop(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)
