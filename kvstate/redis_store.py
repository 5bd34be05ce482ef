"""``RedisStore``: the ``Store`` shared by gateway replicas and the collector, on one Redis or a Redis Cluster.

Key layout: ``kvstate.redis_keys`` (two kinds of slot: a model's block index, and the fleet's per-endpoint state);
the Lua: ``kvstate.redis_scripts`` (block index) and ``kvstate.redis_fleet_scripts`` (fleet). Every multi-key
update is one script whose keys share one hash slot, so it is atomic and runs on one Cluster node; time comes from
the Redis server (``TIME``), so gateways with skewed clocks agree on what has expired.

- ``match_prefix`` is one read-only script call however long the prompt: it reads the block strings along the key
  chain (one byte per endpoint) and stops at the first block no remaining endpoint holds.
- Memory is bounded: at most ``max_blocks_per_endpoint`` blocks per (model, endpoint), the least recently stored or
  routed to trimmed first (``match_prefix`` itself never writes). Speculative entries expire by a server-clock
  timestamp and are swept on the endpoint's next speculative write or purge.
- ``clear_endpoint`` walks that endpoint's own key sets in chunks, never the keyspace.
- In-flight requests are members of a ZSET scored by expiry, so a gateway that dies stops counting after its TTL.
- ``fleet_view`` (what the router reads per decision) is two read-only scripts in one pipeline, one per slot: the
  match in the model's slot, and the in-flight totals, health marks, heartbeats and snapshots in the fleet slot.
  One round trip on one Redis; on a Cluster the two go to their nodes concurrently. Snapshots are sent back only
  when they changed since this store last read them: every ``put_snapshot`` replaces a version token, and the
  caller passes the token it holds.
- A connection error or timeout raises ``StoreUnavailable`` naming the URL; timeouts are short (0.25 s) so a dead
  Redis does not stall placement.
- On a Cluster every command waits until the client knows the cluster's slots (``_ready``): redis-py's asyncio
  ``RedisCluster`` picks a command's node before it discovers the topology, so a command sent while it knows none
  (a new client, or one that just dropped its topology) would go to a random node.
- Diagnostics, public and never on the request path: ``fleet_view_script_calls`` and ``match_script_call`` (what a
  read sends, without sending it: a Cluster slot check, a script timed alone) and ``delete_everything`` (cleaning
  a shared Redis). docs/store.md, "Diagnostics".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import struct
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
import redis.cluster
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    NoScriptError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kvstate import redis_fleet_scripts as fleet_scripts
from kvstate import redis_scripts as scripts
from kvstate.keys import BlockKey
from kvstate.redis_keys import RedisKeys
from kvstate.redis_snapshot import decode_snapshot, encode_snapshot
from kvstate.store import (
    EndpointSnapshot,
    FleetView,
    HealthMark,
    Heartbeat,
    InFlight,
    MatchCheckpoint,
    PrefixMatch,
    StoreRefused,
    StoreUnavailable,
)
from kvstate.tiers import SPECULATIVE_WEIGHT, Tier, mask_weights

__all__ = ["Client", "RedisStore", "ScriptCall", "probe"]

DEFAULT_SOCKET_TIMEOUT_S = 0.25
"""Connect and read timeout: placement would rather degrade than wait on a dead Redis."""

MAX_CONCURRENT_CALLS = 48
"""Store calls in flight at once per store; the rest wait their turn. redis-py's pools hold 100 connections (per
node on a Cluster) and raise past that, rather than wait: 300 concurrent placements failed 200 of their reads
(the Cluster client's pipelines even raised AttributeError). With the budget ledger's 48 beside it, a Cluster node
sees at most 96. A wait counts against the router's ``store_timeout_s`` like the call itself."""

CHUNK = 2000
"""Blocks per script call in bulk writes and purges, so no single script blocks Redis for long."""

FLEET_CALLS_KEPT = 64
"""Endpoint lists whose ``fleet_view`` script keys are kept built (a router asks for one per model)."""

Client = aioredis.Redis | RedisCluster
"""The two clients a ``RedisStore`` runs on: one Redis, or a Redis Cluster."""

_UNAVAILABLE = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    # a Cluster that is up but cannot serve (failover in progress, a slot without a node): unavailable too
    ClusterDownError,
    TryAgainError,
    SlotNotCoveredError,
)


class _Script:
    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


_Call = tuple[_Script, Sequence[str], Sequence[Any]]


class ScriptCall(NamedTuple):
    """One Lua script call as the store would send it (``RedisStore.fleet_view_script_calls``)."""

    source: str
    """The script's Lua source (``redis_scripts`` / ``redis_fleet_scripts``); Redis runs it by its SHA-1."""
    keys: list[str]
    """KEYS: on a Redis Cluster they must all hash to one slot."""
    args: list[Any]
    """ARGV."""


def _matches(flat: Sequence[Any]) -> dict[str, PrefixMatch]:
    """``redis_scripts.MATCH``'s flat reply: name, blocks, weighted blocks, CPU-only, disk-only per endpoint."""
    return {
        _text(flat[i]): PrefixMatch(int(flat[i + 1]), float(_text(flat[i + 2])), int(flat[i + 3]), int(flat[i + 4]))
        for i in range(0, len(flat), MATCH_FIELDS)
    }


def _checkpoint(blocks: int, matches: dict[str, PrefixMatch], raw: Sequence[Any]) -> MatchCheckpoint:
    """The checkpoint ``redis_scripts.MATCH`` took after ``blocks`` keys: [proof, held, until] (flat lists, ms)."""
    proof_flat, held_flat, until_ms = raw
    held = {
        _text(held_flat[i]): PrefixMatch(
            blocks, float(_text(held_flat[i + 1])), int(held_flat[i + 2]), int(held_flat[i + 3])
        )
        for i in range(0, len(held_flat), 4)
    }
    ended = {e: m for e, m in matches.items() if m.blocks < blocks}
    proof = tuple((int(proof_flat[i]), bytes(proof_flat[i + 1])) for i in range(0, len(proof_flat), 2))
    return MatchCheckpoint(blocks, ended, held, proof, int(until_ms))


def _hex_chain(keys: Sequence[BlockKey]) -> str:
    """The chain as one string of 16-hex-digit keys (the scripts slice it)."""
    try:
        return struct.pack(f">{len(keys)}Q", *keys).hex()
    except struct.error as exc:
        bad = next((k for k in keys if not isinstance(k, int) or not 0 <= k < 2**64), None)
        raise ValueError(
            f"block keys must be unsigned 64-bit integers (kvstate.keys), got {bad!r}; compute them with "
            "kvstate.keys / PromptKeyer rather than passing engine hashes"
        ) from exc


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _pairs(flat: Sequence[Any]) -> dict[Any, Any]:
    """An HGETALL reply from a script (a flat field, value list) as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _marks(flat: Sequence[Any]) -> dict[str, HealthMark]:
    """A flat endpoint, since (ms), reason list from a script as marks."""
    return {
        _text(flat[i]): HealthMark(since=int(flat[i + 1]) / 1000, reason=_text(flat[i + 2]))
        for i in range(0, len(flat), 3)
    }


def _beats(flat: Sequence[Any]) -> dict[str, Heartbeat]:
    """A flat name, at (ms), age (ms) list from a script as heartbeats."""
    return {
        _text(flat[i]): Heartbeat(at=int(flat[i + 1]) / 1000, age_s=int(flat[i + 2]) / 1000)
        for i in range(0, len(flat), 3)
    }


def _url_of(client: Client) -> str:
    """``redis://host:port/db`` of a client, without credentials; of a Cluster, its first node's."""
    if isinstance(client, RedisCluster):
        return f"redis://{next(iter(client.nodes_manager.startup_nodes))}"
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}"
    return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def _describe(client: Client) -> str:
    """Where the store's data is, for error messages."""
    if isinstance(client, RedisCluster):
        return "Redis Cluster at " + ", ".join(f"redis://{name}" for name in client.nodes_manager.startup_nodes)
    return f"Redis at {_url_of(client)}"


def probe(url: str, *, cluster: bool = False, timeout_s: float = 2.0) -> None:
    """Connect to Redis at ``url``, authenticate and PING, once and synchronously: a process's check at start,
    before it serves (``cognitora.preflight.check_store``), from any thread, with or without an event loop.

    Raises ``StoreRefused`` when Redis refuses the credentials (or, with ``cluster``, is no Cluster node), and
    ``StoreUnavailable`` when it does not answer. Messages never hold the password.
    """
    client: redis.Redis | redis.cluster.RedisCluster | None = None
    try:
        if cluster:
            client = redis.cluster.RedisCluster.from_url(
                url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )  # connects to the cluster here
        else:
            client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        client.ping()
    except AuthenticationError as exc:
        raise StoreRefused(_refused_credentials(url, exc)) from None
    except RedisClusterException as exc:
        cause = exc.__cause__
        if isinstance(cause, AuthenticationError):
            raise StoreRefused(_refused_credentials(url, cause)) from None
        if isinstance(cause, _UNAVAILABLE):
            raise StoreUnavailable(
                f"no node of the Redis Cluster answered ({cause.__class__.__name__}: {cause})"
            ) from None
        raise StoreRefused(f"not a Redis Cluster node ({exc}): set redis_cluster: false for a single Redis") from None
    except _UNAVAILABLE as exc:
        raise StoreUnavailable(f"Redis did not answer ({exc.__class__.__name__}: {exc})") from None
    finally:
        if client is not None:
            client.close()


def _refused_credentials(url: str, exc: AuthenticationError) -> str:
    parts = urlsplit(url)
    if parts.password is None and not parts.username:
        return f"Redis asks for a password and the URL has none ({exc}); add the password to the URL"
    return f"Redis refused the user or password in the URL ({exc}); fix it there (or the server's ACL)"


MATCH_FIELDS = 5
"""Values per endpoint in ``redis_scripts.MATCH``'s reply: name, blocks, weighted blocks, CPU-only, disk-only."""


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
        self._client = client
        self._cluster_client = client if isinstance(client, RedisCluster) else None
        self._owns_client = owns_client
        self.keys = RedisKeys(key_prefix)
        self._cap = max_blocks_per_endpoint
        self._url = _url_of(client)
        self._where = _describe(client)
        self._known_models: set[str] = set()
        self._match_weights = [repr(w) for w in mask_weights(tier_weights)[1:]] + [repr(SPECULATIVE_WEIGHT)]
        self._match = _Script(scripts.MATCH)
        self._add = _Script(scripts.ADD)
        self._add_speculative = _Script(scripts.ADD_SPECULATIVE)
        self._remove = _Script(scripts.REMOVE)
        self._clear_chunk = _Script(scripts.CLEAR_CHUNK)
        self._inflight_add = _Script(fleet_scripts.INFLIGHT_ADD)
        self._inflight_prefill_done = _Script(fleet_scripts.INFLIGHT_PREFILL_DONE)
        self._inflight_read = _Script(fleet_scripts.INFLIGHT_READ)
        self._inflight_release = _Script(fleet_scripts.INFLIGHT_RELEASE)
        self._put_snapshot = _Script(fleet_scripts.PUT_SNAPSHOT)
        self._fleet_state = _Script(fleet_scripts.FLEET_STATE)
        self._mark_unhealthy = _Script(fleet_scripts.MARK_UNHEALTHY)
        self._health_read = _Script(fleet_scripts.HEALTH_READ)
        self._put_heartbeat = _Script(fleet_scripts.PUT_HEARTBEAT)
        self._heartbeats_read = _Script(fleet_scripts.HEARTBEATS_READ)
        self._fleet_calls: dict[tuple[str, ...], tuple[list[str], list[str]]] = {}
        self._calls = asyncio.Semaphore(MAX_CONCURRENT_CALLS)
        # The snapshots of ``_snapshot_version``, for the endpoints read since it became current (None: none).
        self._snapshot_version = ""
        self._snapshot_cache: dict[str, EndpointSnapshot | None] = {}

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
        client: Client
        if cluster:
            client = RedisCluster.from_url(
                url,
                socket_timeout=socket_timeout_s,
                socket_connect_timeout=socket_timeout_s,
                retry=Retry(NoBackoff(), 1),
            )
        else:
            client = aioredis.Redis.from_url(
                url,
                socket_timeout=socket_timeout_s,
                socket_connect_timeout=socket_timeout_s,
                retry=Retry(NoBackoff(), 1),
            )
        return cls(client, key_prefix, tier_weights, max_blocks_per_endpoint, owns_client=True)

    @property
    def url(self) -> str:
        """The URL of the store's Redis (of a Cluster: one node's), without credentials."""
        return self._url

    @property
    def cluster(self) -> bool:
        return isinstance(self._client, RedisCluster)

    @property
    def client(self) -> Client:
        """The Redis client (budgets share its connection pool: ``cognitora.budgets.gate``)."""
        return self._client

    @contextlib.contextmanager
    def _unavailable(self, what: str) -> Iterator[None]:
        try:
            yield
        except AuthenticationError as exc:
            raise StoreRefused(f"{self._where} refused the credentials ({what}: {exc}); fix redis_url") from exc
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(
                f"{self._where} did not answer ({what}: {exc.__class__.__name__}: {exc}); "
                "check that redis-server is running and that the configured redis URL points at it"
            ) from exc
        except RedisClusterException as exc:
            # The cluster client wraps "no node reachable" in its own exception; the same class also reports
            # client-side misuse (keys of one call in several slots), which is a bug to show as it is.
            if not isinstance(exc.__cause__, _UNAVAILABLE):
                raise
            raise StoreUnavailable(
                f"{self._where} did not answer ({what}: {exc}); check that the cluster's nodes are running and "
                "that the configured redis URL points at one of them"
            ) from exc

    async def _ready(self) -> Client:
        """The client, ready for one command (call it right before each, nothing awaited in between): on a Cluster,
        one that knows the cluster's slots.

        redis-py's asyncio ``RedisCluster`` chooses a command's node before it discovers the topology: while it knows
        none (a new client, or one that closed its connections after MOVED replies, a CLUSTERDOWN or a failed
        pipeline), a keyed command is sent to a random primary, which answers MOVED; every fifth MOVED the client
        closes all its connections, other tasks' in-flight commands included ("Connection closed by server"), and
        retries them, at random again. Concurrent calls on a new store then raised ``StoreUnavailable`` on a healthy
        cluster, and a ``put_snapshot`` that had run was run again, its version token over a newer snapshot's.
        ``initialize()`` discovers the topology once (concurrent callers wait for it) and returns at once after.
        """
        if self._cluster_client is not None:
            await self._cluster_client.initialize()
        return self._client

    async def _run(self, script: _Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """One script call by SHA; loads the script when the server does not know it (first use, restart)."""
        async with self._calls:
            return await self._evalsha(script, keys, args)

    async def _evalsha(self, script: _Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await (await self._ready()).evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            await (await self._ready()).script_load(script.source)
            return await (await self._ready()).evalsha(script.sha, len(keys), *keys, *args)

    async def _run_many(self, calls: Sequence[_Call], then: Sequence[tuple[str, ...]] = ()) -> list[Any]:
        """Script calls, then plain commands, in one pipelined round trip (on a Cluster: one pipeline per node,
        sent concurrently; each call's keys are in one slot, so each goes whole to one node).

        redis-py's own pipelined scripts cost an extra SCRIPT EXISTS round trip per execute; instead we load on
        a NoScriptError and run again (every script here is idempotent, and a read-only one harmless to rerun).
        """
        async with self._calls:
            if len(calls) == 1 and not then:
                script, keys, args = calls[0]
                return [await self._evalsha(script, keys, args)]  # no pipeline object for one call
            for attempt in range(2):
                pipe = (await self._ready()).pipeline(transaction=False)
                for script, keys, args in calls:
                    # not ``pipe.evalsha``: the Cluster pipeline blocks that method, but routes the command itself
                    # by its keys (all of one call's keys are in one slot, so it goes whole to one node)
                    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
                for command in then:
                    pipe.execute_command(*command)
                try:
                    return await pipe.execute()
                except NoScriptError:
                    if attempt:
                        raise
                    for script in {c[0].sha: c[0] for c in calls}.values():
                        await (await self._ready()).script_load(script.source)
            raise AssertionError("unreachable")

    # -- KV block index -------------------------------------------------------------------------------------
    def _index_keys(self, model: str, endpoint: str) -> list[str]:
        """KEYS of the block-index write scripts (all in the model's slot)."""
        k = self.keys
        return [
            k.endpoint_blocks(model, endpoint),
            k.endpoint_speculative(model, endpoint),
            k.endpoint_ids(model),
            k.endpoint_names(model),
            k.free_ids(model),
        ]

    def _registry(self, model: str) -> list[tuple[str, ...]]:
        """Record that ``model`` exists (once per process): ``clear_endpoint`` without a model walks every model.

        The set only grows (but for ``delete_everything``), so remembering what this process added is safe, and
        keeps the hot write path at one command.
        """
        if model in self._known_models:
            return []
        return [("SADD", self.keys.models(), model)]

    async def _write(self, calls: Sequence[_Call], model: str) -> None:
        then = self._registry(model)
        if len(calls) == 1 and not then:
            script, keys, args = calls[0]
            await self._run(script, keys, args)  # no pipeline object: the common case of one event batch
        else:
            await self._run_many(calls, then)
            self._known_models.add(model)

    async def add_blocks(self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier = Tier.GPU) -> None:
        if not keys:
            return
        zkeys = self._index_keys(model, endpoint)
        base = self.keys.block_base(model)
        calls = [
            (self._add, zkeys, [base, endpoint, int(tier), self._cap, _hex_chain(keys[i : i + CHUNK])])
            for i in range(0, len(keys), CHUNK)
        ]
        with self._unavailable("add_blocks"):
            await self._write(calls, model)

    async def remove_blocks(
        self, model: str, endpoint: str, keys: Sequence[BlockKey], tier: Tier | None = None
    ) -> None:
        if not keys:
            return
        zkeys = self._index_keys(model, endpoint)[:3]
        base = self.keys.block_base(model)
        which = -1 if tier is None else int(tier)
        calls = [
            (self._remove, zkeys, [base, endpoint, which, _hex_chain(keys[i : i + CHUNK])])
            for i in range(0, len(keys), CHUNK)
        ]
        with self._unavailable("remove_blocks"):
            await self._run_many(calls)

    async def clear_endpoint(self, endpoint: str, model: str | None = None) -> None:
        k = self.keys
        with self._unavailable("clear_endpoint"):
            if model is not None:
                models = [model]
            else:
                models = [_text(m) for m in await (await self._ready()).smembers(k.models())]
            for m in models:
                # a model the endpoint holds nothing of costs one call that finds no id for it
                zkeys = self._index_keys(m, endpoint)
                while await self._run(self._clear_chunk, zkeys, [k.block_base(m), endpoint, CHUNK]):
                    pass

    async def match_prefix(
        self, model: str, keys: Sequence[BlockKey], endpoints: Sequence[str] | None = None
    ) -> dict[str, PrefixMatch]:
        if not keys or (endpoints is not None and not endpoints):
            return {}
        zkeys, args = self.match_script_call(model, keys, endpoints)
        with self._unavailable("match_prefix"):
            flat = await self._run(self._match, zkeys, args)
        return _matches(flat)

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
        k = self.keys
        zkeys = [k.block(model, keys[0]), k.endpoint_ids(model), k.endpoint_names(model)]
        args: list[str | bytes] = [
            k.block_base(model),
            _hex_chain(keys),
            k.endpoint_speculative(model, ""),
            *self._match_weights,
        ]
        if resume is not None:
            proof = [str(v) if isinstance(v, int) else v for pair in resume.proof for v in pair]
            held = [
                str(v)
                for e, m in resume.held.items()
                for v in (e, repr(m.weighted_blocks), m.cpu_blocks, m.disk_blocks)
            ]
            args += [str(resume.blocks), repr(resume.until_ms), str(len(proof)), str(len(held)), *proof, *held]
        else:
            args += [str(checkpoint), "0", "0", "0"]
        if endpoints is not None:
            args.extend(dict.fromkeys(endpoints))  # a repeated endpoint must not be counted twice
        return zkeys, args

    async def add_speculative(self, model: str, endpoint: str, keys: Sequence[BlockKey], ttl_s: float) -> None:
        if not keys:
            return
        ttl_ms = max(1, round(ttl_s * 1000))
        blocks_zset, spec_zset, *registry = self._index_keys(model, endpoint)
        zkeys = [spec_zset, blocks_zset, *registry]
        base = self.keys.block_base(model)
        calls = [
            (self._add_speculative, zkeys, [base, endpoint, ttl_ms, self._cap, _hex_chain(keys[i : i + CHUNK])])
            for i in range(0, len(keys), CHUNK)
        ]
        with self._unavailable("add_speculative"):
            await self._write(calls, model)

    # -- in-flight work -------------------------------------------------------------------------------------
    def _inflight_keys(self, endpoint: str) -> list[str]:
        return [self.keys.inflight(endpoint), self.keys.inflight_tokens(endpoint)]

    async def inflight_add(
        self, endpoint: str, request_id: str, prefill_tokens: int, decode_tokens: int, ttl_s: float
    ) -> None:
        ttl_ms = max(1, round(ttl_s * 1000))
        args = [request_id, max(0, int(prefill_tokens)), max(0, int(decode_tokens)), ttl_ms]
        with self._unavailable("inflight_add"):
            await self._run(self._inflight_add, self._inflight_keys(endpoint), args)

    async def inflight_prefill_done(self, endpoint: str, request_id: str) -> None:
        with self._unavailable("inflight_prefill_done"):
            await self._run(self._inflight_prefill_done, self._inflight_keys(endpoint), [request_id])

    async def inflight_release(self, endpoint: str, request_id: str) -> None:
        with self._unavailable("inflight_release"):
            await self._run(self._inflight_release, self._inflight_keys(endpoint), [request_id])

    async def inflight(self, endpoints: Sequence[str]) -> dict[str, InFlight]:
        if not endpoints:
            return {}
        with self._unavailable("inflight"):
            rows = await self._run_many([(self._inflight_read, self._inflight_keys(e), []) for e in endpoints])
        return {e: InFlight(int(r[0]), int(r[1]), int(r[2])) for e, r in zip(endpoints, rows, strict=True)}

    # -- endpoint snapshots ---------------------------------------------------------------------------------
    async def put_snapshot(self, snapshot: EndpointSnapshot) -> None:
        k = self.keys
        zkeys = [k.snapshot(snapshot.endpoint), k.snapshot_endpoints(), k.snapshot_version()]
        args = [snapshot.endpoint, uuid.uuid4().hex, *encode_snapshot(snapshot)]
        with self._unavailable("put_snapshot"):
            await self._run(self._put_snapshot, zkeys, args)

    async def snapshots(self, endpoints: Sequence[str] | None = None) -> dict[str, EndpointSnapshot]:
        with self._unavailable("snapshots"):
            if endpoints is None:
                held = await (await self._ready()).smembers(self.keys.snapshot_endpoints())
                endpoints = sorted(_text(e) for e in held)
            if not endpoints:
                return {}
            async with self._calls:
                pipe = (await self._ready()).pipeline(transaction=False)
                for endpoint in endpoints:
                    pipe.hgetall(self.keys.snapshot(endpoint))
                rows = await pipe.execute()
        return {e: decode_snapshot(e, raw) for e, raw in zip(endpoints, rows, strict=True) if raw}

    # -- gateway health marks ---------------------------------------------------------------------------------
    async def mark_unhealthy(self, endpoint: str, reason: str, ttl_s: float) -> None:
        ttl_ms = max(1, round(ttl_s * 1000))
        with self._unavailable("mark_unhealthy"):
            await self._run(self._mark_unhealthy, [self.keys.health()], [endpoint, ttl_ms, reason])

    async def health_marks(self, endpoints: Sequence[str] | None = None) -> dict[str, HealthMark]:
        if endpoints is not None and not endpoints:
            return {}
        wanted = [] if endpoints is None else list(dict.fromkeys(endpoints))
        with self._unavailable("health_marks"):
            flat = await self._run(self._health_read, [self.keys.health()], wanted)
        return _marks(flat)

    # -- heartbeats ------------------------------------------------------------------------------------------
    async def put_heartbeat(self, name: str, ttl_s: float) -> None:
        ttl_ms = max(1, round(ttl_s * 1000))
        with self._unavailable("put_heartbeat"):
            await self._run(self._put_heartbeat, [self.keys.heartbeats()], [name, ttl_ms])

    async def heartbeats(self) -> dict[str, Heartbeat]:
        with self._unavailable("heartbeats"):
            flat = await self._run(self._heartbeats_read, [self.keys.heartbeats()], [])
        return _beats(flat)

    # -- everything placement reads ---------------------------------------------------------------------------
    async def fleet_view(
        self,
        model: str,
        keys: Sequence[BlockKey],
        endpoints: Sequence[str],
        *,
        checkpoint: int = 0,
        resume: MatchCheckpoint | None = None,
    ) -> FleetView:
        known = self._fleet_call(endpoints)[0]
        if not known:
            return FleetView({}, {}, {})
        if resume is not None and not 0 < resume.blocks <= len(keys):
            resume = None
        at = resume.blocks if resume is not None else checkpoint
        if not 0 < at <= len(keys):
            at = 0
        cached = self._snapshot_cache
        calls = self._fleet_view_calls(model, keys, endpoints, all(e in cached for e in known), at, resume)
        with self._unavailable("fleet_view"):
            replies = await self._run_many(calls)
        counts, version, rows, marks, beats = replies[-1]
        reply = replies[0] if len(replies) == 2 else []
        taken: MatchCheckpoint | None = None
        resumed = False
        if at and reply:
            flat, raw_checkpoint, resumed_flag = reply
            matches = _matches(flat)
            resumed = bool(resumed_flag)
            if resumed and resume is not None:
                matches = {**resume.ended, **matches}
            elif raw_checkpoint:
                taken = _checkpoint(at, matches, raw_checkpoint)
        else:
            matches = _matches(reply)
        inflight = {e: InFlight(counts[3 * j], counts[3 * j + 1], counts[3 * j + 2]) for j, e in enumerate(known)}
        if rows != 0:
            version = _text(version)
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
        return FleetView(matches, inflight, snapshots, _marks(marks), _beats(beats), checkpoint=taken, resumed=resumed)

    def _fleet_view_calls(
        self,
        model: str,
        keys: Sequence[BlockKey],
        endpoints: Sequence[str],
        snapshots_held: bool,
        checkpoint: int = 0,
        resume: MatchCheckpoint | None = None,
    ) -> list[_Call]:
        known, state_keys = self._fleet_call(endpoints)
        have = self._snapshot_version if snapshots_held else ""
        state: _Call = (self._fleet_state, state_keys, [have, *known])
        if not keys or not known:
            return [state]
        zkeys, args = self.match_script_call(model, keys, known, checkpoint, resume)
        return [(self._match, zkeys, args), state]

    def _fleet_call(self, endpoints: Sequence[str]) -> tuple[list[str], list[str]]:
        """The endpoints without repeats and the KEYS of their ``FLEET_STATE`` call, built once per list."""
        key = tuple(endpoints)
        call = self._fleet_calls.get(key)
        if call is None:
            k = self.keys
            known = list(dict.fromkeys(endpoints))
            state_keys = [k.snapshot_version(), k.health(), k.heartbeats()]
            for e in known:
                state_keys.extend([*self._inflight_keys(e), k.snapshot(e)])
            if len(self._fleet_calls) >= FLEET_CALLS_KEPT:
                self._fleet_calls.clear()
            call = self._fleet_calls[key] = (known, state_keys)
        return call

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def ping(self) -> bool:
        try:
            with self._unavailable("ping"):
                return bool(await (await self._ready()).ping())
        except StoreUnavailable:
            return False

    async def close(self) -> None:
        if self._owns_client:
            await self._client.aclose()

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
        return [
            ScriptCall(script.source, list(zkeys), list(args))
            for script, zkeys, args in self._fleet_view_calls(model, keys, endpoints, snapshots_held)
        ]

    async def delete_everything(self) -> None:
        """Remove every key this store wrote under its prefix, found through its own key sets (never a SCAN).

        For a Redis shared by tests, benchmarks or a retired deployment, once the writers under this prefix have
        stopped (a write racing it can outlive it); in-flight keys not found this way expire on their own.
        """
        k = self.keys
        with self._unavailable("delete_everything"):
            models = [_text(m) for m in await (await self._ready()).smembers(k.models())]
            for model in models:
                endpoints = [_text(e) for e in await (await self._ready()).hkeys(k.endpoint_ids(model))]
                for endpoint in endpoints:
                    await self.clear_endpoint(endpoint)
                    await (await self._ready()).delete(*self._inflight_keys(endpoint))
                await (await self._ready()).delete(k.endpoint_ids(model), k.endpoint_names(model), k.free_ids(model))
            snap_endpoints = [_text(e) for e in await (await self._ready()).smembers(k.snapshot_endpoints())]
            for endpoint in snap_endpoints:
                await (await self._ready()).delete(k.snapshot(endpoint), *self._inflight_keys(endpoint))
            await (await self._ready()).delete(
                k.models(), k.snapshot_endpoints(), k.snapshot_version(), k.health(), k.heartbeats()
            )
            self._known_models.clear()
