"""llama.cpp ``GET /slots`` as the scraper polls it: busy slots and context size, per endpoint.

``llama-server`` lists its ``-np`` slots at ``/slots`` (on by default in recent builds; engines.md 4.2). The page
says what ``/metrics`` cannot: how many slots there are (the engine's concurrency) and each slot's ``n_ctx`` (the
largest is a lower bound of the KV the server holds: ``SlotsLoad.n_ctx``). It also works on a server started
without ``--metrics``. It does not show a slot's cached prompt unless the server runs with slot debugging on
(llama.cpp's ``to_json(only_metrics)``), so prefix locality stays the router's routing history.

Discovery, no setting to keep in sync: the first answer decides. 404 (a build without the route) or 501 (started
with ``--no-slots``: "This server does not support slots endpoint") turns polling off for this endpoint, logged
once; the load then comes from ``/metrics`` alone. ``engine_pulls.llamacpp_slots: false`` never asks. A body of
another shape is logged once per streak and the last good reading is kept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import httpx

from kvstate.engines.llamacpp import SlotsLoad, slots_load
from kvstate.store import EndpointSnapshot

__all__ = ["SlotsPoll"]

log = logging.getLogger(__name__)

ABSENT_STATUSES = frozenset({404, 501})
"""Statuses that mean "this server has no /slots": stop asking."""


@dataclass
class SlotsPoll:
    """One endpoint's ``/slots`` state: whether to poll it, and what it said last."""

    endpoint_id: str
    url: str
    enabled: bool = True
    """False once the server said it has no /slots (404, 501)."""
    load: SlotsLoad | None = None
    """The last reading (None: none yet, or the route is off)."""
    broken: bool = False
    """The last answer was unreadable: log only the first of a streak."""

    def poll_url(self) -> str | None:
        """What to GET this round (None once polling is off)."""
        return self.url if self.enabled else None

    def read(self, result: httpx.Response | httpx.HTTPError | None) -> None:
        """Take one round's answer. A transport error or another status keeps the last reading (the health check
        decides whether the endpoint is up)."""
        if result is None or not self.enabled:
            return
        if isinstance(result, httpx.Response) and result.status_code in ABSENT_STATUSES:
            self.enabled = False
            self.load = None
            log.info(
                "llama.cpp /slots not served (HTTP %d); load from /metrics only",
                result.status_code,
                extra={"endpoint": self.endpoint_id, "status": result.status_code},
            )
            return
        if not isinstance(result, httpx.Response) or not result.is_success:
            reason = repr(result) if isinstance(result, Exception) else f"HTTP {result.status_code}"
            self._problem("llama.cpp /slots fetch failed", reason)
            return
        try:
            self.load = slots_load(result.content)
        except ValueError as exc:
            self._problem("llama.cpp /slots body unreadable; keeping the last reading", str(exc))
            return
        self.broken = False

    def _problem(self, msg: str, reason: str) -> None:
        if not self.broken:
            log.warning(msg, extra={"endpoint": self.endpoint_id, "reason": reason})
        self.broken = True

    def apply(self, snapshot: EndpointSnapshot) -> EndpointSnapshot:
        """The snapshot with what /slots says: running = busy slots (the same moment the page was read, and known
        without ``--metrics``), seats = the slots, and the KV capacity = the largest slot's ``n_ctx`` when metrics
        did not give one."""
        if self.load is None:
            return snapshot
        capacity = snapshot.kv_capacity_tokens or self.load.n_ctx
        return replace(snapshot, running=self.load.busy, seats=self.load.slots, kv_capacity_tokens=capacity)
