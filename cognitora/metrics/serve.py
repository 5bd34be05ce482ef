"""The metrics page over HTTP (aiohttp): ``GET /metrics``, readable by a page from any origin.

    server = MetricsServer(exporter.page)
    await server.start("127.0.0.1:9464")     # or start_unix(path); server.port is the port bound (0 picks one)

CORS: every answer carries ``Access-Control-Allow-Origin: *``, and an ``OPTIONS`` preflight on any path is answered
``204`` (methods GET, OPTIONS; the headers the browser asked for), with ``Access-Control-Allow-Private-Network:
true`` when Chrome asks (a public page reading a private address). The page holds no credential and accepts none,
so a wildcard origin exposes nothing a direct GET would not. A dashboard opened from ``file://`` (origin ``null``)
reads it too.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from cognitora.failsafe import RateLimitedLog
from cognitora.metrics.exporter import CONTENT_TYPE

__all__ = ["METRICS_PATH", "MetricsServer", "cors_headers", "parse_listen", "serve_page"]

log = logging.getLogger("cognitora.metrics")

METRICS_PATH = "/metrics"

Page = Callable[[], Awaitable[bytes]]


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6) -> (host, port); ``ValueError`` saying what is wrong."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{value!r}: expected HOST:PORT, e.g. 127.0.0.1:9464 or 0.0.0.0:9464")
    return host.strip("[]"), int(port)


def cors_headers(request_headers: dict[str, str] | None = None) -> dict[str, str]:
    """The CORS headers of an answer; with a preflight's request headers, those of its answer."""
    headers = {"Access-Control-Allow-Origin": "*"}
    if request_headers is None:
        return headers
    headers["Access-Control-Allow-Methods"] = "GET, OPTIONS"
    asked = request_headers.get("Access-Control-Request-Headers")
    if asked:
        headers["Access-Control-Allow-Headers"] = asked
    if request_headers.get("Access-Control-Request-Private-Network", "").lower() == "true":
        headers["Access-Control-Allow-Private-Network"] = "true"
    headers["Access-Control-Max-Age"] = "600"
    return headers


class MetricsServer:
    """Serves ``page()`` at ``/metrics`` (and ``/``) until ``stop()``."""

    def __init__(self, page: Page) -> None:
        self._page = page
        self._runner: web.AppRunner | None = None
        self._errors = RateLimitedLog(log)
        self.port = 0
        """The TCP port bound (after ``start``)."""

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[_cors])
        app.router.add_get(METRICS_PATH, self._metrics)
        app.router.add_get("/", self._metrics)
        return app

    async def start(self, listen: str) -> None:
        """Listen on ``HOST:PORT`` (port 0: a free one, see ``port``)."""
        host, port = parse_listen(listen)
        runner = await self._setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        addresses = runner.addresses  # what was bound: the port, when 0 asked for a free one
        self.port = int(addresses[0][1]) if addresses else port

    async def start_unix(self, path: str) -> None:
        """Listen on a unix socket (the workers of ``cognitora extproc --workers N``)."""
        runner = await self._setup()
        await web.UnixSite(runner, path).start()

    async def _setup(self) -> web.AppRunner:
        runner = web.AppRunner(self._app(), access_log=None, handle_signals=False)
        await runner.setup()
        self._runner = runner
        return runner

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        try:
            body = await self._page()
        except Exception as exc:  # a page that cannot be made is a failed scrape, never a dead server
            self._errors.error("metrics page failed", exc)
            return web.Response(status=503, text=f"metrics unavailable: {type(exc).__name__}: {exc}\n")
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


@web.middleware
async def _cors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    if request.method == "OPTIONS":
        return web.Response(status=204, headers=cors_headers(dict(request.headers)))
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # 404, 405: still readable by the page that asked
        exc.headers.update(cors_headers())
        raise
    response.headers.update(cors_headers())
    return response


async def serve_page(page: Page, listen: str, process: str) -> MetricsServer:
    """Start serving ``page`` on ``listen`` and log where (``OSError`` when the address cannot be bound)."""
    server = MetricsServer(page)
    await server.start(listen)
    host, _ = parse_listen(listen)
    shown = f"[{host}]" if ":" in host else host
    log.info(
        "metrics on http://%s:%d%s",
        shown,
        server.port,
        METRICS_PATH,
        extra={"serving": process, "metrics_port": server.port},
    )
    return server
