"""The agent: sample a source every interval, serve the latest sample as a DCGM page at ``/metrics`` (and
``/healthz``, ``/readyz``: ready while the readings succeed).

    agent = NodeAgent(NvmlSource(), interval_s=1.0)
    await agent.start("0.0.0.0:9400")      # reads once before listening, so the first scrape has numbers
    ...
    await agent.stop()

Sampling is on the agent's own clock, as dcgm-exporter collects on its own interval: a scrape is answered from
memory and never waits on the driver. NVML calls block (briefly), so they run in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from typing import Protocol

from cognitora.metrics.serve import MetricsServer
from cognitora.node_agent.exposition import GpuReading, dcgm_page
from cognitora.ops.health import Readiness, sample_readiness

__all__ = ["DEFAULT_LISTEN", "NodeAgent", "Source"]

log = logging.getLogger(__name__)

DEFAULT_LISTEN = "0.0.0.0:9400"
"""dcgm-exporter's conventional port: a node runs one or the other."""


class Source(Protocol):
    name: str

    def read(self) -> list[GpuReading]: ...


class NodeAgent:
    """Serves ``source``'s readings under DCGM's names; ``page()`` is the current page (text)."""

    def __init__(self, source: Source, interval_s: float = 1.0, hostname: str | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"--interval-s must be positive, got {interval_s}")
        self.source = source
        self.interval_s = interval_s
        self.hostname = hostname or socket.gethostname()
        self.readings: list[GpuReading] = []
        self.samples = 0
        self._page = ""
        self.last_sample_at: float | None = None
        """``time.monotonic()`` of the last successful reading (``/readyz``: cognitora.ops.health)."""
        self._server = MetricsServer(self._page_bytes, probe=self._readiness)
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self._server.port

    def page(self) -> str:
        return self._page

    async def _page_bytes(self) -> bytes:
        return self._page.encode()

    async def sample(self) -> None:
        """Read the source once (in a thread) and rebuild the page."""
        try:
            readings = await asyncio.to_thread(self.source.read)
        except Exception:  # a bug or an unexpected driver error: keep serving the last page, try again next tick
            log.exception("reading the power source failed", extra={"source": self.source.name})
            return
        self.readings = readings
        self._page = dcgm_page(readings, self.hostname)
        self.samples += 1
        self.last_sample_at = time.monotonic()

    async def _readiness(self) -> Readiness:
        return sample_readiness(self.last_sample_at, self.interval_s)

    async def start(self, listen: str = DEFAULT_LISTEN) -> None:
        await self.sample()
        await self._server.start(listen)
        self._task = asyncio.create_task(self._run(), name="node-agent sampler")
        log.info(
            "node agent serving",
            extra={"listen": listen, "port": self.port, "source": self.source.name, "gpus": len(self.readings)},
        )

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            due += self.interval_s
            await asyncio.sleep(max(due - loop.time(), 0.0))
            await self.sample()
            now = loop.time()
            if due < now:  # fell behind (a slow driver call): skip the missed ticks rather than burst
                due = now

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._server.stop()
