"""``RedisLedger``: budget counters in Redis or a Redis Cluster.

Key layout (every key in ONE hash slot, tag ``{<prefix>.budget}``, so one script holds all of a request's limits,
team, key and user alike, on a Cluster too; the cost is that one node serves all budget traffic, a few small
commands per request):

| key | type | content |
|---|---|---|
| ``B:c:<counter name>`` | STRING / HASH | a fixed window's count / a rolling window's bucket -> count |
| ``B:leases`` | ZSET | open reservations (request id), scored by lease expiry (ms) |
| ``B:done:<request id>`` | STRING | the request was settled (or its lease expired): TTL ``DONE_TTL_S`` |
| ``B:day:<YYYY-MM-DD>`` | HASH | report rows (``plan.row_field``) -> value; TTL ``budgets.history_days`` |

``B`` is ``<prefix>:budget:{<prefix>.budget}``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from cognitora.budgets import redis_scripts
from cognitora.budgets.ledger import DONE_TTL_S, REAP_BATCH, Refusal, SettleResult, StoreSlow
from cognitora.budgets.plan import CounterPlan, Reservation, Usage, row_field
from kvstate.redis_client import MAX_CONCURRENT_CALLS, UNAVAILABLE_ERRORS, Script, ScriptRunner
from kvstate.store import StoreRefused, StoreUnavailable

__all__ = ["RedisLedger", "budget_key_base"]

DAY_MS = 86_400_000
SOCKET_TIMEOUT_S = 1.0
"""Connect and read timeout of the ledger's connections. A connect that times out means unreachable (a host that
drops packets; under load the pool's few connections are already open, so a busy gateway never connects anew);
a read that times out means slow (retried, and bounded by ``budgets.reserve_timeout_s``: never fail-open)."""


def budget_key_base(prefix: str) -> str:
    return f"{prefix}:budget:{{{prefix}.budget}}:"


class RedisLedger:
    def __init__(
        self, client: aioredis.Redis | RedisCluster, prefix: str, history_days: int, *, owns_client: bool = False
    ) -> None:
        self._client = client
        self._cluster = client if isinstance(client, RedisCluster) else None
        self._owns = owns_client
        self.base = budget_key_base(prefix)
        self._history_ms = history_days * DAY_MS
        self._reserve = Script(redis_scripts.RESERVE)
        self._settle = Script(redis_scripts.SETTLE)
        self._counters = Script(redis_scripts.COUNTERS)
        # Budget scripts in flight at once: at most MAX_CONCURRENT_CALLS (a runner of the ledger's own, so store calls
        # do not count), the rest wait their turn; redis-py's pools raise rather than wait past their size.
        self._scripts = ScriptRunner(client)

    @classmethod
    def from_url(
        cls, url: str, prefix: str, history_days: int, *, cluster: bool = False, timeout_s: float = SOCKET_TIMEOUT_S
    ) -> RedisLedger:
        client: aioredis.Redis | RedisCluster
        options: dict[str, Any] = {
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            "retry": Retry(NoBackoff(), 1),
        }
        if cluster:
            client = RedisCluster.from_url(url, **options)
        else:
            # A full pool waits for a connection (the default pool raises); the runner's cap keeps it from filling.
            pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=MAX_CONCURRENT_CALLS + 8, **options)
            client = aioredis.Redis(connection_pool=pool)
        return cls(client, prefix, history_days, owns_client=True)

    @classmethod
    def beside(cls, client: aioredis.Redis | RedisCluster, prefix: str, history_days: int) -> RedisLedger:
        """A ledger on the same server as ``client`` (a store's), with connections of its own (a plain Redis:
        the same settings but the ledger's timeouts, in a waiting pool) so budget calls and store calls never
        starve each other."""
        if isinstance(client, RedisCluster):
            return cls(client, prefix, history_days)
        pool = client.connection_pool
        settings = {**pool.connection_kwargs, "socket_timeout": SOCKET_TIMEOUT_S}
        settings["socket_connect_timeout"] = SOCKET_TIMEOUT_S
        own = aioredis.BlockingConnectionPool(
            connection_class=pool.connection_class, max_connections=MAX_CONCURRENT_CALLS + 8, **settings
        )
        return cls(aioredis.Redis(connection_pool=own), prefix, history_days, owns_client=True)

    # -- keys ---------------------------------------------------------------------------------------------------
    def counter_key(self, name: str) -> str:
        return f"{self.base}c:{name}"

    def _keys_of(self, r: Reservation) -> list[str]:
        """A reservation's keys in the scripts' order: its settled mark, its report day, its counters."""
        return [
            f"{self.base}done:{r.request_id}",
            self._day_key(r.day),
            *(self.counter_key(c.name) for c in r.counters),
        ]

    def _day_key(self, day: str) -> str:
        return f"{self.base}day:{day}"

    def _day_expire_ms(self, day: str) -> int:
        return _day_start_ms(day) + DAY_MS + self._history_ms

    # -- calls --------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _unavailable(self, what: str) -> Iterator[None]:
        """Redis errors as the gate tells them apart: unreachable (``StoreUnavailable``: refused, reset, no
        connection within the connect timeout, a cluster without this slot) or connected but slow (``StoreSlow``:
        no answer within the socket timeout). Only the first may admit without the store (fail-open)."""
        try:
            yield
        except AuthenticationError as exc:
            raise StoreRefused(f"Redis refused the credentials ({what}: {exc}); fix redis_url") from exc
        except RedisTimeoutError as exc:
            if _connecting(exc):
                raise StoreUnavailable(f"the budget store did not answer ({what}: {exc})") from exc
            raise StoreSlow(f"the budget store is slow to answer ({what}: {exc})") from exc
        except UNAVAILABLE_ERRORS as exc:
            raise StoreUnavailable(f"the budget store did not answer ({what}: {type(exc).__name__}: {exc})") from exc
        except RedisClusterException as exc:
            if not isinstance(exc.__cause__, UNAVAILABLE_ERRORS):
                raise
            raise StoreUnavailable(f"the budget store's cluster did not answer ({what}: {exc})") from exc

    async def _run(self, script: Script, keys: Sequence[str], args: Sequence[Any], what: str) -> Any:
        with self._unavailable(what):
            return await self._scripts.run(script, keys, args)

    async def reserve(self, reservation: Reservation, now_ms: int) -> Refusal | None:
        [verdict] = await self.reserve_many([reservation], now_ms)
        return verdict

    async def reserve_many(self, reservations: Sequence[Reservation], now_ms: int) -> list[Refusal | None]:
        if not reservations:
            return []
        keys = [f"{self.base}leases"]
        args: list[Any] = [now_ms, DONE_TTL_S, self.base, REAP_BATCH]
        for r in reservations:
            keys += self._keys_of(r)
            args += [
                r.request_id,
                f"{r.lease_expires_ms} {self._day_expire_ms(r.day)} {len(r.counters)}",
                _prefixes(r),
                _usage(r.estimate),
            ]
            args += [
                f"{_or_dash(c.bucket)} {c.cap} {c.amount} {c.expire_at_ms} {_or_dash(c.min_bucket)} "
                f"{_or_dash(c.bucket_ms)} {c.resets_at_ms}"
                for c in r.counters
            ]
        results = await self._run(self._reserve, keys, args, "reserve a budget")
        verdicts: list[Refusal | None] = []
        for r, result in zip(reservations, results, strict=True):
            if int(result[0]) == 1:
                verdicts.append(Refusal(r.counters[int(result[1]) - 1], int(result[2]), int(result[3])))
            else:
                verdicts.append(None)
        return verdicts

    async def settle(self, reservation: Reservation, actual: Usage, requests: int = 1) -> SettleResult:
        [result] = await self.settle_many([(reservation, actual, requests)])
        return result

    async def settle_many(self, settles: Sequence[tuple[Reservation, Usage, int]]) -> list[SettleResult]:
        if not settles:
            return []
        keys = [f"{self.base}leases"]
        args: list[Any] = [DONE_TTL_S]
        for r, actual, requests in settles:
            keys += self._keys_of(r)
            args += [
                r.request_id,
                f"{self._day_expire_ms(r.day)} {requests} {len(r.counters)}",
                _prefixes(r),
                _usage(r.estimate),
                _usage(actual),
            ]
            args += [f"{_or_dash(c.bucket)} {c.amount} {actual.of(c.metric)} {c.expire_at_ms}" for c in r.counters]
        results = await self._run(self._settle, keys, args, "settle a budget")
        return [{1: SettleResult.SETTLED, 2: SettleResult.ADDED}.get(int(x), SettleResult.ALREADY) for x in results]

    async def counter_values(self, counters: Sequence[CounterPlan], now_ms: int) -> list[int]:
        if not counters:
            return []
        keys = [self.counter_key(c.name) for c in counters]
        args = ["" if c.min_bucket is None else c.min_bucket for c in counters]
        return [int(v) for v in await self._run(self._counters, keys, args, "read budget counters")]

    async def days(self, days: Sequence[str]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        with self._unavailable("read budget history"):
            for day in days:
                raw = await self._client.hgetall(self._day_key(day))
                if raw:
                    out[day] = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}
        return out

    async def open_reservations(self) -> int:
        with self._unavailable("count open reservations"):
            return int(await self._client.zcard(f"{self.base}leases"))

    async def reset(self, counter_prefix: str) -> int:
        pattern = f"{self.counter_key(counter_prefix)}*"
        deleted = 0
        with self._unavailable("reset budget counters"):
            if self._cluster is not None:
                node = self._cluster.get_node_from_key(self.counter_key(counter_prefix))
                found = [k async for k in self._cluster.scan_iter(match=pattern, target_nodes=node)]
            else:
                found = [k async for k in self._client.scan_iter(match=pattern)]
            for key in found:
                deleted += int(await self._client.delete(key))
        return deleted

    async def ping(self) -> bool:
        try:
            with self._unavailable("ping"):
                return bool(await self._client.ping())
        except StoreUnavailable:
            return False

    async def close(self) -> None:
        if self._owns:
            await self._client.aclose()


def _connecting(exc: BaseException) -> bool:
    """redis-py's "Timeout connecting to server": no connection at all (a host that drops packets), not a slow
    answer on an open connection."""
    return "connecting" in str(exc).lower()


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _usage(usage: Usage) -> str:
    return f"{usage.input_tokens} {usage.output_tokens} {usage.cached_tokens} {usage.cost_micro_usd}"


def _prefixes(r: Reservation) -> str:
    """The report rows' field prefixes, one per line (``row_field`` without the metric)."""
    return "\n".join(row_field(kind, subject, model, "") for kind, subject, model in r.rows)


@functools.lru_cache(maxsize=64)
def _day_start_ms(day: str) -> int:
    return int(dt.datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=dt.UTC).timestamp() * 1000)
