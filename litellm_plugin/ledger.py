"""``PlacementLedger``: the attempts the strategy placed and dispatched, until LiteLLM reports how each ended.

LiteLLM tells us an attempt's end through several callbacks (a deployment failure hook, success and failure
events, in sync and async flavours, some of which can fire twice for one attempt). The ledger makes the core hear
about each attempt exactly once: whoever ``take``s an entry first reports it. Entries are keyed by the placement id
the strategy writes into the request's metadata, and grouped by LiteLLM's trace id so a retry can settle earlier
attempts of the same request that ended without any callback.

Thread-safe: LiteLLM runs sync logging callbacks on worker threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cognitora.decision import Decision

if TYPE_CHECKING:
    from litellm_plugin.runtime import CoreHost, Spawned


@dataclass
class Placement:
    """One attempt: its decision, the core that made it, and the request it belongs to."""

    decision: Decision
    host: CoreHost
    trace_id: str | None
    dispatch: Spawned | None = None
    """The in-flight count's store write, started as the deployment is returned; settled before the release."""
    opened_at: float = field(default_factory=time.monotonic)


class PlacementLedger:
    def __init__(self, max_age_s: float = 900.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._open: dict[str, Placement] = {}
        self._by_trace: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        self._max_age_s = max_age_s
        self._clock = clock
        self._next_prune = 0.0

    def open(self, placement: Placement) -> None:
        now = self._clock()
        rid = placement.decision.request_id
        with self._lock:
            self._open[rid] = placement
            if placement.trace_id is not None:
                self._by_trace.setdefault(placement.trace_id, set()).add(rid)
            if now >= self._next_prune:
                self._prune(now)

    def get(self, request_id: str) -> Placement | None:
        with self._lock:
            return self._open.get(request_id)

    def take(self, request_id: str) -> Placement | None:
        """Remove and return the attempt; None if it was already reported (or never opened)."""
        with self._lock:
            return self._pop(request_id)

    def take_trace(self, trace_id: str | None, keep: str | None = None) -> list[Placement]:
        """Remove and return every open attempt of one request (except ``keep``)."""
        if trace_id is None:
            return []
        with self._lock:
            ids = [rid for rid in self._by_trace.get(trace_id, ()) if rid != keep]
            return [p for p in (self._pop(rid) for rid in ids) if p is not None]

    def _pop(self, request_id: str) -> Placement | None:
        placement = self._open.pop(request_id, None)
        if placement is not None and placement.trace_id is not None:
            ids = self._by_trace.get(placement.trace_id)
            if ids is not None:
                ids.discard(request_id)
                if not ids:
                    del self._by_trace[placement.trace_id]
        return placement

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)

    def _prune(self, now: float) -> None:
        # An attempt whose end LiteLLM never reported (a client that vanished mid-stream): the store's in-flight
        # lease expires on its own after the same age, so forgetting it here loses nothing.
        stale = [rid for rid, p in self._open.items() if now - p.opened_at > self._max_age_s]
        for rid in stale:
            self._pop(rid)
        self._next_prune = now + min(60.0, self._max_age_s)
