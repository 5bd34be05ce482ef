"""What a metrics page reads from the process it describes, as protocols: the page depends on these shapes, not on
the modules that run the parts.

``cognitora.collector.Collector`` is a ``CollectorSource``; the collector imports this package to serve its page,
so the page must not import the collector back (that was an import circle: ``collector`` <-> ``exporter`` /
``families``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from kvstate.events.ingest import EventIngestor
from kvstate.events.subscriber import KVEventSubscriber
from kvstate.scrape import Scraper

__all__ = ["CollectorSource"]


class CollectorSource(Protocol):
    """The parts of a running collector whose counters a page shows (``CollectorFamilies``), and whose scraper's
    snapshots it shows when the process runs one (``Exporter``)."""

    @property
    def subscribers(self) -> Mapping[str, KVEventSubscriber]:
        """The KV-event subscribers, by endpoint id."""
        ...

    @property
    def ingestors(self) -> Mapping[str, EventIngestor]:
        """The event ingestors, by model name."""
        ...

    @property
    def scraper(self) -> Scraper:
        """The scraper of every endpoint (its counters and its latest snapshots)."""
        ...
