"""``RedisLeases``: ``Leases`` shared by gateway replicas through Redis or a Redis Cluster.

Semantics (docs/flow_control.md, "Across replicas", says the same with their limits):

- **A lease per admitted request per engine**, granted by one script (``redis_scripts.ACQUIRE``) only while the
  engine holds fewer than ``capacity`` live leases, every replica's counted. Idempotent per lease id: a retried
  acquire (a dropped connection) is granted again, not twice.
- **A replica's leases live as long as its heartbeat**: each replica renews ``L:replicas`` every third of
  ``replica_ttl_s`` (a task this class runs, ``start``); any script run after a replica's heartbeat expired
  releases all of its leases first. So a replica that dies releases what it held within ``replica_ttl_s`` (plus
  the time until any replica's next call: at most a third of the TTL while a replica lives). A clean ``close``
  releases them at once.
- **A lease never outlives ``max_lease_s``**, even on a live replica (a release lost to a bug).
- **A replica's queue depth and prediction margin ride on its heartbeat** (``publish_depth``, ``publish_margin``:
  kept until the next one, no round trip of their own) and are read back for the live replicas only (``queued``,
  ``margins``): a dead replica's stop counting when its heartbeat expires, and are deleted when it is reaped.
- Time is the Redis server's; nothing depends on the replicas' clocks agreeing.
- Redis unreachable: ``StoreUnavailable``, like the store (the core then dispatches unleased: placement's own
  saturation check still stands).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from redis.exceptions import RedisClusterException

from cognitora.flow import redis_scripts
from cognitora.flow.config import LeaseConfig
from cognitora.flow.leases import FairCharge, LeaseGrant, SharedMargin
from cognitora.flow.redis_keys import FlowKeys
from kvstate.redis_client import UNAVAILABLE_ERRORS, Client, Script, run_script, text
from kvstate.store import StoreUnavailable

__all__ = ["SERVED_KEEP_S", "RedisLeases"]

log = logging.getLogger(__name__)

SERVED_KEEP_S = 86_400.0
"""A band's shared fairness counters are dropped after a day without a dispatch in it."""


class RedisLeases:
    """See the module doc. ``client``: the store's (``RedisStore.client``) or one of its own; left open."""

    def __init__(self, client: Client, prefix: str, config: LeaseConfig, *, replica: str | None = None) -> None:
        self._client = client
        self.keys = FlowKeys(prefix)
        self.replica = replica or uuid.uuid4().hex
        if not self.replica or " " in self.replica:
            raise ValueError(f"a replica id holds no space, got {self.replica!r}")
        self._ttl_ms = int(config.replica_ttl_s * 1000)
        self._max_ms = int(config.max_lease_s * 1000)
        self._beat_s = config.replica_ttl_s / 3
        self._depth: dict[str, int] = {}
        self._margin: SharedMargin | None = None
        self._task: asyncio.Task[None] | None = None
        self._acquire = Script(redis_scripts.ACQUIRE)
        self._charge = Script(redis_scripts.CHARGE)
        self._release = Script(redis_scripts.RELEASE)
        self._heartbeat = Script(redis_scripts.HEARTBEAT)
        self._leave = Script(redis_scripts.LEAVE)
        self._held = Script(redis_scripts.HELD)
        self._queued = Script(redis_scripts.QUEUED)
        self._margins = Script(redis_scripts.MARGINS)

    @contextlib.contextmanager
    def _unavailable(self, what: str) -> Iterator[None]:
        try:
            yield
        except UNAVAILABLE_ERRORS as exc:
            raise StoreUnavailable(f"flow-control leases: Redis did not answer ({what}: {exc})") from exc
        except RedisClusterException as exc:
            if not isinstance(exc.__cause__, UNAVAILABLE_ERRORS):
                raise  # client-side misuse (keys of several slots in one call): a bug to show as it is
            raise StoreUnavailable(f"flow-control leases: the cluster did not answer ({what}: {exc})") from exc

    # -- leases ---------------------------------------------------------------------------------------------------
    async def acquire(
        self, endpoint: str, lease_id: str, capacity: int, charge: FairCharge | None = None
    ) -> LeaseGrant:
        k = self.keys
        keys = [k.replicas(), k.leases(endpoint), k.held(self.replica), k.depth()]
        args: list[Any] = [self.replica, lease_id, capacity, self._max_ms, self._ttl_ms, endpoint]
        args += [k.leases_base(), k.held_base()]
        if charge is not None:
            keys.append(k.served(charge.band))
            args += [charge.flow, repr(float(charge.cost)), int(SERVED_KEEP_S * 1000), *charge.peers]
        with self._unavailable("acquire"):
            granted, held, served = await run_script(self._client, self._acquire, keys, args)
        return LeaseGrant(bool(granted), int(held), capacity, _served(charge, served))

    async def release(self, endpoint: str, lease_id: str) -> None:
        with self._unavailable("release"):
            await run_script(
                self._client,
                self._release,
                [self.keys.leases(endpoint), self.keys.held(self.replica)],
                [self.replica, lease_id],
            )

    async def charge(self, charge: FairCharge) -> dict[str, float]:
        args = [charge.flow, repr(float(charge.cost)), int(SERVED_KEEP_S * 1000), *charge.peers]
        with self._unavailable("charge"):
            served = await run_script(self._client, self._charge, [self.keys.served(charge.band)], args)
        return _served(charge, served)

    async def held(self, endpoints: Sequence[str]) -> dict[str, int]:
        """Live leases per endpoint (a dead replica's no longer count, even before they are released)."""
        keys = [self.keys.replicas(), *(self.keys.leases(e) for e in endpoints)]
        with self._unavailable("held"):
            counts = await run_script(self._client, self._held, keys, [])
        return {e: int(n) for e, n in zip(endpoints, counts, strict=True)}

    # -- the replica's heartbeat, queue depth and prediction margin -----------------------------------------------
    async def heartbeat(self) -> None:
        """Renew this replica (releasing dead replicas' leases) and publish its queue depth and margin."""
        k = self.keys
        margin = "" if self._margin is None else f"{self._margin.factor!r} {self._margin.samples}"
        args: list[Any] = [self.replica, self._ttl_ms, self._max_ms, k.leases_base(), k.held_base(), margin]
        for band, n in self._depth.items():
            args += [band, n]
        with self._unavailable("heartbeat"):
            await run_script(self._client, self._heartbeat, [k.replicas(), k.depth(), k.margin()], args)
        self._depth = {band: n for band, n in self._depth.items() if n > 0}

    async def publish_depth(self, waiting: Mapping[str, int]) -> None:
        """Sent with the next heartbeat (a band that emptied is sent as 0 once, which removes it)."""
        self._depth = {**{band: 0 for band in self._depth}, **waiting}

    async def queued(self) -> dict[str, int]:
        with self._unavailable("queued"):
            flat = await run_script(self._client, self._queued, [self.keys.replicas(), self.keys.depth()], [])
        return {text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    def publish_margin(self, margin: SharedMargin) -> None:
        """Sent with every heartbeat from now on (each replaces the last)."""
        self._margin = margin

    async def margins(self) -> dict[str, SharedMargin]:
        with self._unavailable("margins"):
            flat = await run_script(self._client, self._margins, [self.keys.replicas(), self.keys.margin()], [])
        found: dict[str, SharedMargin] = {}
        for i in range(0, len(flat), 2):
            factor, samples = text(flat[i + 1]).split(" ")
            found[text(flat[i])] = SharedMargin(float(factor), int(samples))
        return found

    def start(self) -> None:
        """Renew the heartbeat every third of ``replica_ttl_s`` on the running loop, until ``close``."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._beat(), name="cognitora-flow-heartbeat")

    async def _beat(self) -> None:
        while True:
            try:
                await self.heartbeat()
            except StoreUnavailable as exc:
                log.warning("%s; this replica's leases lapse if it lasts over the heartbeat TTL", exc)
            await asyncio.sleep(self._beat_s)

    async def close(self) -> None:
        """Stop the heartbeat and release every lease of this replica now."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        k = self.keys
        with self._unavailable("leave"):
            await run_script(
                self._client,
                self._leave,
                [k.replicas(), k.depth(), k.margin()],
                [self.replica, k.leases_base(), k.held_base()],
            )


def _served(charge: FairCharge | None, values: Sequence[Any]) -> dict[str, float]:
    if charge is None or not values:
        return {}
    flows = (charge.flow, *charge.peers)
    return {flow: float(text(v)) for flow, v in zip(flows, values, strict=True)}
