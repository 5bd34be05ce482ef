"""``grpc.health.v1.Health`` on the ext_proc server: what Envoy's ``grpc_health_check`` (examples/envoy.yaml) and a
Kubernetes gRPC probe read. The servicer is grpcio-health-checking's; this module adds one thing to it: it notices
when a checker has been told NOT_SERVING, so a drain (``cognitora.ops.drain``) stops accepting streams only once
the proxy in front knows to send them elsewhere.

SERVING (for the server as a whole, ``""``, and for the ext_proc service by name) once the server has started;
NOT_SERVING for good from the start of a drain.
"""

from __future__ import annotations

import asyncio
import math
import time

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

__all__ = ["ExtprocHealth", "add_health"]

EXT_PROC_SERVICE = external_processor_pb2.DESCRIPTOR.services_by_name["ExternalProcessor"].full_name
"""``envoy.service.ext_proc.v3.ExternalProcessor``: a checker may ask for it by name (``service_name``)."""


class ExtprocHealth(HealthServicer):
    """grpcio-health-checking's asyncio servicer; ``seen_not_serving`` is set once a Check answered NOT_SERVING
    after ``start_draining``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen_not_serving = asyncio.Event()
        self._draining = False
        self._last_check: float | None = None
        self._gap_s: float | None = None
        """Seconds between the last two Checks: the checker's interval, as seen from here."""

    def next_check_within(self) -> float | None:
        """How long until a checker should ask again: twice its observed interval, from now; ``math.inf`` when it
        has asked only once (it exists, its interval is unknown: the drain waits its whole announce bound, as a
        proxy that checked a just-started replica once does come back); None when nobody has asked, and a drain
        need not wait for anyone."""
        if self._last_check is None:
            return None
        if self._gap_s is None:
            return math.inf
        return 2 * self._gap_s

    async def serving(self) -> None:
        for service in ("", EXT_PROC_SERVICE):
            await self.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def start_draining(self) -> None:
        self._draining = True
        await self.enter_graceful_shutdown()

    async def Check(  # the gRPC method's name
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        now = time.monotonic()
        if self._last_check is not None:
            self._gap_s = now - self._last_check
        self._last_check = now
        response: health_pb2.HealthCheckResponse = await super().Check(request, context)
        if self._draining and response.status == health_pb2.HealthCheckResponse.NOT_SERVING:
            self.seen_not_serving.set()
        return response


def add_health(server: grpc.aio.Server) -> ExtprocHealth:
    """Register the health service on ``server`` (before it starts); call ``serving()`` once it has."""
    health = ExtprocHealth()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    return health
