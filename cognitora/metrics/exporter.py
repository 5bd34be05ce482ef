"""``Exporter``: one process's metrics page, rendered from live state when it is asked for.

    exporter = Exporter(config, "extproc", router=router, collector=lambda: collector)
    body = await exporter.page()          # on the router's loop: reads the endpoint snapshots, then renders

Which families a page has depends on what the process runs (``cognitora.metrics.names``, ``Source``): a gateway's
router, a collector, and always the fleet's endpoint snapshots. Those come from the collector's own scraper when
the process runs one (always fresh, even with the store down), else from the store the router reads, in one call
(``Store.snapshots``) bounded by ``placement.store_timeout_s``; when that read fails, the last snapshots read are
shown again, and ``cognitora_endpoint_snapshot_age_seconds`` says how old they are.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PrometheusCollector

from cognitora.config import CognitoraConfig
from cognitora.distribution import installed_version
from cognitora.metrics.families import CollectorFamilies, FleetFamilies, RouterFamilies, family
from cognitora.metrics.sources import CollectorSource
from kvstate.store import EndpointSnapshot

if TYPE_CHECKING:
    from collections.abc import Iterator

    from cognitora.core.router import Router

__all__ = ["CONTENT_TYPE", "Exporter", "version"]

log = logging.getLogger("cognitora.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text format (what ``prometheus_client.generate_latest`` writes)."""


def version() -> str:
    return installed_version()


class _Info(PrometheusCollector):
    def __init__(self, process: str) -> None:
        self.labels = [process, version()]

    def collect(self) -> Iterator[Metric]:
        info = family("cognitora_info")
        info.add_metric(self.labels, 1)
        yield info


class Exporter:
    """The metrics page of one process: ``process`` names it (extproc, collector, litellm)."""

    def __init__(
        self,
        config: CognitoraConfig,
        process: str,
        *,
        router: Router | None = None,
        collector: Callable[[], CollectorSource | None] | None = None,
        extproc_errors: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.process = process
        self.router = router
        self.collector = collector
        self.fleet = FleetFamilies(config)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Info(process))
        if router is not None:
            self.registry.register(RouterFamilies(router, extproc_errors))
        if collector is not None:
            self.registry.register(CollectorFamilies(collector))
        self.registry.register(self.fleet)
        self._endpoints = sorted({e.id for m in config.models for e in m.endpoints})
        self._store_ok = True

    async def page(self) -> bytes:
        """Read the endpoint snapshots, then render every family (Prometheus text format). Call it on the loop
        the router (and its store) run on."""
        self.fleet.observe(await self._snapshots())
        return self.render()

    def render(self) -> bytes:
        """Render without reading the store (what was last observed)."""
        return generate_latest(self.registry)

    async def _snapshots(self) -> dict[str, EndpointSnapshot]:
        collector = self.collector() if self.collector is not None else None
        if collector is not None:
            scraper = collector.scraper
            return {e: s for e in scraper.endpoint_ids() if (s := scraper.snapshot(e)) is not None}
        if self.router is None:
            return {}
        timeout_s = max(self.config.placement.store_timeout_s, 0.5)
        try:
            async with asyncio.timeout(timeout_s):
                snapshots = await self.router.store.snapshots(self._endpoints)
        except Exception as exc:  # the page still renders: the last snapshots read, their age showing
            if self._store_ok:
                log.warning("metrics: cannot read endpoint snapshots from the store: %s", exc or type(exc).__name__)
                self._store_ok = False
            return {}
        if not self._store_ok:
            log.info("metrics: endpoint snapshots readable again")
            self._store_ok = True
        return snapshots
