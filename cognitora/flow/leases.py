"""Leases: one shared count per engine of the requests gateways have admitted to it, so that N gateway replicas
never admit more than the engine's capacity between them (docs/flow_control.md, "Across replicas").

The core takes a lease on the engine placement chose before it commits a request from the queue; refused (the
engine is full, counting every replica's leases), it tries the next candidate, else the request stays queued.
The lease is released when the attempt finishes. ``RedisLeases`` (``cognitora.flow.redis_leases``) shares them
through Redis, and releases a dead replica's within its heartbeat TTL; ``MemoryLeases`` is the same contract in
one process (one gateway, and the tests).

A grant may also charge the request's cost to its flow's shared fairness counter and read back the counters of
the flows this replica has waiting (``FairCharge``), in the same call: what ``FlowController.merge_served`` takes.

Each replica also shares what ``cognitora explain`` cannot learn itself, with its heartbeat: its queue depth per band
(``publish_depth``, read back summed by ``queued``) and its prediction margin (``publish_margin``, read back per
live replica by ``margins``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["LOCAL_REPLICA", "FairCharge", "LeaseGrant", "Leases", "MemoryLeases", "SharedMargin"]


@dataclass(frozen=True)
class FairCharge:
    """Charge ``cost`` to ``flow`` in ``band``'s shared counters, and read back ``peers``'."""

    band: str
    flow: str
    cost: float
    peers: tuple[str, ...] = ()


@dataclass(frozen=True)
class LeaseGrant:
    granted: bool
    held: int
    """Leases on the endpoint after the call, every replica's."""
    capacity: int
    served: dict[str, float] = field(default_factory=dict)
    """With a ``FairCharge`` and a grant: the shared counters of its flow and peers (cost served through every
    replica); else empty."""


@dataclass(frozen=True)
class SharedMargin:
    """One replica's prediction margin (``cognitora.flow.margin``) as it last published it."""

    factor: float
    samples: int
    """The achieved / predicted ratios it is the quantile of (the factor is 1 below ``margin.min_samples``)."""


class Leases(Protocol):
    async def acquire(
        self, endpoint: str, lease_id: str, capacity: int, charge: FairCharge | None = None
    ) -> LeaseGrant: ...

    async def release(self, endpoint: str, lease_id: str) -> None: ...

    async def charge(self, charge: FairCharge) -> dict[str, float]: ...

    async def held(self, endpoints: Sequence[str]) -> dict[str, int]: ...

    async def publish_depth(self, waiting: Mapping[str, int]) -> None:
        """This replica's queue depth per band, for ``queued`` (``cognitora explain``, the dashboard)."""
        ...

    async def queued(self) -> dict[str, int]:
        """Requests waiting per band in every live replica's queue."""
        ...

    def publish_margin(self, margin: SharedMargin) -> None:
        """This replica's prediction margin, for ``margins``. Kept for the next heartbeat: no I/O, so the first
        token that moved it (a synchronous call) pays nothing."""
        ...

    async def margins(self) -> dict[str, SharedMargin]:
        """The prediction margin each live replica published last, by replica id (a dead replica's is gone)."""
        ...

    async def close(self) -> None: ...


LOCAL_REPLICA = "local"
"""``MemoryLeases.margins``' one replica: this process."""


class MemoryLeases:
    """``Leases`` in one process: nothing to expire (they die with it), counters are this process's own."""

    def __init__(self) -> None:
        self._leases: dict[str, set[str]] = {}
        self._served: dict[tuple[str, str], float] = {}
        self._depth: dict[str, int] = {}
        self._margin: SharedMargin | None = None

    async def acquire(
        self, endpoint: str, lease_id: str, capacity: int, charge: FairCharge | None = None
    ) -> LeaseGrant:
        held = self._leases.setdefault(endpoint, set())
        if lease_id not in held:
            if len(held) >= capacity:
                return LeaseGrant(False, len(held), capacity)
            held.add(lease_id)
        served = await self.charge(charge) if charge is not None else {}
        return LeaseGrant(True, len(held), capacity, served)

    async def release(self, endpoint: str, lease_id: str) -> None:
        self._leases.get(endpoint, set()).discard(lease_id)

    async def charge(self, charge: FairCharge) -> dict[str, float]:
        key = (charge.band, charge.flow)
        self._served[key] = self._served.get(key, 0.0) + charge.cost
        flows = (charge.flow, *charge.peers)
        return {f: self._served.get((charge.band, f), 0.0) for f in flows}

    async def held(self, endpoints: Sequence[str]) -> dict[str, int]:
        return {e: len(self._leases.get(e, ())) for e in endpoints}

    async def publish_depth(self, waiting: Mapping[str, int]) -> None:
        self._depth = {band: n for band, n in waiting.items() if n > 0}

    async def queued(self) -> dict[str, int]:
        return dict(self._depth)

    def publish_margin(self, margin: SharedMargin) -> None:
        self._margin = margin

    async def margins(self) -> dict[str, SharedMargin]:
        return {} if self._margin is None else {LOCAL_REPLICA: self._margin}

    async def close(self) -> None:
        self._leases.clear()
