"""The plugin's metrics page (docs/metrics.md), inside the LiteLLM proxy or an SDK script.

Two ``routing_strategy_args`` keys, read here and never passed on to the fleet's config:

- ``metrics_path`` (default ``/cognitora/metrics``; ``""`` turns it off): in the proxy, the page is a route of the
  proxy's own app, on its own port. LiteLLM 1.108.7 does the same for its Prometheus callback
  (``PrometheusLogger._mount_metrics_endpoint`` mounts an app on ``litellm.proxy.proxy_server.app``); the route is
  added with Starlette's public ``add_route`` on that app: nothing of LiteLLM's is patched. Like every route of
  the proxy it passes the proxy's middleware: its CORS policy (``LITELLM_CORS_ORIGINS``, every origin by default:
  set it) applies to the page's GETs, and no key is asked for (the page holds counts and endpoint addresses, no
  request content, no secret).
- ``metrics_listen`` (``HOST:PORT``, default none): the page on a port of its own (aiohttp, CORS only to
  ``metrics.cors_origins``, as ``cognitora extproc --metrics-listen``), for SDK scripts, or to keep it off the proxy's
  port (and off LiteLLM's CORS policy).

The page is the core's: it is rendered on the core's loop (``CoreHost.call``), so asking for it starts the core
(and, in embedded mode, its collector) when no request has yet.

With ``--num_workers N`` (Redis mode) each proxy worker has its own core: a GET on the proxy's port reaches one
worker and shows that worker's counts (the fleet's gauges, read from the shared store, are the same in every
worker). ``cognitora_info`` carries no worker id; see docs/metrics.md for what to scrape instead.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cognitora.config import ConfigError
from cognitora.core.router import Router
from cognitora.metrics.cors import CorsPolicy
from cognitora.metrics.exporter import CONTENT_TYPE, Exporter
from cognitora.metrics.serve import MetricsServer, parse_listen, serve_page
from litellm_plugin.runtime import CoreHost

__all__ = ["ARGS_KEYS", "DEFAULT_PATH", "MetricsPages", "MetricsSettings", "split_args"]

log = logging.getLogger("cognitora.litellm")

PROCESS = "litellm"
DEFAULT_PATH = "/cognitora/metrics"
ARGS_KEYS = ("metrics_path", "metrics_listen")
"""The ``routing_strategy_args`` keys of this module."""
_PROXY_MODULE = "litellm.proxy.proxy_server"


@dataclass(frozen=True)
class MetricsSettings:
    path: str | None = DEFAULT_PATH
    """Route on the proxy's app; None: none."""
    listen: str | None = None
    """``HOST:PORT`` of a page of its own; None: none."""


def split_args(args: Mapping[str, Any] | None) -> tuple[MetricsSettings, dict[str, Any]]:
    """This module's keys of ``routing_strategy_args``, checked, and the rest (the fleet's config)."""
    rest = dict(args or {})
    path = rest.pop("metrics_path", DEFAULT_PATH)
    listen = rest.pop("metrics_listen", None)
    if path is False or path == "":
        path = None
    if path is not None and (not isinstance(path, str) or not path.startswith("/")):
        raise ConfigError(f"routing_strategy_args.metrics_path: expected a URL path like {DEFAULT_PATH}, got {path!r}")
    if listen is not None:
        try:
            parse_listen(str(listen))
        except ValueError as exc:
            raise ConfigError(f"routing_strategy_args.metrics_listen: {exc}") from None
        listen = str(listen)
    return MetricsSettings(path=path, listen=listen), rest


class _Page:
    """One strategy's page: its core's Router and collector, rendered on the core's loop."""

    def __init__(self, host: CoreHost) -> None:
        self.host = host
        self._exporters: weakref.WeakKeyDictionary[Router, Exporter] = weakref.WeakKeyDictionary()

    async def render(self) -> bytes:
        return await self.host.call(self._render)

    async def _render(self, router: Router) -> bytes:
        exporter = self._exporters.get(router)
        if exporter is None:
            exporter = Exporter(self.host.config, PROCESS, router=router, collector=self.host.collector)
            self._exporters[router] = exporter
        return await exporter.page()


class MetricsPages:
    """Every installed strategy's page in this process (one instance, the installed ``Plugin``'s): the proxy's
    route serves the newest strategy's; a ``metrics_listen`` page has its own server."""

    def __init__(self) -> None:
        self._pages: dict[int, _Page] = {}
        """id(host) -> its page."""
        self._servers: dict[int, MetricsServer] = {}
        self._route_paths: set[str] = set()

    def attach(self, host: CoreHost, settings: MetricsSettings) -> None:
        """Serve ``host``'s page as ``settings`` says (see the module docstring)."""
        page = _Page(host)
        self._pages[id(host)] = page
        if settings.path is not None and _PROXY_MODULE in sys.modules:
            self._add_proxy_route(settings.path, CorsPolicy.of(host.config.metrics))
        if settings.listen is not None:
            self._start_server(host, page, settings.listen)

    def detach(self, host: CoreHost) -> None:
        """Stop serving ``host``'s page (its strategy is being uninstalled)."""
        self._pages.pop(id(host), None)
        server = self._servers.pop(id(host), None)
        if server is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None and host.loop is loop:
            loop.create_task(server.stop())
        elif host.loop is not None and host.loop.is_running():
            asyncio.run_coroutine_threadsafe(server.stop(), host.loop).result(timeout=10)

    def newest(self) -> _Page | None:
        """The page of the strategy installed last, or None."""
        return next(reversed(self._pages.values()), None)

    def _start_server(self, host: CoreHost, page: _Page, listen: str) -> None:
        async def start(_: Router) -> None:
            self._servers[id(host)] = await serve_page(page.render, listen, PROCESS, CorsPolicy.of(host.config.metrics))

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is None:
            host.call_sync(start)  # an SDK script: the core's own thread; an address in use fails here, loudly
            return
        task = running.create_task(host.call(start))  # the proxy builds its Router inside its startup coroutine
        task.add_done_callback(_report_start)

    def _add_proxy_route(self, path: str, cors: CorsPolicy) -> None:
        if path in self._route_paths:
            return
        from starlette.requests import Request
        from starlette.responses import Response

        proxy = sys.modules[_PROXY_MODULE]
        app = getattr(proxy, "app", None)
        if app is None:
            log.warning("LiteLLM proxy has no app to add %s to; set routing_strategy_args.metrics_listen instead", path)
            return

        async def metrics_route(request: Request) -> Response:
            if request.method == "OPTIONS":  # a preflight the proxy's CORS middleware did not answer itself
                return Response(status_code=204, headers=cors.headers(dict(request.headers), preflight=True))
            page = self.newest()
            if page is None:
                return Response("no Cognitora routing strategy is installed\n", status_code=503)
            try:
                body = await page.render()
            except Exception as exc:  # a failed scrape, not a failed proxy
                log.warning("cognitora metrics page failed: %s", exc)
                return Response(f"metrics unavailable: {type(exc).__name__}\n", status_code=503)
            return Response(body, headers={"Content-Type": CONTENT_TYPE})

        # Starlette's public add_route on the proxy's app: nothing of LiteLLM's is patched. A route cannot be taken
        # out of a running app, so after uninstall() it answers 503.
        app.add_route(path, metrics_route, methods=["GET", "OPTIONS"], include_in_schema=False)
        self._route_paths.add(path)
        log.info("cognitora metrics on the proxy's port at %s", path)


def _report_start(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("cognitora metrics page could not start: %s", task.exception())
