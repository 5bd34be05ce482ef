"""``cognitora collector``: feeds the store from every engine's KV events and /metrics.

One collector per fleet (or one in-process ``Collector`` in embedded mode: a single gateway with a
``MemoryStore``), never one per gateway replica: gateways only read the store. It runs:

- for each endpoint with ``kv_events``: a ``KVEventSubscriber`` (ZMQ SUB + replay) applying, through the model's
  ``EventIngestor``, what the engine caches and evicts (our block keys, see ``kvstate.events``);
- for each vLLM endpoint without: a ``KvEventSourceWatcher`` reading the engine's ``GET /kv_event_sources`` and
  keeping one such subscriber per data-parallel rank it names (``cognitora.kv_event_sources``);
- one ``Scraper`` for all endpoints: health, load, power, learned prefill/decode rates (``kvstate.scrape``);
- a heartbeat (``Store.put_heartbeat``) every quarter of ``placement.state_max_age_s`` (at least once a second):
  the Router calls the state it places on stale when the newest beat is older than that bound.

Logs are JSON lines (``cognitora.jsonlog``); every ``--stats-interval-s`` one ``collector stats`` line carries the
counters. SIGTERM or SIGINT stops it cleanly with exit code 0; SIGHUP (or an edit of the file, seen within
``--watch-config-s``) reloads the config: endpoints added, removed or moved (``cognitora.ops.collector_reload``).
docs/collector.md has the details.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import Any

from cognitora import jsonlog, sd_notify
from cognitora.config import CognitoraConfig, ConfigError, EndpointConfig, EngineKind, load_config
from cognitora.failsafe import RateLimitedLog
from cognitora.kv_event_sources import (
    KvEventSource,
    KvEventSourceWatcher,
    discovers_kv_events,
    pulls_trtllm_events,
    reports_kv_events,
)
from cognitora.metrics.cors import CorsPolicy
from cognitora.metrics.exporter import Exporter
from cognitora.metrics.serve import MetricsServer, parse_listen, serve_page
from cognitora.ops.collector_reload import LiveCollector
from cognitora.ops.health import PING_TIMEOUT_S, Readiness
from cognitora.ops.reload import ConfigSource, ConfigWatch
from cognitora.preflight import check_store, resolve_engines, unresolved_problems
from kvstate.engines import ENGINES
from kvstate.events import sglang as sglang_events
from kvstate.events import vllm as vllm_events
from kvstate.events.ingest import EventIngestor
from kvstate.events.subscriber import Decoder, KVEventSubscriber
from kvstate.events.trtllm_poller import TrtllmEventPoller
from kvstate.memory_store import MemoryStore
from kvstate.open import open_store
from kvstate.scrape import Scraper, ScrapeTarget
from kvstate.store import Store, StoreUnavailable
from kvstate.task_stop import cancel_and_wait

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_STATS_INTERVAL_S",
    "DEFAULT_WATCH_CONFIG_S",
    "HEARTBEAT_TTL_S",
    "STOP_TIMEOUT_S",
    "Collector",
    "CollectorThread",
    "collector_metrics",
    "collector_name",
    "collector_readiness",
    "event_decoder",
    "heartbeat_interval_s",
    "main",
    "scrape_target",
    "scrape_targets",
    "serve",
]

DEFAULT_STATS_INTERVAL_S = 30.0
DEFAULT_WATCH_CONFIG_S = 2.0
"""As ``cognitora extproc``'s: a look at the config file's modification time every 2 s."""

HEARTBEAT_TTL_S = 86400.0
"""How long a collector's heartbeat stays in the store: a day, so the beat of a collector that died ages where every
gateway sees it (and says how long ago) rather than vanishing."""

STOP_TIMEOUT_S = 10.0
"""How long a stop waits for the collector's parts before it goes on anyway (``cognitora collector`` after SIGTERM,
``CollectorThread.stop``)."""


def heartbeat_interval_s(config: CognitoraConfig) -> float:
    """Seconds between two heartbeats: a quarter of the staleness bound, at least once a second."""
    return min(1.0, config.placement.state_max_age_s / 4)


def collector_name() -> str:
    """This collector's heartbeat name: where it runs, so an operator can tell two collectors apart."""
    return f"collector {socket.gethostname()} pid {os.getpid()}"


def event_decoder(engine: EngineKind) -> Decoder:
    """SGLang has its own payload layout; vLLM's is also what TensorRT-LLM's ZMQ publisher sends."""
    return sglang_events.decode_batch if engine == EngineKind.SGLANG else vllm_events.decode_batch


def scrape_target(endpoint: EndpointConfig, counts_blocks: bool = False) -> ScrapeTarget:
    """What the scraper polls for one endpoint: the engine, and its power page and GPUs when configured.
    ``counts_blocks``: its KV events feed the store (``ScrapeTarget.counts_blocks``)."""
    power = endpoint.power
    return ScrapeTarget(
        endpoint.id,
        endpoint.url,
        endpoint.engine.value,
        power_url=None if power is None else power.url,
        power_gpus=() if power is None else tuple(str(gpu) for gpu in power.gpus),
        counts_blocks=counts_blocks,
    )


def scrape_targets(config: CognitoraConfig) -> list[ScrapeTarget]:
    """One target per endpoint id (an engine serving several models is scraped once)."""
    pulls = config.engine_pulls
    targets: dict[str, ScrapeTarget] = {}
    for model in config.models:
        for endpoint in model.endpoints:
            # As the collector subscribes (below): a stream configured, discovered (vLLM) or pulled (TRT-LLM).
            # A vLLM engine whose discovery finds no stream is counted too, as holding nothing.
            fed = reports_kv_events(endpoint, pulls.trtllm_kv_events) or discovers_kv_events(
                endpoint, pulls.vllm_kv_event_sources
            )
            targets.setdefault(endpoint.id, scrape_target(endpoint, fed))
    return list(targets.values())


class Collector:
    """Subscribers and scraper for every configured endpoint, writing to ``store``. ``start()``/``stop()``, or
    ``async with Collector(config, store):`` in embedded mode. The caller owns ``store`` (it is not closed here)."""

    def __init__(
        self, config: CognitoraConfig, store: Store, ingestors: dict[str, EventIngestor] | None = None
    ) -> None:
        """``ingestors``: a running collector's, reused for the models whose block size is unchanged (a reload: the
        ingestor tracks each endpoint's blocks, which a subscriber carried over keeps writing through)."""
        self.config = config
        self.store = store
        self.ingestors: dict[str, EventIngestor] = {}
        """Per model name."""
        self.subscribers: dict[str, KVEventSubscriber] = {}
        """Per endpoint id."""
        self.trtllm_pollers: dict[str, TrtllmEventPoller] = {}
        """Per endpoint id: TRT-LLM engines whose events are pulled over HTTP (``engine_pulls.trtllm_kv_events``)."""
        self.source_watchers: dict[str, KvEventSourceWatcher] = {}
        """Per endpoint id: vLLM engines whose streams are read from their ``/kv_event_sources``."""
        self.discovered: dict[str, list[KVEventSubscriber]] = {}
        """Per endpoint id: the subscribers of the streams its watcher found, one per data-parallel rank."""
        self.discovery: dict[str, tuple[str, Decoder, EventIngestor]] = {}
        """Per endpoint id read by a watcher: its URL, decoder and ingestor. A reload keeps its streams when these
        are alike (``cognitora.ops.collector_reload``): the sources are the engine's, not the config's."""
        for model in config.models:
            kept = (ingestors or {}).get(model.name)
            ingestor = kept if kept is not None and kept.block_size == model.block_size else None
            ingestor = ingestor or EventIngestor(store, model.name, model.block_size)
            self.ingestors[model.name] = ingestor
            for endpoint in model.endpoints:
                if endpoint.kv_events is not None:
                    self._add_subscriber(model.name, endpoint, ingestor)
                elif (
                    discovers_kv_events(endpoint, config.engine_pulls.vllm_kv_event_sources)
                    and endpoint.id not in self.source_watchers
                ):
                    self._add_source_watcher(endpoint, ingestor)
                elif (
                    pulls_trtllm_events(endpoint, config.engine_pulls.trtllm_kv_events)
                    and endpoint.id not in self.trtllm_pollers
                ):
                    # Like a ZMQ stream, one engine's events go to the first model listing it.
                    self.trtllm_pollers[endpoint.id] = TrtllmEventPoller(
                        endpoint.id, endpoint.url, ingestor, interval_s=config.engine_pulls.trtllm_kv_events_interval_s
                    )
        self.scraper = Scraper(
            store,
            scrape_targets(config),
            interval_s=config.scrape.interval_s,
            timeout_s=min(config.scrape.timeout_s, config.scrape.interval_s),
            poll_slots=config.engine_pulls.llamacpp_slots,
        )
        self.name = collector_name()
        self.heartbeat_failures = 0
        self._heartbeat: asyncio.Task[None] | None = None
        self._heartbeat_errors = RateLimitedLog(log)
        self._started = False

    def rebuilt(self, config: CognitoraConfig) -> Collector:
        """A collector of ``config`` over the same store, reusing this one's ingestors (a reload; not started)."""
        return Collector(config, self.store, ingestors=self.ingestors)

    def _add_subscriber(self, model: str, endpoint: EndpointConfig, ingestor: EventIngestor) -> None:
        assert endpoint.kv_events is not None
        if endpoint.id in self.subscribers:
            # One event stream describes one engine; applying it to two models' key spaces would make each
            # model's purge wipe the other's blocks. The first model listing the endpoint gets the stream.
            log.warning(
                "endpoint listed with kv_events under several models; its events are applied to the first only",
                extra={
                    "endpoint": endpoint.id,
                    "model": model,
                    "applied_to": self.subscribers[endpoint.id].ingestor.model,
                },
            )
            return
        if not ENGINES.get(endpoint.engine.value).publishes_kv_events:
            log.warning(
                "engine kind is not known to publish KV events; decoding its stream as vLLM's",
                extra={"endpoint": endpoint.id, "engine": endpoint.engine.value},
            )
        self.subscribers[endpoint.id] = KVEventSubscriber(
            endpoint=endpoint.id,
            pub_address=endpoint.kv_events,
            ingestor=ingestor,
            decode=event_decoder(endpoint.engine),
            replay_address=endpoint.kv_events_replay,
        )

    def _add_source_watcher(self, endpoint: EndpointConfig, ingestor: EventIngestor) -> None:
        """Like a configured stream, one engine's discovered streams go to the first model listing it."""
        self.discovery[endpoint.id] = (endpoint.url, event_decoder(endpoint.engine), ingestor)

        async def subscribe(sources: list[KvEventSource]) -> None:
            old = self.discovered.pop(endpoint.id, [])
            await asyncio.gather(*(s.stop() for s in old))
            subscribers = [
                KVEventSubscriber(
                    endpoint=endpoint.id,
                    pub_address=source.publisher,
                    ingestor=ingestor,
                    decode=event_decoder(endpoint.engine),
                    replay_address=source.replay,
                )
                for source in sources
            ]
            self.discovered[endpoint.id] = subscribers
            if self._started:
                for subscriber in subscribers:
                    subscriber.start()

        self.source_watchers[endpoint.id] = KvEventSourceWatcher(
            endpoint.id,
            endpoint.url,
            subscribe,
            interval_s=self.config.engine_pulls.vllm_kv_event_sources_interval_s,
            timeout_s=min(self.config.scrape.timeout_s, self.config.engine_pulls.vllm_kv_event_sources_interval_s),
        )

    def _all_subscribers(self) -> list[KVEventSubscriber]:
        return [*self.subscribers.values(), *(s for found in self.discovered.values() for s in found)]

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        for subscriber in self.subscribers.values():
            subscriber.start()
        for watcher in self.source_watchers.values():
            watcher.start()
        for poller in self.trtllm_pollers.values():
            poller.start()
        await self.scraper.start()
        await self._beat()  # before start() returns: a gateway starting beside it sees a collector at once
        self._heartbeat = asyncio.create_task(self._beat_forever(), name="cognitora-collector-heartbeat")
        log.info(
            "collector started",
            extra={
                "endpoints": self.scraper.endpoint_ids(),
                "kv_event_streams": sorted(self.subscribers),
                "kv_event_sources_read": sorted(self.source_watchers),
                "kv_event_polls": sorted(self.trtllm_pollers),
                "scrape_interval_s": self.scraper.interval_s,
            },
        )

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        if self._heartbeat is not None:
            await cancel_and_wait(self._heartbeat)
            self._heartbeat = None
        await asyncio.gather(*(w.stop() for w in self.source_watchers.values()))
        await asyncio.gather(
            self.scraper.stop(),
            *(s.stop() for s in self._all_subscribers()),
            *(p.stop() for p in self.trtllm_pollers.values()),
        )
        log.info("collector stopped", extra=self.stats())

    async def _beat(self) -> None:
        try:
            await self.store.put_heartbeat(self.name, HEARTBEAT_TTL_S)
        except (StoreUnavailable, OSError) as exc:  # the store is down: the gateways see the beat age, as they should
            self.heartbeat_failures += 1
            log.debug("heartbeat not written", extra={"error": str(exc)})
        except Exception as exc:  # a bug must not end the beats silently (the gateways would call the state stale)
            self.heartbeat_failures += 1
            self._heartbeat_errors.error("heartbeat failed", exc)

    async def _beat_forever(self) -> None:
        interval = heartbeat_interval_s(self.config)
        while True:
            await asyncio.sleep(interval)
            await self._beat()

    async def __aenter__(self) -> Collector:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def stats(self) -> dict[str, Any]:
        """Counters summed over endpoints and models: what the periodic stats line reports."""
        events: dict[str, int] = {}
        for subscriber in self._all_subscribers():
            for name, value in asdict(subscriber.stats).items():
                events[name] = events.get(name, 0) + value
        for poller in self.trtllm_pollers.values():  # pulled batches count as events like pushed ones
            for name in ("applied", "malformed", "purges", "store_errors"):
                events[name] = events.get(name, 0) + getattr(poller.stats, name)
        blocks: dict[str, int] = {}
        for ingestor in self.ingestors.values():
            for name, value in asdict(ingestor.stats).items():
                blocks[name] = blocks.get(name, 0) + value
        scrape = asdict(self.scraper.stats)
        healthy = [e for e in self.scraper.endpoint_ids() if (s := self.scraper.snapshot(e)) is not None and s.healthy]
        return {
            "events_applied": events.get("applied", 0),
            "events_malformed": events.get("malformed", 0),
            "event_gaps": events.get("gaps", 0),
            "events_replayed": events.get("replayed", 0),
            "purges": events.get("purges", 0),
            "event_store_errors": events.get("store_errors", 0),
            "event_poll_failures": sum(p.stats.failures for p in self.trtllm_pollers.values()),
            "blocks_stored": blocks.get("blocks_stored", 0),
            "blocks_removed": blocks.get("blocks_removed", 0),
            "blocks_tracked": sum(ingestor.tracked_total() for ingestor in self.ingestors.values()),
            "blocks_skipped": blocks.get("unknown_parent", 0)
            + blocks.get("block_size_mismatch", 0)
            + blocks.get("inconsistent", 0),
            "scrape_rounds": scrape["rounds"],
            "scrape_failures": scrape["failures"],
            "scrape_metrics_failures": scrape["metrics_failures"],
            "scrape_garbage": scrape["garbage"],
            "scrape_unrecognized": scrape["unrecognized"],
            "scrape_store_failures": scrape["store_failures"],
            "heartbeat_failures": self.heartbeat_failures,
            "healthy_endpoints": len(healthy),
            "endpoints": len(self.scraper.endpoint_ids()),
        }


class CollectorThread:
    """A ``Collector`` on a thread and event loop of its own, feeding an in-process ``MemoryStore``.

    Embedded mode runs the collector inside a gateway. On the gateway's own loop, its scrapes and KV events queue
    behind the requests that loop serves: a LiteLLM proxy streaming responses kept its loop busy enough that scrape
    rounds timed out (engines marked unhealthy while serving) and KV events arrived seconds late. Here they only
    share the GIL. ``MemoryStore`` is safe to write from this thread while the gateway's loop reads it; a Redis
    client is bound to the loop that opened it, so a Redis store is refused (run ``cognitora collector`` instead).
    """

    def __init__(self, config: CognitoraConfig, store: Store) -> None:
        if not isinstance(store, MemoryStore):
            raise TypeError(
                f"CollectorThread feeds an in-process MemoryStore, not a {type(store).__name__}: with Redis, run "
                "`cognitora collector --config cognitora.yaml` beside the gateways instead"
            )
        self.config = config
        self.store = store
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cognitora-collector", daemon=True)
        self.collector: Collector | None = None
        self._stopping = False
        """A stop began: a later one waits for the thread to end (its loop may not run what it would send)."""

    async def start(self) -> None:
        """Start the thread and the collector on it; returns once the collector has started (or raises why not)."""
        if not self._thread.is_alive():
            self._thread.start()
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._start(), self._loop))

    async def _start(self) -> None:
        if self.collector is None:
            self.collector = Collector(self.config, self.store)
        await self.collector.start()

    @property
    def alive(self) -> bool:
        """Its thread runs (started, and not stopped yet)."""
        return self._thread.is_alive()

    async def stop(self) -> None:
        """Stop the collector, then the thread. Safe to call twice, or before ``start``.

        Done before this returns or raises, even when the caller is cancelled meanwhile (a test's loop torn down, a
        drain cut short): the collector's stop is shielded from that, and waited for. Else the thread outlived its
        owner, still collecting, and its "collector stopped" line came after the owner had gone (CI: "--- Logging
        error ---", the test's captured stream closed by then)."""
        if not self._thread.is_alive():
            return
        if self._stopping:  # another stop is under way: its end is this one's
            await asyncio.shield(asyncio.to_thread(self._thread.join, STOP_TIMEOUT_S))
            return
        self._stopping = True
        stopped = self._stop_collector()
        try:
            if stopped is not None:
                await asyncio.shield(asyncio.wrap_future(stopped))
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.shield(asyncio.to_thread(self._thread.join, STOP_TIMEOUT_S))
        except asyncio.CancelledError:
            self._finish(stopped)  # the owner's loop may be closing: finish here, blocking it (milliseconds)
            raise
        finally:
            if not self._thread.is_alive() and not self._loop.is_closed():
                self._loop.close()

    def stop_blocking(self) -> None:
        """``stop`` for a caller that cannot await it (a synchronous close on an event loop): blocks the caller
        until the collector stopped on its own thread and the thread ended (milliseconds). Not from that thread."""
        if not self._thread.is_alive():
            return
        if self._stopping:
            self._thread.join(STOP_TIMEOUT_S)
            return
        self._stopping = True
        self._finish(self._stop_collector())

    def _stop_collector(self) -> concurrent.futures.Future[None] | None:
        return None if self.collector is None else asyncio.run_coroutine_threadsafe(self.collector.stop(), self._loop)

    def _finish(self, stopped: concurrent.futures.Future[None] | None) -> None:
        if stopped is not None:
            concurrent.futures.wait([stopped], timeout=STOP_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(STOP_TIMEOUT_S)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()

    def stats(self) -> dict[str, Any]:
        """``Collector.stats()``; counters read from another thread are at worst a moment old."""
        return {} if self.collector is None else self.collector.stats()


# -- the ``cognitora collector`` command ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cognitora collector", description="Feed the store from engine KV events and /metrics."
    )
    parser.add_argument("--config", required=True, help="cognitora.yaml (needs redis_url)")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default: info"
    )
    parser.add_argument(
        "--stats-interval-s",
        type=float,
        default=DEFAULT_STATS_INTERVAL_S,
        help=f"seconds between two 'collector stats' log lines (default {DEFAULT_STATS_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--watch-config-s",
        type=float,
        default=DEFAULT_WATCH_CONFIG_S,
        help="seconds between looks at the config file; a change reloads it like SIGHUP does (endpoints added, "
        f"removed or moved; default {DEFAULT_WATCH_CONFIG_S:g}; 0 = SIGHUP only)",
    )
    parser.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics, and /healthz and /readyz, CORS open (default: "
        "none; docs/metrics.md, docs/operations.md)",
    )
    return parser


async def serve(
    config: CognitoraConfig,
    store: Store,
    stats_interval_s: float,
    metrics_listen: str | None = None,
    config_path: Path | None = None,
    watch_config_s: float = 0.0,
) -> None:
    """Run a collector until SIGTERM or SIGINT, logging its stats every ``stats_interval_s`` (and serving its
    metrics page on ``metrics_listen``). With ``config_path``, SIGHUP reloads that file (and so does a change seen
    every ``watch_config_s``, 0: SIGHUP only): ``cognitora.ops.collector_reload``."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    live = LiveCollector(Collector(config, store), ConfigSource.file(config_path or Path("cognitora.yaml")))
    reloads: set[asyncio.Task[Any]] = set()
    watch = ConfigWatch(live, watch_config_s if config_path is not None else 0.0)

    def on_sighup() -> None:
        task = asyncio.ensure_future(live.reload("SIGHUP"))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    if config_path is not None:
        loop.add_signal_handler(signal.SIGHUP, on_sighup)
    metrics: MetricsServer | None = None
    try:
        await live.current.start()
        if metrics_listen is not None:
            metrics = await collector_metrics(config, lambda: live.current, metrics_listen)
        watch.start()
        sd_notify.ready("collecting")  # systemd Type=notify: started (deploy/systemd/)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=stats_interval_s)
            if not stop.is_set():
                log.info("collector stats", extra=live.current.stats())
        log.info("signal received; stopping")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        # Bounded: a part whose task lost its cancel (kvstate.task_stop) must not keep the process alive; the
        # timeout cancels the stop under way, which cancels the parts' tasks once more.
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await watch.stop()
                for task in list(reloads):  # a reload under way finishes before the parts stop
                    await task
                if metrics is not None:
                    await metrics.stop()
                await live.current.stop()
        except TimeoutError:
            log.error("collector did not stop in time; exiting anyway", extra={"stop_timeout_s": STOP_TIMEOUT_S})


async def collector_readiness(collector: Collector) -> Readiness:
    """``/readyz``: the store answers a ping, and KV events and scrapes flow (``cognitora.ops.health``)."""
    checks: dict[str, str] = {}
    try:
        async with asyncio.timeout(PING_TIMEOUT_S):
            answered = await collector.store.ping()
        checks["store"] = "ok" if answered else "the store did not answer a ping"
    except TimeoutError:
        checks["store"] = f"the store did not answer a ping within {PING_TIMEOUT_S:g} s"
    except Exception as exc:
        checks["store"] = f"the store is unreachable: {type(exc).__name__}: {exc}"
    waiting = sorted(e for e, s in collector.subscribers.items() if not s.ready.is_set())
    checks["kv_events"] = "ok" if not waiting else f"not subscribed yet: {', '.join(waiting)}"
    stats = collector.stats()
    if stats["scrape_rounds"] == 0:
        checks["scrapes"] = "no scrape round done yet"
    elif stats["endpoints"] and stats["healthy_endpoints"] == 0:
        checks["scrapes"] = f"none of the {stats['endpoints']} engines answers its health check"
    else:
        checks["scrapes"] = "ok"
    return Readiness(checks)


async def collector_metrics(config: CognitoraConfig, current: Callable[[], Collector], listen: str) -> MetricsServer:
    """The collector's metrics page (docs/metrics.md) on ``listen``, of the collector ``current()`` returns (the one
    in force: a reload replaces it)."""
    page = Exporter(config, "collector", collector=current).page
    # /healthz and /readyz on the same port (store reachable, events and scrapes flowing: cognitora.ops.health)
    return await serve_page(
        page, listen, "collector", CorsPolicy.of(config.metrics), probe=lambda: collector_readiness(current())
    )


async def _run(config: CognitoraConfig, args: argparse.Namespace) -> None:
    store = open_store(config.redis_url, config.key_prefix, config.redis_cluster)
    try:
        await serve(config, store, args.stats_interval_s, args.metrics_listen, Path(args.config), args.watch_config_s)
    finally:
        with contextlib.suppress(Exception):
            await store.close()


def _listen_ok(listen: str) -> bool:
    try:
        parse_listen(listen)
    except ValueError as exc:
        log.error(f"--metrics-listen {exc}")
        return False
    return True


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    jsonlog.configure(args.log_level)
    if args.watch_config_s < 0:
        log.error("--watch-config-s must be 0 (off) or positive", extra={"got": args.watch_config_s})
        return 2
    if args.stats_interval_s <= 0:
        log.error("--stats-interval-s must be positive", extra={"got": args.stats_interval_s})
        return 2
    if args.metrics_listen is not None and not _listen_ok(args.metrics_listen):
        return 2
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        log.error(str(exc))
        return 2
    if config.redis_url is None:
        log.error(
            "the collector needs redis_url in its config: it runs as its own process, so only a shared store "
            "reaches the gateways (embedded mode runs Collector inside the gateway instead)",
            extra={"config": args.config},
        )
        return 2
    # What needs the world, checked before collecting (cognitora.preflight): an engine listed twice and a password
    # Redis refuses are errors; a host that does not resolve yet and a Redis that does not answer yet are warnings
    # (each scrape resolves again, and writes resume when Redis answers).
    try:
        engines = resolve_engines(config)
        store_warning = check_store(config)
    except ConfigError as exc:
        log.error(f"{args.config}: {exc}")
        return 2
    for problem in unresolved_problems(engines):
        log.warning(f"{problem}; scraping it anyway (each scrape resolves the name again)")
    if store_warning is not None:
        log.warning(f"store not reachable at start; collecting anyway, writes resume when it answers: {store_warning}")
    log.info(
        "collector starting",
        extra={
            "config": args.config,
            "redis_url": jsonlog.mask_secrets(config.redis_url),
            "key_prefix": config.key_prefix,
        },
    )
    try:
        asyncio.run(_run(config, args))
    except Exception:  # even a crash leaves a JSON line (with the traceback), not a bare stderr dump
        log.exception("collector crashed")
        return 1
    return 0
