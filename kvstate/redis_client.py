"""Talking to one Redis or a Redis Cluster: the client, how its errors read, and how a script call is sent.

``RedisStore`` (``kvstate.redis_store``) and its two halves (``kvstate.redis_index``, ``kvstate.redis_fleet``) send
every command through one ``ScriptRunner``; nothing here knows the key layout or what a script does.

- A connection error or timeout raises ``StoreUnavailable`` naming the URL; timeouts are short (0.25 s) so a dead
  Redis does not stall placement. Refused credentials raise ``StoreRefused``.
- Scripts are sent by SHA and loaded when the server does not know them (first use, a restart, a Cluster node new
  to the store), then run again: every script of the store is idempotent, and a read-only one harmless to rerun.
- On a Cluster every command waits until the client knows the cluster's slots (``ScriptRunner.ready``): redis-py's
  asyncio ``RedisCluster`` picks a command's node before it discovers the topology, so a command sent while it
  knows none (a new client, or one that just dropped its topology) would go to a random node.
- ``probe`` is the synchronous check a process makes once at start, before it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
import redis.cluster
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
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

from kvstate.store import StoreRefused, StoreUnavailable

__all__ = [
    "DEFAULT_SOCKET_TIMEOUT_S",
    "MAX_CONCURRENT_CALLS",
    "UNAVAILABLE_ERRORS",
    "Call",
    "Client",
    "Script",
    "ScriptCall",
    "ScriptRunner",
    "connect",
    "probe",
    "run_script",
    "text",
]

DEFAULT_SOCKET_TIMEOUT_S = 0.25
"""Connect and read timeout: placement would rather degrade than wait on a dead Redis."""

MAX_CONCURRENT_CALLS = 48
"""Store calls in flight at once per store; the rest wait their turn. redis-py's pools hold 100 connections (per
node on a Cluster) and raise past that, rather than wait: 300 concurrent placements failed 200 of their reads
(the Cluster client's pipelines even raised AttributeError). With the budget ledger's 48 beside it, a Cluster node
sees at most 96 (the ledger's runner, ``cognitora.budgets.redis_ledger``, has this same cap). A wait counts against
the router's ``store_timeout_s`` like the call itself."""

Client = aioredis.Redis | RedisCluster
"""The two clients a ``RedisStore`` runs on: one Redis, or a Redis Cluster."""

UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    # a Cluster that is up but cannot serve (failover in progress, a slot without a node): unavailable too
    ClusterDownError,
    TryAgainError,
    SlotNotCoveredError,
)
"""Redis's errors that mean it cannot serve now: every Redis user (the store, flow leases, the budget ledger) turns
them into ``StoreUnavailable``, as it does a ``RedisClusterException`` caused by one; any other error is a bug to
show."""


class Script:
    """One Lua script and the SHA-1 Redis runs it by."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


Call = tuple[Script, Sequence[str], Sequence[Any]]
"""One script call: the script, its KEYS, its ARGV."""


class ScriptCall(NamedTuple):
    """One Lua script call as the store would send it (``RedisStore.fleet_view_script_calls``)."""

    source: str
    """The script's Lua source (``redis_scripts`` / ``redis_fleet_scripts``); Redis runs it by its SHA-1."""
    keys: list[str]
    """KEYS: on a Redis Cluster they must all hash to one slot."""
    args: list[Any]
    """ARGV."""


def text(value: bytes | str) -> str:
    """A reply's bytes as text (the clients do not decode replies: block keys and proofs are bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def connect(url: str, socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S, *, cluster: bool = False) -> Client:
    """A client with short timeouts and one immediate retry (a dropped idle connection).

    ``cluster``: ``url`` is one node of a Redis Cluster (the client discovers the others and follows slot moves); a
    plain client would answer MOVED for every key another node serves.
    """
    if cluster:
        return RedisCluster.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            retry=Retry(NoBackoff(), 1),
        )
    return aioredis.Redis.from_url(
        url,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_timeout_s,
        retry=Retry(NoBackoff(), 1),
    )


def url_of(client: Client) -> str:
    """``redis://host:port/db`` of a client, without credentials; of a Cluster, its first node's."""
    if isinstance(client, RedisCluster):
        return f"redis://{next(iter(client.nodes_manager.startup_nodes))}"
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}"
    return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def describe(client: Client) -> str:
    """Where the store's data is, for error messages."""
    if isinstance(client, RedisCluster):
        return "Redis Cluster at " + ", ".join(f"redis://{name}" for name in client.nodes_manager.startup_nodes)
    return f"Redis at {url_of(client)}"


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
        if isinstance(cause, UNAVAILABLE_ERRORS):
            raise StoreUnavailable(
                f"no node of the Redis Cluster answered ({cause.__class__.__name__}: {cause})"
            ) from None
        raise StoreRefused(f"not a Redis Cluster node ({exc}): set redis_cluster: false for a single Redis") from None
    except UNAVAILABLE_ERRORS as exc:
        raise StoreUnavailable(f"Redis did not answer ({exc.__class__.__name__}: {exc})") from None
    finally:
        if client is not None:
            client.close()


def _refused_credentials(url: str, exc: AuthenticationError) -> str:
    parts = urlsplit(url)
    if parts.password is None and not parts.username:
        return f"Redis asks for a password and the URL has none ({exc}); add the password to the URL"
    return f"Redis refused the user or password in the URL ({exc}); fix it there (or the server's ACL)"


async def run_script(client: Client, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
    """One script call on ``client`` by SHA, loaded when the server does not know it (first use, a restart, a Cluster
    node new to the store); on a Cluster each command waits until the client knows the slots (``ScriptRunner.ready``).
    No cap on calls in flight: ``ScriptRunner.run`` is this under a store's cap; flow leases call it as it is."""
    try:
        return await (await _ready(client)).evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        await (await _ready(client)).script_load(script.source)
        return await (await _ready(client)).evalsha(script.sha, len(keys), *keys, *args)


async def _ready(client: Client) -> Client:
    """``client``, on a Cluster once it knows the slots (``ScriptRunner.ready`` says why)."""
    if isinstance(client, RedisCluster):
        await client.initialize()
    return client


class ScriptRunner:
    """Sends a store's commands on one client: at most ``MAX_CONCURRENT_CALLS`` at once, scripts by SHA, and on a
    Cluster only once the client knows the slots. Shared by the parts of one ``RedisStore``."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.url = url_of(client)
        """The URL of the client's Redis (of a Cluster: one node's), without credentials."""
        self._where = describe(client)
        self._calls = asyncio.Semaphore(MAX_CONCURRENT_CALLS)

    @contextlib.contextmanager
    def unavailable(self, what: str) -> Iterator[None]:
        """Redis's errors inside the block as ``StoreRefused`` / ``StoreUnavailable``, naming ``what`` and where."""
        try:
            yield
        except AuthenticationError as exc:
            raise StoreRefused(f"{self._where} refused the credentials ({what}: {exc}); fix redis_url") from exc
        except UNAVAILABLE_ERRORS as exc:
            raise StoreUnavailable(
                f"{self._where} did not answer ({what}: {exc.__class__.__name__}: {exc}); "
                "check that redis-server is running and that the configured redis URL points at it"
            ) from exc
        except RedisClusterException as exc:
            # The cluster client wraps "no node reachable" in its own exception; the same class also reports
            # client-side misuse (keys of one call in several slots), which is a bug to show as it is.
            if not isinstance(exc.__cause__, UNAVAILABLE_ERRORS):
                raise
            raise StoreUnavailable(
                f"{self._where} did not answer ({what}: {exc}); check that the cluster's nodes are running and "
                "that the configured redis URL points at one of them"
            ) from exc

    async def ready(self) -> Client:
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
        return await _ready(self.client)

    @contextlib.asynccontextmanager
    async def pipeline(self) -> AsyncIterator[Pipeline | ClusterPipeline]:
        """A non-transactional pipeline of plain commands, holding one of the store's call slots while it is used."""
        async with self._calls:
            yield (await self.ready()).pipeline(transaction=False)

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """One script call by SHA; loads the script when the server does not know it (first use, restart)."""
        async with self._calls:
            return await run_script(self.client, script, keys, args)

    async def run_many(self, calls: Sequence[Call], then: Sequence[tuple[str, ...]] = ()) -> list[Any]:
        """Script calls, then plain commands, in one pipelined round trip (on a Cluster: one pipeline per node,
        sent concurrently; each call's keys are in one slot, so each goes whole to one node).

        redis-py's own pipelined scripts cost an extra SCRIPT EXISTS round trip per execute; instead we load on
        a NoScriptError and run again (every script here is idempotent, and a read-only one harmless to rerun).
        """
        async with self._calls:
            if len(calls) == 1 and not then:
                script, keys, args = calls[0]
                return [await run_script(self.client, script, keys, args)]  # no pipeline object for one call
            for attempt in range(2):
                pipe = (await self.ready()).pipeline(transaction=False)
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
                        await (await self.ready()).script_load(script.source)
            raise AssertionError("unreachable")
