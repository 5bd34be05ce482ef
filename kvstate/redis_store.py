"""``RedisStore``: the ``Store`` shared by gateway replicas and the collector, on one Redis or a Redis Cluster.

The store is three parts on one client, each in its own module; this one puts them together behind ``Store``:

- ``kvstate.redis_client``: the client, its errors as ``StoreUnavailable`` / ``StoreRefused``, the script runner
  (scripts by SHA, at most ``MAX_CONCURRENT_CALLS`` at once, a Cluster's slots known before each command), ``probe``.
- ``kvstate.redis_index``: the KV-block index, in each model's hash slot (``match_prefix``, block writes, purges).
- ``kvstate.redis_fleet``: in-flight work, snapshots, health marks and heartbeats, in the fleet's hash slot.

Key layout: ``kvstate.redis_keys``; the Lua: ``kvstate.redis_scripts`` (block index) and
``kvstate.redis_fleet_scripts`` (fleet). Every multi-key update is one script whose keys share one hash slot, so it
is atomic and runs on one Cluster node; time comes from the Redis server (``TIME``), so gateways with skewed clocks
agree on what has expired.

- ``fleet_view`` (what the router reads per decision) is two read-only scripts in one pipeline, one per slot: the
  match in the model's slot, and the in-flight totals, health marks, heartbeats and snapshots in the fleet slot.
  One round trip on one Redis; on a Cluster the two go to their nodes concurrently. Snapshots are sent back only
  when they changed since this store last read them (``kvstate.redis_fleet``).
- Diagnostics, public and never on the request path: ``fleet_view_script_calls`` and ``match_script_call`` (what a
  read sends, without sending it: a Cluster slot check, a script timed alone) and ``delete_everything`` (cleaning
  a shared Redis). docs/store.md, "Diagnostics".

``Client``, ``ScriptCall`` and ``probe`` live in ``kvstate.redis_client``; they are named here too, where callers
found them before the store was split.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio.cluster import RedisCluster

from kvstate.keys import BlockKey
from kvstate.redis_client import (
    DEFAULT_SOCKET_TIMEOUT_S,
    Call,
    Client,
    ScriptCall,
    ScriptRunner,
    connect,
    probe,
    text,
)
from kvstate.redis_fleet import FleetState
from kvstate.redis_index import BlockIndex
from kvstate.redis_keys import RedisKeys
from kvstate.store import (
    EndpointSnapshot,
    FleetView,
    HealthMark,
    Heartbeat,
    InFlight,
    MatchCheckpoint,
    PrefixMatch,
    StoreUnavailable,
)
from kvstate.tiers import Tier

__all__ = ["Client", "RedisStore", "ScriptCall", "probe"]


class RedisStore:
    """``Store`` on Redis (7.0+) or a Redis Cluster. See the module docstring and ``kvstate.redis_keys``.

    A store built by ``from_url`` owns its client and closes it in ``close()``; a client passed in is left open.
    """

    takes_match_checkpoints = True
    """``fleet_view`` takes and resumes prefix-match checkpoints (``kvstate.store.MatchCheckpoint``)."""

    def __init__(
        self,
        client: Client,
        key_prefix: str = "cog",
        tier_weights: dict[Tier, float] | None = None,
        max_blocks_per_endpoint: int = 2_000_000,
        *,
        owns_client: bool = False,
    ) -> None:
        if max_blocks_per_endpoint <= 0:
            raise ValueError(f"max_blocks_per_endpoint must be positive, got {max_blocks_per_endpoint}")
        self._owns_client = owns_client
        self.keys = RedisKeys(key_prefix)
        self._runner = ScriptRunner(client)
        self._index = BlockIndex(self._runner, self.keys, tier_weights, max_blocks_per_endpoint)
        self._fleet = FleetState(self._runner, self.keys)

    @classmethod
    def from_url(
        cls,
        url: str,
        key_prefix: str = "cog",
        tier_weights: dict[Tier, float] | None = None,
        max_blocks_per_endpoint: int = 2_000_000,
        socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
        *,
        cluster: bool = False,
    ) -> RedisStore:
        """A store with its own client: short timeouts and one immediate retry (a dropped idle connection).

        ``cluster``: ``url`` is one node of a Redis Cluster (the client discovers the others and follows slot
        moves); a plain client would answer MOVED for every key another node serves.
        """
        client = connect(url, socket_timeout_s, cluster=cluster)
        return cls(client, key_prefix, tier_weights, max_blocks_per_endpoint, owns_client=True)

    @property
    def url(self) -> str:
        """The URL of the store's Redis (of a Cluster: one node's), without credentials."""
        return self._runner.url

    @property
    def cluster(self) -> bool:
        return isinstance(self._runner.client, RedisCluster)

    @property
    def client(self) -> Client:
        """The Redis client (budgets share its connection pool: ``cognitora.budgets.gate``)."""
        return self._runner.client

    # -- KV block index (``kvstate.redis_index``) -------------------------------------------------------------
    async def add_blocks(self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier = Tier.GPU) -> None:
        await self._index.add_blocks(model, endpoint, keys, tier)

    async def remove_blocks(
        self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier | None = None
    ) -> None:
        await self._index.remove_blocks(model, endpoint, keys, tier)

    async def clear_endpoint(self, endpoint: str, model: str | None = None) -> None:
        await self._index.clear_endpoint(endpoint, model)

    async def cached_blocks(self, endpoint: str) -> int:
        return await self._index.cached_blocks(endpoint)

    async def match_prefix(
        self, model: str, keys: Sequence[BlockKey], endpoints: Sequence[str] | None = None
    ) -> dict[str, PrefixMatch]:
        return await self._index.match_prefix(model, keys, endpoints)

    async def add_speculative(self, model: str, endpoint: str, keys: Sequence[BlockKey], ttl_s: float) -> None:
        await self._index.add_speculative(model, endpoint, keys, ttl_s)

    # -- the fleet slot (``kvstate.redis_fleet``) --------------------------------------------------------------
    async def inflight_add(
        self, endpoint: str, request_id: str, prefill_tokens: int, decode_tokens: int, ttl_s: float
    ) -> None:
        await self._fleet.inflight_add(endpoint, request_id, prefill_tokens, decode_tokens, ttl_s)

    async def inflight_prefill_done(self, endpoint: str, request_id: str) -> None:
        await self._fleet.inflight_prefill_done(endpoint, request_id)

    async def inflight_release(self, endpoint: str, request_id: str) -> None:
        await self._fleet.inflight_release(endpoint, request_id)

    async def inflight(self, endpoints: Sequence[str]) -> dict[str, InFlight]:
        return await self._fleet.inflight(endpoints)

    async def put_snapshot(self, snapshot: EndpointSnapshot) -> None:
        await self._fleet.put_snapshot(snapshot)

    async def snapshots(self, endpoints: Sequence[str] | None = None) -> dict[str, EndpointSnapshot]:
        return await self._fleet.snapshots(endpoints)

    async def mark_unhealthy(self, endpoint: str, reason: str, ttl_s: float) -> None:
        await self._fleet.mark_unhealthy(endpoint, reason, ttl_s)

    async def health_marks(self, endpoints: Sequence[str] | None = None) -> dict[str, HealthMark]:
        return await self._fleet.health_marks(endpoints)

    async def put_heartbeat(self, name: str, ttl_s: float) -> None:
        await self._fleet.put_heartbeat(name, ttl_s)

    async def heartbeats(self) -> dict[str, Heartbeat]:
        return await self._fleet.heartbeats()

    # -- everything placement reads: both slots in one round trip ------------------------------------------------
    async def fleet_view(
        self,
        model: str,
        keys: Sequence[BlockKey],
        endpoints: Sequence[str],
        *,
        checkpoint: int = 0,
        resume: MatchCheckpoint | None = None,
    ) -> FleetView:
        if not self._fleet.known(endpoints):
            return FleetView({}, {}, {})
        if resume is not None and not 0 < resume.blocks <= len(keys):
            resume = None
        at = resume.blocks if resume is not None else checkpoint
        if not 0 < at <= len(keys):
            at = 0
        state = self._fleet.state_call(endpoints)
        calls = self._fleet_view_calls(model, keys, state.known, state.call, at, resume)
        with self._runner.unavailable("fleet_view"):
            replies = await self._runner.run_many(calls)
        match = self._index.read_match(replies[0] if len(replies) == 2 else [], at, resume)
        fleet = self._fleet.read_state(state, replies[-1])
        return FleetView(
            match.matches,
            fleet.inflight,
            fleet.snapshots,
            fleet.health_marks,
            fleet.heartbeats,
            checkpoint=match.checkpoint,
            resumed=match.resumed,
        )

    def _fleet_view_calls(
        self,
        model: str,
        keys: Sequence[BlockKey],
        known: list[str],
        state: Call,
        checkpoint: int = 0,
        resume: MatchCheckpoint | None = None,
    ) -> list[Call]:
        """The match in the model's slot (absent when there is nothing to match), then the fleet slot's state."""
        if not keys or not known:
            return [state]
        return [self._index.match_call(model, keys, known, checkpoint, resume), state]

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def ping(self) -> bool:
        try:
            with self._runner.unavailable("ping"):
                return bool(await (await self._runner.ready()).ping())
        except StoreUnavailable:
            return False

    async def close(self) -> None:
        if self._owns_client:
            await self._runner.client.aclose()

    # -- diagnostics: public, for operators' tools, the tests and the benchmarks; placement never calls them --------

    def fleet_view_script_calls(
        self, model: str, keys: Sequence[BlockKey], endpoints: Sequence[str], snapshots_held: bool
    ) -> list[ScriptCall]:
        """The script calls of one ``fleet_view`` (``ScriptCall``: Lua source, KEYS, ARGV): ``redis_scripts.MATCH``
        in the model's slot (absent when there are no keys), then ``redis_fleet_scripts.FLEET_STATE`` in the fleet
        slot.
        What a read sends, without sending it: to check that each call's keys share one hash slot (a Redis Cluster
        runs a script only then), or to time a script on its own inside redis-server.

        ``snapshots_held``: this store holds the snapshots of every endpoint asked for, as of the version it last
        read, so the script sends them only if that version is no longer current.
        """
        state = self._fleet.state_call(endpoints, snapshots_held)
        return [
            ScriptCall(script.source, list(zkeys), list(args))
            for script, zkeys, args in self._fleet_view_calls(model, keys, state.known, state.call)
        ]

    def match_script_call(
        self,
        model: str,
        keys: Sequence[BlockKey],
        endpoints: Sequence[str] | None = None,
        checkpoint: int = 0,
        resume: MatchCheckpoint | None = None,
    ) -> tuple[list[str], list[str | bytes]]:
        """KEYS and ARGV of ``redis_scripts.MATCH`` for this lookup: what ``match_prefix`` sends. Public so that a
        diagnostic can run the script on its own (``bench.store_bench`` times it inside redis-server)."""
        return self._index.match_script_call(model, keys, endpoints, checkpoint, resume)

    async def delete_everything(self) -> None:
        """Remove every key this store wrote under its prefix, found through its own key sets (never a SCAN).

        For a Redis shared by tests, benchmarks or a retired deployment, once the writers under this prefix have
        stopped (a write racing it can outlive it); in-flight keys not found this way expire on their own.
        """
        k = self.keys
        inflight_keys = self._fleet.inflight_keys
        with self._runner.unavailable("delete_everything"):
            models = [text(m) for m in await (await self._runner.ready()).smembers(k.models())]
            for model in models:
                endpoints = [text(e) for e in await (await self._runner.ready()).hkeys(k.endpoint_ids(model))]
                for endpoint in endpoints:
                    await self.clear_endpoint(endpoint)
                    await (await self._runner.ready()).delete(*inflight_keys(endpoint))
                await (await self._runner.ready()).delete(
                    k.endpoint_ids(model), k.endpoint_names(model), k.free_ids(model)
                )
            snap_endpoints = [text(e) for e in await (await self._runner.ready()).smembers(k.snapshot_endpoints())]
            for endpoint in snap_endpoints:
                await (await self._runner.ready()).delete(k.snapshot(endpoint), *inflight_keys(endpoint))
            await (await self._runner.ready()).delete(
                k.models(), k.snapshot_endpoints(), k.snapshot_version(), k.health(), k.heartbeats()
            )
            self._index.forget_models()
