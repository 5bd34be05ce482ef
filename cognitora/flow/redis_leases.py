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
- Time is the Redis server's; nothing depends on the replicas' clocks agreeing.
- Redis unreachable: ``StoreUnavailable``, like the store (the core then dispatches unleased: placement's own
  saturation check still stands).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    ClusterDownError,
    NoScriptError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from cognitora.flow import redis_scripts
from cognitora.flow.config import LeaseConfig
from cognitora.flow.leases import FairCharge, LeaseGrant
from cognitora.flow.redis_keys import FlowKeys
from kvstate.redis_client import Client
from kvstate.store import StoreUnavailable

__all__ = ["SERVED_KEEP_S", "RedisLeases"]

log = logging.getLogger(__name__)

_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError, ClusterDownError, TryAgainError, SlotNotCoveredError)
"""Errors that mean Redis cannot serve now (the store's list, ``kvstate.redis_client``); any other is a bug to show."""

SERVED_KEEP_S = 86_400.0
"""A band's shared fairness counters are dropped after a day without a dispatch in it."""


class _Lua:
    """A script, run by SHA and loaded when the server does not know it (first use, a restart, a failover)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(self, client: Client, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if isinstance(client, RedisCluster):
            await client.initialize()  # route by slot from the first call (kvstate.redis_client.ScriptRunner.ready)
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await client.script_load(self.source)
            return await client.evalsha(self.sha, len(keys), *keys, *args)


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
        self._task: asyncio.Task[None] | None = None
        self._acquire = _Lua(redis_scripts.ACQUIRE)
        self._charge = _Lua(redis_scripts.CHARGE)
        self._release = _Lua(redis_scripts.RELEASE)
        self._heartbeat = _Lua(redis_scripts.HEARTBEAT)
        self._leave = _Lua(redis_scripts.LEAVE)
        self._held = _Lua(redis_scripts.HELD)
        self._queued = _Lua(redis_scripts.QUEUED)

    @contextlib.contextmanager
    def _unavailable(self, what: str) -> Iterator[None]:
        try:
            yield
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"flow-control leases: Redis did not answer ({what}: {exc})") from exc
        except RedisClusterException as exc:
            if not isinstance(exc.__cause__, _UNAVAILABLE):
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
            granted, held, served = await self._acquire(self._client, keys, args)
        return LeaseGrant(bool(granted), int(held), capacity, _served(charge, served))

    async def release(self, endpoint: str, lease_id: str) -> None:
        with self._unavailable("release"):
            await self._release(
                self._client, [self.keys.leases(endpoint), self.keys.held(self.replica)], [self.replica, lease_id]
            )

    async def charge(self, charge: FairCharge) -> dict[str, float]:
        args = [charge.flow, repr(float(charge.cost)), int(SERVED_KEEP_S * 1000), *charge.peers]
        with self._unavailable("charge"):
            served = await self._charge(self._client, [self.keys.served(charge.band)], args)
        return _served(charge, served)

    async def held(self, endpoints: Sequence[str]) -> dict[str, int]:
        """Live leases per endpoint (a dead replica's no longer count, even before they are released)."""
        keys = [self.keys.replicas(), *(self.keys.leases(e) for e in endpoints)]
        with self._unavailable("held"):
            counts = await self._held(self._client, keys, [])
        return {e: int(n) for e, n in zip(endpoints, counts, strict=True)}

    # -- the replica's heartbeat and queue depth ------------------------------------------------------------------
    async def heartbeat(self) -> None:
        """Renew this replica (releasing dead replicas' leases) and publish its queue depth."""
        k = self.keys
        args: list[Any] = [self.replica, self._ttl_ms, self._max_ms, k.leases_base(), k.held_base()]
        for band, n in self._depth.items():
            args += [band, n]
        with self._unavailable("heartbeat"):
            await self._heartbeat(self._client, [k.replicas(), k.depth()], args)
        self._depth = {band: n for band, n in self._depth.items() if n > 0}

    async def publish_depth(self, waiting: Mapping[str, int]) -> None:
        """Sent with the next heartbeat (a band that emptied is sent as 0 once, which removes it)."""
        self._depth = {**{band: 0 for band in self._depth}, **waiting}

    async def queued(self) -> dict[str, int]:
        with self._unavailable("queued"):
            flat = await self._queued(self._client, [self.keys.replicas(), self.keys.depth()], [])
        return {_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

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
            await self._leave(self._client, [k.replicas(), k.depth()], [self.replica, k.leases_base(), k.held_base()])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _served(charge: FairCharge | None, values: Sequence[Any]) -> dict[str, float]:
    if charge is None or not values:
        return {}
    flows = (charge.flow, *charge.peers)
    return {flow: float(_text(v)) for flow, v in zip(flows, values, strict=True)}
