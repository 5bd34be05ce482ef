"""The fleet's per-endpoint state on Redis: in-flight work, snapshots, health marks and heartbeats, in the fleet slot.

One half of ``RedisStore`` (``kvstate.redis_store``; the other is ``kvstate.redis_index``). Keys: the fleet slot of
``kvstate.redis_keys``; the Lua: ``kvstate.redis_fleet_scripts``. Time comes from the Redis server (``TIME``), so
gateways with skewed clocks agree on what has expired.

- In-flight requests are members of a ZSET scored by expiry, so a gateway that dies stops counting after its TTL.
- What ``fleet_view`` reads of this slot is one read-only script (``state_call``, ``read_state``): the in-flight
  totals, health marks, heartbeats and snapshots. Snapshots are sent back only when they changed since this store
  last read them: every ``put_snapshot`` replaces a version token, and the caller passes the token it holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

from kvstate import redis_fleet_scripts as fleet_scripts
from kvstate.redis_client import Call, Script, ScriptRunner, text
from kvstate.redis_keys import RedisKeys
from kvstate.redis_snapshot import decode_snapshot, encode_snapshot
from kvstate.store import EndpointSnapshot, HealthMark, Heartbeat, InFlight

__all__ = ["FLEET_CALLS_KEPT", "FleetRead", "FleetState", "StateCall"]

FLEET_CALLS_KEPT = 64
"""Endpoint lists whose ``fleet_view`` script keys are kept built (a router asks for one per model)."""


def _pairs(flat: Sequence[Any]) -> dict[Any, Any]:
    """An HGETALL reply from a script (a flat field, value list) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _marks(flat: Sequence[Any]) -> dict[str, HealthMark]:
    """A flat endpoint, since (ms), reason list from a script as marks."""
    return {
        text(flat[i]): HealthMark(since=int(flat[i + 1]) / 1000, reason=text(flat[i + 2]))
        for i in range(0, len(flat), 3)
    }


def _beats(flat: Sequence[Any]) -> dict[str, Heartbeat]:
    """A flat name, at (ms), age (ms) list from a script as heartbeats."""
    return {
        text(flat[i]): Heartbeat(at=int(flat[i + 1]) / 1000, age_s=int(flat[i + 2]) / 1000)
        for i in range(0, len(flat), 3)
    }


class StateCall(NamedTuple):
    """``FleetState.state_call``: one ``FLEET_STATE`` call, and what ``read_state`` needs to read its reply."""

    known: list[str]
    """The endpoints asked for, without repeats, in the reply's order."""
    call: Call
    snapshots: dict[str, EndpointSnapshot | None]
    """The snapshots this store held when the call was built (a concurrent read may replace them meanwhile)."""


class FleetRead(NamedTuple):
    """What ``FleetState.read_state`` read of a ``FLEET_STATE`` reply."""

    inflight: dict[str, InFlight]
    snapshots: dict[str, EndpointSnapshot]
    health_marks: dict[str, HealthMark]
    heartbeats: dict[str, Heartbeat]


class FleetState:
    """The fleet slot, on the ``ScriptRunner`` of a ``RedisStore``."""

    def __init__(self, runner: ScriptRunner, keys: RedisKeys) -> None:
        self._runner = runner
        self._keys = keys
        self._inflight_add = Script(fleet_scripts.INFLIGHT_ADD)
        self._inflight_prefill_done = Script(fleet_scripts.INFLIGHT_PREFILL_DONE)
        self._inflight_read = Script(fleet_scripts.INFLIGHT_READ)
        self._inflight_release = Script(fleet_scripts.INFLIGHT_RELEASE)
        self._put_snapshot = Script(fleet_scripts.PUT_SNAPSHOT)
        self._fleet_state = Script(fleet_scripts.FLEET_STATE)
        self._mark_unhealthy = Script(fleet_scripts.MARK_UNHEALTHY)
        self._health_read = Script(fleet_scripts.HEALTH_READ)
        self._put_heartbeat = Script(fleet_scripts.PUT_HEARTBEAT)
        self._heartbeats_read = Script(fleet_scripts.HEARTBEATS_READ)
        self._fleet_calls: dict[tuple[str, ...], tuple[list[str], list[str]]] = {}
        # The snapshots of ``_snapshot_version``, for the endpoints read since it became current (None: none).
        self._snapshot_version = ""
        self._snapshot_cache: dict[str, EndpointSnapshot | None] = {}

    # -- in-flight work -------------------------------------------------------------------------------------
    def inflight_keys(self, endpoint: str) -> list[str]:
        """The in-flight keys of ``endpoint`` (KEYS of the in-flight scripts)."""
        return [self._keys.inflight(endpoint), self._keys.inflight_tokens(endpoint)]

    async def inflight_add(
        self, endpoint: str, request_id: str, prefill_tokens: int, decode_tokens: int, ttl_s: float
    ) -> None:
        ttl_ms = max(1, round(ttl_s * 1000))
        args = [request_id, max(0, int(prefill_tokens)), max(0, int(decode_tokens)), ttl_ms]
        with self._runner.unavailable("inflight_add"):
            await self._runner.run(self._inflight_add, self.inflight_keys(endpoint), args)

    async def inflight_prefill_done(self, endpoint: str, request_id: str) -> None:
        with self._runner.unavailable("inflight_prefill_done"):
            await self._runner.run(self._inflight_prefill_done, self.inflight_keys(endpoint), [request_id])

    async def inflight_release(self, endpoint: str, request_id: str) -> None:
        with self._runner.unavailable("inflight_release"):
            await self._runner.run(self._inflight_release, self.inflight_keys(endpoint), [request_id])

    async def inflight(self, endpoints: Sequence[str]) -> dict[str, InFlight]:
        if not endpoints:
            return {}
        calls: list[Call] = [(self._inflight_read, self.inflight_keys(e), []) for e in endpoints]
        with self._runner.unavailable("inflight"):
            rows = await self._runner.run_many(calls)
        return {e: InFlight(int(r[0]), int(r[1]), int(r[2])) for e, r in zip(endpoints, rows, strict=True)}

    # -- endpoint snapshots ---------------------------------------------------------------------------------
    async def put_snapshot(self, snapshot: EndpointSnapshot) -> None:
        k = self._keys
        zkeys = [k.snapshot(snapshot.endpoint), k.snapshot_endpoints(), k.snapshot_version()]
        args = [snapshot.endpoint, uuid.uuid4().hex, *encode_snapshot(snapshot)]
        with self._runner.unavailable("put_snapshot"):
            await self._runner.run(self._put_snapshot, zkeys, args)

    async def snapshots(self, endpoints: Sequence[str] | None = None) -> dict[str, EndpointSnapshot]:
        with self._runner.unavailable("snapshots"):
            if endpoints is None:
                held = await (await self._runner.ready()).smembers(self._keys.snapshot_endpoints())
                endpoints = sorted(text(e) for e in held)
            if not endpoints:
                return {}
            async with self._runner.pipeline() as pipe:
                for endpoint in endpoints:
                    pipe.hgetall(self._keys.snapshot(endpoint))
                rows = await pipe.execute()
        return {e: decode_snapshot(e, raw) for e, raw in zip(endpoints, rows, strict=True) if raw}

    # -- gateway health marks ---------------------------------------------------------------------------------
    async def mark_unhealthy(self, endpoint: str, reason: str, ttl_s: float) -> None:
        ttl_ms = max(1, round(ttl_s * 1000))
        with self._runner.unavailable("mark_unhealthy"):
            await self._runner.run(self._mark_unhealthy, [self._keys.health()], [endpoint, ttl_ms, reason])

    async def health_marks(self, endpoints: Sequence[str] | None = None) -> dict[str, HealthMark]:
        if endpoints is not None and not endpoints:
            return {}
        wanted = [] if endpoints is None else list(dict.fromkeys(endpoints))
        with self._runner.unavailable("health_marks"):
            flat = await self._runner.run(self._health_read, [self._keys.health()], wanted)
        return _marks(flat)

    # -- heartbeats ------------------------------------------------------------------------------------------
    async def put_heartbeat(self, name: str, ttl_s: float) -> None:
        ttl_ms = max(1, round(ttl_s * 1000))
        with self._runner.unavailable("put_heartbeat"):
            await self._runner.run(self._put_heartbeat, [self._keys.heartbeats()], [name, ttl_ms])

    async def heartbeats(self) -> dict[str, Heartbeat]:
        with self._runner.unavailable("heartbeats"):
            flat = await self._runner.run(self._heartbeats_read, [self._keys.heartbeats()], [])
        return _beats(flat)

    # -- the fleet slot's part of ``fleet_view`` -----------------------------------------------------------------
    def known(self, endpoints: Sequence[str]) -> list[str]:
        """``endpoints`` without repeats, as ``state_call`` asks for them."""
        return self._fleet_call(endpoints)[0]

    def state_call(self, endpoints: Sequence[str], snapshots_held: bool | None = None) -> StateCall:
        """The ``FLEET_STATE`` call for ``endpoints``.

        ``snapshots_held``: this store holds the snapshots of every endpoint asked for, as of the version it last
        read, so the script sends them only if that version is no longer current; None: whether it does.
        """
        known, state_keys = self._fleet_call(endpoints)
        cache = self._snapshot_cache
        if snapshots_held is None:
            snapshots_held = all(e in cache for e in known)
        have = self._snapshot_version if snapshots_held else ""
        return StateCall(known, (self._fleet_state, state_keys, [have, *known]), cache)

    def read_state(self, asked: StateCall, reply: Sequence[Any]) -> FleetRead:
        """The reply to ``asked``; keeps the snapshots it sent (and a new version's token) for the next call."""
        counts, version, rows, marks, beats = reply
        known = asked.known
        inflight = {e: InFlight(counts[3 * j], counts[3 * j + 1], counts[3 * j + 2]) for j, e in enumerate(known)}
        cached = asked.snapshots
        if rows != 0:
            version = text(version)
            if version != self._snapshot_version:
                self._snapshot_cache = {}
                self._snapshot_version = version
            cached = self._snapshot_cache  # (a concurrent call may have replaced it while this one waited)
            for e, raw in zip(known, rows, strict=True):
                cached[e] = decode_snapshot(e, _pairs(raw)) if raw else None
        snapshots = {}
        for e in known:
            snap = cached[e]
            if snap is not None:
                snapshots[e] = snap
        return FleetRead(inflight, snapshots, _marks(marks), _beats(beats))

    def _fleet_call(self, endpoints: Sequence[str]) -> tuple[list[str], list[str]]:
        """The endpoints without repeats and the KEYS of their ``FLEET_STATE`` call, built once per list."""
        key = tuple(endpoints)
        call = self._fleet_calls.get(key)
        if call is None:
            k = self._keys
            known = list(dict.fromkeys(endpoints))
            state_keys = [k.snapshot_version(), k.health(), k.heartbeats()]
            for e in known:
                state_keys.extend([*self.inflight_keys(e), k.snapshot(e)])
            if len(self._fleet_calls) >= FLEET_CALLS_KEPT:
                self._fleet_calls.clear()
            call = self._fleet_calls[key] = (known, state_keys)
        return call
