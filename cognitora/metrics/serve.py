"""The metrics page over HTTP (aiohttp): ``GET /metrics``, readable from a browser by the origins the operator lists.

    server = MetricsServer(exporter.page, CorsPolicy.of(config.metrics))
    await server.start("127.0.0.1:9464")     # or start_unix(path); server.port is the port bound (0 picks one)

CORS (``cognitora.metrics.cors``): an answer to a listed origin carries ``Access-Control-Allow-Origin`` with it, an
``OPTIONS`` preflight on any path is answered ``204`` (with the allowed methods and headers for a listed origin, no
CORS header for another); by default only the dashboard opened from disk (origin ``null``) is listed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from cognitora.failsafe import RateLimitedLog
from cognitora.metrics.cors import CorsPolicy
from cognitora.metrics.exporter import CONTENT_TYPE
from cognitora.ops.health import HEALTHZ_PATH, READYZ_PATH, Probe, probe_answer

__all__ = ["METRICS_PATH", "MetricsServer", "parse_listen", "serve_page"]

log = logging.getLogger("cognitora.metrics")

METRICS_PATH = "/metrics"

Page = Callable[[], Awaitable[bytes]]


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6) -> (host, port); ``ValueError`` saying what is wrong."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{value!r}: expected HOST:PORT, e.g. 127.0.0.1:9464 or 0.0.0.0:9464")
    return host.strip("[]"), int(port)


class MetricsServer:
    """Serves ``page()`` at ``/metrics`` (and ``/``) until ``stop()``."""

    def __init__(self, page: Page, cors: CorsPolicy | None = None, probe: Probe | None = None) -> None:
        self._page = page
        self._cors = cors or CorsPolicy()
        self._probe = probe
        """With one: ``/healthz`` and ``/readyz`` beside ``/metrics`` (``cognitora.ops.health``)."""
        self._runner: web.AppRunner | None = None
        self._errors = RateLimitedLog(log)
        self.port = 0
        """The TCP port bound (after ``start``)."""

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._cors_middleware])
        app.router.add_get(METRICS_PATH, self._metrics)
        app.router.add_get("/", self._metrics)
        if self._probe is not None:
            app.router.add_get(HEALTHZ_PATH, self._healthz)
            app.router.add_get(READYZ_PATH, self._readyz)
        return app

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        assert self._probe is not None
        status, body = await probe_answer(self._probe)
        return web.json_response(body, status=status)

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

    @web.middleware
    async def _cors_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        asked = dict(request.headers)
        if request.method == "OPTIONS":
            return web.Response(status=204, headers=self._cors.headers(asked, preflight=True))
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # 404, 405: still readable by a page that may read the metrics
            exc.headers.update(self._cors.headers(asked))
            raise
        response.headers.update(self._cors.headers(asked))
        return response

    async def _metrics(self, request: web.Request) -> web.Response:
        try:
            body = await self._page()
        except Exception as exc:  # a page that cannot be made is a failed scrape, never a dead server
            self._errors.error("metrics page failed", exc)
            return web.Response(status=503, text=f"metrics unavailable: {type(exc).__name__}: {exc}\n")
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def serve_page(
    page: Page, listen: str, process: str, cors: CorsPolicy | None = None, probe: Probe | None = None
) -> MetricsServer:
    """Start serving ``page`` on ``listen`` and log where (``OSError`` when the address cannot be bound); with
    ``probe``, ``/healthz`` and ``/readyz`` too."""
    server = MetricsServer(page, cors, probe)
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
