"""What the gateway queue records per request that leaves it: a wait-time histogram by band, flow and how it left,
and one JSON log line (``cognitora.flow`` logger: ``band``, ``flow``, ``how``, ``waited_s``, ``wake``, ``aged``).

The counters and depths of ``FlowController.snapshot`` are the rest (``cognitora.metrics`` exports both). Flow
labels are trusted identities (``team:<name>``, ``key:<id>``); their cardinality is bounded: the first
``MAX_FLOW_LABELS`` flows seen keep their name, any later one is ``other``.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from cognitora.flow.outcome import Departure, Left
from cognitora.telemetry import Histogram

__all__ = ["MAX_FLOW_LABELS", "WAIT_SECONDS_BUCKETS", "FlowTelemetry"]

log = logging.getLogger("cognitora.flow")

MAX_FLOW_LABELS = 32
WAIT_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


@dataclass
class FlowTelemetry:
    waits: dict[tuple[str, str, str], Histogram] = field(default_factory=dict)
    """(band, flow label, how it left) -> seconds waited."""
    holds: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(where, reason) -> holds: ``admission`` (a request that joined the queue held by the rule) or ``queue`` (a
    try from the queue that stayed held); ``seats``, ``kv``, ``slo``, ``priority`` or ``isolation``."""
    _labels: set[str] = field(default_factory=set)

    def held(self, where: str, reason: str) -> None:
        self.holds[where, reason] += 1

    def flow_label(self, flow: str) -> str:
        if flow in self._labels:
            return flow
        if len(self._labels) < MAX_FLOW_LABELS:
            self._labels.add(flow)
            return flow
        return "other"

    def departed(self, d: Departure) -> None:
        """The ``FlowController``'s observer: one call per request that leaves the queue."""
        key = (d.band, self.flow_label(d.flow), d.how.value)
        hist = self.waits.get(key)
        if hist is None:
            hist = self.waits[key] = Histogram(WAIT_SECONDS_BUCKETS)
        hist.observe(d.waited_s)
        level = logging.INFO if d.how is Left.DISPATCHED else logging.WARNING
        log.log(
            level,
            "left the gateway queue",
            extra={
                "band": d.band,
                "flow": d.flow,
                "how": d.how.value,
                "waited_s": round(d.waited_s, 4),
                "wake": None if d.wake is None else d.wake.value,
                "aged": d.aged,
            },
        )
