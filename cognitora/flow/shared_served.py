"""Fairness across gateway replicas: the cost each flow was served through *other* replicas, added to this
replica's counters, so a team served heavily elsewhere waits its turn here too.

Replicas share one cumulative counter per (band, flow) in Redis (``L:served:<band>``, ``cognitora.flow.
redis_keys``): each dispatch adds its cost, and the same call reads back the counters of the flows this replica
has waiting (``leases.FairCharge``). This class remembers the last value seen per flow; what a counter grew by
since, less this replica's own charges, is what the others served: ``FairQueue.add_served`` adds it. The first
value seen of a flow is taken as the baseline, not as service (the flow's history before this replica saw it is
what the virtual-time lift forgives anyway).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SharedServed"]

MAX_TRACKED = 100_000
"""(band, flow) baselines kept; past it they are forgotten (each starts again from its next value)."""


class SharedServed:
    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], float] = {}

    def elsewhere(
        self, band: str, served: Mapping[str, float], charged: str | None = None, cost: float = 0.0
    ) -> dict[str, float]:
        """``served``: counters just read (after this replica charged ``cost`` to ``charged``, when it did). Returns
        what each flow was served through other replicas since the previous read (only those above 0)."""
        if len(self._seen) > MAX_TRACKED:
            self._seen.clear()
        out: dict[str, float] = {}
        for flow, value in served.items():
            key = (band, flow)
            seen = self._seen.get(key)
            self._seen[key] = value
            if seen is None:
                continue
            grown = value - seen - (cost if flow == charged else 0.0)
            if grown > 0:
                out[flow] = grown
        return out
