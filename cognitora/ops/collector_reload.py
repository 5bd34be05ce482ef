"""Reloading ``cognitora collector``'s configuration without a restart: SIGHUP, or a change of the file seen by
``ConfigWatch`` (as for ``cognitora extproc``, ``cognitora.ops.reload``).

What changes live: the endpoints (added, removed, moved to another address or KV event stream), the models they
serve, the scrape and engine-pull settings, the heartbeat's pace. A reload builds a new ``Collector`` from the new
file over the same store and carries over, untouched, every part whose endpoint did not change: its KV event
subscriber keeps its stream (no purge, no replay, no event missed), a TRT-LLM poller keeps polling, and the scraper
is kept whole when no scrape target or setting changed (otherwise a new one starts, and the rates it learned
restart). What did change stops, and its replacement starts as at start-up (a changed stream resyncs: purge, then
replay). A vLLM engine whose streams are discovered (``/kv_event_sources``) is read by a new watcher, but its
running streams are kept when the engine's URL, decoder and ingestor are alike: the new watcher starts from the
sources the old one knew, and replaces the streams only if the engine now names others.

Validation first: the file must load, the store (``redis_url``, ``key_prefix``, ``redis_cluster``) must be the same
(the process holds its connections: restart to change it), and no engine may be listed twice; on any error the
collector in force keeps running on the old config, and the log says why.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Generic, Protocol, Self, TypeVar

from cognitora.config import CognitoraConfig, ConfigError
from cognitora.kv_event_sources import KvEventSourceWatcher
from cognitora.ops.reload import ConfigSource, ReloadOutcome, changed_sections, log_outcome, restart_only
from cognitora.preflight import resolve_engines, unresolved_problems
from kvstate.events.ingest import EventIngestor
from kvstate.events.subscriber import Decoder, KVEventSubscriber
from kvstate.events.trtllm_poller import TrtllmEventPoller
from kvstate.scrape import Scraper

__all__ = ["LiveCollector", "ReloadableCollector", "carry_over"]

log = logging.getLogger("cognitora.ops.collector_reload")


class ReloadableCollector(Protocol):
    """What a reload reads and moves of ``cognitora.collector.Collector`` (a protocol, not an import: the collector
    command builds a ``LiveCollector``, so importing the collector here would close a circle)."""

    config: CognitoraConfig
    subscribers: dict[str, KVEventSubscriber]
    source_watchers: dict[str, KvEventSourceWatcher]
    discovered: dict[str, list[KVEventSubscriber]]
    discovery: dict[str, tuple[str, Decoder, EventIngestor]]
    trtllm_pollers: dict[str, TrtllmEventPoller]
    scraper: Scraper

    def rebuilt(self, config: CognitoraConfig) -> Self:
        """A collector of ``config`` over the same store, reusing this one's ingestors (not started)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


C = TypeVar("C", bound=ReloadableCollector)


class LiveCollector(Generic[C]):
    """The collector in force (``current``), replaced on ``reload``; ``ConfigWatch`` drives it like a
    ``LiveRouter``."""

    def __init__(self, collector: C, source: ConfigSource) -> None:
        self.current = collector
        self.source = source
        self._lock = asyncio.Lock()
        self.reloads = 0
        """Reloads that took effect."""
        self.refused = 0
        """Reloads refused (the config in force stayed)."""
        self.last_outcome: ReloadOutcome | None = None

    async def reload(self, why: str = "SIGHUP") -> ReloadOutcome:
        """Validate the file and, if it passes, put a collector built from it in force. Never raises: a refused
        reload is logged with its reason and counted, and the collector in force keeps running."""
        async with self._lock:
            outcome = await self._reload()
            self.last_outcome = outcome
            if outcome.ok:
                self.reloads += 1
            else:
                self.refused += 1
            log_outcome(log, why, outcome, self.source)
            return outcome

    async def retire_idle(self) -> None:
        """Nothing to retire: a collector holds no request (``ConfigWatch`` calls it between looks)."""

    async def _reload(self) -> ReloadOutcome:
        old = self.current
        try:
            config = await asyncio.to_thread(self.source.load)
            fixed = restart_only(old.config, config)
            if fixed:
                return ReloadOutcome(False, f"{', '.join(fixed)} changed: the store cannot change live; restart")
            changed = changed_sections(old.config, config)
            if not changed:
                return ReloadOutcome(True, "nothing changed")
            engines = await asyncio.to_thread(resolve_engines, config)  # an engine listed twice: ConfigError
            for problem in unresolved_problems(engines):
                log.warning(f"{problem}; scraping it anyway (each scrape resolves the name again)")
            new = old.rebuilt(config)
        except ConfigError as exc:
            return ReloadOutcome(False, f"{self.source.path}: {exc}")
        except Exception as exc:  # a bug in a check must not stop the collecting: the old config stays
            log.exception("config reload failed")
            return ReloadOutcome(False, f"{self.source.path}: {type(exc).__name__}: {exc}")
        kept = carry_over(old, new)
        await old.stop()  # only what did not carry over: the carried parts left ``old`` above
        await new.start()
        self.current = new
        log.info("collector parts kept running across the reload", extra={"kept": kept})
        return ReloadOutcome(True, "changed: " + ", ".join(changed), changed)


def carry_over(old: ReloadableCollector, new: ReloadableCollector) -> list[str]:
    """Move from ``old`` into ``new`` every running part whose endpoint is configured alike in both (``new`` was
    built with ``old``'s ingestors, so an unchanged model's ingestor is the same object). Returns what moved."""
    kept: list[str] = []
    for endpoint, subscriber in list(new.subscribers.items()):
        running = old.subscribers.get(endpoint)
        if running is not None and _same_stream(running, subscriber):
            new.subscribers[endpoint] = old.subscribers.pop(endpoint)
            kept.append(f"kv events {endpoint}")
    for endpoint, how in new.discovery.items():
        reading = old.source_watchers.get(endpoint)
        streams = old.discovered.get(endpoint, [])
        if reading is None or reading.current is None or old.discovery.get(endpoint) != how:
            continue
        if [(s.pub_address, s.replay_address) for s in streams] != [(c.publisher, c.replay) for c in reading.current]:
            continue  # the old watcher is between learning new sources and subscribing to them: read afresh
        # Without this every discovered engine was purged and replayed on any reload (the scrape interval alone).
        new.discovered[endpoint] = old.discovered.pop(endpoint)
        new.source_watchers[endpoint].current = reading.current
        kept.append(f"kv event sources {endpoint}")
    for endpoint, poller in list(new.trtllm_pollers.items()):
        polling = old.trtllm_pollers.get(endpoint)
        if polling is not None and _same_poll(polling, poller):
            new.trtllm_pollers[endpoint] = old.trtllm_pollers.pop(endpoint)
            kept.append(f"trtllm events {endpoint}")
    if _same_scrape(old, new):
        new.scraper, old.scraper = old.scraper, new.scraper  # ``old`` stops the unstarted one
        kept.append("scraper")
    return kept


def _same_stream(a: KVEventSubscriber, b: KVEventSubscriber) -> bool:
    return (a.pub_address, a.replay_address, a.decode) == (b.pub_address, b.replay_address, b.decode) and (
        a.ingestor is b.ingestor
    )


def _same_poll(a: TrtllmEventPoller, b: TrtllmEventPoller) -> bool:
    return (a.events_url, a.interval_s, a.timeout_s) == (b.events_url, b.interval_s, b.timeout_s) and (
        a.ingestor is b.ingestor
    )


def _same_scrape(old: ReloadableCollector, new: ReloadableCollector) -> bool:
    return old.scraper.targets() == new.scraper.targets() and _scrape_settings(old.config) == _scrape_settings(
        new.config
    )


def _scrape_settings(config: CognitoraConfig) -> tuple[object, ...]:
    return (config.scrape, config.engine_pulls.llamacpp_slots)
