"""``cognitora extproc``: the gRPC ext_proc service Envoy calls for every request (docs/envoy.md).

This module is the stream loop and the process around it; the phases live in ``processor.Exchange``.
Bindings: xds-protos (protoc ``_pb2`` + grpcio servicer, upb-backed). ``envoy-data-plane`` has no grpcio servicer
and (de)serialises two orders of magnitude slower (docs/envoy.md, "Bindings").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

from cognitora import jsonlog, sd_notify
from cognitora.config import ConfigError
from cognitora.core.deployment import CollectorPlace, DeploymentRule, deployment_problem
from cognitora.failsafe import RateLimitedLog
from cognitora.metrics.cors import CorsPolicy
from cognitora.ops.drain import drain
from cognitora.ops.reload import ConfigSource, ConfigWatch, LiveRouter
from cognitora.preflight import check_store, resolve_engines
from cognitora.tracing import Tracing
from envoy_extproc import protocol
from envoy_extproc.addresses import AddressBook, address_book
from envoy_extproc.health import ExtprocHealth, add_health
from envoy_extproc.live import LiveParts
from envoy_extproc.metrics import SupervisorMetrics
from envoy_extproc.processor import Exchange, PlacementCore
from envoy_extproc.settings import ExtprocSettings, parse_settings

__all__ = ["ExtProcServer", "ExtProcService", "blind_start_problem", "main", "start_server"]

log = logging.getLogger("cognitora.extproc")

_FAIL_CLOSED = frozenset({"request_headers", "request_body"})
"""Phases whose failure answers the client 503: the request has not been placed yet."""

_PASS_THROUGH = {
    "request_headers": protocol.CONTINUE_REQUEST_HEADERS,
    "request_body": protocol.CONTINUE_REQUEST_BODY,
    "request_trailers": protocol.CONTINUE_REQUEST_TRAILERS,
    "response_headers": protocol.CONTINUE_RESPONSE_HEADERS,
    "response_body": protocol.CONTINUE_RESPONSE_BODY,
    "response_trailers": protocol.CONTINUE_RESPONSE_TRAILERS,
}


class ExtProcService(ep_grpc.ExternalProcessorServicer):
    """One gRPC stream per HTTP request: read a message, answer it; at the end, see the request's report through."""

    def __init__(
        self, core: PlacementCore, settings: ExtprocSettings, addresses: AddressBook, tracing: Tracing | None = None
    ) -> None:
        self._core = core
        self._settings = settings
        self._addresses = addresses
        self._tracing = tracing
        self._closing: set[asyncio.Task[None]] = set()
        self._errors = 0
        """Phases that raised (each one logged with its traceback at most once a minute)."""
        self._error_log = RateLimitedLog(log)

    @property
    def errors(self) -> int:
        """Phases that raised so far (``cognitora_internal_errors_total{where="extproc"}``)."""
        return self._errors

    async def Process(  # the gRPC method's name
        self, request_iterator: AsyncIterator[protocol.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> None:
        # context.read()/write() rather than iterating request_iterator and yielding: one async-generator layer
        # less per message in grpc.aio, a visible share of the per-request CPU.
        exchange = Exchange(self._core, self._settings, self._addresses, self._tracing, send=context.write)
        try:
            while True:
                message = await context.read()
                if message is grpc.aio.EOF:
                    return
                answer = await self._answer(exchange, message)
                if context.cancelled():  # Envoy gave up meanwhile (its message timeout): it will read nothing more
                    return
                await context.write(answer)
                exchange.delivered()
                if exchange.closed:
                    return
        finally:
            # The request's last reports run in a task of their own: when Envoy resets the stream (client gone),
            # grpc.aio cancels this handler, and the outcome must still reach the core.
            closing = asyncio.ensure_future(exchange.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
            await asyncio.shield(closing)

    async def drain(self) -> None:
        """Wait for the reports of streams that already ended (at shutdown, before the store closes)."""
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def _answer(self, exchange: Exchange, message: protocol.ProcessingRequest) -> protocol.ProcessingResponse:
        kind = message.WhichOneof("request")
        try:
            if kind == "request_headers":
                exchange.note_metadata(message.metadata_context)
                return await exchange.on_request_headers(message.request_headers)
            if kind == "request_body":
                return await exchange.on_request_body(message.request_body)
            if kind == "response_headers":
                return await exchange.on_response_headers(message.response_headers)
            if kind == "response_body":
                return await exchange.on_response_body(message.response_body)
        except Exception as exc:
            self._errors += 1
            self._error_log.error(f"ext_proc {kind} phase failed", exc)
            if kind in _FAIL_CLOSED:
                # A request the service could not place must not reach an engine unplaced (uncounted, unshed).
                exchange.closed = True
                return protocol.openai_error(
                    503,
                    "the gateway could not place this request (an internal error, logged): retry shortly",
                    error_type="server_error",
                    code="503",
                    retry_after_s=1,
                    details="cognitora_internal_error",
                )
        # Past placement, one bad message must not fail the request or the service: let this phase pass through.
        return _PASS_THROUGH.get(kind or "", protocol.CONTINUE_REQUEST_HEADERS)


def grpc_options(settings: ExtprocSettings) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        # A second instance on the same port must fail, not silently share it; only --workers shares it, on purpose.
        ("grpc.so_reuseport", 1 if settings.reuse_port else 0),
    ]


class ExtProcServer:
    """The gRPC server and its service, started; ``stop()`` finishes open streams and their reports."""

    def __init__(self, server: grpc.aio.Server, service: ExtProcService, port: int, health: ExtprocHealth) -> None:
        self.server = server
        self.service = service
        self.port = port
        self.health = health
        """``grpc.health.v1.Health``: SERVING once started, NOT_SERVING from the start of a drain."""

    async def stop(self, grace_s: float | None) -> None:
        await self.server.stop(grace_s)
        await self.service.drain()


async def start_server(
    core: PlacementCore, settings: ExtprocSettings, addresses: AddressBook, tracing: Tracing | None = None
) -> ExtProcServer:
    """Start serving on ``settings.listen`` (``127.0.0.1:0`` picks a free port: see ``.port``)."""
    server = grpc.aio.server(options=grpc_options(settings))
    service = ExtProcService(core, settings, addresses, tracing)
    ep_grpc.add_ExternalProcessorServicer_to_server(service, server)
    health = add_health(server)
    try:
        port = server.add_insecure_port(settings.listen)
    except RuntimeError:  # grpcio's "failed to bind" (another instance holds the port)
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {settings.listen}: address in use or invalid")
    await server.start()
    await health.serving()
    return ExtProcServer(server, service, port, health)


async def _run(settings: ExtprocSettings) -> int:
    from cognitora.burst.credentials import cloud_api_keys
    from cognitora.config import load_config
    from cognitora.core.core import Core, prepare

    try:
        config = load_config(settings.config_path)
    except ConfigError as exc:
        print(f"cognitora extproc: {exc}", file=sys.stderr)
        return 2
    blind = blind_start_problem(config.redis_url, settings)
    if blind is not None:
        print(f"cognitora extproc: {blind}", file=sys.stderr)
        return 2
    if config.redis_url is None and settings.without_collector:
        log.warning("in-process store and no collector (--without-collector): no engine state reaches placement")
    # What needs the world, checked before serving: each a message naming the key (cognitora.preflight).
    try:
        addresses = address_book(resolve_engines(config))
        addresses.cloud_keys = cloud_api_keys(config.burst)  # burst.targets[].credential_env, read once
        store_warning = await asyncio.to_thread(check_store, config)
        prepared = prepare(config)  # loads and compiles each model's tokenizer and chat template, the intent policy
    except ConfigError as exc:
        print(f"cognitora extproc: {settings.config_path}: {exc}", file=sys.stderr)
        return 2
    if store_warning is not None:
        log.warning("%s", store_warning)
    # No choice made passed the blind check only with a shared store: `cognitora collector` feeds it from outside.
    place = collector_place(settings) or CollectorPlace.EXTERNAL
    core = await Core.open(config, collector=place, prepared=prepared)
    router, collector = core.router, core.collector
    # SIGHUP or a change of the file reloads the config (cognitora.ops.reload): new requests are placed by a Router
    # built from it; the addresses, the embedded collector and the metrics page follow (envoy_extproc.live).
    live = LiveRouter(router, ConfigSource.file(settings.config_path))
    tracing = Tracing.from_env("cognitora-extproc")  # OTLP when OTEL_EXPORTER_OTLP_*ENDPOINT is set
    try:
        server = await start_server(live, settings, addresses, tracing)
    except OSError as exc:
        print(f"cognitora extproc: {exc}", file=sys.stderr)
        await core.close()
        return 1
    parts = LiveParts(settings, live, addresses, collector, lambda: server.service.errors, address_book)
    live.prepare = parts.prepare
    log.info("ext_proc listening on %s (port %d), %d endpoints", settings.listen, server.port, len(addresses.addresses))
    try:
        await parts.start_metrics()
    except OSError as exc:
        print(f"cognitora extproc: --metrics-listen {settings.metrics_listen}: {exc}", file=sys.stderr)
        await server.stop(0)
        await core.close()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, parts.on_sighup)
    watch = ConfigWatch(live, settings.watch_config_s)
    watch.start()
    sd_notify.ready(f"serving ext_proc on port {server.port}")  # after the handlers: a stop then drains
    await stop.wait()
    await watch.stop()
    # Health NOT_SERVING first, new streams refused once Envoy has seen it, open ones finish (cognitora.ops.drain).
    await drain(
        settings.drain,
        announce=server.health.start_draining,
        seen=server.health.seen_not_serving,
        stop_accepting=server.stop,
        next_check_within=server.health.next_check_within(),
    )
    await parts.stop()
    await live.close()
    tracing.shutdown()
    return 0


def collector_place(settings: ExtprocSettings) -> CollectorPlace | None:
    """The flags' choice of who feeds the store: ``--collector`` this process, ``--without-collector`` nothing (said
    so); neither: none chosen (an external ``cognitora collector`` when the config names a shared store)."""
    if settings.collector:
        return CollectorPlace.IN_PROCESS
    if settings.without_collector:
        return CollectorPlace.NONE
    return None


def blind_start_problem(redis_url: str | None, settings: ExtprocSettings) -> str | None:
    """Why this service would place blind, or None (the core's rule: ``cognitora.core.core.deployment_problem``).
    With the in-process store and no ``--collector`` nothing feeds the store: no KV events, no load, no health from
    any engine, only this process's own routing history."""
    if deployment_problem(redis_url, collector_place(settings), 1) is not DeploymentRule.BLIND:
        return None
    return (
        f"{settings.config_path} has no redis_url (in-process store) and --collector is off: nothing would feed "
        "the fleet's state (KV events, load, health), and every request would be placed blind. Add --collector "
        "(one gateway process), or set redis_url in the config and run `cognitora collector --config "
        f"{settings.config_path}` once beside the gateways. (--without-collector starts anyway, for measurements.)"
    )


def main(argv: list[str]) -> int:
    settings = parse_settings(argv)
    if settings.workers > 1:
        return _supervise(settings)
    return _serve(settings)


def _serve(settings: ExtprocSettings) -> int:
    jsonlog.configure(settings.log_level)
    loop_factory = None
    with contextlib.suppress(ImportError):
        import uvloop

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(_run(settings))


def _supervise(settings: ExtprocSettings) -> int:
    """``--workers N``: N service processes bound to the same port (SO_REUSEPORT); the kernel spreads Envoy's
    HTTP/2 connections over them (not its streams: see docs/envoy.md for the cluster settings that open several).

    Only with a shared store: each process has its own Router, so with the in-process store each would count only
    its own in-flight work and routed prefixes, and place blind to the others'. Stops them all when one exits.
    """
    import multiprocessing
    import multiprocessing.connection
    from dataclasses import replace

    from cognitora.config import load_config

    try:
        config = load_config(settings.config_path)
    except ConfigError as exc:
        print(f"cognitora extproc: {exc}", file=sys.stderr)
        return 2
    rule = deployment_problem(config.redis_url, collector_place(settings), settings.workers)
    if rule is DeploymentRule.WORKERS_NEED_SHARED_STORE:
        print(
            "cognitora extproc: --workers needs a shared store (redis_url in the config): with the in-process store "
            "each worker would place on its own partial view of the fleet",
            file=sys.stderr,
        )
        return 2
    if settings.listen.rsplit(":", 1)[-1] == "0":
        print(
            "cognitora extproc: --workers needs a fixed port (each worker would pick its own with port 0)",
            file=sys.stderr,
        )
        return 2
    worker_settings = replace(settings, workers=1, reuse_port=True)
    metrics = None
    if settings.metrics_listen is not None:
        metrics = SupervisorMetrics(settings.metrics_listen, settings.workers, CorsPolicy.of(config.metrics))
    if metrics is not None:
        jsonlog.configure(settings.log_level)
        try:
            metrics.start()
        except OSError as exc:
            print(f"cognitora extproc: --metrics-listen {settings.metrics_listen}: {exc}", file=sys.stderr)
            return 1
    spawn = multiprocessing.get_context("spawn")  # grpc does not survive fork()
    workers = [
        spawn.Process(
            target=_serve,
            args=(worker_settings if metrics is None else metrics.worker_settings(worker_settings, i),),
            daemon=False,
        )
        for i in range(settings.workers)
    ]
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.pid is not None and worker.exitcode is None:
                os.kill(worker.pid, signal.SIGTERM)

    def reload(signum: int, _frame: object) -> None:
        for worker in workers:
            if worker.pid is not None and worker.exitcode is None:
                os.kill(worker.pid, signal.SIGHUP)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    signal.signal(signal.SIGHUP, reload)  # each worker reloads its own config (cognitora.ops.reload)
    for worker in workers:
        worker.start()
    # The first worker to exit ends the service: a crash (or a port another instance holds) must be seen by the
    # supervisor that restarts this command, not hidden behind the workers that are still up.
    multiprocessing.connection.wait([w.sentinel for w in workers])
    if not stopping:
        stop(signal.SIGTERM, None)
    for worker in workers:
        worker.join()
    if metrics is not None:
        metrics.stop()
    codes = [w.exitcode or 0 for w in workers]
    return 0 if stopping and not any(codes) else max(1, *codes)
